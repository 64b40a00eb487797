//! Conformance of `window`, `capuchin` and `odswap` on zoo models and a graph file
//! at 100%, 50%, 25% and 12.5% of the footprint: a verified plan with throughput in
//! (0, 1], or Infeasible with a reason; at 100% the plan equals `none`'s.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::Graph;
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

const PLANNERS: [&str; 3] = ["window", "capuchin", "odswap"];
const BUDGET_FRACTIONS: [f64; 4] = [1.0, 0.5, 0.25, 0.125];

fn zoo(name: &str, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    match outcore_graph::zoo::build(name, Some(2), &knobs, None) {
        Ok(g) => g,
        Err(e) => panic!("zoo {name}: {e}"),
    }
}

fn graphs() -> Vec<(String, Graph)> {
    let mut out: Vec<(String, Graph)> = [
        ("resnet18", vec![]),
        ("mobilenet_v2", vec![]),
        ("densenet121", vec![]),
        ("bert-base", vec![("seq", 32)]),
        ("lstm", vec![]),
        ("tiny-cnn", vec![]),
        ("mlp", vec![]),
    ]
    .into_iter()
    .map(|(name, knobs)| (name.to_string(), zoo(name, &knobs)))
    .collect();
    let path = std::path::Path::new("/work/shared/graphs/mobilenet_v2_b64.json");
    if path.exists() {
        match outcore_graph::format::load_graph_file(path) {
            Ok(g) => out.push(("mobilenet_v2_b64.json".into(), g)),
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }
    out
}

#[test]
fn planners_b_conform_on_zoo_models_and_a_graph_file() {
    let device = DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin device");
    let cost = RooflineModel::new(device);
    let mut feasible_below_footprint = 0usize;
    for (model, graph) in graphs() {
        let (footprint_bytes, _) = outcore_graph::footprint(&graph);
        let none_plan = outcore_planners::by_name("none")
            .expect("none")
            .plan(&PlanRequest {
                graph: &graph,
                cost: &cost,
                budget_bytes: footprint_bytes,
                seed: 0,
                time_limit_s: 10.0,
            });
        for name in PLANNERS {
            let planner = outcore_planners::by_name(name).expect("registered");
            for fraction in BUDGET_FRACTIONS {
                let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
                let request = PlanRequest {
                    graph: &graph,
                    cost: &cost,
                    budget_bytes,
                    seed: 0,
                    time_limit_s: 10.0,
                };
                match planner.plan(&request) {
                    PlanOutcome::Feasible(plan) => {
                        let violations = verify(&plan, &graph);
                        assert!(
                            violations.is_empty(),
                            "{name} on {model} at {fraction}: {}",
                            violations[0]
                        );
                        let report = simulate(&graph, &plan, &cost, &SimOptions::default())
                            .expect("simulates")
                            .report;
                        let tp = report.throughput_vs_ideal;
                        assert!(
                            tp > 0.0 && tp <= 1.0 + 1e-9,
                            "{name} on {model} at {fraction}: throughput {tp}"
                        );
                        if fraction == 1.0 {
                            let none = none_plan.plan().expect("none fits the footprint");
                            assert_eq!(plan.streams, none.streams, "{name} on {model} at 100%");
                            assert!((tp - 1.0).abs() < 1e-9, "{name} on {model} at 100%: {tp}");
                        } else {
                            feasible_below_footprint += 1;
                        }
                    }
                    PlanOutcome::Infeasible { reason } => {
                        assert!(
                            fraction < 1.0,
                            "{name} on {model} infeasible at 100%: {reason}"
                        );
                        assert!(!reason.is_empty());
                    }
                }
            }
        }
    }
    assert!(
        feasible_below_footprint > 0,
        "no planner found any plan below the footprint"
    );
}
