//! The subcommands: turn arguments into facade calls (`outcore::…`) and print
//! the typed results as tables or JSON. No planning, checking or simulating
//! logic lives here.

use crate::args::{Cli, Command, GraphArgs, MaxBatchArgs, RunArgs, TargetArgs};
use crate::progress::{self, StopFlag};
use anyhow::{Context, Result, bail};
use outcore::{
    Comparison, GraphSource, LoadedGraph, PlanOptions, PlannerOutcome, Runnability, SimReport,
    SimulateOptions, Target,
};
use outcore_graph::{stats, zoo};
use outcore_plan::fmt_bytes;
use serde_json::{Value, json};
use std::path::Path;

/// Prints a line; a closed pipe (`outcore zoo | head`) ends the program quietly.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

pub fn run(cli: Cli, stop: &StopFlag) -> Result<()> {
    match cli.command {
        Command::Zoo { json } => cmd_zoo(json),
        Command::Stats { graph, json } => cmd_stats(&graph, json),
        Command::Export { graph, output } => cmd_export(&graph, &output),
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
        } => cmd_compare(&graph, &target, &planners, json, stop),
        Command::Run(args) => cmd_run(args, stop),
        Command::BenchSuite {
            planners,
            seconds,
            retry_gap,
            retry_seconds,
            retry_moves,
            moves,
            only,
            allocator,
            json,
        } => {
            let limits = SuiteLimits {
                seconds,
                max_moves: moves
                    .map(|m| outcore::check_moves(m).context("--moves"))
                    .transpose()?,
                retry: suite_retry(seconds, retry_gap, retry_seconds, retry_moves)?,
            };
            cmd_bench_suite(&planners, limits, only.as_deref(), &allocator, json, stop)
        }
        Command::MaxBatch(args) => cmd_max_batch(&args, stop),
        Command::Verify { plan, json } => cmd_verify(&plan, json),
        Command::Report {
            plan,
            compare,
            output,
            svg_dir,
            latency_table,
        } => cmd_report(
            plan.as_deref(),
            &compare,
            &output,
            svg_dir.as_deref(),
            latency_table.as_deref(),
        ),
        Command::Colocate {
            jobs,
            device,
            budget,
            trace,
            tensile,
            run,
            json,
        } => cmd_colocate(
            &jobs,
            &device,
            budget.as_deref(),
            trace.as_deref(),
            ColocateMode { tensile, run },
            json,
        ),
        Command::AllocReplay {
            trace,
            allocator,
            capacity,
            json,
        } => cmd_alloc_replay(&trace, &allocator, capacity.as_deref(), json),
    }
}

/// What `outcore colocate` adds to the list's own plans.
struct ColocateMode {
    /// TENSILE over all jobs beside per-job capuchin and vdnn-conv, instead.
    tensile: bool,
    /// Also train the jobs at once on the CPU executor.
    run: bool,
}

/// `outcore colocate`: the list's own plans, or with `tensile` TENSILE over
/// all jobs beside per-job capuchin and vdnn-conv (one block each); with
/// `run`, also the jobs trained at once on the CPU executor.
fn cmd_colocate(
    jobs: &Path,
    device: &str,
    budget: Option<&str>,
    trace: Option<&Path>,
    mode: ColocateMode,
    json_out: bool,
) -> Result<()> {
    let list = outcore::load_job_list(jobs)?;
    let record = trace.is_some();
    let (mut json, groups) = if mode.tensile {
        let r = outcore::colocate_tensile(&list, device, budget, record)?;
        let json = serde_json::to_value(&r)?;
        let groups = vec![
            ("TENSILE over all jobs (tensile-multi)", r.tensile),
            (
                "each job alone: capuchin at TENSILE's bound for it",
                r.capuchin,
            ),
            (
                "each job alone: vdnn-conv at TENSILE's bound for it",
                r.vdnn_conv,
            ),
        ];
        (json, groups)
    } else {
        let r = outcore::colocate(&list, device, budget, record)?;
        (serde_json::to_value(&r)?, vec![("", r)])
    };
    // The trace, when asked for, is the first group's run.
    write_trace(trace, groups[0].1.trace.as_ref())?;
    let cpu_run = if mode.run {
        Some(outcore::colocate_run(
            &list,
            &outcore::ColocateRunOptions::default(),
        )?)
    } else {
        None
    };
    if json_out {
        if let (Some(run), Value::Object(map)) = (&cpu_run, &mut json) {
            map.insert("cpu_run".into(), serde_json::to_value(run)?);
        }
        print_json(&json)?;
        return colocate_run_verdict(cpu_run.as_ref());
    }
    for (title, group) in &groups {
        if !title.is_empty() {
            say!("== {title}");
        }
        print_colocate(group);
    }
    for (_, group) in &groups {
        check_fits(group)?;
    }
    if let Some(run) = &cpu_run {
        print_colocate_run(run);
    }
    colocate_run_verdict(cpu_run.as_ref())
}

fn write_trace(path: Option<&Path>, trace: Option<&Value>) -> Result<()> {
    if let (Some(path), Some(t)) = (path, trace) {
        std::fs::write(path, serde_json::to_string(t)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Per-job rows and the global line of one colocated run.
fn print_colocate(r: &outcore::ColocateResult) {
    say!(
        "{:<12} {:<16} {:>10} {:>10} {:>10} {:>12} {:>10} {:>7} {:>7} {:>7}",
        "job",
        "planner",
        "start_s",
        "finish_s",
        "mean_it_s",
        "peak",
        "plan_budg",
        "MSR",
        "EOR",
        "CBR"
    );
    for (row, job) in r.jobs.iter().zip(&r.report.jobs) {
        let n = job.per_iteration_time_s.len().max(1) as f64;
        let mean_s = job.per_iteration_time_s.iter().sum::<f64>() / n;
        say!(
            "{:<12} {:<16} {:>10.4} {:>10.4} {:>10.4} {:>12} {:>10} {:>7.4} {:>7.4} {:>7.4}",
            row.name,
            row.planner,
            job.start_s,
            job.finish_s,
            mean_s,
            fmt_bytes(job.peak_live_bytes),
            fmt_bytes(row.plan_budget_bytes),
            row.msr,
            row.eor,
            row.cbr
        );
    }
    let g = &r.metrics.global;
    say!(
        "global: peak {} of {} on {} ({}), makespan {:.4} s; unscheduled: peak {}, makespan {:.4} s; MSR {:.4} EOR {:.4} CBR {:.4}",
        fmt_bytes(r.report.peak_live_bytes),
        fmt_bytes(r.budget_bytes),
        r.device,
        if r.report.fits_budget {
            "fits"
        } else {
            "OVER BUDGET"
        },
        r.report.makespan_s,
        fmt_bytes(r.vanilla.peak_live_bytes),
        r.vanilla.makespan_s,
        g.msr,
        g.eor,
        g.cbr
    );
}

/// An error (non-zero exit) when the jobs together exceed their budget.
fn check_fits(r: &outcore::ColocateResult) -> Result<()> {
    if !r.report.fits_budget {
        bail!(
            "the jobs together peak at {}, over the {} they share; lower the jobs' budgets or give more memory",
            fmt_bytes(r.report.peak_live_bytes),
            fmt_bytes(r.budget_bytes)
        );
    }
    Ok(())
}

/// The jobs as trained together on the CPU executor.
fn print_colocate_run(run: &outcore::ColocateRunResult) {
    say!(
        "on the CPU executor, one arena of {}, all jobs at once ({:.3} s), measured global peak {}:",
        fmt_bytes(run.capacity_bytes),
        run.wall_time_s,
        fmt_bytes(run.peak_device_bytes)
    );
    say!(
        "{:<12} {:<16} {:>10} {:>10} {:>6} {:>10} {:>12} {:>10} {:>10} {:>7} {:>6}",
        "job",
        "planner",
        "window",
        "plan_budg",
        "iters",
        "meas_it_s",
        "peak",
        "swap_in",
        "recompute",
        "checks",
        "alone"
    );
    let yes_no = |v: Option<bool>| match v {
        Some(true) => "same",
        Some(false) => "DIFF",
        None => "-",
    };
    for j in &run.jobs {
        if let Some(e) = &j.error {
            say!("{:<12} {:<16} FAILED: {e}", j.name, j.planner);
            continue;
        }
        say!(
            "{:<12} {:<16} {:>10} {:>10} {:>6} {:>10.4} {:>12} {:>10} {:>10} {:>7} {:>6}",
            j.name,
            j.planner,
            fmt_bytes(j.window_bytes),
            fmt_bytes(j.plan_budget_bytes),
            j.iters,
            j.measured_iter_time_s.unwrap_or(f64::NAN),
            fmt_bytes(j.peak_device_bytes.unwrap_or(0)),
            fmt_bytes(j.swap_in_bytes.unwrap_or(0)),
            j.recomputes.unwrap_or(0),
            match j.checks_passed {
                Some(true) => "passed",
                Some(false) => "FAILED",
                None => "-",
            },
            yes_no(j.matches_reference)
        );
    }
}

/// An error when a job of the CPU run failed or differs from its run alone.
fn colocate_run_verdict(run: Option<&outcore::ColocateRunResult>) -> Result<()> {
    match run {
        Some(run) if !run.all_ok() => {
            let bad: Vec<&str> = run
                .jobs
                .iter()
                .filter(|j| {
                    j.error.is_some()
                        || j.checks_passed == Some(false)
                        || j.matches_reference == Some(false)
                })
                .map(|j| j.name.as_str())
                .collect();
            bail!(
                "on the CPU executor, job(s) {} failed or differ from training alone; see the table above",
                bad.join(", ")
            )
        }
        _ => Ok(()),
    }
}

fn print_json(value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    say!("{text}");
    Ok(())
}

// ----- arguments to facade inputs -----

fn graph_source(args: &GraphArgs) -> Result<GraphSource> {
    Ok(match (&args.model, &args.graph) {
        (Some(model), None) => GraphSource::Zoo {
            model: model.clone(),
            batch: args.batch,
            knobs: outcore::parse_knobs(&args.knobs)?,
            optimizer: args.optimizer.clone(),
        },
        (None, Some(path)) => {
            // A graph file fixes its batch, shapes and optimizer when exported:
            // a zoo flag given with it would be silently ignored.
            let knob = args
                .knobs
                .first()
                .map(|k| format!("--{}", k.replace('=', " ")))
                .unwrap_or_default();
            let ignored = [
                ("--batch".to_string(), args.batch.is_some()),
                (knob, !args.knobs.is_empty()),
                ("--optimizer".to_string(), args.optimizer.is_some()),
            ];
            if let Some((flag, _)) = ignored.iter().find(|(_, given)| *given) {
                bail!(
                    "{flag} does not apply to --graph {}: a graph file fixes its batch, shapes and optimizer when exported; drop {flag}, or use --model NAME",
                    path.display()
                );
            }
            GraphSource::File { path: path.clone() }
        }
        _ => bail!("give a model with --model NAME or a graph file with --graph FILE"),
    })
}

fn load_graph(args: &GraphArgs) -> Result<LoadedGraph> {
    Ok(outcore::load_graph(&graph_source(args)?)?)
}

fn plan_options(args: &TargetArgs) -> Result<PlanOptions> {
    Ok(PlanOptions {
        seed: args.seed,
        time_limit_s: outcore::check_time_limit_s(args.seconds)?,
        max_moves: args.moves.map(outcore::check_moves).transpose()?,
        latency_table: args
            .latency_table
            .as_deref()
            .map(outcore::load_latency_table)
            .transpose()?,
        on_progress: None,
    })
}

fn target(graph: &LoadedGraph, args: &TargetArgs) -> Result<Target> {
    Ok(Target::parse(
        graph,
        &args.device,
        &args.budget,
        &args.allocator,
    )?)
}

// ----- printing -----

/// One judged plan as `compare` and `simulate` print it in JSON.
fn outcome_json(
    planner: &str,
    feasible: bool,
    verified: bool,
    reason: Option<&str>,
    report: Option<&SimReport>,
    planner_time_s: f64,
    simulate_time_s: f64,
) -> Value {
    json!({
        "planner": planner,
        "feasible": feasible,
        "verified": verified,
        "reason": reason,
        "iter_time_s": report.map(|r| r.iter_time_s),
        "throughput_vs_ideal": report.map(|r| r.throughput_vs_ideal),
        "peak_bytes": report.map(|r| r.peak_reserved_bytes.max(r.peak_live_bytes)),
        "swap_in_bytes": report.map(|r| r.swap_in_bytes),
        "swap_out_bytes": report.map(|r| r.swap_out_bytes),
        "recompute_time_s": report.map(|r| r.recompute_time_s),
        "stall_time_s": report.map(|r| r.stall_time_s),
        "planner_time_s": planner_time_s,
        "simulate_time_s": simulate_time_s,
    })
}

fn planner_outcome_json(o: &PlannerOutcome) -> Value {
    let mut v = outcome_json(
        &o.planner,
        o.is_feasible(),
        o.verified,
        o.reason.as_deref(),
        o.report.as_ref(),
        o.planner_time_s,
        o.simulate_time_s,
    );
    v["status"] = serde_json::to_value(o.status).unwrap_or(Value::Null);
    v
}

fn cmd_export(args: &GraphArgs, output: &Path) -> Result<()> {
    let loaded = load_graph(args)?;
    let text = outcore_graph::format::native::to_string(&loaded.graph);
    if output == Path::new("-") {
        // The graph is the output; the summary line would corrupt it.
        say!("{text}");
        return Ok(());
    }
    std::fs::write(output, text).with_context(|| format!("cannot write {}", output.display()))?;
    say!(
        "wrote {} ({} ops, {} tensors, {})",
        output.display(),
        loaded.graph.ops.len(),
        loaded.graph.tensors.len(),
        outcore_graph::format::native::FORMAT
    );
    Ok(())
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
    let blocked: Vec<String> = s
        .not_recomputable_by_reason
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    say!(
        "not recomputable      {} ({})",
        s.not_recomputable_by_reason.values().sum::<usize>(),
        blocked.join(", ")
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
    planner: &str,
    output: &Path,
) -> Result<()> {
    let loaded = load_graph(args)?;
    let target = target(&loaded, target_args)?;
    let options = plan_options(target_args)?;
    let bound = match options.max_moves {
        Some(moves) => format!("at most {moves} scored moves per start"),
        None => format!("a search ends within {} s", options.time_limit_s),
    };
    // No spinner beside a planner that draws its own progress line
    // (SwapAdvisor's line per generation).
    let spinner = if outcore::planner_draws_own_progress(planner) {
        indicatif::ProgressBar::hidden()
    } else {
        progress::spinner(format!("planning with {planner} ({bound})"))
    };
    // Only a plan that verifies and runs under its allocator comes back.
    let result = outcore::plan(&loaded, planner, &target, &options);
    spinner.finish_and_clear();
    let result = result?;
    outcore::write_plan(&result.plan, output)?;
    let r = &result.report;
    say!(
        "wrote {} ({} steps, {} allocator); simulated {:.4} s/iteration, {:.1}% of ideal throughput, peak {}",
        output.display(),
        result.plan.n_steps(),
        result.plan.allocator.name(),
        r.iter_time_s,
        r.throughput_vs_ideal * 100.0,
        fmt_bytes(r.peak_live_bytes.max(r.peak_reserved_bytes))
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
    check_output_path("--trace", trace)?;
    check_output_path("--alloc-trace", alloc_trace)?;
    let plan = outcore::load_plan(plan_path)?;
    let options = SimulateOptions {
        iterations,
        record_trace: trace.is_some(),
        record_alloc_trace: alloc_trace.is_some(),
        latency_table: latency_table.map(outcore::load_latency_table).transpose()?,
    };
    let out = outcore::simulate_plan(&plan, &options)?;
    if let (Some(path), Some(doc)) = (trace, &out.trace) {
        std::fs::write(path, serde_json::to_string(doc)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let (Some(path), Some(t)) = (alloc_trace, &out.alloc_trace) {
        outcore_alloc::write_trace(path, t)?;
    }
    if json_out {
        let mut v = outcome_json(
            &out.planner,
            out.runnable,
            out.verification.passed,
            out.reason.as_deref(),
            Some(&out.report),
            0.0,
            out.simulate_time_s,
        );
        // No planner ran here: a 0.0 would read as a measured time.
        v["planner_time_s"] = Value::Null;
        v["allocator"] = json!(plan.allocator.name());
        print_json(&v)?;
    } else {
        print_simulation(&out, plan.allocator.name());
    }
    // A report of a plan that cannot run is not a success.
    if let Some(reason) = &out.reason {
        bail!("{reason}");
    }
    Ok(())
}

fn print_simulation(out: &outcore::SimulateResult, allocator: &str) {
    let r = &out.report;
    say!("planner            {}", out.planner);
    say!("allocator          {allocator}");
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
    if let Some(reason) = &out.reason {
        say!("NOT RUNNABLE       {reason}");
    }
}

/// Fails before any work when an output file named by `flag` cannot be
/// written where asked (a directory in the way, a parent directory that does
/// not exist), so that a command never writes one of its files, then fails
/// on another and loses the run.
fn check_output_path(flag: &str, path: Option<&Path>) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    if path.is_dir() {
        bail!(
            "{flag} {}: is a directory; give the path of a file to write",
            path.display()
        );
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        bail!(
            "{flag} {}: the directory {} does not exist; create it or give another path",
            path.display(),
            parent.display()
        );
    }
    Ok(())
}

fn cmd_report(
    plan_path: Option<&Path>,
    compare: &[std::path::PathBuf],
    output: &Path,
    svg_dir: Option<&Path>,
    latency_table: Option<&Path>,
) -> Result<()> {
    if plan_path.is_none()
        && let Some(table) = latency_table
    {
        bail!(
            "--latency-table {}: applies to a plan's report only (--plan), not to --compare, whose runs carry their own simulated times; drop it, or report a plan",
            table.display()
        );
    }
    // The figures' directory before the report: a path that cannot be one
    // fails the command before any file is written.
    check_output_path("--output", Some(output))?;
    if let Some(dir) = svg_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--svg-dir {}: cannot create the directory", dir.display()))?;
    }
    let report = match plan_path {
        Some(path) => {
            let plan = outcore::load_plan(path)?;
            let table = latency_table.map(outcore::load_latency_table).transpose()?;
            outcore::plan_report(&plan, table.as_ref())?
        }
        None => {
            let mut runs = Vec::new();
            for path in compare {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                runs.extend(outcore::parse_compare(&text, &path.display().to_string())?);
            }
            outcore::compare_report(&runs)?
        }
    };
    let html = report.to_html();
    std::fs::write(output, &html).with_context(|| format!("cannot write {}", output.display()))?;
    say!(
        "wrote {} ({} figures, {} bytes)",
        output.display(),
        report.figures.len(),
        html.len()
    );
    if let Some(dir) = svg_dir {
        for path in report.write_svgs(dir)? {
            say!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn cmd_compare(
    args: &GraphArgs,
    target_args: &TargetArgs,
    planners: &str,
    json_out: bool,
    stop: &StopFlag,
) -> Result<()> {
    let loaded = load_graph(args)?;
    let target = target(&loaded, target_args)?;
    let mut options = plan_options(target_args)?;
    let planners = outcore::parse_planner_list(planners)?;
    let bar = progress::bar("planners", planners.len() as u64);
    options.on_progress = Some(progress::iteration_hook(bar, stop.clone()));
    let c = outcore::compare(&loaded, &planners, &target, &options)?;
    // Where no planner listed has a plan (`ideal`, unlimited, aside; a list
    // of `ideal` alone asks for the bound, not a plan), a budget under which
    // one exists (`outcore::budget_hint`).
    let held: Vec<_> = c.results.iter().filter(|o| o.planner != "ideal").collect();
    let none_fits = !held.is_empty() && held.iter().all(|o| !o.is_feasible());
    let hint = if none_fits {
        outcore::budget_hint(&loaded, &target, &options)
    } else {
        None
    };
    if json_out {
        let results: Vec<Value> = c
            .results
            .iter()
            .map(|o| {
                let mut v = planner_outcome_json(o);
                v["gap_to_bound"] = json!(c.gap_to_bound(o));
                v
            })
            .collect();
        print_json(&json!({
            "model": c.model,
            "batch": c.batch,
            "device": c.device,
            "budget_bytes": c.budget_bytes,
            "footprint_bytes": c.footprint_bytes,
            "allocator": c.allocator,
            "ideal_time_s": c.ideal_time_s,
            "lower_bound": c.lower_bound,
            "swap_only_bound": c.swap_only_bound,
            "results": results,
            "budget_hint": hint,
        }))?;
    } else {
        print_comparison(&c);
        if none_fits {
            say!("{}", hint_line(hint.as_ref(), &target));
        }
    }
    // A plan that fails verification is a planner bug: say so by the exit code.
    let broken: Vec<&str> = c.not_runnable().map(|o| o.planner.as_str()).collect();
    if !broken.is_empty() {
        bail!(
            "not runnable: the plans of {} fail verification or simulation (see their rows)",
            broken.join(", ")
        );
    }
    Ok(())
}

/// `compare`'s last line where no planner listed has a plan: the budget hint
/// for `target`.
fn hint_line(hint: Option<&outcore::BudgetHint>, target: &Target) -> String {
    match hint {
        None => {
            "no planner listed has a plan, nor do `dtr`, `window` or `outcore` up to 4x the budget"
                .into()
        }
        Some(h) if h.at_budget_of(target) => {
            format!("no planner listed has a plan; {}", h.describe(target))
        }
        Some(h) => format!(
            "no planner listed has a plan; {}: give that budget, or lower the batch",
            h.describe(target)
        ),
    }
}

/// `--retry-gap` and `--retry-seconds` (clap asks for both or neither),
/// checked: a gap above zero and a second search longer than the first.
fn suite_retry(
    seconds: f64,
    gap: Option<f64>,
    retry_seconds: Option<f64>,
    retry_moves: Option<i64>,
) -> Result<Option<outcore::Retry>> {
    let (Some(gap), Some(retry_seconds)) = (gap, retry_seconds) else {
        return Ok(None);
    };
    let max_moves = retry_moves
        .map(|m| outcore::check_moves(m).context("--retry-moves"))
        .transpose()?;
    if !(gap.is_finite() && gap > 0.0) {
        bail!(
            "--retry-gap {gap}: a fraction above the lower bound must be a finite number above 0 (e.g. 0.1 for 10%)"
        );
    }
    let time_limit_s = outcore::check_time_limit_s(retry_seconds).context("--retry-seconds")?;
    if time_limit_s <= seconds {
        bail!(
            "--retry-seconds {retry_seconds}: the second search must be longer than the first (--seconds {seconds}); give more than {seconds}"
        );
    }
    Ok(Some(outcore::Retry {
        above_gap: gap,
        time_limit_s,
        max_moves,
    }))
}

/// What bounds the suite's searches: `--seconds`, `--moves`, and the retry.
struct SuiteLimits {
    seconds: f64,
    max_moves: Option<u64>,
    retry: Option<outcore::Retry>,
}

fn cmd_bench_suite(
    planners: &str,
    limits: SuiteLimits,
    only: Option<&str>,
    allocator: &str,
    json_out: bool,
    stop: &StopFlag,
) -> Result<()> {
    let planners = outcore::parse_planner_list(planners)?;
    // Checked before the first graph loads, not at the first case.
    outcore::parse_allocator(allocator)?;
    let mut suite = outcore::standard_suite(planners.clone(), &outcore::default_repo_root());
    suite.allocator = allocator.to_string();
    suite.retry = limits.retry;
    if let Some(only) = only {
        let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
        suite.graphs.retain(|g| {
            wanted
                .iter()
                .any(|w| g.label.split_whitespace().next() == Some(*w))
        });
        if suite.graphs.is_empty() {
            bail!(
                "--only {only} matches no graph of the suite; its graphs are: resnet50, inception_v3, densenet121, mobilenet_v2, vgg16, bert-base, gpt2, vit_b_16 (and the PyTorch exports of resnet50, gpt2, vgg16, mobilenet_v2)"
            );
        }
    }
    let cases = suite.graphs.len() * suite.devices.len() * suite.budget_percents.len();
    let options = PlanOptions {
        time_limit_s: outcore::check_time_limit_s(limits.seconds)?,
        max_moves: limits.max_moves,
        on_progress: Some(progress::iteration_hook(
            progress::bar("cases", cases as u64),
            stop.clone(),
        )),
        ..PlanOptions::default()
    };
    let result = outcore::run_suite(&suite, &options)?;
    if json_out {
        // In the JSON too (`skipped`), but a graph left out of the table
        // should not go unnoticed: e.g. the PyTorch exports, read relative
        // to the repository's root, from another directory.
        for (label, why) in &result.skipped {
            eprintln!("warning: skipped {label}: {why}");
        }
        return print_json(&serde_json::to_value(&result)?);
    }
    say!("allocator: {}", result.allocator);
    if let Some(moves) = result.max_moves {
        say!("outcore's searches: {moves} scored moves per start");
    }
    say!("{}", result.to_markdown(&planners));
    for (label, why) in &result.skipped {
        say!("skipped {label}: {why}");
    }
    Ok(())
}

fn print_comparison(c: &Comparison) {
    say!(
        "{} batch {} on {}: budget {} ({:.0}% of the {} footprint), {} allocator, ideal {:.4} s/iteration",
        c.model,
        c.batch,
        c.device,
        fmt_bytes(c.budget_bytes),
        100.0 * c.budget_bytes as f64 / c.footprint_bytes.max(1) as f64,
        fmt_bytes(c.footprint_bytes),
        c.allocator,
        c.ideal_time_s
    );
    match &c.lower_bound {
        outcore::Bound::Time(b) => say!(
            "lower bound {:.4} s/iteration ({:.1}% of ideal throughput at most){}",
            b.time_s,
            100.0 * c.ideal_time_s / b.time_s.max(f64::MIN_POSITIVE),
            bound_reason(b)
        ),
        outcore::Bound::NoPlan {
            op,
            working_set_bytes,
            ..
        } => say!(
            "lower bound: no plan exists: op `{op}` needs {} at once",
            fmt_bytes(*working_set_bytes)
        ),
    }
    // Only where it says more: a swap-only planner's room to gain.
    if let (Some(any_s), Some(swap_s)) = (c.lower_bound.time_s(), c.swap_only_bound.time_s())
        && swap_s > any_s * 1.001
    {
        say!(
            "swap-only bound {swap_s:.4} s/iteration ({:.1}% of ideal throughput at most) for plans that recompute nothing",
            100.0 * c.ideal_time_s / swap_s.max(f64::MIN_POSITIVE)
        );
    }
    say!(
        "{:<16} {:>9} {:>10} {:>9} {:>8} {:>11} {:>11} {:>10} {:>9}",
        "planner",
        "verified",
        "iter s",
        "vs ideal",
        "gap",
        "peak",
        "swapped in",
        "recompute",
        "plan s"
    );
    for o in &c.results {
        let reason = o.reason.as_deref().unwrap_or("");
        match (o.status, &o.report) {
            (Runnability::Feasible, Some(r)) => say!(
                "{:<16} {:>9} {:>10.4} {:>8.1}% {:>8} {:>11} {:>11} {:>9.4}s {:>9.3}",
                o.planner,
                "yes",
                r.iter_time_s,
                r.throughput_vs_ideal * 100.0,
                c.gap_to_bound(o)
                    .map_or("-".to_string(), |g| format!("{:.1}%", g * 100.0)),
                fmt_bytes(r.peak_live_bytes.max(r.peak_reserved_bytes)),
                fmt_bytes(r.swap_in_bytes),
                r.recompute_time_s,
                o.planner_time_s
            ),
            (Runnability::NotRunnable, _) => say!("{:<16} NOT RUNNABLE: {reason}", o.planner),
            _ => say!("{:<16} infeasible: {reason}", o.planner),
        }
    }
}

fn cmd_max_batch(args: &MaxBatchArgs, stop: &StopFlag) -> Result<()> {
    let device = outcore::load_device(&args.device)?;
    let budget_bytes = match args.budget.as_deref() {
        None => device.memory_bytes,
        Some(text) if text.trim().ends_with('%') => bail!(
            "budget `{text}`: a percentage of the footprint does not apply to max-batch, whose footprint grows with the batch; accepted: bytes or a size like 11GB / 10GiB, at most the device's memory; drop --budget to use all of it"
        ),
        Some(text) => outcore::parse_size(text).context("--budget")?,
    };
    let request = outcore::MaxBatchRequest {
        model: args.model.clone(),
        knobs: outcore::parse_knobs(&args.knobs)?,
        optimizer: args.optimizer.clone(),
        device,
        budget_bytes,
        allocator: outcore::parse_allocator(&args.allocator)?,
        batch_limit: args.limit,
    };
    let planners = outcore::parse_planner_list(&args.planners)?;
    let options = PlanOptions {
        seed: args.seed,
        time_limit_s: outcore::check_time_limit_s(args.seconds)?,
        max_moves: None,
        latency_table: None,
        on_progress: Some(progress::iteration_hook(
            progress::bar("planners", planners.len() as u64),
            stop.clone(),
        )),
    };
    let result = outcore::max_batch(&request, &planners, &options)?;
    if args.json {
        print_json(&serde_json::to_value(&result)?)?;
    } else {
        print_max_batch(&result);
    }
    let broken: Vec<&str> = result
        .rows
        .iter()
        .filter(|r| r.not_runnable.is_some())
        .map(|r| r.planner.as_str())
        .collect();
    if !broken.is_empty() {
        bail!(
            "not runnable: the plans of {} fail verification or simulation at some batch (see their rows)",
            broken.join(", ")
        );
    }
    if result.none_trains() {
        bail!("{}", no_batch_trains(&result));
    }
    Ok(())
}

/// `max-batch`'s error where no planner listed plans batch 1: the budget is
/// too small for the model, so the answer is a budget that trains batch 1
/// (the result's hint), or the lack of one.
fn no_batch_trains(r: &outcore::MaxBatchResult) -> String {
    let head = format!(
        "no planner listed plans even batch 1 of {} under {} ({} bytes)",
        r.model,
        fmt_bytes(r.budget_bytes),
        r.budget_bytes
    );
    match &r.budget_hint {
        None => format!(
            "{head}, nor do `dtr`, `window` or `outcore` up to 4x that budget or the device's memory: raise --budget well above it (each row above says what its planner lacks), or train a smaller model (see --knob)"
        ),
        Some(h) if h.budget_bytes <= r.budget_bytes => format!(
            "{head}, but `{}` plans batch 1 under it ({:.4} s/iteration): add it to --planners",
            h.planner, h.iter_time_s
        ),
        Some(h) => format!(
            "{head}; `{}` plans batch 1 under {} ({} bytes, {:.4} s/iteration): raise --budget to at least that, at most the device's memory",
            h.planner,
            fmt_bytes(h.budget_bytes),
            h.budget_bytes,
            h.iter_time_s
        ),
    }
}

fn print_max_batch(r: &outcore::MaxBatchResult) {
    say!(
        "{} on {}: budget {}, {} allocator, batch limit {} ({})",
        r.model,
        r.device,
        fmt_bytes(r.budget_bytes),
        r.allocator,
        r.batch_limit,
        r.method
    );
    say!(
        "{:<16} {:>10} {:>12} {:>10} {:>14} {:>7} {:>9}",
        "planner",
        "max batch",
        "infeasible",
        "iter s",
        "samples/s",
        "probes",
        "search s"
    );
    for row in &r.rows {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |b| b.to_string());
        say!(
            "{:<16} {:>10} {:>12} {:>10} {:>14} {:>7} {:>9.1}",
            row.planner,
            opt(row.max_batch),
            opt(row.first_infeasible_batch),
            row.iter_time_s
                .map_or("-".to_string(), |t| format!("{t:.4}")),
            row.throughput_samples_per_s
                .map_or("-".to_string(), |t| format!("{t:.1}")),
            row.probes,
            row.search_time_s
        );
        if let Some(why) = &row.not_runnable {
            say!("  {} NOT RUNNABLE: {why}", row.planner);
        } else if row.max_batch.is_none() {
            say!("  {}: {}", row.planner, row.reason.as_deref().unwrap_or(""));
        }
    }
}

fn cmd_alloc_replay(
    path: &Path,
    allocator: &str,
    capacity: Option<&str>,
    json_out: bool,
) -> Result<()> {
    let trace = outcore_alloc::read_trace(path)?;
    let capacity_bytes = capacity
        .map(outcore::parse_size)
        .transpose()
        .context("--capacity")?;
    let out = outcore::alloc_replay(trace, allocator, capacity_bytes)?;
    // The allocator as asked (`best-fit-paged`), not only its algorithm
    // (`best-fit`), which the report records.
    let name = outcore::parse_allocator(allocator)?.name().to_string();
    if json_out {
        let mut v = serde_json::to_value(&out)?;
        v["algorithm"] = v["allocator"].clone();
        v["allocator"] = json!(name);
        return print_json(&v);
    }
    let report = &out.report;
    say!("allocator          {name} ({} algorithm)", report.allocator);
    say!(
        "operations         {} in {:.4} s",
        report.ops,
        out.replay_time_s
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

/// The allocator `outcore run --allocator NAME --chunk-kib N` names.
fn run_allocator(name: &str, chunk_kib: Option<u64>) -> Result<outcore::AllocatorSpec> {
    Ok(match (name, chunk_kib) {
        ("virtual-chunks", kib) => outcore::virtual_chunks_allocator(kib.unwrap_or(2048))?,
        (other, Some(kib)) => bail!(
            "--chunk-kib {kib} does not apply to --allocator {other}: it is the chunk size of virtual-chunks; drop --chunk-kib or use --allocator virtual-chunks"
        ),
        (other, None) => outcore::parse_allocator(other)?,
    })
}

fn cmd_verify(plan_path: &Path, json_out: bool) -> Result<()> {
    let plan = outcore::load_plan(plan_path)?;
    let graph = outcore::graph_of_plan(&plan)?;
    let v = outcore::verify_plan(&plan, &graph);
    if json_out {
        print_json(&serde_json::to_value(&v)?)?;
    } else if v.passed {
        say!(
            "verified           {} ({} steps, budget {}, {} allocator)",
            plan_path.display(),
            plan.n_steps(),
            fmt_bytes(plan.budget_bytes),
            plan.allocator.name()
        );
    } else {
        say!("FAILED             {} violations", v.violation_count);
        for line in &v.violations {
            say!("  {line}");
        }
    }
    if let Some(err) = v.error() {
        return Err(err.into());
    }
    Ok(())
}

fn cmd_run(a: RunArgs, stop: &StopFlag) -> Result<()> {
    if a.backend != "cpu" {
        bail!(
            "backend `{}` is not available in this build; use --backend cpu (the CUDA backend is a separate crate built with its feature)",
            a.backend
        );
    }
    let options = outcore::RunOptions {
        iters: a.iters,
        check: a.check,
        reference: a.reference,
        seed: a.seed,
        link_bytes_per_s: a.link_gbps.map(|g| g * 1e9),
        synthetic_kernels: a.synthetic,
        synthetic_flops_per_s: a.synthetic_flops_per_s,
        trace: a.trace.is_some(),
        // A plan for the `perfect` allocator is laid out unless the user
        // named an allocator (`--allocator perfect` runs the best-fit list).
        lay_out_perfect: a.allocator.is_none(),
        on_iteration: Some(progress::iteration_hook(
            progress::bar("iterations", u64::from(a.iters)),
            stop.clone(),
        )),
    };
    options.validate()?;
    check_output_path("--trace", a.trace.as_deref())?;
    check_output_path("--profile-out", a.profile_out.as_deref())?;
    if a.allocator.is_none()
        && let Some(kib) = a.chunk_kib
    {
        bail!(
            "--chunk-kib {kib} needs --allocator virtual-chunks (it is that allocator's chunk size); add it, or drop --chunk-kib"
        );
    }
    let allocator = a
        .allocator
        .as_deref()
        .map(|name| run_allocator(name, a.chunk_kib))
        .transpose()?;
    // The plan: loaded, or made here for the CPU device.
    let (graph, plan) = if let Some(path) = &a.plan {
        let mut plan = outcore::load_plan(path)?;
        let graph = outcore::graph_of_plan(&plan)?;
        // The arena runs the named allocator (the plan's own otherwise).
        if let Some(allocator) = allocator {
            outcore::set_allocator(&mut plan, &graph, allocator)?;
        }
        (graph, plan)
    } else {
        let loaded = load_graph(&a.graph)?;
        let budget = a.budget.as_deref().unwrap_or("100%");
        let budget_bytes = outcore::parse_budget(budget, loaded.footprint_bytes())?;
        let planner = a.planner.as_deref().unwrap_or("none");
        let plan_options = PlanOptions {
            seed: a.seed,
            max_moves: a.moves.map(outcore::check_moves).transpose()?,
            ..PlanOptions::default()
        };
        // Planned under the allocator the arena runs (a size-class pool is
        // sized for the plan here), or for one that lays out in the arena.
        let made = outcore::plan_for_run(
            &loaded,
            planner,
            budget_bytes,
            allocator,
            &plan_options,
            &options,
        )?;
        (loaded.graph, made.plan)
    };
    let out = outcore::run(&graph, plan, &options)?;
    if let (Some(path), Some(trace)) = (&a.trace, &out.trace) {
        std::fs::write(path, serde_json::to_string(trace)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &a.profile_out {
        out.latency_table.write_json_file(path)?;
    }
    if a.json {
        let mut v = serde_json::to_value(&out)?;
        if let Some(map) = v.as_object_mut() {
            // Written to their own files with --trace and --profile-out.
            map.remove("trace");
            map.remove("latency_table");
        }
        return print_json(&v);
    }
    print_run(&out);
    Ok(())
}

fn print_run(out: &outcore::RunResult) {
    say!(
        "planner            {} on the cpu backend, {} iterations, {} allocator",
        out.planner,
        out.iters,
        out.allocator
    );
    say!(
        "iteration time     measured {:.6} s, predicted {:.6} s (simulated on device profile `{}`)",
        out.measured_iter_time_s,
        out.predicted_iter_time_s,
        out.predicted_device
    );
    say!(
        "device memory      plan's simulated peak {}; arena high-water mark {} of a {} arena",
        fmt_bytes(out.predicted_peak_bytes),
        fmt_bytes(out.arena_high_water_bytes),
        fmt_bytes(out.budget_bytes)
    );
    say!(
        "swapped in / out   {} / {} per iteration",
        fmt_bytes(out.swap_in_bytes),
        fmt_bytes(out.swap_out_bytes)
    );
    say!(
        "checks             {}",
        out.checks_passed.map_or("off".to_string(), |c| if c {
            "passed".into()
        } else {
            "FAILED".into()
        })
    );
    if let Some(m) = out.matches_reference {
        say!(
            "vs reference       {}",
            if m {
                "bit-identical parameters"
            } else {
                "DIFFERENT parameters"
            }
        );
    }
    let finite: Vec<f32> = out.losses.iter().flatten().copied().collect();
    if let (Some(first), Some(last)) = (finite.first(), finite.last()) {
        say!("loss               {first:.4} -> {last:.4}");
    }
}

/// What sets the bound, for `compare`'s header line.
fn bound_reason(b: &outcore::TimeBound) -> String {
    if let Some(cut) = &b.cut {
        return format!(
            ": {} must be off the device after `{}`",
            fmt_bytes(cut.absent_bytes),
            cut.op
        );
    }
    match &b.program {
        Some(p) => format!(
            ": the cut program at the start of `{}` (its optimum recomputes {:.4} s and copies in {})",
            p.op,
            p.optimum.recompute_s,
            fmt_bytes(p.optimum.swapped_bytes.round() as u64)
        ),
        None => String::new(),
    }
}
