//! Measurements of the `home` planner (RESULTS.md and BENCHMARKS.md, "HOME"):
//!
//! - `accuracy MODEL BATCH FRACTION [N] [DEVICE]`: Algorithm 2's estimate vs the
//!   evaluator (the simulator's code) on N random policies lowered at
//!   FRACTION of the footprint: relative error of the iteration time (median,
//!   max), whether both agree the policy fits, and time per estimate and per
//!   evaluation.
//! - `search MODEL BATCH FRACTION PARTICLES ITERATIONS SCORING [SECONDS] [DEVICE] [PATIENCE] [SEED]`:
//!   one `home` run; prints the convergence history (worst / average / best per
//!   iteration, Fig. 8), the search time and the plan's simulated time.
//! - The maximum batch of each planner (Table 2) is `outcore max-batch`
//!   (`outcore::max_batch` in the facade), which replaced this example's copy.
//!
//! MODEL is a zoo name with optional knobs, e.g. `lstm:layers=4,hidden=2048`.
//! FRACTION is of the footprint (e.g. 0.5); a value above 1 is a budget in GiB.
//! Run with `cargo run --release -p outcore-planners --example home_study -- ...`.

// An example prints its measurement; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_eval::{Evaluator, Scratch as EvalScratch};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{AllocatorSpec, PlanOutcome, PlanRequest, Planner};
use outcore_planners::framework::Ctx;
use outcore_planners::home::estimate::{Algorithm2, Scratch};
use outcore_planners::home::policy::PolicySpace;
use outcore_planners::home::pso::random_policy;
use outcore_planners::{Home, Scoring};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn graph(spec: &str, batch: u64) -> Res<Graph> {
    if spec.ends_with(".json") {
        return Ok(outcore_graph::format::load_graph_file(
            std::path::Path::new(spec),
        )?);
    }
    let (name, knobs) = spec.split_once(':').unwrap_or((spec, ""));
    let mut map = BTreeMap::new();
    for kv in knobs.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or("knob as NAME=VALUE")?;
        map.insert(k.to_string(), v.parse()?);
    }
    Ok(zoo::build(name, Some(batch), &map, None)?)
}

fn budget(g: &Graph, fraction: f64) -> u64 {
    if fraction > 1.0 {
        (fraction * (1u64 << 30) as f64) as u64
    } else {
        (footprint(g).0 as f64 * fraction) as u64
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("accuracy") => accuracy(&args[1..]),
        Some("search") => search(&args[1..]),
        Some("debug") => debug_bounds(&args[1..]),
        Some("uniform") => uniform(&args[1..]),
        Some("suite") => suite(),
        _ => Err("usage: home_study accuracy|search ... (see the file's doc comment)".into()),
    }
}

fn accuracy(args: &[String]) -> Res<()> {
    let model = args.first().ok_or("MODEL")?;
    let batch: u64 = arg(args, 1, 32);
    let fraction: f64 = arg(args, 2, 0.5);
    let n: usize = arg(args, 3, 50);
    let device = args.get(4).map_or("v100-16gb-pcie3", String::as_str);
    let g = graph(model, batch)?;
    let cost = RooflineModel::new(DeviceProfile::builtin(device)?);
    let budget_bytes = budget(&g, fraction);
    let ctx = Ctx::in_graph_order(&g, &cost);
    let model2 = Algorithm2::new(&ctx, &cost);
    let space = PolicySpace::new(&ctx);
    let evaluator = Evaluator::new(&g, &cost, budget_bytes, AllocatorSpec::Perfect);
    let (mut s2, mut se) = (Scratch::default(), EvalScratch::default());
    let mut errors = Vec::new();
    let (mut agree, mut alg2_fits_only, mut eval_fits_only, mut both_fit) = (0, 0, 0, 0);
    let mut peak_errors = Vec::new();
    let (mut t_alg2, mut t_eval) = (0.0, 0.0);
    for i in 0..n {
        let policy = random_policy(&space, 1, i);
        let t0 = Instant::now();
        let lowered = space.lower(&model2, &policy, budget_bytes, &mut s2);
        t_alg2 += t0.elapsed().as_secs_f64();
        let schedule = ctx.schedule(lowered.gaps.clone());
        let t0 = Instant::now();
        let e = evaluator.evaluate(&schedule, &mut se);
        t_eval += t0.elapsed().as_secs_f64();
        let Some(sim_s) = e.iter_time_s() else {
            return Err(format!("policy {i} did not simulate: {e:?}").into());
        };
        errors.push((lowered.estimate.time_s - sim_s).abs() / sim_s);
        let bound = e.bound.peak_bytes as f64;
        peak_errors.push((lowered.estimate.peak_bytes as f64 - bound) / bound);
        if lowered.estimate.fits() && e.feasible() {
            both_fit += 1;
        }
        match (lowered.estimate.fits(), e.feasible()) {
            (a, b) if a == b => agree += 1,
            (true, false) => alg2_fits_only += 1,
            _ => eval_fits_only += 1,
        }
    }
    // Cross-check the evaluator against the full pipeline on the last policy.
    let policy = random_policy(&space, 1, 0);
    let lowered = space.lower(&model2, &policy, budget_bytes, &mut s2);
    let plan = outcore_plan::lower_schedule(
        &g,
        &ctx.schedule(lowered.gaps),
        outcore_plan::PlannerInfo {
            name: "home-study".into(),
            seed: None,
            settings: serde_json::Value::Null,
        },
        budget_bytes,
    )?;
    let full = simulate(&g, &plan, &cost, &SimOptions::default())?
        .report
        .iter_time_s;
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    let max = errors.last().copied().unwrap_or(0.0);
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    println!(
        "{model} b{batch} at {fraction} on {device}: {} ops, {} feature maps, {n} random policies",
        g.ops.len(),
        space.len()
    );
    println!(
        "  relative error of Algorithm 2 vs simulator: median {:.2}%, mean {:.2}%, max {:.2}%",
        median * 100.0,
        mean * 100.0,
        max * 100.0
    );
    println!(
        "  fits: agree {agree} (both fit {both_fit}), Algorithm 2 only {alg2_fits_only}, evaluator only {eval_fits_only}"
    );
    peak_errors.sort_by(f64::total_cmp);
    println!(
        "  peak bytes, Algorithm 2 vs verify's bound (signed): min {:.2}%, median {:.2}%, max {:.2}%",
        peak_errors[0] * 100.0,
        peak_errors[peak_errors.len() / 2] * 100.0,
        peak_errors[peak_errors.len() - 1] * 100.0
    );
    println!(
        "  per policy: Algorithm 2 (with lowering) {:.1} us, evaluator {:.1} us; full simulate of policy 0: {:.4} s (estimate {:.4} s)",
        t_alg2 / n as f64 * 1e6,
        t_eval / n as f64 * 1e6,
        full,
        lowered.estimate.time_s
    );
    Ok(())
}

fn search(args: &[String]) -> Res<()> {
    let model = args.first().ok_or("MODEL")?;
    let batch: u64 = arg(args, 1, 32);
    let fraction: f64 = arg(args, 2, 0.5);
    let particles: usize = arg(args, 3, 24);
    let iterations: usize = arg(args, 4, 40);
    let scoring = match args.get(5).map_or("hybrid", String::as_str) {
        "algorithm2" => Scoring::Algorithm2,
        "evaluator" => Scoring::Evaluator,
        _ => Scoring::Hybrid,
    };
    let seconds: f64 = arg(args, 6, 600.0);
    let device = args.get(7).map_or("v100-16gb-pcie3", String::as_str);
    let g = graph(model, batch)?;
    let cost = RooflineModel::new(DeviceProfile::builtin(device)?);
    let budget_bytes = budget(&g, fraction);
    let patience: usize = arg(args, 8, 0);
    let planner = Home {
        particles,
        iterations,
        patience,
        scoring,
    };
    let request = PlanRequest {
        time_limit_s: seconds,
        seed: arg(args, 9, 0),
        ..PlanRequest::new(&g, &cost, budget_bytes)
    };
    let t0 = Instant::now();
    let cpu0 = cpu_time_s();
    let outcome = planner.plan(&request)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu_s = cpu_time_s() - cpu0;
    match outcome {
        PlanOutcome::Feasible(plan) => {
            let report = simulate(&g, &plan, &cost, &SimOptions::default())?.report;
            let s = &plan.planner.settings;
            println!(
                "{model} b{batch} at {fraction}: {secs:.1} s wall, {cpu_s:.1} s CPU, throughput vs ideal {:.3}, iter {:.4} s; m {particles} iters {iterations} {scoring:?}: ran {} ({}), {} evaluations, {} trials; retained {} swapped {} recomputed {}",
                report.throughput_vs_ideal,
                report.iter_time_s,
                s["iterations_run"],
                s["stop"],
                s["evaluations"],
                s["trials"],
                s["retained"],
                s["swapped"],
                s["recomputed"]
            );
            if let Some(history) = s["history"].as_array() {
                for h in history {
                    println!(
                        "  iter {:>3} feasible {:>3} worst {} avg {} best {} best-so-far {}",
                        h["iteration"],
                        h["feasible"],
                        h["worst_s"],
                        h["average_s"],
                        h["best_s"],
                        h["best_so_far"]["time_s"]
                    );
                }
            }
        }
        PlanOutcome::Infeasible(why) => {
            println!("{model} b{batch} at {fraction}: {secs:.1} s, infeasible: {why}")
        }
    }
    Ok(())
}

/// Debugging aid: per-stream verify bounds vs Algorithm 2's for one policy.
pub fn debug_bounds(args: &[String]) -> Res<()> {
    let model = args.first().ok_or("MODEL")?;
    let batch: u64 = arg(args, 1, 32);
    let fraction: f64 = arg(args, 2, 0.5);
    let index: usize = arg(args, 3, 0);
    let g = graph(model, batch)?;
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3")?);
    let budget_bytes = budget(&g, fraction);
    let ctx = Ctx::in_graph_order(&g, &cost);
    let model2 = Algorithm2::new(&ctx, &cost);
    let space = PolicySpace::new(&ctx);
    let policy = random_policy(&space, 1, index);
    let mut s2 = Scratch::default();
    let lowered = space.lower(&model2, &policy, budget_bytes, &mut s2);
    println!("estimate {:?}", lowered.estimate);
    let huge = space.lower(&model2, &policy, u64::MAX / 4, &mut s2);
    println!("estimate without capacity {:?}", huge.estimate);
    let plan = outcore_plan::lower_schedule(
        &g,
        &ctx.schedule(lowered.gaps.clone()),
        outcore_plan::PlannerInfo {
            name: "home-study".into(),
            seed: None,
            settings: serde_json::Value::Null,
        },
        1,
    )?;
    for v in outcore_plan::verify(&plan, &g) {
        println!("verify: {v}");
    }
    for gap in lowered
        .gaps
        .iter()
        .filter(|g| g.how == outcore_plan::Restore::Swap)
        .take(400)
    {
        println!(
            "swap {} {} MiB after {:?} trigger {:?} reclaim {:?} before {:?}",
            g.tensor(gap.tensor).name,
            g.tensor(gap.tensor).size_bytes >> 20,
            gap.after,
            gap.prefetch_after,
            gap.reclaim_before,
            gap.before
        );
    }
    Ok(())
}

/// Uniform policies (all swap, all recompute where offered) under both scorers.
pub fn uniform(args: &[String]) -> Res<()> {
    use outcore_planners::home::policy::Action;
    let model = args.first().ok_or("MODEL")?;
    let batch: u64 = arg(args, 1, 32);
    let fraction: f64 = arg(args, 2, 0.5);
    let g = graph(model, batch)?;
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3")?);
    let budget_bytes = budget(&g, fraction);
    let ctx = Ctx::in_graph_order(&g, &cost);
    let model2 = Algorithm2::new(&ctx, &cost);
    let space = PolicySpace::new(&ctx);
    let evaluator = Evaluator::new(&g, &cost, budget_bytes, AllocatorSpec::Perfect);
    let (mut s2, mut se) = (Scratch::default(), EvalScratch::default());
    let policies: Vec<(&str, Vec<Action>)> = vec![
        ("retain", space.retain_all()),
        ("swap", vec![Action::Swap; space.len()]),
        (
            "recompute-else-swap",
            (0..space.len())
                .map(|j| {
                    if space.recomputable[j] {
                        Action::Recompute
                    } else {
                        Action::Swap
                    }
                })
                .collect(),
        ),
        (
            "recompute-else-retain",
            (0..space.len())
                .map(|j| {
                    if space.recomputable[j] {
                        Action::Recompute
                    } else {
                        Action::Retain
                    }
                })
                .collect(),
        ),
    ];
    for (name, p) in policies {
        let l = space.lower(&model2, &p, budget_bytes, &mut s2);
        let e = evaluator.evaluate(&ctx.schedule(l.gaps), &mut se);
        println!(
            "{name:>22}: alg2 {:.4} s peak {:.2} GiB excess {:.2} GiB relaxed {} | evaluator {:?} s bound {:.2} GiB feasible {}",
            l.estimate.time_s,
            l.estimate.peak_bytes as f64 / (1u64 << 30) as f64,
            l.estimate.excess_bytes as f64 / (1u64 << 30) as f64,
            l.relaxed,
            e.iter_time_s(),
            e.bound.peak_bytes as f64 / (1u64 << 30) as f64,
            e.feasible()
        );
    }
    println!(
        "budget {:.2} GiB",
        budget_bytes as f64 / (1u64 << 30) as f64
    );
    Ok(())
}

/// The conformance test's graphs (every zoo model at batch 32 with its knobs)
/// at 70% and 50% in graph and random order, `home` only, with the default
/// settings: time and outcome per run, for choosing defaults.
pub fn suite() -> Res<()> {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3")?);
    let mut total_s = 0.0;
    let mut feasible = 0;
    let mut runs = 0;
    for info in zoo::models() {
        let mut knobs = BTreeMap::new();
        let has = |k: &str| info.knobs.iter().find(|x| x.name == k).map(|x| x.default);
        let recurrent = matches!(info.name, "lstm" | "brnn");
        if let Some(seq) = has("seq") {
            knobs.insert("seq".to_string(), seq.min(if recurrent { 8 } else { 32 }));
        }
        if !recurrent && let Some(layers) = has("layers") {
            knobs.insert("layers".to_string(), layers.min(4));
        }
        if let Some(repeats) = has("repeats") {
            knobs.insert("repeats".to_string(), repeats.min(1));
        }
        if let Some(size) = has("size") {
            knobs.insert("size".to_string(), size.min(128));
        }
        let g = zoo::build(info.name, Some(32), &knobs, None)?;
        let order = outcore_plan::random_topological_order(&g, 1);
        for fraction in [0.7, 0.5] {
            for o in [None, Some(&order[..])] {
                let request = PlanRequest {
                    order: o,
                    ..PlanRequest::new(&g, &cost, budget(&g, fraction))
                };
                let t0 = Instant::now();
                let outcome = Home::default().plan(&request)?;
                let secs = t0.elapsed().as_secs_f64();
                total_s += secs;
                runs += 1;
                let what = match &outcome {
                    PlanOutcome::Feasible(p) => {
                        feasible += 1;
                        format!(
                            "feasible, ran {} ({}), {} trials",
                            p.planner.settings["iterations_run"],
                            p.planner.settings["stop"],
                            p.planner.settings["trials"]
                        )
                    }
                    PlanOutcome::Infeasible(_) => "infeasible".into(),
                };
                println!(
                    "{:>16} {fraction} {}: {secs:6.2} s {what}",
                    info.name,
                    if o.is_some() { "random" } else { "graph " }
                );
            }
        }
    }
    println!("{runs} runs, {feasible} feasible, {total_s:.1} s");
    Ok(())
}

/// User + system CPU seconds of this process, from /proc/self/stat (Linux):
/// wall time is meaningless on a shared machine.
fn cpu_time_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line: 12 and 13 here.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
