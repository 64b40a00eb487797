//! One planner on a zoo model in a chosen operator order, printing the
//! verified plan's simulated iteration time and its fraction of ideal: how much of a
//! planner's result is its order's (SwapAdvisor Sec. 6.2: ODSwap on MXNet's
//! default schedule).
//!
//! ```text
//! cargo run --release -p outcore-planners --example planner_in_order -- \
//!     MODEL BATCH BUDGET PLANNER ORDER [key=value ...]
//! ```
//!
//! `BUDGET` is bytes or `NNGiB`; `ORDER` is `graph`, `eager` (the
//! eager-update order), `framework` (`outcore_plan::framework_default_order`,
//! MXNet's default schedule) or `random` (a seeded random topological
//! order). Keys: zoo knobs (`layers=8`), `device=` (default
//! v100-16gb-pcie3), `seconds=` (default 60), `seed=`.

// An example prints its measurement; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_plan::{PlanOutcome, PlanRequest};
use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, batch, budget, planner, order, rest @ ..] = &args[..] else {
        return Err("usage: MODEL BATCH BUDGET PLANNER ORDER [key=value ...]".into());
    };
    let mut knobs = BTreeMap::new();
    let mut device = "v100-16gb-pcie3".to_string();
    let mut seconds = 60.0;
    let mut seed = 0u64;
    for kv in rest {
        let (k, v) = kv
            .split_once('=')
            .ok_or(format!("`{kv}` is not key=value"))?;
        match k {
            "device" => device = v.to_string(),
            "seconds" => seconds = v.parse()?,
            "seed" => seed = v.parse()?,
            knob => {
                knobs.insert(knob.to_string(), v.parse::<u64>()?);
            }
        }
    }
    let budget_bytes: u64 = match budget.strip_suffix("GiB") {
        Some(g) => (g.parse::<f64>()? * (1u64 << 30) as f64) as u64,
        None => budget.parse()?,
    };
    let graph = outcore_graph::zoo::build(model, Some(batch.parse()?), &knobs, None)?;
    let cost = RooflineModel::new(DeviceProfile::builtin(&device)?);
    let order = match order.as_str() {
        "graph" => graph.ops.iter().map(|o| o.id).collect(),
        "eager" => outcore_plan::eager_update_order(&graph),
        "framework" => outcore_plan::framework_default_order(&graph),
        "random" => outcore_plan::random_topological_order(&graph, seed),
        other => {
            return Err(format!("order `{other}`: give graph, eager, framework or random").into());
        }
    };
    let request = PlanRequest {
        seed,
        order: Some(&order),
        time_limit_s: seconds,
        ..PlanRequest::new(&graph, &cost, budget_bytes)
    };
    let planner = outcore_planners::by_name(planner)?;
    match planner.plan(&request)? {
        PlanOutcome::Feasible(plan) => {
            if let Some(v) = outcore_plan::verify(&plan, &graph).first() {
                return Err(format!("{} does not verify: {v}", planner.name()).into());
            }
            let report = outcore_sim::simulate(&graph, &plan, &cost, &Default::default())?.report;
            println!(
                "# {} {model} b{batch} budget {budget_bytes} order {}: {:.4} s/iteration, {:.4} of ideal {:.4} s; swapped in {} bytes",
                planner.name(),
                args[4],
                report.iter_time_s,
                report.throughput_vs_ideal,
                report.ideal_time_s,
                report.swap_in_bytes
            );
        }
        PlanOutcome::Infeasible(why) => println!("# {} infeasible: {why}", planner.name()),
    }
    Ok(())
}
