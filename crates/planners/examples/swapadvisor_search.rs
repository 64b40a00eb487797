//! One SwapAdvisor search on a zoo model, printing the convergence history
//! (best / mean / worst simulated iteration time of the feasible individuals
//! alive, per generation: the paper's Fig. 9) as CSV, then the result line.
//!
//! ```text
//! cargo run --release -p outcore-planners --example swapadvisor_search -- \
//!     MODEL BATCH BUDGET SECONDS [key=value ...]
//! ```
//!
//! `BUDGET` is bytes, `NNGiB` or `NN%` of the footprint. Keys: zoo knobs
//! (`layers=8`), `device=` (default v100-16gb-pcie3), `population=`,
//! `p=` (mutation probability), `adapt=self|fixed` (`P` adapts per
//! individual, the default, or stays fixed as in the paper), `search=joint|order-only|alloc-only`,
//! `seeding=seeded|random`, `generations=`, `seed=`, `polish=` (the share of
//! the time the pool's polish may take, 0 for none), `order=random` (plan
//! on a seeded random topological order instead of the graph's: the seed
//! individual's order, and the fixed order of `alloc-only`), `order=framework`
//! (the same with `outcore_plan::framework_default_order`, MXNet's default
//! schedule), `fixed=framework|seed` (the order `alloc-only` keeps when
//! no `order=` is given: MXNet's default schedule, the default, or the
//! fastest seed's).

// An example prints its measurement; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::footprint;
use outcore_plan::{PlanOutcome, PlanRequest, Planner};
use outcore_planners::SwapAdvisor;
use outcore_planners::swapadvisor::{Adaptation, FixedOrder, SearchSpace, Seeding};
use std::collections::BTreeMap;
use std::time::Instant;

fn budget_bytes(text: &str, footprint_bytes: u64) -> Result<u64, String> {
    if let Some(p) = text.strip_suffix('%') {
        let p: f64 = p.parse().map_err(|e| format!("budget `{text}`: {e}"))?;
        return Ok((footprint_bytes as f64 * p / 100.0) as u64);
    }
    if let Some(g) = text.strip_suffix("GiB") {
        let g: f64 = g.parse().map_err(|e| format!("budget `{text}`: {e}"))?;
        return Ok((g * (1u64 << 30) as f64) as u64);
    }
    text.parse().map_err(|e| format!("budget `{text}`: {e}"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, batch, budget, seconds, rest @ ..] = &args[..] else {
        return Err("usage: MODEL BATCH BUDGET SECONDS [key=value ...]".into());
    };
    let mut knobs = BTreeMap::new();
    let mut planner = SwapAdvisor::new(SearchSpace::Joint);
    let mut device = "v100-16gb-pcie3".to_string();
    let mut seed = 0u64;
    let mut fixed_order: Option<&str> = None;
    for kv in rest {
        let (k, v) = kv
            .split_once('=')
            .ok_or(format!("`{kv}` is not key=value"))?;
        match k {
            "device" => device = v.to_string(),
            "population" => planner.population = v.parse()?,
            "p" => planner.mutation_probability = v.parse()?,
            "adapt" => {
                planner.adaptation = match v {
                    "fixed" => Adaptation::Fixed,
                    "self" => Adaptation::SelfAdaptive,
                    _ => return Err(format!("adapt `{v}`").into()),
                }
            }
            "generations" => planner.max_generations = Some(v.parse()?),
            "polish" => planner.polish_share = v.parse()?,
            "fixed" => {
                planner.fixed_order = match v {
                    "framework" => FixedOrder::FrameworkDefault,
                    "seed" => FixedOrder::FastestSeed,
                    _ => return Err(format!("fixed `{v}`").into()),
                }
            }
            "seed" => seed = v.parse()?,
            "order" if v == "random" || v == "framework" => fixed_order = Some(v),
            "search" => {
                planner.search = match v {
                    "joint" => SearchSpace::Joint,
                    "order-only" => SearchSpace::OrderOnly,
                    "alloc-only" => SearchSpace::AllocationOnly,
                    _ => return Err(format!("search `{v}`").into()),
                }
            }
            "seeding" => {
                planner.seeding = match v {
                    "seeded" => Seeding::Seeded,
                    "random" => Seeding::Random,
                    _ => return Err(format!("seeding `{v}`").into()),
                }
            }
            knob => {
                knobs.insert(knob.to_string(), v.parse::<u64>()?);
            }
        }
    }
    let graph = outcore_graph::zoo::build(model, Some(batch.parse()?), &knobs, None)?;
    let cost = RooflineModel::new(DeviceProfile::builtin(&device)?);
    let (fp, _) = footprint(&graph);
    let order = match fixed_order {
        Some("random") => Some(outcore_plan::random_topological_order(&graph, seed)),
        Some(_) => Some(outcore_plan::framework_default_order(&graph)),
        None => None,
    };
    let request = PlanRequest {
        seed,
        order: order.as_deref(),
        time_limit_s: seconds.parse()?,
        ..PlanRequest::new(&graph, &cost, budget_bytes(budget, fp)?)
    };
    let t0 = Instant::now();
    let outcome = planner.plan(&request)?;
    let secs = t0.elapsed().as_secs_f64();
    match outcome {
        PlanOutcome::Feasible(plan) => {
            let s = &plan.planner.settings;
            println!(
                "generation,evaluations,elapsed_s,best_s,mean_s,worst_s,feasible,alive,best_ever_s,mean_p_order,mean_p_alloc"
            );
            for h in s["history"].as_array().into_iter().flatten() {
                println!(
                    "{},{},{:.3},{},{},{},{},{},{},{:.4},{:.4}",
                    h["generation"],
                    h["evaluations"],
                    h["elapsed_s"].as_f64().unwrap_or(0.0),
                    h["best_s"],
                    h["mean_s"],
                    h["worst_s"],
                    h["feasible"],
                    h["alive"],
                    h["best_ever_s"],
                    h["mean_p"]["order"].as_f64().unwrap_or(f64::NAN),
                    h["mean_p"]["alloc"].as_f64().unwrap_or(f64::NAN)
                );
            }
            let ideal: f64 = (0..graph.ops.len())
                .map(|i| {
                    outcore_cost::CostModel::op_time_s(&cost, &graph, outcore_graph::OpId(i as u32))
                })
                .sum();
            let t = s["simulated_iter_time_s"].as_f64().unwrap_or(f64::NAN);
            println!(
                "# {} {model} b{batch} budget {} ops {} footprint {fp}: {t:.4} s/iteration, {:.1}% of ideal {ideal:.4} s; {} generations, {} evaluations in {secs:.1} s; pool {} classes of {} sizes, {} bytes; {} swap-ins ({} triggers delayed)",
                plan.planner.name,
                request.budget_bytes,
                graph.ops.len(),
                100.0 * ideal / t,
                s["generations"],
                s["evaluations"],
                s["pool_classes"],
                s["tensor_sizes"],
                s["pool_bytes"],
                s["swap_ins"],
                s["delayed_prefetches"],
            );
            println!("# pool polish: {}", s["polish"]);
        }
        PlanOutcome::Infeasible(why) => println!("# infeasible after {secs:.1} s: {why}"),
    }
    Ok(())
}
