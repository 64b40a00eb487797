//! Throughput vs ideal of the recompute-only planners at 10 budgets, from 100%
//! of the footprint down to the smallest feasible one (bisection to 1/128), on
//! full-size zoo ResNet-50, Inception-v3, DenseNet-121, BERT-base, GPT-2 and an
//! LSTM, on v100-16gb-pcie3 with the perfect allocator; says whether each
//! sweep is monotone (a larger budget never slower). Prints a markdown table to
//! stderr (RESULTS.md, "Recomputation that uses the budget").
//!
//! `cargo run --release -p outcore-planners --example recompute_budget_sweep [PLANNER,...]`

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

/// (label, zoo name, batch, knobs).
type Model = (
    &'static str,
    &'static str,
    u64,
    &'static [(&'static str, u64)],
);

fn model(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Result<Graph, String> {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    zoo::build(name, Some(batch), &knobs, None).map_err(|e| e.to_string())
}

/// Throughput vs ideal at `fraction` of the footprint (`None`: infeasible).
fn throughput(
    name: &str,
    g: &Graph,
    cost: &RooflineModel,
    fraction: f64,
) -> Result<Option<f64>, String> {
    let budget_bytes = (footprint(g).0 as f64 * fraction) as u64;
    let planner = outcore_planners::by_name(name)?;
    match planner.plan(&PlanRequest::new(g, cost, budget_bytes)) {
        Ok(PlanOutcome::Feasible(plan)) => {
            if let Some(v) = verify(&plan, g).first() {
                return Err(format!("{name} does not verify: {v}"));
            }
            let out =
                simulate(g, &plan, cost, &SimOptions::default()).map_err(|e| e.to_string())?;
            Ok(Some(out.report.throughput_vs_ideal))
        }
        Ok(PlanOutcome::Infeasible(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn smallest_feasible(name: &str, g: &Graph, cost: &RooflineModel) -> Result<f64, String> {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..7 {
        let mid = (lo + hi) / 2.0;
        if throughput(name, g, cost, mid)?.is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

fn sweep(label: &str, g: &Graph, cost: &RooflineModel, planners: &[String]) -> Result<(), String> {
    for name in planners {
        let f_min = smallest_feasible(name, g, cost)?;
        let mut cells = Vec::new();
        let mut monotone = true;
        let mut previous = f64::INFINITY;
        for i in 0..10 {
            let fraction = 1.0 - (1.0 - f_min) * i as f64 / 9.0;
            match throughput(name, g, cost, fraction)? {
                Some(t) => {
                    monotone &= t <= previous + 1e-9;
                    previous = t;
                    cells.push(format!("{t:.3}"));
                }
                None => {
                    monotone = false;
                    cells.push("inf.".into());
                }
            }
        }
        eprintln!(
            "| {label} | {name} | {:.0}% | {} | {} |",
            f_min * 100.0,
            cells.join(" "),
            if monotone { "yes" } else { "NO" }
        );
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let planners: Vec<String> = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "checkpoint-sqrt,checkpoint-greedy,checkpoint-all".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let cost =
        RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").map_err(|e| e.to_string())?);
    let models: [Model; 6] = [
        ("ResNet-50 b32", "resnet50", 32, &[]),
        ("Inception-v3 b32", "inception_v3", 32, &[]),
        ("DenseNet-121 b32", "densenet121", 32, &[]),
        ("BERT-base b32 s128", "bert-base", 32, &[]),
        ("GPT-2 b8 s512", "gpt2", 8, &[]),
        (
            "LSTM b256 s64 h1024 v1000",
            "lstm",
            256,
            &[("seq", 64), ("vocab", 1000)],
        ),
    ];
    eprintln!(
        "| model | planner | smallest feasible budget | throughput vs ideal at 10 budgets, 100% first | monotone |"
    );
    eprintln!("|---|---|---|---|---|");
    for (label, name, batch, knobs) in models {
        let g = model(name, batch, knobs)?;
        sweep(label, &g, &cost, &planners)?;
    }
    Ok(())
}
