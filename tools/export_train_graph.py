#!/usr/bin/env python3
"""Export one PyTorch training step as a ``dnn-train-graph/1`` JSON file for outcore.

This file holds the PyTorch-side exporter of outcore's training-graph interchange
format (spec: shared/formats/pytorch-training-graph.md).  It builds a torchvision or
Hugging Face transformers model *without weights*, runs one eager training step
(forward, loss, backward, optimizer step) and records every ATen operator with a
``TorchDispatchMode``:

* Device: everything runs on PyTorch's ``meta`` device.  Meta tensors carry shapes,
  dtypes, strides and storages but no data, so a 7B-parameter model needs no real
  memory and no accelerator.  Numeric values are never looked at.
* Tensor identity: a tensor is keyed by (storage, storage offset, shape, strides,
  dtype); storages are told apart by their ``StorageImpl`` pointer
  (``untyped_storage()._cdata``), which works on meta tensors where ``data_ptr`` is
  always 0.  Every tensor seen is kept referenced until the end, so no storage is
  freed and reused while recording.
* Views: an op output that shares a storage already seen is a view
  (``alias_of`` = the tensor that owns the storage).  In-place ops (schema returns or
  arguments annotated ``Tensor(a!)``) create a new version of the mutated tensor; the
  last version of a parameter, buffer or optimizer state becomes its
  ``*_updated`` tensor (``inplace_of``), intermediate versions are views of their
  owner, so in-place ops cost no memory, as in eager PyTorch.
* FLOPs: ``torch.utils.flop_counter``'s formulas where PyTorch has one
  (``flop_counter``), the largest operand's element count for other computing ops
  (``elementwise_est``), 0 for views (``view``) and for copies / factories (``none``).
* The optimizer step is written out as PyTorch's single-tensor (``foreach=False``)
  SGD / AdamW update, in steady state (momentum buffers / Adam moments already
  exist); the step counter of AdamW is a Python number and not part of the graph.
* ``Tensor.item()`` on a meta tensor returns True (bool) or 0, so model code that
  branches on data (Hugging Face mask helpers) takes the no-padding path.
* ``F.dropout`` is routed to ``aten.native_dropout`` (the kernel CUDA uses) while
  recording, because the CPU/meta composite expands to bernoulli/div/mul.  No
  generator state is recorded (the meta device consumes none): outcore's importer
  makes dropout recomputable by splitting the mask draw (kept, as backward keeps
  it anyway) from the rest, and splits batch norm's running-statistics update off
  the normalisation (see ``crates/graph/src/format/dnn_train_graph.rs``).

Usage::

    python3 tools/export_train_graph.py --model resnet50 --batch 32 -o resnet50_b32.json
    python3 tools/export_train_graph.py --model hf:gpt2 --batch 8 --seq 1024 --optimizer adamw -o gpt2.json
    python3 tools/export_train_graph.py --model "torchvision:inception_v3?aux_logits=true" --batch 32 -o inception_v3_aux_b32.json
    python3 tools/export_train_graph.py --list-models
    python3 tools/export_train_graph.py --summarize FILE   # recompute a file's summary

Needs ``torch`` (and ``torchvision`` / ``transformers`` for those models); it is a
developer tool, not a build or CI dependency of outcore.  ``--summarize`` needs only
the Python standard library.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict

FORMAT = "dnn-train-graph/1"

# Short names -> model specs.  A spec is "torchvision:NAME" or "hf:MODEL_TYPE"
# optionally followed by config overrides "hf:gpt2?n_layer=24,n_embd=1024,n_head=16".
MODEL_TABLE = {
    "gpt2": "hf:gpt2",
    "gpt2-medium": "hf:gpt2?n_embd=1024,n_layer=24,n_head=16",
    "gpt2-large": "hf:gpt2?n_embd=1280,n_layer=36,n_head=20",
    "gpt2-xl": "hf:gpt2?n_embd=1600,n_layer=48,n_head=25",
    "bert-base": "hf:bert",
    "bert-large": "hf:bert?hidden_size=1024,num_hidden_layers=24,num_attention_heads=16,intermediate_size=4096",
    "llama-7b": "hf:llama?hidden_size=4096,intermediate_size=11008,num_hidden_layers=32,"
    "num_attention_heads=32,num_key_value_heads=32,vocab_size=32000",
    "t5-small": "hf:t5",
}

# Legacy ops that update their running statistics in place although their schema
# does not say so (no `Tensor(a!)`): argument positions written when training.
UNANNOTATED_WRITES = {
    "native_batch_norm": (3, 4),
    "cudnn_batch_norm": (3, 4),
    "miopen_batch_norm": (3, 4),
}

# Ops whose cost is not arithmetic: copies, fills and tensor factories.
NO_FLOP_OPS = {
    "clone", "copy", "copy_", "_to_copy", "to", "contiguous", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill", "fill_",
    "zero_", "scalar_tensor", "arange", "lift_fresh", "lift_fresh_copy", "_local_scalar_dense",
    "cat", "stack", "index_select", "gather", "embedding", "slice_scatter", "select_scatter",
    "masked_fill", "masked_fill_", "constant_pad_nd", "repeat", "triu", "tril", "tril_",
    "triu_", "rand", "randn", "randint", "rand_like", "randn_like", "bernoulli_",
    "_unsafe_view", "detach_", "resize_", "set_",
}


# --------------------------------------------------------------------------- summary
def _numel(shape):
    return math.prod(shape) if shape else 1


def root_of(tensors, tid):
    """The allocating tensor behind `tid` (follows alias_of and inplace_of)."""
    seen = 0
    while True:
        t = tensors[tid]
        nxt = t["alias_of"] if t["alias_of"] is not None else t["inplace_of"]
        if nxt is None:
            return tid
        tid = nxt
        seen += 1
        if seen > len(tensors):
            raise ValueError("alias_of / inplace_of cycle")


PERSISTENT_ROLES = ("param", "buffer", "opt_state")


def liveness(g):
    """[(start, end)] for every allocating tensor id (None for non-allocating or persistent).

    Spec semantics: an allocating tensor lives from its producer (graph inputs: from
    op 0) to the last op that reads it or any view of it; step outputs live to the
    end; parameters, buffers and optimizer state are persistent (always live).
    """
    ops, tensors = g["ops"], g["tensors"]
    n = len(ops)
    roots = [root_of(tensors, t["id"]) for t in tensors]
    last = {}
    for op in ops:
        for tid in op["inputs"]:
            last[roots[tid]] = op["id"]
    spans = [None] * len(tensors)
    for t in tensors:
        if t["alias_of"] is not None or t["inplace_of"] is not None:
            continue
        if t["role"] in PERSISTENT_ROLES:
            continue
        start = t["producer"] if t["producer"] is not None else 0
        end = max(start, last.get(t["id"], start))
        spans[t["id"]] = (start, end)
    # outputs of the step (and their views) keep their owner alive to the end
    for t in tensors:
        if t["is_output"]:
            r = roots[t["id"]]
            if spans[r] is not None:
                spans[r] = (spans[r][0], n - 1)
    return spans


def summarize(g):
    """The informative summary block, computed from ops and tensors only."""
    ops, tensors = g["ops"], g["tensors"]
    n = len(ops)
    by_role = Counter()
    for t in tensors:
        if t["alias_of"] is None and t["inplace_of"] is None:
            by_role[t["role"]] += t["bytes"]
    persistent = sum(by_role[r] for r in PERSISTENT_ROLES)
    spans = liveness(g)
    delta = [0] * (n + 1)
    for t in tensors:
        s = spans[t["id"]]
        if s is not None:
            delta[s[0]] += t["bytes"]
            delta[s[1] + 1] -= t["bytes"]
    live, peak, peak_op, curve = 0, 0, 0, []
    for i in range(n):
        live += delta[i]
        curve.append(live)
        if live > peak:
            peak, peak_op = live, i
    phases = Counter(op["phase"] for op in ops)
    fwd_end = max((op["id"] for op in ops if op["phase"] == "forward"), default=-1)
    at_fwd_end = 0
    if fwd_end >= 0:
        for t in tensors:
            s = spans[t["id"]]
            if s is not None and s[0] <= fwd_end < s[1]:
                at_fwd_end += t["bytes"]
    flops = Counter()
    flops_fc = Counter()
    for op in ops:
        flops[op["phase"]] += op["flops"]
        if op["flops_src"] == "flop_counter":
            flops_fc[op["phase"]] += op["flops"]
    order = ["forward", "backward", "optimizer"]

    def first(phase):
        return next((op["id"] for op in ops if op["phase"] == phase), None)

    return {
        "num_ops": n,
        "num_ops_by_phase": {p: phases[p] for p in order if phases[p]},
        "num_tensors": len(tensors),
        "num_storage_owners": sum(1 for t in tensors if t["alias_of"] is None),
        "num_views": sum(1 for t in tensors if t["alias_of"] is not None),
        "num_distinct_tensor_bytes": len({t["bytes"] for t in tensors}),
        "num_distinct_shapes": len({(tuple(t["shape"]), t["dtype"]) for t in tensors}),
        "num_params": sum(1 for t in tensors if t["role"] == "param"),
        "param_bytes": by_role["param"],
        "buffer_bytes": by_role["buffer"],
        "opt_state_bytes": by_role["opt_state"],
        "persistent_bytes": persistent,
        "peak_live_bytes": peak + persistent,
        "peak_nonpersistent_bytes": peak,
        "peak_live_op": peak_op,
        "peak_live_op_name": ops[peak_op]["name"] if ops else None,
        "nonpersistent_live_bytes_at_forward_end": at_fwd_end,
        "saved_for_backward_bytes": at_fwd_end,
        "bytes_by_role_allocating": {r: b for r, b in by_role.items()},
        "flops_by_phase": {p: flops[p] for p in order if phases[p]},
        "flops_by_phase_flop_counter_only": {p: flops_fc[p] for p in order if flops_fc[p]},
        "optimizer_phase_starts_at_op": first("optimizer"),
        "backward_phase_starts_at_op": first("backward"),
    }


def check_graph(g):
    """Structural checks the importer relies on; raises ValueError."""
    ops, tensors = g["ops"], g["tensors"]
    for i, op in enumerate(ops):
        if op["id"] != i:
            raise ValueError(f"ops[{i}].id == {op['id']}")
        for tid in op["inputs"] + op["outputs"]:
            if not 0 <= tid < len(tensors):
                raise ValueError(f"op {i} names tensor {tid}")
    for i, t in enumerate(tensors):
        if t["id"] != i:
            raise ValueError(f"tensors[{i}].id == {t['id']}")
        p = t["producer"]
        if p is not None and i not in ops[p]["outputs"]:
            raise ValueError(f"tensor {i} not an output of its producer {p}")
        for op in ops[: p if p is not None else 0]:
            if i in op["inputs"]:
                raise ValueError(f"tensor {i} read by op {op['id']} before producer {p}")
        root_of(tensors, i)


# --------------------------------------------------------------------------- capture
def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def parse_spec(spec):
    spec = MODEL_TABLE.get(spec, spec)
    if ":" not in spec:
        spec = "torchvision:" + spec
    family, _, rest = spec.partition(":")
    name, _, over = rest.partition("?")
    overrides = {}
    for kv in filter(None, over.split(",")):
        k, _, v = kv.partition("=")
        overrides[k.strip()] = _parse_value(v.strip())
    return family, name, overrides


def _parse_value(v):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def build_model(spec, args):
    """(model, model_name, make_inputs, run, loss_fn, seq, input_shape).  Builds on the meta device."""
    family, name, overrides = parse_spec(spec)
    if family == "torchvision":
        return _torchvision_model(spec, name, overrides, args)
    if family == "hf":
        return _hf_model(spec, name, overrides, args)
    raise SystemExit(f"error: unknown model family {family!r} in {spec!r} (use torchvision: or hf:)")


def _torchvision_model(spec, name, overrides, args):
    """A torchvision classifier (auxiliary heads' losses weighted as torchvision's
    reference recipe weights them); ``build_model``'s tuple."""
    import torch

    try:
        import torchvision
    except ImportError as e:
        raise SystemExit(f"error: torchvision is needed for {spec!r}: {e}")
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise SystemExit(
            f"error: unknown torchvision model {name!r}; known: {', '.join(sorted(available))}"
            f"\n(short names: {', '.join(sorted(MODEL_TABLE))}; Hugging Face: hf:MODEL_TYPE)"
        )
    kw = dict(overrides)
    if name in ("inception_v3", "googlenet"):
        kw.setdefault("aux_logits", False)
        kw.setdefault("init_weights", False)
    with torch.device("meta"):
        model = torchvision.models.get_model(name, weights=None, **kw)
    size = args.image_size or (299 if name == "inception_v3" else 224)
    shape = [args.batch, 3, size, size]
    num_classes = kw.get("num_classes", 1000)

    def make_inputs():
        x = torch.empty(shape, device="meta", dtype=args.torch_dtype)
        y = torch.empty([args.batch], device="meta", dtype=torch.int64)
        return x, y

    def run(model, x):
        out = model(x)
        if isinstance(out, torch.Tensor):
            return out, []
        if hasattr(out, "logits"):  # InceptionOutputs, GoogLeNetOutputs
            # With aux_logits=True the auxiliary heads run in training mode and
            # their losses join the main loss (torchvision's reference recipe).
            aux = [getattr(out, a, None) for a in ("aux_logits", "aux_logits2", "aux_logits1")]
            return out.logits, [a for a in aux if isinstance(a, torch.Tensor)]
        return (out["out"] if isinstance(out, dict) else out[0]), []

    # torchvision's references/classification/train.py: inception_v3 adds
    # 0.4 x its auxiliary loss, googlenet 0.3 x each of its two.
    aux_weight = 0.4 if name == "inception_v3" else 0.3

    def loss_fn(out, y):
        logits, aux = out
        loss = torch.nn.functional.cross_entropy(logits, y)
        for a in aux:
            loss = loss + aux_weight * torch.nn.functional.cross_entropy(a, y)
        return loss

    del num_classes
    return model, name, make_inputs, run, loss_fn, None, shape


def _hf_model(spec, name, overrides, args):
    """A Hugging Face model from its config with the first trainable head that
    fits it (causal LM, masked LM, seq2seq, sequence classification);
    ``build_model``'s tuple."""
    import torch

    try:
        import transformers
    except ImportError as e:
        raise SystemExit(f"error: transformers is needed for {spec!r}: {e}")
    try:
        cfg = transformers.AutoConfig.for_model(name, **overrides)
    except (ValueError, KeyError):
        raise SystemExit(f"error: unknown Hugging Face model type {name!r} "
                         f"(model types are the keys of transformers.CONFIG_MAPPING, e.g. gpt2, bert, llama)")
    seq = args.seq or 128
    if args.attn != "default":
        cfg._attn_implementation = args.attn
    model = None
    auto_classes = ("AutoModelForCausalLM", "AutoModelForMaskedLM",
                    "AutoModelForSeq2SeqLM", "AutoModelForSequenceClassification")
    last_err = None
    for cls_name in auto_classes:
        cls = getattr(transformers, cls_name)
        try:
            with torch.device("meta"):
                model = cls.from_config(cfg, torch_dtype=args.torch_dtype)
            break
        except (ValueError, KeyError) as e:
            last_err = e
    if model is None:
        raise SystemExit(f"error: no trainable head for Hugging Face model type {name!r}: {last_err}")
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    shape = [args.batch, seq]
    seq2seq = model.config.is_encoder_decoder
    vocab = model.config.vocab_size

    def make_inputs():
        x = torch.empty(shape, device="meta", dtype=torch.int64)
        if model.__class__.__name__.endswith("ForSequenceClassification"):
            y = torch.empty([args.batch], device="meta", dtype=torch.int64)
        else:
            y = torch.empty(shape, device="meta", dtype=torch.int64)
        return x, y

    def run(model, x):
        if seq2seq:
            out = model(input_ids=x, decoder_input_ids=x, use_cache=False)
        else:
            out = model(input_ids=x)
        return out.logits

    def loss_fn(logits, y):
        if logits.dim() == 3:
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        return torch.nn.functional.cross_entropy(logits.float(), y)

    del vocab
    label = f"{name}" if not overrides else spec
    return model, label, make_inputs, run, loss_fn, seq, shape


class Recorder:
    """Builds the ops / tensors tables from dispatched ATen calls."""

    def __init__(self):
        import torch

        self.torch = torch
        self.ops = []
        self.tensors = []
        self.key_to_id = {}  # geometric key -> latest graph tensor with that key
        self.obj_to_id = {}  # id(python tensor) -> graph tensor (objects are kept alive)
        self.storage_owner = {}  # storage cdata -> allocating tensor id
        self.keep = []  # strong refs: storages are never freed while recording
        self.phase = "forward"
        self.module_stack = []
        self.in_model = False
        self.name_counts = Counter()
        self.input_versions = defaultdict(list)  # graph-input id -> in-place versions
        from torch.utils.flop_counter import FlopCounterMode

        self.flop_registry = FlopCounterMode().flop_registry

    # tensor helpers
    def key(self, t):
        st = t.untyped_storage()
        return (st._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)

    def _new(self, t, name, kind, role, producer, alias_of=None):
        tid = len(self.tensors)
        self.tensors.append({
            "id": tid, "name": name, "shape": list(t.shape), "dtype": _dtype_name(t.dtype),
            "bytes": t.numel() * t.element_size(), "kind": kind, "role": role,
            "producer": producer, "alias_of": alias_of, "inplace_of": None, "is_output": False,
        })
        self.keep.append(t)
        self.key_to_id[self.key(t)] = tid
        self.obj_to_id[id(t)] = tid
        return tid

    def add_input(self, t, name, kind, role):
        tid = self._new(t, name, kind, role, None)
        st = t.untyped_storage()
        self.storage_owner.setdefault(st._cdata, tid)
        if st.nbytes() != self.tensors[tid]["bytes"]:
            self.tensors[tid]["_storage_bytes"] = st.nbytes()
        return tid

    def lookup(self, t):
        # The same Python object first (a parameter stays itself even when a view
        # with identical geometry exists, e.g. t(t(weight)) in backward); a new object
        # for known data (autograd unpacking a saved tensor) by its geometric key.
        tid = self.obj_to_id.get(id(t))
        if tid is not None:
            return tid
        k = self.key(t)
        tid = self.key_to_id.get(k)
        if tid is not None:
            return tid
        owner = self.storage_owner.get(k[0])
        if owner is not None:  # a view made outside dispatch (e.g. `.data`)
            return self._new(t, f"{self.tensors[owner]['name']}.view", self.tensors[owner]["kind"],
                             self.tensors[owner]["role"], None, alias_of=self.root(owner))
        n = sum(1 for x in self.tensors if x["name"].startswith("constant"))
        return self.add_input(t, f"constant_{n}", "other", "buffer")

    def root(self, tid):
        return root_of(self.tensors, tid)

    def role_for_phase(self):
        return {"forward": ("activation", "activation"), "backward": ("gradient", "grad"),
                "optimizer": ("other", "opt_temp")}[self.phase]

    # one dispatched op
    def record(self, func, args, kwargs, out):
        torch = self.torch
        from torch.utils._pytree import tree_flatten

        flat_in, _ = tree_flatten((args, kwargs))
        # zero-element tensors (e.g. batch norm's empty `reserve`) hold no memory and
        # are left out of the graph
        in_tensors = [a for a in flat_in if isinstance(a, torch.Tensor) and a.numel() > 0]
        inputs = [self.lookup(a) for a in in_tensors]
        schema = func._schema
        # arguments the op writes to (in-place / out= / running stats)
        written = []
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            val = kwargs.get(a.name) if a.name in kwargs or i >= len(args) else args[i]
            vals, _ = tree_flatten(val)
            written += [v for v in vals if isinstance(v, torch.Tensor)]
        base = func._overloadpacket.__name__
        training = args[5] if len(args) > 5 else kwargs.get("training", True)
        if base in UNANNOTATED_WRITES and training:
            written += [args[i] for i in UNANNOTATED_WRITES[base]
                        if i < len(args) and isinstance(args[i], torch.Tensor)]
        written = [w for w in written if w.numel() > 0]
        flat_out, _ = tree_flatten(out)
        all_out = [o for o in flat_out if isinstance(o, torch.Tensor)]
        out_tensors = [o for o in all_out if o.numel() > 0]
        if all_out and not out_tensors and not written:
            self.keep.extend(all_out)
            return  # e.g. `empty` of a zero-element tensor: nothing to record
        op_id = len(self.ops)
        c = self.name_counts[base]
        self.name_counts[base] += 1
        stem = base if c == 0 else f"{base}_{c}"
        kind, role = self.role_for_phase()
        outputs = []
        written_keys = {self.key(w) for w in written}
        ordered = out_tensors + [w for w in written if all(w is not o for o in out_tensors)]
        multi = len(ordered) > 1
        seen_out = set()
        is_view_op = False
        for j, o in enumerate(ordered):
            name = f"{stem}.{j}" if multi else stem
            k = self.key(o)
            if k in seen_out:
                continue
            seen_out.add(k)
            cd = k[0]
            if k in written_keys:  # new version of a mutated tensor
                old = self.lookup(o)
                r = self.root(old)
                tid = self._new(o, name, kind, role, op_id, alias_of=r)
                if self.tensors[r]["producer"] is None and self.tensors[r]["role"] in PERSISTENT_ROLES + ("input", "label"):
                    self.input_versions[r].append(tid)
            elif cd in self.storage_owner:  # shares a storage already seen: a view
                tid = self._new(o, name, kind, role, op_id, alias_of=self.storage_owner[cd])
                is_view_op = True
            else:  # fresh allocation
                tid = self._new(o, name, kind, role, op_id)
                self.storage_owner[cd] = tid
                st = o.untyped_storage().nbytes()
                if st != self.tensors[tid]["bytes"]:
                    self.tensors[tid]["_storage_bytes"] = st
            outputs.append(tid)
        flops, src = self.flops(func, base, args, kwargs, out, in_tensors, out_tensors,
                                is_view_op and len(outputs) == 1 and not written)
        module = None
        if self.phase == "forward" and self.in_model:
            module = self.module_stack[-1] if self.module_stack else "<root>"
        self.ops.append({"id": op_id, "name": str(func), "phase": self.phase, "inputs": inputs,
                         "outputs": outputs, "flops": int(flops), "flops_src": src, "module": module})

    def flops(self, func, base, args, kwargs, out, ins, outs, is_view):
        if is_view:
            return 0, "view"
        f = self.flop_registry.get(func._overloadpacket)
        if base == "convolution_backward":
            # PyTorch's backward formula ignores `groups` for the weight gradient and
            # so overcounts depthwise convolutions by the channel count; count each
            # requested gradient (input, weight) as one forward convolution instead.
            try:
                grad_out, x, w = args[0], args[1], args[2]
                stride, padding, dilation, transposed, out_pad, groups, mask = args[4:11]
                fwd = self.flop_registry[self.torch.ops.aten.convolution](
                    x, w, None, stride, padding, dilation, transposed, out_pad, groups, out_val=grad_out)
                return fwd * (int(bool(mask[0])) + int(bool(mask[1]))), "flop_counter"
            except Exception:  # noqa: BLE001 - fall back to PyTorch's formula
                pass
        if f is not None:
            try:
                return f(*args, **kwargs, out_val=out), "flop_counter"
            except Exception:  # noqa: BLE001 - formula not applicable; fall back
                pass
        if base in NO_FLOP_OPS or not ins:
            return 0, "none"
        return max(t.numel() for t in ins), "elementwise_est"

    def finish(self, loss, grads, params_ids, optimizer):
        T = self.tensors
        lid = self.key_to_id[self.key(loss)]
        T[lid]["role"] = "loss"
        T[lid]["is_output"] = True
        for g in grads:
            if g is None:
                continue
            gid = self.key_to_id[self.key(g)]
            T[gid]["role"] = "grad_param"
            if optimizer == "none":
                T[gid]["is_output"] = True
        updated = {"param": ("param", "param_updated"), "buffer": ("other", "buffer_updated"),
                   "opt_state": ("other", "opt_state_updated")}
        for r, versions in self.input_versions.items():
            t0 = T[r]
            last = T[versions[-1]]
            if t0["role"] not in updated or last["shape"] != t0["shape"]:
                continue
            last["alias_of"] = None
            last["inplace_of"] = r
            last["kind"], last["role"] = updated[t0["role"]]
            last["name"] = t0["name"] + "'"
            last["is_output"] = True
        del params_ids


def capture(args):
    """One eager training step of ``args.model`` on the meta device, recorded
    op by op: the ``dnn-train-graph/1`` dict with its summary."""
    import torch

    model, model_name, make_inputs, run, loss_fn, seq, input_shape = build_model(args.model, args)
    model.train()
    rec = Recorder()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for p in model.parameters():
        if p.dtype != args.torch_dtype and p.is_floating_point():
            p.data = p.data.to(args.torch_dtype)
    opt_state = _optimizer_state(params, args.optimizer)
    x, y = make_inputs()
    param_ids = _add_inputs(rec, params, list(model.named_buffers()), opt_state, x, y)
    handles = _module_hooks(model, rec)
    orig_dropout = _route_dropout_to_native()
    plist = [p for _, p in params]
    try:
        with _dispatch_mode(rec):
            rec.phase, rec.in_model = "forward", True
            out = run(model, x)
            rec.in_model = False
            loss = loss_fn(out, y)
            rec.phase = "backward"
            grads = torch.autograd.grad(loss, plist, allow_unused=True)
            rec.phase = "optimizer"
            with torch.no_grad():
                optimizer_step(args, plist, grads, [[s for _, s in st] for st in opt_state])
    finally:
        torch.nn.functional.dropout = orig_dropout
        for h in handles:
            h.remove()
    rec.finish(loss, grads, param_ids, args.optimizer)
    return _graph_dict(rec, args, model_name, seq, input_shape)


def _optimizer_state(params, optimizer):
    """Per parameter, its optimizer state as (name, meta tensor) pairs in steady
    state: SGD's momentum buffer, AdamW's two moments, nothing without one."""
    import torch

    opt_state = []
    with torch.no_grad():
        for n, p in params:
            if optimizer == "sgd":
                opt_state.append([(n + ".momentum_buffer", torch.empty_like(p))])
            elif optimizer == "adamw":
                opt_state.append([(n + ".exp_avg", torch.empty_like(p)),
                                  (n + ".exp_avg_sq", torch.empty_like(p))])
            else:
                opt_state.append([])
    return opt_state


def _add_inputs(rec, params, buffers, opt_state, x, y):
    """The graph's inputs in file order (parameters, buffers, optimizer state,
    the batch and its labels); returns the parameters' tensor ids."""
    import torch

    param_ids = [rec.add_input(p, n, "param", "param") for n, p in params]
    for n, b in buffers:
        rec.add_input(b, n, "other", "buffer")
    for states in opt_state:
        for n, s in states:
            rec.add_input(s, n, "other", "opt_state")
    rec.add_input(x, "input_ids" if x.dtype == torch.int64 else "images", "input", "input")
    rec.add_input(y, "labels", "input", "label")
    return param_ids


def _module_hooks(model, rec):
    """Forward hooks keeping ``rec.module_stack`` the path of the modules whose
    forward is running; returns their handles."""
    names = {m: (n or "<root>") for n, m in model.named_modules()}

    def pre(mod, _inp):
        rec.module_stack.append(names.get(mod, type(mod).__name__))

    def post(mod, _inp, _out):
        if rec.module_stack:
            rec.module_stack.pop()

    handles = []
    for m in names:
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))
    return handles


def _dispatch_mode(rec):
    """The dispatch mode that records every ATen op into ``rec``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    SKIP = {torch.ops.aten.detach.default}
    LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            kw = kw or {}
            if func is LOCAL_SCALAR and a[0].is_meta:
                # `Tensor.item()` has no value on meta: data-dependent Python control
                # flow sees True / 0 (e.g. an all-ones attention mask, no packing).
                return True if a[0].dtype == torch.bool else 0
            out = func(*a, **kw)
            if func in SKIP:
                # autograd's own bookkeeping (saving / unpacking tensors for backward):
                # same storage and geometry as the input, so it resolves to the same
                # graph tensor; no kernel runs, so no op is recorded.
                rec.keep.append(out)
            else:
                rec.record(func, a, kw, out)
            return out

    return Mode()


def _route_dropout_to_native():
    """Routes ``F.dropout`` to ``aten.native_dropout`` (see the module doc);
    returns the original, for the caller to put back."""
    import torch
    import torch.nn.functional as F

    orig_dropout = F.dropout

    def native_dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        return torch.native_dropout(input, p, True)[0]

    F.dropout = native_dropout
    return orig_dropout


def _graph_dict(rec, args, model_name, seq, input_shape):
    """The file's dict from a finished recording, checked, with its summary."""
    import torch

    g = {
        "format": FORMAT,
        "model": model_name,
        "batch": args.batch,
        "seq": seq,
        "input_shape": input_shape,
        "dtype": _dtype_name(args.torch_dtype),
        "optimizer": args.optimizer,
        "torch_version": torch.__version__,
        "summary": None,
        "ops": rec.ops,
        "tensors": rec.tensors,
    }
    differs = 0
    for t in rec.tensors:
        if "_storage_bytes" in t:
            differs += t["alias_of"] is None
            del t["_storage_bytes"]
    check_graph(g)
    s = summarize(g)
    s["owner_storage_bytes_differs_from_logical"] = differs
    s["capture"] = {"device": "meta", "method": "TorchDispatchMode (eager)"}
    g["summary"] = s
    return g


def optimizer_step(args, params, grads, states):
    """PyTorch's single-tensor SGD / AdamW update (torch.optim, foreach=False), steady state."""
    lr, wd = args.lr, args.weight_decay
    if args.optimizer == "sgd":
        momentum = 0.9
        for p, g, (buf,) in zip(params, grads, states):
            if g is None:
                continue
            d_p = g.add(p, alpha=wd)
            buf.mul_(momentum).add_(d_p, alpha=1.0)
            p.add_(buf, alpha=-lr)
    elif args.optimizer == "adamw":
        beta1, beta2, eps, step = 0.9, 0.999, 1e-8, 2
        bc1 = 1 - beta1 ** step
        bc2_sqrt = (1 - beta2 ** step) ** 0.5
        for p, g, (m, v) in zip(params, grads, states):
            if g is None:
                continue
            p.mul_(1 - lr * wd)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / bc2_sqrt).add_(eps)
            p.addcdiv_(m, denom, value=-lr / bc1)


# --------------------------------------------------------------------------- CLI
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="torchvision:NAME, hf:MODEL_TYPE[?key=val,...], or a short name")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=None, help="sequence length for hf: models (default 128)")
    ap.add_argument("--image-size", type=int, default=None, help="image side for torchvision models")
    ap.add_argument("--optimizer", choices=["sgd", "adamw", "none"], default="sgd")
    ap.add_argument("--lr", type=float, default=None, help="default 0.1 (sgd) / 1e-3 (adamw)")
    ap.add_argument("--weight-decay", type=float, default=None, help="default 1e-4 (sgd) / 1e-2 (adamw)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa", "default"],
                    help="attention implementation for hf: models (default eager)")
    ap.add_argument("-o", "--output", help="output JSON file (default MODEL_bBATCH.json)")
    ap.add_argument("--list-models", action="store_true", help="list short names and torchvision models")
    ap.add_argument("--summarize", metavar="FILE", help="recompute and print the summary of an existing file")
    args = ap.parse_args(argv)

    if args.summarize:
        with open(args.summarize) as f:
            g = json.load(f)
        check_graph(g)
        s = summarize(g)
        old = g.get("summary") or {}
        for k, v in s.items():
            mark = "" if old.get(k, v) == v else f"   (file says {old.get(k)})"
            print(f"{k}: {v}{mark}")
        return 0
    if args.list_models:
        for k, v in sorted(MODEL_TABLE.items()):
            print(f"{k:14s} {v}")
        try:
            import torchvision

            print("torchvision:", " ".join(sorted(torchvision.models.list_models(module=torchvision.models))))
        except ImportError:
            print("(torchvision not installed)")
        return 0
    if not args.model:
        ap.error("--model is required")
    try:
        import torch
    except ImportError:
        raise SystemExit("error: PyTorch is not installed (pip install torch torchvision [transformers])")
    args.torch_dtype = getattr(torch, args.dtype)
    if args.lr is None:
        args.lr = 0.1 if args.optimizer == "sgd" else 1e-3
    if args.weight_decay is None:
        args.weight_decay = 1e-4 if args.optimizer == "sgd" else 1e-2
    g = capture(args)
    out = args.output or f"{g['model'].replace('/', '_')}_b{args.batch}.json"
    with open(out, "w") as f:
        json.dump(g, f, separators=(",", ":"))
    s = g["summary"]
    print(f"{out}: {s['num_ops']} ops {s['num_ops_by_phase']}, {s['num_tensors']} tensors, "
          f"peak {s['peak_live_bytes']} B at op {s['peak_live_op']} ({s['peak_live_op_name']}), "
          f"saved for backward {s['saved_for_backward_bytes']} B", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
