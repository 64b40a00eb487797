//! The alternatives behind `outcore`'s search (issue 16: "say what you chose
//! and why, with measurements of the alternatives you tried"), on a few
//! benchmark-suite cases, each variant bounded by the same number of scored
//! moves (not by the clock, so that a busy machine does not change the
//! answer):
//!
//! - `seeds only`: the portfolio, no local search (`max_moves` 0);
//! - `climb, fastest seed`: hill climbing from the fastest seed only, no kicks;
//! - `climb, 2 seeds`: the same from the two fastest seeds;
//! - `ILS, 2 seeds`: with kicks (iterated local search), no repair starts;
//! - `ILS + repair starts, shuffled moves`: as the default, the moves
//!   scored in the shuffled order alone (not [`outcore_planners::Joint::prioritised`]);
//! - `ILS + repair starts` (the default).
//!
//! SwapAdvisor's seed runs 4 generations of 16 in every variant, so the seeds
//! are the same everywhere. Prints a markdown table of throughput vs ideal.
//! Run with
//! `cargo run --release -p outcore-planners --example joint_alternatives -- [MOVES] [FILTER]`
//! (default 3000 moves per start; with FILTER, only the variants whose name
//! contains it).

// An example prints its table; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{PlanOutcome, PlanRequest, Planner};
use outcore_planners::Joint;
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

/// (label, zoo name, batch, knobs, fraction of the footprint).
type Case = (
    &'static str,
    &'static str,
    u64,
    &'static [(&'static str, u64)],
    f64,
);

const CASES: [Case; 5] = [
    ("ResNet-50 b64", "resnet50", 64, &[], 0.5),
    ("ResNet-50 b64", "resnet50", 64, &[], 0.25),
    ("BERT-base b32 s128", "bert-base", 32, &[], 0.5),
    ("VGG-16 b32", "vgg16", 32, &[], 0.5),
    ("GPT-2 b8 s512", "gpt2", 8, &[], 0.25),
];

fn variants(moves: usize) -> Vec<(&'static str, Joint)> {
    let base = Joint {
        max_moves: moves,
        swapadvisor: outcore_planners::SwapAdvisor {
            population: 16,
            max_generations: Some(4),
            ..outcore_planners::SwapAdvisor::new(outcore_planners::swapadvisor::SearchSpace::Joint)
        },
        ..Joint::default()
    };
    vec![
        (
            "seeds only",
            Joint {
                max_moves: 0,
                max_kicks: 0,
                repair_starts: false,
                ..base.clone()
            },
        ),
        (
            "climb, fastest seed",
            Joint {
                improved_seeds: 1,
                max_kicks: 0,
                repair_starts: false,
                ..base.clone()
            },
        ),
        (
            "climb, 2 seeds",
            Joint {
                max_kicks: 0,
                repair_starts: false,
                ..base.clone()
            },
        ),
        (
            "ILS, 2 seeds",
            Joint {
                repair_starts: false,
                ..base.clone()
            },
        ),
        (
            "ILS + repair starts, shuffled moves",
            Joint {
                prioritised: false,
                ..base.clone()
            },
        ),
        ("ILS + repair starts (default)", base),
    ]
}

fn main() -> Result<(), Error> {
    let moves: usize = std::env::args().nth(1).map_or(Ok(3000), |s| s.parse())?;
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3")?);
    let filter = std::env::args().nth(2).unwrap_or_default();
    let variants: Vec<_> = variants(moves)
        .into_iter()
        .filter(|(name, _)| name.contains(filter.as_str()))
        .collect();
    let names: Vec<&str> = variants.iter().map(|(n, _)| *n).collect();
    println!("| case | budget | {} |", names.join(" | "));
    println!("|---|---|{}", "---|".repeat(names.len()));
    for (label, name, batch, knobs, fraction) in CASES {
        let knobs: BTreeMap<String, u64> = knobs.iter().map(|&(k, v)| (k.into(), v)).collect();
        let g = zoo::build(name, Some(batch), &knobs, None)?;
        let budget_bytes = (footprint(&g).0 as f64 * fraction) as u64;
        let mut cells = Vec::new();
        for (_, planner) in &variants {
            cells.push(run(planner, &g, &cost, budget_bytes)?);
        }
        println!(
            "| {label} | {:.0}% | {} |",
            fraction * 100.0,
            cells.join(" | ")
        );
    }
    Ok(())
}

/// Throughput vs ideal and planning time of one variant, as a cell.
fn run(
    planner: &Joint,
    g: &Graph,
    cost: &RooflineModel,
    budget_bytes: u64,
) -> Result<String, Error> {
    let request = PlanRequest {
        // Bounded by moves and generations: the clock never stops a variant.
        time_limit_s: 3600.0,
        ..PlanRequest::new(g, cost, budget_bytes)
    };
    let t0 = Instant::now();
    let outcome = planner.plan(&request)?;
    let plan_s = t0.elapsed().as_secs_f64();
    Ok(match outcome {
        PlanOutcome::Feasible(plan) => {
            let r = simulate(g, &plan, cost, &SimOptions::default())?.report;
            format!("{:.3} ({plan_s:.0} s)", r.throughput_vs_ideal)
        }
        PlanOutcome::Infeasible(_) => format!("infeasible ({plan_s:.0} s)"),
    })
}
