//! Chen et al.'s checkpointing planners recompute each forward op at most once
//! per iteration (a segment's forward re-runs once, before its backward), on
//! every zoo model (small batch, large defaults shrunk by knobs) at 70% and 50%
//! of the footprint, in graph order and in a random topological order.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, OpId, footprint};
use outcore_plan::{Instr, PlanOutcome, PlanRequest, Stream, random_topological_order, verify};
use std::collections::BTreeMap;

const PLANNERS: [&str; 3] = ["checkpoint-sqrt", "checkpoint-greedy", "checkpoint-all"];

/// Knobs that keep a model's graph small.
fn knobs_for(info: &outcore_graph::zoo::ModelInfo) -> BTreeMap<String, u64> {
    let mut knobs = BTreeMap::new();
    let has = |k: &str| info.knobs.iter().find(|x| x.name == k).map(|x| x.default);
    for (knob, cap) in [("seq", 16), ("layers", 3), ("repeats", 1), ("size", 64)] {
        if let Some(v) = has(knob) {
            knobs.insert(knob.to_string(), v.min(cap));
        }
    }
    knobs
}

/// Recompute steps per op in a plan.
fn recomputations(plan: &outcore_plan::Plan) -> BTreeMap<OpId, usize> {
    let mut per_op = BTreeMap::new();
    for step in &plan.streams[Stream::Compute.index()] {
        if let Instr::Recompute { op, .. } = &step.instr {
            *per_op.entry(*op).or_insert(0) += 1;
        }
    }
    per_op
}

#[test]
fn no_op_is_recomputed_twice_on_any_zoo_model() {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let mut plans_with_recomputation = 0;
    let mut models = 0;
    for info in outcore_graph::zoo::models() {
        let g: Graph = outcore_graph::zoo::build(info.name, Some(8), &knobs_for(&info), None)
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        models += 1;
        let (footprint_bytes, _) = footprint(&g);
        let random = random_topological_order(&g, 1);
        for percent in [70u64, 50] {
            let budget_bytes = footprint_bytes * percent / 100;
            for (order_name, order) in [("graph", None), ("random", Some(&random[..]))] {
                for name in PLANNERS {
                    let planner = outcore_planners::by_name(name).expect("registered");
                    let request = PlanRequest {
                        order,
                        ..PlanRequest::new(&g, &cost, budget_bytes)
                    };
                    let what = format!("{name} on {} at {percent}% ({order_name})", info.name);
                    let plan = match planner.plan(&request) {
                        Ok(PlanOutcome::Feasible(plan)) => plan,
                        Ok(PlanOutcome::Infeasible(_)) => continue,
                        Err(e) => panic!("{what}: {e}"),
                    };
                    assert!(verify(&plan, &g).is_empty(), "{what} does not verify");
                    let per_op = recomputations(&plan);
                    if let Some((op, n)) = per_op.iter().find(|(_, n)| **n > 1) {
                        panic!("{what}: `{}` is recomputed {n} times", g.op(*op).name);
                    }
                    plans_with_recomputation += usize::from(!per_op.is_empty());
                }
            }
        }
    }
    eprintln!("{plans_with_recomputation} plans recompute, over {models} models");
    // Not vacuous: most of the runs recompute something.
    assert!(
        plans_with_recomputation >= models * 3,
        "only {plans_with_recomputation} plans recompute anything"
    );
}
