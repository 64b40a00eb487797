"""The step function: capture, plan, generate, and run under the plan.

``compile_step`` captures one training step, converts it, plans it with
outcore's Rust planners under the budget, generates straight-line code from
the plan and returns a :class:`StepFunction`.  Calling it trains one step: the
optimizer runs inside the generated code and updates the parameters and its
state in place.  A change of batch shape, of hyper-parameters or of the
optimizer's state structure (the first step creates SGD's momentum buffers)
captures and plans again (cached per signature); the step with the state
the first step creates is planned ahead, at ``compile_step``.

Budgets: bytes (``int``), a size (``"12GiB"``), a percentage of the step's
footprint (``"60%"``), or a fraction of the device's memory (``float`` in
(0, 1]).  The planner gets the budget less the pinned state (batch-norm
statistics, constants) and less ``headroom`` (kernel workspaces and the caching
allocator's rounding, which the graph does not hold); ``enforce=True`` caps the
CUDA caching allocator at the budget with
``torch.cuda.set_per_process_memory_fraction`` (process-wide).

Nothing is mutated before planning succeeds: a capture, conversion or
planning error (unsupported op, budget below the largest op's working set,
no feasible plan) raises and leaves model and optimizer as they were.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

import outcore

from ..errors import CaptureError, InfeasibleError, InvalidValueError, OutcoreError
from .capture import Captured, capture_steady_step, capture_step, step_signature
from .codegen import Generated, StepLocation, generate
from .convert import Converted, convert, to_graph_json

DEFAULT_PLANNERS = (
    "none,checkpoint-sqrt,checkpoint-all,superneurons,capuchin,window,odswap,lms,vdnn-conv,vdnn-all"
)


def _flat(t: torch.Tensor, nbytes: int | None = None) -> torch.Tensor:
    """The whole storage of ``t`` as a flat uint8 tensor."""
    st = t.untyped_storage()
    n = st.nbytes() if nbytes is None else nbytes
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, 0, (n,), (1,))


class _Runtime:
    """What the generated code calls: streams, events, copies, frees.

    On the CPU every stream operation is a no-op and copies are synchronous.
    """

    def __init__(self, device: torch.device, profile: bool = False,
                 latest_host: dict[int, torch.Tensor] | None = None):
        self.cuda = device.type == "cuda"
        self.device = device
        self.profile = profile
        self.op_times: dict[int, list[Any]] = {}
        self.copy_times: dict[tuple[int, str], list[Any]] = {}
        #: op -> bytes each run allocated and released inside the op (CUDA)
        self.op_transient_bytes: dict[int, list[int]] = {}
        #: device storage (its ``_cdata``) -> the host buffer last copied from
        #: it, so that a step that fails can put persistent tensors back;
        #: shared by the plain and the profiled runtime of one compiled step
        self.latest_host: dict[int, torch.Tensor] = {} if latest_host is None else latest_host
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.h2d = torch.cuda.Stream(device)
            self.d2h = torch.cuda.Stream(device)
            self.streams = [self.compute, self.h2d, self.d2h]

    def bind(self) -> dict[str, Any]:
        return {
            "_start": self.start, "_join": self.join, "_rec": self.rec, "_wait_c": self.wait_c,
            "_wait_s": self.wait_s, "_so": self.swap_out, "_si": self.swap_in, "_sa": self.alloc_in, "_free": self.free,
            "_zl": torch.zeros_like, "_batch_host": self.batch_host, "_tick": self.tick,
            "_tock": self.tock,
        }

    # streams and events
    def start(self) -> None:
        if self.cuda:
            self.compute = torch.cuda.current_stream(self.device)
            self.streams[0] = self.compute
            e = self.compute.record_event()
            self.h2d.wait_event(e)
            self.d2h.wait_event(e)

    def join(self) -> None:
        if self.cuda:
            self.compute.wait_stream(self.h2d)
            self.compute.wait_stream(self.d2h)

    def rec(self, s: int) -> Any:
        return self.streams[s].record_event() if self.cuda else None

    def wait_c(self, *events: Any) -> None:
        if self.cuda:
            for e in events:
                if e is not None:
                    self.compute.wait_event(e)

    def wait_s(self, s: int, *events: Any) -> None:
        if self.cuda:
            for e in events:
                if e is not None:
                    self.streams[s].wait_event(e)

    # copies and memory
    def swap_out(self, dev: torch.Tensor, host: torch.Tensor, waits: tuple, tid: int) -> Any:
        self.latest_host[dev.untyped_storage()._cdata] = host
        if not self.cuda:
            t0 = time.perf_counter() if self.profile else 0.0
            host.copy_(_flat(dev))
            if self.profile:
                self.copy_times.setdefault((tid, "d2h"), []).append(time.perf_counter() - t0)
            return None
        s = self.d2h
        for e in waits:
            if e is not None:
                s.wait_event(e)
        with torch.cuda.stream(s):
            start = s.record_event(torch.cuda.Event(enable_timing=True)) if self.profile else None
            host.copy_(_flat(dev), non_blocking=True)
            end = s.record_event(torch.cuda.Event(enable_timing=self.profile))
        if self.profile:
            self.copy_times.setdefault((tid, "d2h"), []).append((start, end))
        return end

    @staticmethod
    def _take(dev: torch.Tensor, nbytes: int) -> None:
        """A released storage's device memory back (on the compute stream,
        see codegen); nothing if it has it."""
        st = dev.untyped_storage()
        if st.nbytes() != nbytes:
            st.resize_(nbytes)

    def alloc_in(self, dev: torch.Tensor, nbytes: int) -> Any:
        """Takes a swap-in's device memory ahead of its copy (on the compute
        stream); the event the copy waits for instead of the compute stream
        where the copy is issued."""
        self._take(dev, nbytes)
        return self.compute.record_event() if self.cuda else None

    def swap_in(self, dev: torch.Tensor, host: torch.Tensor, nbytes: int, waits: tuple, tid: int,
                taken: Any = None) -> Any:
        self._take(dev, nbytes)
        if not self.cuda:
            t0 = time.perf_counter() if self.profile else 0.0
            _flat(dev, nbytes).copy_(host)
            if self.profile:
                self.copy_times.setdefault((tid, "h2d"), []).append(time.perf_counter() - t0)
            return None
        s = self.h2d
        s.wait_event(taken if taken is not None else self.compute.record_event())
        for e in waits:
            if e is not None:
                s.wait_event(e)
        with torch.cuda.stream(s):
            start = s.record_event(torch.cuda.Event(enable_timing=True)) if self.profile else None
            _flat(dev, nbytes).copy_(host, non_blocking=True)
            end = s.record_event(torch.cuda.Event(enable_timing=self.profile))
        if self.profile:
            self.copy_times.setdefault((tid, "h2d"), []).append((start, end))
        return end

    @staticmethod
    def free(t: torch.Tensor) -> None:
        t.untyped_storage().resize_(0)

    def batch_host(self, *pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Host copies of batch inputs that the plan swaps in before any swap-out."""
        for dev, host in pairs:
            if self.cuda:
                self.d2h.wait_event(self.compute.record_event())
                with torch.cuda.stream(self.d2h):
                    host.copy_(_flat(dev), non_blocking=True)
                self.compute.wait_stream(self.d2h)
            else:
                host.copy_(_flat(dev))

    # profiling
    def tick(self) -> Any:
        if self.cuda:
            # the caching allocator's counts follow the host: the peak between
            # here and tock is the op's own, whatever the device is running
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            return (self.compute.record_event(torch.cuda.Event(enable_timing=True)), before)
        return time.perf_counter()

    def tock(self, op: int, t0: Any) -> None:
        if self.cuda:
            # The end event first: the two reads of the allocator's
            # statistics below cost the host about 0.3 ms on an H200, and a
            # device waiting for the host would count that into the op (read
            # first, they made `detach` measure 351 us instead of 17).
            end = self.compute.record_event(torch.cuda.Event(enable_timing=True))
            start, before = t0
            after = torch.cuda.memory_allocated(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.op_transient_bytes.setdefault(op, []).append(max(0, peak - max(before, after)))
            self.op_times.setdefault(op, []).append((start, end))
        else:
            self.op_times.setdefault(op, []).append(time.perf_counter() - t0)

    def resolve_times(self) -> tuple[dict[int, list[float]], dict[tuple[int, str], list[float]]]:
        if self.cuda:
            torch.cuda.synchronize(self.device)

        def sec(v: Any) -> float:
            if isinstance(v, tuple):
                return v[0].elapsed_time(v[1]) / 1e3
            return float(v)

        ops = {k: [sec(v) for v in vs] for k, vs in self.op_times.items()}
        copies = {k: [sec(v) for v in vs] for k, vs in self.copy_times.items()}
        return ops, copies


@dataclass
class Compiled:
    """One captured, planned and generated step (for one signature)."""

    captured: Captured
    converted: Converted
    graph: Any
    graph_path: str
    plan_result: Any
    plan_json: dict[str, Any]
    generated: Generated
    fn: Callable[..., Any]
    runtime: _Runtime
    planner_budget_bytes: int
    budget_bytes: int
    host: dict[int, torch.Tensor] = field(default_factory=dict)
    profile_fn: Callable[..., Any] | None = None
    profile_runtime: _Runtime | None = None
    profile_generated: Generated | None = None
    #: the pinned plan's steps (stream, index) in the order they are issued
    timeline: list[tuple[int, int]] | None = None


#: how the generated code orders the plan's steps (see ``compile_step``)
ISSUE_ORDERS = ("early", "timeline")

#: (allocator, issue order, headroom) of a step compiled on CUDA where
#: ``compile_step`` is given none of them.  PyTorch's expandable segments
#: (``virtual-chunks``) issued in the simulated order, with 12% of the budget
#: kept for the kernels' workspaces: on an H200 on 2026-12-04 (RESULTS.md, "Why
#: planned steps ran out of memory") runs under it trained 7 times in 8 and no
#: other setting was faster by more than the single runs' spread, while under
#: the caching allocator's ordinary segments (``best-fit-paged``) ResNet-50 at
#: a quarter of eager's peak and every swap-only plan of ``auto`` ran out of
#: memory in all 10 runs: the kernels' own temporary blocks (attention
#: backward, cuDNN workspaces) fragment them in ways no plan's allocator model
#: sees.
CUDA_DEFAULTS = ("virtual-chunks", "timeline", 0.12)
#: the same for every other device: its allocator does not cache blocks the
#: way CUDA's does, so the plan's allocator only shapes the plan
OTHER_DEFAULTS = ("best-fit-paged", "early", 0.0)

#: The most a headroom left to the device's default rises to after planned
#: steps ran out of memory (:meth:`StepFunction._after_out_of_memory`).
MAX_ADAPTED_HEADROOM = 0.5

#: PyTorch's out-of-memory error (``torch.cuda.OutOfMemoryError`` is the same
#: class in the torch versions that have both)
_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def is_out_of_memory(err: BaseException) -> bool:
    """PyTorch's out-of-memory error, or a ``RuntimeError`` that says out of
    memory (as some library calls on CUDA report it); the bench's failure
    records read errors the same way."""
    return isinstance(err, _OUT_OF_MEMORY) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def raised_headroom(headroom: float) -> float:
    """The headroom after a planned step ran out of memory: half again, at
    least 4 points of the budget more, at most :data:`MAX_ADAPTED_HEADROOM`.

    Why these steps: on an H200 (2026-12-04, RESULTS.md "Why planned steps
    ran out of memory") ResNet-50 b128 at a quarter of eager's peak trained
    at 12% and at 15% headroom, but one plan of eight ran out of memory at
    12%; one kernel's temporaries that no plan holds were from 3.7% (GPT-2
    b8's 384 MiB attention blocks in a 10.97 GB budget) to 18% (a 520 MB
    cuDNN workspace in ResNet-50 b128's 2.85 GB) of the budget.
    Half again reaches 0.18, 0.27, 0.41 and 0.5 from CUDA's 0.12, so a plan
    that keeps failing hands back at most 4 failed steps before the budget
    left to the planner is half; 4 points first where the default is 0."""
    return min(MAX_ADAPTED_HEADROOM, max(headroom * 1.5, headroom + 0.04))


def _failed_at(gen: Generated, err: BaseException) -> StepLocation | None:
    """The plan step whose generated line is the innermost one on ``err``'s
    traceback, or ``None`` where the step's code is not on it."""
    line = None
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<outcore step"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return gen.locate(line) if line is not None else None


def _cuda_memory_held(device: torch.device) -> str:
    """What PyTorch's caching allocator held when a step failed, as a
    sentence for its error ("" off CUDA): reserved far above allocated is
    fragmentation, allocated near the budget what the plan did not model."""
    if device.type != "cuda":
        return ""
    allocated = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    return f" PyTorch held {allocated} B allocated and {reserved} B reserved when it failed."


def _add_note(err: BaseException, note: str) -> None:
    """``err.add_note(note)`` (Python 3.11+); a warning on older Pythons."""
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:
        warnings.warn(note, RuntimeWarning, stacklevel=3)


def available_host_bytes() -> int | None:
    """Host memory available now (``MemAvailable``), or ``None`` if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _use_expandable_segments() -> None:
    """Turns on PyTorch's expandable segments (process-wide, for the segments
    created from now on): the caching allocator then maps 2 MiB pages into one
    growing virtual range per stream instead of a ``cudaMalloc`` per segment,
    which is what the ``virtual-chunks`` allocator the plan was made for
    models (2 MiB chunks, small requests packed into a small pool)."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:  # torch before the accelerator-generic allocator settings
        setter = torch.cuda.memory._set_allocator_settings
    setter("expandable_segments:True")


def _tf32_on(chain: Sequence[Any], legacy: Callable[[], bool]) -> bool:
    """Whether TF32 is on for one op family: the first of ``chain`` (the most
    specific backend first) whose ``fp32_precision`` is not ``"none"``
    decides (``"tf32"``: on); all ``"none"``: off, PyTorch's meaning.  Torch
    without that API: the legacy ``allow_tf32`` flag (``legacy``)."""
    values = [getattr(obj, "fp32_precision", None) for obj in chain]
    if all(v is None for v in values):
        return bool(legacy())
    for v in values:
        if v not in (None, "none"):
            return v == "tf32"
    return False


def torch_tf32_mode() -> str:
    """Which float32 ops PyTorch runs on TF32 tensor cores, as a device
    profile's ``tf32`` mode: convolutions by ``torch.backends.cudnn.conv``'s
    precision (TF32 by default), matrix products by
    ``torch.backends.cuda.matmul``'s (IEEE by default), each falling back to
    its parents' (``torch.backends.cudnn``, ``torch.backends``).  The new
    ``fp32_precision`` settings are read rather than the legacy
    ``allow_tf32`` flags, which raise once the new ones are used.  Planning for
    the mode the step runs in matters: on an H100 the roofline priced
    ResNet-50's step 1.49x and VGG-16's 2.84x too slow with every float32 op
    on the CUDA cores, and 0.86x / 1.15x with convolutions on TF32
    (RESULTS.md)."""
    b = torch.backends
    conv = _tf32_on([getattr(b.cudnn, "conv", None), b.cudnn, b], lambda: b.cudnn.allow_tf32)
    matmul = _tf32_on([b.cuda.matmul, b], lambda: b.cuda.matmul.allow_tf32)
    return {(False, False): "off", (True, False): "convolutions", (False, True): "matmuls",
            (True, True): "all"}[(conv, matmul)]


def _device_profile_for(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        for key, prof in (("h200", "h200-141gb"), ("h100", "h100-80gb"), ("a100", "a100-40gb"),
                          ("a6000", "a6000-48gb"), ("v100", "v100-16gb-pcie3"), ("2080", "rtx2080ti-11gb")):
            if key in name:
                return prof
    return "a100-40gb"


def _device_memory_bytes(device: torch.device, profile: str) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(outcore.device_profile(profile)["memory_bytes"])


def parse_budget(budget: int | float | str, *, footprint_bytes: int, device_memory_bytes: int) -> int:
    """Bytes of a budget given as bytes, a size, a percentage of the footprint,
    or a fraction of the device's memory."""
    if isinstance(budget, bool):
        raise InvalidValueError(f"budget `{budget!r}`: not a number of bytes, a size, a percentage or a fraction")
    if isinstance(budget, float):
        if not (0.0 < budget <= 1.0):
            raise InvalidValueError(
                f"budget fraction `{budget}`: out of range; accepted: a fraction in (0, 1] of the "
                f"device's {device_memory_bytes} bytes, bytes (int), a size like '12GiB' or a percentage like '60%'"
            )
        return int(budget * device_memory_bytes)
    if isinstance(budget, int):
        if budget <= 0:
            raise InvalidValueError(f"budget `{budget}`: must be a positive number of bytes")
        return budget
    if isinstance(budget, str):
        return outcore._native.parse_budget(budget, footprint_bytes)
    raise InvalidValueError(f"budget `{budget!r}`: not bytes, a size, a percentage or a fraction")


def _apply_measured_workspaces(conv: Converted, latency_table: str) -> int:
    """Raises each op's workspace to the bytes a profiled run allocated and
    released inside it (``workspace_bytes`` of the table's entries, which
    :meth:`StepFunction.profile` measures on CUDA: cuDNN and cuBLAS
    workspaces, ops' own temporaries such as the 384 MiB inside each of
    GPT-2's attention softmax backwards), so the planner keeps room for them.
    Entries of ops this graph lacks, or names that differ, are skipped (the
    planner checks the table against the graph and names them); a
    ``workspace_bytes`` that is not a whole number of bytes is an error.
    Returns how many ops changed."""
    try:
        with open(latency_table, encoding="utf-8-sig") as f:
            entries = json.load(f).get("entries", [])
    except (OSError, ValueError, AttributeError):
        return 0  # the planner reports what is wrong with the file
    changed = 0
    for e in entries:
        if not isinstance(e, dict):
            continue
        op, ws = e.get("op"), e.get("workspace_bytes")
        if ws is None or not isinstance(op, int):
            continue
        if not isinstance(ws, int) or isinstance(ws, bool) or ws < 0:
            raise InvalidValueError(
                f"latency table {latency_table}: entry of op {op} ({e.get('name')!r}) has workspace_bytes "
                f"`{ws!r}`; accepted: a whole number of bytes >= 0 (what StepFunction.profile writes), "
                "or no such field"
            )
        if 0 <= op < len(conv.ops) and conv.ops[op].name == e.get("name") and ws > conv.ops[op].workspace_bytes:
            conv.ops[op].workspace_bytes = ws
            changed += 1
    if changed:
        conv.graph_json = to_graph_json(conv)
    return changed


def _largest_working_set(conv: Converted) -> tuple[int, str]:
    size = {t.id: t.size_bytes for t in conv.tensors}
    owner = {t.id: t.owner for t in conv.tensors}
    best = (0, "")
    for op in conv.ops:
        owners = {owner[t] for t in op.inputs + op.outputs}
        b = sum(size[o] for o in owners) + op.workspace_bytes
        if b > best[0]:
            best = (b, op.name)
    return best


def _batch_tensor(t: Any, name: str) -> torch.Tensor:
    """``t`` as the step may consume it: refused when it is not a tensor or
    an earlier step consumed it (its storage released, or emptied by
    :func:`_empty_if_released`); a copy when it does not own exactly its
    storage (a view: releasing its storage would release the tensor it
    views, a whole dataset, say); else ``t`` itself."""
    if not isinstance(t, torch.Tensor):
        raise InvalidValueError(f"batch `{name}`: a {type(t).__name__}, not a torch.Tensor; pass the step a tensor")
    storage_bytes = t.untyped_storage().nbytes()
    if t.numel() == 0 or storage_bytes == 0:
        raise InvalidValueError(
            f"batch `{name}` (shape {tuple(t.shape)}, {storage_bytes} B of storage) holds no data: a step consumes "
            "its batch (the plan releases its storage after its last use), so a tensor passed to an earlier "
            "step cannot be passed again; pass a new batch, or clones (step(x.clone(), y.clone())) to keep one")
    own_bytes = t.numel() * t.element_size()
    if t._base is not None or t.storage_offset() != 0 or storage_bytes != own_bytes:
        # the copy keeps a dense layout's strides (channels-last stays so)
        return t.clone()
    return t


def _empty_if_released(t: Any) -> None:
    """After a step: a batch tensor whose storage the plan released becomes
    an empty tensor, so that reading it is an empty result, not a read of
    released memory (which crashes the process)."""
    if isinstance(t, torch.Tensor) and t.numel() > 0 and t.untyped_storage().nbytes() == 0:
        with torch.no_grad():
            t.set_(torch.empty(0, dtype=t.dtype, device=t.device))


def _check_headroom(headroom: Any) -> None:
    """``headroom`` is a fraction of the budget in [0, 1) (a float) or bytes
    (a whole number >= 0): a negative one would plan above the budget it
    enforces, and one of the whole budget leaves the planner nothing."""
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)):
        raise InvalidValueError(f"headroom `{headroom!r}`: not a number; accepted: a fraction of the budget "
                                "in [0, 1) such as 0.08, or a whole number of bytes >= 0")
    if isinstance(headroom, float) and not (math.isfinite(headroom) and 0.0 <= headroom < 1.0):
        raise InvalidValueError(f"headroom `{headroom}`: a fraction of the budget must be in [0, 1), "
                                "e.g. 0.08 (or give a whole number of bytes)")
    if isinstance(headroom, int) and headroom < 0:
        raise InvalidValueError(f"headroom `{headroom}`: bytes kept from the planner must be >= 0, "
                                "e.g. 0 or 268435456 (or give a fraction of the budget such as 0.08)")


class StepFunction:
    """Trains one step under an outcore plan per call: ``loss = step(x, y)``.

    Attributes of the current compilation: :attr:`plan_result` (the Rust
    planner's result: plan, verification, simulated report), :attr:`source`
    (the generated code), :attr:`stats` (measured peaks of the last call).
    """

    def __init__(self, model: nn.Module, loss_fn, optimizer, *, budget, planner: str,
                 device_profile: str | None, allocator: str | None, headroom: float | int | None,
                 latency_table: str | None, seed: int, time_limit_s: float, enforce: bool,
                 issue_order: str | None = None, moves: int | None = None):
        if issue_order is not None and issue_order not in ISSUE_ORDERS:
            raise InvalidValueError(f"issue_order `{issue_order}`: not one of {', '.join(ISSUE_ORDERS)} "
                                    "(see compile_step)")
        if headroom is not None:
            _check_headroom(headroom)
        if moves is not None and planner == "auto":
            raise InvalidValueError(
                f"moves `{moves}` with planner `auto`: `auto` compares planners that count no moves "
                f"({DEFAULT_PLANNERS}); accepted: moves with planner 'outcore' or 'outcore-recompute', "
                "or no moves"
            )
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.budget = budget
        self.planner = planner
        self.device_profile = device_profile
        self.allocator = allocator
        self.headroom = headroom
        #: left to the device's default: it rises after a planned step runs
        #: out of memory (:meth:`_after_out_of_memory`)
        self._adaptive_headroom = headroom is None
        #: planned steps that ran out of memory and so raised the headroom
        self.replans_after_oom = 0
        #: where the last step that raised failed, in the plan's terms
        #: (``None`` before any failure, or where no generated line was on
        #: the traceback)
        self.last_failure: StepLocation | None = None
        self.latency_table = latency_table
        self.seed = seed
        self.time_limit_s = time_limit_s
        self.moves = moves
        self.enforce = enforce
        self.issue_order = issue_order
        self._expandable = False
        self._cache: dict[tuple, Compiled] = {}
        #: plans by (graph JSON, planner budget, profile): the step with the
        #: optimizer's state, planned ahead by :meth:`check_steady`
        self._plans: dict[tuple, Any] = {}
        self._current: Compiled | None = None
        self._host_resident: dict[int, bool] = {}
        self._budget_bytes: int | None = None
        self.stats: dict[str, Any] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="outcore-torch-")

    # ------------------------------------------------------------- compile
    def compile(self, batch: Sequence[torch.Tensor]) -> Compiled:
        sig = step_signature(self.model, self.optimizer, batch)
        hit = self._cache.get(sig)
        if hit is not None:
            self._current = hit
            return hit
        cap = capture_step(self.model, self.loss_fn, self.optimizer, batch)
        self._resolve_defaults(cap.device)
        if cap.device.type == "cuda" and self.allocator == "virtual-chunks" and not self._expandable:
            # before the plan's first allocation; the cached ordinary segments
            # go back so that new memory comes from expandable ones
            _use_expandable_segments()
            torch.cuda.empty_cache()
            self._expandable = True
        conv, graph, path, budget_bytes, planner_budget, result = self._planned_graph(cap, f"graph{len(self._cache)}")
        # "timeline": issued in the order the plan's predicted iteration
        # starts its steps, with the waits that order that iteration's frees
        # (``outcore._native.pin_to_timeline``): the caching allocator then
        # sees the allocations and frees the plan's allocator model was checked on
        timeline = None
        plan = result.plan
        if self.issue_order == "timeline":
            plan, timeline_json = outcore._native.pin_to_timeline(result.plan, self.latency_table)
            timeline = [(int(r[0]), int(r[1])) for r in json.loads(timeline_json)]
        plan_json = json.loads(plan.to_json())
        verification = outcore.verify(plan, graph)
        if not verification.passed:
            raise outcore.PlanError(f"the plan fails verification: {verification.violations[:3]}")
        gen = generate(conv, plan_json, timeline=timeline)
        runtime = _Runtime(cap.device)
        glb = {"__builtins__": __builtins__, "_ph": [ph.tensor for ph in cap.placeholders], **gen.globals, **runtime.bind()}
        code = compile(gen.source, f"<outcore step {cap.model_name}>", "exec")
        exec(code, glb)  # noqa: S102 - our own generated source
        compiled = Compiled(cap, conv, graph, path, result, plan_json, gen, glb["step"], runtime,
                            planner_budget, budget_bytes, timeline=timeline)
        glb["_H"] = compiled.host
        self._alloc_host(compiled)
        self._cache[sig] = compiled
        self._current = compiled
        return compiled

    def _planned_graph(self, cap: Captured, name: str):
        """Converts ``cap`` and plans it under the step's budget: the
        converted step, its graph (written as ``name``.json), the budget, the
        planner's share of it and the plan.  A graph planned before under
        the same budget and profile (the step with the optimizer's state,
        checked by :meth:`check_steady`) takes that plan again."""
        conv = convert(cap)
        if self.latency_table is not None:
            _apply_measured_workspaces(conv, self.latency_table)
        text = json.dumps(conv.graph_json)
        path = os.path.join(self._tmp.name, f"{name}.json")
        with open(path, "w") as f:
            f.write(text)
        graph = outcore.load_graph(path=path)
        profile = self._with_tf32(self.device_profile or _device_profile_for(cap.device), cap.device)
        memory = _device_memory_bytes(cap.device, profile)
        if self._budget_bytes is None:
            # Resolved once, on the first graph: later graphs of the same step
            # (after the optimizer created its state) keep the same bytes.
            self._budget_bytes = parse_budget(
                self.budget, footprint_bytes=graph.footprint_bytes + conv.pinned_bytes, device_memory_bytes=memory
            )
        budget_bytes = self._budget_bytes
        headroom = (int(self.headroom * budget_bytes) if isinstance(self.headroom, float) else int(self.headroom))
        if headroom >= budget_bytes:
            raise InvalidValueError(
                f"headroom `{self.headroom}`: {headroom} B kept from the planner is not below the budget of "
                f"{budget_bytes} B, so the graph would get nothing; accepted: a whole number of bytes below the "
                "budget, or a fraction of it in [0, 1) such as 0.08")
        planner_budget = budget_bytes - conv.pinned_bytes - headroom
        need, op_name = _largest_working_set(conv)
        if planner_budget < need:
            raise InfeasibleError(
                f"the budget {budget_bytes} B leaves {planner_budget} B for the graph (pinned module "
                f"state {conv.pinned_bytes} B, headroom {headroom} B), below op `{op_name}`'s working set of "
                f"{need} B (its inputs, outputs and workspace must be on the device at once); give a budget "
                f"of at least {need + conv.pinned_bytes + headroom} B or a smaller batch"
            )
        key = (text, planner_budget, profile)
        result = self._plans.get(key)
        if result is None:
            try:
                result = self._plan(graph, profile, planner_budget)
            except InfeasibleError as e:
                # the planner's message speaks of the graph's share; a budget
                # it names needs the pinned state and headroom on top
                _add_note(e, f"outcore: the graph was planned under {planner_budget} B: the budget {budget_bytes} B "
                             f"less {conv.pinned_bytes} B of pinned module state and {headroom} B of headroom; a "
                             "planning budget named above needs those bytes on top as budget=")
                raise
            self._plans[key] = result
        return conv, graph, path, budget_bytes, planner_budget, result

    def check_steady(self, batch: Sequence[torch.Tensor]) -> None:
        """Where the compiled step creates the optimizer's state (its first
        step: SGD's momentum, Adam's moments), plans the step that holds it,
        the one every later call runs (:func:`~.capture.capture_steady_step`),
        now: a budget too small for it raises here, before any training,
        and its plan is kept for the call that captures that step."""
        c = self.compiled
        try:
            steady = capture_steady_step(self.model, self.loss_fn, self.optimizer, batch, c.captured)
        except CaptureError as e:
            # the state as fake tensors is this check's own device; the real
            # state's capture at the second call stands on its own
            warnings.warn(f"outcore: the step with the optimizer's state could not be checked ahead ({e}); "
                          "it is captured and planned at the second call", RuntimeWarning, stacklevel=3)
            return
        if steady is None:
            return
        try:
            self._planned_graph(steady, "steady")
        except InfeasibleError as e:
            raise InfeasibleError(
                f"the step once the optimizer holds its state (every call after the first) has no plan: {e}. "
                "The first step, which creates that state, has one; give a budget for the step with the state"
            ) from e

    def _resolve_defaults(self, device: torch.device) -> None:
        """The allocator, issue order and headroom not given to the step:
        :data:`CUDA_DEFAULTS` on CUDA, :data:`OTHER_DEFAULTS` elsewhere
        (resolved on the first capture, kept after)."""
        allocator, order, headroom = CUDA_DEFAULTS if device.type == "cuda" else OTHER_DEFAULTS
        if self.allocator is None:
            self.allocator = allocator
        if self.issue_order is None:
            self.issue_order = order
        if self.headroom is None:
            self.headroom = headroom

    def _with_tf32(self, profile: str, device: torch.device) -> str:
        """On CUDA, the profile with the TF32 mode PyTorch runs float32 ops in
        (:func:`torch_tf32_mode`), written beside the graph, unless the mode is
        off or the profile is a file that states its own.  Profiles outcore
        writes leave ``tf32`` out when it is off, so to pin ``off`` against
        PyTorch's settings, write ``"tf32": "off"`` into the file."""
        if device.type != "cuda":
            return profile
        mode = torch_tf32_mode()
        if mode == "off":
            return profile
        d = outcore.device_profile(profile)  # validated first: a bad file is outcore's clear error
        if os.path.isfile(profile):
            # a user's profile file that names a mode (even "off") keeps it
            with open(profile, encoding="utf-8-sig") as f:  # a BOM, as outcore's loader allows
                if "tf32" in json.load(f):
                    return profile
        d["tf32"] = mode
        path = os.path.join(self._tmp.name, f"device-tf32-{mode}.json")
        with open(path, "w") as f:
            json.dump(d, f)
        return path

    def _plan(self, graph, profile: str, planner_budget: int):
        kw = dict(device=profile, budget=planner_budget, allocator=self.allocator, seed=self.seed,
                  time_limit_s=self.time_limit_s, latency_table=self.latency_table)
        if self.planner != "auto":
            return outcore.plan(graph, self.planner, moves=self.moves, **kw)
        comparison = outcore.compare(graph, DEFAULT_PLANNERS, **kw)
        feasible = [r for r in comparison.results if r.feasible and r.report is not None]
        if not feasible:
            reasons = "; ".join(f"{r.planner}: {r.reason}" for r in comparison.results[:4])
            hint = outcore.budget_hint(graph, **kw)
            found = (f"; `{hint.planner}` has a plan under {hint.budget_bytes} B ({hint.iter_time_s:.4f} "
                     "s/iteration)" if hint is not None else "")
            raise InfeasibleError(
                f"no planner fits {comparison.model} into {planner_budget} B for the graph: {reasons}{found}"
            )
        best = min(feasible, key=lambda r: (r.report.iter_time_s, r.planner))
        return outcore.plan(graph, best.planner, **kw)

    def _alloc_host(self, c: Compiled) -> None:
        pin = c.captured.device.type == "cuda"
        need = sum(c.generated.host_buffers.values())
        avail = available_host_bytes()
        if avail is not None and need > 0.8 * avail:
            raise InfeasibleError(
                f"the plan keeps {need} B on the host (pinned buffers of swapped tensors) but only "
                f"{avail} B of host memory is available (at most 80% is used); give a larger device "
                "budget, a smaller batch, or a planner that recomputes more"
            )
        for tid, nbytes in c.generated.host_buffers.items():
            c.host[tid] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)

    # ------------------------------------------------------------- running
    def _enter_residency(self, c: Compiled) -> None:
        """Moves persistent tensors the plan keeps on the host there (once)."""
        for tid, r in c.generated.initial_residency.items():
            if r == "device" or self._host_resident.get(tid):
                continue
            t = c.converted.tensors[tid]
            dev = c.captured.placeholders[t.placeholder].tensor
            c.host[tid].copy_(_flat(dev))
            c.runtime.latest_host[dev.untyped_storage()._cdata] = c.host[tid]
            if r == "host":
                dev.untyped_storage().resize_(0)
            self._host_resident[tid] = True

    def materialize(self) -> None:
        """Brings every persistent tensor the plan keeps on the host back to the
        device (for evaluation or saving); the next step moves them again."""
        c = self._current
        if c is None:
            return
        if c.captured.device.type == "cuda":
            torch.cuda.synchronize(c.captured.device)
        for tid, r in c.generated.initial_residency.items():
            if not self._host_resident.get(tid):
                continue
            t = c.converted.tensors[tid]
            dev = c.captured.placeholders[t.placeholder].tensor
            nbytes = c.host[tid].numel()
            if dev.untyped_storage().nbytes() != nbytes:
                dev.untyped_storage().resize_(nbytes)
                _flat(dev).copy_(c.host[tid])
            self._host_resident[tid] = False

    def _recover(self, c: Compiled) -> None:
        """After a step that raised (out of memory, an interrupt): every
        parameter, buffer and optimizer state whose device storage the plan had
        released gets it back with its last value, the host copy it was last
        copied to, so the model is whole again (as after an eager step that
        failed: parameters as they were, unless the optimizer had begun).  The
        next step moves tensors to the host again as its plan says."""
        if c.captured.device.type == "cuda":
            try:
                torch.cuda.synchronize(c.captured.device)
            except RuntimeError:
                pass  # a device error: restore what the host has regardless
        for ph in c.captured.placeholders:
            if ph.role in ("input", "label"):
                continue
            st = ph.tensor.untyped_storage()
            host = c.runtime.latest_host.get(st._cdata)
            if st.nbytes() == 0 and host is not None and host.numel() > 0:
                st.resize_(host.numel())
                _flat(ph.tensor).copy_(host)
        self._host_resident.clear()

    def _run(self, c: Compiled, fn: Callable[..., Any], gen: Generated, x: torch.Tensor,
             y: torch.Tensor) -> Any:
        """One generated step (plain or profiled, ``gen`` its source); the
        model made whole again if it raises (:meth:`_recover`), where it failed
        kept in :attr:`last_failure`, and an out-of-memory error handled by
        :meth:`_after_out_of_memory`."""
        try:
            with torch.no_grad():
                return fn(x, y)
        except BaseException as err:
            # the caching allocator's state where it failed, before the
            # recovery takes memory back for the parameters
            out_of_memory = is_out_of_memory(err)
            held = _cuda_memory_held(c.captured.device) if out_of_memory else ""
            self._recover(c)
            self.last_failure = _failed_at(gen, err)
            if out_of_memory:
                self._after_out_of_memory(c, err, held)
            raise

    def _after_out_of_memory(self, c: Compiled, err: BaseException, held: str) -> None:
        """Says on ``err`` where the plan ran out of memory and what it
        predicted, and, where the headroom was left to the device's default,
        raises it (:func:`raised_headroom`) and drops every compiled plan, so
        that the next call plans the step again with more room for what the
        plan does not model (kernels' temporaries, the allocator's own
        fragmentation).  The failed step is not run again: the plan released
        the batch's storage after its last use, and the model may be partly
        updated (the note says whether)."""
        budget = c.budget_bytes
        planned = c.plan_result.report.peak_live_bytes + c.converted.pinned_bytes
        where = f"at {self.last_failure}" if self.last_failure is not None else "(no generated line on the traceback)"
        _add_note(err, f"outcore: the planned step ran out of device memory {where}. The plan predicted a "
                       f"peak of {planned} B live against a budget of {budget} B ({budget - c.planner_budget_bytes} "
                       f"B of it kept from the planner: pinned state and headroom {self.headroom}).{held}")
        if self.last_failure is not None and self.last_failure.updates_before > 0:
            _add_note(err, "outcore: the optimizer had begun: the model is partly updated by this step, as after "
                           "an eager step that fails inside optimizer.step().")
        if not self._adaptive_headroom:
            _add_note(err, f"outcore: headroom {self.headroom!r} was given, so it stays; pass a larger headroom= "
                           "(or leave it None, and it rises after an out-of-memory error), a larger budget, or a "
                           "smaller batch.")
            return
        old = float(self.headroom)
        new = raised_headroom(old)
        if new <= old:
            _add_note(err, f"outcore: the headroom is already at its cap of {MAX_ADAPTED_HEADROOM} of the budget; "
                           "give a larger budget or a smaller batch.")
            return
        self.headroom = new
        self.replans_after_oom += 1
        self._cache.clear()
        self._current = None
        _add_note(err, f"outcore: the headroom (left to the device's default) rises from {old:.3g} to {new:.3g} "
                       "of the budget and the next call plans the step again; this step's batch is not run again.")

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Trains one step and returns the loss.  The batch is consumed: the
        plan releases the storage of ``x`` and ``y`` after their last use, and
        afterwards (whether the step succeeded or raised) each whose storage
        was released is an empty tensor, so that nothing reads released
        memory; pass clones to keep them.  A batch tensor that does not own exactly its storage (a slice
        or view of a larger tensor, a dataset's rows) is copied first and the
        copy consumed, so the tensor it views is never released; a tensor an
        earlier step consumed is refused (:func:`_batch_tensor`).  If the
        step raises (out of memory, say), every parameter and optimizer state
        the plan had moved off the device is put back with its last value
        before the error propagates; an out-of-memory error also says where
        in the plan it happened and may raise the headroom for the next call
        (:meth:`_after_out_of_memory`)."""
        given = (x, y)
        x, y = _batch_tensor(x, "x"), _batch_tensor(y, "y")
        try:
            return self._step(x, y)
        finally:
            for t in given:
                _empty_if_released(t)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step on a batch the step may consume (:meth:`__call__`)."""
        if self._cache.get(step_signature(self.model, self.optimizer, (x, y))) is not self._current:
            self.materialize()  # another graph: its plan may keep other tensors on the host
        c = self.compile((x, y))
        cuda = c.captured.device.type == "cuda"
        if cuda:
            if self.enforce:
                total = torch.cuda.get_device_properties(c.captured.device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, c.budget_bytes / total), c.captured.device)
            torch.cuda.reset_peak_memory_stats(c.captured.device)
        self._enter_residency(c)
        outs = self._run(c, c.fn, c.generated, x, y)
        self._install_new_state(c, outs)
        if cuda:
            self.stats = {
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(c.captured.device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(c.captured.device),
            }
        self.stats.update({
            "plan_peak_live_bytes": c.plan_result.report.peak_live_bytes + c.converted.pinned_bytes,
            "plan_peak_reserved_bytes": c.plan_result.report.peak_reserved_bytes + c.converted.pinned_bytes,
            "budget_bytes": c.budget_bytes,
            "planner": c.plan_result.planner,
        })
        return outs[0]

    def _install_new_state(self, c: Compiled, outs) -> None:
        if not c.captured.new_state:
            return
        params = [ph.tensor for ph in c.captured.placeholders if ph.role == "param"]
        for pi, key, pos in c.captured.new_state:
            self.optimizer.state[params[pi]][key] = outs[pos]

    # ------------------------------------------------------------- reports
    @property
    def compiled(self) -> Compiled:
        if self._current is None:
            raise OutcoreError("the step has not been compiled yet: call it (or .compile(batch)) first")
        return self._current

    @property
    def plan_result(self):
        return self.compiled.plan_result

    @property
    def source(self) -> str:
        return self.compiled.generated.source

    def measure(self, x: torch.Tensor, y: torch.Tensor, iterations: int = 10, warmup: int = 2) -> dict[str, Any]:
        """Median measured iteration time beside the simulated one, and peaks."""
        for _ in range(warmup):
            self(x.clone(), y.clone())
        c = self.compiled
        cuda = c.captured.device.type == "cuda"
        times = []
        peaks = []
        for _ in range(iterations):
            if cuda:
                torch.cuda.synchronize(c.captured.device)
            xi, yi = x.clone(), y.clone()
            t0 = time.perf_counter()
            self(xi, yi)
            if cuda:
                torch.cuda.synchronize(c.captured.device)
            times.append(time.perf_counter() - t0)
            peaks.append(dict(self.stats))
        measured = statistics.median(times)
        simulated = c.plan_result.report.iter_time_s
        return {
            "planner": c.plan_result.planner,
            "measured_iter_time_s": measured,
            "simulated_iter_time_s": simulated,
            "relative_error": abs(simulated - measured) / measured if measured > 0 else None,
            "peak_allocated_bytes": max((p.get("peak_allocated_bytes", 0) for p in peaks), default=0),
            "peak_reserved_bytes": max((p.get("peak_reserved_bytes", 0) for p in peaks), default=0),
            "plan_peak_live_bytes": peaks[-1]["plan_peak_live_bytes"] if peaks else None,
            "budget_bytes": c.budget_bytes,
            "recomputes": c.generated.n_recomputes,
            "swap_outs": c.generated.n_swap_outs,
            "swap_ins": c.generated.n_swap_ins,
        }

    def profile(self, x: torch.Tensor, y: torch.Tensor, iterations: int = 5) -> dict[str, Any]:
        """Runs the step ``iterations`` times with every op and copy timed and
        returns an ``outcore-latency-table/1`` document (medians).  On CUDA
        each op's entry also has ``workspace_bytes``: the most bytes the op
        allocated and released inside itself over the runs (kernels'
        workspaces, its own temporaries), which ``compile_step(latency_table=
        path)`` then plans room for.  Measured under the plan's own memory
        (cuDNN picks smaller workspaces when memory is short)."""
        self(x.clone(), y.clone())
        c = self.compiled
        if c.profile_fn is None:
            gen = generate(c.converted, c.plan_json, profile=True, timeline=c.timeline)
            rt = _Runtime(c.captured.device, profile=True, latest_host=c.runtime.latest_host)
            glb = {"__builtins__": __builtins__, "_ph": [ph.tensor for ph in c.captured.placeholders],
                   **gen.globals, **rt.bind(), "_H": c.host}
            exec(compile(gen.source, "<outcore step (profiled)>", "exec"), glb)  # noqa: S102
            c.profile_fn, c.profile_runtime, c.profile_generated = glb["step"], rt, gen
        rt = c.profile_runtime
        rt.op_times.clear()
        rt.copy_times.clear()
        rt.op_transient_bytes.clear()
        for _ in range(iterations):
            self._enter_residency(c)
            outs = self._run(c, c.profile_fn, c.profile_generated, x.clone(), y.clone())
            self._install_new_state(c, outs)
        ops, copies = rt.resolve_times()
        entries = [
            {"op": op, "name": c.converted.ops[op].name, "kind": c.converted.ops[op].label,
             "time_s": max(statistics.median(ts), 1e-9), "samples": len(ts),
             **({"workspace_bytes": max(rt.op_transient_bytes[op])} if op in rt.op_transient_bytes else {})}
            for op, ts in sorted(ops.items())
        ]
        copy_entries = [
            {"tensor": tid, "name": c.converted.tensors[tid].name, "direction": d,
             "size_bytes": c.converted.tensors[tid].storage_nbytes,
             "time_s": max(statistics.median(ts), 1e-9), "samples": len(ts)}
            for (tid, d), ts in sorted(copies.items())
        ]
        table: dict[str, Any] = {
            "format": "outcore-latency-table/1",
            "device": torch.cuda.get_device_name(c.captured.device) if c.captured.device.type == "cuda" else "cpu",
            "graph_model": c.captured.model_name,
            "entries": entries,
        }
        rates = {}
        for d in ("h2d", "d2h"):
            es = [e for e in copy_entries if e["direction"] == d]
            tot_t = sum(e["time_s"] * e["samples"] for e in es)
            tot_b = sum(e["size_bytes"] * e["samples"] for e in es)
            if tot_t > 0 and tot_b > 0:
                rates[f"{d}_bytes_per_s"] = tot_b / tot_t
        if len(rates) == 2:
            table["copies"] = rates
        if copy_entries:
            table["copy_entries"] = copy_entries
        return table

    def write_latency_table(self, path: str, table: dict[str, Any]) -> None:
        """Writes a table from :meth:`profile`; ``latency_table=path`` of the
        next :func:`compile_step` plans with it."""
        with open(path, "w") as f:
            json.dump(table, f, indent=1)


def compile_step(
    model: nn.Module,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    example_batch: Sequence[torch.Tensor],
    *,
    budget: int | float | str,
    planner: str = "outcore",
    device_profile: str | None = None,
    allocator: str | None = None,
    headroom: float | int | None = None,
    latency_table: str | None = None,
    seed: int = 0,
    time_limit_s: float = 10.0,
    enforce: bool = False,
    issue_order: str | None = None,
    moves: int | None = None,
) -> StepFunction:
    """Captures, plans and generates a training step that runs under ``budget``.

    ``planner``: an outcore planner name, or ``"auto"`` (every default planner
    judged by the simulator, the fastest feasible plan kept).  The default,
    ``"outcore"``, is the joint search started from every other planner's
    plan (within ``time_limit_s``); on an H200 (2026-11-30) its ResNet-50 b128
    step at half of eager's peak took 71.5 ms against ``auto``'s 73.9.

    Defaults: ``allocator``, ``issue_order`` and ``headroom`` left ``None``
    are ``"virtual-chunks"``, ``"timeline"`` and ``0.12`` on CUDA
    (:data:`CUDA_DEFAULTS`; until 2026-12-04 they were ``"best-fit-paged"``,
    ``"early"`` and ``0.0``, under which ResNet-50 at a quarter of eager's
    peak and ``auto``'s swap-only plans ran out of memory on an H200) and
    ``"best-fit-paged"``, ``"early"`` and ``0.0`` on other devices.

    ``headroom``: the part of the budget kept from the planner for what its
    plan does not model (kernels' temporaries, the allocator's fragmentation):
    a fraction of the budget in [0, 1) or bytes.  Left ``None``, it rises
    after a planned step runs out of memory (:func:`raised_headroom`: 0.12,
    0.18, 0.27, 0.405, then 0.5 on CUDA) and the next call plans again;
    given, it stays.  Either way the error says where in the plan the step
    failed (also :attr:`StepFunction.last_failure`) and whether the optimizer
    had begun updating the model.

    ``allocator``: the allocator the plan is made for.  ``"best-fit-paged"``
    models PyTorch's caching allocator (segments, best fit,
    splitting, caching) with each segment on any free 2 MiB pages, as
    ``cudaMalloc`` maps memory.  ``"best-fit"`` is the same with its segments
    in one contiguous range of the device, which a GPU does not need: on an
    H200 (2026-11-30), GPT-2 124M at batch 8 under half of eager's peak
    trained in 478 ms under a ``best-fit`` plan and in 264 ms under a
    ``best-fit-paged`` one, both within the enforced budget (eager 199 ms,
    per-block checkpointing 256 ms).  ``"virtual-chunks"`` is the model of
    PyTorch's expandable segments, which the step turns on (for the whole
    process, and for good: tensors allocated before keep their ordinary
    segments) when it is compiled on CUDA (259 ms there).  Neither model has
    PyTorch's per-stream block caching, and at a quarter of eager's peak
    ResNet-50's plans ran out of real memory under ``best-fit`` and
    ``best-fit-paged`` (under ``virtual-chunks`` it trained with the timeline
    issue order and 12% headroom, below; RESULTS.md).
    ``"perfect"`` plans in bytes only (tests, and CPU).

    ``issue_order``: the order the generated code issues the plan's steps
    from the host, which is the order PyTorch's caching allocator sees
    allocations and frees in.  ``"early"`` issues every copy as
    soon as its waits allow and releases a copy stream's frees at the first
    compute step ordered after them: the bytes held are within the budget
    under any timing, but not the sequence the allocator model simulated (on
    an H200, ResNet-50 b128 at a quarter of eager's peak: the step's
    variables held up to 2.70 GB where the plan's iteration holds 2.37).
    ``"timeline"`` pins the plan to its predicted iteration and issues the
    steps in the order that iteration starts them, so PyTorch sees the
    simulated sequence (2.44 GB measured there).  With ``best-fit-paged`` it
    still ran out of memory there, from cached-but-unallocated blocks, and
    once on GPT-2 124M at half of eager's peak, which trains under
    ``"early"``; with ``virtual-chunks`` and ``headroom=0.12`` or ``0.15`` it
    trained at the quarter (RESULTS.md, "Issue order").

    ``moves`` (``outcore`` and ``outcore-recompute`` only, as in
    :func:`outcore.plan`) ends the planner's search after that many scored
    moves per start instead of at ``time_limit_s``: the same ``seed`` then
    gives the same plan, and so the same generated step, whatever the
    machine's speed.

    The example batch
    is captured at once, so errors (unsupported ops, an infeasible budget) are
    raised here, before any training.  Where the optimizer has no state yet
    (SGD's momentum, Adam's moments: its first step creates them), the step
    every later call runs holds it, so it is planned here too (captured with
    that state as fake tensors, :meth:`StepFunction.check_steady`): a budget
    that fits the first step and not that one raises here as well, and the
    plan is kept for the second call.  A percentage resolves against the
    first step's footprint: torchvision's ResNet-18 on 32x32 images at batch
    8 with SGD's momentum needs 94.31 MiB with nothing moved in its first
    step and 130.21 MiB in every later one (until 2026-12-04 that step was
    planned only at the second call, and such a budget failed there).
    """
    step = StepFunction(model, loss_fn, optimizer, budget=budget, planner=planner,
                        device_profile=device_profile, allocator=allocator, headroom=headroom,
                        latency_table=latency_table, seed=seed, time_limit_s=time_limit_s,
                        enforce=enforce, issue_order=issue_order, moves=moves)
    step.compile(tuple(example_batch))
    step.check_steady(tuple(example_batch))
    return step
