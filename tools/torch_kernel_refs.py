#!/usr/bin/env python3
"""PyTorch's results for the CPU executor's real kernels: the reference that
`crates/exec/tests/torch_reference.rs` holds every kernel to.

Why: the kernels' own tests check each backward against finite differences
of its forward, which cannot tell a kernel that computes the wrong function
consistently (GELU's tanh approximation where PyTorch's `nn.GELU()` is the
exact erf form, a biased running variance, AdamW's decay added to the
gradient). Here each op kind the executor runs for real is computed by
PyTorch on small seeded inputs, forward and backward (and the optimizer
updates over three steps), and written with its inputs to
`crates/exec/tests/data/torch_kernel_refs.json`. The Rust test runs the
kernels on the same inputs, so `cargo test` needs no PyTorch;
`python/tests/test_kernel_refs.py` recomputes every case from the stored
inputs with the installed PyTorch, so the file cannot drift from PyTorch
unnoticed.

Regenerate (after adding a case; the inputs are seeded):
    python3 tools/torch_kernel_refs.py --out crates/exec/tests/data/torch_kernel_refs.json

Not covered, on purpose: dropout (its mask comes from outcore's own
counter-based generator, so that a recomputation draws the same mask; it
cannot equal PyTorch's), `Concat`'s and `View`'s gradients (the builder
splits or reshapes the gradient with other ops), and `Fill`.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys

import torch
import torch.nn.functional as F

FORMAT = "outcore-torch-kernel-refs/1"


def _short(v: float) -> float:
    """The shortest decimal that reads back as the same f32 (`v` is one)."""
    exact = struct.pack("<f", v)
    for digits in range(6, 10):
        short = float(f"{v:.{digits}g}")
        if struct.pack("<f", short) == exact:
            return short
    return v


def _t(x: torch.Tensor) -> dict:
    """A tensor as the file stores it: shape, dtype and flat values."""
    x = x.detach().contiguous()
    if x.dtype == torch.float32:
        data = [_short(v) for v in x.reshape(-1).tolist()]
        dtype = "float32"
    elif x.dtype == torch.int64:
        data = [int(v) for v in x.reshape(-1).tolist()]
        dtype = "int64"
    else:
        raise ValueError(f"dtype {x.dtype} is not stored")
    return {"shape": list(x.shape), "dtype": dtype, "data": data}


def _from(d: dict) -> torch.Tensor:
    """The tensor [`_t`] stored."""
    dtype = {"float32": torch.float32, "int64": torch.int64}[d["dtype"]]
    return torch.tensor(d["data"], dtype=dtype).reshape(d["shape"])


def _grads(outputs, inputs, grad_output, wanted):
    """The gradient of `sum(outputs[0] * grad_output)` for each input in
    `wanted` (None elsewhere)."""
    leaves = [x for x, w in zip(inputs, wanted) if w]
    got = torch.autograd.grad(outputs[0], leaves, grad_output)
    it = iter(got)
    return [next(it) if w else None for w in wanted]


def _forward(kind: str, attrs: dict, xs: list[torch.Tensor], step: int):
    """PyTorch's outputs of one op, in the op's output order."""
    a = attrs
    if kind == "linear":
        return [F.linear(xs[0], xs[1], xs[2] if a["bias"] else None)]
    if kind == "matmul":
        b = xs[1].transpose(-1, -2) if a["transpose_b"] else xs[1]
        return [a["scale"] * torch.matmul(xs[0], b)]
    if kind == "embedding":
        return [F.embedding(xs[0], xs[1])]
    if kind == "conv2d":
        return [
            F.conv2d(
                xs[0],
                xs[1],
                xs[2] if a["bias"] else None,
                stride=a["stride"],
                padding=a["padding"],
                dilation=a["dilation"],
                groups=a["groups"],
            )
        ]
    if kind == "max_pool2d":
        y, idx = F.max_pool2d(
            xs[0], a["kernel"], a["stride"], a["padding"], return_indices=True
        )
        return [y, idx]
    if kind == "avg_pool2d":
        return [F.avg_pool2d(xs[0], a["kernel"], a["stride"], a["padding"], count_include_pad=True)]
    if kind == "global_avg_pool":
        return [xs[0].mean(dim=(2, 3), keepdim=True)]
    unary = {
        "relu": torch.relu,
        "relu6": F.relu6,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "gelu": F.gelu,  # nn.GELU()'s default: the exact erf form
        "silu": F.silu,
        "softmax": lambda x: torch.softmax(x, dim=-1),
    }
    if kind in unary:
        return [unary[kind](xs[0])]
    if kind == "scale":
        return [xs[0] * a["factor"]]
    if kind == "add_scalar":
        return [xs[0] + a["value"]]
    if kind == "pow_scalar":
        return [xs[0].pow(a["exponent"])]
    if kind == "add":
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return [out]
    if kind == "mul":
        return [xs[0] * xs[1]]
    if kind == "concat":
        return [torch.cat(xs, dim=a["axis"])]
    if kind == "batch_norm":
        y, mean, invstd = torch.native_batch_norm(
            xs[0], xs[1], xs[2], None, None, True, 0.1, a["eps"]
        )
        return [y, mean, invstd]
    if kind == "batch_norm_stats":
        return _batch_norm_stats(a, xs)
    if kind == "layer_norm":
        y, mean, rstd = torch.native_layer_norm(xs[0], [xs[0].shape[-1]], xs[1], xs[2], a["eps"])
        return [y, mean, rstd]
    if kind == "softmax_cross_entropy":
        return [F.cross_entropy(xs[0], xs[1]), torch.log_softmax(xs[0], dim=-1)]
    if kind in ("sgd", "adam"):
        return _optimizer_step(kind, a, xs, step)
    raise ValueError(f"unknown kind {kind}")


def _batch_norm_stats(a: dict, xs: list[torch.Tensor]):
    """The running statistics after one training batch of `count` elements
    per channel whose batch mean and inverse std are `xs[2]`, `xs[3]`:
    PyTorch's update, `(1 - m) r + m stat`, with the unbiased variance."""
    rm, rv, mean, invstd = xs
    n = a["count"]
    m = a["momentum"]
    var = 1.0 / (invstd.double() ** 2)
    unbiased = var * n / (n - 1)
    return [
        ((1 - m) * rm.double() + m * mean.double()).float(),
        ((1 - m) * rv.double() + m * unbiased).float(),
    ]


def _optimizer_step(kind: str, a: dict, xs: list[torch.Tensor], step: int):
    """One step of `torch.optim.SGD` / `Adam` / `AdamW` at the 1-based
    `step` from the given state: inputs `p, g (, buffer)` / `p, g, m, v`."""
    p = torch.nn.Parameter(xs[0].clone())
    p.grad = xs[1].clone()
    if kind == "sgd":
        opt = torch.optim.SGD(
            [p], lr=a["lr"], momentum=a["momentum"], weight_decay=a["weight_decay"], foreach=False
        )
        if a["momentum"] > 0:
            opt.state[p]["momentum_buffer"] = xs[2].clone()
        opt.step()
        out = [p.detach().clone()]
        if a["momentum"] > 0:
            out.append(opt.state[p]["momentum_buffer"].clone())
        return out
    cls = torch.optim.AdamW if a["decoupled"] else torch.optim.Adam
    opt = cls(
        [p],
        lr=a["lr"],
        betas=(a["beta1"], a["beta2"]),
        eps=a["eps"],
        weight_decay=a["weight_decay"],
        foreach=False,
    )
    opt.state[p]["step"] = torch.tensor(float(step - 1))
    opt.state[p]["exp_avg"] = xs[2].clone()
    opt.state[p]["exp_avg_sq"] = xs[3].clone()
    opt.step()
    st = opt.state[p]
    return [p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone()]


def reference(case: dict):
    """PyTorch's outputs and input gradients for a stored case, from its
    stored inputs: `(outputs, grads)`, grads `None` where not asked for."""
    xs = [_from(d) for d in case["inputs"]]
    wanted = [g is not None for g in case.get("grads", [None] * len(xs))]
    for x, w in zip(xs, wanted):
        if w:
            x.requires_grad_(True)
    outputs = _forward(case["kind"], case["attrs"], xs, case.get("step", 1))
    grads = None
    if case.get("grad_output") is not None:
        grads = _grads(outputs, xs, _from(case["grad_output"]), wanted)
    return [o.detach() for o in outputs], grads


def _randn(gen, *shape, scale=1.0):
    return torch.randn(tuple(shape), generator=gen) * scale


def _specs(gen):
    """Every case: `(name, kind, attrs, inputs, grads_for, step)`."""
    r = lambda *s, scale=1.0: _randn(gen, *s, scale=scale)  # noqa: E731
    conv = lambda k, s, p, d, g, b: {  # noqa: E731
        "kernel": [k, k],
        "stride": [s, s],
        "padding": [p, p],
        "dilation": [d, d],
        "groups": g,
        "bias": b,
    }
    pool = {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}
    wide = r(96, scale=3.0)
    specs = [
        ("linear", "linear", {"bias": True}, [r(4, 6), r(5, 6), r(5)], [1, 1, 1]),
        ("linear without bias", "linear", {"bias": False}, [r(4, 6), r(5, 6)], [1, 1]),
        (
            "matmul, b transposed and scaled, per batch element",
            "matmul",
            {"transpose_b": True, "scale": 0.125},
            [r(2, 3, 4), r(2, 5, 4)],
            [1, 1],
        ),
        (
            "matmul, one b for the batch",
            "matmul",
            {"transpose_b": False, "scale": 1.0},
            [r(2, 3, 4), r(4, 5)],
            [1, 1],
        ),
        (
            "embedding",
            "embedding",
            {},
            [torch.tensor([[1, 5, 1], [0, 6, 3]]), r(7, 4)],
            [0, 1],
        ),
        (
            "conv2d 3x3 stride 2 padding 1 with bias",
            "conv2d",
            conv(3, 2, 1, 1, 1, True),
            [r(2, 4, 7, 6), r(6, 4, 3, 3), r(6)],
            [1, 1, 1],
        ),
        (
            "conv2d depthwise 3x3",
            "conv2d",
            conv(3, 1, 1, 1, 4, False),
            [r(2, 4, 5, 5), r(4, 1, 3, 3)],
            [1, 1],
        ),
        (
            "conv2d dilated, two groups",
            "conv2d",
            conv(3, 1, 2, 2, 2, False),
            [r(1, 4, 6, 6), r(4, 2, 3, 3)],
            [1, 1],
        ),
        ("max_pool2d 3x3 stride 2 padding 1", "max_pool2d", pool, [r(2, 3, 7, 7)], [1]),
        ("avg_pool2d 3x3 stride 2 padding 1", "avg_pool2d", pool, [r(2, 3, 7, 7)], [1]),
        ("global_avg_pool", "global_avg_pool", {}, [r(2, 3, 4, 5)], [1]),
    ]
    for kind in ["relu", "relu6", "tanh", "sigmoid", "gelu", "silu"]:
        x = wide.clone()
        if kind == "relu6":
            x = x * 2.5  # reach past 6
        specs.append((kind, kind, {}, [x], [1]))
    specs += [
        ("softmax", "softmax", {}, [r(3, 7, scale=2.0)], [1]),
        ("scale", "scale", {"factor": 0.3}, [r(10)], [1]),
        ("add_scalar", "add_scalar", {"value": 1.5}, [r(10)], None),
        ("pow_scalar", "pow_scalar", {"exponent": 3.0}, [r(10)], [1]),
        ("add of three", "add", {}, [r(2, 5), r(2, 5), r(2, 5)], None),
        ("mul, broadcast over h w", "mul", {}, [r(2, 3, 2, 2), r(2, 3, 1, 1)], [1, 1]),
        ("mul, same shapes", "mul", {}, [r(6), r(6)], [1, 1]),
        ("concat on channels", "concat", {"axis": 1}, [r(2, 3, 2), r(2, 1, 2)], None),
        (
            "batch_norm",
            "batch_norm",
            {"eps": 1e-5},
            [r(4, 3, 5, 5, scale=2.0) + 0.5, r(3), r(3)],
            [1, 1, 1],
        ),
        (
            "layer_norm",
            "layer_norm",
            {"eps": 1e-5},
            [r(3, 8, scale=2.0) + 0.5, r(8), r(8)],
            [1, 1, 1],
        ),
        (
            "softmax_cross_entropy",
            "softmax_cross_entropy",
            {},
            [r(5, 7, scale=2.0), torch.tensor([0, 6, 3, 3, 1])],
            [1, 0],
        ),
    ]
    x = r(4, 3, 5, 5, scale=2.0) + 0.5
    _, mean, invstd = torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    specs.append(
        (
            "batch_norm_stats",
            "batch_norm_stats",
            {"momentum": 0.1, "count": 100},
            [r(3), r(3).abs() + 0.5, mean, invstd],
            None,
        )
    )
    return specs


def _optimizer_specs(gen):
    """Three consecutive steps of each optimizer, each step's inputs the
    previous step's PyTorch outputs: `(name, kind, attrs, inputs, step)`."""
    sgd = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
    plain = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
    adam = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    out = []
    for label, kind, attrs in [
        ("sgd with momentum and weight decay", "sgd", sgd),
        ("sgd", "sgd", plain),
        ("adam with L2 weight decay", "adam", {**adam, "decoupled": False}),
        ("adamw", "adam", {**adam, "decoupled": True}),
    ]:
        p = _randn(gen, 12)
        state = []
        if kind == "sgd" and attrs["momentum"] > 0:
            state = [torch.zeros(12)]
        if kind == "adam":
            state = [torch.zeros(12), torch.zeros(12)]
        for step in (1, 2, 3):
            g = _randn(gen, 12)
            inputs = [p, g, *state]
            out.append((f"{label}, step {step}", kind, attrs, inputs, step))
            after = _optimizer_step(kind, attrs, inputs, step)
            p, state = after[0], after[1:]
    return out


def generate(seed: int = 0) -> dict:
    """Every case with PyTorch's results, inputs drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for name, kind, attrs, inputs, grads_for in _specs(gen):
        case = {"name": name, "kind": kind, "attrs": attrs, "step": 1}
        case["inputs"] = [_t(x) for x in inputs]
        if grads_for is not None:
            # The gradient of the first output: seeded values of its shape.
            y = _forward(kind, attrs, list(inputs), 1)[0]
            case["grad_output"] = _t(_randn(gen, *y.shape))
            case["grads"] = [{} if w else None for w in grads_for]
        outputs, grads = reference(case)
        case["outputs"] = [_t(o) for o in outputs]
        if grads is not None:
            case["grads"] = [None if g is None else _t(g) for g in grads]
        cases.append(case)
    for name, kind, attrs, inputs, step in _optimizer_specs(gen):
        case = {"name": name, "kind": kind, "attrs": attrs, "step": step}
        case["inputs"] = [_t(x) for x in inputs]
        outputs, _ = reference(case)
        case["outputs"] = [_t(o) for o in outputs]
        cases.append(case)
    return {
        "format": FORMAT,
        "generator": f"tools/torch_kernel_refs.py --seed {seed}",
        "torch": torch.__version__,
        "cases": cases,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--seed", type=int, default=0, help="the inputs' seed (default 0)")
    args = ap.parse_args(argv)
    doc = generate(args.seed)
    # One case per line: diffs stay readable.
    lines = [json.dumps(c, separators=(",", ":")) for c in doc["cases"]]
    head = {k: v for k, v in doc.items() if k != "cases"}
    text = json.dumps(head)[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n"
    json.loads(text)  # well-formed
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {len(doc['cases'])} cases, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
