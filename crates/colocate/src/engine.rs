//! The multi-job simulator: jobs arrive, run their iterations back to back and
//! leave, sharing one compute stream, one host-to-device and one
//! device-to-host link, and one memory.
//!
//! Rules, and why:
//! - **One step at a time per physical stream.** The device runs one kernel at
//!   a time (kernels of different processes are time-sliced, not overlapped),
//!   and each link direction runs one copy at a time at the full rate (a GPU
//!   has a copy engine per direction that serves copies in turn). With one job
//!   this is exactly `outcore_sim::simulate`'s model, where each stream runs
//!   one step at a time; splitting bandwidth between concurrent copies would
//!   instead need a model of how the engine interleaves them. Copies run at
//!   the duplex per-direction rate while both directions copy, whichever jobs
//!   they belong to, as in `simulate`.
//! - **Earliest-ready first, ties by job index.** When a physical stream frees
//!   up, it takes, among the jobs whose next step on that stream has every wait
//!   done, the step that has been ready longest (ready: its job's previous step
//!   on the stream and every step it waits for are done); ties go to the job
//!   listed first. That is a first-come first-served queue of launched work,
//!   which is how a time-sliced device drains the work several processes
//!   submit; it never starves a job, and the tie rule makes runs reproducible.
//! - **Frees take no stream time and go first.** A free (an instant step)
//!   needs only its own job's stream order and waits, not the physical
//!   stream, so one job's long kernel never delays another job's frees; and
//!   among a stream's candidates frees go before copies and kernels, so memory
//!   released at an instant is released before another job allocates at that
//!   instant (a free delays nobody). Across streams the sweep order is
//!   `simulate`'s (compute, h2d, d2h, repeated until nothing starts), which
//!   with one job is the only order that keeps its peak identical.
//! - **Iterations.** Each job's iterations are separated by its own barrier (its
//!   plan's waits are within one iteration), as in `simulate`; jobs do not wait
//!   for each other between iterations.
//! - **Memory** is one live-bytes counter for all jobs under the perfect
//!   allocator (every request fits exactly), plus each job's own counter. A job
//!   allocates its device-resident persistent tensors when it arrives, its
//!   batch inputs at the start of every iteration (as `simulate` does), and
//!   everything it still holds is released when it leaves. Plans under a real
//!   allocator are rejected: a shared address space with several allocators
//!   (or one) is not modelled yet.
//! - **Clock.** Times within an epoch are kept relative to the epoch's start,
//!   and a new epoch starts whenever no job is inside an iteration. With one
//!   job every iteration is an epoch starting at 0, so its iteration times are
//!   computed with the very floating-point operations `simulate` uses and are
//!   equal, not just close.

use outcore_cost::{CopyRates, CostModel};
use outcore_plan::{AllocatorSpec, Plan, Program, Residency, StepInstr, StepRef, Stream};
use outcore_sim::link::{InFlight, advance_to, ends_s};
use outcore_sim::{SimError, SimErrorKind, SimPrepared, StepWork, StreamBusy, step_work};
use serde::Serialize;

use crate::job::{ColocateError, ColocateErrorKind, Job, JobSet};
use crate::trace::JobTrace;

/// What to record beside the report.
#[derive(Debug, Clone, Default)]
pub struct ColocateOptions {
    /// A Chrome trace with one track group per job (see [`ColocateOutput::trace`]).
    pub record_trace: bool,
}

/// The report and the optional trace.
#[derive(Debug, Clone)]
pub struct ColocateOutput {
    pub report: ColocateReport,
    /// Chrome Trace Event JSON: a process per job (compute, h2d and d2h
    /// tracks) and a "device" process with the global live bytes; times from
    /// the run's start.
    pub trace: Option<serde_json::Value>,
}

/// What one job did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobReport {
    pub name: String,
    pub arrival_s: f64,
    /// When its first step could start (its arrival: jobs are admitted at once).
    pub start_s: f64,
    /// When its last iteration ended.
    pub finish_s: f64,
    /// Each iteration's time, in order.
    pub per_iteration_time_s: Vec<f64>,
    /// The most bytes this job held at once.
    pub peak_live_bytes: u64,
    /// Seconds its steps occupied each physical stream, over the whole run.
    pub busy: StreamBusy,
    /// Bytes it copied in and out over the whole run.
    pub swap_in_bytes: u64,
    pub swap_out_bytes: u64,
}

/// What a job set did on its device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ColocateReport {
    pub jobs: Vec<JobReport>,
    /// The most bytes all jobs held at once (what TENSILE minimises).
    pub peak_live_bytes: u64,
    pub budget_bytes: u64,
    /// Whether the global peak is within the set's budget.
    pub fits_budget: bool,
    /// From the first arrival to the last finish.
    pub makespan_s: f64,
    /// Seconds each physical stream was busy, over the whole run.
    pub busy: StreamBusy,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not arrived yet.
    Waiting,
    /// Its arrival time has been reached; admitted at the next admission.
    Due,
    /// Inside an iteration.
    Running,
    /// All iterations done; it holds nothing.
    Finished,
}

/// A step on a physical stream: whose, and how far along.
#[derive(Debug, Clone, Copy)]
struct Active {
    job: usize,
    /// The step's id within its job (compute, then h2d, then d2h).
    step: usize,
    flight: InFlight,
    started_s: f64,
    scratch_bytes: u64,
}

/// One job's state in the loop.
struct JobRun<'a> {
    job: &'a Job,
    prepared: SimPrepared,
    offset: [usize; 3],
    len: [usize; 3],
    phase: Phase,
    iteration: usize,
    next: [usize; 3],
    /// Per stream: one of this job's steps is on the physical stream.
    on_stream: [bool; 3],
    /// Per step: when it finished in the current iteration (infinity: not yet).
    done_at: Vec<f64>,
    done: usize,
    /// The current iteration's start, on the epoch clock.
    iter_start: f64,
    live_bytes: u64,
    /// Device-resident persistent bytes (allocated on arrival) and batch-input
    /// bytes (allocated at each iteration's start).
    persistent_bytes: u64,
    batch_input_bytes: u64,
    report: JobReport,
}

impl<'a> JobRun<'a> {
    fn new(job: &'a Job, cost: &dyn CostModel) -> Self {
        let plan = job.plan();
        let prepared = SimPrepared::new(job.graph(), cost);
        let pg = &prepared.graph;
        let mut offset = [0usize; 3];
        let mut len = [0usize; 3];
        let mut total = 0;
        for st in Stream::ALL {
            offset[st.index()] = total;
            len[st.index()] = plan.stream_len(st);
            total += len[st.index()];
        }
        let host: Vec<_> = plan
            .initial_residency()
            .iter()
            .filter(|&&(_, r)| r == Residency::Host)
            .map(|&(t, _)| t)
            .collect();
        let persistent_bytes = pg
            .persistent_ids
            .iter()
            .filter(|t| !host.contains(t))
            .map(|t| pg.size_bytes[t.index()])
            .sum();
        let batch_input_bytes = (0..pg.n_tensors())
            .filter(|&i| pg.batch_input[i] && pg.allocates[i])
            .map(|i| pg.size_bytes[i])
            .sum();
        JobRun {
            job,
            offset,
            len,
            phase: Phase::Waiting,
            iteration: 0,
            next: [0; 3],
            on_stream: [false; 3],
            done_at: vec![f64::INFINITY; total],
            done: 0,
            iter_start: 0.0,
            live_bytes: 0,
            persistent_bytes,
            batch_input_bytes,
            report: JobReport {
                name: job.name().to_string(),
                arrival_s: job.arrival_s(),
                start_s: f64::NAN,
                finish_s: f64::NAN,
                per_iteration_time_s: Vec::with_capacity(job.iterations()),
                peak_live_bytes: 0,
                busy: StreamBusy::default(),
                swap_in_bytes: 0,
                swap_out_bytes: 0,
            },
            prepared,
        }
    }

    fn total(&self) -> usize {
        self.done_at.len()
    }

    fn iteration_done(&self) -> bool {
        self.phase == Phase::Running && self.done == self.total()
    }

    fn step_ref(&self, s: usize, step: usize) -> StepRef {
        StepRef {
            stream: Stream::ALL[s],
            index: (step - self.offset[s]) as u32,
        }
    }
}

/// Simulates `set` on the device `cost` prices; see the module doc for the rules.
pub fn simulate_jobs(set: &JobSet, cost: &dyn CostModel) -> Result<ColocateReport, ColocateError> {
    Ok(simulate_jobs_with(set, cost, &ColocateOptions::default())?.report)
}

/// [`simulate_jobs`] with recordings.
pub fn simulate_jobs_with(
    set: &JobSet,
    cost: &dyn CostModel,
    options: &ColocateOptions,
) -> Result<ColocateOutput, ColocateError> {
    for job in set.jobs() {
        if job.plan().allocator != AllocatorSpec::Perfect {
            return Err(ColocateError {
                kind: ColocateErrorKind::UnsupportedAllocator {
                    job: job.name().to_string(),
                    allocator: job.plan().allocator.name().to_string(),
                },
            });
        }
    }
    let mut run = Device {
        jobs: set.jobs().iter().map(|j| JobRun::new(j, cost)).collect(),
        copy: cost.copy_rates(),
        streams: [None; 3],
        epoch_s: 0.0,
        now: 0.0,
        live_bytes: 0,
        peak_bytes: 0,
        busy: StreamBusy::default(),
        trace: options.record_trace.then(JobTrace::default),
    };
    run.run()?;
    let names: Vec<&str> = set.jobs().iter().map(Job::name).collect();
    let trace = run.trace.take().map(|t| t.finish(&names));
    Ok(ColocateOutput {
        report: run.report(set.budget_bytes()),
        trace,
    })
}

/// The shared device and every job on it.
struct Device<'a> {
    jobs: Vec<JobRun<'a>>,
    copy: CopyRates,
    streams: [Option<Active>; 3],
    /// Global time of the current epoch's start.
    epoch_s: f64,
    /// Time since the epoch's start.
    now: f64,
    live_bytes: u64,
    peak_bytes: u64,
    busy: StreamBusy,
    trace: Option<JobTrace>,
}

/// A simulation error of job `j`.
fn sim_error(job: &Job, kind: SimErrorKind) -> ColocateError {
    ColocateError {
        kind: ColocateErrorKind::Sim {
            job: job.name().to_string(),
            source: SimError { kind },
        },
    }
}

impl<'a> Device<'a> {
    /// The event loop: end iterations, start epochs, admit arrivals, start
    /// what is ready, then advance to the next completion or arrival.
    fn run(&mut self) -> Result<(), ColocateError> {
        self.mark_due();
        loop {
            let ended: Vec<usize> = (0..self.jobs.len())
                .filter(|&j| self.jobs[j].iteration_done())
                .collect();
            for &j in &ended {
                let jr = &mut self.jobs[j];
                let time_s = self.now - jr.iter_start;
                jr.report.per_iteration_time_s.push(time_s);
            }
            if self
                .jobs
                .iter()
                .all(|jr| jr.phase != Phase::Running || jr.iteration_done())
            {
                // No job is inside an iteration and nothing runs: a new epoch.
                self.epoch_s += self.now;
                self.now = 0.0;
            }
            for &j in &ended {
                self.next_iteration(j);
            }
            self.admit();
            self.start_ready()?;
            if self.jobs.iter().any(JobRun::iteration_done) {
                continue;
            }
            if self.jobs.iter().all(|jr| jr.phase == Phase::Finished) {
                return Ok(());
            }
            self.advance()?;
        }
    }

    /// Jobs whose arrival time the clock has reached become due.
    fn mark_due(&mut self) {
        for jr in &mut self.jobs {
            if jr.phase == Phase::Waiting && jr.job.arrival_s() - self.epoch_s <= self.now {
                jr.phase = Phase::Due;
            }
        }
    }

    /// The earliest arrival still to come, on the epoch clock.
    fn next_arrival(&self) -> f64 {
        self.jobs
            .iter()
            .filter(|jr| jr.phase == Phase::Waiting)
            .map(|jr| jr.job.arrival_s() - self.epoch_s)
            .fold(f64::INFINITY, f64::min)
    }

    /// Job `j` allocates `size_bytes`. Saturating: each graph's sizes are
    /// bounded so one job's sums fit, but many jobs together need not.
    fn allocate(&mut self, j: usize, size_bytes: u64) {
        let jr = &mut self.jobs[j];
        jr.live_bytes = jr.live_bytes.saturating_add(size_bytes);
        jr.report.peak_live_bytes = jr.report.peak_live_bytes.max(jr.live_bytes);
        self.live_bytes = self.live_bytes.saturating_add(size_bytes);
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
        self.trace_memory();
    }

    fn trace_memory(&mut self) {
        if let Some(trace) = self.trace.as_mut() {
            trace.memory(self.epoch_s + self.now, self.live_bytes);
        }
    }

    fn free(&mut self, j: usize, size_bytes: u64) {
        let jr = &mut self.jobs[j];
        jr.live_bytes = jr.live_bytes.saturating_sub(size_bytes);
        self.live_bytes = self.live_bytes.saturating_sub(size_bytes);
        self.trace_memory();
    }

    /// Admits due jobs: their persistent tensors, then their first iteration.
    fn admit(&mut self) {
        for j in 0..self.jobs.len() {
            if self.jobs[j].phase != Phase::Due {
                continue;
            }
            let bytes = self.jobs[j].persistent_bytes;
            self.allocate(j, bytes);
            self.jobs[j].report.start_s = self.epoch_s + self.now;
            self.begin_iteration(j);
        }
    }

    /// After job `j` ended an iteration: the next one, or it leaves.
    fn next_iteration(&mut self, j: usize) {
        let jr = &mut self.jobs[j];
        jr.iteration += 1;
        if jr.iteration < jr.job.iterations() {
            self.begin_iteration(j);
            return;
        }
        jr.phase = Phase::Finished;
        jr.report.finish_s = self.epoch_s + self.now;
        // Leaving, the job gives back everything it still holds.
        let held = jr.live_bytes;
        self.free(j, held);
    }

    fn begin_iteration(&mut self, j: usize) {
        let now = self.now;
        let jr = &mut self.jobs[j];
        jr.phase = Phase::Running;
        jr.done_at.iter_mut().for_each(|d| *d = f64::INFINITY);
        jr.next = [0; 3];
        jr.done = 0;
        jr.iter_start = now;
        let bytes = jr.batch_input_bytes;
        self.allocate(j, bytes);
    }

    /// If job `j`'s next step on stream `s` can start now: since when it has
    /// been ready, and whether it is instant (a free).
    fn candidate(&self, j: usize, s: usize) -> Result<Option<(f64, bool)>, ColocateError> {
        let jr = &self.jobs[j];
        if jr.phase != Phase::Running || jr.on_stream[s] || jr.next[s] >= jr.len[s] {
            return Ok(None);
        }
        let plan: &Plan = jr.job.plan();
        let (st, i) = (Stream::ALL[s], jr.next[s]);
        let mut ready = match i {
            0 => jr.iter_start,
            _ => jr.done_at[jr.offset[s] + i - 1],
        };
        for w in plan.waits(st, i) {
            let ws = w.stream.index();
            if w.index as usize >= jr.len[ws] {
                let what = format!("step {w}");
                return Err(sim_error(jr.job, SimErrorKind::BadReference(what)));
            }
            let done = jr.done_at[jr.offset[ws] + w.index as usize];
            if done > self.now {
                return Ok(None);
            }
            ready = ready.max(done);
        }
        let instant = matches!(plan.instr(st, i), StepInstr::Free(_));
        Ok(Some((ready, instant)))
    }

    /// The step stream `s` takes now: frees first, then earliest ready first,
    /// ties by job index; only frees while the stream is busy.
    fn choose(&self, s: usize) -> Result<Option<usize>, ColocateError> {
        let busy = self.streams[s].is_some();
        // Ordered by (not instant, ready time, job index); the scan in job
        // order keeps the lowest index among equals.
        let mut best: Option<(bool, f64, usize)> = None;
        for j in 0..self.jobs.len() {
            let Some((ready, instant)) = self.candidate(j, s)? else {
                continue;
            };
            let key = (!instant, ready);
            if (busy && !instant) || best.is_some_and(|(i, r, _)| (i, r) <= key) {
                continue;
            }
            best = Some((!instant, ready, j));
        }
        Ok(best.map(|(_, _, j)| j))
    }

    /// Starts every step that can start now, sweeping the streams in order
    /// (one step per stream per sweep, as `simulate` does) until a sweep
    /// starts nothing.
    fn start_ready(&mut self) -> Result<(), ColocateError> {
        let mut progressed = true;
        while progressed {
            progressed = false;
            for s in 0..3 {
                if let Some(j) = self.choose(s)? {
                    self.start(j, s)?;
                    progressed = true;
                }
            }
        }
        Ok(())
    }

    /// Starts job `j`'s next step on stream `s`.
    fn start(&mut self, j: usize, s: usize) -> Result<(), ColocateError> {
        let jr = &self.jobs[j];
        let at = StepRef {
            stream: Stream::ALL[s],
            index: jr.next[s] as u32,
        };
        let id = jr.offset[s] + jr.next[s];
        // Under the perfect allocator the outputs can be added up: the peak
        // after several additions is the peak after their sum.
        let mut allocated_bytes = 0u64;
        let (work, scratch_bytes) = step_work(&jr.prepared, jr.job.plan(), at, |_, size| {
            allocated_bytes = allocated_bytes.saturating_add(size)
        })
        .map_err(|e| sim_error(jr.job, e.kind))?;
        self.allocate(j, allocated_bytes.saturating_add(scratch_bytes));
        let now = self.now;
        let flight = match work {
            StepWork::Instant(t) => {
                let size = self.jobs[j].prepared.graph.size_bytes[t.index()];
                self.free(j, size);
                let jr = &mut self.jobs[j];
                jr.done_at[id] = now;
                jr.next[s] += 1;
                jr.done += 1;
                return Ok(());
            }
            StepWork::Kernel { time_s, .. } => InFlight::kernel(now, time_s),
            StepWork::Copy { bytes, swap_in } => {
                let report = &mut self.jobs[j].report;
                match swap_in {
                    true => report.swap_in_bytes += bytes,
                    false => report.swap_out_bytes += bytes,
                }
                InFlight::copy(self.copy.latency_s, bytes)
            }
        };
        self.jobs[j].on_stream[s] = true;
        self.streams[s] = Some(Active {
            job: j,
            step: id,
            flight,
            started_s: now,
            scratch_bytes,
        });
        Ok(())
    }

    /// Advances the clock to the next completion or arrival and finishes every
    /// step that completes then; copy rates as in `simulate`.
    fn advance(&mut self) -> Result<(), ColocateError> {
        let copy = self.copy;
        let now = self.now;
        let flights = self
            .streams
            .each_ref()
            .map(|r| r.as_ref().map(|r| &r.flight));
        let ends = ends_s(&copy, now, flights);
        let t_next = ends.iter().copied().fold(f64::INFINITY, f64::min);
        if let Some(stuck) = self.stuck(t_next) {
            return Err(stuck);
        }
        let t_next = t_next.min(self.next_arrival());
        if !t_next.is_finite() {
            // Nothing runs, nothing is to arrive, and no job is inside an
            // iteration: the loop ends before this, so this is a bug.
            let at = StepRef {
                stream: Stream::Compute,
                index: 0,
            };
            return Err(sim_error(self.jobs[0].job, SimErrorKind::Deadlock(at)));
        }
        let flights = self
            .streams
            .each_mut()
            .map(|r| r.as_mut().map(|r| &mut r.flight));
        let finished = advance_to(&copy, now, t_next, &ends, flights);
        for s in (0..3).filter(|&s| finished[s]) {
            if let Some(r) = self.streams[s] {
                self.finish(s, r, t_next);
            }
        }
        self.now = t_next;
        self.mark_due();
        Ok(())
    }

    /// Ends step `r` on stream `s` at `t`.
    fn finish(&mut self, s: usize, r: Active, t: f64) {
        let dur = t - r.started_s;
        let jr = &mut self.jobs[r.job];
        for busy in [&mut jr.report.busy, &mut self.busy] {
            match s {
                0 => busy.compute_s += dur,
                1 => busy.h2d_s += dur,
                _ => busy.d2h_s += dur,
            }
        }
        if let Some(trace) = self.trace.as_mut() {
            let at = jr.step_ref(s, r.step);
            let (graph, plan) = (jr.job.graph(), jr.job.plan());
            let start_s = self.epoch_s + r.started_s;
            trace.span(r.job, graph, plan, at, jr.iteration, start_s, dur);
        }
        jr.done_at[r.step] = t;
        jr.next[s] += 1;
        jr.done += 1;
        jr.on_stream[s] = false;
        self.streams[s] = None;
        if r.scratch_bytes > 0 {
            self.free(r.job, r.scratch_bytes);
        }
    }

    /// Why nothing can happen, if so: a step never ends (a rate of 0 or an
    /// infinite op time), or nothing runs, no job is still to arrive, and a
    /// job has steps left (a deadlock).
    fn stuck(&self, t_next: f64) -> Option<ColocateError> {
        if t_next.is_finite() {
            return None;
        }
        if let Some((s, r)) = (0..3).find_map(|s| self.streams[s].map(|r| (s, r))) {
            let jr = &self.jobs[r.job];
            let at = jr.step_ref(s, r.step);
            return Some(sim_error(jr.job, SimErrorKind::InfiniteTime(at)));
        }
        if self.next_arrival().is_finite() {
            return None;
        }
        let jr = self.jobs.iter().find(|jr| jr.phase == Phase::Running)?;
        let s = (0..3).find(|&s| jr.next[s] < jr.len[s]).unwrap_or(0);
        let at = StepRef {
            stream: Stream::ALL[s],
            index: jr.next[s] as u32,
        };
        Some(sim_error(jr.job, SimErrorKind::Deadlock(at)))
    }

    fn report(self, budget_bytes: u64) -> ColocateReport {
        let first_arrival = self
            .jobs
            .iter()
            .map(|jr| jr.report.arrival_s)
            .fold(f64::INFINITY, f64::min);
        let last_finish = self
            .jobs
            .iter()
            .map(|jr| jr.report.finish_s)
            .fold(f64::NEG_INFINITY, f64::max);
        ColocateReport {
            jobs: self.jobs.into_iter().map(|jr| jr.report).collect(),
            peak_live_bytes: self.peak_bytes,
            budget_bytes,
            fits_budget: self.peak_bytes <= budget_bytes,
            makespan_s: last_finish - first_arrival,
            busy: self.busy,
        }
    }
}
