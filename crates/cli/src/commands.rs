//! The subcommands: load inputs, call the library crates, print tables or JSON.

use crate::args::{Cli, Command, GraphArgs, RunArgs, TargetArgs};
use anyhow::{Context, Result, anyhow, bail};
use outcore_cost::{CostModel, DeviceProfile, RooflineModel};
use outcore_graph::builder::Optimizer;
use outcore_graph::{Graph, footprint, stats, zoo};
use outcore_plan::{AllocatorSpec, Plan, PlanOutcome, PlanRequest, Planner, fmt_bytes, verify};
use outcore_sim::{SimOptions, SimReport, simulate};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Prints a line; a closed pipe (`outcore zoo | head`) ends the program quietly.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Zoo { json } => cmd_zoo(json),
        Command::Stats { graph, json } => cmd_stats(&graph, json),
        Command::Export { graph, output } => {
            let loaded = load_graph(&graph)?;
            std::fs::write(
                &output,
                outcore_graph::format::native::to_string(&loaded.graph),
            )
            .with_context(|| format!("cannot write {}", output.display()))?;
            say!(
                "wrote {} ({} ops, {} tensors, {})",
                output.display(),
                loaded.graph.ops.len(),
                loaded.graph.tensors.len(),
                outcore_graph::format::native::FORMAT
            );
            Ok(())
        }
        Command::Plan {
            graph,
            target,
            planner,
            output,
        } => cmd_plan(&graph, &target, &planner, &output),
        Command::Simulate {
            plan,
            trace,
            alloc_trace,
            latency_table,
            iterations,
            json,
        } => cmd_simulate(
            &plan,
            trace.as_deref(),
            alloc_trace.as_deref(),
            latency_table.as_deref(),
            iterations,
            json,
        ),
        Command::Compare {
            graph,
            target,
            planners,
            json,
        } => cmd_compare(&graph, &target, &planners, json),
        Command::Run(args) => cmd_run(args),
        Command::AllocReplay {
            trace,
            allocator,
            capacity,
            json,
        } => cmd_alloc_replay(&trace, &allocator, capacity.as_deref(), json),
    }
}

fn print_json(value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    say!("{text}");
    Ok(())
}

// ----- inputs -----

fn parse_optimizer(name: &str) -> Result<Optimizer> {
    Ok(match name {
        "sgd" => Optimizer::sgd_momentum(),
        "adamw" => Optimizer::adamw(),
        "adam" => match Optimizer::adamw() {
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
                ..
            } => Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay: 0.0,
                decoupled: false,
            },
            other => other,
        },
        "none" => Optimizer::None,
        other => bail!("unknown optimizer `{other}`; use sgd, adam, adamw or none"),
    })
}

fn parse_knobs(knobs: &[String]) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for k in knobs {
        let (name, value) = k
            .split_once('=')
            .ok_or_else(|| anyhow!("knob `{k}` is not NAME=VALUE"))?;
        let value: u64 = value
            .parse()
            .map_err(|_| anyhow!("knob `{name}` needs a whole number, got `{value}`"))?;
        out.insert(name.to_string(), value);
    }
    Ok(out)
}

/// Where a graph came from, for recording in plans.
struct LoadedGraph {
    graph: Graph,
    args: GraphArgs,
}

fn load_graph(args: &GraphArgs) -> Result<LoadedGraph> {
    let graph = match (&args.model, &args.graph) {
        (Some(model), None) => {
            let knobs = parse_knobs(&args.knobs)?;
            let optimizer = args.optimizer.as_deref().map(parse_optimizer).transpose()?;
            zoo::build(model, args.batch, &knobs, optimizer)?
        }
        (None, Some(path)) => outcore_graph::format::load_graph_file(path)?,
        _ => bail!("give a model with --model NAME or a graph file with --graph FILE"),
    };
    Ok(LoadedGraph {
        graph,
        args: args.clone(),
    })
}

/// Parses a budget: plain bytes, a size with a unit, or a percentage of the footprint.
fn parse_budget(text: &str, footprint_bytes: u64) -> Result<u64> {
    let t = text.trim();
    if let Some(pct) = t.strip_suffix('%') {
        let p: f64 = pct
            .trim()
            .parse()
            .map_err(|_| anyhow!("budget `{text}`: `{pct}` is not a number"))?;
        if !p.is_finite() || p <= 0.0 {
            bail!("budget `{text}` must be positive");
        }
        return Ok((footprint_bytes as f64 * p / 100.0).round() as u64);
    }
    parse_size(t).with_context(|| format!("budget `{text}`: use bytes, a size like 12GiB, or NN%"))
}

fn parse_size(t: &str) -> Result<u64> {
    let units: [(&str, f64); 8] = [
        ("TiB", 1024f64.powi(4)),
        ("GiB", 1024f64.powi(3)),
        ("MiB", 1024f64.powi(2)),
        ("KiB", 1024.0),
        ("TB", 1e12),
        ("GB", 1e9),
        ("MB", 1e6),
        ("KB", 1e3),
    ];
    for (suffix, scale) in units {
        if let Some(num) = t.strip_suffix(suffix) {
            let v: f64 = num
                .trim()
                .parse()
                .map_err(|_| anyhow!("`{num}` is not a number"))?;
            if !v.is_finite() || v <= 0.0 {
                bail!("the size must be positive");
            }
            return Ok((v * scale).round() as u64);
        }
    }
    let bytes: u64 = t
        .trim_end_matches('B')
        .parse()
        .map_err(|_| anyhow!("`{t}` is not a size"))?;
    if bytes == 0 {
        bail!("the size must be positive");
    }
    Ok(bytes)
}

struct Target {
    device: DeviceProfile,
    budget_bytes: u64,
    footprint_bytes: u64,
    allocator: AllocatorSpec,
}

fn load_target(graph: &Graph, target: &TargetArgs) -> Result<Target> {
    let device = DeviceProfile::load(&target.device)?;
    let (footprint_bytes, _) = footprint(graph);
    let budget_bytes = parse_budget(&target.budget, footprint_bytes)?;
    if budget_bytes > device.memory_bytes {
        bail!(
            "the budget {} is larger than {}'s memory ({}); give at most {} bytes",
            fmt_bytes(budget_bytes),
            device.name,
            fmt_bytes(device.memory_bytes),
            device.memory_bytes
        );
    }
    let allocator = match target.allocator.as_str() {
        "perfect" => AllocatorSpec::Perfect,
        "best-fit" => AllocatorSpec::BestFit(Default::default()),
        "virtual-chunks" => AllocatorSpec::VirtualChunks(Default::default()),
        // Configured per plan from its own allocation trace (see `plan_and_check`).
        "size-class" => AllocatorSpec::SizeClass(Default::default()),
        other => bail!(
            "unknown allocator `{other}`; use perfect, best-fit, size-class or virtual-chunks"
        ),
    };
    Ok(Target {
        device,
        budget_bytes,
        footprint_bytes,
        allocator,
    })
}

fn record_graph_source(plan: &mut Plan, loaded: &LoadedGraph) -> Result<()> {
    plan.graph.zoo_model = loaded.args.model.clone();
    plan.graph.batch = Some(loaded.graph.meta.batch);
    plan.graph.knobs = parse_knobs(&loaded.args.knobs)?;
    plan.graph.optimizer = loaded.args.optimizer.clone();
    plan.graph.file = loaded.args.graph.as_ref().map(|p| {
        std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.clone())
            .display()
            .to_string()
    });
    Ok(())
}

/// Rebuilds the graph a plan names and checks its fingerprint.
fn graph_of_plan(plan: &Plan) -> Result<Graph> {
    let graph = if let Some(model) = &plan.graph.zoo_model {
        let optimizer = plan
            .graph
            .optimizer
            .as_deref()
            .map(parse_optimizer)
            .transpose()?;
        zoo::build(model, plan.graph.batch, &plan.graph.knobs, optimizer)?
    } else if let Some(file) = &plan.graph.file {
        outcore_graph::format::load_graph_file(Path::new(file))?
    } else {
        bail!("the plan names neither a zoo model nor a graph file");
    };
    plan.check_graph(&graph)?;
    Ok(graph)
}

/// The roofline model on `device`, with measured latencies over it when given.
fn cost_model(device: DeviceProfile, latency_table: Option<&Path>) -> Result<Box<dyn CostModel>> {
    let roofline = RooflineModel::new(device);
    Ok(match latency_table {
        None => Box::new(roofline),
        Some(path) => {
            let table = outcore_cost::MeasuredTable::from_json_file(path)?;
            Box::new(outcore_cost::MeasuredModel::new(table, roofline))
        }
    })
}

// ----- planning, checking, simulating -----

/// One planner's outcome on one request, as `compare` reports it.
struct Outcome {
    planner: String,
    plan: Option<Plan>,
    reason: Option<String>,
    verified: bool,
    report: Option<SimReport>,
    planner_time_s: f64,
    simulate_time_s: f64,
}

fn plan_and_check(
    planner: &dyn Planner,
    graph: &Graph,
    cost: &dyn CostModel,
    target: &Target,
    args: &TargetArgs,
) -> Outcome {
    let request = PlanRequest {
        graph,
        cost,
        budget_bytes: target.budget_bytes,
        seed: args.seed,
        time_limit_s: args.seconds,
        allocator: &target.allocator,
        order: None,
    };
    let t0 = Instant::now();
    let outcome = planner.plan(&request);
    let planner_time_s = t0.elapsed().as_secs_f64();
    let mut out = Outcome {
        planner: planner.name().to_string(),
        plan: None,
        reason: None,
        verified: false,
        report: None,
        planner_time_s,
        simulate_time_s: 0.0,
    };
    let mut plan = match outcome {
        Ok(PlanOutcome::Infeasible(why)) => {
            out.reason = Some(why.message);
            return out;
        }
        Err(e) => {
            out.reason = Some(e.to_string());
            return out;
        }
        Ok(PlanOutcome::Feasible(plan)) => *plan,
    };
    plan.device = serde_json::to_value(&target.device).unwrap_or(Value::Null);
    if plan.allocator == AllocatorSpec::Perfect {
        plan.allocator = target.allocator.clone();
    }
    if matches!(target.allocator, AllocatorSpec::SizeClass(_)) {
        // Size the pool for this plan: replay it with a perfect allocator first.
        let mut probe = plan.clone();
        probe.allocator = AllocatorSpec::Perfect;
        let options = SimOptions {
            iterations: 1,
            record_alloc_trace: true,
            ..SimOptions::default()
        };
        if let Ok(Some(trace)) = simulate(graph, &probe, cost, &options).map(|o| o.alloc_trace) {
            plan.allocator = size_classes_for_trace(&trace);
        }
    }
    let violations = verify(&plan, graph);
    out.verified = violations.is_empty();
    if let Some(first) = violations.first() {
        out.reason = Some(format!(
            "the plan fails verification ({} violations), first: {first}",
            violations.len()
        ));
    }
    let t1 = Instant::now();
    match simulate(graph, &plan, cost, &SimOptions::default()) {
        Ok(sim) => {
            if let Some(oom) = &sim.report.oom {
                out.reason.get_or_insert_with(|| {
                    format!(
                        "out of memory in the allocator: {} (free {}, largest free block {})",
                        oom.message,
                        fmt_bytes(oom.free_bytes),
                        fmt_bytes(oom.largest_free_block_bytes)
                    )
                });
            }
            out.report = Some(sim.report);
        }
        Err(e) => {
            out.reason
                .get_or_insert_with(|| format!("simulation failed: {e}"));
        }
    }
    out.simulate_time_s = t1.elapsed().as_secs_f64();
    out.plan = Some(plan);
    out
}

fn outcome_json(o: &Outcome) -> Value {
    let feasible = o.plan.is_some() && o.report.as_ref().is_some_and(|r| r.oom.is_none());
    let r = o.report.as_ref();
    json!({
        "planner": o.planner,
        "feasible": feasible,
        "verified": o.verified,
        "reason": o.reason,
        "iter_time_s": r.map(|r| r.iter_time_s),
        "throughput_vs_ideal": r.map(|r| r.throughput_vs_ideal),
        "peak_bytes": r.map(|r| r.peak_reserved_bytes.max(r.peak_live_bytes)),
        "swap_in_bytes": r.map(|r| r.swap_in_bytes),
        "swap_out_bytes": r.map(|r| r.swap_out_bytes),
        "recompute_time_s": r.map(|r| r.recompute_time_s),
        "stall_time_s": r.map(|r| r.stall_time_s),
        "planner_time_s": o.planner_time_s,
        "simulate_time_s": o.simulate_time_s,
    })
}

fn cmd_zoo(json_out: bool) -> Result<()> {
    let models = zoo::models();
    if json_out {
        let list: Vec<Value> = models
            .iter()
            .map(|m| {
                json!({
                    "name": m.name,
                    "description": m.description,
                    "source": m.source,
                    "default_batch": m.default_batch,
                    "knobs": m.knobs,
                    "reference_param_count": m.reference_param_count,
                })
            })
            .collect();
        return print_json(&Value::Array(list));
    }
    for m in &models {
        let knobs: Vec<String> = m
            .knobs
            .iter()
            .map(|k| format!("--{} {}", k.name, k.default))
            .collect();
        say!("{:<18} {}", m.name, m.description);
        if !knobs.is_empty() {
            say!("{:<18} knobs: {}", "", knobs.join(" "));
        }
    }
    Ok(())
}

fn cmd_stats(args: &GraphArgs, json_out: bool) -> Result<()> {
    let loaded = load_graph(args)?;
    let s = stats(&loaded.graph);
    if json_out {
        return print_json(&serde_json::to_value(&s)?);
    }
    say!("model                 {} (batch {})", s.model, s.batch);
    say!("source                {}", loaded.graph.meta.source);
    say!(
        "ops                   {} (forward {}, backward {}, optimizer {})",
        s.n_ops,
        s.n_ops_by_phase["forward"],
        s.n_ops_by_phase["backward"],
        s.n_ops_by_phase["optimizer"]
    );
    say!(
        "tensors               {} ({} distinct sizes)",
        s.n_tensors,
        s.n_distinct_sizes
    );
    say!(
        "parameters            {} ({})",
        s.param_count,
        fmt_bytes(s.param_bytes)
    );
    say!(
        "optimizer state       {}",
        fmt_bytes(s.optimizer_state_bytes)
    );
    say!(
        "footprint             {} (peak at {})",
        fmt_bytes(s.footprint_bytes),
        s.peak_op.as_deref().unwrap_or("start")
    );
    say!(
        "saved for backward    {}",
        fmt_bytes(s.saved_for_backward_bytes)
    );
    for (phase, flops) in &s.flops_by_phase {
        say!(
            "{:<21} {:.3} TFLOP",
            format!("flops {phase}"),
            *flops as f64 / 1e12
        );
    }
    Ok(())
}

fn cmd_plan(
    args: &GraphArgs,
    target_args: &TargetArgs,
    planner_name: &str,
    output: &Path,
) -> Result<()> {
    let loaded = load_graph(args)?;
    let target = load_target(&loaded.graph, target_args)?;
    let planner = outcore_planners::by_name(planner_name).map_err(|e| anyhow!(e))?;
    let cost = cost_model(target.device.clone(), target_args.latency_table.as_deref())?;
    let cost = cost.as_ref();
    let outcome = plan_and_check(planner.as_ref(), &loaded.graph, cost, &target, target_args);
    let Some(mut plan) = outcome.plan else {
        bail!(
            "{planner_name} finds no plan for {} under {}: {}",
            loaded.graph.meta.model,
            fmt_bytes(target.budget_bytes),
            outcome.reason.unwrap_or_default()
        );
    };
    if !outcome.verified {
        bail!(
            "{}",
            outcome
                .reason
                .unwrap_or_else(|| "the plan fails verification".into())
        );
    }
    record_graph_source(&mut plan, &loaded)?;
    std::fs::write(output, plan.to_json())
        .with_context(|| format!("cannot write {}", output.display()))?;
    let r = outcome.report.as_ref();
    say!(
        "wrote {} ({} steps); simulated {:.4} s/iteration, {:.1}% of ideal throughput, peak {}",
        output.display(),
        plan.n_steps(),
        r.map_or(0.0, |r| r.iter_time_s),
        r.map_or(0.0, |r| r.throughput_vs_ideal * 100.0),
        fmt_bytes(r.map_or(0, |r| r.peak_live_bytes))
    );
    Ok(())
}

fn cmd_simulate(
    plan_path: &Path,
    trace: Option<&Path>,
    alloc_trace: Option<&Path>,
    latency_table: Option<&Path>,
    iterations: usize,
    json_out: bool,
) -> Result<()> {
    let text = std::fs::read_to_string(plan_path)
        .with_context(|| format!("cannot read {}", plan_path.display()))?;
    let plan = Plan::from_json(&text, &plan_path.display().to_string())?;
    let graph = graph_of_plan(&plan)?;
    let device: DeviceProfile = serde_json::from_value(plan.device.clone())
        .map_err(|e| anyhow!("the plan's device profile is unreadable: {e}"))?;
    let cost = cost_model(device, latency_table)?;
    let cost = cost.as_ref();
    let violations = verify(&plan, &graph);
    if let Some(first) = violations.first() {
        bail!(
            "the plan fails verification ({} violations), first: {first}",
            violations.len()
        );
    }
    let options = SimOptions {
        iterations: iterations.max(1),
        record_trace: trace.is_some(),
        record_alloc_trace: alloc_trace.is_some(),
    };
    let t0 = Instant::now();
    let out = simulate(&graph, &plan, cost, &options)?;
    let simulate_time_s = t0.elapsed().as_secs_f64();
    if let (Some(path), Some(doc)) = (trace, &out.trace) {
        std::fs::write(path, serde_json::to_string(doc)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(path), Some(t)) = (alloc_trace, &out.alloc_trace) {
        outcore_alloc::write_trace(path, t)?;
    }
    let outcome = Outcome {
        planner: plan.planner.name.clone(),
        reason: out
            .report
            .oom
            .as_ref()
            .map(|o| format!("out of memory in the allocator: {}", o.message)),
        plan: Some(plan),
        verified: true,
        report: Some(out.report),
        planner_time_s: 0.0,
        simulate_time_s,
    };
    if json_out {
        return print_json(&outcome_json(&outcome));
    }
    let r = outcome.report.clone().ok_or_else(|| anyhow!("no report"))?;
    say!("planner            {}", outcome.planner);
    say!(
        "iteration time     {:.6} s (ideal {:.6} s, {:.1}% of ideal throughput)",
        r.iter_time_s,
        r.ideal_time_s,
        r.throughput_vs_ideal * 100.0
    );
    say!("peak live          {}", fmt_bytes(r.peak_live_bytes));
    say!("peak reserved      {}", fmt_bytes(r.peak_reserved_bytes));
    say!(
        "swapped in / out   {} / {}",
        fmt_bytes(r.swap_in_bytes),
        fmt_bytes(r.swap_out_bytes)
    );
    say!("recompute          {:.6} s", r.recompute_time_s);
    say!("compute stalls     {:.6} s", r.stall_time_s);
    say!(
        "busy               compute {:.6} s, h2d {:.6} s, d2h {:.6} s",
        r.busy.compute_s,
        r.busy.h2d_s,
        r.busy.d2h_s
    );
    if let Some(reason) = &outcome.reason {
        say!("NOT RUNNABLE       {reason}");
    }
    Ok(())
}

fn cmd_compare(
    args: &GraphArgs,
    target_args: &TargetArgs,
    planners: &str,
    json_out: bool,
) -> Result<()> {
    let loaded = load_graph(args)?;
    let target = load_target(&loaded.graph, target_args)?;
    let chosen: Vec<Box<dyn Planner>> = if planners == "all" {
        outcore_planners::all()
    } else {
        planners
            .split(',')
            .map(|n| outcore_planners::by_name(n.trim()).map_err(|e| anyhow!(e)))
            .collect::<Result<_>>()?
    };
    let cost = cost_model(target.device.clone(), target_args.latency_table.as_deref())?;
    let cost = cost.as_ref();
    let ideal_time_s: f64 = (0..loaded.graph.ops.len())
        .map(|i| cost.op_time_s(&loaded.graph, outcore_graph::OpId(i as u32)))
        .sum();
    let outcomes: Vec<Outcome> = chosen
        .iter()
        .map(|p| plan_and_check(p.as_ref(), &loaded.graph, cost, &target, target_args))
        .collect();
    let g = &loaded.graph;
    if json_out {
        let results: Vec<Value> = outcomes.iter().map(outcome_json).collect();
        return print_json(&json!({
            "model": g.meta.model,
            "batch": g.meta.batch,
            "device": target.device.name,
            "budget_bytes": target.budget_bytes,
            "footprint_bytes": target.footprint_bytes,
            "ideal_time_s": ideal_time_s,
            "results": results,
        }));
    }
    say!(
        "{} batch {} on {}: budget {} ({:.0}% of the {} footprint), ideal {:.4} s/iteration",
        g.meta.model,
        g.meta.batch,
        target.device.name,
        fmt_bytes(target.budget_bytes),
        100.0 * target.budget_bytes as f64 / target.footprint_bytes.max(1) as f64,
        fmt_bytes(target.footprint_bytes),
        ideal_time_s
    );
    say!(
        "{:<16} {:>9} {:>10} {:>9} {:>11} {:>11} {:>10} {:>9}",
        "planner",
        "verified",
        "iter s",
        "vs ideal",
        "peak",
        "swapped in",
        "recompute",
        "plan s"
    );
    for o in &outcomes {
        match (&o.report, o.plan.is_some()) {
            (Some(r), true) => say!(
                "{:<16} {:>9} {:>10.4} {:>8.1}% {:>11} {:>11} {:>9.4}s {:>9.3}{}",
                o.planner,
                if o.verified { "yes" } else { "NO" },
                r.iter_time_s,
                r.throughput_vs_ideal * 100.0,
                fmt_bytes(r.peak_live_bytes),
                fmt_bytes(r.swap_in_bytes),
                r.recompute_time_s,
                o.planner_time_s,
                o.reason
                    .as_ref()
                    .map(|x| format!("  ({x})"))
                    .unwrap_or_default()
            ),
            _ => say!(
                "{:<16} infeasible: {}",
                o.planner,
                o.reason.as_deref().unwrap_or("")
            ),
        }
    }
    Ok(())
}

/// A size-class pool for a trace: one class per distinct size, with as many objects
/// as the trace ever holds live at once (the smallest pool of exact-size classes
/// that serves it; SwapAdvisor searches coarser merges of these classes).
fn size_classes_for_trace(trace: &outcore_alloc::Trace) -> AllocatorSpec {
    let mut live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut size_of: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for e in &trace.events {
        match e {
            outcore_alloc::TraceEvent::Alloc { id, size_bytes } => {
                size_of.insert(id.0, *size_bytes);
                let entry = live.entry(*size_bytes).or_insert((0, 0));
                entry.0 += 1;
                entry.1 = entry.1.max(entry.0);
            }
            outcore_alloc::TraceEvent::Free { id } => {
                if let Some(size) = size_of.remove(&id.0)
                    && let Some(entry) = live.get_mut(&size)
                {
                    entry.0 = entry.0.saturating_sub(1);
                }
            }
        }
    }
    let classes = live
        .iter()
        .map(|(&size_bytes, &(_, count))| outcore_alloc::SizeClassSpec { size_bytes, count })
        .collect();
    AllocatorSpec::SizeClass(outcore_alloc::SizeClassConfig {
        classes,
        encoding: None,
    })
}

fn cmd_alloc_replay(
    path: &Path,
    allocator: &str,
    capacity: Option<&str>,
    json_out: bool,
) -> Result<()> {
    let mut trace = outcore_alloc::read_trace(path)?;
    if let Some(c) = capacity {
        trace.capacity_bytes = Some(parse_size(c).with_context(|| format!("capacity `{c}`"))?);
    }
    let kind: outcore_alloc::AllocatorKind = allocator.parse()?;
    let config = outcore_alloc::AllocatorConfig::default_for(kind);
    let config = if let outcore_alloc::AllocatorConfig::SizeClass(_) = config {
        size_classes_for_trace(&trace).config().unwrap_or(config)
    } else {
        config
    };
    let t0 = Instant::now();
    let report = outcore_alloc::replay_with_config(&trace, &config)?;
    let replay_time_s = t0.elapsed().as_secs_f64();
    if json_out {
        let mut v = serde_json::to_value(&report)?;
        v["replay_time_s"] = json!(replay_time_s);
        return print_json(&v);
    }
    say!("allocator          {}", report.allocator);
    say!(
        "operations         {} in {:.4} s",
        report.ops,
        replay_time_s
    );
    say!("peak live          {}", fmt_bytes(report.peak_live_bytes));
    say!(
        "peak reserved      {}",
        fmt_bytes(report.peak_reserved_bytes)
    );
    say!(
        "fragmentation      {}",
        report
            .fragmentation
            .map_or("n/a".into(), |f| format!("{f:.3}"))
    );
    say!("failures           {}", report.failures);
    Ok(())
}

/// The plan `allocator` JSON for `outcore run --allocator NAME --chunk-kib N`.
fn run_allocator(name: &str, chunk_kib: u64) -> Result<AllocatorSpec> {
    Ok(match name {
        "perfect" => AllocatorSpec::Perfect,
        "best-fit" => AllocatorSpec::BestFit(Default::default()),
        "virtual-chunks" => {
            let chunk_bytes = chunk_kib
                .checked_mul(1024)
                .filter(|b| *b > 0)
                .ok_or_else(|| anyhow!("--chunk-kib must be a positive number of KiB"))?;
            // A quarter chunk: small tensors (biases, norms) share chunks instead
            // of wasting most of one each, while packed chunks that fragment stay
            // a small part of a chunk's worth.
            AllocatorSpec::VirtualChunks(outcore_alloc::VirtualChunksConfig {
                chunk_bytes,
                small_alloc_max_bytes: chunk_bytes / 4 / 512 * 512,
            })
        }
        other => bail!("unknown allocator `{other}`; use perfect, best-fit or virtual-chunks"),
    })
}

fn cmd_run(a: RunArgs) -> Result<()> {
    if a.backend != "cpu" {
        bail!(
            "backend `{}` is not available in this build; use --backend cpu (the CUDA backend is a separate crate built with its feature)",
            a.backend
        );
    }
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if a.link_gbps.is_some_and(|g| !g.is_finite() || g <= 0.0) {
        bail!("--link-gbps must be a positive number");
    }
    let allocator = a
        .allocator
        .as_deref()
        .map(|name| run_allocator(name, a.chunk_kib))
        .transpose()?;
    // The plan: loaded, or made here for the CPU device.
    let (graph, mut plan, planner_name) = if let Some(path) = &a.plan {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let plan = Plan::from_json(&text, &path.display().to_string())?;
        let graph = graph_of_plan(&plan)?;
        let name = plan.planner.name.clone();
        (graph, plan, name)
    } else {
        let loaded = load_graph(&a.graph)?;
        let (footprint_bytes, _) = footprint(&loaded.graph);
        let budget_bytes = parse_budget(a.budget.as_deref().unwrap_or("100%"), footprint_bytes)?;
        let planner_name = a.planner.clone().unwrap_or_else(|| "none".into());
        let planner = outcore_planners::by_name(&planner_name).map_err(|e| anyhow!(e))?;
        let device =
            outcore_exec::cpu::device_profile(budget_bytes, a.link_gbps, a.synthetic_flops_per_s);
        let cost = RooflineModel::new(device.clone());
        let target = Target {
            device,
            budget_bytes,
            footprint_bytes,
            allocator: allocator.clone().unwrap_or_default(),
        };
        let target_args = TargetArgs {
            device: "cpu-reference".into(),
            budget: a.budget.clone().unwrap_or_default(),
            allocator: a.allocator.clone().unwrap_or_else(|| "perfect".into()),
            seed: a.seed,
            seconds: 10.0,
            latency_table: None,
        };
        let outcome = plan_and_check(
            planner.as_ref(),
            &loaded.graph,
            &cost,
            &target,
            &target_args,
        );
        let Some(mut plan) = outcome.plan else {
            bail!(
                "{planner_name} finds no plan for {} under {}: {}",
                loaded.graph.meta.model,
                fmt_bytes(budget_bytes),
                outcome.reason.unwrap_or_default()
            );
        };
        if !outcome.verified {
            bail!(
                "{}",
                outcome
                    .reason
                    .unwrap_or_else(|| "the plan fails verification".into())
            );
        }
        record_graph_source(&mut plan, &loaded)?;
        (loaded.graph, plan, planner_name)
    };
    // The arena runs the named allocator (a loaded plan's own otherwise).
    if let Some(allocator) = allocator {
        plan.allocator = allocator;
    }
    let violations = verify(&plan, &graph);
    if let Some(first) = violations.first() {
        bail!(
            "the plan fails verification ({} violations), first: {first}",
            violations.len()
        );
    }
    // Predict with the simulator on the same plan and cost model.
    let device =
        outcore_exec::cpu::device_profile(plan.budget_bytes, a.link_gbps, a.synthetic_flops_per_s);
    plan.device = serde_json::to_value(&device)?;
    let cost = RooflineModel::new(device);
    let predicted = simulate(&graph, &plan, &cost, &SimOptions::default())?.report;

    let options = outcore_exec::ExecOptions {
        iters: a.iters,
        check: a.check,
        seed: a.seed,
        synthetic_flops_per_s: a.synthetic_flops_per_s,
        trace: a.trace.is_some(),
        synthetic_kernels: a.synthetic,
        // Synthetic kernels take exactly the simulator's op times, so the measured
        // gap is the executor's own overhead (issue, copies, allocation, threads).
        op_time_s: a.synthetic.then(|| {
            (0..graph.ops.len())
                .map(|i| cost.op_time_s(&graph, outcore_graph::OpId(i as u32)))
                .collect()
        }),
        ..outcore_exec::ExecOptions::default()
    };
    let backend = outcore_exec::CpuBackend::new(outcore_exec::CpuBackendOptions {
        link_bytes_per_s: a.link_gbps.map(|g| g * 1e9),
        ..outcore_exec::CpuBackendOptions::default()
    });
    let report = outcore_exec::execute(&graph, &plan, &backend, &options)?;

    let matches_reference = if a.reference {
        let (footprint_bytes, _) = footprint(&graph);
        let info = outcore_plan::PlannerInfo {
            name: "reference".into(),
            seed: None,
            settings: Value::Null,
        };
        // Twice the footprint: room for the arena's fragmentation.
        let reference_plan =
            outcore_plan::lower_in_order(&graph, info, footprint_bytes.saturating_mul(2));
        let backend = outcore_exec::CpuBackend::new(outcore_exec::CpuBackendOptions::default());
        let reference_options = outcore_exec::ExecOptions {
            check: false,
            trace: false,
            ..options.clone()
        };
        let reference =
            outcore_exec::execute(&graph, &reference_plan, &backend, &reference_options)?;
        Some(reference.final_state() == report.final_state())
    } else {
        None
    };
    if let Some(path) = &a.trace {
        std::fs::write(path, serde_json::to_string(&report.trace)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &a.profile_out {
        let mut table = outcore_cost::MeasuredTable::new("cpu-reference", &graph.meta.model);
        for e in &report.latency_table.entries {
            table.push(
                outcore_graph::OpId(e.op),
                &e.name,
                e.time_s,
                e.samples as u64,
            );
        }
        table.write_json_file(path)?;
    }
    let losses: Vec<Value> = report
        .losses
        .iter()
        .map(|l| if l.is_finite() { json!(l) } else { Value::Null })
        .collect();
    let out = json!({
        "planner": planner_name,
        "iters": report.iters,
        "measured_iter_time_s": report.measured_iter_time_s,
        "predicted_iter_time_s": predicted.iter_time_s,
        "peak_device_bytes": report.peak_device_bytes,
        "budget_bytes": plan.budget_bytes,
        "swap_in_bytes": report.swap_in_bytes,
        "swap_out_bytes": report.swap_out_bytes,
        "recomputes": report.recomputes,
        "synthetic_kernels": a.synthetic,
        "iter_times_s": report.iter_times_s,
        "checks_passed": report.checks_passed,
        "matches_reference": matches_reference,
        "losses": losses,
    });
    if a.json {
        return print_json(&out);
    }
    say!(
        "planner            {planner_name} on the cpu backend, {} iterations",
        report.iters
    );
    say!(
        "iteration time     measured {:.6} s, predicted {:.6} s",
        report.measured_iter_time_s,
        predicted.iter_time_s
    );
    say!(
        "peak device        {} of a {} arena",
        fmt_bytes(report.peak_device_bytes),
        fmt_bytes(plan.budget_bytes)
    );
    say!(
        "swapped in / out   {} / {} per iteration",
        fmt_bytes(report.swap_in_bytes),
        fmt_bytes(report.swap_out_bytes)
    );
    say!(
        "checks             {}",
        report.checks_passed.map_or("off".to_string(), |c| if c {
            "passed".into()
        } else {
            "FAILED".into()
        })
    );
    if let Some(m) = matches_reference {
        say!(
            "vs reference       {}",
            if m {
                "bit-identical parameters"
            } else {
                "DIFFERENT parameters"
            }
        );
    }
    if let (Some(first), Some(last)) = (report.losses.first(), report.losses.last()) {
        say!("loss               {first:.4} -> {last:.4}");
    }
    Ok(())
}
