"""Capture of one training step as an ATen-level joint graph on fake tensors.

``capture_step`` traces forward, loss, backward (``torch.autograd.grad``) and the
user's own optimizer ``step()`` with ``make_fx`` over fake tensors of the
device the model lives on, so the dispatch is that device's real one (cuDNN
batch norm on CUDA, ``native_batch_norm`` on CPU).  Private tracing APIs are
used only in this module.

Choices:

* The optimizer is traced through its own ``step()`` on the fake parameters:
  its ``param_groups`` and ``state`` are swapped for fake ones for the length
  of the trace and restored after.  ``foreach`` is resolved first as the
  optimizer would resolve it on the real parameters (fake tensors would
  otherwise make it fall back to the single-tensor path), so the captured
  update is the one eager training runs.
* Hyper-parameters (learning rate, momentum, ...) are constants of the graph;
  :func:`step_signature` records them, and the step function captures again
  when they change (e.g. under a learning-rate scheduler).
* An optimizer whose state holds a CPU scalar read with ``.item()`` (Adam's
  ``step`` unless ``capturable=True``) cannot be traced: that is a
  :class:`~outcore.errors.CaptureError` naming the fix.
* Phases are the node counts of the tracer's graph when the loss is computed
  and when the gradients are returned; modules are recorded the same way with
  forward hooks, for readable op names.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..errors import CaptureError


@dataclass
class Placeholder:
    """One graph input: what it is and the real tensor behind it."""

    role: str  # "param", "buffer", "opt_state", "input", "label"
    name: str
    tensor: torch.Tensor
    param_index: int | None = None  # params and optimizer state
    state_key: str | None = None  # optimizer state


@dataclass
class Captured:
    """A traced training step."""

    gm: torch.fx.GraphModule
    placeholders: list[Placeholder]
    #: node -> "forward" / "backward" / "optimizer"
    phase: dict[torch.fx.Node, str]
    #: node -> module path (forward nodes issued inside a module)
    module: dict[torch.fx.Node, str]
    #: the loss node, and the optimizer-state tensors the step creates:
    #: (param index, state key, output position)
    loss_node: torch.fx.Node
    new_state: list[tuple[int, str, int]] = field(default_factory=list)
    device: torch.device = torch.device("cpu")
    signature: tuple = ()
    model_name: str = "model"
    batch: int = 1


def _group_hparams(optimizer: torch.optim.Optimizer) -> tuple:
    out = []
    for g in optimizer.param_groups:
        items = []
        for k, v in sorted(g.items()):
            if k == "params":
                continue
            if isinstance(v, torch.Tensor):
                v = ("tensor", tuple(v.shape), v.dtype, float(v.detach().cpu().reshape(-1)[0]) if v.numel() else None)
            items.append((k, repr(v)))
        out.append(tuple(items))
    return tuple(out)


def _state_structure(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> tuple:
    out = []
    for p in params:
        st = optimizer.state.get(p, {})
        out.append(tuple(sorted((k, isinstance(v, torch.Tensor)) for k, v in st.items())))
    return tuple(out)


def step_signature(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Sequence[torch.Tensor]) -> tuple:
    """What a captured graph depends on besides tensor values: shapes, dtypes
    and devices of the batch, the training flag, the optimizer's
    hyper-parameters and the structure of its state."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return (
        tuple((tuple(t.shape), t.dtype, t.device) for t in batch),
        model.training,
        _group_hparams(optimizer),
        _state_structure(optimizer, params),
    )


def _resolve_foreach(optimizer: torch.optim.Optimizer) -> list[Any]:
    """Sets each group's ``foreach`` to what the optimizer resolves it to on the
    real parameters; returns the old values to restore."""
    old = []
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
    except ImportError:  # pragma: no cover - older or newer torch
        _default_to_fused_or_foreach = None
    for g in optimizer.param_groups:
        old.append(g.get("foreach", None))
        if "foreach" in g and g["foreach"] is None and _default_to_fused_or_foreach is not None:
            _, foreach = _default_to_fused_or_foreach(list(g["params"]), g.get("differentiable", False), use_fused=False)
            g["foreach"] = bool(foreach)
        if g.get("fused"):
            raise CaptureError(
                f"optimizer {type(optimizer).__name__} with fused=True: the fused kernel cannot be "
                "traced op by op; construct it with fused=False (foreach or single-tensor)"
            )
    return old


def capture_step(
    model: nn.Module,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    batch: Sequence[torch.Tensor],
) -> Captured:
    """Traces ``loss_fn(model(batch[0]), batch[1])``, its gradients and
    ``optimizer.step()`` as one ATen graph on fake tensors."""
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

    if len(batch) != 2 or not all(isinstance(t, torch.Tensor) for t in batch):
        raise CaptureError(
            f"example batch: expected (inputs, targets), two tensors; got {type(batch).__name__} "
            f"of {len(batch) if hasattr(batch, '__len__') else '?'} items"
        )
    x, y = batch
    named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    named_buffers = list(model.named_buffers())
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    by_id = {id(p): i for i, (_, p) in enumerate(named_params)}
    for p in opt_params:
        if id(p) not in by_id:
            raise CaptureError(
                "the optimizer holds a tensor that is not a trainable parameter of the model; "
                "build the optimizer from model.parameters()"
            )
    devices = {p.device for _, p in named_params} | {x.device, y.device}
    if len(devices) != 1:
        raise CaptureError(f"parameters and batch must be on one device; found {sorted(map(str, devices))}")
    device = devices.pop()

    placeholders: list[Placeholder] = []
    for i, (n, p) in enumerate(named_params):
        placeholders.append(Placeholder("param", n, p, param_index=i))
    for n, b in named_buffers:
        placeholders.append(Placeholder("buffer", n, b))
    for i, (n, p) in enumerate(named_params):
        for k, v in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(v, torch.Tensor):
                if v.device != p.device:
                    raise CaptureError(
                        f"optimizer state `{n}.{k}` is on {v.device}, its parameter on {p.device}: "
                        f"{type(optimizer).__name__} reads it with .item(), which cannot be traced; "
                        "for Adam/AdamW pass capturable=True (CUDA), or use SGD"
                    )
                placeholders.append(Placeholder("opt_state", f"{n}.{k}", v, param_index=i, state_key=k))
    placeholders.append(Placeholder("input", "input", x))
    placeholders.append(Placeholder("label", "label", y))

    pnames = [n for n, _ in named_params]
    bnames = [n for n, _ in named_buffers]
    marks: dict[str, int] = {}
    module_marks: list[tuple[int, str, bool]] = []
    names = {m: (n or "<root>") for n, m in model.named_modules()}
    handles = []

    def pre(mod, _inp):
        mode = get_proxy_mode()
        if mode is not None:
            module_marks.append((len(mode.tracer.graph.nodes), names.get(mod, "?"), True))

    def post(mod, _inp, _out):
        mode = get_proxy_mode()
        if mode is not None:
            module_marks.append((len(mode.tracer.graph.nodes), names.get(mod, "?"), False))

    for m in names:
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))

    n_params = len(named_params)
    n_buffers = len(named_buffers)
    state_slots = [(ph.param_index, ph.state_key) for ph in placeholders if ph.role == "opt_state"]
    new_state: list[tuple[int, str, int]] = []

    def step(*flat):
        params = list(flat[:n_params])
        buffers = list(flat[n_params : n_params + n_buffers])
        states = list(flat[n_params + n_buffers : n_params + n_buffers + len(state_slots)])
        xx, yy = flat[-2], flat[-1]
        mode = get_proxy_mode()
        out = functional_call(
            model, {**dict(zip(pnames, params)), **dict(zip(bnames, buffers))}, (xx,), strict=False
        )
        loss = loss_fn(out, yy)
        marks["forward_end"] = len(mode.tracer.graph.nodes)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        marks["backward_end"] = len(mode.tracer.graph.nodes)
        fake_of = {id(real): fake for (_, real), fake in zip(named_params, params)}
        saved_groups = [g["params"] for g in optimizer.param_groups]
        saved_state = optimizer.state
        fake_state: dict = defaultdict(dict)
        for (pi, key), s in zip(state_slots, states):
            fake_state[params[pi]][key] = s
        for (_, real), fake in zip(named_params, params):
            for k, v in saved_state.get(real, {}).items():
                if not isinstance(v, torch.Tensor):
                    fake_state[fake][k] = v
        old_foreach = _resolve_foreach(optimizer)
        try:
            with torch.no_grad():
                for g in optimizer.param_groups:
                    g["params"] = [fake_of[id(p)] for p in g["params"]]
                for p, gr in zip(params, grads):
                    p.grad = gr
                optimizer.state = fake_state
                optimizer.step()
        finally:
            for g, ps, fe in zip(optimizer.param_groups, saved_groups, old_foreach):
                g["params"] = ps
                if "foreach" in g:
                    g["foreach"] = fe
            optimizer.state = saved_state
            for p in params:
                p.grad = None
        # State the step created (e.g. SGD's momentum buffers on the first step).
        extra = []
        for pi, p in enumerate(params):
            for k, v in sorted(fake_state.get(p, {}).items()):
                if isinstance(v, torch.Tensor) and (pi, k) not in state_slots:
                    new_state.append((pi, k, 1 + len(extra)))
                    extra.append(v)
        return (loss, *extra)

    flat_inputs = [ph.tensor for ph in placeholders]
    trace_inputs = []
    for ph in placeholders:
        t = ph.tensor.detach()
        if ph.role == "param":
            t = t.requires_grad_(True)
        trace_inputs.append(t)
    try:
        gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=False)(*trace_inputs)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - every tracing failure is reported the same way
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(
            f"cannot capture the training step of {type(model).__name__} with "
            f"{type(optimizer).__name__}: {type(e).__name__}: {msg}. outcore.torch traces the step "
            "with make_fx on fake tensors: data-dependent Python control flow (.item(), "
            "printing tensor values) and optimizers that read CPU scalars (Adam without "
            "capturable=True) cannot be traced"
        ) from e
    finally:
        for h in handles:
            h.remove()
    del flat_inputs

    nodes = list(gm.graph.nodes)
    phase: dict[torch.fx.Node, str] = {}
    for i, n in enumerate(nodes):
        if i < marks.get("forward_end", 0):
            phase[n] = "forward"
        elif i < marks.get("backward_end", 0):
            phase[n] = "backward"
        else:
            phase[n] = "optimizer"
    module: dict[torch.fx.Node, str] = {}
    stack: list[str] = []
    mi = 0
    for i, n in enumerate(nodes):
        while mi < len(module_marks) and module_marks[mi][0] <= i:
            _, name, enter = module_marks[mi]
            if enter:
                stack.append(name)
            elif stack:
                stack.pop()
            mi += 1
        if stack and phase[n] == "forward":
            module[n] = stack[-1]
    output = nodes[-1]
    outs = output.args[0]
    loss_node = outs[0]
    return Captured(
        gm=gm,
        placeholders=placeholders,
        phase=phase,
        module=module,
        loss_node=loss_node,
        new_state=new_state,
        device=device,
        signature=step_signature(model, optimizer, batch),
        model_name=type(model).__name__,
        batch=int(x.shape[0]) if x.dim() > 0 else 1,
    )
