//! Optimizer states copied out early in the iteration, before their first
//! use (the previous iteration left them on the device after their update),
//! and back for their update: training with such a plan is bit-identical to
//! training with every tensor resident, over several iterations, with every
//! host copy checked.

mod common;

use outcore_exec::{CpuBackend, CpuBackendOptions, ExecOptions, execute, test_plans};
use outcore_graph::builder::Optimizer;
use outcore_graph::{Graph, TensorKind};
use outcore_plan::{Gap, PlannerInfo, Restore, Schedule, lower_schedule, use_positions};
use std::collections::BTreeMap;

fn adamw_mlp() -> Graph {
    outcore_graph::zoo::build("mlp", Some(8), &BTreeMap::new(), Some(Optimizer::adamw()))
        .expect("zoo model builds")
}

#[test]
fn states_copied_out_before_their_update_train_bit_identically() {
    let graph = adamw_mlp();
    let mut schedule = Schedule::in_graph_order(&graph);
    let uses = use_positions(&graph, &schedule.order);
    for t in graph
        .tensors
        .iter()
        .filter(|t| t.kind == TensorKind::OptimizerState && t.allocates())
    {
        let first = uses[t.id.index()][0];
        assert!(first > 2, "{} is first used at {first}", t.name);
        schedule.gaps.push(Gap {
            tensor: t.id,
            after: Some(0),
            before: Some(first),
            how: Restore::Swap,
            prefetch_after: Some(first - 1),
            reclaim_before: Some(1),
        });
    }
    assert!(schedule.gaps.len() >= 4, "two states per weight");
    let info = PlannerInfo {
        name: "early-out".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let mut plan = lower_schedule(&graph, &schedule, info, 0).expect("lowers");
    // Slack for the arena's fragmentation (verify counts bytes, the
    // executor places them).
    test_plans::fit_budget(&mut plan, &graph, 1.0).expect("verifies");
    let reference = common::in_order(&graph);
    let opts = ExecOptions {
        iters: 3,
        check: true,
        ..Default::default()
    };
    let backend = || CpuBackend::new(CpuBackendOptions::default());
    let ours = execute(&graph, &plan, &backend(), &opts).expect("runs");
    let theirs = execute(&graph, &reference, &backend(), &opts).expect("runs");
    assert_eq!(ours.checks_passed, Some(true));
    assert!(
        ours.final_state() == theirs.final_state(),
        "parameters differ from the run with every tensor resident"
    );
    // The states did cross the link each iteration, both ways.
    let state_bytes: u64 = schedule
        .gaps
        .iter()
        .map(|g| graph.tensor(g.tensor).size_bytes)
        .sum();
    assert_eq!(
        (ours.swap_out_bytes, ours.swap_in_bytes),
        (state_bytes, state_bytes)
    );
}
