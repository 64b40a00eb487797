"""outcore.torch.bench: the fixed-batch mode and its argument checks (on CPU,
where no budget is enforced: this checks the plumbing, not the numbers)."""

from __future__ import annotations

import json

import pytest
import torch

import outcore.torch as ot
from outcore.torch import bench
from outcore.torch.models import TinyGPT, lm_loss


def test_fixed_batch_trains_every_method_at_that_batch_and_records_the_plan(tmp_path):
    out = tmp_path / "b.json"
    assert bench.main(["--model", "tiny-gpt", "--device", "cpu", "--budget", "40MiB", "--batch", "6",
                       "--methods", "eager,outcore", "--planner", "capuchin", "--allocator", "virtual-chunks",
                       "--seconds", "1", "--iters", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["fixed_batch"] == 6 and doc["allocator"] == "virtual-chunks"
    by_method = {r["method"]: r for r in doc["results"]}
    assert by_method["eager"]["batch"] == 6 and by_method["outcore"]["batch"] == 6
    assert by_method["outcore"]["planner"] == "capuchin"
    assert by_method["outcore"]["simulated_iter_s"] > 0


def test_a_trial_bounded_by_moves_plans_the_same_whatever_the_clock(tmp_path):
    """``--moves`` reaches compile_step: two trials with very different time
    limits make the same plan (the search stops at its move count, not the
    clock) and record the bound."""
    docs = []
    for seconds in ("0.001", "100"):
        out = tmp_path / f"m{seconds}.json"
        # 10 MiB is below this step's footprint: the plan recomputes and swaps
        assert bench.main(["--model", "tiny-gpt", "--device", "cpu", "--budget", "10MiB", "--batch", "64",
                           "--allocator", "virtual-chunks", "--methods", "outcore", "--planner", "outcore",
                           "--moves", "20", "--seconds", seconds, "--iters", "1", "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    assert [d["moves"] for d in docs] == [20, 20]
    plans = [{k: d["results"][0][k] for k in ("planner", "simulated_iter_s", "plan_peak_live_bytes", "recomputes",
                                                "swap_outs", "swap_ins")} for d in docs]
    assert plans[0] == plans[1] and plans[0]["planner"] == "outcore", plans
    assert plans[0]["recomputes"] + plans[0]["swap_outs"] > 0, plans


@pytest.mark.parametrize("argv, word", [
    (["--batch", "-1"], "--batch"),
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "nan"], "--seconds"),
    (["--allocator", "bogus"], "bogus"),
    (["--moves", "-1"], "--moves"),
    (["--moves", "5", "--planner", "auto"], "`auto` counts no moves"),
    (["--moves", "5", "--methods", "eager"], "--moves applies to the outcore method"),
    (["--budget", "abc"], "--budget: size `abc`"),
    (["--budget", "0"], "--budget must be a positive"),
    (["--start", "0"], "--start must be a whole number >= 1"),
    (["--max-batch", "4"], "--max-batch must be at least --start (8); got 4"),
    (["--iters", "0"], "--iters must be a whole number >= 1"),
    (["--headroom", "2"], "--headroom must be a fraction of the budget in [0, 1)"),
    (["--headroom", "-0.5"], "got -0.5"),
    (["--tolerance", "0"], "--tolerance must be a fraction in (0, 1)"),
    (["--methods", "eager,bogus"], "unknown method `bogus`"),
    (["--model", "nosuch"], "unknown model `nosuch`"),
    (["--planner", "nope"], "unknown planner `nope`"),
    (["--eager-bytes-per-sample", "-3"], "--eager-bytes-per-sample must be >= 0"),
])
def test_bad_arguments_exit_non_zero_naming_the_value(argv, word, capsys):
    """Refused before anything trains (the usage error, exit status 2): a
    --start of 0 looped for ever doubling batch 0, --iters 0 and a budget
    that is not a size ended in tracebacks, a negative headroom planned
    above the budget, and an unknown method was found only after the
    methods before it had run."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", "tiny-gpt", "--device", "cpu", "--budget", "40MiB", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert word in err, err
    assert "fits" not in err, err


# best-fit-paged's 20 MiB shared segments leave this ~36 MiB step no room below its footprint
@pytest.mark.parametrize("allocator, budget, spec", [
    ("virtual-chunks", "90%", {"kind": "virtual-chunks"}),
    ("best-fit-paged", "200%", {"kind": "best-fit", "paged_segments": True}),
])
def test_a_step_planned_for_a_cuda_allocator_model_carries_it_and_trains_like_eager(allocator, budget, spec):
    torch.manual_seed(0)
    eager = TinyGPT(vocab=4096, d=128, heads=2, layers=2, seq=64, p=0.0)
    ours = TinyGPT(vocab=4096, d=128, heads=2, layers=2, seq=64, p=0.0)
    ours.load_state_dict(eager.state_dict())
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9, foreach=False)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9, foreach=False)
    x, y = torch.randint(0, 4096, (8, 64)), torch.randint(0, 4096, (8, 64))
    step = ot.compile_step(ours, lm_loss, opt_o, (x.clone(), y.clone()), budget=budget, planner="capuchin",
                           allocator=allocator)
    got = step.compiled.plan_json["allocator"]
    assert {k: got.get(k) for k in spec} == spec, got
    for _ in range(2):
        opt_e.zero_grad()
        le = lm_loss(eager(x), y)
        le.backward()
        opt_e.step()
        lo = step(x.clone(), y.clone())
        assert torch.equal(le.detach(), lo)
    step.materialize()
    for a, b in zip(eager.state_dict().values(), ours.state_dict().values()):
        assert torch.equal(a, b)
