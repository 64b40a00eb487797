"""Straight-line Python generated from an outcore plan.

``generate`` turns a verified ``outcore-plan/1`` plan of a converted step into
the source of one function ``step(x, y)``: one statement (or a few) per plan
step, no interpreter loop.  What each instruction becomes:

* ``Compute(op)`` -- the op's ATen calls on the current (compute) stream,
  then its riders (nodes on pinned state).
* ``Recompute(op, outputs)`` -- the same calls again, pinned arguments the op
  writes replaced by scratch (``_zl``), and only the listed outputs kept;
  views of a recomputed tensor are derived again before their next use.
* ``SwapOut(t)`` -- ``_so``: the d2h stream waits for the step's events, copies
  the tensor's whole storage into its pinned host buffer, records an event.
* ``SwapIn(t)`` -- ``_si``: the storage is re-allocated (``resize_``) on the
  compute stream, so the caching allocator's stream order covers later
  compute readers, the h2d stream waits for the compute stream up to here and
  for the step's events, and copies the host buffer back.  The tensor object
  and its views stay the same, so parameters and optimizer state are updated
  in place.
* ``Free(t)`` -- ``_free``: the storage is resized to 0 bytes.  A free on the
  compute stream happens at once.  A free on a copy stream is deferred to the
  first compute step that the plan orders after it, where the compute stream
  first waits for the free's event: device memory goes back to the allocator
  only after the last reader's event.
* Waits -- ``_wait_c`` / the ``waits`` argument of the copy helpers, on events
  recorded after exactly the steps that other streams wait for.

Issue order (``compile_step(issue_order=...)``): ``"early"`` is a topological
merge of the three programs that issues copies as early as their waits allow,
with copy streams' frees deferred as above.  ``"timeline"`` takes a plan pinned
to its predicted iteration (``outcore._native.pin_to_timeline``) and issues the
steps in the order that iteration starts them: a copy stream's free is then
released where it stands (every later allocating step of the pinned plan waits
for that stream up to it or further), and a swap-in that starts while a kernel
runs takes its memory just before that kernel (``_sa``), so its copy waits for
what finished before, not for the kernel (see ``_hoisted_swap_ins``).  PyTorch's
caching allocator counts bytes in the host's order; under ``"timeline"`` that
is the simulated sequence of allocations and frees.

On the CPU the stream helpers are no-ops and copies are plain ``copy_`` calls:
the same source runs there (the tests).
"""

from __future__ import annotations

import bisect
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import PlanError, UnsupportedOpError
from .convert import Converted, _arg_nodes

STREAMS = ("compute", "h2d", "d2h")


@dataclass
class Generated:
    """Generated source and the values its globals refer to."""

    source: str
    globals: dict[str, Any]
    #: host buffers needed: tensor id -> storage bytes
    host_buffers: dict[int, int]
    #: persistent tensor id -> initial residency ("device", "host", "device_and_host")
    initial_residency: dict[int, str]
    #: batch inputs (placeholder index) that need a host copy at the start
    batch_host_copies: list[int]
    #: compute ops timed (op id) in order, when profiling
    timed_ops: list[int] = field(default_factory=list)
    #: copies timed: (tensor id, "h2d"/"d2h")
    timed_copies: list[tuple[int, str]] = field(default_factory=list)
    n_recomputes: int = 0
    n_swap_outs: int = 0
    n_swap_ins: int = 0
    #: each plan step's first line in ``source`` (1-based, in issue order)
    #: with what the step does and how many in-place updates of parameters
    #: and optimizer state were issued before it (:meth:`locate`)
    step_lines: list[tuple[int, str, int]] = field(default_factory=list)
    #: the step's in-place updates of parameters and optimizer state (one per
    #: updated storage and op; batch norm's running statistics, pinned state
    #: written by riders, are not counted)
    n_updates: int = 0

    def locate(self, line: int) -> StepLocation:
        """The plan step that source line ``line`` belongs to: where in the
        plan a failure's traceback (out of memory, say) points, and whether
        the optimizer had begun updating the model."""
        starts = [first for first, _, _ in self.step_lines]
        k = bisect.bisect_right(starts, line) - 1
        if k < 0:
            return StepLocation(line, "the step's prologue (before the plan's first step)", 0, self.n_updates)
        _, what, before = self.step_lines[k]
        return StepLocation(line, what, before, self.n_updates)


@dataclass
class StepLocation:
    """Where in a generated step a line is: the plan step it belongs to."""

    #: the line in the generated source (1-based)
    line: int
    #: the plan step there, e.g. "op 12 `aten.addmm.default` [fc1]"
    what: str
    #: in-place updates of parameters and optimizer state issued before
    #: that step (a step that failed after one has partly updated the model)
    updates_before: int
    #: those updates in the whole step
    updates_total: int

    def __str__(self) -> str:
        done = (f"{self.updates_before} of the step's {self.updates_total} in-place updates of "
                "parameters and optimizer state had been issued")
        return f"{self.what} (line {self.line} of the generated step); {done}"


def _step_key(s: dict[str, Any]) -> tuple[int, int]:
    return STREAMS.index(s["stream"]), int(s["index"])


def _emission_order(streams: list[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    """A topological merge of the three programs: every copy as soon as its
    waits allow, then one compute step, and again."""
    pos = [0, 0, 0]
    done: set[tuple[int, int]] = set()
    order: list[tuple[int, int]] = []
    total = sum(len(s) for s in streams)

    def ready(s: int) -> bool:
        if pos[s] >= len(streams[s]):
            return False
        return all(_step_key(w) in done for w in streams[s][pos[s]].get("waits", []))

    def take(s: int) -> None:
        done.add((s, pos[s]))
        order.append((s, pos[s]))
        pos[s] += 1

    while len(order) < total:
        progressed = False
        for s in (1, 2):
            while ready(s):
                take(s)
                progressed = True
        if ready(0):
            take(0)
            progressed = True
        if not progressed:
            raise PlanError("the plan's waits form a cycle; it cannot be issued (re-plan)")
    return order


def _timeline_order(streams: list[list[dict[str, Any]]],
                    timeline: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The timeline as an issue order, checked: every step once, each stream in
    its order, every wait on a step issued before."""
    pos = [0, 0, 0]
    done: set[tuple[int, int]] = set()
    order: list[tuple[int, int]] = []
    for s, i in timeline:
        if not (0 <= s < 3) or i != pos[s] or i >= len(streams[s]):
            raise PlanError(f"the timeline's step ({s}, {i}) is not stream {s}'s next step; "
                            "pin the plan again (outcore._native.pin_to_timeline)")
        for w in streams[s][i].get("waits", []):
            if _step_key(w) not in done:
                raise PlanError(f"the timeline starts step ({s}, {i}) before {w}, which it waits for; "
                                "pin the plan again")
        done.add((s, i))
        order.append((s, i))
        pos[s] += 1
    if any(p != len(st) for p, st in zip(pos, streams)):
        raise PlanError("the timeline does not list every step of the plan; pin the plan again")
    return order


def _hoisted_swap_ins(streams: list[list[dict[str, Any]]],
                      order: list[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
    """Swap-ins whose device memory is taken before the kernel running when
    they start: compute index -> swap-ins (stream, index).

    A swap-in's h2d copy waits for the compute stream up to where its memory
    is taken (the caching allocator may hand it a block a kernel issued
    before used, a cuDNN workspace say).  Taken where the timeline starts the
    copy, that is after the kernel then running, which the prediction does
    not wait for; taken just before that kernel, the copy waits only for what
    finished before it.  Not where a copy stream frees memory between the
    two: the swap-in may need those bytes, and in the timeline's order they
    are released only there."""
    hoisted: dict[int, list[tuple[int, int]]] = {}
    last_kernel: int | None = None
    for s, i in order:
        instr = streams[s][i]["instr"]
        if s == 0:
            runs = isinstance(instr, dict) and ("compute" in instr or "recompute" in instr)
            last_kernel = i if runs else None
        elif isinstance(instr, dict) and "free" in instr:
            last_kernel = None
        elif isinstance(instr, dict) and "swap_in" in instr and last_kernel is not None:
            hoisted.setdefault(last_kernel, []).append((s, i))
    return hoisted


def _vector_clocks(streams, order) -> dict[tuple[int, int], list[int]]:
    """For each step, the last index of each stream that happens before or at it."""
    vc: dict[tuple[int, int], list[int]] = {}
    last = [[-1, -1, -1] for _ in range(3)]
    for s, i in order:
        clock = list(last[s])
        for w in streams[s][i].get("waits", []):
            ws, wi = _step_key(w)
            clock = [max(a, b) for a, b in zip(clock, vc[(ws, wi)])]
        clock[s] = i
        vc[(s, i)] = clock
        last[s] = clock
    return vc


class _Emitter:
    def __init__(self, conv: Converted, plan: dict[str, Any], profile: bool):
        self.conv = conv
        self.plan = plan
        self.profile = profile
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {}
        self.fn_names: dict[Any, str] = {}
        self.consts: dict[int, str] = {}
        self.epoch: dict[int, int] = {}
        self.view_epoch: dict[torch.fx.Node, int] = {}
        self.getitems: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for n in conv.captured.gm.graph.nodes:
            if n.op == "call_function" and n.target is operator.getitem:
                self.getitems.setdefault(n.args[0], []).append(n)
        self.timed_ops: list[int] = []
        self.timed_copies: list[tuple[int, str]] = []

    # ------------------------------------------------------------- naming
    @staticmethod
    def var(n: torch.fx.Node) -> str:
        return "v_" + n.name

    def fn(self, target: Any) -> str:
        name = self.fn_names.get(target)
        if name is None:
            name = f"_f{len(self.fn_names)}"
            self.fn_names[target] = name
            self.globals[name] = target
        return name

    def const(self, value: Any) -> str:
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float):
            if math.isfinite(value):
                return repr(value)
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.const(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        name = f"_k{len(self.consts)}"
        self.consts[len(self.consts)] = name
        self.globals[name] = value
        return name

    def arg(self, a: Any, scratch: bool = False) -> str:
        if isinstance(a, torch.fx.Node):
            return f"_zl({self.var(a)})" if scratch else self.var(a)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.arg(v) for v in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.arg(v)}" for k, v in a.items()) + "}"
        return self.const(a)

    # ------------------------------------------------------------- nodes
    def call(self, n: torch.fx.Node, scratch_positions: tuple[int, ...] = ()) -> str:
        target = self.conv.functional.get(n, n.target)
        args = [self.arg(a, scratch=i in scratch_positions and a is not None) for i, a in enumerate(n.args)]
        kwargs = [f"{k}={self.arg(v)}" for k, v in n.kwargs.items()]
        return f"{self.fn(target)}({', '.join(args + kwargs)})"

    def emit_node(self, n: torch.fx.Node, keep: set[torch.fx.Node] | None = None, scratch: bool = False) -> None:
        """One trace node; ``keep``: on recomputation, the values to assign."""
        for a in _arg_nodes((n.args, n.kwargs)):
            self.ensure_view(a)
        positions = tuple(self.conv.pinned_writes.get(n, ())) if scratch else ()
        expr = self.call(n, positions)
        children = self.getitems.get(n)
        val = n.meta.get("val")
        if isinstance(val, (tuple, list)):
            self.lines.append(f"_r = {expr}")
            for g in children or []:
                if keep is None or g in keep:
                    self.lines.append(f"{self.var(g)} = _r[{g.args[1]}]")
                    self.view_epoch.pop(g, None)
            self.lines.append("_r = None")
        elif keep is None or n in keep:
            self.lines.append(f"{self.var(n)} = {expr}")
        else:
            self.lines.append(f"_ = {expr}")
            self.lines.append("_ = None")

    def ensure_view(self, a: torch.fx.Node) -> None:
        """Derives a view again when its owner was recomputed since."""
        tid = self.conv.tensor_of.get(a)
        if tid is None:
            return
        t = self.conv.tensors[tid]
        if t.view_of is None or t.version or t.placeholder is not None:
            return
        owner_epoch = self.epoch.get(t.owner, 0)
        if self.view_epoch.get(a, 0) == owner_epoch:
            return
        src = a.args[0] if a.target is operator.getitem else a
        for b in _arg_nodes((src.args, src.kwargs)):
            self.ensure_view(b)
        keep = set(self.getitems.get(src, [])) | {src}
        self.emit_node(src, keep=keep)
        for g in keep:
            if g in self.conv.tensor_of:
                self.view_epoch[g] = owner_epoch

    def owner_var(self, tid: int) -> str:
        t = self.conv.tensors[tid]
        if t.node is None:
            raise PlanError(f"tensor {tid} ({t.name}) has no value to swap or free")
        return self.var(t.node)


def generate(conv: Converted, plan: dict[str, Any], *, profile: bool = False,
             timeline: list[tuple[int, int]] | None = None) -> Generated:
    """The step function's source for ``plan`` (see the module docs).

    ``timeline``: the plan's steps as (stream, index) in the order its
    predicted iteration starts them, for a plan pinned to that iteration
    (``outcore._native.pin_to_timeline``); the steps are then issued in that
    order and copy streams' frees released in place.  Without it, the older
    merge that issues copies as early as their waits allow."""
    g = _Generation(conv, plan, profile, timeline)
    g.prologue()
    for s, i in g.order:
        g.step(s, i)
    return g.finish()


class _Generation:
    """The state of one ``generate`` call: the issue order, the events, the
    host copies and the frees still pending on copy streams, and the source
    lines emitted so far."""

    def __init__(self, conv: Converted, plan: dict[str, Any], profile: bool,
                 timeline: list[tuple[int, int]] | None):
        self.e = _Emitter(conv, plan, profile)
        self.conv = conv
        self.profile = profile
        self.timeline = timeline
        self.streams = streams = plan["streams"]
        self.order = (_timeline_order(streams, timeline) if timeline is not None
                      else _emission_order(streams))
        self.hoisted = _hoisted_swap_ins(streams, self.order) if timeline is not None else {}
        self.hoisted_at = {si: k for k, sis in self.hoisted.items() for si in sis}
        self._events_and_deferred_frees()
        self.residency = {int(t): r for t, r in plan.get("initial_residency", [])}
        self._host_copies()
        self.writes_in_place: dict[int, list[int]] = {}
        for op in conv.ops:
            for t in op.outputs:
                info = conv.tensors[t]
                if info.version:
                    self.writes_in_place.setdefault(op.id, []).append(info.owner)
        self.batch_host: list[int] = []
        self.returned: set[int] = set()
        self.n_rec = self.n_out = self.n_in = 0
        self.pending: dict[tuple[int, int], int] = {}
        self.step_lines: list[tuple[int, str, int]] = []
        self.n_updates = 0
        roles = ("param", "opt_state")
        self.updated_owners = {t.id for t in conv.tensors if t.placeholder is not None
                             and conv.captured.placeholders[t.placeholder].role in roles}

    def _describe(self, instr: Any) -> str:
        """A plan step in words, for a failure's message."""
        ops, tensors = self.conv.ops, self.conv.tensors
        if isinstance(instr, dict) and "compute" in instr:
            op = ops[int(instr["compute"])]
            return f"op {op.id} `{op.name}`" + (f" [{op.module}]" if op.module else "")
        if isinstance(instr, dict) and "recompute" in instr:
            op = ops[int(instr["recompute"]["op"])]
            return f"the recomputation of op {op.id} `{op.name}`"
        for key, words in (("swap_in", "the swap-in"), ("swap_out", "the swap-out"), ("free", "the free")):
            if isinstance(instr, dict) and key in instr:
                t = tensors[int(instr[key])]
                return f"{words} of `{t.name}` ({t.storage_nbytes} B)"
        return f"the plan step {instr!r}"

    def _events_and_deferred_frees(self) -> None:
        """Which steps need an event (those waited for, and frees on copy
        streams), and the deferred frees: copy-stream free -> first compute
        step ordered after it (issued in the timeline's order, a pinned plan
        releases them in place)."""
        streams = self.streams
        vc = _vector_clocks(streams, self.order)
        self.needs_event: set[tuple[int, int]] = set()
        for s in range(3):
            for step in streams[s]:
                for w in step.get("waits", []):
                    self.needs_event.add(_step_key(w))
        self.deferred: dict[int, list[tuple[int, int, int]]] = {}
        compute_clocks = [vc[(0, i)] for i in range(len(streams[0]))]
        for s in (1, 2) if self.timeline is None else ():
            for i, step in enumerate(streams[s]):
                instr = step["instr"]
                if isinstance(instr, dict) and "free" in instr:
                    self.needs_event.add((s, i))
                    at = next((c for c, clock in enumerate(compute_clocks) if clock[s] >= i), None)
                    if at is not None:
                        self.deferred.setdefault(at, []).append((s, i, int(instr["free"])))

    def _host_copies(self) -> None:
        """The host buffers of tensors that start the step on the host, and
        which host copies are current (for in-place writes the plan cannot
        see)."""
        cap = self.conv.captured
        self.host_buffers: dict[int, int] = {}
        self.host_valid: dict[int, bool] = {}
        for t in self.conv.tensors:
            if t.placeholder is not None and t.view_of is None:
                role = cap.placeholders[t.placeholder].role
                if role in ("input", "label"):
                    self.host_valid[t.id] = True
                elif self.residency.get(t.id, "device") != "device":
                    self.host_valid[t.id] = True
                    self.host_buffers[t.id] = t.storage_nbytes

    def ev(self, s: int, i: int) -> str:
        return f"e_{STREAMS[s]}_{i}"

    def waits_of(self, s: int, i: int) -> list[str]:
        return [self.ev(*_step_key(w)) for w in self.streams[s][i].get("waits", [])]

    def prologue(self) -> None:
        """Binds the inputs, pinned state and constants, takes host copies of
        a batch the plan swaps in first, and runs the riders before the first
        op."""
        e, conv, cap, L = self.e, self.conv, self.conv.captured, self.e.lines
        tensors = conv.tensors
        for i, ph in enumerate(cap.placeholders):
            node = [n for n in cap.gm.graph.nodes if n.op == "placeholder"][i]
            if ph.role == "input":
                L.append(f"{e.var(node)} = x")
            elif ph.role == "label":
                L.append(f"{e.var(node)} = y")
            else:
                L.append(f"{e.var(node)} = _ph[{i}]")
        for n in cap.gm.graph.nodes:
            if n.op == "get_attr":
                L.append(f"{e.var(n)} = {e.const(getattr(cap.gm, n.target))}")
        L.append("_start()")
        first_swap: dict[int, str] = {}
        for s, i in self.order:
            instr = self.streams[s][i]["instr"]
            if isinstance(instr, dict):
                for k in ("swap_in", "swap_out"):
                    if k in instr:
                        first_swap.setdefault(int(instr[k]), k)
        for tid, k in first_swap.items():
            t = tensors[tid]
            if k == "swap_in" and t.placeholder is not None and cap.placeholders[t.placeholder].role in ("input", "label"):
                self.batch_host.append(tid)
                self.host_buffers[tid] = t.storage_nbytes
        if self.batch_host:
            L.append("_batch_host(" + ", ".join(f"({e.owner_var(t)}, _H[{t}])" for t in self.batch_host) + ")")
        for n in conv.prologue:
            e.emit_node(n)
        out_node = [n for n in cap.gm.graph.nodes if n.op == "output"][0]
        self.returned = {tensors[conv.tensor_of[a]].owner for a in _arg_nodes(out_node.args) if a in conv.tensor_of}

    def step(self, s: int, i: int) -> None:
        """The source of plan step ``i`` of stream ``s``."""
        instr = self.streams[s][i]["instr"]
        waits = self.waits_of(s, i)
        # body line k is source line k + 2 (after ``def step(x, y):``)
        self.step_lines.append((len(self.e.lines) + 2, self._describe(instr), self.n_updates))
        if s == 0:
            self._before_compute_step(i)
        if isinstance(instr, dict) and "compute" in instr:
            self._compute(int(instr["compute"]), waits)
        elif isinstance(instr, dict) and "recompute" in instr:
            self._recompute(instr["recompute"], waits)
        elif isinstance(instr, dict) and "swap_out" in instr:
            self._swap_out(s, i, int(instr["swap_out"]), waits)
        elif isinstance(instr, dict) and "swap_in" in instr:
            self._swap_in(s, i, int(instr["swap_in"]), waits)
        elif isinstance(instr, dict) and "free" in instr:
            self._free(s, i, int(instr["free"]), waits)
        else:
            raise PlanError(f"unknown plan instruction {instr!r}")
        if (s, i) in self.needs_event and s == 0:
            self.e.lines.append(f"{self.ev(s, i)} = _rec(0)")

    def _before_compute_step(self, i: int) -> None:
        """Before compute step ``i``: the memory of swap-ins hoisted to it, and
        the copy-stream frees deferred to it."""
        L, tensors = self.e.lines, self.conv.tensors
        for hs, hi in self.hoisted.get(i, []):
            tid = int(self.streams[hs][hi]["instr"]["swap_in"])
            L.append(f"_pa_{hs}_{hi} = _sa({self.e.owner_var(tid)}, {tensors[tid].storage_nbytes})")
        for fs, fi, tid in self.deferred.get(i, []):
            if (fs, fi) in self.pending:
                del self.pending[(fs, fi)]
                L.append(f"_wait_c({self.ev(fs, fi)})")
                L.append(f"_free(_pf_{fs}_{fi})")
                L.append(f"_pf_{fs}_{fi} = None")

    def _compute(self, op_id: int, waits: list[str]) -> None:
        e, conv, L = self.e, self.conv, self.e.lines
        op = conv.ops[op_id]
        if waits:
            L.append(f"_wait_c({', '.join(waits)})")
        L.append(f"# op {op.id}: {op.name}" + (f" [{op.module}]" if op.module else ""))
        if self.profile:
            L.append("_t0 = _tick()")
        for n in op.nodes:
            e.emit_node(n)
            for g in [n] + e.getitems.get(n, []):
                if g in conv.tensor_of:
                    e.view_epoch[g] = e.epoch.get(conv.tensors[conv.tensor_of[g]].owner, 0)
        if self.profile:
            L.append(f"_tock({op.id}, _t0)")
            e.timed_ops.append(op.id)
        for r in op.riders:
            e.emit_node(r)
        for owner in self.writes_in_place.get(op.id, []):
            self.host_valid[owner] = False
            if owner in self.updated_owners:
                self.n_updates += 1

    def _recompute(self, rc: dict[str, Any], waits: list[str]) -> None:
        e, tensors, L = self.e, self.conv.tensors, self.e.lines
        op = self.conv.ops[int(rc["op"])]
        if not op.recomputable:
            raise UnsupportedOpError(
                f"the plan recomputes op `{op.name}` ({op.label}), which cannot be recomputed: "
                f"{op.why_not_recomputable}; re-plan (the graph marks it not recomputable)"
            )
        if waits:
            L.append(f"_wait_c({', '.join(waits)})")
        keep = {tensors[int(t)].node for t in rc["outputs"]}
        L.append(f"# recompute op {op.id}: {op.name} -> {', '.join(str(tensors[int(t)].name) for t in rc['outputs'])}")
        for n in op.nodes:
            e.emit_node(n, keep=keep, scratch=True)
        for t in rc["outputs"]:
            owner = tensors[int(t)].owner
            e.epoch[owner] = e.epoch.get(owner, 0) + 1
            node = tensors[int(t)].node
            e.view_epoch[node] = e.epoch[owner]
        self.n_rec += 1

    def _swap_out(self, s: int, i: int, tid: int, waits: list[str]) -> None:
        e, tensors = self.e, self.conv.tensors
        self.host_buffers[tid] = tensors[tid].storage_nbytes
        name = self.ev(s, i) if (s, i) in self.needs_event else "_"
        e.lines.append(f"{name} = _so({e.owner_var(tid)}, _H[{tid}], ({', '.join(waits)}{',' if len(waits) == 1 else ''}), {tid})")
        self.host_valid[tid] = True
        self.n_out += 1
        if self.profile:
            e.timed_copies.append((tid, "d2h"))

    def _swap_in(self, s: int, i: int, tid: int, waits: list[str]) -> None:
        e, tensors, L = self.e, self.conv.tensors, self.e.lines
        if not self.host_valid.get(tid, False):
            raise PlanError(
                f"the plan swaps in `{tensors[tid].name}` from a host copy that an in-place op "
                "has made stale (outcore's lowering does not see in-place writes to activations); "
                "re-plan with another planner or a larger budget"
            )
        self.host_buffers.setdefault(tid, tensors[tid].storage_nbytes)
        for key, pt in list(self.pending.items()):
            if pt == tid:
                # freed on a copy stream but not yet released: the storage
                # is still there; the copy below rewrites the same bytes
                del self.pending[key]
                L.append(f"_pf_{key[0]}_{key[1]} = None")
        name = self.ev(s, i) if (s, i) in self.needs_event else "_"
        pre = f"_pa_{s}_{i}" if (s, i) in self.hoisted_at else "None"
        L.append(f"{name} = _si({e.owner_var(tid)}, _H[{tid}], {tensors[tid].storage_nbytes}, ({', '.join(waits)}{',' if len(waits) == 1 else ''}), {tid}, {pre})")
        self.n_in += 1
        if self.profile:
            e.timed_copies.append((tid, "h2d"))

    def _free(self, s: int, i: int, tid: int, waits: list[str]) -> None:
        e, L = self.e, self.e.lines
        if s != 0 and self.timeline is not None:
            # released where it stands: every later allocating step of the
            # pinned plan waits for this stream up to here or further
            if waits:
                L.append(f"_wait_s({s}, {', '.join(waits)})")
            if (s, i) in self.needs_event:
                L.append(f"{self.ev(s, i)} = _rec({s})")
            if tid not in self.returned:
                L.append(f"_free({e.owner_var(tid)})")
        elif s == 0:
            if waits:
                L.append(f"_wait_c({', '.join(waits)})")
            if tid not in self.returned:  # a returned tensor belongs to the caller
                L.append(f"_free({e.owner_var(tid)})")
        else:
            # the event marks the free; the storage is released where a
            # compute step is ordered after it (see `deferred`), through a
            # reference taken now (a recomputation may rebind the name)
            if waits:
                L.append(f"_wait_s({s}, {', '.join(waits)})")
            L.append(f"{self.ev(s, i)} = _rec({s})")
            if tid not in self.returned:
                L.append(f"_pf_{s}_{i} = {e.owner_var(tid)}")
                self.pending[(s, i)] = tid

    def finish(self) -> Generated:
        """Joins the streams, releases the frees still pending, returns the
        step's outputs, and the function's source with what runs it."""
        e, conv, L = self.e, self.conv, self.e.lines
        cap, tensors = conv.captured, conv.tensors
        self.step_lines.append((len(L) + 2, "the step's end (the streams joined)", self.n_updates))
        L.append("_join()")
        for (fs, fi), tid in self.pending.items():
            L.append(f"_free(_pf_{fs}_{fi})")
        out = [n for n in cap.gm.graph.nodes if n.op == "output"][0]
        outs = ", ".join(e.var(a) for a in out.args[0])
        L.append(f"return ({outs},)")
        body = "\n".join("    " + line for line in L)
        source = "def step(x, y):\n" + body + "\n"
        return Generated(
            source=source,
            globals=e.globals,
            host_buffers=self.host_buffers,
            initial_residency={t: r for t, r in self.residency.items()},
            batch_host_copies=[tensors[t].placeholder for t in self.batch_host],
            timed_ops=e.timed_ops,
            timed_copies=e.timed_copies,
            n_recomputes=self.n_rec,
            n_swap_outs=self.n_out,
            n_swap_ins=self.n_in,
            step_lines=self.step_lines,
            n_updates=self.n_updates,
        )
