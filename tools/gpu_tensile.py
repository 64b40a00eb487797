"""Runs TENSILE's cold-start comparison on a real GPU (issue 13): the plans
`tensile` makes with measured, predicted and roofline latencies, and
`capuchin` at the warm plan's peak, each trained for real by
`outcore.torch` and timed.

    python3 tools/gpu_tensile.py TABLES_DIR [--stems vgg16__b64,...] [--iterations 10]

TABLES_DIR holds, per stem `<model>__b<batch>`: `<stem>.lat.json` (the
table `tools/gpu_latency_tables.py` measured: the warm times) and
`<stem>.pred.lat.json` (the MLP's predictions, written by
`cargo run --release -p outcore-planners --example tensile_h100 -- DIR coldstart --write OUT`).

Per stem: the vanilla step (`none`), then `tensile` at one byte below the
vanilla plan's peak (the paper's active mode) planned with each latency
source, then `capuchin` at the peak the warm `tensile` plan states. Each
step: median wall time of `--iterations` synchronised steps after two
warm-ups, and PyTorch's peak allocated bytes. Each group runs in its own
process (`--one`), so that nothing a previous group allocated is counted in
its peak. MSR = 1 - peak / vanilla
peak, EOR = time / vanilla time, CBR = MSR / EOR (TENSILE Sec. V-A), all
measured. Prints one JSON line per row and a table at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

import outcore.torch as ot

sys.path.insert(0, os.path.dirname(__file__))
from gpu_latency_tables import init_state, make  # noqa: E402


def measure(model_name, batch, planner, budget, latency_table, iterations, device):
    torch.manual_seed(0)
    model, loss_fn, x, y = make(model_name, batch, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    init_state(model, loss_fn, opt, x, y)
    before = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    step = ot.compile_step(model, loss_fn, opt, (x.clone(), y.clone()), budget=budget, planner=planner,
                           allocator="perfect", latency_table=latency_table)
    plan_s = time.perf_counter() - t0
    m = step.measure(x, y, iterations=iterations, warmup=2)
    c = step.compiled
    out = {
        "time_s": m["measured_iter_time_s"], "simulated_s": m["simulated_iter_time_s"],
        "peak_allocated_bytes": m["peak_allocated_bytes"], "plan_s": plan_s,
        "plan_peak_bytes": c.plan_result.report.peak_live_bytes, "pinned_bytes": c.converted.pinned_bytes,
        "swap_outs": m["swap_outs"], "swap_ins": m["swap_ins"], "recomputes": m["recomputes"],
        "op_names": [op.name for op in c.converted.ops],
        "allocated_before_compile_bytes": before,
    }
    del step, model, opt, x, y
    gc.collect()
    torch.cuda.empty_cache()
    return out


#: A group's process (capture, plan, 12 steps) is stopped after this long.
CHILD_TIMEOUT_S = 300


def measure_alone(model_name, batch, planner, budget, latency_table, iterations):
    """`measure` in a fresh process; raises `ot.InfeasibleError` when the child reports infeasible."""
    args = json.dumps([model_name, batch, planner, budget, latency_table, iterations])
    r = subprocess.run([sys.executable, __file__, "--one", args], capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{planner} on {model_name}: exit {r.returncode}: {r.stderr[-600:]}")
    out = json.loads(lines[-1])
    if "infeasible" in out:
        raise ot.InfeasibleError(out["infeasible"])
    return out


def one(args: str) -> int:
    model_name, batch, planner, budget, table, iterations = json.loads(args)
    device = torch.device("cuda")
    try:
        out = measure(model_name, batch, planner, budget, table, iterations, device)
    except ot.InfeasibleError as e:
        out = {"infeasible": str(e)}
    print(json.dumps(out))
    return 0


def names_match(path: str, names: list[str]) -> str:
    with open(path) as f:
        t = json.load(f)
    ok = sum(1 for e in t["entries"] if e["op"] < len(names) and names[e["op"]] == e["name"])
    return f"{ok}/{len(t['entries'])} entries match the captured graph ({len(names)} ops)"


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        return one(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("tables_dir")
    ap.add_argument("--stems", default="vgg16__b64,inception_v3__b64,resnet50__b64,densenet121__b64,vit_b_16__b64")
    ap.add_argument("--iterations", type=int, default=10)
    a = ap.parse_args()
    rows = []
    for stem in a.stems.split(","):
        model_name, batch = stem.rsplit("__b", 1)
        batch = int(batch)
        try:
            van = measure_alone(model_name, batch, "none", "300%", None, a.iterations)
            warm_table = os.path.join(a.tables_dir, f"{stem}.lat.json")
            pred_table = os.path.join(a.tables_dir, f"{stem}.pred.lat.json")
            print(f"{stem}: warm table {names_match(warm_table, van['op_names'])}; "
                  f"predicted {names_match(pred_table, van['op_names'])}", flush=True)
            budget = van["plan_peak_bytes"] - 1 + van["pinned_bytes"]
            groups = [("vanilla (none)", van)]
            for label, table in (("tensile, measured (warm)", warm_table), ("tensile, predicted (cold)", pred_table),
                                 ("tensile, roofline", None)):
                try:
                    groups.append((label, measure_alone(model_name, batch, "tensile", budget, table, a.iterations)))
                except ot.InfeasibleError as e:
                    print(f"{stem}: {label}: infeasible ({str(e)[:200]})", flush=True)
            warm = dict(groups).get("tensile, measured (warm)")
            if warm is None:
                raise ot.InfeasibleError("the warm tensile plan is infeasible: no budget for capuchin")
            cap_budget = warm["plan_peak_bytes"] + warm["pinned_bytes"]
            try:
                groups.append(("capuchin at warm's peak, measured",
                               measure_alone(model_name, batch, "capuchin", cap_budget, warm_table, a.iterations)))
            except ot.InfeasibleError as e:
                print(f"{stem}: capuchin at {cap_budget} B: infeasible ({str(e)[:200]})", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, the next model goes on
            print(f"{stem}: FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
            continue
        for label, g in groups:
            msr = 1 - g["peak_allocated_bytes"] / van["peak_allocated_bytes"]
            eor = g["time_s"] / van["time_s"]
            r = {"stem": stem, "group": label, "msr": msr, "eor": eor, "cbr": msr / eor,
                 **{k: v for k, v in g.items() if k != "op_names"}}
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| model | group | measured step (ms) | simulated (ms) | peak allocated (MiB) | MSR | EOR | CBR | swaps out/in | recomputes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['stem']} | {r['group']} | {r['time_s']*1e3:.2f} | {r['simulated_s']*1e3:.2f} | "
              f"{r['peak_allocated_bytes']/2**20:.0f} | {r['msr']:.4f} | {r['eor']:.4f} | {r['cbr']:.4f} | "
              f"{r['swap_outs']}/{r['swap_ins']} | {r['recomputes']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
