"""A planned step measured, profiled, planned again on its own latencies, and
measured again.

    python3 tools/device/replan.py --model resnet50 --batch 128 --budget B --out DIR \
        [--allocator virtual-chunks] [--issue-order timeline] [--headroom 0.15] [--moves N]

Compiles the step (outcore.torch, the budget enforced), measures it
(:meth:`StepFunction.measure`), profiles it (every op and copy timed, an
``outcore-latency-table/1`` written to DIR/latency.json), then compiles a new
step for the same model with ``latency_table=`` that file and measures it.
Writes DIR/replan.json: both measurements (median step, simulated step,
peaks, recomputes and swaps).  A diagnostic for a lent GPU session
(tools/README.md).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import outcore.torch as ot
from outcore.torch.bench import prepared


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--allocator", default="virtual-chunks")
    ap.add_argument("--issue-order", default="timeline", choices=["early", "timeline"])
    ap.add_argument("--headroom", type=float, default=0.15)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--moves", type=int, default=None,
                    help="bound the search by scored moves per start (the same plans on every run)")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    model, loss_fn, opt, x, y = prepared(a.model, dev, a.batch)
    kw = dict(budget=a.budget, allocator=a.allocator, issue_order=a.issue_order, headroom=a.headroom,
              time_limit_s=a.seconds, moves=a.moves, enforce=dev.type == "cuda")
    doc: dict = {"model": a.model, "batch": a.batch, "budget_bytes": a.budget, "allocator": a.allocator,
                 "issue_order": a.issue_order, "headroom": a.headroom, "moves": a.moves}
    step = ot.compile_step(model, loss_fn, opt, (x, y), **kw)
    doc["roofline"] = step.measure(x, y, iterations=a.iterations)
    print("roofline plan:", json.dumps(doc["roofline"]), flush=True)
    table = step.profile(x, y, iterations=3)
    path = os.path.join(a.out, "latency.json")
    step.write_latency_table(path, table)
    step.materialize()  # parameters the plan keeps on the host back on the device
    del step
    again = ot.compile_step(model, loss_fn, opt, (x, y), latency_table=path, **kw)
    doc["measured_latencies"] = again.measure(x, y, iterations=a.iterations)
    print("plan on measured latencies:", json.dumps(doc["measured_latencies"]), flush=True)
    with open(os.path.join(a.out, "replan.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
