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
    return _capture(model, loss_fn, optimizer, batch, {}, None)


def capture_steady_step(
    model: nn.Module,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    batch: Sequence[torch.Tensor],
    first: Captured,
) -> Captured | None:
    """The step once the optimizer holds the state that ``first`` creates
    (``first.new_state``: SGD's momentum, Adam's moments), traced now with
    that state as fake tensors of the shapes, strides and dtypes ``first``
    gives them: the graph the next call captures from the real state, made
    before any training so that its plan can be checked.  ``None`` where
    ``first`` creates no state.  Its opt-state placeholders hold fake
    tensors: it is for planning, not for generating code."""
    if not first.new_state:
        return None
    from torch._subclasses.fake_tensor import FakeTensorMode

    outs = [n for n in first.gm.graph.nodes if n.op == "output"][0].args[0]
    mode = FakeTensorMode()
    extra: dict[tuple[int, str], torch.Tensor] = {}
    for pi, key, pos in first.new_state:
        val = outs[pos].meta["val"]
        with mode:
            extra[(pi, key)] = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                                                   device=val.device)
    return _capture(model, loss_fn, optimizer, batch, extra, mode)


def _capture(
    model: nn.Module,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    batch: Sequence[torch.Tensor],
    extra_state: dict[tuple[int, str], torch.Tensor],
    fake_mode: Any,
) -> Captured:
    """:func:`capture_step`, with ``extra_state`` (param index, key) ->
    tensor as optimizer state beside the optimizer's own, traced under
    ``fake_mode`` (the mode those tensors are fake in) where given."""
    x, y = _check_batch(batch)
    named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    named_buffers = list(model.named_buffers())
    device = _one_device(named_params, optimizer, x, y)
    placeholders = _placeholders(named_params, named_buffers, optimizer, x, y, extra_state)
    step = _StepFunction(model, loss_fn, optimizer, named_params, named_buffers, placeholders)
    marks = _ModuleMarks(model)
    try:
        gm = _trace(step, placeholders, model, optimizer, fake_mode)
    finally:
        marks.remove()
    nodes = list(gm.graph.nodes)
    phase = _phases(nodes, step.marks)
    outs = nodes[-1].args[0]
    return Captured(
        gm=gm,
        placeholders=placeholders,
        phase=phase,
        module=marks.modules_of(nodes, phase),
        loss_node=outs[0],
        new_state=step.new_state,
        device=device,
        signature=step_signature(model, optimizer, batch),
        model_name=type(model).__name__,
        batch=int(x.shape[0]) if x.dim() > 0 else 1,
    )


def _check_batch(batch: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The example batch as ``(inputs, targets)``, or a CaptureError naming
    what it is instead."""
    if len(batch) != 2 or not all(isinstance(t, torch.Tensor) for t in batch):
        raise CaptureError(
            f"example batch: expected (inputs, targets), two tensors; got {type(batch).__name__} "
            f"of {len(batch) if hasattr(batch, '__len__') else '?'} items"
        )
    x, y = batch
    return x, y


def _one_device(
    named_params: list[tuple[str, nn.Parameter]],
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.device:
    """The one device of the parameters and the batch; a CaptureError where
    the optimizer holds a tensor that is not a trainable parameter, or where
    they are on several devices."""
    by_id = {id(p) for _, p in named_params}
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in by_id:
                raise CaptureError(
                    "the optimizer holds a tensor that is not a trainable parameter of the model; "
                    "build the optimizer from model.parameters()"
                )
    devices = {p.device for _, p in named_params} | {x.device, y.device}
    if len(devices) != 1:
        raise CaptureError(f"parameters and batch must be on one device; found {sorted(map(str, devices))}")
    return devices.pop()


def _placeholders(
    named_params: list[tuple[str, nn.Parameter]],
    named_buffers: list[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    extra_state: dict[tuple[int, str], torch.Tensor],
) -> list[Placeholder]:
    """The graph's inputs in the traced function's order: parameters,
    buffers, the optimizer's tensor state (per parameter, by key; with
    ``extra_state`` beside it), the inputs and the labels. State on another
    device than its parameter is a CaptureError naming the fix."""
    placeholders: list[Placeholder] = []
    for i, (n, p) in enumerate(named_params):
        placeholders.append(Placeholder("param", n, p, param_index=i))
    for n, b in named_buffers:
        placeholders.append(Placeholder("buffer", n, b))
    for i, (n, p) in enumerate(named_params):
        state = dict(optimizer.state.get(p, {}))
        state.update({k: v for (pi, k), v in extra_state.items() if pi == i})
        for k, v in sorted(state.items()):
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
    return placeholders


class _ModuleMarks:
    """Forward hooks on every module that record, while tracing, the
    tracer's node count where each module's forward starts and ends, so that
    forward nodes can be named by the innermost module that issued them."""

    def __init__(self, model: nn.Module):
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        self._get_proxy_mode = get_proxy_mode
        #: (node count, module path, entering)
        self.marks: list[tuple[int, str, bool]] = []
        self._names = {m: (n or "<root>") for n, m in model.named_modules()}
        self._handles = []
        for m in self._names:
            self._handles.append(m.register_forward_pre_hook(self._pre))
            self._handles.append(m.register_forward_hook(self._post, always_call=True))

    def _mark(self, mod: nn.Module, entering: bool) -> None:
        mode = self._get_proxy_mode()
        if mode is not None:
            self.marks.append((len(mode.tracer.graph.nodes), self._names.get(mod, "?"), entering))

    def _pre(self, mod, _inp):
        self._mark(mod, True)

    def _post(self, mod, _inp, _out):
        self._mark(mod, False)

    def remove(self) -> None:
        """Removes the hooks."""
        for h in self._handles:
            h.remove()

    def modules_of(self, nodes: list[torch.fx.Node], phase: dict[torch.fx.Node, str]) -> dict[torch.fx.Node, str]:
        """Each forward node's innermost module path (nodes issued outside
        every module have none)."""
        module: dict[torch.fx.Node, str] = {}
        stack: list[str] = []
        mi = 0
        for i, n in enumerate(nodes):
            while mi < len(self.marks) and self.marks[mi][0] <= i:
                _, name, enter = self.marks[mi]
                if enter:
                    stack.append(name)
                elif stack:
                    stack.pop()
                mi += 1
            if stack and phase[n] == "forward":
                module[n] = stack[-1]
        return module


class _StepFunction:
    """The function ``make_fx`` traces: the flat placeholders in, the model's
    forward and loss, ``torch.autograd.grad``, and the user's optimizer
    stepping the fake parameters (its ``param_groups`` and ``state`` swapped
    for fake ones for the call and restored after); returns the loss and the
    tensor state the step created. Records the phase marks (node counts at
    the loss and after the gradients) and the created state."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        named_params: list[tuple[str, nn.Parameter]],
        named_buffers: list[tuple[str, torch.Tensor]],
        placeholders: list[Placeholder],
    ):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.named_params = named_params
        self.pnames = [n for n, _ in named_params]
        self.bnames = [n for n, _ in named_buffers]
        self.state_slots = [(ph.param_index, ph.state_key) for ph in placeholders if ph.role == "opt_state"]
        #: node counts: "forward_end", "backward_end"
        self.marks: dict[str, int] = {}
        #: (param index, state key, output position) of state the step created
        self.new_state: list[tuple[int, str, int]] = []

    def __call__(self, *flat):
        from torch.func import functional_call
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        n_params, n_buffers = len(self.pnames), len(self.bnames)
        params = list(flat[:n_params])
        buffers = list(flat[n_params : n_params + n_buffers])
        states = list(flat[n_params + n_buffers : n_params + n_buffers + len(self.state_slots)])
        xx, yy = flat[-2], flat[-1]
        mode = get_proxy_mode()
        out = functional_call(
            self.model, {**dict(zip(self.pnames, params)), **dict(zip(self.bnames, buffers))}, (xx,), strict=False
        )
        loss = self.loss_fn(out, yy)
        self.marks["forward_end"] = len(mode.tracer.graph.nodes)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        self.marks["backward_end"] = len(mode.tracer.graph.nodes)
        fake_state = self._step_optimizer(params, grads, states)
        # State the step created (e.g. SGD's momentum buffers on the first step).
        extra = []
        for pi, p in enumerate(params):
            for k, v in sorted(fake_state.get(p, {}).items()):
                if isinstance(v, torch.Tensor) and (pi, k) not in self.state_slots:
                    self.new_state.append((pi, k, 1 + len(extra)))
                    extra.append(v)
        return (loss, *extra)

    def _step_optimizer(self, params: list, grads: tuple, states: list) -> dict:
        """The user's ``optimizer.step()`` on the fake parameters, gradients
        and state; returns the fake state it leaves."""
        optimizer = self.optimizer
        fake_of = {id(real): fake for (_, real), fake in zip(self.named_params, params)}
        saved_groups = [g["params"] for g in optimizer.param_groups]
        saved_state = optimizer.state
        fake_state: dict = defaultdict(dict)
        for (pi, key), s in zip(self.state_slots, states):
            fake_state[params[pi]][key] = s
        for (_, real), fake in zip(self.named_params, params):
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
        return fake_state


def _trace(
    step: _StepFunction,
    placeholders: list[Placeholder],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    fake_mode: Any = None,
) -> torch.fx.GraphModule:
    """``make_fx`` of the step on fake copies of the placeholders
    (parameters requiring gradients), made in ``fake_mode`` where given (the
    mode of placeholders that are fake already); any tracing failure is a
    CaptureError naming the model, the optimizer and what cannot be traced."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    trace_inputs = []
    for ph in placeholders:
        t = ph.tensor.detach()
        if fake_mode is not None and not isinstance(t, FakeTensor):
            t = fake_mode.from_tensor(t)
        if ph.role == "param":
            t = t.requires_grad_(True)
        trace_inputs.append(t)
    try:
        # A plain function, as make_fx expects, around the step object.
        def run(*flat):
            return step(*flat)

        return make_fx(run, tracing_mode="fake", _allow_non_fake_inputs=False)(*trace_inputs)
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


def _phases(nodes: list[torch.fx.Node], marks: dict[str, int]) -> dict[torch.fx.Node, str]:
    """Each node's phase by the node counts the step recorded: forward up to
    the loss, backward up to the gradients, optimizer after."""
    phase: dict[torch.fx.Node, str] = {}
    for i, n in enumerate(nodes):
        if i < marks.get("forward_end", 0):
            phase[n] = "forward"
        elif i < marks.get("backward_end", 0):
            phase[n] = "backward"
        else:
            phase[n] = "optimizer"
    return phase
