"""outcore.torch: the generated code trains torchvision's ResNet-18 and a
GPT-2-style transformer for 3 steps under plans that swap and recompute, bit
for bit like eager training; bad input raises before anything is changed.

On CPU tensors (the default, and CI) the stream operations are no-ops.  With
``OUTCORE_TEST_DEVICE=cuda`` the same tests run on the GPU with deterministic
algorithms (set ``CUBLAS_WORKSPACE_CONFIG=:4096:8``): real streams, events and
pinned host buffers."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
from typing import Any

import pytest
import torch
from torch import nn

import outcore
import outcore.torch as ot

torchvision = pytest.importorskip("torchvision")
from models import TinyGPT, lm_loss  # noqa: E402

DEVICE = torch.device(os.environ.get("OUTCORE_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda":
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _slow_link_device(tmp_path) -> str:
    """A V100 profile with a 20x slower host link: copies no longer hide behind
    compute, so planners mix recomputation with swapping."""
    d = outcore.device_profile("v100-16gb-pcie3")
    d["name"] = "v100-slow-link"
    for k in ("h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_bytes_per_s"):
        d[k] = d[k] / 20
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(d))
    return str(path)


def _steady_footprint(model, loss_fn, make_opt, batch) -> int:
    """Bytes of the step once the optimizer has its state (planned with none)."""
    m = copy.deepcopy(model).to(DEVICE)
    batch = [t.to(DEVICE) for t in batch]
    o = make_opt(m)
    o.zero_grad()
    loss_fn(m(batch[0]), batch[1]).backward()
    o.step()
    s = ot.compile_step(m, loss_fn, o, [t.clone() for t in batch], budget="100%", planner="none", allocator="perfect",
                           headroom=0.0)
    return s.compiled.graph.footprint_bytes + s.compiled.converted.pinned_bytes


def _train_both(make_model, loss_fn, make_opt, batches, **compile_kw):
    torch.manual_seed(1)
    eager = make_model().to(DEVICE)
    ours = copy.deepcopy(eager)
    batches = [(x.to(DEVICE), y.to(DEVICE)) for x, y in batches]
    opt_e, opt_o = make_opt(eager), make_opt(ours)
    # the budgets are fractions of the footprint chosen to force swaps and
    # recomputations; CUDA's default headroom (12%) would plan below them
    compile_kw.setdefault("headroom", 0.0)
    step = ot.compile_step(ours, loss_fn, opt_o, [t.clone() for t in batches[0]], **compile_kw)
    losses = []
    for i, (x, y) in enumerate(batches):
        torch.manual_seed(100 + i)  # dropout draws the same numbers in both
        opt_e.zero_grad()
        le = loss_fn(eager(x), y)
        le.backward()
        opt_e.step()
        torch.manual_seed(100 + i)
        lo = step(x.clone(), y.clone())
        losses.append((le.detach(), lo))
    step.materialize()
    return eager, ours, opt_e, opt_o, step, losses


def _assert_identical(eager, ours, opt_e, opt_o, losses):
    for le, lo in losses:
        assert torch.equal(le, lo), (le.item(), lo.item())
    for (n, a), (_, b) in zip(eager.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b), n
    pe = [p for g in opt_e.param_groups for p in g["params"]]
    po = [p for g in opt_o.param_groups for p in g["params"]]
    for a, b in zip(pe, po):
        sa, sb = opt_e.state[a], opt_o.state[b]
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


def _sgd(m):
    # foreach=False: one update op per parameter, which planners can place
    # one by one (the CUDA default, foreach, merges every update into one op)
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4, foreach=False)


def _resnet18_case(n_batches: int, batch: int, side: int):
    """torchvision's ResNet-18 (10 classes): its maker, cross-entropy, seeded
    batches and its steady step's footprint."""
    def make():
        return torchvision.models.resnet18(num_classes=10)

    torch.manual_seed(0)
    batches = [(torch.randn(batch, 3, side, side), torch.randint(0, 10, (batch,))) for _ in range(n_batches)]
    loss_fn = nn.functional.cross_entropy
    torch.manual_seed(1)
    return make, loss_fn, batches, _steady_footprint(make(), loss_fn, _sgd, batches[0])


@pytest.mark.parametrize("issue_order", ["early", "timeline"])
def test_resnet18_three_steps_with_swaps_and_recomputation_match_eager(tmp_path, issue_order):
    make, loss_fn, batches, footprint = _resnet18_case(3, 16, 64)
    run = _train_both(make, loss_fn, _sgd, batches, budget=int(0.97 * footprint), planner="superneurons",
                      allocator="perfect", device_profile=_slow_link_device(tmp_path), issue_order=issue_order)
    eager, ours, opt_e, opt_o, step, losses = run
    assert (step.compiled.timeline is not None) == (issue_order == "timeline")
    gen = step.compiled.generated
    assert gen.n_recomputes > 0 and gen.n_swap_outs > 0 and gen.n_swap_ins > 0
    assert step.plan_result.report.peak_live_bytes <= step.compiled.planner_budget_bytes
    _assert_identical(eager, ours, opt_e, opt_o, losses)


def test_a_step_that_fails_midway_leaves_the_model_whole(tmp_path):
    """An error inside the generated step (an out-of-memory on a GPU; here a
    swap-in made to fail) after the plan released parameters' device storage:
    every parameter and optimizer state is whole again with the value it had
    (buffers the forward updated before the failure keep the update, as in
    eager training), and the next step trains under the plan again."""
    make, loss_fn, batches, footprint = _resnet18_case(3, 8, 32)
    # two steps as planned (the second with SGD's momentum: the steady plan,
    # which keeps some parameters on the host between steps); the buffers
    # updated before the failure below follow the issue order, here "early"
    eager, ours, opt_e, opt_o, step, _ = _train_both(make, loss_fn, _sgd, batches[:2], budget=int(0.5 * footprint),
                                                     planner="window", allocator="perfect", issue_order="early")
    c = step.compiled
    assert c.generated.n_swap_ins > 0
    before = _snapshot(ours, opt_o)
    real = c.fn.__globals__["_si"]
    emptied: list[str] = []

    def failing(*args):
        # fail at the first swap-in made while the device storage of some
        # parameter or optimizer state is released (kept on the host there)
        emptied.extend(ph.name for ph in c.captured.placeholders
                       if ph.role not in ("input", "label") and ph.tensor.untyped_storage().nbytes() == 0)
        if emptied:
            raise RuntimeError("injected: CUDA out of memory")
        return real(*args)

    c.fn.__globals__["_si"] = failing
    x, y = (t.to(DEVICE) for t in batches[2])
    with pytest.raises(RuntimeError, match="injected") as caught:
        step(x.clone(), y.clone())
    c.fn.__globals__["_si"] = real
    # a RuntimeError that says out of memory is read as one; the headroom
    # was given (0.0), so the plan stays
    assert "the planned step ran out of device memory at the swap-in of" in "\n".join(caught.value.__notes__)
    assert step.compiled is c
    assert emptied, "the plan released no persistent tensor before a swap-in"
    for ph in c.captured.placeholders:
        if ph.role not in ("input", "label"):
            t = ph.tensor
            assert t.untyped_storage().nbytes() >= t.numel() * t.element_size(), ph.name
    after = _snapshot(ours, opt_o)
    changed = [k for k in before[0] if not torch.equal(before[0][k], after[0][k])]
    # the forward had run its first batch norm, whose running statistics
    # it updates, as an eager forward does before a later op fails
    assert changed == ["bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"], changed
    ob, oa = before[1]["state"], after[1]["state"]
    assert ob.keys() == oa.keys() and all(torch.equal(ob[k][n], oa[k][n]) for k in ob for n in ob[k])
    # the next step trains under the plan again
    loss = step(x.clone(), y.clone())
    assert torch.isfinite(loss)
    step.materialize()
    for ph in c.captured.placeholders:
        if ph.role not in ("input", "label"):
            assert ph.tensor.untyped_storage().nbytes() > 0, ph.name


def test_each_plan_steps_first_line_is_where_its_code_starts():
    """``Generated.locate``'s table: a compute step's lines hold its op's
    comment, a swap-in's its ``_si`` call, and a line before the first step
    is the prologue; the optimizer's updates are counted in order."""
    make, loss_fn, batches, footprint = _resnet18_case(1, 8, 32)
    model = make().to(DEVICE)
    step = ot.compile_step(model, loss_fn, _sgd(model), [t.to(DEVICE) for t in batches[0]],
                           budget=int(0.5 * footprint), planner="window", allocator="perfect", issue_order="early",
                           headroom=0.0)
    gen = step.compiled.generated
    lines = gen.source.splitlines()
    marks = gen.step_lines
    assert [m[0] for m in marks] == sorted(m[0] for m in marks)
    seen = {"op": 0, "swap-in": 0}
    for k, (first, what, before) in enumerate(marks):
        last = marks[k + 1][0] if k + 1 < len(marks) else len(lines) + 1
        body = lines[first - 1:last - 1]
        if what.startswith("op "):
            op_id = what.split()[1]
            assert any(b.strip().startswith(f"# op {op_id}:") for b in body), (what, body)
            seen["op"] += 1
        elif what.startswith("the swap-in of"):
            assert any("_si(" in b for b in body), (what, body)
            seen["swap-in"] += 1
        if last > first:  # a free on a copy stream may emit no line where it stands
            assert gen.locate(first).what == what and gen.locate(last - 1).what == what
            assert gen.locate(first).updates_before == before
    assert seen["op"] == len(step.compiled.converted.ops) and seen["swap-in"] == gen.n_swap_ins > 0
    assert gen.locate(1).what.startswith("the step's prologue")
    # SGD's first step updates each parameter (its momentum buffer is new,
    # an output of the update, not an in-place write)
    n_params = sum(1 for _ in model.parameters())
    assert marks[-1][2] == gen.n_updates == n_params
    assert marks[0][2] == 0


@pytest.mark.parametrize("headroom", [None, 0.0])
def test_out_of_memory_names_the_plan_step_and_a_default_headroom_rises(headroom):
    """A step that runs out of memory (injected at the first swap-in made
    while a parameter's storage is on the host) says where, in the plan's
    terms; a headroom left to the device's default rises and the next call
    plans again with it, one that was given stays and the plan is kept."""
    make, loss_fn, batches, footprint = _resnet18_case(3, 8, 32)
    model = make().to(DEVICE)
    opt = _sgd(model)
    batches = [(x.to(DEVICE), y.to(DEVICE)) for x, y in batches]
    step = ot.compile_step(model, loss_fn, opt, [t.clone() for t in batches[0]], budget=int(0.5 * footprint),
                           planner="window", allocator="perfect", issue_order="early", headroom=headroom)
    step(*(t.clone() for t in batches[0]))
    step(*(t.clone() for t in batches[1]))  # the steady plan, with momentum
    c = step.compiled
    old = step.headroom
    real = c.fn.__globals__["_si"]

    def failing(*args):
        if any(ph.role not in ("input", "label") and ph.tensor.untyped_storage().nbytes() == 0
               for ph in c.captured.placeholders):
            raise torch.OutOfMemoryError("injected: CUDA out of memory")
        return real(*args)

    c.fn.__globals__["_si"] = failing
    with pytest.raises(torch.OutOfMemoryError, match="injected") as caught:
        step(*(t.clone() for t in batches[2]))
    c.fn.__globals__["_si"] = real
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    where = step.last_failure
    assert where is not None and where.what.startswith("the swap-in of `"), where
    assert f"ran out of device memory at {where.what}" in notes
    assert ("B reserved when it failed" in notes) == (DEVICE.type == "cuda")
    # in the forward pass: no parameter or optimizer state updated yet
    assert where.updates_before == 0 < where.updates_total
    if headroom is None:
        assert step.headroom == ot.runtime.raised_headroom(old) > old
        assert step.replans_after_oom == 1 and "the next call plans the step again" in notes
        step(*(t.clone() for t in batches[2]))
        assert step.compiled is not c
        kept = step.compiled.budget_bytes - step.compiled.planner_budget_bytes
        assert kept - (c.budget_bytes - c.planner_budget_bytes) == int(step.headroom * c.budget_bytes) - int(
            old * c.budget_bytes) > 0
    else:
        assert step.headroom == headroom and step.replans_after_oom == 0
        assert "was given, so it stays" in notes
        step(*(t.clone() for t in batches[2]))
        assert step.compiled is c


def test_out_of_memory_after_the_optimizer_began_says_the_model_is_partly_updated():
    """Injected at the first swap-in issued after an in-place update (the
    eager-update order interleaves updates with the backward pass), the
    failure counts the updates before it and says the model took them."""
    make, loss_fn, batches, footprint = _resnet18_case(2, 8, 32)
    model = make().to(DEVICE)
    batches = [(x.to(DEVICE), y.to(DEVICE)) for x, y in batches]
    step = ot.compile_step(model, loss_fn, _sgd(model), [t.clone() for t in batches[0]],
                           budget=int(0.5 * footprint), planner="window", allocator="perfect", issue_order="early",
                           headroom=0.0)
    c = step.compiled
    marks = c.generated.step_lines
    at = next((k for k, (_, what, before) in enumerate(marks)
               if before > 0 and what.startswith("the swap-in of")), None)
    assert at is not None, "no swap-in after the first update"
    late = marks[at][1:]
    # the same tensor may be swapped in earlier too: fail at this swap-in's turn
    turn = sum(1 for _, what, _ in marks[:at] if what == late[0])
    real = c.fn.__globals__["_si"]
    calls = []

    def failing(*args):
        if late[0].startswith(f"the swap-in of `{c.converted.tensors[args[4]].name}`"):
            calls.append(args[4])
            if len(calls) > turn:
                raise torch.OutOfMemoryError("injected: CUDA out of memory")
        return real(*args)

    c.fn.__globals__["_si"] = failing
    with pytest.raises(torch.OutOfMemoryError) as caught:
        step(*(t.clone() for t in batches[1]))
    c.fn.__globals__["_si"] = real
    assert (step.last_failure.what, step.last_failure.updates_before) == late
    notes = "\n".join(caught.value.__notes__)
    assert f"{late[1]} of the step's {c.generated.n_updates} in-place updates" in notes
    assert "the model is partly updated by this step" in notes


def test_a_budget_too_small_for_the_step_with_the_optimizers_state_raises_at_compile():
    """SGD with momentum creates its buffers in the first step; a budget that
    fits that step and not the ones after (which hold the buffers) raises at
    ``compile_step``, before any training: model and optimizer untouched."""
    make, loss_fn, batches, _ = _resnet18_case(1, 8, 32)
    model = make().to(DEVICE)
    opt = _sgd(model)
    x, y = (t.to(DEVICE) for t in batches[0])
    before = _snapshot(model, opt)
    # all of the first step's footprint (a percentage resolves against it),
    # with nothing moved: the buffers the later steps hold do not fit
    with pytest.raises(outcore.errors.InfeasibleError, match="once the optimizer holds its state") as caught:
        ot.compile_step(model, loss_fn, opt, (x.clone(), y.clone()), budget="100%", planner="none",
                        allocator="perfect", issue_order="early", headroom=0.0)
    assert "none finds no plan" in str(caught.value)
    assert "The first step, which creates that state, has one" in str(caught.value)
    # the planner's message names a budget for the graph's share: the note
    # of the error it raised says what the step's budget= adds to that
    cause_notes = "\n".join(getattr(caught.value.__cause__, "__notes__", []))
    assert "the graph was planned under" in cause_notes and "of pinned module state" in cause_notes
    assert "has a plan under" in str(caught.value)
    assert not opt.state, "the optimizer's state was created"
    assert _same(before, _snapshot(model, opt))


def test_the_step_with_the_optimizers_state_is_planned_once_ahead():
    """``compile_step`` plans the step with the optimizer's state ahead, and
    the call that captures it takes that plan instead of planning again."""
    make, loss_fn, batches, footprint = _resnet18_case(3, 8, 32)
    model = make().to(DEVICE)
    step = ot.compile_step(model, loss_fn, _sgd(model), [t.to(DEVICE) for t in batches[0]],
                           budget=int(0.97 * footprint), planner="window", allocator="perfect",
                           issue_order="early", headroom=0.0)
    planned = list(step._plans.values())
    assert len(planned) == 2, "the first step and the step with the momentum buffers"
    for x, y in batches:
        step(x.to(DEVICE), y.to(DEVICE))
    assert len(step._cache) == 2 and len(step._plans) == 2
    assert step.compiled.plan_result is planned[1]
    assert step.compiled.generated.n_swap_outs > 0


def test_a_raised_headroom_grows_by_half_to_its_cap():
    raised = [0.12]
    while len(raised) < 6:
        raised.append(ot.runtime.raised_headroom(raised[-1]))
    assert raised == pytest.approx([0.12, 0.18, 0.27, 0.405, 0.5, 0.5])
    assert ot.runtime.raised_headroom(0.0) == pytest.approx(0.04)


def _mixed_budget(make_model, loss_fn, make_opt, batch, footprint, planner, device_profile, fractions):
    """The first budget (a fraction of ``footprint``) at which ``planner``'s
    plan both recomputes and swaps.  A fixed fraction is not enough: which
    ops a graph holds depends on the device (on CUDA dropout is one random
    op, ``native_dropout``, whose output cannot be recomputed; on CPU it is
    ``bernoulli_`` and multiplications that can), so at 65% Capuchin's plan
    for the CUDA graph swaps only (H200, 2026-11-30)."""
    tried = []
    for frac in fractions:
        m = make_model().to(DEVICE)
        o = make_opt(m)
        # one eager step first: the graph judged is the steady one (with the
        # optimizer's state), the one the test's assertion sees
        o.zero_grad()
        loss_fn(m(batch[0].to(DEVICE)), batch[1].to(DEVICE)).backward()
        o.step()
        s = ot.compile_step(m, loss_fn, o, [t.to(DEVICE) for t in batch], budget=int(frac * footprint),
                            planner=planner, allocator="perfect", device_profile=device_profile, headroom=0.0)
        g = s.compiled.generated
        tried.append((frac, g.n_recomputes, g.n_swap_outs, g.n_swap_ins))
        if g.n_recomputes > 0 and g.n_swap_outs > 0 and g.n_swap_ins > 0:
            return int(frac * footprint)
    raise AssertionError(f"no budget gives a plan that both recomputes and swaps: (fraction, recomputes, "
                         f"swap-outs, swap-ins) {tried}")


def _native_dropout(x, p=0.5, training=True, inplace=False):
    """``F.dropout`` as CUDA dispatches it: one ``native_dropout`` op."""
    if not training or p == 0.0:
        return x
    return torch.ops.aten.native_dropout(x, p, True)[0]


@pytest.mark.parametrize("dropout", ["default", "native"])
def test_gpt2_style_three_steps_with_swaps_and_recomputation_match_eager(tmp_path, monkeypatch, dropout):
    # "native": the graph CUDA gives (dropout as `native_dropout`), on any device
    if dropout == "native":
        monkeypatch.setattr(nn.functional, "dropout", _native_dropout)

    def make():
        return TinyGPT(vocab=128, d=64, heads=4, layers=2, seq=32)

    torch.manual_seed(0)
    batches = [(torch.randint(0, 128, (8, 32)), torch.randint(0, 128, (8, 32))) for _ in range(3)]
    torch.manual_seed(1)
    footprint = _steady_footprint(make(), lm_loss, _sgd, batches[0])
    slow = _slow_link_device(tmp_path)
    # At 75% Capuchin's plan swaps only (verify's bound at a swap-in is a
    # maximum over its window, not a sum); this test needs both.
    budget = _mixed_budget(make, lm_loss, _sgd, batches[0], footprint, "capuchin", slow, (0.65, 0.6, 0.55, 0.5))
    run = _train_both(make, lm_loss, _sgd, batches, budget=budget, planner="capuchin",
                      allocator="perfect", device_profile=slow)
    eager, ours, opt_e, opt_o, step, losses = run
    gen = step.compiled.generated
    assert gen.n_recomputes > 0 and gen.n_swap_outs > 0 and gen.n_swap_ins > 0
    if dropout == "native":
        ops = {str(n.target) for n in step.compiled.captured.gm.graph.nodes if n.op == "call_function"}
        assert "aten.native_dropout.default" in ops, sorted(ops)
    _assert_identical(eager, ours, opt_e, opt_o, losses)


def _snapshot(model, opt):
    return (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))


def _same(a, b):
    (ma, oa), (mb, ob) = a, b
    return all(torch.equal(ma[k], mb[k]) for k in ma) and repr(oa) == repr(ob)


def test_budget_below_the_largest_op_raises_and_changes_nothing():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    o = _sgd(m)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    before = _snapshot(m, o)
    with pytest.raises(ot.InfeasibleError, match=r"working set of \d+ B"):
        ot.compile_step(m, nn.functional.cross_entropy, o, (x, y), budget=1 << 20, allocator="perfect")
    assert _same(before, _snapshot(m, o))


def test_a_step_planned_with_moves_is_the_same_whatever_the_time_limit():
    """``moves`` bounds ``outcore``'s search by counts: time limits 10^5 apart
    give the same plan and the same generated step; with ``auto``, whose
    planners count no moves, it is refused by name before anything changes."""
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    compiled = []
    for time_limit_s in (0.001, 100.0):
        mc = copy.deepcopy(m)
        s = ot.compile_step(mc, nn.functional.cross_entropy, _sgd(mc), (x, y), budget="60%",
                            allocator="perfect", moves=30, time_limit_s=time_limit_s)
        assert s.compiled.plan_result.planner == "outcore"
        plan = copy.deepcopy(s.compiled.plan_json)
        del plan["graph"]["file"]  # each step's own temporary directory
        compiled.append((json.dumps(plan, sort_keys=True), s.source))
    assert compiled[0] == compiled[1]
    o = _sgd(m)
    before = _snapshot(m, o)
    with pytest.raises(ot.InvalidValueError, match=r"moves `30` with planner `auto`"):
        ot.compile_step(m, nn.functional.cross_entropy, o, (x, y), budget="60%", allocator="perfect",
                        planner="auto", moves=30)
    assert _same(before, _snapshot(m, o))


def test_unknown_issue_order_is_refused_by_name_and_changes_nothing():
    m = torchvision.models.resnet18(num_classes=10)
    o = _sgd(m)
    before = _snapshot(m, o)
    with pytest.raises(ot.InvalidValueError, match=r"issue_order `soon`: not one of early, timeline"):
        ot.compile_step(m, nn.functional.cross_entropy, o, (torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))),
                        budget="90%", allocator="perfect", issue_order="soon")
    assert _same(before, _snapshot(m, o))


def test_unsupported_op_in_capture_names_it_and_changes_nothing():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.sum().item() > 0:  # data-dependent control flow cannot be captured
                return self.fc(x)
            return -self.fc(x)

    m = DataDependent()
    o = _sgd(m)
    before = _snapshot(m, o)
    with pytest.raises(ot.CaptureError, match="cannot capture"):
        ot.compile_step(m, nn.functional.cross_entropy, o, (torch.randn(3, 4), torch.randint(0, 2, (3,))), budget="100%")
    assert _same(before, _snapshot(m, o))


def test_complex_dtype_is_an_unsupported_op_error():
    class Complexish(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            z = torch.view_as_complex(self.fc(x).reshape(-1, 2, 2).contiguous())
            return torch.view_as_real(z * z).reshape(x.shape[0], -1)

    m = Complexish()
    o = _sgd(m)
    with pytest.raises(ot.UnsupportedOpError, match="complex"):
        ot.compile_step(m, nn.functional.mse_loss, o, (torch.randn(3, 4), torch.randn(3, 4)), budget="100%")


def test_recomputing_a_random_op_is_refused_by_name():
    torch.manual_seed(0)
    m = TinyGPT(vocab=32, d=16, heads=2, layers=1, seq=8)
    o = _sgd(m)
    x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    # twice the first step's footprint: the later steps hold SGD's momentum too
    step = ot.compile_step(m, lm_loss, o, (x, y), budget="200%", planner="none", allocator="perfect",
                           headroom=0.0)
    conv = step.compiled.converted
    random_ops = [op for op in conv.ops if not op.recomputable and "random" in (op.why_not_recomputable or "")]
    assert random_ops, "the dropout of TinyGPT must be a random op"
    victim = random_ops[0]
    plan = copy.deepcopy(step.compiled.plan_json)
    out = victim.outputs[0]
    compute = plan["streams"][0]
    at = next(i for i, s in enumerate(compute) if s["instr"] == {"compute": victim.id})
    compute.insert(at + 1, {"instr": {"recompute": {"op": victim.id, "outputs": [out]}}})
    from outcore.torch.codegen import generate

    with pytest.raises(ot.UnsupportedOpError, match=f"`{victim.name}`.*random"):
        generate(conv, plan)


def test_bad_budget_spellings_name_the_value():
    with pytest.raises(outcore.InvalidValueError, match="out of range"):
        ot.parse_budget(1.5, footprint_bytes=10, device_memory_bytes=100)
    with pytest.raises(outcore.InvalidValueError, match="12 apples"):
        ot.parse_budget("12 apples", footprint_bytes=10, device_memory_bytes=100)
    assert ot.parse_budget("1KiB", footprint_bytes=10, device_memory_bytes=100) == 1024
    assert ot.parse_budget(0.5, footprint_bytes=10, device_memory_bytes=100) == 50
    assert ot.parse_budget("50%", footprint_bytes=10, device_memory_bytes=100) == 5


def _profiled_tiny_gpt(iterations: int):
    """A one-layer TinyGPT trained one step under a plan, then profiled:
    (model, optimizer, batch, step, latency table)."""
    torch.manual_seed(0)
    m = TinyGPT(vocab=32, d=16, heads=2, layers=1, seq=8, p=0.0).to(DEVICE)
    o = _sgd(m)
    x, y = torch.randint(0, 32, (2, 8), device=DEVICE), torch.randint(0, 32, (2, 8), device=DEVICE)
    # 300% of the first step's graph: the steady-state graph adds momentum buffers
    step = ot.compile_step(m, lm_loss, o, (x.clone(), y.clone()), budget="300%", planner="none", allocator="perfect",
                           headroom=0.0)
    step(x.clone(), y.clone())
    return m, o, x, y, step, step.profile(x, y, iterations=iterations)


def test_latency_table_is_written_in_outcore_format_and_plans_with_it(tmp_path):
    m, o, x, y, step, table = _profiled_tiny_gpt(2)
    assert table["format"] == "outcore-latency-table/1"
    names = {op.id: op.name for op in step.compiled.converted.ops}
    assert {e["op"] for e in table["entries"]} == set(names)
    assert all(e["name"] == names[e["op"]] and e["time_s"] > 0 for e in table["entries"])
    path = tmp_path / "lat.json"
    step.write_latency_table(str(path), table)
    again = ot.compile_step(m, lm_loss, o, (x.clone(), y.clone()), budget="100%", planner="none",
                            allocator="perfect", latency_table=str(path), headroom=0.0)
    assert again.plan_result.verification.passed


@pytest.mark.parametrize("headroom, shown", [
    (-0.5, "headroom `-0.5`: a fraction of the budget must be in [0, 1)"),
    (1.0, "headroom `1.0`"),
    (float("nan"), "headroom `nan`"),
    (-1, "headroom `-1`: bytes kept from the planner must be >= 0"),
    ("8%", "headroom `'8%'`: not a number"),
])
def test_a_headroom_out_of_range_is_refused_by_name(headroom, shown):
    """A negative headroom planned above the budget the step enforces (and
    a whole budget of it left the planner nothing): refused before the
    step is captured, the model untouched."""
    m = TinyGPT(vocab=32, d=16, heads=2, layers=1, seq=8, p=0.0).to(DEVICE)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = (torch.randint(0, 32, (2, 8), device=DEVICE) for _ in range(2))
    with pytest.raises(outcore.InvalidValueError) as e:
        ot.compile_step(m, lm_loss, o, (x, y), budget="100%", planner="none", allocator="perfect",
                        headroom=headroom)
    assert shown in str(e.value), str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert not o.state


def test_a_profiled_op_is_timed_before_the_allocator_statistics_are_read(monkeypatch):
    """On CUDA ``profile`` brackets each op with events and reads the caching
    allocator's statistics around it; those reads cost the host about 0.3 ms,
    which a device waiting for the host counted into the op when the end
    event came after them (a `detach` measured 351 us instead of 17 on an
    H200, and plans made on such a table swapped where they should have
    recomputed).  Checked on any machine with the CUDA calls replaced by a
    log: nothing runs between the op and its end event, and the op's
    transient bytes are its peak less the larger of before and after."""
    from outcore.torch.runtime import _Runtime

    log: list[str] = []
    allocated = iter([100, 150])

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.enable_timing = enable_timing

    class Stream:
        def record_event(self, ev: Event) -> Event:
            log.append("event")
            return ev

    def reading(name: str, value: Any) -> Any:
        def read(*_: Any) -> Any:
            log.append(name)
            return value() if callable(value) else value
        return read

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reading("reset", None))
    monkeypatch.setattr(torch.cuda, "memory_allocated", reading("allocated", lambda: next(allocated)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", reading("peak", 400))
    rt = _Runtime(torch.device("cpu"), profile=True)
    rt.cuda, rt.compute = True, Stream()
    t0 = rt.tick()
    log.append("op")
    rt.tock(7, t0)
    assert log == ["reset", "allocated", "event", "op", "event", "allocated", "peak"]
    assert rt.op_transient_bytes == {7: [400 - 150]}
    assert len(rt.op_times[7]) == 1 and all(isinstance(e, Event) for e in rt.op_times[7][0])


def test_measured_workspaces_in_a_latency_table_are_planned_for(tmp_path):
    """``workspace_bytes`` of a table's entries (what ``profile`` measures on
    CUDA inside each op) become the ops' workspaces in the planned graph; a
    bad value is refused by name.  On the CPU there is nothing to measure, so
    the table here is written by hand."""
    m, o, x, y, step, table = _profiled_tiny_gpt(1)
    if DEVICE.type == "cpu":
        assert all("workspace_bytes" not in e for e in table["entries"])
    else:
        assert all(e["workspace_bytes"] >= 0 for e in table["entries"])
    ops = step.compiled.converted.ops
    victim = max(ops, key=lambda op: len(op.inputs))
    big = 1 << 20
    for e in table["entries"]:
        e["workspace_bytes"] = big if e["op"] == victim.id else 0
    path = tmp_path / "lat.json"
    step.write_latency_table(str(path), table)
    again = ot.compile_step(m, lm_loss, o, (x.clone(), y.clone()), budget="100%", planner="none",
                            allocator="perfect", latency_table=str(path), headroom=0.0)
    graph_ops = again.compiled.converted.graph_json["ops"]
    assert graph_ops[victim.id]["workspace_bytes"] == max(big, victim.workspace_bytes)
    plain = ot.compile_step(m, lm_loss, o, (x.clone(), y.clone()), budget="100%", planner="none",
                            allocator="perfect", headroom=0.0)
    assert again.plan_result.report.peak_live_bytes >= plain.plan_result.report.peak_live_bytes
    assert again.compiled.graph.footprint_bytes > plain.compiled.graph.footprint_bytes

    table["entries"][0]["workspace_bytes"] = -1
    step.write_latency_table(str(path), table)
    with pytest.raises(outcore.InvalidValueError, match=r"workspace_bytes `-1`.*whole number of bytes"):
        ot.compile_step(m, lm_loss, o, (x.clone(), y.clone()), budget="100%", planner="none",
                        allocator="perfect", latency_table=str(path), headroom=0.0)


@contextlib.contextmanager
def _tf32_flags(conv: bool, matmul: bool):
    """PyTorch's TF32 settings for convolutions and matmuls (the
    ``fp32_precision`` ones) set for the block, restored after (they are
    properties of backend modules, which monkeypatch cannot undo)."""
    b = torch.backends
    old = (b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision)
    b.cudnn.conv.fp32_precision = "tf32" if conv else "ieee"
    b.cuda.matmul.fp32_precision = "tf32" if matmul else "ieee"
    try:
        yield
    finally:
        b.cudnn.conv.fp32_precision, b.cuda.matmul.fp32_precision = old


@pytest.mark.parametrize("conv, matmul, mode", [
    (True, False, "convolutions"), (False, False, "off"), (False, True, "matmuls"), (True, True, "all"),
])
def test_tf32_mode_follows_torchs_flags(conv, matmul, mode):
    from outcore.torch.runtime import torch_tf32_mode

    with _tf32_flags(conv, matmul):
        assert torch_tf32_mode() == mode


def test_tf32_mode_takes_a_parents_precision_where_the_op_says_none():
    from outcore.torch.runtime import torch_tf32_mode

    b = torch.backends
    old = (b.cudnn.conv.fp32_precision, b.cudnn.fp32_precision)
    try:
        b.cudnn.conv.fp32_precision, b.cudnn.fp32_precision = "none", "ieee"
        assert torch_tf32_mode() == "off"
        b.cudnn.fp32_precision = "tf32"
        assert torch_tf32_mode() in ("convolutions", "all")
    finally:
        b.cudnn.conv.fp32_precision, b.cudnn.fp32_precision = old


def test_a_cuda_step_plans_with_tf32_convolutions_and_a_conv_net_simulates_faster(tmp_path):
    """On CUDA the step plans for the TF32 mode PyTorch runs in (PyTorch's
    defaults: convolutions on TF32); the profile written for it prices a
    convolutional graph faster than the built-in profile (all FP32)."""
    m = nn.Linear(2, 2)
    step = ot.StepFunction(m, nn.functional.mse_loss, torch.optim.SGD(m.parameters(), lr=0.1), budget="100%",
                           planner="none", device_profile=None, allocator="perfect", headroom=0.0,
                           latency_table=None, seed=0, time_limit_s=1.0, enforce=False)
    with _tf32_flags(True, False):
        path = step._with_tf32("h100-80gb", torch.device("cuda"))
    assert outcore.device_profile(path)["tf32"] == "convolutions"
    assert step._with_tf32("h100-80gb", torch.device("cpu")) == "h100-80gb"
    # A profile file that names its own mode, even "off", keeps it.
    own = tmp_path / "own.json"
    own.write_text(json.dumps({**outcore.device_profile("h100-80gb"), "tf32": "off"}))
    with _tf32_flags(True, False):
        assert step._with_tf32(str(own), torch.device("cuda")) == str(own)
    g = outcore.load_graph("tiny-cnn")
    fp32 = outcore.plan(g, "none", device="h100-80gb", budget="100%", allocator="perfect")
    tf32 = outcore.plan(g, "none", device=path, budget="100%", allocator="perfect")
    assert tf32.report.iter_time_s < fp32.report.iter_time_s


def test_settings_left_unset_take_the_devices_defaults():
    """allocator, issue order and headroom left unset: on CUDA the setting
    every plan trained under on an H200 (expandable segments, the simulated
    order, 12%), elsewhere the caching allocator's model, the early order and
    no headroom; one given explicitly is kept on either device."""
    from outcore.torch.runtime import CUDA_DEFAULTS, OTHER_DEFAULTS, StepFunction

    assert CUDA_DEFAULTS == ("virtual-chunks", "timeline", 0.12)
    assert OTHER_DEFAULTS == ("best-fit-paged", "early", 0.0)
    m = TinyGPT(vocab=32, d=16, heads=2, layers=1, seq=8, p=0.0)

    def unset(**given):
        kw = dict(allocator=None, headroom=None, issue_order=None)
        kw.update(given)
        return StepFunction(m, lm_loss, _sgd(m), budget="100%", planner="none", device_profile=None,
                            latency_table=None, seed=0, time_limit_s=1.0, enforce=False, **kw)

    for device, want in (("cuda", CUDA_DEFAULTS), ("cpu", OTHER_DEFAULTS), ("meta", OTHER_DEFAULTS)):
        s = unset()
        s._resolve_defaults(torch.device(device))  # no CUDA needed: only the device's type is read
        assert (s.allocator, s.issue_order, s.headroom) == want, device
    s = unset(allocator="best-fit", issue_order="early", headroom=0)
    s._resolve_defaults(torch.device("cuda"))
    assert (s.allocator, s.issue_order, s.headroom) == ("best-fit", "early", 0)
    # compile_step on this device resolves them at capture
    x, y = torch.randint(0, 32, (2, 8), device=DEVICE), torch.randint(0, 32, (2, 8), device=DEVICE)
    step = ot.compile_step(m.to(DEVICE), lm_loss, _sgd(m), (x, y), budget=64 << 20, planner="none")
    want = CUDA_DEFAULTS if torch.device(DEVICE).type == "cuda" else OTHER_DEFAULTS
    assert (step.allocator, step.issue_order, step.headroom) == want
    assert (step.compiled.timeline is not None) == (want[1] == "timeline")
    assert step.compiled.planner_budget_bytes == (64 << 20) - int(want[2] * (64 << 20))
    kind = step.compiled.plan_json["allocator"]
    assert (kind["kind"], kind.get("paged_segments")) == (
        ("virtual-chunks", None) if want[0] == "virtual-chunks" else ("best-fit", True)), kind


def test_auto_with_no_planner_fitting_names_a_budget_that_plans(monkeypatch):
    """``planner="auto"`` judges its planners with ``outcore.compare``; where
    none fits, the error names a budget under which one plans
    (``outcore.budget_hint``). The comparison is stubbed to find nothing, so
    the hint (real) finds a plan under the very budget given."""
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    o = _sgd(m)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    real = outcore.compare

    def nothing_fits(graph, planners, **kw):
        c = real(graph, "none", **kw)
        failed = outcore.PlannerOutcome(planner="none", status="infeasible", reason="stubbed", verified=False,
                                        report=None, planner_time_s=0.0)
        return dataclasses.replace(c, results=[failed])

    monkeypatch.setattr(outcore, "compare", nothing_fits)
    before = _snapshot(m, o)
    with pytest.raises(ot.InfeasibleError, match=r"none: stubbed; `\w+` has a plan under \d+ B"):
        ot.compile_step(m, nn.functional.cross_entropy, o, (x, y), budget="60%", allocator="perfect",
                        planner="auto", time_limit_s=1.0)
    assert _same(before, _snapshot(m, o))


def test_a_batch_sliced_from_a_dataset_leaves_the_dataset_whole_and_a_consumed_batch_is_refused():
    """The plan releases the batch's storage after its last use.  A slice of
    a dataset shares the dataset's storage: the step consumes a copy, and the
    dataset keeps every byte and value.  A batch passed as it is becomes an
    empty tensor after the step (reading it is no read of released memory),
    and passing it again is refused by name before anything changes."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(DEVICE)
    o = _sgd(m)
    data_x = torch.randn(64, 16, device=DEVICE)
    data_y = torch.randint(0, 4, (64,), device=DEVICE)
    kept_x, kept_y = data_x.clone(), data_y.clone()
    step = ot.compile_step(m, nn.functional.cross_entropy, o, (data_x[:8].clone(), data_y[:8].clone()),
                           budget="200%", planner="none", allocator="perfect")
    for k in range(3):
        step(data_x[8 * k:8 * (k + 1)], data_y[8 * k:8 * (k + 1)])
    assert data_x.untyped_storage().nbytes() == kept_x.numel() * 4
    assert torch.equal(data_x, kept_x) and torch.equal(data_y, kept_y)

    x, y = data_x[:8].clone(), data_y[:8].clone()
    step(x, y)
    assert x.numel() == 0 and y.numel() == 0, "a consumed batch is empty, not a view of released memory"
    assert x.sum().item() == 0.0
    before = _snapshot(m, o)
    with pytest.raises(ot.InvalidValueError, match=r"batch `x` .* holds no data: a step consumes its batch"):
        step(x, y)
    assert _same(before, _snapshot(m, o))
    with pytest.raises(ot.InvalidValueError, match=r"batch `y`: a list, not a torch.Tensor"):
        step(data_x[:8].clone(), [0] * 8)


@pytest.mark.parametrize("headroom", [10**12, 2**64])
def test_headroom_bytes_of_the_whole_budget_are_refused_and_change_nothing(headroom):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(DEVICE)
    o = _sgd(m)
    before = _snapshot(m, o)
    x, y = torch.randn(8, 16, device=DEVICE), torch.randint(0, 4, (8,), device=DEVICE)
    with pytest.raises(ot.InvalidValueError, match=rf"headroom `{headroom}`: {headroom} B .* not below the budget"):
        ot.compile_step(m, nn.functional.cross_entropy, o, (x, y), budget="200%", planner="none",
                        allocator="perfect", headroom=headroom)
    assert _same(before, _snapshot(m, o))
