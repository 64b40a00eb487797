//! Conformance of every planner (`outcore_planners::all()`) on every zoo model at
//! batch 1 (large defaults shrunk by knobs) and on the two example graphs in
//! crates/graph/tests/data, at budgets of 100%, 50%, 25% and 12.5% of the footprint
//! on v100-16gb-pcie3: either a plan that verifies and simulates with a
//! throughput against ideal in (0, 1], or an infeasibility with a reason. No
//! panics: each (planner, model, budget) runs under `catch_unwind`, and every
//! panic is reported by name before the test fails. At 100% every planner must
//! return a plan with throughput 1.0.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint};
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

const BUDGET_FRACTIONS: [f64; 4] = [1.0, 0.5, 0.25, 0.125];

const EXAMPLE_GRAPHS: [&str; 2] = ["vgg16_b32.json", "mobilenet_v2_b64.json"];

/// Knobs that keep a model's graph moderate at batch 1.
fn knobs_for(info: &outcore_graph::zoo::ModelInfo) -> BTreeMap<String, u64> {
    let mut knobs = BTreeMap::new();
    let has = |k: &str| info.knobs.iter().find(|x| x.name == k).map(|x| x.default);
    let recurrent = matches!(info.name, "lstm" | "brnn");
    if let Some(seq) = has("seq") {
        knobs.insert("seq".into(), seq.min(if recurrent { 8 } else { 32 }));
    }
    if !recurrent && let Some(layers) = has("layers") {
        knobs.insert("layers".into(), layers.min(4));
    }
    if let Some(repeats) = has("repeats") {
        knobs.insert("repeats".into(), repeats.min(1));
    }
    if let Some(size) = has("size") {
        knobs.insert("size".into(), size.min(128));
    }
    knobs
}

fn graphs() -> Vec<(String, Graph)> {
    let mut out = Vec::new();
    for info in outcore_graph::zoo::models() {
        let knobs = knobs_for(&info);
        let g = outcore_graph::zoo::build(info.name, Some(1), &knobs, None)
            .unwrap_or_else(|e| panic!("zoo {} with {knobs:?}: {e}", info.name));
        out.push((info.name.to_string(), g));
    }
    for file in EXAMPLE_GRAPHS {
        // In the repository, so that a missing file is a failure, never a skip.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../graph/tests/data")
            .join(file);
        let g = outcore_graph::format::load_graph_file(&path)
            .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
        out.push((file.to_string(), g));
    }
    out
}

/// What one (planner, model, budget) came to.
enum Outcome {
    Feasible,
    Infeasible,
    /// The contract is broken (a plan that does not verify, a bad throughput,
    /// an empty reason, infeasible at 100%).
    Broken(String),
}

fn check(
    planner: &dyn outcore_plan::Planner,
    g: &Graph,
    cost: &RooflineModel,
    fraction: f64,
    budget_bytes: u64,
) -> Outcome {
    let request = PlanRequest {
        graph: g,
        cost,
        budget_bytes,
        seed: 0,
        time_limit_s: 10.0,
        allocator: &outcore_plan::AllocatorSpec::Perfect,
    };
    match planner.plan(&request) {
        PlanOutcome::Feasible(plan) => {
            let violations = verify(&plan, g);
            if let Some(v) = violations.first() {
                return Outcome::Broken(format!(
                    "{} verify violations, first: {v}",
                    violations.len()
                ));
            }
            let report = match simulate(g, &plan, cost, &SimOptions::default()) {
                Ok(out) => out.report,
                Err(e) => return Outcome::Broken(format!("does not simulate: {e}")),
            };
            let t = report.throughput_vs_ideal;
            if !(t > 0.0 && t <= 1.0 + 1e-9) {
                return Outcome::Broken(format!("throughput vs ideal {t}"));
            }
            if fraction == 1.0 && (t - 1.0).abs() > 1e-9 {
                return Outcome::Broken(format!("throughput vs ideal {t} at the footprint"));
            }
            Outcome::Feasible
        }
        PlanOutcome::Infeasible { reason } => {
            if fraction == 1.0 {
                Outcome::Broken(format!("infeasible at the footprint: {reason}"))
            } else if reason.trim().is_empty() {
                Outcome::Broken("infeasible with an empty reason".into())
            } else {
                Outcome::Infeasible
            }
        }
    }
}

#[test]
fn every_planner_verifies_or_explains_on_every_model_and_budget() {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let started = Instant::now();
    let graphs = graphs();
    let planners = outcore_planners::all();
    // Per planner: feasible, infeasible, seconds.
    let mut tally: BTreeMap<&'static str, (usize, usize, f64)> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    let mut slowest: Vec<(f64, String)> = Vec::new();
    for (model, g) in &graphs {
        let (footprint_bytes, _) = footprint(g);
        for fraction in BUDGET_FRACTIONS {
            let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
            for planner in &planners {
                let name = planner.name();
                let t0 = Instant::now();
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    check(planner.as_ref(), g, &cost, fraction, budget_bytes)
                }));
                let secs = t0.elapsed().as_secs_f64();
                slowest.push((secs, format!("{name} on {model} at {fraction}")));
                let entry = tally.entry(name).or_insert((0, 0, 0.0));
                entry.2 += secs;
                match outcome {
                    Ok(Outcome::Feasible) => entry.0 += 1,
                    Ok(Outcome::Infeasible) => entry.1 += 1,
                    Ok(Outcome::Broken(why)) => {
                        failures.push(format!("{name} on {model} at {fraction}: {why}"));
                    }
                    Err(_) => failures.push(format!("{name} on {model} at {fraction}: PANICKED")),
                }
            }
        }
    }
    let runs = graphs.len() * BUDGET_FRACTIONS.len();
    eprintln!(
        "conformance_all: {} graphs x {} budgets x {} planners in {:.1} s",
        graphs.len(),
        BUDGET_FRACTIONS.len(),
        planners.len(),
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "{:<16} {:>8} {:>10} {:>8}",
        "planner", "feasible", "infeasible", "secs"
    );
    for (name, (feasible, infeasible, secs)) in &tally {
        eprintln!("{name:<16} {feasible:>4}/{runs:<3} {infeasible:>10} {secs:>8.1}");
    }
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (secs, what) in slowest.iter().take(5) {
        eprintln!("slowest: {secs:.2} s {what}");
    }
    // The main algorithm must find plans below the footprint, not only at it.
    let window_feasible = tally.get("window").map_or(0, |t| t.0);
    assert!(
        window_feasible > graphs.len(),
        "window is feasible only {window_feasible} times over {} graphs",
        graphs.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
