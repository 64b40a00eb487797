//! Prints what `window`, `capuchin` and `odswap` achieve (ignored by default:
//! `cargo test --release -p outcore-planners --test report_b -- --ignored --nocapture`).

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_plan::{PlanOutcome, PlanRequest};
use outcore_sim::{SimOptions, simulate};

#[allow(clippy::print_stdout)] // the report is the point of these ignored tests
fn report(model: &str, batch: u64, fractions: &[f64]) {
    let device = DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin device");
    let cost = RooflineModel::new(device);
    let graph = outcore_graph::zoo::build(model, Some(batch), &Default::default(), None)
        .expect("zoo model");
    let (footprint_bytes, _) = outcore_graph::footprint(&graph);
    for &fraction in fractions {
        for name in ["window", "capuchin", "odswap"] {
            let planner = outcore_planners::by_name(name).expect("registered");
            let started = std::time::Instant::now();
            let outcome = planner.plan(&PlanRequest {
                graph: &graph,
                cost: &cost,
                budget_bytes: (footprint_bytes as f64 * fraction) as u64,
                seed: 0,
                time_limit_s: 60.0,
            });
            let planning_s = started.elapsed().as_secs_f64();
            match outcome {
                PlanOutcome::Feasible(plan) => {
                    let r = simulate(&graph, &plan, &cost, &SimOptions::default())
                        .expect("simulates")
                        .report;
                    println!(
                        "{model} b{batch} {fraction} {name}: throughput_vs_ideal {:.3} swap-in {} MB recompute {:.4} s planning {planning_s:.1} s settings {}",
                        r.throughput_vs_ideal,
                        r.swap_in_bytes / 1_000_000,
                        r.recompute_time_s,
                        plan.planner.settings
                    );
                }
                PlanOutcome::Infeasible { reason } => {
                    println!("{model} b{batch} {fraction} {name}: infeasible: {reason}")
                }
            }
        }
    }
}

#[test]
#[ignore = "prints a report; slow in debug builds"]
fn report_resnet50_b64() {
    report("resnet50", 64, &[0.5, 0.25]);
}

#[test]
#[ignore = "prints a report"]
fn report_small_models() {
    for model in ["resnet18", "mobilenet_v2", "mlp", "lstm"] {
        report(model, 2, &[0.5, 0.25, 0.125]);
    }
}
