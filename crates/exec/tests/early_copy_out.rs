//! Optimizer states copied out early in the iteration, before their first
//! use (the previous iteration left them on the device after their update),
//! and back for their update: training with such a plan is bit-identical to
//! training with every tensor resident, over several iterations, with every
//! host copy checked. So is training with copy-outs delayed past their
//! gaps' starts.

mod common;

use outcore_exec::{CpuBackend, CpuBackendOptions, ExecOptions, execute, test_plans};
use outcore_graph::builder::Optimizer;
use outcore_graph::{Graph, TensorId, TensorKind};
use outcore_plan::{Gap, PlannerInfo, Restore, Schedule, lower_schedule, use_positions};
use std::collections::BTreeMap;

fn adamw_mlp() -> Graph {
    outcore_graph::zoo::build("mlp", Some(8), &BTreeMap::new(), Some(Optimizer::adamw()))
        .expect("zoo model builds")
}

/// `schedule` lowered, fitted to a budget and run for 3 iterations with
/// every host copy checked: its parameters at the end must equal those of
/// the run with every tensor resident. Its report.
fn trains_as_if_resident(graph: &Graph, schedule: &Schedule) -> outcore_exec::RunReport {
    let info = PlannerInfo {
        name: "early-copy".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let mut plan = lower_schedule(graph, schedule, info, 0).expect("lowers");
    // Slack for the arena's fragmentation (verify counts bytes, the
    // executor places them).
    test_plans::fit_budget(&mut plan, graph, 1.0).expect("verifies");
    let reference = common::in_order(graph);
    let opts = ExecOptions {
        iters: 3,
        check: true,
        ..Default::default()
    };
    let backend = || CpuBackend::new(CpuBackendOptions::default());
    let ours = execute(graph, &plan, &backend(), &opts).expect("runs");
    let theirs = execute(graph, &reference, &backend(), &opts).expect("runs");
    assert_eq!(ours.checks_passed, Some(true));
    assert!(
        ours.final_state() == theirs.final_state(),
        "parameters differ from the run with every tensor resident"
    );
    ours
}

/// A swap of `t` over `(after, before)`, reclaimed at `reclaim`, swapped in
/// after the op before its use, its copy-out after position `copy`.
fn swap_copied_after(t: TensorId, after: usize, before: usize, reclaim: usize, copy: usize) -> Gap {
    Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(before - 1),
        reclaim_before: Some(reclaim),
        copy_out_after: Some(copy),
    }
}

/// `schedule` swaps at least three activations and three weights, trains
/// as if every tensor were resident, and moves `moved_bytes` each way per
/// iteration.
fn trains_moving_activations_and_weights(graph: &Graph, schedule: &Schedule, moved_bytes: u64) {
    let kinds = |k: TensorKind| {
        schedule
            .gaps
            .iter()
            .filter(|g| graph.tensor(g.tensor).kind == k)
            .count()
    };
    assert!(kinds(TensorKind::Activation) >= 3, "{:?}", schedule.gaps);
    assert!(kinds(TensorKind::Parameter) >= 3, "{:?}", schedule.gaps);
    let ours = trains_as_if_resident(graph, schedule);
    assert_eq!(
        (ours.swap_out_bytes, ours.swap_in_bytes),
        (moved_bytes, moved_bytes)
    );
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
            copy_out_after: None,
        });
    }
    assert!(schedule.gaps.len() >= 4, "two states per weight");
    let ours = trains_as_if_resident(&graph, &schedule);
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

/// Swaps whose copy-outs start early (`Gap::copy_out_after`): each saved
/// activation copied out right after the op that makes it and freed after
/// its last forward read, each weight copied out from the first op (on the
/// device at the start, its host copy stale) and freed after its forward
/// read. Training is bit-identical to training with every tensor resident,
/// with every host copy checked, and each of those tensors crossed the link
/// once each way per iteration.
#[test]
fn tensors_copied_out_before_their_gaps_train_bit_identically() {
    let graph = adamw_mlp();
    let mut schedule = Schedule::in_graph_order(&graph);
    let uses = use_positions(&graph, &schedule.order);
    let mut moved_bytes = 0;
    for t in graph.tensors.iter().filter(|t| t.allocates()) {
        let u = &uses[t.id.index()];
        let (copy, after, before) = match t.kind {
            // Made at u[0], read last in the forward pass at u[k], next in
            // the backward pass: the widest gap between two uses.
            TensorKind::Activation if u.len() >= 3 => {
                let k = (1..u.len() - 1)
                    .max_by_key(|&k| u[k + 1] - u[k])
                    .expect("two gaps");
                (u[0], u[k], u[k + 1])
            }
            TensorKind::Parameter if u.len() >= 3 && u[0] > 0 => (0, u[0], u[1]),
            _ => continue,
        };
        if before <= after + 1 || copy >= after {
            continue;
        }
        schedule
            .gaps
            .push(swap_copied_after(t.id, after, before, after + 1, copy));
        moved_bytes += t.size_bytes;
    }
    trains_moving_activations_and_weights(&graph, &schedule, moved_bytes);
}

/// Swaps whose copy-outs are delayed (`Gap::copy_out_after` past the gap's
/// start): each saved activation and each weight stays resident, unread,
/// for one more op after its last forward read, then is copied out and
/// freed on the d2h stream, and comes back for the backward pass. Training
/// is bit-identical to training with every tensor resident, with every host
/// copy checked, and each of those tensors crossed the link once each way
/// per iteration.
#[test]
fn tensors_copied_out_after_a_delay_train_bit_identically() {
    let graph = adamw_mlp();
    let mut schedule = Schedule::in_graph_order(&graph);
    let uses = use_positions(&graph, &schedule.order);
    let mut moved_bytes = 0;
    for t in graph.tensors.iter().filter(|t| t.allocates()) {
        let u = &uses[t.id.index()];
        if !matches!(t.kind, TensorKind::Activation | TensorKind::Parameter) || u.len() < 2 {
            continue;
        }
        // The widest gap between two uses, if it leaves room for the delay.
        let k = (0..u.len() - 1)
            .max_by_key(|&k| u[k + 1] - u[k])
            .expect("one gap");
        let (after, before) = (u[k], u[k + 1]);
        if before <= after + 2 {
            continue;
        }
        schedule
            .gaps
            .push(swap_copied_after(t.id, after, before, after + 2, after + 1));
        moved_bytes += t.size_bytes;
    }
    trains_moving_activations_and_weights(&graph, &schedule, moved_bytes);
}
