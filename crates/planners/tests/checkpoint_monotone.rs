//! Throughput of every recompute-only planner is monotone in the budget: on
//! (small versions of) zoo ResNet-50, Inception-v3, DenseNet-121, BERT-base,
//! GPT-2 and an LSTM, at 10 budgets from 100% of the footprint down to the
//! smallest feasible one (found by bisection), every budget is feasible and a
//! larger budget never gives a slower plan. The planners are the three
//! checkpoint segmentations and `dtr` (greedy, so this is a measurement at
//! these budgets, not a property it guarantees). The full-size sweeps are the
//! examples `recompute_budget_sweep` and `recompute_table` (numbers in
//! RESULTS.md).

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

const PLANNERS: [&str; 4] = [
    "checkpoint-sqrt",
    "checkpoint-greedy",
    "checkpoint-all",
    "dtr",
];

fn model(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    zoo::build(name, Some(batch), &knobs, None).expect("zoo model builds")
}

/// Throughput vs ideal of the planner's plan at `fraction` of the footprint,
/// `None` when infeasible.
fn throughput(name: &str, g: &Graph, cost: &RooflineModel, fraction: f64) -> Option<f64> {
    let budget_bytes = (footprint(g).0 as f64 * fraction) as u64;
    let planner = outcore_planners::by_name(name).expect("registered");
    match planner.plan(&PlanRequest::new(g, cost, budget_bytes)) {
        Ok(PlanOutcome::Feasible(plan)) => {
            assert!(verify(&plan, g).is_empty(), "{name} does not verify");
            let report = simulate(g, &plan, cost, &SimOptions::default())
                .expect("simulates")
                .report;
            Some(report.throughput_vs_ideal)
        }
        Ok(PlanOutcome::Infeasible(_)) => None,
        Err(e) => panic!("{name} on {}: {e}", g.meta.model),
    }
}

/// The smallest feasible fraction of the footprint, to within 1/128.
fn smallest_feasible(name: &str, g: &Graph, cost: &RooflineModel) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..7 {
        let mid = (lo + hi) / 2.0;
        if throughput(name, g, cost, mid).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// 10 budgets from 1.0 down to the smallest feasible fraction: throughput never
/// rises as the budget falls, and every one is feasible.
fn check_monotone(g: &Graph, cost: &RooflineModel) {
    for name in PLANNERS {
        let f_min = smallest_feasible(name, g, cost);
        let mut previous: Option<(f64, f64)> = None;
        for i in 0..10 {
            let fraction = 1.0 - (1.0 - f_min) * i as f64 / 9.0;
            let t = throughput(name, g, cost, fraction).unwrap_or_else(|| {
                panic!(
                    "{name} on {}: infeasible at {fraction:.3} although feasible at {f_min:.3}",
                    g.meta.model
                )
            });
            if let Some((f_prev, t_prev)) = previous {
                assert!(
                    t <= t_prev + 1e-9,
                    "{name} on {}: {t:.4} at {fraction:.3} of the footprint but {t_prev:.4} at {f_prev:.3}",
                    g.meta.model
                );
            }
            previous = Some((fraction, t));
        }
        let (_, t_min) = previous.expect("ten budgets");
        eprintln!(
            "{name} on {}: feasible down to {f_min:.3}, throughput {t_min:.3} there",
            g.meta.model
        );
    }
}

fn cost() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"))
}

#[test]
fn cnns_are_monotone_in_the_budget() {
    let cost = cost();
    for g in [
        model("resnet50", 16, &[]),
        model("inception_v3", 16, &[]),
        model("densenet121", 16, &[]),
    ] {
        check_monotone(&g, &cost);
    }
}

#[test]
fn sequence_models_are_monotone_in_the_budget() {
    let cost = cost();
    for g in [
        model("bert-base", 32, &[("layers", 4), ("seq", 128)]),
        model("gpt2", 16, &[("layers", 4), ("seq", 256)]),
        model(
            "lstm",
            128,
            &[("layers", 2), ("hidden", 512), ("seq", 32), ("vocab", 1000)],
        ),
    ] {
        check_monotone(&g, &cost);
    }
}
