//! Several training jobs at once on the CPU backend, sharing one device arena
//! (TENSILE's setting, Sec. III: several jobs' executors on one GPU, each taking
//! plan updates between iterations).
//!
//! Design:
//! - **One arena, one window per job.** [`execute_jobs`] allocates one
//!   [`CpuDevice`] of the given capacity and gives each job a disjoint window of
//!   it, laid out in job order from offset 0. A window is the job's largest
//!   plan budget (over its first plan and every plan it swaps to) rounded up to
//!   the allocators' 512-byte granule, because each plan is verified against its
//!   own budget and the job's arena allocator never addresses past it. The
//!   windows must together fit the capacity; otherwise nothing runs and the
//!   error names each job's window, the total and the capacity to ask for.
//! - **Isolation by construction, not by care.** Each job runs on its own
//!   windowed [`CpuBackend`](crate::CpuBackend): its own stream workers, events,
//!   host buffers and sticky error, and every device offset it is given is
//!   bounds-checked against its window before it touches the arena. A job whose
//!   plan is bad, whose allocation fails or whose kernel fails stops with its
//!   own error; it cannot write into another job's window, and the others run
//!   to the end. (TENSILE gets the same from running each job's executor in its
//!   own process.)
//! - **Threads, not an interleaving of steps.** Each job runs the unchanged
//!   single-job executor ([`execute_swapping`]) on a thread of its own, so a
//!   job's results are exactly those of running it alone: its kernels read and
//!   write only its window, so the order in which the jobs' steps happen to
//!   interleave changes their timing, never their bytes. A deterministic
//!   step-by-step interleaving would have needed a second, re-entrant executor
//!   and would have hidden the contention the measured latencies should show
//!   (each job's latency table is measured while the others run).
//! - **Plan swaps** are the executor's: a job lists [`PlanSwap`]s and takes each
//!   new plan at its iteration boundary with the persistent state carried over.
//!
//! Compute is time-sliced by the host's scheduler between the jobs' compute
//! workers (on a GPU, between their kernels); the link is the host's memcpy,
//! shared likewise. Jobs start together: arrival times are the simulator's
//! (`outcore-colocate`), not this executor's.

use crate::backend::DeviceSegment;
use crate::cpu::{CpuBackendOptions, CpuDevice};
use crate::executor::{ExecOptions, PlanSwap, RunReport, SharedUsage, execute_swapping};
use crate::{ExecError, ExecErrorKind};
use outcore_alloc::ALIGNMENT_BYTES;
use outcore_graph::Graph;
use outcore_plan::Plan;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

/// One job of a co-located run.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    /// Unique among the run's jobs.
    pub name: String,
    pub graph: &'a Graph,
    /// The plan it starts with.
    pub plan: &'a Plan,
    /// Plans it switches to between iterations.
    pub swaps: Vec<PlanSwap<'a>>,
    /// Iterations, seed, checks, issue order of `plan`, ...
    pub options: ExecOptions,
    /// Link throttle and fault injection of the job's backend.
    pub backend: CpuBackendOptions,
}

impl Job<'_> {
    /// Bytes of the shared arena the job needs: its largest plan budget,
    /// rounded up to the allocators' granule.
    pub fn window_bytes(&self) -> u64 {
        let budget = self
            .swaps
            .iter()
            .map(|s| s.plan.budget_bytes)
            .fold(self.plan.budget_bytes, u64::max);
        budget
            .div_ceil(ALIGNMENT_BYTES)
            .saturating_mul(ALIGNMENT_BYTES)
    }
}

/// What one job did.
#[derive(Debug)]
pub struct JobOutcome {
    pub name: String,
    /// Its window of the shared arena.
    pub window: DeviceSegment,
    /// Its report (per-iteration times, latency table, final state), or the
    /// error that stopped it.
    pub result: Result<RunReport, ExecError>,
}

/// What a co-located run did.
#[derive(Debug)]
pub struct MultiRunReport {
    pub capacity_bytes: u64,
    /// In the order the jobs were given.
    pub jobs: Vec<JobOutcome>,
    /// Wall time from the first job's start to the last job's end.
    pub wall_time_s: f64,
    /// The most device bytes the jobs held at once (the global peak TENSILE
    /// minimises), measured: each job's allocations counted into one total as
    /// they happen (requested sizes, frees counted once they completed).
    pub peak_device_bytes: u64,
}

impl MultiRunReport {
    pub fn job(&self, name: &str) -> Option<&JobOutcome> {
        self.jobs.iter().find(|j| j.name == name)
    }
}

/// Lays the jobs' windows out from offset 0 in job order. Errors (before
/// anything runs): no jobs, a duplicate or empty name, a plan swap outside
/// the job's iterations or for another graph, windows that do not fit.
pub fn layout_windows(
    jobs: &[Job<'_>],
    capacity_bytes: u64,
) -> Result<Vec<DeviceSegment>, ExecError> {
    if jobs.is_empty() {
        return Err(ExecError::invalid("no jobs to run; give at least one job"));
    }
    let mut names = BTreeSet::new();
    for job in jobs {
        if job.name.is_empty() {
            return Err(ExecError::invalid(
                "a job has an empty name; name every job",
            ));
        }
        if !names.insert(job.name.as_str()) {
            return Err(ExecError::invalid(format!(
                "two jobs are named `{}`; give every job a unique name",
                job.name
            )));
        }
    }
    for job in jobs {
        crate::executor::check_swaps(job.graph, &job.swaps, job.options.iters)
            .map_err(|e| ExecError::invalid(format!("job `{}`: {e}", job.name)))?;
    }
    let mut windows = Vec::with_capacity(jobs.len());
    let mut offset_bytes = 0u64;
    for job in jobs {
        let size_bytes = job.window_bytes();
        windows.push(DeviceSegment::new(offset_bytes, size_bytes));
        offset_bytes = offset_bytes.saturating_add(size_bytes);
    }
    if offset_bytes > capacity_bytes {
        let each: Vec<String> = jobs
            .iter()
            .zip(&windows)
            .map(|(j, w)| format!("`{}` {} bytes", j.name, w.size_bytes))
            .collect();
        return Err(ExecError::invalid(format!(
            "the jobs' windows ({}) total {offset_bytes} bytes, more than the {capacity_bytes}-byte shared arena; give an arena of at least {offset_bytes} bytes or plan the jobs at smaller budgets",
            each.join(", ")
        )));
    }
    Ok(windows)
}

/// Runs every job concurrently, each on its own window of one shared arena of
/// `capacity_bytes` (see the module docs). `Err` only for input that stops the
/// run before it starts (see [`layout_windows`]) or an arena that cannot be
/// allocated; a job's own failure is in its [`JobOutcome::result`].
pub fn execute_jobs(jobs: &[Job<'_>], capacity_bytes: u64) -> Result<MultiRunReport, ExecError> {
    let windows = layout_windows(jobs, capacity_bytes)?;
    let device = CpuDevice::new(capacity_bytes)?;
    let usage = Arc::new(SharedUsage::default());
    let started = Instant::now();
    let results: Vec<Result<RunReport, ExecError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .zip(&windows)
            .map(|(job, window)| {
                let (device, usage) = (&device, &usage);
                std::thread::Builder::new()
                    .name(format!("outcore-job-{}", job.name))
                    .spawn_scoped(scope, move || run_job(device, usage, job, *window))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(ExecError::new(ExecErrorKind::Backend {
                        detail: "the job's thread panicked".into(),
                    }))
                }),
                Err(e) => Err(ExecError::new(ExecErrorKind::Backend {
                    detail: format!("the job's thread could not be started: {e}"),
                })),
            })
            .collect()
    });
    let wall_time_s = started.elapsed().as_secs_f64();
    let jobs = jobs
        .iter()
        .zip(windows)
        .zip(results)
        .map(|((job, window), result)| JobOutcome {
            name: job.name.clone(),
            window,
            result,
        })
        .collect();
    Ok(MultiRunReport {
        capacity_bytes,
        jobs,
        wall_time_s,
        peak_device_bytes: usage.peak_bytes(),
    })
}

/// One job on its window, its bytes counted into `usage` (in place of any
/// usage its options name); the backend (and its lease of the window) lives
/// as long as the run.
fn run_job(
    device: &CpuDevice,
    usage: &Arc<SharedUsage>,
    job: &Job<'_>,
    window: DeviceSegment,
) -> Result<RunReport, ExecError> {
    let backend =
        device.backend_in_window(window.offset_bytes, window.size_bytes, job.backend.clone())?;
    let options = ExecOptions {
        shared_usage: Some(Arc::clone(usage)),
        ..job.options.clone()
    };
    execute_swapping(job.graph, job.plan, &job.swaps, &backend, &options)
}
