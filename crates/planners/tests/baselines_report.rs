//! Prints a throughput table of the baseline planners (run with `--ignored
//! --nocapture`): ResNet-50 at batch 64 on v100-16gb-pcie3 at 50% and 25% of
//! the footprint, plus the models of the conformance test at small batches.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint};
use outcore_plan::{PlanOutcome, PlanRequest};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

const PLANNERS: [&str; 8] = [
    "vdnn-all",
    "vdnn-conv",
    "vdnn-all-sync",
    "vdnn-conv-sync",
    "checkpoint-all",
    "checkpoint-sqrt",
    "superneurons",
    "lms",
];

fn row(g: &Graph, label: &str, fractions: &[f64]) {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let (footprint_bytes, _) = footprint(g);
    for &fraction in fractions {
        let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
        for name in PLANNERS {
            let planner = outcore_planners::by_name(name).expect("registered");
            let request = PlanRequest {
                graph: g,
                cost: &cost,
                budget_bytes,
                seed: 0,
                time_limit_s: 60.0,
            };
            let started = std::time::Instant::now();
            let outcome = planner.plan(&request);
            let plan_s = started.elapsed().as_secs_f64();
            match outcome {
                PlanOutcome::Feasible(plan) => {
                    let t = simulate(g, &plan, &cost, &SimOptions::default())
                        .map(|o| o.report.throughput_vs_ideal)
                        .unwrap_or(f64::NAN);
                    eprintln!(
                        "{label} {:>5.1}% {name:<16} throughput_vs_ideal {t:.3} (planned in {plan_s:.2} s) {}",
                        fraction * 100.0,
                        plan.planner.settings
                    );
                }
                PlanOutcome::Infeasible { reason } => {
                    eprintln!(
                        "{label} {:>5.1}% {name:<16} infeasible: {reason}",
                        fraction * 100.0
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "report: prints throughputs, slow"]
fn resnet50_b64_table() {
    let g = outcore_graph::zoo::build("resnet50", Some(64), &BTreeMap::new(), None).expect("zoo");
    row(&g, "resnet50/b64", &[0.5, 0.25]);
}

#[test]
#[ignore = "report: prints throughputs"]
fn small_models_table() {
    for name in [
        "resnet18",
        "mobilenet_v2",
        "densenet121",
        "lstm",
        "tiny-cnn",
        "mlp",
    ] {
        let g = outcore_graph::zoo::build(name, Some(2), &BTreeMap::new(), None).expect("zoo");
        row(&g, name, &[0.5, 0.25]);
    }
}
