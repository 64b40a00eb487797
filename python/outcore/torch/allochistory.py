"""The caching allocator's own record of a CUDA run, as an outcore trace.

``recorded(path_prefix, budget_bytes)`` wraps a stretch of CUDA work in
``torch.cuda.memory._record_memory_history`` (no stack traces) and writes, when
it ends (an out-of-memory error included):

* ``<prefix>.trace.json``: every block allocated and freed, in the
  allocator's order, as an ``outcore-alloc-trace/1`` trace that ``outcore
  alloc-replay`` replays through any allocator model; the blocks live when
  recording began come first, in address order (their real layout is not
  kept), and ``capacity_bytes`` is the budget the work ran under;
* ``<prefix>.events.json``: PyTorch's segment events (the bytes reserved
  after each, by the trace event they follow), its out-of-memory events, and
  where each op began when the run marked them (``MARKER_BYTES``).

A block counts as freed at ``free_completed`` (when the streams that used it
are done), which is when PyTorch can hand it out again.  For the device tools
(``tools/device/memdiag.py``, ``python -m outcore.torch.bench
--alloc-history``); nothing in a planned step calls it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import torch

#: Size of the marker block a run allocates and frees at each op's start to
#: mark it in the history (``memdiag.py --history``): in PyTorch's small pool,
#: below 1 MiB, so the large blocks' layout is not touched, and an odd multiple
#: of 512 B that no tensor of the models here has.
MARKER_BYTES = 512 * 1003


def history_files(before: list[dict], trace: list[dict], budget: int,
                  ops: list[int] | None = None) -> tuple[dict, dict]:
    """A recorded history as an ``outcore-alloc-trace/1`` trace and a summary
    of the rest (see the module doc).  ``before``:
    ``torch.cuda.memory_snapshot()`` when recording began; ``trace``: the
    recorded entries; ``ops``: where the run marked its ops, the op of each
    mark in order (a block of ``MARKER_BYTES`` is then a mark, not a tensor)."""
    events: list[dict] = []
    live: dict[int, int] = {}  # address -> trace id
    next_id = 0

    def alloc(addr: int, size: int) -> None:
        nonlocal next_id
        live[addr] = next_id
        events.append({"op": "alloc", "id": next_id, "size_bytes": size})
        next_id += 1

    for seg in sorted(before, key=lambda g: g["address"]):
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                alloc(addr, b["size"])
            addr += b["size"]
    reserved = sum(g["total_size"] for g in before)
    op_starts, segments, ooms, unmatched = [], [], [], 0
    marker_addrs: set[int] = set()
    for e in trace:
        act, addr, size = e["action"], e.get("addr", 0), e.get("size", 0)
        if ops is not None and act == "alloc" and size == MARKER_BYTES:
            marker_addrs.add(addr)
            op_starts.append({"op": ops[len(op_starts)] if len(op_starts) < len(ops) else None,
                              "event": len(events)})
        elif act == "free_completed" and addr in marker_addrs:
            marker_addrs.discard(addr)
        elif act == "alloc":
            alloc(addr, size)
        elif act == "free_completed":
            if addr in live:
                events.append({"op": "free", "id": live.pop(addr)})
            else:
                unmatched += 1
        elif act in ("segment_alloc", "segment_map"):
            reserved += size
            segments.append({"event": len(events), "action": act, "size": size, "reserved": reserved})
        elif act in ("segment_free", "segment_unmap"):
            reserved -= size
            segments.append({"event": len(events), "action": act, "size": size, "reserved": reserved})
        elif act == "oom":
            ooms.append({"event": len(events), "size": size, "device_free": e.get("device_free")})
    trace_doc = {"format": "outcore-alloc-trace/1", "capacity_bytes": budget, "events": events}
    summary = {"initial_reserved_bytes": sum(g["total_size"] for g in before),
               "initial_live_blocks": sum(1 for g in before for b in g["blocks"] if b["state"] != "inactive"),
               "peak_reserved_bytes": max([s["reserved"] for s in segments] + [reserved]),
               "frees_of_unknown_blocks": unmatched, "op_starts": op_starts,
               "segments": segments, "ooms": ooms}
    return trace_doc, summary


@contextlib.contextmanager
def recorded(path_prefix: str, budget_bytes: int, device: torch.device | None = None) -> Iterator[None]:
    """Records the allocator's history of the block's CUDA work and writes
    the two files above when the block ends, however it ends."""
    dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_snapshot()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=10_000_000)
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):  # a device error: write what was recorded
            torch.cuda.synchronize(dev)
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        trace, events = history_files([g for g in before if g.get("device", index) == index],
                                      snap["device_traces"][index], budget_bytes)
        with open(f"{path_prefix}.trace.json", "w") as f:
            json.dump(trace, f)
        with open(f"{path_prefix}.events.json", "w") as f:
            json.dump(events, f)


def trace_to_oom(trace: dict, events: dict, which: int = 0) -> dict:
    """The recorded trace up to PyTorch's out-of-memory event ``which``, then
    the request it refused: replayed (``outcore alloc-replay --allocator A``)
    it asks whether allocator model ``A`` would have found room where PyTorch
    did not, on the same sequence.  A request PyTorch refused never became a
    block, so the recorded trace alone lacks it."""
    ooms = events.get("ooms", [])
    if not 0 <= which < len(ooms):
        raise ValueError(f"out-of-memory event {which}: the history has {len(ooms)} (0 to {len(ooms) - 1})")
    oom = ooms[which]
    kept = trace["events"][: oom["event"]]
    new_id = 1 + max((e["id"] for e in kept), default=-1)
    return dict(trace, events=kept + [{"op": "alloc", "id": new_id, "size_bytes": oom["size"]}])


def main(argv: list[str] | None = None) -> int:
    """``python -m outcore.torch.allochistory to-oom PREFIX OUT [WHICH]``:
    writes :func:`trace_to_oom` of ``PREFIX.trace.json`` and
    ``PREFIX.events.json`` to ``OUT``, and prints the live bytes before the
    refused request."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4) or args[0] != "to-oom":
        print("usage: python -m outcore.torch.allochistory to-oom PREFIX OUT [WHICH]", file=sys.stderr)
        return 2
    with open(f"{args[1]}.trace.json") as f:
        trace = json.load(f)
    with open(f"{args[1]}.events.json") as f:
        events = json.load(f)
    try:
        cut = trace_to_oom(trace, events, int(args[3]) if len(args) == 4 else 0)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    live: dict[int, int] = {}
    for e in cut["events"][:-1]:
        if e["op"] == "alloc":
            live[e["id"]] = e["size_bytes"]
        else:
            live.pop(e["id"], None)
    with open(args[2], "w") as f:
        json.dump(cut, f)
    print(f"{len(cut['events'])} events; {sum(live.values())} B live before the refused request of "
          f"{cut['events'][-1]['size_bytes']} B; capacity {cut['capacity_bytes']} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
