//! `outcore colocate --run`: the jobs of a job list trained at once on the CPU
//! reference executor, sharing one device arena (`outcore_exec::execute_jobs`).
//!
//! Each job is planned alone by its own planner at its own budget, for the CPU
//! backend (as `outcore run` plans: the device is the CPU's, its memory the
//! job's budget), and issued in the simulator's order. The shared arena is the
//! jobs' windows together (each its plan budget). Every job runs with checks
//! on and, with `reference`, is compared with the same model trained alone
//! without a plan. Arrival times and priorities are the simulator's concern:
//! here every job starts at once.

use std::time::Instant;

use outcore_exec::{CpuBackendOptions, ExecOptions, Job, execute_jobs};
use outcore_graph::Graph;
use outcore_plan::{AllocatorSpec, Plan, StepRef};
use outcore_sim::{SimOptions, simulate};
use serde::Serialize;

use crate::colocate::{JobList, job_source};
use crate::input::{load_graph, parse_budget};
use crate::planning::{PlanOptions, plan};
use crate::run::{RunOptions, cpu_target, matches_reference};
use crate::{Error, MeasuredTable, Result};

/// How to run a job list on the CPU executor.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateRunOptions {
    /// Checksum tensors at swap-out / swap-in and compare recomputed tensors.
    pub check: bool,
    /// Also train each model alone without a plan and compare final parameters.
    pub reference: bool,
    pub seed: u64,
}

impl Default for ColocateRunOptions {
    fn default() -> Self {
        ColocateRunOptions {
            check: true,
            reference: true,
            seed: 0,
        }
    }
}

/// What one job did on the CPU executor.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateRunRow {
    pub name: String,
    pub planner: String,
    pub plan_budget_bytes: u64,
    /// Its window of the shared arena.
    pub window_offset_bytes: u64,
    pub window_bytes: u64,
    pub iters: u32,
    /// `None` when the job failed (see `error`).
    pub measured_iter_time_s: Option<f64>,
    pub iter_times_s: Vec<f64>,
    pub peak_device_bytes: Option<u64>,
    pub swap_in_bytes: Option<u64>,
    pub swap_out_bytes: Option<u64>,
    pub recomputes: Option<u64>,
    pub checks_passed: Option<bool>,
    /// Whether final parameters equal the model's trained alone, when asked.
    pub matches_reference: Option<bool>,
    pub losses: Vec<Option<f32>>,
    /// Measured op and copy latencies (`outcore-latency-table/1`).
    pub latency_table: Option<MeasuredTable>,
    /// Why the job stopped, if it did.
    pub error: Option<String>,
}

/// The result of `outcore colocate --run`.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateRunResult {
    /// The shared arena.
    pub capacity_bytes: u64,
    /// From the first job's start to the last job's end.
    pub wall_time_s: f64,
    /// The most device bytes the jobs held at once, measured.
    pub peak_device_bytes: u64,
    pub jobs: Vec<ColocateRunRow>,
}

impl ColocateRunResult {
    /// Every job finished, passed its checks and (when compared) matched its
    /// run alone.
    pub fn all_ok(&self) -> bool {
        self.jobs.iter().all(|j| {
            j.error.is_none()
                && j.checks_passed != Some(false)
                && j.matches_reference != Some(false)
        })
    }
}

/// A job planned for the CPU backend.
struct PlannedJob {
    name: String,
    planner: String,
    graph: Graph,
    plan: Plan,
    issue_order: Option<Vec<StepRef>>,
    iters: u32,
}

/// Plans every job for the CPU backend, runs them all at once on one shared
/// arena, and reports each.
pub fn colocate_run(list: &JobList, options: &ColocateRunOptions) -> Result<ColocateRunResult> {
    let planned = list
        .jobs
        .iter()
        .map(plan_for_cpu)
        .collect::<Result<Vec<_>>>()?;
    let jobs: Vec<Job<'_>> = planned
        .iter()
        .map(|p| Job {
            name: p.name.clone(),
            graph: &p.graph,
            plan: &p.plan,
            swaps: Vec::new(),
            options: exec_options(p, options),
            backend: CpuBackendOptions::default(),
        })
        .collect();
    let capacity_bytes = jobs
        .iter()
        .map(Job::window_bytes)
        .fold(0u64, u64::saturating_add);
    let started = Instant::now();
    let run = execute_jobs(&jobs, capacity_bytes)?;
    let wall_time_s = started.elapsed().as_secs_f64();
    let mut rows = Vec::with_capacity(planned.len());
    for ((p, job), outcome) in planned.iter().zip(&jobs).zip(&run.jobs) {
        let mut row = ColocateRunRow {
            name: p.name.clone(),
            planner: p.planner.clone(),
            plan_budget_bytes: p.plan.budget_bytes,
            window_offset_bytes: outcome.window.offset_bytes,
            window_bytes: outcome.window.size_bytes,
            iters: p.iters,
            measured_iter_time_s: None,
            iter_times_s: Vec::new(),
            peak_device_bytes: None,
            swap_in_bytes: None,
            swap_out_bytes: None,
            recomputes: None,
            checks_passed: None,
            matches_reference: None,
            losses: Vec::new(),
            latency_table: None,
            error: None,
        };
        match &outcome.result {
            Ok(report) => {
                row.measured_iter_time_s = Some(report.measured_iter_time_s);
                row.iter_times_s = report.iter_times_s.clone();
                row.peak_device_bytes = Some(report.peak_device_bytes);
                row.swap_in_bytes = Some(report.swap_in_bytes);
                row.swap_out_bytes = Some(report.swap_out_bytes);
                row.recomputes = Some(report.recomputes);
                row.checks_passed = report.checks_passed;
                row.losses = report
                    .losses
                    .iter()
                    .map(|l| l.is_finite().then_some(*l))
                    .collect();
                row.latency_table = Some(report.latency_table.clone());
                if options.reference {
                    row.matches_reference =
                        Some(matches_reference(&p.graph, &job.options, report)?);
                }
            }
            Err(e) => row.error = Some(e.to_string()),
        }
        rows.push(row);
    }
    Ok(ColocateRunResult {
        capacity_bytes,
        wall_time_s,
        peak_device_bytes: run.peak_device_bytes,
        jobs: rows,
    })
}

fn exec_options(p: &PlannedJob, options: &ColocateRunOptions) -> ExecOptions {
    ExecOptions {
        iters: p.iters,
        check: options.check,
        seed: options.seed,
        trace: false,
        issue_order: p.issue_order.clone(),
        ..ExecOptions::default()
    }
}

/// Plans one job alone for the CPU backend at its budget; refuses iteration
/// counts and predicted run lengths `outcore run` would refuse.
fn plan_for_cpu(spec: &crate::colocate::JobSpec) -> Result<PlannedJob> {
    let run_options = RunOptions::default();
    let iters = u32::try_from(spec.iterations)
        .ok()
        .filter(|n| (1..=RunOptions::MAX_ITERS).contains(n))
        .ok_or_else(|| {
            Error::invalid(
                "iterations of job",
                format!("{} ({})", spec.iterations, spec.name),
                "out of range for a run on the CPU executor",
                format!(
                    "a whole number of iterations in [1, {}]",
                    RunOptions::MAX_ITERS
                ),
            )
        })?;
    let loaded = load_graph(&job_source(spec)?)?;
    let footprint_bytes = loaded.footprint_bytes();
    let budget_bytes = parse_budget(spec.budget.as_deref().unwrap_or("100%"), footprint_bytes)?;
    let target = cpu_target(&loaded, budget_bytes, AllocatorSpec::Perfect, &run_options)?;
    let planned = plan(&loaded, &spec.planner, &target, &PlanOptions::default())?;
    let cost = outcore_cost::RooflineModel::new(run_options.cpu_device(budget_bytes));
    let sim_options = SimOptions {
        record_start_order: true,
        ..SimOptions::default()
    };
    let predicted = simulate(&loaded.graph, &planned.plan, &cost, &sim_options)?;
    let predicted_run_s = predicted.report.iter_time_s * f64::from(iters);
    if !predicted_run_s.is_finite() || predicted_run_s > RunOptions::MAX_PREDICTED_RUN_S {
        return Err(Error::invalid(
            "run length of job",
            format!(
                "{}: {iters} iterations of {:.3e} s predicted = {predicted_run_s:.3e} s",
                spec.name, predicted.report.iter_time_s
            ),
            "out of range",
            format!(
                "a run predicted to take at most {} s; lower the job's iterations or use a smaller model",
                RunOptions::MAX_PREDICTED_RUN_S
            ),
        ));
    }
    Ok(PlannedJob {
        name: spec.name.clone(),
        planner: spec.planner.clone(),
        graph: loaded.graph,
        plan: planned.plan,
        issue_order: predicted.start_order,
        iters,
    })
}
