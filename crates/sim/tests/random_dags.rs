//! Property test: random training DAGs with random valid swap / recompute choices
//! lower to plans that verify and simulate; corrupted plans are rejected; and the
//! memory bound verify proves is never below the simulated peak.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, TensorId, TensorKind};
use outcore_plan::{
    Gap, Instr, PlannerInfo, Restore, Schedule, Stream, ViolationKind, lower_schedule,
    use_positions, verify,
};
use outcore_sim::{SimOptions, simulate};
use proptest::prelude::*;

/// Builds a random DAG of linear / relu / add layers over `[batch, width]` tensors.
fn random_graph(choices: &[u8], width: u64) -> Graph {
    let mut b = GraphBuilder::new("random", 4, DType::Float32);
    let x = b.input("x", &[4, width]);
    let y = b.label("y", &[4]);
    let mut pool = vec![b.linear("in", x, width, true)];
    for (i, &c) in choices.iter().enumerate() {
        let pick = |k: u8| pool[(k as usize) % pool.len()];
        let t = match c % 4 {
            0 => b.linear(&format!("fc{i}"), pick(c / 4), width, c % 8 == 0),
            1 => b.relu(pick(c / 4)),
            2 => {
                let (a, z) = (pick(c / 4), pick(c / 16 + 1));
                if a == z { b.relu(a) } else { b.add(&[a, z]) }
            }
            _ => b.gelu(pick(c / 4)),
        };
        pool.push(t);
    }
    let last = *pool.last().unwrap_or(&x);
    let logits = b.linear("head", last, 10, true);
    let loss = b.softmax_cross_entropy(logits, y);
    b.finish(loss, Optimizer::sgd_momentum())
        .expect("random graph is valid")
}

/// Random gaps: each activation with a long enough interval between uses is swapped
/// or recomputed by `decisions`; recomputation only where the producer's inputs
/// stay resident (they are then kept free of gaps).
fn random_schedule(g: &Graph, decisions: &[u8]) -> Schedule {
    let mut s = Schedule::in_graph_order(g);
    let uses = use_positions(g, &s.order);
    let mut pinned = vec![false; g.tensors.len()];
    let mut gapped = vec![false; g.tensors.len()];
    let mut k = 0;
    let activations: Vec<TensorId> = g
        .tensors
        .iter()
        .filter(|t| t.allocates() && t.kind == TensorKind::Activation)
        .map(|t| t.id)
        .collect();
    // Latest first, so that a recomputation can pin its (earlier) inputs.
    for &t in activations.iter().rev() {
        if pinned[t.index()] {
            continue;
        }
        let u = &uses[t.index()];
        for w in u.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b - a < 2 {
                continue;
            }
            let d = decisions[k % decisions.len()];
            k += 1;
            match d % 3 {
                0 => {}
                1 => {
                    s.gaps.push(Gap {
                        tensor: t,
                        after: Some(a),
                        before: Some(b),
                        how: Restore::Swap,
                        prefetch_after: Some(a + (b - a - 1) * (d as usize % 4) / 4),
                        reclaim_before: if d.is_multiple_of(2) { Some(b) } else { None },
                    });
                    gapped[t.index()] = true;
                }
                _ => {
                    let producer = g.tensor(t).producer.map(|p| g.op(p));
                    let Some(op) = producer else { continue };
                    let inputs: Vec<TensorId> = op
                        .inputs
                        .iter()
                        .map(|&i| g.storage_owner(i))
                        .filter(|i| !g.tensor(*i).is_persistent())
                        .collect();
                    let ok = op.recomputable
                        && inputs.iter().all(|i| {
                            !gapped[i.index()] && uses[i.index()].last().is_some_and(|&l| l >= b)
                        });
                    if ok {
                        for i in inputs {
                            pinned[i.index()] = true;
                        }
                        s.gaps.push(Gap {
                            tensor: t,
                            after: Some(a),
                            before: Some(b),
                            how: Restore::Recompute,
                            prefetch_after: None,
                            reclaim_before: None,
                        });
                        gapped[t.index()] = true;
                    }
                }
            }
        }
    }
    s
}

fn info() -> PlannerInfo {
    PlannerInfo {
        name: "random".into(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_plans_verify_simulate_and_resist_corruption(
        layers in proptest::collection::vec(any::<u8>(), 3..24),
        decisions in proptest::collection::vec(any::<u8>(), 1..16),
        width in 8u64..64,
    ) {
        let g = random_graph(&layers, width);
        let s = random_schedule(&g, &decisions);
        let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("random schedule lowers");
        let v = verify(&plan, &g);
        prop_assert!(v.is_empty(), "valid plan rejected: {}", v[0]);
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin"));
        let out = simulate(&g, &plan, &cost, &SimOptions::default()).expect("simulates");
        let r = &out.report;
        prop_assert!(r.throughput_vs_ideal > 0.0 && r.throughput_vs_ideal <= 1.0 + 1e-9);
        prop_assert!(r.iter_time_s >= r.ideal_time_s * (1.0 - 1e-9) + r.recompute_time_s * 0.0);

        // Soundness of the memory bound: a budget one byte under the simulated
        // peak must be reported as over budget.
        let mut tight = plan.clone();
        tight.budget_bytes = r.peak_live_bytes - 1;
        prop_assert!(
            verify(&tight, &g).iter().any(|v| matches!(v.kind, ViolationKind::OverBudget { .. })),
            "verify accepts a budget below the simulated peak"
        );

        // Corruption 1: a compute step stops waiting for its swap-in.
        let waiting = plan.streams[Stream::Compute.index()]
            .iter()
            .position(|st| st.waits.iter().any(|w| w.stream == Stream::H2d));
        if let Some(i) = waiting {
            let mut broken = plan.clone();
            broken.streams[Stream::Compute.index()][i].waits.retain(|w| w.stream != Stream::H2d);
            prop_assert!(!verify(&broken, &g).is_empty(), "a race on a swap-in is not caught");
        }
        // Corruption 2: a free disappears (the plan would leak every iteration).
        let free = plan.streams[Stream::Compute.index()]
            .iter()
            .position(|st| matches!(st.instr, Instr::Free(_)))
            .expect("plans free tensors");
        let mut broken = plan.clone();
        broken.streams[Stream::Compute.index()].remove(free);
        prop_assert!(!verify(&broken, &g).is_empty(), "a leak is not caught");
        // Corruption 3: a recomputation is dropped.
        let rec = plan.streams[Stream::Compute.index()]
            .iter()
            .position(|st| matches!(st.instr, Instr::Recompute { .. }));
        if let Some(i) = rec {
            let mut broken = plan.clone();
            broken.streams[Stream::Compute.index()].remove(i);
            prop_assert!(!verify(&broken, &g).is_empty(), "a missing recomputation is not caught");
        }
    }
}

#[test]
fn the_generator_makes_both_kinds_of_gap() {
    // A deep chain of relus and linears keeps activations alive into backward.
    let layers: Vec<u8> = (0..20).map(|i| if i % 2 == 0 { 1 } else { 0 }).collect();
    let g = random_graph(&layers, 16);
    let s = random_schedule(&g, &[1, 2, 2, 1, 0]);
    let swaps = s.gaps.iter().filter(|g| g.how == Restore::Swap).count();
    let recomputes = s
        .gaps
        .iter()
        .filter(|g| g.how == Restore::Recompute)
        .count();
    assert!(
        swaps > 0 && recomputes > 0,
        "swaps {swaps}, recomputes {recomputes}"
    );
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
}
