//! Conformance of the baseline planners (vDNN, checkpointing, SuperNeurons, LMS)
//! on zoo models and the shared VGG-16 graph: at every budget, a verified plan
//! whose simulated throughput is in (0, 1], or an infeasibility with a reason.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint};
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

const BASELINES: [&str; 8] = [
    "vdnn-all",
    "vdnn-conv",
    "vdnn-all-sync",
    "vdnn-conv-sync",
    "checkpoint-all",
    "checkpoint-sqrt",
    "superneurons",
    "lms",
];

/// Budgets as fractions of the footprint.
const BUDGET_FRACTIONS: [f64; 4] = [1.0, 0.5, 0.25, 0.125];

fn graphs() -> Vec<(String, Graph)> {
    let mut out = Vec::new();
    for name in [
        "resnet18",
        "mobilenet_v2",
        "densenet121",
        "bert-base",
        "lstm",
        "tiny-cnn",
        "mlp",
    ] {
        let mut knobs = BTreeMap::new();
        if name == "bert-base" {
            knobs.insert("seq".to_string(), 32);
        }
        let g = outcore_graph::zoo::build(name, Some(2), &knobs, None)
            .unwrap_or_else(|e| panic!("zoo {name}: {e}"));
        out.push((name.to_string(), g));
    }
    let vgg = std::path::Path::new("/work/shared/graphs/vgg16_b32.json");
    if vgg.exists() {
        let g = outcore_graph::format::load_graph_file(vgg).expect("load vgg16_b32.json");
        out.push(("vgg16_b32.json".into(), g));
    }
    out
}

#[test]
fn baselines_verify_or_explain_at_every_budget() {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let started = std::time::Instant::now();
    let mut feasible = 0usize;
    let mut infeasible = 0usize;
    for (model, g) in graphs() {
        let (footprint_bytes, _) = footprint(&g);
        for fraction in BUDGET_FRACTIONS {
            let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
            for name in BASELINES {
                let planner = outcore_planners::by_name(name).expect("registered");
                let request = PlanRequest {
                    graph: &g,
                    cost: &cost,
                    budget_bytes,
                    seed: 0,
                    time_limit_s: 10.0,
                };
                match planner.plan(&request) {
                    PlanOutcome::Feasible(plan) => {
                        let violations = verify(&plan, &g);
                        assert!(
                            violations.is_empty(),
                            "{name} on {model} at {fraction}: {}",
                            violations[0]
                        );
                        let report = simulate(&g, &plan, &cost, &SimOptions::default())
                            .expect("simulates")
                            .report;
                        let t = report.throughput_vs_ideal;
                        assert!(
                            t > 0.0 && t <= 1.0 + 1e-9,
                            "{name} on {model} at {fraction}: throughput {t}"
                        );
                        if fraction == 1.0 {
                            assert!((t - 1.0).abs() < 1e-9, "{name} on {model} at 100%: {t}");
                        }
                        feasible += 1;
                    }
                    PlanOutcome::Infeasible { reason } => {
                        assert!(fraction < 1.0, "{name} on {model} at 100%: {reason}");
                        assert!(!reason.is_empty());
                        infeasible += 1;
                    }
                }
            }
        }
    }
    eprintln!(
        "{feasible} feasible, {infeasible} infeasible in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(feasible > 0);
}
