#!/usr/bin/env bash
# The `offsets` layout against the other allocators: `outcore` (the joint
# planner) on the suite's zoo models at 50% and 25% of the footprint on
# v100-16gb-pcie3, once per allocator, `--seconds 5`; then each offsets plan's
# layout (height / memory bound, rounds, layout time). Writes one JSON file
# per run into DIR and prints a Markdown table. Run from the repository root
# after `cargo build --release -p outcore-cli`.
#
#   tools/layout_study.sh DIR
set -euo pipefail
dir="${1:?usage: tools/layout_study.sh DIR}"
mkdir -p "$dir"
bin=target/release/outcore
cases=(
  "resnet50 64" "inception_v3 64" "densenet121 64" "mobilenet_v2 64"
  "bert-base 32" "gpt2 8" "vit_b_16 64"
)
for c in "${cases[@]}"; do
  set -- $c
  for budget in 50 25; do
    for a in perfect best-fit virtual-chunks offsets; do
      out="$dir/$1-b$2-$budget-$a.json"
      "$bin" compare --model "$1" --batch "$2" --device v100-16gb-pcie3 --budget "$budget%" \
        --allocator "$a" --planners outcore --seconds 5 --json > "$out" 2>/dev/null || true
    done
    "$bin" plan --model "$1" --batch "$2" --device v100-16gb-pcie3 --budget "$budget%" \
      --allocator offsets --seconds 5 -o "$dir/$1-b$2-$budget-offsets.plan.json" > /dev/null 2>&1 || true
  done
done
python3 - "$dir" <<'PY'
import json, sys, os, glob
d = sys.argv[1]
print("| model | budget | perfect | best-fit | virtual-chunks | offsets | layout / bound | rounds | layout s |")
print("|---|---|---|---|---|---|---|---|---|")
def tput(path):
    try:
        j = json.load(open(path))
    except Exception:
        return "—"
    for r in j.get("results", []):
        if r.get("planner") == "outcore":
            if r.get("feasible"):
                return f"{r['throughput_vs_ideal']:.3f}"
            return "inf."
    return "?"
for plan in sorted(glob.glob(os.path.join(d, "*.plan.json"))):
    base = plan[: -len("-offsets.plan.json")]
    name = os.path.basename(base)
    model, batch, budget = name.rsplit("-", 2)
    cells = [tput(f"{base}-{a}.json") for a in ["perfect", "best-fit", "virtual-chunks", "offsets"]]
    lay = json.load(open(plan))["planner"]["settings"].get("layout", {})
    ratio = lay["height_bytes"] / lay["memory_bound_bytes"] if lay else float("nan")
    print(f"| {model} {batch} | {budget}% | " + " | ".join(cells)
          + f" | {ratio:.4f} | {lay.get('rounds','—')} | {lay.get('layout_time_s', float('nan')):.2f} |")
PY
