"""outcore: plan deep-learning training steps that exceed device memory.

The functions here call outcore's Rust library (the facade ``crates/outcore``)
through the extension module :mod:`outcore._native`; results come back as the
small classes below, errors as the exceptions of :mod:`outcore.errors` with the
library's message.  :mod:`outcore.torch` captures a PyTorch training step, plans
it and runs it under the plan.

>>> import outcore
>>> g = outcore.load_graph("resnet50", batch=32)
>>> c = outcore.compare(g, device="v100-16gb-pcie3", budget="60%")
>>> print(c)                                                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

from . import _native
from ._native import Graph, Plan
from .errors import (
    CaptureError,
    GraphError,
    InfeasibleError,
    InvalidValueError,
    OutcoreError,
    OutcoreIOError,
    PlanError,
    UnsupportedOpError,
)

__version__ = "0.1.0"

PathLike = Union[str, "os.PathLike[str]"]

#: Budget spellings: bytes (int), a size ("12GiB"), a percentage of the graph's
#: footprint ("60%").
Budget = Union[int, str]


def _path(p: PathLike | None) -> str | None:
    return None if p is None else os.fspath(p)


def _budget_text(budget: Budget) -> str:
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise InvalidValueError(
            f"budget `{budget!r}`: not bytes or text; accepted: a whole number of bytes, "
            "a size like '12GiB', or a percentage of the footprint like '60%'"
        )
    return str(budget)


#: The largest whole number the native layer takes (Rust's ``u64``).
_U64_MAX = 2**64 - 1


def _integer(value: Any) -> int | None:
    """``value`` as a Python integer (anything with ``__index__`` but a
    bool), else ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return value.__index__()
    except (AttributeError, TypeError):
        return None


def _whole(what: str, value: Any) -> int | None:
    """``value`` (``None`` passes) as a whole number in [0, 2^64 - 1] for the
    native layer, else :class:`InvalidValueError` naming ``what``: the
    extension's own conversion raises an ``OverflowError`` ("can't convert
    negative int to unsigned") that names neither the argument nor the range.
    The native layer checks each value's own range after this one."""
    if value is None:
        return None
    number = _integer(value)
    if number is None or not 0 <= number <= _U64_MAX:
        raise InvalidValueError(
            f"{what} `{value!r}`: not a whole number in range; accepted: a whole number in "
            f"[0, {_U64_MAX}] (and the value's own range, checked next)"
        )
    return number


def _moves(value: Any) -> int | None:
    """``moves`` (``None`` passes) as a whole number the native layer takes
    (a signed 64-bit one, so that a negative count reaches its range check
    and is named there), else :class:`InvalidValueError`: the extension's
    own conversion raises a bare ``OverflowError``."""
    if value is None:
        return None
    number = _integer(value)
    if number is None or not -(2**63) <= number < 2**63:
        raise InvalidValueError(f"moves `{value!r}`: not a whole number in range; accepted: a whole number "
                                "of moves in [0, 1000000000], e.g. 2000, or None to end the search by time")
    return number


def _target_args(
    device: str,
    budget: Budget,
    allocator: str,
    seed: int,
    time_limit_s: float,
    latency_table: PathLike | None,
    moves: int | None,
) -> tuple[Any, ...]:
    """The arguments :func:`plan` and :func:`compare` pass to the native layer
    after the graph and the planner names, checked and converted."""
    return (device, _budget_text(budget), allocator, _whole("seed", seed), time_limit_s, _path(latency_table),
            _moves(moves))


def zoo_models() -> list[dict[str, Any]]:
    """The zoo's models: name, description, source, default batch and knobs."""
    return json.loads(_native.zoo_models())


def planners(by_name_too: bool = False) -> list[str]:
    """The planners' names: those ``compare(..., "all")`` runs, and with
    ``by_name_too`` also those reachable by name only (SwapAdvisor's
    ablations, ``outcore-recompute``, ``checkmate-milp``)."""
    names = list(_native.planners())
    return names + list(_native.planners_by_name_only()) if by_name_too else names


def devices() -> list[str]:
    """The names of the built-in device profiles."""
    return list(_native.devices())


def device_profile(name_or_path: str) -> dict[str, Any]:
    """A device profile (built-in name or JSON file), validated, as a dict."""
    return json.loads(_native.device_json(name_or_path))


def parse_size(text: str) -> int:
    """Bytes of a size such as ``"12GiB"``, ``"512MB"`` or ``"1048576"``."""
    return _native.parse_size(text)


def load_graph(
    model: str | None = None,
    *,
    path: PathLike | None = None,
    batch: int | None = None,
    knobs: Mapping[str, int] | None = None,
    optimizer: str | None = None,
) -> Graph:
    """Builds a zoo model (``model``) or reads a graph file (``path``:
    ``outcore-graph/1`` or ``dnn-train-graph/1``), validated."""
    if knobs is not None and not isinstance(knobs, Mapping):
        raise InvalidValueError(f"knobs `{knobs!r}`: a {type(knobs).__name__}, not a mapping; accepted: a dict of "
                                "knob name to whole number, e.g. knobs={'depth': 50}")
    knob_values = {name: _whole(f"knob `{name}`", v) for name, v in knobs.items()} if knobs else None
    try:
        return _native.load_graph(model, _path(path), _whole("batch", batch), knob_values, optimizer)
    except GraphError as e:
        if model is not None and path is None and (model.endswith(".json") or os.sep in model):
            raise GraphError(f"{e}; to read a graph file, pass it as path={model!r}") from None
        raise


def load_plan(path: PathLike) -> Plan:
    """Reads an ``outcore-plan/1`` file (its device and budget checked)."""
    return _native.load_plan(os.fspath(path))


@dataclass(frozen=True)
class Verification:
    """The outcome of outcore's independent verifier."""

    passed: bool
    violation_count: int
    violations: list[str]

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "Verification":
        return cls(bool(d["passed"]), int(d["violation_count"]), list(d["violations"]))


@dataclass(frozen=True)
class SimReport:
    """The simulator's report of one iteration (all fields of the Rust report in ``raw``)."""

    iter_time_s: float
    peak_live_bytes: int
    peak_reserved_bytes: int
    swap_in_bytes: int
    swap_out_bytes: int
    recompute_time_s: float
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "SimReport":
        return cls(
            float(d["iter_time_s"]),
            int(d["peak_live_bytes"]),
            int(d["peak_reserved_bytes"]),
            int(d["swap_in_bytes"]),
            int(d["swap_out_bytes"]),
            float(d["recompute_time_s"]),
            dict(d),
        )

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


@dataclass(frozen=True)
class PlanResult:
    """A feasible plan: verified, and simulated without an allocation failure."""

    plan: Plan
    planner: str
    budget_bytes: int
    verification: Verification
    report: SimReport
    planner_time_s: float
    simulate_time_s: float


@dataclass(frozen=True)
class PlannerOutcome:
    """One planner's outcome in a comparison."""

    planner: str
    status: str  # "feasible", "infeasible" or "not_runnable"
    reason: str | None
    verified: bool
    report: SimReport | None
    planner_time_s: float

    @property
    def feasible(self) -> bool:
        return self.status == "feasible"


@dataclass(frozen=True)
class Comparison:
    """Every chosen planner on one target, judged alike."""

    model: str
    batch: int
    device: str
    budget_bytes: int
    footprint_bytes: int
    allocator: str
    ideal_time_s: float
    results: list[PlannerOutcome]

    def __str__(self) -> str:
        lines = [
            f"{self.model} batch {self.batch} on {self.device}, budget {self.budget_bytes} B "
            f"({100.0 * self.budget_bytes / max(self.footprint_bytes, 1):.0f}% of the footprint), "
            f"allocator {self.allocator}, ideal {self.ideal_time_s * 1e3:.2f} ms",
            f"{'planner':<16} {'status':<13} {'iter ms':>9} {'overhead':>9} {'peak MiB':>9}",
        ]
        for r in self.results:
            if r.report is not None and r.feasible:
                t = r.report.iter_time_s
                over = f"{100.0 * (t / self.ideal_time_s - 1.0):.1f}%" if self.ideal_time_s > 0 else "-"
                lines.append(
                    f"{r.planner:<16} {r.status:<13} {t * 1e3:>9.2f} {over:>9} {r.report.peak_live_bytes / 2**20:>9.1f}"
                )
            else:
                lines.append(f"{r.planner:<16} {r.status:<13} {'-':>9} {'-':>9} {'-':>9}")
        return "\n".join(lines)


@dataclass(frozen=True)
class SimulateResult:
    """A simulated plan; ``runnable`` is false when an allocation failed."""

    planner: str
    verification: Verification
    report: SimReport
    runnable: bool
    reason: str | None
    trace: Any | None = field(default=None, repr=False)


def plan(
    graph: Graph,
    planner: str = "window",
    *,
    device: str = "a100-40gb",
    budget: Budget = "100%",
    allocator: str = "best-fit",
    seed: int = 0,
    time_limit_s: float = 10.0,
    latency_table: PathLike | None = None,
    moves: int | None = None,
) -> PlanResult:
    """Plans ``graph`` with one planner for ``device`` under ``budget``.

    The plan is returned only if it verifies and its simulation under
    ``allocator`` has no allocation failure; otherwise :class:`InfeasibleError`
    (with the shortfall) or :class:`PlanError` is raised.

    ``moves`` (``outcore`` and ``outcore-recompute`` only) ends the search
    after that many scored moves per start instead of at ``time_limit_s``,
    which it then does not read: the same ``seed`` gives the same plan
    whatever the machine's speed and thread count, however long the search
    takes there.
    """
    p, rest = _native.plan(
        graph, planner, *_target_args(device, budget, allocator, seed, time_limit_s, latency_table, moves)
    )
    d = json.loads(rest)
    return PlanResult(
        plan=p,
        planner=d["planner"],
        budget_bytes=int(d["budget_bytes"]),
        verification=Verification._from(d["verification"]),
        report=SimReport._from(d["report"]),
        planner_time_s=float(d["planner_time_s"]),
        simulate_time_s=float(d["simulate_time_s"]),
    )


def compare(
    graph: Graph,
    planners: str | Sequence[str] = "all",
    *,
    device: str = "a100-40gb",
    budget: Budget = "100%",
    allocator: str = "best-fit",
    seed: int = 0,
    time_limit_s: float = 10.0,
    latency_table: PathLike | None = None,
    moves: int | None = None,
) -> Comparison:
    """Runs every named planner (``"all"``, ``"window,capuchin"`` or a list) on
    one target and judges every plan the same way. ``moves`` bounds
    ``outcore``'s search as in :func:`plan`; the other planners still end at
    ``time_limit_s``."""
    names = planners if isinstance(planners, str) else ",".join(planners)
    d = json.loads(
        _native.compare(
            graph, names, *_target_args(device, budget, allocator, seed, time_limit_s, latency_table, moves)
        )
    )
    results = [
        PlannerOutcome(
            planner=r["planner"],
            status=r["status"],
            reason=r.get("reason"),
            verified=bool(r["verified"]),
            report=SimReport._from(r["report"]) if r.get("report") else None,
            planner_time_s=float(r["planner_time_s"]),
        )
        for r in d["results"]
    ]
    return Comparison(
        model=d["model"],
        batch=int(d["batch"]),
        device=d["device"],
        budget_bytes=int(d["budget_bytes"]),
        footprint_bytes=int(d["footprint_bytes"]),
        allocator=d["allocator"],
        ideal_time_s=float(d["ideal_time_s"]),
        results=results,
    )


@dataclass(frozen=True)
class BudgetHint:
    """A budget under which ``planner`` has a plan that verifies and
    simulates, and that plan's simulated iteration time."""

    budget_bytes: int
    planner: str
    iter_time_s: float


def budget_hint(
    graph: Graph,
    *,
    device: str = "a100-40gb",
    budget: Budget = "100%",
    allocator: str = "best-fit",
    seed: int = 0,
    time_limit_s: float = 10.0,
    latency_table: PathLike | None = None,
) -> BudgetHint | None:
    """A budget, ``budget`` itself or above it, under which ``dtr``,
    ``window`` or ``outcore`` has a plan (a few seconds of planning, 10 s at
    most; what :func:`plan`'s :class:`InfeasibleError` names where no plan
    fits); ``None`` if none plans up to four times ``budget`` or the device's
    memory.  Not the least such budget: no planner is monotone in it."""
    # the target's arguments without the move count (last), which the hint,
    # planning on short clocks, does not take
    args = _target_args(device, budget, allocator, seed, time_limit_s, latency_table, None)[:-1]
    d = json.loads(_native.budget_hint(graph, *args))
    if d is None:
        return None
    return BudgetHint(budget_bytes=int(d["budget_bytes"]), planner=d["planner"], iter_time_s=float(d["iter_time_s"]))


def verify(plan: Plan, graph: Graph) -> Verification:
    """Proves (or refutes) a plan's safety on the graph it was made for with
    outcore's verifier; a plan made for another graph (another model, batch
    or knob) raises :class:`PlanError` naming both fingerprints."""
    return Verification._from(json.loads(_native.verify(plan, graph)))


def simulate(
    plan: Plan,
    *,
    iterations: int = 2,
    latency_table: PathLike | None = None,
    record_trace: bool = False,
) -> SimulateResult:
    """Simulates a plan on its own device under its own allocator (the graph is
    rebuilt from what the plan records; a plan that fails verification raises)."""
    d = json.loads(_native.simulate(plan, _whole("iterations", iterations), _path(latency_table), record_trace))
    return SimulateResult(
        planner=d["planner"],
        verification=Verification._from(d["verification"]),
        report=SimReport._from(d["report"]),
        runnable=bool(d["runnable"]),
        reason=d.get("reason"),
        trace=d.get("trace"),
    )


def _write_text(path: PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file beside it, renamed
    over it once written: a write that fails (a full disk, a directory in the
    way) leaves what was at ``path`` as it was."""
    target = os.fspath(path)
    tmp = f"{target}.outcore-tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise OutcoreIOError(f"cannot write {target}: {e}") from e


def export_graph(graph: Graph, path: PathLike) -> None:
    """Writes a graph as ``outcore-graph/1`` JSON (an existing file at
    ``path`` is replaced only once the new one is whole)."""
    if not isinstance(graph, Graph):
        raise InvalidValueError(f"graph: a {type(graph).__name__}, not an outcore.Graph; load one with "
                                "outcore.load_graph(...)")
    _write_text(path, graph.to_json())


def save_plan(plan: Plan, path: PathLike) -> None:
    """Writes a plan as ``outcore-plan/1`` JSON (an existing file at ``path``
    is replaced only once the new one is whole)."""
    if not isinstance(plan, Plan):
        raise InvalidValueError(f"plan: a {type(plan).__name__}, not an outcore.Plan; make one with "
                                "outcore.plan(...).plan or outcore.load_plan(path)")
    _write_text(path, plan.to_json())


__all__ = [
    "Graph",
    "Plan",
    "PlanResult",
    "PlannerOutcome",
    "Comparison",
    "SimulateResult",
    "SimReport",
    "Verification",
    "zoo_models",
    "planners",
    "devices",
    "device_profile",
    "parse_size",
    "load_graph",
    "load_plan",
    "plan",
    "compare",
    "budget_hint",
    "BudgetHint",
    "verify",
    "simulate",
    "export_graph",
    "save_plan",
    "OutcoreError",
    "InvalidValueError",
    "GraphError",
    "PlanError",
    "InfeasibleError",
    "OutcoreIOError",
    "UnsupportedOpError",
    "CaptureError",
]
