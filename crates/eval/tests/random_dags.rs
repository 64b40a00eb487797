//! Property test: random training DAGs with random valid swap / recompute choices,
//! in graph order and in random topological orders, lower to plans that verify
//! and simulate; corrupted plans are rejected; and the memory bound verify
//! proves is never below the simulated peak.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_eval::testing::{mixed_schedule, random_graph, random_topological_order};
use outcore_graph::Graph;
use outcore_plan::{
    Instr, PlannerInfo, Restore, Schedule, Stream, ViolationKind, lower_schedule,
    peak_over_all_timings, verify,
};
use outcore_sim::{SimOptions, simulate};
use proptest::prelude::*;

fn random_schedule(g: &Graph, decisions: &[u8], order_seed: Option<u64>) -> Schedule {
    let order = match order_seed {
        Some(seed) => random_topological_order(g, seed),
        None => Schedule::in_graph_order(g).order,
    };
    mixed_schedule(g, order, decisions)
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
        order_seed in proptest::option::of(any::<u64>()),
    ) {
        let g = random_graph(&layers, width).expect("random graph is valid");
        let s = random_schedule(&g, &decisions, order_seed);
        let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("random schedule lowers");
        let v = verify(&plan, &g);
        prop_assert!(v.is_empty(), "valid plan rejected: {}", v[0]);
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin"));
        let out = simulate(&g, &plan, &cost, &SimOptions::default()).expect("simulates");
        let r = &out.report;
        prop_assert!(r.throughput_vs_ideal > 0.0 && r.throughput_vs_ideal <= 1.0 + 1e-9);
        // The compute stream runs every op once and every recomputation on top,
        // one kernel at a time: an iteration takes at least both.
        prop_assert!(
            r.iter_time_s >= (r.ideal_time_s + r.recompute_time_s) * (1.0 - 1e-9),
            "iteration {} s < ideal {} s + recompute {} s",
            r.iter_time_s,
            r.ideal_time_s,
            r.recompute_time_s
        );

        // Soundness of the memory bound: the simulation is one timing, the
        // enumeration every timing, and a budget one byte under the latter
        // must be reported as over budget.
        let exact = peak_over_all_timings(&plan, &g).expect("the plan is safe");
        prop_assert!(
            exact >= r.peak_live_bytes,
            "the peak over all timings {} is below the simulated one {}",
            exact,
            r.peak_live_bytes
        );
        let mut tight = plan.clone();
        tight.budget_bytes = exact - 1;
        prop_assert!(
            verify(&tight, &g).iter().any(|v| matches!(v.kind, ViolationKind::OverBudget { .. })),
            "verify accepts a budget below the peak over all timings"
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
    let g = random_graph(&layers, 16).expect("random graph is valid");
    let s = random_schedule(&g, &[1, 2, 2, 1, 0], None);
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
