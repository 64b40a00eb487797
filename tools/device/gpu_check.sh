#!/usr/bin/env bash
# The GPU check of one lent device session (see tools/README.md): the Python
# suite on CUDA with deterministic algorithms, then each way of training at one
# batch under budgets of 50% and 25% of eager training's peak at that batch.
#
#   tools/device/gpu_check.sh OUT_DIR [resnet50:128,gpt2:8]
#
# Environment: SKIP_PYTEST=1, RUNS ("planner:allocator[:issue order[:headroom]] ...",
# by default the defaults before 2026-12-04 (outcore:best-fit-paged, early, 0.08), the setting that trained ResNet-50 on
# an H200 at a quarter and is the CUDA default since (outcore:virtual-chunks:timeline:0.12) and auto), SECONDS_LIMIT,
# MOVES (the outcore planner's search bounded by scored moves per start, so
# that every run of the check makes the same plans; not passed to auto).
# (Since 2026-12-04 compile_step and the bench default to virtual-chunks, timeline, 0.12 on
# CUDA; RUNS names every setting explicitly.)
# Run on 2026-11-30 (H200, 5 min; results in python/bench-results/2026-11-30-h200)
# with the outcore runs as `auto` and `outcore`, both best-fit, and with these
# default RUNS on 2026-12-04 (H200, 7 min; python/bench-results/2026-12-04-h200).
# Expects `outcore` importable (the wheel installed) and a CUDA device.  Every
# result is written under OUT_DIR as it comes (one JSON per run, log.txt), so a
# run cut short keeps what it measured.
set -uo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [model:batch,...]   (e.g. resnet50:128,gpt2:8)" >&2
    exit 2
fi
out="$(realpath -m "$1")"
cases="${2:-resnet50:128,gpt2:8}"
cd "$(dirname "$0")/../.."  # the repository's root: python/tests is found from here
mkdir -p "$out/json"
log="$out/log.txt"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }

say "device: $(python3 -c 'import torch; print(torch.cuda.get_device_name(0), torch.__version__)')"
if [ -z "${SKIP_PYTEST:-}" ]; then
    say "pytest on cuda"
    (cd python/tests && OUTCORE_TEST_DEVICE=cuda CUBLAS_WORKSPACE_CONFIG=:4096:8 \
        python3 -m pytest -q -p no:cacheprovider . 2>&1) | tail -15 | tee -a "$log"
fi
bench() { python3 -m outcore.torch.bench "$@" 2>&1 | tee -a "$log"; }
total=$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory)')
IFS=, read -ra list <<< "$cases"
for c in "${list[@]}"; do
    model="${c%%:*}"; batch="${c##*:}"
    case "$batch" in
        ''|*[!0-9]*) say "skipping \`$c\`: give model:batch, the batch a positive whole number"; continue ;;
    esac
    say "$model b$batch: eager, unlimited"
    bench --model "$model" --batch "$batch" --budget "$total" --methods eager --json "$out/json/$model-eager.json"
    peak=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results'][0].get('peak_allocated_bytes', 0))" \
        "$out/json/$model-eager.json")
    [ "$peak" -gt 0 ] || { say "no eager peak for $model"; continue; }
    for pct in 50 25; do
        budget=$(( peak * pct / 100 ))
        say "$model b$batch at $pct% of eager's peak ($budget B)"
        bench --model "$model" --batch "$batch" --budget "$budget" --methods checkpoint \
            --json "$out/json/$model-$pct-checkpoint.json"
        # planner:allocator[:issue order[:headroom]]; virtual-chunks turns on
        # PyTorch's expandable segments (for the rest of that process only:
        # each run is its own process)
        for run in ${RUNS:-outcore:best-fit-paged outcore:virtual-chunks:timeline:0.12 auto:best-fit-paged}; do
            IFS=: read -r planner allocator order headroom <<< "$run"
            order="${order:-early}"; headroom="${headroom:-0.08}"
            bench --model "$model" --batch "$batch" --budget "$budget" --methods outcore --planner "$planner" \
                --allocator "$allocator" --issue-order "$order" --headroom "$headroom" \
                --seconds "${SECONDS_LIMIT:-10}" ${MOVES:+$([ "$planner" = auto ] || echo --moves "$MOVES")} \
                --json "$out/json/$model-$pct-$planner-$allocator-$order-$headroom.json"
        done
    done
done
say "done"
