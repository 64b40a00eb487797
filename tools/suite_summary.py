#!/usr/bin/env python3
"""Summarises `outcore bench-suite --json` output for RESULTS.md: per case,
outcore's throughput vs ideal beside the best other planner's, its gap to the
lower bound and its planning time; then the issue-16 checks (never slower than
another planner by more than 0.5%, feasible wherever one is, the median and
largest gap to the bound).

    outcore bench-suite --planners all --seconds 5 --json > suite.json
    tools/suite_summary.py suite.json
"""
import json
import statistics
import sys


def fmt(x):
    return "—" if x is None else f"{x:.3f}"


def main(path):
    with open(path) as f:
        d = json.load(f)
    cases = {}
    for r in d["rows"]:
        key = (r["graph"], r["device"], r["budget_percent"])
        cases.setdefault(key, {})[r["planner"]] = r
    gaps, slower, missing = [], [], []
    print("| graph | device | budget | outcore | best other | its throughput | gap to bound | plan s |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(cases):
        ps = cases[key]
        ours = ps.get("outcore")
        others = {n: r for n, r in ps.items()
                  if n not in ("outcore", "ideal") and r["status"] == "feasible"}
        best = min(others.items(), key=lambda x: x[1]["iter_time_s"]) if others else None
        feasible = ours is not None and ours["status"] == "feasible"
        ot = ours["throughput_vs_ideal"] if feasible else None
        if best and not feasible:
            missing.append(key)
        if best and feasible and ours["iter_time_s"] > best[1]["iter_time_s"] * 1.005:
            slower.append((key, best[0]))
        gap = ours.get("gap_to_bound") if feasible else None
        if gap is not None:
            gaps.append(gap)
        print(f"| {key[0]} | {key[1]} | {key[2]:g}% | {fmt(ot)} | "
              f"{best[0] if best else '—'} | {fmt(best[1]['throughput_vs_ideal'] if best else None)} | "
              f"{fmt(gap)} | {fmt(ours['planner_time_s'] if ours else None)} |")
    print()
    print(f"cases: {len(cases)}; outcore slower than another planner by more than 0.5%: "
          f"{len(slower)} {slower}; infeasible where another planner is feasible: "
          f"{len(missing)} {missing}")
    if gaps:
        print(f"gap to the lower bound over the {len(gaps)} feasible cases: median "
              f"{statistics.median(gaps):.3f}, largest {max(gaps):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
