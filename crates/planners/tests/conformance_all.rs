//! Conformance of every planner (`outcore_planners::all()`) on every zoo model at
//! batch 32 (large defaults shrunk by knobs, so that activations dominate the
//! footprint and the run stays short) and on the two example graphs in
//! crates/graph/tests/data (in the repository), on v100-16gb-pcie3: at 100% of the footprint in graph
//! order, and at 70% and 50% in graph order and in a seeded random topological
//! order. Each run is either a plan that verifies and simulates with a
//! throughput against ideal in (0, 1], or an infeasibility with a message; a
//! `PlannerError` fails the test. No panics: each run is under `catch_unwind`,
//! and every panic is reported by name before the test fails. At 100% every
//! planner must return a plan with throughput 1.0. Each planner must be
//! feasible at least a measured number of times (`MIN_FEASIBLE`).

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, OpId, footprint};
use outcore_plan::{PlanOutcome, PlanRequest, random_topological_order, verify};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// (fraction of the footprint, in a random order too).
const BUDGETS: [(f64, bool); 3] = [(1.0, false), (0.7, true), (0.5, true)];

/// The batch of the zoo models.
const BATCH: u64 = 32;

/// Seed of the random topological orders.
const ORDER_SEED: u64 = 1;

/// The runs there are (35 graphs x 5): a missing example graph lowers every
/// floor by its runs.
const MEASURED_RUNS: usize = 175;

/// Feasible runs per planner, at least. Most floors were measured when the zoo
/// had 29 graphs (145 runs) and hold for the 175 of today. Measured on the commit that set them: capuchin 85,
/// checkpoint-all 79, checkpoint-sqrt 79, ideal 145, lms 88, none 29, odswap
/// 86, superneurons 72, swapadvisor 111 (its quick form below), vdnn-all 84,
/// vdnn-all-sync 90, vdnn-conv 52, vdnn-conv-sync 56, window 132; each floor is about 5% below (ideal and
/// none exact), so that a change losing a case or two passes but a collapse
/// does not. checkpoint-greedy was added later, feasible 82 times (and
/// checkpoint-all and checkpoint-sqrt 84 each with it). outcore (its quick
/// form below) was added later still, feasible 134 times, and is checked to be
/// feasible on every run where any other planner is. `dtr` was measured at 96
/// on the commit that added it, where the lowering's earlier freeing of chain
/// links also took the three checkpoint planners to 86 and superneurons to 74
/// (their floors are unchanged). `home` (its quick form below) joined at 35
/// graphs (175 runs), feasible 111 times (floor 105); there `ideal` was
/// feasible 175 times and `none` 35 (their floors, exact again).
/// `tensile` joined later still, from `ablations()` (not one of `outcore`'s
/// seeds then), feasible 43 times (floor 40): every 100% run and 8 of the 140
/// at 70% and 50%. Once its peak analysis stopped adding the swap-in window
/// `verify` no longer sums (2026-12-02) it was feasible 76 times (floor 70),
/// and it moved into `all()`, where `outcore` seeds from it.
const MIN_FEASIBLE: [(&str, usize); 19] = [
    ("capuchin", 80),
    ("home", 105),
    ("checkpoint-all", 75),
    ("checkpoint-greedy", 75),
    ("checkpoint-sqrt", 75),
    ("dtr", 91),
    ("ideal", 175),
    ("lms", 84),
    ("none", 35),
    ("odswap", 82),
    ("outcore", 127),
    ("superneurons", 68),
    ("tensile", 70),
    ("swapadvisor", 105),
    ("vdnn-all", 80),
    ("vdnn-all-sync", 86),
    ("vdnn-conv", 49),
    ("vdnn-conv-sync", 53),
    ("window", 126),
];

const EXAMPLE_GRAPHS: [&str; 2] = ["vgg16_b32.json", "mobilenet_v2_b64.json"];

/// SwapAdvisor at the paper's population searches until the time limit; a
/// small search (8 individuals, 2 generations) keeps these runs short.
fn quick_swapadvisor() -> outcore_planners::SwapAdvisor {
    outcore_planners::SwapAdvisor {
        population: 8,
        max_generations: Some(2),
        ..outcore_planners::SwapAdvisor::new(outcore_planners::swapadvisor::SearchSpace::Joint)
    }
}

/// Knobs that keep a model's graph moderate at batch 32.
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
        let g = outcore_graph::zoo::build(info.name, Some(BATCH), &knobs, None)
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

/// HOME with a small swarm (8 particles, at most 3 iterations): the
/// default's 128 particles would dominate this test's time.
fn quick_home() -> outcore_planners::Home {
    outcore_planners::Home {
        particles: 8,
        iterations: 3,
        ..outcore_planners::Home::default()
    }
}

/// outcore with the quick SwapAdvisor and HOME as seeds and a short local search from
/// the fastest seed only (64 moves, no kicks, no repair starts): it runs every
/// other planner first, so its full form would multiply this test's time.
fn quick_outcore() -> outcore_planners::Joint {
    outcore_planners::Joint {
        improved_seeds: 1,
        repair_starts: false,
        max_kicks: 0,
        max_moves: 64,
        swapadvisor: quick_swapadvisor(),
        home: quick_home(),
        recompute_only: false,
        eager_seeds: true,
        // One swarm, as `quick_home`'s, so that the run stays short.
        home_runs: 1,
        streamed_seeds: true,
        offloaded_seeds: true,
        mixed_seeds: true,
        kept_link_seeds: true,
        prioritised: true,
        polish_swap_timing: true,
        held_starts: true,
        early_out_seeds: true,
        bounded_by_counts: false,
    }
}

fn check(
    planner: &dyn outcore_plan::Planner,
    g: &Graph,
    cost: &RooflineModel,
    fraction: f64,
    budget_bytes: u64,
    order: Option<&[OpId]>,
) -> Outcome {
    let request = PlanRequest {
        order,
        ..PlanRequest::new(g, cost, budget_bytes)
    };
    let outcome = match planner.plan(&request) {
        Ok(outcome) => outcome,
        Err(e) => return Outcome::Broken(format!("planner error: {e}")),
    };
    match outcome {
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
        PlanOutcome::Infeasible(reason) => {
            if fraction == 1.0 {
                Outcome::Broken(format!("infeasible at the footprint: {reason}"))
            } else if reason.message.trim().is_empty() {
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
    let planners: Vec<Box<dyn outcore_plan::Planner>> = outcore_planners::all()
        .into_iter()
        .map(|p| match p.name() {
            "swapadvisor" => Box::new(quick_swapadvisor()) as Box<dyn outcore_plan::Planner>,
            "home" => Box::new(quick_home()),
            "outcore" => Box::new(quick_outcore()),
            _ => p,
        })
        .collect();
    // Per planner: feasible, infeasible, seconds.
    let mut tally: BTreeMap<&'static str, (usize, usize, f64)> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    let mut slowest: Vec<(f64, String)> = Vec::new();
    let mut runs = 0usize;
    for (model, g) in &graphs {
        let (footprint_bytes, _) = footprint(g);
        let random_order = random_topological_order(g, ORDER_SEED);
        for (fraction, reordered) in BUDGETS {
            let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
            let orders: &[(&str, Option<&[OpId]>)] = if reordered {
                &[("graph", None), ("random", Some(&random_order))]
            } else {
                &[("graph", None)]
            };
            for &(order_name, order) in orders {
                runs += 1;
                let mut any_feasible: Option<&'static str> = None;
                let mut outcore_feasible = false;
                for planner in &planners {
                    let name = planner.name();
                    let t0 = Instant::now();
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        check(planner.as_ref(), g, &cost, fraction, budget_bytes, order)
                    }));
                    let secs = t0.elapsed().as_secs_f64();
                    let what = format!("{name} on {model} at {fraction} in {order_name} order");
                    slowest.push((secs, what.clone()));
                    let entry = tally.entry(name).or_insert((0, 0, 0.0));
                    entry.2 += secs;
                    if matches!(outcome, Ok(Outcome::Feasible)) {
                        if name == "outcore" {
                            outcore_feasible = true;
                        } else if name != "ideal" {
                            any_feasible.get_or_insert(name);
                        }
                    }
                    match outcome {
                        Ok(Outcome::Feasible) => entry.0 += 1,
                        Ok(Outcome::Infeasible) => entry.1 += 1,
                        Ok(Outcome::Broken(why)) => failures.push(format!("{what}: {why}")),
                        Err(_) => failures.push(format!("{what}: PANICKED")),
                    }
                }
                if let Some(other) = any_feasible
                    && !outcore_feasible
                {
                    failures.push(format!(
                        "outcore on {model} at {fraction} in {order_name} order: infeasible where {other} found a plan"
                    ));
                }
            }
        }
    }
    eprintln!(
        "conformance_all: {} graphs, {runs} (budget, order) runs each of {} planners in {:.1} s",
        graphs.len(),
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
    // A missing example graph takes its runs off every floor.
    let missing_runs = MEASURED_RUNS.saturating_sub(runs);
    for (name, floor) in MIN_FEASIBLE {
        let floor = floor.saturating_sub(missing_runs);
        let feasible = tally.get(name).map_or(0, |t| t.0);
        if feasible < floor {
            failures.push(format!(
                "{name} is feasible {feasible} times, below its floor of {floor}"
            ));
        }
    }
    for planner in &planners {
        if !MIN_FEASIBLE.iter().any(|(n, _)| *n == planner.name()) {
            failures.push(format!("{} has no floor in MIN_FEASIBLE", planner.name()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
