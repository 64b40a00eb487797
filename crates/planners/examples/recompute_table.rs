//! The recompute-only comparison of issue 10 ("Done when"), as markdown tables:
//!
//! - `overhead`: iteration time over ideal of `dtr` and of every
//!   recompute-only planner (`dtr` and every planner whose name starts with
//!   `checkpoint`, so new checkpoint planners join by being registered) on zoo
//!   ResNet-50, Inception v3, DenseNet-121, BERT-base, GPT-2 and an LSTM at
//!   50% and 30% of the footprint, and whether the best of them is at most
//!   `dtr`'s;
//! - `small`: the same planners and the exact reference `checkmate-milp` on
//!   graphs of at most 100 ops (small zoo models and random DAGs), with
//!   whether the proven optimum is at most every heuristic's recomputation
//!   time and within 5% of the best heuristic's overhead;
//! - `monotone`: each recompute-only planner but `outcore-recompute` on the six models at 10 budgets
//!   from 100% of the footprint down to the smallest feasible one (found by
//!   bisection to 0.5%), and whether throughput never rises as the budget falls.
//!
//! - `scaling`: how long the reference takes on random DAGs of growing size.
//! - `monotone-search` (not in `all`): the same for `outcore-recompute`, at
//!   20 s per plan, down to `dtr`'s smallest feasible budget.
//!
//! Run (release; every section by default):
//! `cargo run --release -p outcore-planners --example recompute_table -- [overhead|small|monotone|scaling|all] [milp-seconds]`
//! Every number is simulated on `v100-16gb-pcie3` with the roofline model and
//! the perfect allocator; every plan counted passed `verify()` (the planners
//! prove it) and is checked here to contain no swap.

// An example prints its table; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_eval::testing::random_graph_batch;
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{PlanOutcome, PlanRequest, Planner};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

/// One model of the comparison: label, zoo name, batch, knobs.
struct Model {
    label: &'static str,
    name: &'static str,
    batch: u64,
    knobs: &'static [(&'static str, u64)],
}

const MODELS: [Model; 6] = [
    Model {
        label: "ResNet-50 b32",
        name: "resnet50",
        batch: 32,
        knobs: &[],
    },
    Model {
        label: "Inception v3 b32",
        name: "inception_v3",
        batch: 32,
        knobs: &[],
    },
    Model {
        label: "DenseNet-121 b32",
        name: "densenet121",
        batch: 32,
        knobs: &[],
    },
    Model {
        label: "BERT-base b32 s128",
        name: "bert-base",
        batch: 32,
        knobs: &[("seq", 128)],
    },
    Model {
        label: "GPT-2 b8 s512",
        name: "gpt2",
        batch: 8,
        knobs: &[("seq", 512)],
    },
    Model {
        label: "LSTM 4x2048 s64 v2000 b512",
        name: "lstm",
        batch: 512,
        knobs: &[
            ("layers", 4),
            ("hidden", 2048),
            ("seq", 64),
            ("vocab", 2000),
        ],
    },
];

/// Small graphs for the exact reference: (label, zoo name, batch, knobs).
const SMALL_MODELS: [Model; 3] = [
    Model {
        label: "tiny-cnn b32",
        name: "tiny-cnn",
        batch: 32,
        knobs: &[],
    },
    Model {
        label: "mlp b64 (4 layers)",
        name: "mlp",
        batch: 64,
        knobs: &[("layers", 4)],
    },
    Model {
        label: "lstm 1x64 s4 v100 b256",
        name: "lstm",
        batch: 256,
        knobs: &[("layers", 1), ("hidden", 64), ("seq", 4), ("vocab", 100)],
    },
];

/// Layer choices of the random DAGs (`outcore_eval::testing::random_graph`).
const RANDOM_DAGS: [&[u8]; 3] = [
    &[0, 1, 4, 2, 9, 3, 17, 5, 6, 33],
    &[8, 13, 2, 1, 21, 7, 4, 0, 18, 3, 2, 41],
    &[1, 5, 9, 13, 2, 6, 10, 14, 3, 11],
];

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let section = args.get(1).map_or("all", String::as_str);
    let milp_seconds: f64 = args.get(2).map_or(Ok(60.0), |s| s.parse())?;
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3")?);
    if matches!(section, "overhead" | "all") {
        overhead_table(&cost)?;
    }
    if matches!(section, "small" | "all") {
        small_table(&cost, milp_seconds)?;
    }
    if section == "monotone-search" {
        monotone_search_table(&cost)?;
    }
    if matches!(section, "monotone" | "all") {
        monotone_table(&cost)?;
    }
    if matches!(section, "scaling" | "all") {
        scaling_table(&cost, milp_seconds)?;
    }
    Ok(())
}

/// The recompute-only planners: `dtr`, every `checkpoint*` planner, and
/// `outcore-recompute` (outcore's search restricted to recomputation, seeded
/// by the others, so never slower than `dtr` by construction).
fn recompute_planners() -> Vec<Box<dyn Planner>> {
    outcore_planners::all()
        .into_iter()
        .chain(outcore_planners::ablations())
        .filter(|p| {
            p.name() == "dtr"
                || p.name().starts_with("checkpoint")
                || p.name() == "outcore-recompute"
        })
        .collect()
}

fn build(m: &Model) -> Result<Graph, Error> {
    let knobs: BTreeMap<String, u64> = m.knobs.iter().map(|&(k, v)| (k.into(), v)).collect();
    Ok(zoo::build(m.name, Some(m.batch), &knobs, None)?)
}

/// What one planner came to on one graph and budget.
#[derive(Debug, Clone)]
struct Run {
    /// Iteration time over ideal, when feasible.
    overhead: Option<f64>,
    recompute_time_s: f64,
    /// The plan's settings (for the reference's proof and solve statistics).
    settings: serde_json::Value,
    plan_time_s: f64,
    note: String,
}

fn run(
    planner: &dyn Planner,
    g: &Graph,
    cost: &RooflineModel,
    fraction: f64,
    time_limit_s: f64,
) -> Result<Run, Error> {
    let budget_bytes = (footprint(g).0 as f64 * fraction) as u64;
    let request = PlanRequest {
        time_limit_s,
        ..PlanRequest::new(g, cost, budget_bytes)
    };
    let t0 = Instant::now();
    let outcome = planner.plan(&request)?;
    let plan_time_s = t0.elapsed().as_secs_f64();
    let plan = match outcome {
        PlanOutcome::Feasible(plan) => plan,
        PlanOutcome::Infeasible(why) => {
            return Ok(Run {
                overhead: None,
                recompute_time_s: 0.0,
                settings: serde_json::Value::Null,
                plan_time_s,
                note: why.message,
            });
        }
    };
    let report = simulate(g, &plan, cost, &SimOptions::default())?.report;
    if report.swap_in_bytes + report.swap_out_bytes > 0 {
        return Err(format!("{} swapped on a recompute-only comparison", planner.name()).into());
    }
    Ok(Run {
        overhead: Some(report.iter_time_s / report.ideal_time_s),
        recompute_time_s: report.recompute_time_s,
        settings: plan.planner.settings.clone(),
        plan_time_s,
        note: String::new(),
    })
}

/// A count the reference recorded in its solve statistics, or "—".
fn count(stats: &serde_json::Value, key: &str) -> String {
    stats[key].as_u64().map_or("—".into(), |n| n.to_string())
}

fn cell(r: &Run) -> String {
    r.overhead
        .map_or_else(|| "—".to_string(), |o| format!("{o:.3}"))
}

fn overhead_table(cost: &RooflineModel) -> Result<(), Error> {
    let planners = recompute_planners();
    println!("### Overhead (iteration time / ideal) at 50% and 30% of the footprint\n");
    let names: Vec<&str> = planners.iter().map(|p| p.name()).collect();
    println!(
        "| model | ops | budget | {} | checkmate-milp | best checkpoint <= dtr |",
        names.join(" | ")
    );
    println!("|---|---|---|{}---|---|", "---|".repeat(names.len()));
    for m in &MODELS {
        let g = build(m)?;
        for fraction in [0.5, 0.3] {
            let runs: Vec<Run> = planners
                .iter()
                .map(|p| run(p.as_ref(), &g, cost, fraction, 60.0))
                .collect::<Result<_, _>>()?;
            let dtr = runs
                .iter()
                .zip(&names)
                .find(|(_, n)| **n == "dtr")
                .and_then(|(r, _)| r.overhead);
            let best_checkpoint = runs
                .iter()
                .zip(&names)
                .filter(|(_, n)| n.starts_with("checkpoint"))
                .filter_map(|(r, _)| r.overhead)
                .fold(None, |a: Option<f64>, o| Some(a.map_or(o, |a| a.min(o))));
            let verdict = match (best_checkpoint, dtr) {
                (Some(c), Some(d)) => if c <= d { "yes" } else { "no" }.to_string(),
                (Some(_), None) => "yes (dtr infeasible)".into(),
                (None, Some(_)) => "no (checkpoint infeasible)".into(),
                (None, None) => "— (both infeasible)".into(),
            };
            let cells: Vec<String> = runs.iter().map(cell).collect();
            println!(
                "| {} | {} | {:.0}% | {} | — (> {} ops) | {verdict} |",
                m.label,
                g.ops.len(),
                fraction * 100.0,
                cells.join(" | "),
                outcore_planners::MILP_MAX_OPS
            );
        }
    }
    println!();
    Ok(())
}

fn small_graphs() -> Result<Vec<(String, Graph)>, Error> {
    let mut out = Vec::new();
    for m in &SMALL_MODELS {
        out.push((m.label.to_string(), build(m)?));
    }
    for (i, choices) in RANDOM_DAGS.iter().enumerate() {
        out.push((
            format!("random DAG {i} (batch 256, width 64)"),
            random_graph_batch(choices, 64, 256)?,
        ));
    }
    Ok(out)
}

fn small_table(cost: &RooflineModel, milp_seconds: f64) -> Result<(), Error> {
    let planners = recompute_planners();
    let milp = outcore_planners::CheckmateMilp;
    let names: Vec<&str> = planners.iter().map(|p| p.name()).collect();
    println!(
        "### Graphs of at most {} ops: the exact reference (time limit {milp_seconds} s)\n",
        outcore_planners::MILP_MAX_OPS
    );
    println!(
        "| graph | ops | budget | {} | checkmate-milp | proven | solve s | nodes | binaries | rows | MILP recompute <= every heuristic's | best heuristic within 5% of MILP |",
        names.join(" | ")
    );
    println!(
        "|---|---|---|{}---|---|---|---|---|---|---|---|",
        "---|".repeat(names.len())
    );
    let dtr = outcore_planners::Dtr;
    for (label, g) in small_graphs()? {
        // Small graphs are often dominated by what no recomputation moves
        // (parameters, gradients): the budgets are a third, two thirds and
        // all of the way from the footprint down to the least budget at which
        // `dtr` is feasible.
        let low = smallest_feasible(&dtr, &g, cost)?;
        if low >= 1.0 {
            println!("<!-- {label}: dtr needs the whole footprint; nothing to recompute -->");
            continue;
        }
        for t in [1.0 / 3.0, 2.0 / 3.0, 1.0] {
            let fraction = 1.0 - t * (1.0 - low);
            let runs: Vec<Run> = planners
                .iter()
                .map(|p| run(p.as_ref(), &g, cost, fraction, 60.0))
                .collect::<Result<_, _>>()?;
            let exact = run(&milp, &g, cost, fraction, milp_seconds)?;
            let proven = exact.settings["proven_optimal"].as_bool();
            let stats = &exact.settings["milp"];
            let (lower_bound, within) = match (exact.overhead, proven) {
                (Some(o), Some(true)) => {
                    let ok = runs.iter().all(|r| {
                        r.overhead.is_none() || exact.recompute_time_s <= r.recompute_time_s + 1e-12
                    });
                    let best = runs
                        .iter()
                        .filter_map(|r| r.overhead)
                        .fold(f64::INFINITY, f64::min);
                    let within = if best.is_finite() {
                        if best <= o * 1.05 { "yes" } else { "no" }.to_string()
                    } else {
                        "— (no heuristic plan)".into()
                    };
                    (if ok { "yes" } else { "NO" }.to_string(), within)
                }
                (Some(_), _) => ("— (not proven)".into(), "—".into()),
                (None, _) => {
                    let none = runs.iter().all(|r| r.overhead.is_none());
                    (
                        if none {
                            "— (no plan at all)"
                        } else {
                            "NO (heuristic feasible)"
                        }
                        .into(),
                        "—".into(),
                    )
                }
            };
            let cells: Vec<String> = runs.iter().map(cell).collect();
            println!(
                "| {label} | {} | {:.1}% | {} | {} | {} | {:.2} | {} | {} | {} | {lower_bound} | {within} |",
                g.ops.len(),
                fraction * 100.0,
                cells.join(" | "),
                cell(&exact),
                proven.map_or("—", |p| if p { "yes" } else { "no" }),
                exact.plan_time_s,
                count(stats, "nodes"),
                count(stats, "binary_vars"),
                count(stats, "constraints"),
            );
            if exact.overhead.is_none() {
                println!("<!-- {label} {fraction}: {} -->", exact.note);
            }
            if stats["tiny_pinned"].as_u64().is_some_and(|n| n > 0) {
                println!(
                    "<!-- {label} {fraction}: {} storages pinned for being tiny -->",
                    stats["tiny_pinned"]
                );
            }
        }
    }
    println!();
    Ok(())
}

/// The smallest fraction of the footprint (to 0.5%) at which `planner` is
/// feasible, searching down from 100% by bisection over [1%, 100%].
fn smallest_feasible(planner: &dyn Planner, g: &Graph, cost: &RooflineModel) -> Result<f64, Error> {
    let (mut lo, mut hi) = (0.01, 1.0);
    if run(planner, g, cost, lo, 60.0)?.overhead.is_some() {
        return Ok(lo);
    }
    while hi - lo > 0.005 {
        let mid = (lo + hi) / 2.0;
        if run(planner, g, cost, mid, 60.0)?.overhead.is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

fn monotone_table(cost: &RooflineModel) -> Result<(), Error> {
    println!("### Throughput vs budget: 10 budgets from 100% down to the smallest feasible\n");
    println!(
        "| model | planner | smallest feasible | throughput at the 10 budgets (100% first) | monotone |"
    );
    println!("|---|---|---|---|---|");
    for m in &MODELS {
        let g = build(m)?;
        // `outcore-recompute` is left out: a search of up to a minute per
        // plan, at some 20 budgets per model, and not in `all()`.
        for planner in recompute_planners()
            .into_iter()
            .filter(|p| p.name() != "outcore-recompute")
        {
            let low = smallest_feasible(planner.as_ref(), &g, cost)?;
            monotone_row(m, planner.as_ref(), &g, cost, low, 60.0)?;
        }
    }
    println!();
    Ok(())
}

/// One row of the monotone table: `planner` at 10 budgets from 100% of the
/// footprint down to `low`, each planned with `time_limit_s`.
fn monotone_row(
    m: &Model,
    planner: &dyn Planner,
    g: &Graph,
    cost: &RooflineModel,
    low: f64,
    time_limit_s: f64,
) -> Result<(), Error> {
    let mut throughputs = Vec::new();
    for i in 0..10 {
        let fraction = 1.0 - (1.0 - low) * i as f64 / 9.0;
        let r = run(planner, g, cost, fraction, time_limit_s)?;
        throughputs.push(r.overhead.map(|o| 1.0 / o));
    }
    let monotone = throughputs.windows(2).all(|w| match (w[0], w[1]) {
        (Some(a), Some(b)) => b <= a + 1e-9,
        (Some(_), None) => true,
        (None, _) => false,
    });
    let feasible_all = throughputs.iter().all(Option::is_some);
    let cells: Vec<String> = throughputs
        .iter()
        .map(|t| t.map_or("—".into(), |t| format!("{t:.3}")))
        .collect();
    println!(
        "| {} | {} | {:.0}% | {} | {} |",
        m.label,
        planner.name(),
        low * 100.0,
        cells.join(" "),
        match (monotone, feasible_all) {
            (true, true) => "yes",
            (true, false) => "yes (infeasible inside the range)",
            (false, _) => "NO",
        }
    );
    Ok(())
}

/// `monotone-search`: `outcore-recompute` (20 s per plan) at the 10 budgets
/// from 100% down to `dtr`'s smallest feasible one (it is seeded by `dtr`, so
/// it is feasible wherever `dtr` is).
fn monotone_search_table(cost: &RooflineModel) -> Result<(), Error> {
    println!(
        "### outcore-recompute vs budget: 10 budgets from 100% down to dtr's smallest feasible\n"
    );
    println!(
        "| model | planner | smallest feasible (dtr) | throughput at the 10 budgets (100% first) | monotone |"
    );
    println!("|---|---|---|---|---|");
    let dtr = outcore_planners::by_name("dtr")?;
    let search = outcore_planners::Joint::recompute_only();
    for m in &MODELS {
        let g = build(m)?;
        let low = smallest_feasible(dtr.as_ref(), &g, cost)?;
        monotone_row(m, &search, &g, cost, low, 20.0)?;
    }
    println!();
    Ok(())
}

/// A deterministic stream of layer choices for random DAGs (xorshift).
fn choices(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn scaling_table(cost: &RooflineModel, milp_seconds: f64) -> Result<(), Error> {
    println!(
        "### The exact reference on random DAGs of growing size (time limit {milp_seconds} s)\n"
    );
    println!(
        "| layers | ops | budget | dtr | checkmate-milp | proven | gap | solve s | nodes | binaries | rows |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let dtr = outcore_planners::Dtr;
    let milp = outcore_planners::CheckmateMilp;
    for layers in [8, 16, 24, 32, 40] {
        let g = random_graph_batch(&choices(layers, 7 + layers as u64), 64, 256)?;
        if g.ops.len() > outcore_planners::MILP_MAX_OPS {
            println!(
                "| {layers} | {} | — | — | — (over the limit) | | | | | | |",
                g.ops.len()
            );
            continue;
        }
        let low = smallest_feasible(&dtr, &g, cost)?;
        let fraction = 1.0 - 2.0 / 3.0 * (1.0 - low);
        let d = run(&dtr, &g, cost, fraction, 60.0)?;
        let e = run(&milp, &g, cost, fraction, milp_seconds)?;
        let stats = &e.settings["milp"];
        println!(
            "| {layers} | {} | {:.1}% | {} | {} | {} | {} | {:.2} | {} | {} | {} |",
            g.ops.len(),
            fraction * 100.0,
            cell(&d),
            cell(&e),
            e.settings["proven_optimal"]
                .as_bool()
                .map_or("—", |p| if p { "yes" } else { "no" }),
            stats["gap"]
                .as_f64()
                .map_or("—".into(), |g| format!("{g:.3}")),
            e.plan_time_s,
            count(stats, "nodes"),
            count(stats, "binary_vars"),
            count(stats, "constraints"),
        );
    }
    println!();
    Ok(())
}
