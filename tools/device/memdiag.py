"""Where a planned step's real CUDA memory departs from the plan, op by op.

    python3 tools/device/memdiag.py --model resnet50 --batch 128 --budget B --out DIR

Compiles the step (outcore.torch) for the budget, trains two steps without the
memory cap (the first creates SGD's momentum buffers and plans again), then runs
the generated step once more with every op bracketed: PyTorch's allocated bytes
before and after the op, the peak inside it, and the bytes of the distinct
device storages the step's own variables hold after it.  Writes:

* ``memdiag.json``: one row per compute op in issue order (op id, name, kind,
  allocated before / after, peak inside, referenced after) and the plan's and
  PyTorch's peaks;
* ``graph.json`` and ``plan.json``: the planned graph and plan, to compare the
  rows with the simulator's allocation trace on another machine;
* ``summary.txt``: the ops with the largest transient bytes (peak inside less
  the larger of before and after) and the largest unreferenced bytes
  (allocated after less referenced after).

With ``--history`` the caching allocator's own record of the bracketed step
(``torch.cuda.memory._record_memory_history``, no stacks) is written too:

* ``alloc_trace.json``: every block the step allocated and freed, in the
  allocator's order, as an ``outcore-alloc-trace/1`` trace (``outcore
  alloc-replay`` replays it through any allocator model), the blocks live
  when recording began allocated first, in address order, and
  ``capacity_bytes`` the budget the step ran under;
* ``alloc_events.json``: where each op began in that trace (a marker block of
  ``MARKER_BYTES`` allocated and freed at each op's start, left out of the
  trace), PyTorch's segment events (bytes reserved after each) and its
  out-of-memory events.

A diagnostic for a lent GPU session (tools/README.md); it changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import outcore
import outcore.torch as ot
from outcore.torch import runtime as R
from outcore.torch.allochistory import MARKER_BYTES, history_files
from outcore.torch.bench import prepared
from outcore.torch.codegen import generate


class MemRuntime(R._Runtime):
    """A profiling runtime whose tick / tock record memory, not time."""

    def __init__(self, device: torch.device, markers: bool = False):
        super().__init__(device, profile=True)
        self.rows: list[dict] = []
        self.markers = markers

    def tick(self):
        if not self.cuda:  # a dry run of the script on CPU: no allocator statistics
            return 0
        if self.markers:
            del_me = torch.empty(MARKER_BYTES, dtype=torch.uint8, device=self.device)
            del del_me
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def tock(self, op: int, t0):
        after = torch.cuda.memory_allocated(self.device) if self.cuda else 0
        peak = torch.cuda.max_memory_allocated(self.device) if self.cuda else 0
        seen: dict[int, int] = {}
        frame = sys._getframe(1)  # the generated step: its variables and the placeholders
        for v in list(frame.f_locals.values()) + list(frame.f_globals.get("_ph", [])):
            if isinstance(v, torch.Tensor) and v.device.type == self.device.type:
                st = v.untyped_storage()
                if st.nbytes() > 0:
                    seen[st.data_ptr()] = st.nbytes()
        reserved = torch.cuda.memory_reserved(self.device) if self.cuda else 0
        self.rows.append({"op": op, "before": t0, "after": after, "peak": peak,
                          "referenced": sum(seen.values()), "reserved": reserved})


def segments_summary() -> dict:
    """PyTorch's segments now: how many, their bytes, and the largest free blocks."""
    segs = torch.cuda.memory_snapshot()
    out = {"segments": len(segs), "total": sum(g["total_size"] for g in segs),
           "allocated": sum(g["allocated_size"] for g in segs), "largest_free_blocks": []}
    free = [(b["size"], g["total_size"]) for g in segs for b in g["blocks"] if b["state"] == "inactive"]
    out["free"] = sum(f for f, _ in free)
    out["largest_free_blocks"] = sorted(free, reverse=True)[:15]
    out["segment_sizes"] = sorted((g["total_size"] for g in segs), reverse=True)[:30]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--allocator", default="best-fit-paged")
    ap.add_argument("--planner", default="outcore")
    ap.add_argument("--headroom", type=float, default=0.08)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--issue-order", default="early", choices=["early", "timeline"])
    ap.add_argument("--enforce", action="store_true",
                    help="cap PyTorch at the budget and run the bracketed step first (as the bench's warm-up "
                         "step); an out-of-memory ends the run with the rows so far and PyTorch's segments")
    ap.add_argument("--history", action="store_true",
                    help="record the caching allocator's history of the bracketed step (alloc_trace.json, "
                         "alloc_events.json)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    model, loss_fn, opt, x, y = prepared(a.model, dev, a.batch)
    step = ot.compile_step(model, loss_fn, opt, (x, y), budget=a.budget, planner=a.planner,
                           allocator=a.allocator, headroom=a.headroom, time_limit_s=a.seconds,
                           enforce=False, issue_order=a.issue_order)
    for _ in range(0 if a.enforce else 2):
        step(x.clone(), y.clone())
    c = step.compiled
    if cuda:
        torch.cuda.synchronize()
    gen = generate(c.converted, c.plan_json, profile=True, timeline=c.timeline)
    rt = MemRuntime(dev, markers=a.history and cuda)
    glb = {"__builtins__": __builtins__, "_ph": [ph.tensor for ph in c.captured.placeholders],
           **gen.globals, **rt.bind(), "_H": c.host}
    exec(compile(gen.source, "<outcore step (memdiag)>", "exec"), glb)  # noqa: S102
    step._enter_residency(c)
    if cuda:
        if a.enforce:
            total = torch.cuda.get_device_properties(dev).total_memory
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            torch.cuda.set_per_process_memory_fraction(min(1.0, a.budget / total), index)
        torch.cuda.reset_peak_memory_stats(dev)
    history = a.history and cuda
    if history:
        torch.cuda.synchronize()
        before_snapshot = torch.cuda.memory_snapshot()
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=10_000_000)
    oom = None
    try:
        with torch.no_grad():
            outs = glb["step"](x.clone(), y.clone())
        step._install_new_state(c, outs)
    except torch.cuda.OutOfMemoryError as e:
        oom = {"error": str(e)[:400], "at_op_after": rt.rows[-1]["op"] if rt.rows else None,
               "segments": segments_summary()}
    if cuda:
        torch.cuda.synchronize()
    if history:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        trace_doc, hist = history_files(before_snapshot, snap["device_traces"][index], a.budget,
                                        [r["op"] for r in rt.rows])
        with open(os.path.join(a.out, "alloc_trace.json"), "w") as f:
            json.dump(trace_doc, f)
        with open(os.path.join(a.out, "alloc_events.json"), "w") as f:
            json.dump(hist, f)
        print(f"history: {len(trace_doc['events'])} events, {len(hist['op_starts'])} ops, peak reserved "
              f"{hist['peak_reserved_bytes']}, {len(hist['ooms'])} out-of-memory events")
    ops = c.converted.ops
    rows = [dict(r, name=ops[r["op"]].name, kind=ops[r["op"]].label) for r in rt.rows]
    doc = {
        "model": a.model, "batch": a.batch, "budget_bytes": a.budget, "allocator": a.allocator,
        "planner_budget_bytes": c.planner_budget_bytes, "pinned_bytes": c.converted.pinned_bytes,
        "plan_peak_live_bytes": c.plan_result.report.peak_live_bytes,
        "plan_peak_reserved_bytes": c.plan_result.report.peak_reserved_bytes,
        "planner": c.plan_result.planner, "issue_order": a.issue_order, "enforce": a.enforce,
        "oom": oom, "rows": rows,
    }
    with open(os.path.join(a.out, "memdiag.json"), "w") as f:
        json.dump(doc, f)
    with open(c.graph_path) as src, open(os.path.join(a.out, "graph.json"), "w") as dst:
        dst.write(src.read())
    with open(os.path.join(a.out, "plan.json"), "w") as f:
        json.dump(c.plan_json, f)
    if history:  # the device profile the plan was made for, to simulate it again elsewhere
        profile = step._with_tf32(step.device_profile or R._device_profile_for(dev), dev)
        with open(os.path.join(a.out, "device.json"), "w") as f:
            json.dump(outcore.device_profile(profile), f)
    lines = [f"{a.model} b{a.batch} budget {a.budget} planner budget {c.planner_budget_bytes} "
             f"pinned {c.converted.pinned_bytes} plan peak live {doc['plan_peak_live_bytes']} "
             f"reserved {doc['plan_peak_reserved_bytes']} ({c.plan_result.planner}, {a.allocator})",
             f"measured peak allocated {max(r['peak'] for r in rows)} "
             f"max after {max(r['after'] for r in rows)} max referenced {max(r['referenced'] for r in rows)} "
             f"max reserved {max(r['reserved'] for r in rows)}"]
    if oom:
        lines.append(f"out of memory after op {oom['at_op_after']}: {oom['error']}")
        lines.append(f"segments: {json.dumps(oom['segments'])}")
    trans = sorted(rows, key=lambda r: r["peak"] - max(r["before"], r["after"]), reverse=True)[:25]
    lines.append("largest transient (peak inside - max(before, after)):")
    lines += [f"  op {r['op']:5d} {r['kind']:28s} {r['peak'] - max(r['before'], r['after']):>12d} "
              f"before {r['before']} after {r['after']} {r['name']}" for r in trans]
    unref = sorted(rows, key=lambda r: r["after"] - r["referenced"], reverse=True)[:15]
    lines.append("largest unreferenced (after - referenced):")
    lines += [f"  op {r['op']:5d} {r['kind']:28s} {r['after'] - r['referenced']:>12d} {r['name']}" for r in unref]
    top = sorted(rows, key=lambda r: r["peak"], reverse=True)[:10]
    lines.append("largest peaks inside ops:")
    lines += [f"  op {r['op']:5d} {r['kind']:28s} peak {r['peak']} before {r['before']} after {r['after']} "
              f"referenced {r['referenced']} {r['name']}" for r in top]
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:40]))


if __name__ == "__main__":
    main()
