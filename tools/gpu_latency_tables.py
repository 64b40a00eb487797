"""Measures `outcore-latency-table/1` tables of real PyTorch training steps on
a GPU, for the latency predictors of `outcore_cost::predict` (TENSILE's cold
start, issue 13).

    python3 tools/gpu_latency_tables.py OUT_DIR [--models a,b] [--batches 8,16,32]
                                                [--iterations 5] [--deadline-s 540]

For each (model, batch) the step (SGD with momentum, float32) is captured by
`outcore.torch.compile_step` with the `none` planner (nothing moved, nothing
recomputed: the vanilla step), run once, then profiled: every op of the graph
timed by CUDA events on the compute stream, the median over `--iterations`
steps (`StepFunction.profile`). Written per configuration, into OUT_DIR:

- `<model>__b<batch>.graph.json`: the captured graph (outcore's IR), whose op
  ids the table's entries name;
- `<model>__b<batch>.lat.json`: the latency table, plus `measured_step_s`
  (the median wall time of whole steps, synchronised, outside the profiler).

An op's time is from the event recorded before it to the event recorded after
it on the compute stream: the kernel(s) and any time the GPU waited for the
Python that launches them. Small ops of the generated code are launch-bound,
and that wait is part of what a real step pays, so it is kept in the table.

`summary.json` in OUT_DIR lists this run's configurations (a second run into
the same directory replaces it).

A configuration that fails (an op the capture does not support, out of
memory) is logged with its error and skipped; the others go on. The run stops
starting configurations after `--deadline-s`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch
from torch import nn

import outcore.torch as ot
from outcore.torch.models import TinyGPT, lm_loss

IMAGE_MODELS = {
    "resnet18": 224, "resnet50": 224, "resnet101": 224, "vgg16": 224, "vgg19": 224,
    "inception_v3": 299, "densenet121": 224, "mobilenet_v2": 224, "efficientnet_b0": 224,
    "squeezenet1_1": 224, "googlenet": 224, "vit_b_16": 224,
}


def make(name: str, batch: int, device: torch.device):
    """(model, loss, x, y) of one configuration."""
    if name in IMAGE_MODELS:
        import torchvision

        kw = {}
        if name in ("inception_v3", "googlenet"):
            kw = {"aux_logits": False, "init_weights": False}
        model = getattr(torchvision.models, name)(**kw).to(device)
        side = IMAGE_MODELS[name]
        x = torch.randn(batch, 3, side, side, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        return model, nn.functional.cross_entropy, x, y
    if name == "gpt2-small-seq256":
        # GPT-2 124M's widths at a 256-token context, so batches 8-32 fit a step
        model = TinyGPT(vocab=50257, d=768, heads=12, layers=12, seq=256, p=0.1).to(device)
        x = torch.randint(0, 50257, (batch, 256), device=device)
        y = torch.randint(0, 50257, (batch, 256), device=device)
        return model, lm_loss, x, y
    raise SystemExit(f"error: unknown model `{name}`")


def init_state(model, loss_fn, opt, x, y) -> None:
    """One eager step so the optimizer has its momentum buffers, then the
    parameters as they were (the captured graph is the steady-state step)."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    opt.zero_grad()
    loss_fn(model(x[:1]), y[:1]).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.load_state_dict(saved)


def one(name: str, batch: int, iterations: int, out_dir: str, device: torch.device) -> dict:
    torch.manual_seed(0)
    model, loss_fn, x, y = make(name, batch, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    init_state(model, loss_fn, opt, x, y)
    t0 = time.perf_counter()
    step = ot.compile_step(model, loss_fn, opt, (x.clone(), y.clone()), budget="300%",
                           planner="none", allocator="perfect")
    compile_s = time.perf_counter() - t0
    m = step.measure(x, y, iterations=iterations, warmup=2)
    table = step.profile(x, y, iterations=iterations)
    table["measured_step_s"] = m["measured_iter_time_s"]
    table["simulated_step_s"] = m["simulated_iter_time_s"]
    table["batch"] = batch
    stem = os.path.join(out_dir, f"{name}__b{batch}")
    with open(stem + ".graph.json", "w") as f:
        json.dump(step.compiled.converted.graph_json, f)
    with open(stem + ".lat.json", "w") as f:
        json.dump(table, f, indent=1)
    ops_sum = sum(e["time_s"] for e in table["entries"])
    return {"model": name, "batch": batch, "ops": len(table["entries"]), "compile_s": compile_s,
            "ops_sum_s": ops_sum, "measured_step_s": m["measured_iter_time_s"],
            "simulated_step_s": m["simulated_iter_time_s"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--models", default=",".join(list(IMAGE_MODELS) + ["gpt2-small-seq256"]))
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--deadline-s", type=float, default=540.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device; this tool measures GPU latencies", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    os.makedirs(a.out_dir, exist_ok=True)
    start = time.perf_counter()
    rows = []
    for name in a.models.split(","):
        for batch in (int(b) for b in a.batches.split(",")):
            if time.perf_counter() - start > a.deadline_s:
                print(f"deadline: skipping {name} b{batch}", flush=True)
                continue
            try:
                r = one(name, batch, a.iterations, a.out_dir, device)
                rows.append(r)
                print(f"{name:18} b{batch:<3} {r['ops']:5} ops  ops sum {r['ops_sum_s']*1e3:8.2f} ms  "
                      f"step {r['measured_step_s']*1e3:8.2f} ms  simulated {r['simulated_step_s']*1e3:8.2f} ms  "
                      f"compile {r['compile_s']:.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - logged and skipped, the others go on
                print(f"{name:18} b{batch:<3} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                traceback.print_exc(limit=3)
                rows.append({"model": name, "batch": batch, "error": f"{type(e).__name__}: {e}"[:2000]})
            gc.collect()
            torch.cuda.empty_cache()
            with open(os.path.join(a.out_dir, "summary.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                           "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
