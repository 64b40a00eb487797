"""The Rust facade through Python: results as objects, errors as exceptions."""

from __future__ import annotations

import json

import pytest

import outcore


def test_lists_are_not_empty_and_consistent():
    names = [m["name"] for m in outcore.zoo_models()]
    assert "resnet50" in names
    assert "window" in outcore.planners()
    # by name only: in the longer list, not in the one "all" runs, and plannable
    by_name = set(outcore.planners(by_name_too=True)) - set(outcore.planners())
    assert {"outcore-recompute", "checkmate-milp"} <= by_name, by_name
    assert set(outcore.planners()) <= set(outcore.planners(by_name_too=True))
    g = outcore.load_graph("tiny-cnn")
    r = outcore.plan(g, "outcore-recompute", device="v100-16gb-pcie3", budget="100%", allocator="perfect", moves=5)
    assert r.planner == "outcore-recompute"
    assert "h100-80gb" in outcore.devices()
    assert outcore.device_profile("h100-80gb")["memory_bytes"] > 0


def test_plan_verify_simulate_compare_round_trip(tmp_path):
    g = outcore.load_graph("resnet50", batch=8)
    assert g.n_ops > 100 and g.footprint_bytes > 0
    r = outcore.plan(g, "checkpoint-sqrt", device="v100-16gb-pcie3", budget="70%")
    assert r.verification.passed
    assert r.budget_bytes == round(0.7 * g.footprint_bytes)
    assert r.report.peak_live_bytes <= r.budget_bytes
    assert r.report.recompute_time_s > 0
    assert outcore.verify(r.plan, g).passed
    s = outcore.simulate(r.plan)
    assert s.runnable and s.report.iter_time_s == pytest.approx(r.report.iter_time_s, rel=1e-9)
    path = tmp_path / "p.json"
    outcore.save_plan(r.plan, path)
    back = outcore.load_plan(path)
    assert json.loads(back.to_json()) == json.loads(r.plan.to_json())
    c = outcore.compare(g, "none,checkpoint-sqrt", device="v100-16gb-pcie3", budget="70%")
    by = {o.planner: o for o in c.results}
    assert by["none"].status == "infeasible" and by["checkpoint-sqrt"].feasible
    assert "checkpoint-sqrt" in str(c)


def test_an_offsets_plan_carries_its_layout_and_simulates_the_same(tmp_path):
    # `--allocator offsets`: the plan is laid out at exact offsets, which the
    # simulator follows (its own allocator refuses any overlap) and verify checks.
    g = outcore.load_graph("tiny-transformer", batch=8)
    r = outcore.plan(g, "odswap", device="v100-16gb-pcie3", budget="50%", allocator="offsets")
    assert r.verification.passed
    allocator = json.loads(r.plan.to_json())["allocator"]
    assert allocator["kind"] == "offsets"
    assert 0 < allocator["height_bytes"] <= r.budget_bytes
    assert r.report.raw.get("oom") is None
    assert r.report.peak_reserved_bytes <= allocator["height_bytes"]
    assert outcore.verify(r.plan, g).passed
    s = outcore.simulate(r.plan)
    assert s.runnable and s.report.iter_time_s == pytest.approx(r.report.iter_time_s, rel=1e-9)
    path = tmp_path / "p.json"
    outcore.save_plan(r.plan, path)
    assert json.loads(outcore.load_plan(path).to_json())["allocator"] == allocator


def test_graph_files_round_trip(tmp_path):
    g = outcore.load_graph("mlp", batch=4)
    path = tmp_path / "g.json"
    outcore.export_graph(g, path)
    back = outcore.load_graph(path=path)
    assert back.to_json() == g.to_json()


def test_a_search_bounded_by_moves_gives_the_same_plan_whatever_the_time_limit():
    # `moves=`: outcore's search ends by its move count and does not read
    # `time_limit_s`, so a millisecond and an hour give the same plan.
    g = outcore.load_graph("tiny-cnn")
    short, long = (
        outcore.plan(
            g, "outcore", device="v100-16gb-pcie3", budget="60%", allocator="perfect", time_limit_s=s, moves=500
        )
        for s in (0.001, 3600.0)
    )
    assert short.plan.to_json() == long.plan.to_json()
    settings = json.loads(short.plan.to_json())["planner"]["settings"]
    assert settings["bounded_by"] == {"moves_per_start": 500}
    with pytest.raises(outcore.InvalidValueError, match="moves `-1`: out of range"):
        outcore.plan(g, "outcore", device="v100-16gb-pcie3", budget="60%", moves=-1)
    with pytest.raises(outcore.InvalidValueError, match="`window` has no move count"):
        outcore.plan(g, "window", device="v100-16gb-pcie3", budget="60%", moves=10)
    # A comparison none of whose planners counts moves refuses the count.
    with pytest.raises(outcore.InvalidValueError, match="`window`, `dtr` have no move count"):
        outcore.compare(g, ["window", "dtr"], device="v100-16gb-pcie3", budget="60%", moves=10)


def test_errors_are_typed_and_carry_the_message():
    g = outcore.load_graph("resnet50", batch=8)
    with pytest.raises(outcore.InvalidValueError, match="budget `12 parsecs`"):
        outcore.plan(g, budget="12 parsecs")
    with pytest.raises(ValueError, match="unknown planner `nope`"):
        outcore.plan(g, "nope")
    with pytest.raises(outcore.InfeasibleError, match="needs"):
        outcore.plan(g, "window", device="v100-16gb-pcie3", budget="1MiB", allocator="perfect")
    # under PyTorch's caching allocator no tensor gets a segment of 1 MiB:
    # said of the budget and the allocator, with the fix
    with pytest.raises(outcore.InvalidValueError, match=r"smallest segment \(2.00 MiB.*allocator=\"perfect\""):
        outcore.plan(g, "window", device="v100-16gb-pcie3", budget="1MiB")
    with pytest.raises(outcore.GraphError):
        outcore.load_graph("no-such-model")
    with pytest.raises(outcore.GraphError, match="cannot read /nonexistent/graph.json"):
        outcore.load_graph(path="/nonexistent/graph.json")
    with pytest.raises(outcore.OutcoreIOError, match="/nonexistent/p.json"):
        outcore.load_plan("/nonexistent/p.json")
    with pytest.raises(outcore.PlanError):
        outcore.Plan.from_json("{}")


def test_whole_numbers_out_of_range_name_the_argument():
    """A negative or too large batch, knob, seed or iteration count is an
    InvalidValueError naming the argument and the range, where the extension's
    conversion raised a bare OverflowError; a file given as a model name is
    pointed to ``path=``."""
    for kwargs, name in [
        ({"batch": -1}, "batch `-1`"),
        ({"batch": 2**70}, "batch `1180591620717411303424`"),
        ({"knobs": {"width": -3}}, "knob `width` `-3`"),
        ({"batch": 2.5}, "batch `2.5`"),
    ]:
        with pytest.raises(outcore.InvalidValueError, match=name):
            outcore.load_graph("tiny-cnn", **kwargs)
    g = outcore.load_graph("tiny-cnn")
    with pytest.raises(outcore.InvalidValueError, match="seed `-1`: not a whole number in range"):
        outcore.plan(g, "dtr", device="v100-16gb-pcie3", budget="60%", seed=-1)
    with pytest.raises(outcore.InvalidValueError, match="seed `-2`"):
        outcore.compare(g, "dtr", device="v100-16gb-pcie3", budget="60%", seed=-2)
    p = outcore.plan(g, "ideal", device="v100-16gb-pcie3", allocator="perfect").plan
    with pytest.raises(outcore.InvalidValueError, match="iterations `-1`"):
        outcore.simulate(p, iterations=-1)
    with pytest.raises(outcore.GraphError, match="pass it as path='graphs/g.json'"):
        outcore.load_graph("graphs/g.json")


def test_a_budget_hint_names_a_budget_under_which_the_named_planner_plans():
    g = outcore.load_graph("tiny-cnn")
    # 20% of the footprint: no planner plans there (the CLI and facade tests'
    # case); the hint's budget is above it, and its planner plans under it
    with pytest.raises(outcore.InfeasibleError, match="has a plan under"):
        outcore.plan(g, "window", device="v100-16gb-pcie3", budget="20%", allocator="perfect", time_limit_s=1.0)
    hint = outcore.budget_hint(g, device="v100-16gb-pcie3", budget="20%", allocator="perfect", time_limit_s=1.0)
    assert hint is not None
    budget = int(0.2 * g.footprint_bytes)
    assert budget < hint.budget_bytes <= 4 * budget + 4
    r = outcore.plan(g, hint.planner, device="v100-16gb-pcie3", budget=hint.budget_bytes, allocator="perfect",
                     time_limit_s=1.0)
    assert r.report.iter_time_s > 0
    # no op fits 1 KiB, nor four times it
    assert outcore.budget_hint(g, device="v100-16gb-pcie3", budget="1KiB", allocator="perfect") is None


def test_bad_arguments_to_the_file_writers_leave_an_existing_file_as_it_was(tmp_path):
    g = outcore.load_graph("mlp", batch=4)
    r = outcore.plan(g, "none", device="v100-16gb-pcie3", budget="100%", allocator="perfect")
    path = tmp_path / "p.json"
    outcore.save_plan(r.plan, path)
    before = path.read_bytes()
    with pytest.raises(outcore.InvalidValueError, match=r"plan: a NoneType, not an outcore.Plan"):
        outcore.save_plan(None, path)
    with pytest.raises(outcore.InvalidValueError, match=r"graph: a NoneType, not an outcore.Graph"):
        outcore.export_graph(None, path)
    with pytest.raises(outcore.OutcoreIOError, match=r"cannot write"):
        outcore.save_plan(r.plan, tmp_path)  # a directory in the way
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"], "no temporary file left behind"


def test_verify_refuses_a_plan_for_another_graph_by_name():
    g8, g32 = outcore.load_graph("mlp", batch=8), outcore.load_graph("mlp", batch=32)
    r = outcore.plan(g32, "none", device="v100-16gb-pcie3", budget="100%", allocator="perfect")
    assert outcore.verify(r.plan, g32).passed
    with pytest.raises(outcore.PlanError, match=r"made for another graph \(fingerprint [0-9a-f]{16}, this graph"):
        outcore.verify(r.plan, g8)


@pytest.mark.parametrize("limit", [float("nan"), -1.0, 0.0, float("inf")])
def test_a_budget_hint_refuses_a_time_limit_out_of_range(limit):
    g = outcore.load_graph("tiny-cnn")
    with pytest.raises(outcore.InvalidValueError, match=r"time limit"):
        outcore.budget_hint(g, device="v100-16gb-pcie3", budget="20%", time_limit_s=limit)
