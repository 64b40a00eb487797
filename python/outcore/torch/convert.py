"""Conversion of a captured step (``capture.Captured``) to outcore's graph IR.

The result is an ``outcore-graph/1`` document for the Rust planners plus, for
every outcore op, the FX nodes that run it, so that the code generator can
execute a plan op by op.  The recomputability of every op is decided here, not
by the Rust importer:

* **Storages.** Tensor identity is storage identity of the fake values
  (``StorageWeakRef``): an output that shares the storage of an earlier tensor
  is a view of that storage's owner, or a new version of it when the op writes
  that argument (schema ``Tensor(a!)``, plus batch norm's unannotated running
  statistics).  Zero-element tensors hold no memory and stay out of the graph.
* **Pinned state.** Buffers written outside the optimizer (batch-norm running
  statistics, ``num_batches_tracked``) and tensor constants are *pinned*: kept
  on the device, left out of the graph, their bytes taken off the budget.  So a
  batch norm's graph op is pure (inputs, weight, bias -> output and saved
  statistics) and may be recomputed: a recomputation passes scratch tensors in
  place of the running statistics, so they are updated once per step, as in
  eager training.  Nodes that touch only pinned or zero-element values
  ("riders") run right after the graph op that precedes them in the trace,
  never on recomputation.
* **In-place ops on activations and gradients** (``relu_``, autograd's
  ``add_`` accumulation) run out of place through their functional variant
  when nothing reads the old value afterwards (the same kernel arithmetic, so
  the same bits): their output is a new tensor, and producers stay
  recomputable.  Otherwise the write is kept, the output is a version (a view)
  of the written storage, and every op touching that storage is not
  recomputable (a recomputation would see another version).
* **Optimizer updates.** outcore's IR allows one in-place update per
  persistent tensor; the optimizer writes a momentum buffer several times
  (``mul_`` then ``add_``), and a ``foreach`` optimizer writes every parameter
  in one op.  Each run of trace nodes from the first to the last write of a
  persistent storage is merged into one op (runs that overlap merge), whose
  outputs are the final versions (``inplace_update_of``); temporaries used
  only inside the run count as its workspace.
* **Random ops** (``Tag.nondeterministic_seeded``: dropout's ``bernoulli_``,
  ``native_dropout``, ``rand*``) are never recomputable (their outputs are
  kept), and neither are ops that CUDA may run non-deterministically
  (``index_add``, ``scatter_add``, ...) unless
  ``torch.use_deterministic_algorithms(True)`` is in force.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

from ..errors import UnsupportedOpError
from .capture import Captured

# Ops that write their running statistics although their schema does not say so
# (argument positions written in training mode).
UNANNOTATED_WRITES = {
    "native_batch_norm": (3, 4),
    "cudnn_batch_norm": (3, 4),
    "miopen_batch_norm": (3, 4),
}

# Ops whose writes to pinned state may be redirected to scratch when they are
# recomputed: in training mode their running statistics are only updated, never
# used for the outputs.
SCRATCH_WRITES_OK = {
    "native_batch_norm",
    "cudnn_batch_norm",
    "miopen_batch_norm",
    "_native_batch_norm_legit",
    "_batch_norm_with_update",
    "_native_batch_norm_legit_functional",
}

# Forward ops that CUDA may run with atomics (results that vary in the last
# bits) unless deterministic algorithms are enabled.
NONDETERMINISTIC_UNLESS_FLAGGED = {
    "index_add",
    "index_add_",
    "index_put",
    "index_put_",
    "_index_put_impl_",
    "scatter_add",
    "scatter_add_",
    "scatter_reduce",
    "scatter_reduce_",
    "_embedding_bag",
    "embedding_bag",
    "put_",
    "_unsafe_index_put",
}

DTYPES = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}

_NO_FLOP = {
    "clone", "copy", "copy_", "_to_copy", "empty", "empty_like", "empty_strided", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_empty",
    "new_full", "fill", "fill_", "zero_", "scalar_tensor", "arange", "lift_fresh_copy", "cat",
    "stack", "index_select", "gather", "embedding", "slice_scatter", "select_scatter",
    "constant_pad_nd", "repeat", "_unsafe_view",
}


@dataclass
class TensorInfo:
    """One outcore tensor and where its value lives at run time."""

    id: int
    name: str
    kind: str
    shape: list[int]
    dtype: str
    size_bytes: int
    producer: int | None
    view_of: int | None = None
    inplace_update_of: int | None = None
    is_output: bool = False
    #: the FX node whose value it is (``None`` for none)
    node: torch.fx.Node | None = None
    #: storage owner (itself for owners and for persistent placeholders)
    owner: int = -1
    #: bytes of the owner's storage (what swapping moves)
    storage_nbytes: int = 0
    #: placeholder index for graph inputs
    placeholder: int | None = None
    #: a version produced by an in-place op that was kept in place
    version: bool = False


@dataclass
class OpInfo:
    """One outcore op: the trace nodes it runs, in order."""

    id: int
    name: str
    label: str
    phase: str
    nodes: list[torch.fx.Node]
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    flops: int = 0
    workspace_bytes: int = 0
    recomputable: bool = False
    module: str | None = None
    #: nodes touching only pinned / zero-element values, run after this op
    riders: list[torch.fx.Node] = field(default_factory=list)
    #: why the op is not recomputable (for error messages)
    why_not_recomputable: str | None = None


@dataclass
class Converted:
    """The outcore graph of a captured step and the mapping back to it."""

    captured: Captured
    tensors: list[TensorInfo]
    ops: list[OpInfo]
    #: FX node -> outcore tensor id (graph values only)
    tensor_of: dict[torch.fx.Node, int]
    #: nodes executed through their functional variant
    functional: dict[torch.fx.Node, Any]
    #: pinned placeholder indices and their bytes
    pinned_placeholders: list[int]
    pinned_bytes: int
    #: riders before the first graph op
    prologue: list[torch.fx.Node]
    #: (node, arg path) of pinned arguments a node writes (scratch on recompute)
    pinned_writes: dict[torch.fx.Node, list[int]]
    #: FX nodes whose values are pinned / zero-element (side values)
    side: set[torch.fx.Node]
    graph_json: dict[str, Any] = field(default_factory=dict)

    def op_by_name(self, name: str) -> OpInfo:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)


def _base(target: Any) -> str:
    packet = getattr(target, "_overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


def _tensors(val: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(val)
    return [v for v in flat if isinstance(v, torch.Tensor)]


def _written_args(node: torch.fx.Node) -> list[tuple[int, Any]]:
    """(argument position, FX argument) pairs the op writes."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        if i < len(node.args):
            out.append((i, node.args[i]))
        elif a.name in node.kwargs:
            out.append((i, node.kwargs[a.name]))
    base = _base(target)
    if base in UNANNOTATED_WRITES:
        training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", True)
        if training:
            for i in UNANNOTATED_WRITES[base]:
                if i < len(node.args) and node.args[i] is not None:
                    out.append((i, node.args[i]))
    return out


def _arg_nodes(arg: Any) -> list[torch.fx.Node]:
    flat, _ = tree_flatten(arg)
    return [a for a in flat if isinstance(a, torch.fx.Node)]


def _functional_variant(target: Any) -> Any | None:
    """The out-of-place overload of an in-place ATen op (``relu_`` -> ``relu``)."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    base = _base(target)
    if not base.endswith("_") or base.startswith("_foreach"):
        return None
    packet = getattr(torch.ops.aten, base[:-1], None)
    if packet is None:
        return None
    overload = getattr(packet, target._overloadname, None)
    if overload is None:
        return None
    # Same arguments, no alias annotation on the result.
    a = [x.name for x in target._schema.arguments]
    b = [x.name for x in overload._schema.arguments]
    if a != b or len(overload._schema.returns) != 1:
        return None
    return overload


def _dtype(t: torch.Tensor, where: str) -> str:
    name = DTYPES.get(t.dtype)
    if name is None:
        raise UnsupportedOpError(
            f"{where}: dtype {t.dtype} is not supported by outcore's graph; supported: "
            f"{', '.join(DTYPES.values())}"
        )
    return name


def _flops(node: torch.fx.Node, is_view: bool) -> int:
    if is_view:
        return 0
    base = _base(node.target)
    try:
        from torch.utils.flop_counter import flop_registry

        f = flop_registry.get(getattr(node.target, "_overloadpacket", None))
    except ImportError:  # pragma: no cover
        f = None

    def val(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    if f is not None:
        try:
            args = torch.fx.node.map_aggregate(node.args, val)
            kwargs = torch.fx.node.map_aggregate(node.kwargs, val)
            return int(f(*args, **kwargs, out_val=node.meta.get("val")))
        except Exception:  # noqa: BLE001 - formula not applicable; estimate below
            pass
    if base in _NO_FLOP:
        return 0
    ins = [t for a in _arg_nodes((node.args, node.kwargs)) for t in _tensors(a.meta.get("val"))]
    return max((t.numel() for t in ins), default=0)


class _Builder:
    def __init__(self, cap: Captured):
        self.cap = cap
        self.tensors: list[TensorInfo] = []
        self.tensor_of: dict[torch.fx.Node, int] = {}
        self.owner_of_storage: dict[StorageWeakRef, int] = {}
        self.side: set[torch.fx.Node] = set()
        self.pinned_storages: set[StorageWeakRef] = set()
        self.functional: dict[torch.fx.Node, Any] = {}
        self.kept_inplace_owners: set[int] = set()
        self.pinned_writes: dict[torch.fx.Node, list[int]] = {}
        self.written_pinned_storages: set[StorageWeakRef] = set()

    # ---------------------------------------------------------------- tensors
    def new_tensor(self, node, val, name, kind, producer, **kw) -> int:
        tid = len(self.tensors)
        dtype = _dtype(val, f"tensor `{name}`")
        shape = [int(s) for s in val.shape]
        elem = val.element_size()
        nbytes = int(val.untyped_storage().nbytes())
        logical = math.prod(shape) * elem if shape else elem
        info = TensorInfo(
            id=tid, name=name, kind=kind, shape=shape, dtype=dtype, size_bytes=logical,
            producer=producer, node=node, **kw,
        )
        if info.view_of is None and info.inplace_update_of is None:
            # An owner: size is what its storage holds (a flat shape when the
            # storage is larger than the tensor it was returned as).
            info.owner = tid
            info.storage_nbytes = nbytes
            if nbytes != logical and nbytes % elem == 0 and nbytes > 0:
                info.shape = [nbytes // elem]
                info.size_bytes = nbytes
        self.tensors.append(info)
        return tid


def _phase_kind(phase: str) -> str:
    return {"forward": "activation", "backward": "gradient", "optimizer": "temporary"}[phase]


def convert(cap: Captured) -> Converted:
    """Builds the outcore graph of a captured step (see the module docs)."""
    b = _Builder(cap)
    nodes = list(cap.gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != len(cap.placeholders):
        raise UnsupportedOpError(
            f"the trace has {len(placeholders)} inputs but {len(cap.placeholders)} were given"
        )
    storage_of_node = _storages_of_nodes(nodes)
    ph_index = {n: i for i, n in enumerate(placeholders)}
    pinned_placeholders, pinned_bytes = _pin_state(b, nodes, ph_index, storage_of_node)
    _add_graph_inputs(b, ph_index, storage_of_node)
    persistent_storages = {
        storage_of_node[n] for n, i in ph_index.items()
        if cap.placeholders[i].role in ("param", "buffer", "opt_state")
    } - b.pinned_storages
    functionalizable = _Functionalizer(b, nodes, storage_of_node, persistent_storages)
    raw_ops, prologue = _walk_trace(b, nodes, storage_of_node, functionalizable)
    ops = _group_persistent_writes(b, raw_ops, persistent_storages, storage_of_node)
    _mark_outputs(b, cap, nodes)
    _finish_ops(b, cap, ops)
    conv = Converted(
        captured=cap,
        tensors=b.tensors,
        ops=ops,
        tensor_of=b.tensor_of,
        functional=b.functional,
        pinned_placeholders=pinned_placeholders,
        pinned_bytes=pinned_bytes,
        prologue=prologue,
        pinned_writes=b.pinned_writes,
        side=b.side,
    )
    _set_recomputable(conv, b, storage_of_node)
    conv.graph_json = to_graph_json(conv)
    return conv


def _storages_of_nodes(nodes) -> dict[torch.fx.Node, StorageWeakRef]:
    """The storage of every node whose fake value is one tensor."""
    storage_of_node: dict[torch.fx.Node, StorageWeakRef] = {}
    for n in nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            storage_of_node[n] = StorageWeakRef(v.untyped_storage())
    return storage_of_node


def _pin_state(b: _Builder, nodes, ph_index, storage_of_node) -> tuple[list[int], int]:
    """Step 1: which storages are pinned (buffers written outside the
    optimizer; tensor constants are side values). Returns the pinned
    placeholders' indices and their bytes."""
    cap = b.cap
    buffer_storages = {
        storage_of_node[n]: i for n, i in ph_index.items() if cap.placeholders[i].role == "buffer"
    }
    for n in nodes:
        if n.op != "call_function":
            continue
        for _, arg in _written_args(n):
            for a in _arg_nodes(arg):
                st = storage_of_node.get(a)
                if st is None:
                    continue
                if st in buffer_storages and cap.phase[n] != "optimizer":
                    b.pinned_storages.add(st)
    for n in nodes:
        if n.op == "get_attr":
            v = getattr(cap.gm, n.target, None)
            if isinstance(v, torch.Tensor):
                b.side.add(n)
    pinned_placeholders = [
        i for n, i in ph_index.items() if storage_of_node.get(n) in b.pinned_storages
    ]
    pinned_bytes = sum(int(cap.placeholders[i].tensor.untyped_storage().nbytes()) for i in pinned_placeholders)
    return pinned_placeholders, pinned_bytes


# The graph tensor kind of each placeholder role.
_ROLE_KIND = {"param": "parameter", "buffer": "buffer", "opt_state": "optimizer_state",
              "input": "input", "label": "label"}


def _add_graph_inputs(b: _Builder, ph_index, storage_of_node) -> None:
    """Step 2: a graph tensor per placeholder that is neither pinned nor
    empty; a placeholder sharing an earlier one's storage (tied tensors) is
    a view of it."""
    for n, i in ph_index.items():
        ph = b.cap.placeholders[i]
        v = n.meta["val"]
        st = storage_of_node[n]
        if st in b.pinned_storages or v.numel() == 0:
            b.side.add(n)
            continue
        if st in b.owner_of_storage:
            tid = b.new_tensor(n, v, ph.name, _ROLE_KIND[ph.role], None,
                               view_of=b.owner_of_storage[st], placeholder=i)
            b.tensors[tid].owner = b.owner_of_storage[st]
        else:
            tid = b.new_tensor(n, v, ph.name, _ROLE_KIND[ph.role], None, placeholder=i)
            b.owner_of_storage[st] = tid
        b.tensor_of[n] = tid


class _Functionalizer:
    """Step 3: which in-place writes on non-persistent storages can run out
    of place (nothing reads an older value of that storage afterwards).
    Called with a node and its written arguments, it returns the functional
    variant to run instead, or ``None``."""

    def __init__(self, b: _Builder, nodes, storage_of_node, persistent_storages):
        self.b = b
        self.storage_of_node = storage_of_node
        self.persistent_storages = persistent_storages
        self.index = {n: k for k, n in enumerate(nodes)}
        self.reads: dict[StorageWeakRef, list[tuple[int, torch.fx.Node]]] = {}
        for n in nodes:
            if n.op not in ("call_function", "output"):
                continue
            for a in _arg_nodes((n.args, n.kwargs)):
                st = storage_of_node.get(a)
                if st is not None:
                    self.reads.setdefault(st, []).append((self.index[n], a))

    def __call__(self, n: torch.fx.Node, written: list[tuple[int, Any]]) -> Any | None:
        if len(written) != 1:
            return None
        if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
            return None
        f = _functional_variant(n.target)
        if f is None:
            return None
        (_, arg), = written
        if not isinstance(arg, torch.fx.Node):
            return None
        st = self.storage_of_node.get(arg)
        if st is None or st in self.persistent_storages or st in self.b.pinned_storages:
            return None
        here = self.index[n]
        for at, a in self.reads.get(st, []):
            if at > here and self.index[a] < here:
                return None  # an older value of the storage is read later
        return f


def _walk_trace(b: _Builder, nodes, storage_of_node, functionalizable):
    """Step 4: walks the trace into raw graph ops (and riders), creating
    storage owners, views and versions. Returns the raw ops and the
    prologue (riders before the first graph op)."""
    raw_ops: list[dict[str, Any]] = []
    prologue: list[torch.fx.Node] = []
    getitem_of: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            getitem_of.setdefault(n.args[0], []).append(n)
    for n in nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        ns = getattr(n.target, "namespace", None)
        if ns == "profiler" or str(n.target).startswith("profiler."):
            continue
        if not isinstance(n.target, torch._ops.OpOverload):
            raise UnsupportedOpError(
                f"op `{n.name}` ({n.target}) is not an ATen operator; outcore.torch runs "
                "ATen-level traces only"
            )
        op = _raw_op(b, n, storage_of_node, functionalizable, getitem_of.get(n, []))
        if op is not None:
            raw_ops.append(op)
        elif raw_ops:
            raw_ops[-1]["riders"].append(n)
        else:
            prologue.append(n)
    return raw_ops, prologue


def _is_side_value(b: _Builder, storage_of_node, a: torch.fx.Node) -> bool:
    """Whether `a` stays out of the graph (a side value or pinned state)."""
    if a in b.side:
        return True
    st = storage_of_node.get(a)
    return st is not None and st in b.pinned_storages


def _raw_op(b: _Builder, n: torch.fx.Node, storage_of_node, functionalizable, getitems):
    """One trace node as a raw graph op, or ``None`` for a rider (it produces
    and writes nothing the graph tracks)."""
    phase = b.cap.phase[n]
    written = _written_args(n)
    inputs = [a for a in _arg_nodes((n.args, n.kwargs))]
    graph_inputs = [a for a in inputs if not _is_side_value(b, storage_of_node, a)]
    for a in graph_inputs:
        if a not in b.tensor_of and a.meta.get("val") is not None and _tensors(a.meta.get("val")):
            # e.g. a zero-element value produced earlier
            if all(t.numel() == 0 for t in _tensors(a.meta["val"])):
                continue
            raise UnsupportedOpError(f"op `{n.name}` ({n.target}) reads `{a.name}`, which has no graph tensor")
    graph_inputs = [a for a in graph_inputs if a in b.tensor_of]
    # values this node produces
    produced: list[tuple[torch.fx.Node, torch.Tensor]] = []
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        produced.append((n, v))
    elif isinstance(v, (tuple, list)):
        for g in getitems:
            gv = g.meta.get("val")
            if isinstance(gv, torch.Tensor):
                produced.append((g, gv))
    written_graph = []
    pinned_written_pos = []
    for pos, arg in written:
        for a in _arg_nodes(arg):
            if _is_side_value(b, storage_of_node, a):
                pinned_written_pos.append(pos)
                b.written_pinned_storages.add(storage_of_node.get(a))
            elif a in b.tensor_of:
                written_graph.append(a)
    if pinned_written_pos:
        b.pinned_writes[n] = sorted(set(pinned_written_pos))
    f = functionalizable(n, written) if written_graph else None
    real_outputs = [
        (g, gv) for g, gv in produced
        if gv.numel() > 0 and StorageWeakRef(gv.untyped_storage()) not in b.pinned_storages
    ]
    for g, gv in produced:
        if (g, gv) not in real_outputs:
            b.side.add(g)
    if not real_outputs and not written_graph:
        # produces nothing the graph tracks: a rider of the previous op
        if graph_inputs and pinned_written_pos:
            raise UnsupportedOpError(
                f"op `{n.name}` ({n.target}) reads graph tensors only to update module state "
                "in place; outcore.torch cannot place it in a plan"
            )
        b.side.add(n)
        return None
    kind = _phase_kind(phase)
    out_ids, is_view_op = _op_outputs(b, real_outputs, written_graph, storage_of_node, kind, f)
    _written_versions(b, n, written_graph, storage_of_node, kind, out_ids)
    if f is not None:
        b.functional[n] = f
    return {
        "nodes": [n], "phase": phase, "inputs": graph_inputs, "outputs": out_ids,
        "riders": [], "is_view": is_view_op, "written": written_graph,
    }


def _op_outputs(b: _Builder, real_outputs, written_graph, storage_of_node, kind, f):
    """The graph tensors of a node's outputs (new owners, or views and
    versions of an earlier storage's owner), and whether the op only makes
    views."""
    out_ids: list[int] = []
    is_view_op = bool(real_outputs) and not written_graph
    for g, gv in real_outputs:
        st = StorageWeakRef(gv.untyped_storage())
        name = g.name
        if f is not None:
            tid = b.new_tensor(g, gv, name, kind, None)
            b.owner_of_storage[st] = tid
        elif st in b.owner_of_storage:
            owner = b.owner_of_storage[st]
            root = b.tensors[owner].owner
            is_written = any(storage_of_node.get(a) == st for a in written_graph)
            tid = b.new_tensor(g, gv, name, kind, None, view_of=root, version=is_written)
            b.tensors[tid].owner = root
            if is_written:
                b.kept_inplace_owners.add(root)
        else:
            tid = b.new_tensor(g, gv, name, kind, None)
            b.owner_of_storage[st] = tid
            is_view_op = False
        if b.tensors[tid].view_of is None:
            is_view_op = False
        b.tensor_of[g] = tid
        out_ids.append(tid)
    return out_ids, is_view_op


def _written_versions(b: _Builder, n, written_graph, storage_of_node, kind, out_ids) -> None:
    """In-place writes whose written value is not returned (e.g.
    ``_foreach_*_``): a new version of each written storage, appended to
    `out_ids`."""
    for a in written_graph:
        st = storage_of_node.get(a)
        root = b.tensors[b.owner_of_storage[st]].owner
        if any(b.tensors[t].owner == root for t in out_ids):
            continue
        val = a.meta["val"]
        tid = b.new_tensor(None, val, f"{n.name}.{a.name}", kind, None, view_of=root, version=True)
        b.tensors[tid].owner = root
        b.kept_inplace_owners.add(root)
        out_ids.append(tid)


def _group_persistent_writes(b: _Builder, raw_ops, persistent_storages, storage_of_node):
    """Merges each run of ops from the first to the last write of a persistent
    storage into one op (see the module docs)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, op in enumerate(raw_ops):
        for t in op["outputs"]:
            info = b.tensors[t]
            if info.version and b.tensors[info.owner].placeholder is not None:
                root = info.owner
                first.setdefault(root, k)
                last[root] = k
    spans = sorted((first[r], last[r]) for r in first)
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    groups: list[tuple[int, int]] = []
    k = 0
    mi = 0
    while k < len(raw_ops):
        if mi < len(merged) and merged[mi][0] == k:
            groups.append((k, merged[mi][1] + 1))
            k = merged[mi][1] + 1
            mi += 1
        else:
            groups.append((k, k + 1))
            k += 1
    ops: list[OpInfo] = []
    for s, e in groups:
        members = raw_ops[s:e]
        nodes = [n for m in members for n in m["nodes"]]
        riders = [r for m in members for r in m["riders"]]
        op = OpInfo(id=len(ops), name=nodes[0].name if e - s == 1 else f"{nodes[0].name}..{nodes[-1].name}",
                    label=str(nodes[0].target) if e - s == 1 else "optimizer_update",
                    phase=members[0]["phase"], nodes=nodes, riders=riders)
        produced = [t for m in members for t in m["outputs"]]
        produced_set = set(produced)
        ins: list[int] = []
        for m in members:
            for a in m["inputs"]:
                t = b.tensor_of[a]
                if t not in produced_set and t not in ins:
                    ins.append(t)
        op.inputs = ins
        op.outputs = produced
        op._is_view = e - s == 1 and members[0]["is_view"]  # type: ignore[attr-defined]
        ops.append(op)
    for op in ops:
        for t in op.outputs:
            b.tensors[t].producer = op.id
    return ops


def _mark_outputs(b: _Builder, cap: Captured, nodes) -> None:
    out = nodes[-1]
    for k, a in enumerate(_arg_nodes(out.args)):
        if a not in b.tensor_of:
            continue
        t = b.tensors[b.tensor_of[a]]
        t.is_output = True
        if k == 0:
            b.tensors[t.owner].kind = "loss"
            t.kind = "loss"


def _finish_ops(b: _Builder, cap: Captured, ops: list[OpInfo]) -> None:
    """Final versions of persistent tensors, group-internal temporaries, kinds."""
    readers: dict[int, set[int]] = {}
    for op in ops:
        for t in op.inputs:
            readers.setdefault(t, set()).add(op.id)
    for op in ops:
        # the last version of each persistent owner written in this op becomes its update
        last_version: dict[int, int] = {}
        for t in op.outputs:
            info = b.tensors[t]
            if info.version and b.tensors[info.owner].placeholder is not None:
                last_version[info.owner] = t
        keep: list[int] = []
        workspace = 0
        for t in op.outputs:
            info = b.tensors[t]
            if info.version and info.owner in last_version:
                if last_version[info.owner] == t:
                    info.view_of = None
                    info.inplace_update_of = info.owner
                    root = b.tensors[info.owner]
                    info.kind = root.kind
                    info.name = root.name + "'"
                    info.is_output = True
                    keep.append(t)
                continue  # an intermediate version inside the op
            if len(op.nodes) > 1 and not info.is_output and not (readers.get(t, set()) - {op.id}):
                # a temporary used only inside a merged op: its workspace
                views_read = any(
                    b.tensors[v].owner == t and (readers.get(v, set()) - {op.id}) for v in op.outputs
                )
                if not views_read:
                    if info.view_of is None:
                        workspace += info.size_bytes
                    continue
            keep.append(t)
        op.outputs = keep
        op.workspace_bytes = workspace
        op.flops = sum(_flops(n, getattr(op, "_is_view", False)) for n in op.nodes)
        mods = [cap.module.get(n) for n in op.nodes if cap.module.get(n)]
        op.module = mods[0] if mods else None
    # gradients of parameters: backward owners read by the optimizer
    for op in ops:
        if op.phase != "optimizer":
            continue
        for t in op.inputs:
            owner = b.tensors[b.tensors[t].owner]
            if owner.kind == "gradient":
                owner.kind = "parameter_gradient"
    # tensors dropped from every op (intermediate versions, temporaries) are
    # renumbered away
    keep_ids = sorted({t for op in ops for t in op.outputs} | {t.id for t in b.tensors if t.placeholder is not None})
    remap = {old: new for new, old in enumerate(keep_ids)}
    for t in b.tensors:
        if t.id in remap:
            continue
        # dropped: map its node to its owner's id for readers inside merged ops
    new_tensors = []
    for old in keep_ids:
        t = b.tensors[old]
        t.id = remap[old]
        new_tensors.append(t)
    for t in new_tensors:
        for f in ("view_of", "inplace_update_of", "owner"):
            v = getattr(t, f)
            if v is not None and v >= 0:
                setattr(t, f, remap.get(v, v))
    b.tensor_of = {n: remap[t] for n, t in b.tensor_of.items() if t in remap}
    for op in ops:
        op.inputs = [remap[t] for t in op.inputs if t in remap]
        op.outputs = [remap[t] for t in op.outputs]
    b.tensors = new_tensors
    b.kept_inplace_owners = {remap[t] for t in b.kept_inplace_owners if t in remap}
    b.owner_of_storage = {k: remap[v] for k, v in b.owner_of_storage.items() if v in remap}


def _set_recomputable(conv: Converted, b: _Builder, storage_of_node) -> None:
    det = torch.are_deterministic_algorithms_enabled()
    # Persistent tensors written by the optimizer are versioned by outcore
    # itself (verify refuses a recomputation that would read a stale version);
    # only activations and gradients written in place need this rule.
    mutated = {o for o in b.kept_inplace_owners if conv.tensors[o].placeholder is None}
    for op in conv.ops:
        why = None
        if op.phase != "forward":
            why = f"it is a {op.phase} op"
        elif len(op.nodes) != 1:
            why = "it merges several updates"
        else:
            n = op.nodes[0]
            base = _base(n.target)
            if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
                why = f"`{n.target}` is random: recomputing it would draw new numbers"
            elif base in NONDETERMINISTIC_UNLESS_FLAGGED and not det:
                why = f"`{n.target}` may be non-deterministic on the device (enable torch.use_deterministic_algorithms)"
            elif n in conv.pinned_writes and base not in SCRATCH_WRITES_OK:
                why = f"`{n.target}` updates module state in place"
            elif any(conv.tensors[t].version for t in op.outputs):
                why = f"`{n.target}` writes its input in place"
            elif any(conv.tensors[t].owner in mutated for t in op.inputs + op.outputs):
                why = "a tensor it reads or writes is also updated in place"
            else:
                for a in _arg_nodes((n.args, n.kwargs)):
                    st = storage_of_node.get(a)
                    if st is not None and st in b.written_pinned_storages and n not in conv.pinned_writes:
                        why = f"it reads `{a.name}`, module state updated during the step"
                        break
        op.recomputable = why is None
        op.why_not_recomputable = why


def to_graph_json(conv: Converted) -> dict[str, Any]:
    """The ``outcore-graph/1`` document of a converted step."""
    cap = conv.captured
    tensors = []
    for t in conv.tensors:
        d: dict[str, Any] = {
            "id": t.id, "name": t.name, "shape": t.shape, "dtype": t.dtype,
            "size_bytes": t.size_bytes, "kind": t.kind, "producer": t.producer,
        }
        if t.view_of is not None:
            d["view_of"] = t.view_of
        if t.inplace_update_of is not None:
            d["inplace_update_of"] = t.inplace_update_of
        if t.is_output:
            d["is_output"] = True
        tensors.append(d)
    ops = []
    size = {t.id: t.size_bytes for t in conv.tensors}
    for op in conv.ops:
        allocating = [t for t in op.outputs if conv.tensors[t].view_of is None]
        ops.append({
            "id": op.id, "name": op.name, "kind": {"named": {"name": op.label}},
            "phase": op.phase, "inputs": op.inputs, "outputs": op.outputs, "flops": op.flops,
            "bytes_read": sum(size[t] for t in set(op.inputs)),
            "bytes_written": sum(size[t] for t in allocating),
            "workspace_bytes": op.workspace_bytes,
            "recomputable": op.recomputable,
            **({"module": op.module} if op.module else {}),
        })
    opt = None
    return {
        "format": "outcore-graph/1",
        "meta": {
            "model": cap.model_name,
            "batch": cap.batch,
            "optimizer": opt or "captured",
            "source": f"outcore.torch capture on {cap.device} (torch {torch.__version__})",
        },
        "tensors": tensors,
        "ops": ops,
    }
