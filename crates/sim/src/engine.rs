//! The discrete-event engine: three streams, waits, duplex-aware copies, and memory
//! through an allocator model, run for several iterations to reach steady state.

use crate::link::{InFlight, advance_to, ends_s};
use crate::report::{SimOom, SimReport, StreamBusy};
use crate::trace::TraceBuilder;
use outcore_alloc::{AllocId, Allocator, Trace};
use outcore_cost::{CopyRates, CostModel};
use outcore_graph::{Graph, OpId, TensorId};
use outcore_plan::{
    AllocatorSpec, Plan, PreparedGraph, Program, Residency, StepInstr, StepRef, Stream, TimedStep,
};

/// What to simulate and what to record.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Iterations to run back to back; the report describes the last one. More
    /// than one lets allocator caches reach their steady state.
    pub iterations: usize,
    /// Record a Chrome trace of the last iteration.
    pub record_trace: bool,
    /// Record every allocate / free as an allocation trace.
    pub record_alloc_trace: bool,
    /// Record the order in which the last iteration's steps start (see
    /// [`SimOutput::start_order`]).
    pub record_start_order: bool,
    /// Record the last iteration's timeline: every step with its start and
    /// end, in the order the steps started (see [`SimOutput::timeline`]).
    pub record_timeline: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            iterations: 2,
            record_trace: false,
            record_alloc_trace: false,
            record_start_order: false,
            record_timeline: false,
        }
    }
}

/// The report plus the optional recordings.
#[derive(Debug)]
pub struct SimOutput {
    pub report: SimReport,
    /// Chrome Trace Event JSON, when asked for.
    pub trace: Option<serde_json::Value>,
    /// Allocation trace, when asked for.
    pub alloc_trace: Option<Trace>,
    /// The last iteration's steps in the order they started (ties in the order
    /// the event loop took them), when asked for. An executor that issues steps
    /// in this order hands its allocator the simulated sequence of allocations
    /// and frees, which is what a real allocator's feasibility was checked on.
    pub start_order: Option<Vec<StepRef>>,
    /// The last iteration's steps in start order with their start and end
    /// times (seconds from the iteration's start), when asked for: what
    /// [`outcore_plan::pin_frees`] pins a plan to.
    pub timeline: Option<Vec<TimedStep>>,
}

/// An error that stops a simulation before it can report (not an out-of-memory,
/// which is part of the report).
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct SimError {
    pub kind: SimErrorKind,
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimErrorKind {
    #[error(
        "the plan's allocator configuration is invalid: {0}; use {{\"kind\": \"perfect\"}}, best-fit, size-class or virtual-chunks"
    )]
    BadAllocator(String),
    #[error(
        "the simulated time is infinite at {0}: the cost model gives it a rate of 0 or an infinite time; check the device profile's rates and the latency table"
    )]
    InfiniteTime(StepRef),
    #[error("the plan deadlocks at {0}: verify the plan first (`outcore plan` does)")]
    Deadlock(StepRef),
    #[error("the plan references {0}, which the graph lacks: it was made for another graph")]
    BadReference(String),
}

/// What a step does over time (see [`step_work`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepWork {
    /// Fixed duration on the compute stream.
    Kernel { time_s: f64, recompute: bool },
    /// A copy (a swap-in, or else a swap-out): fixed latency, then bytes at a
    /// rate that depends on the other direction.
    Copy { bytes: u64, swap_in: bool },
    /// No duration: a free of this tensor.
    Instant(TensorId),
}

/// A step that has started and not finished.
#[derive(Debug, Clone, Copy)]
struct Running {
    step: usize,
    flight: InFlight,
    started_s: f64,
    /// Scratch bytes held until it finishes.
    scratch_bytes: u64,
    /// A recomputation: its time counts as recompute time.
    recompute: bool,
}

/// Device memory as the event loop sees it. Two models: [`Perfect`] (bytes
/// only) and [`Real`] (an allocator over addresses); the loop is compiled
/// once for each, so the perfect model's bookkeeping is a few additions.
trait Memory {
    fn allocate(&mut self, id: u64, size_bytes: u64, at: Option<StepRef>);
    fn free(&mut self, id: u64, size_bytes: u64);
    fn live(&self) -> u64;
    /// Peak reserved bytes, fragmentation, peak live bytes and the first
    /// allocation failure, at the end.
    fn finish(self) -> (u64, Option<f64>, u64, Option<SimOom>);
}

/// A perfect allocator: every request fits exactly.
#[derive(Debug, Default)]
struct Perfect {
    live: u64,
    peak_live: u64,
}

impl Memory for Perfect {
    #[inline]
    fn allocate(&mut self, _id: u64, size_bytes: u64, _at: Option<StepRef>) {
        self.live += size_bytes;
        self.peak_live = self.peak_live.max(self.live);
    }

    #[inline]
    fn free(&mut self, _id: u64, size_bytes: u64) {
        self.live = self.live.saturating_sub(size_bytes);
    }

    #[inline]
    fn live(&self) -> u64 {
        self.live
    }

    fn finish(self) -> (u64, Option<f64>, u64, Option<SimOom>) {
        (self.peak_live, Some(1.0), self.peak_live, None)
    }
}

/// A real allocator over addresses; its first failure is the plan's OOM.
struct Real {
    alloc: Box<dyn Allocator>,
    oom: Option<SimOom>,
    /// Ids from here on are steps' scratch buffers, not tensors.
    scratch_id_base: u64,
}

impl Memory for Real {
    fn allocate(&mut self, id: u64, size_bytes: u64, at: Option<StepRef>) {
        let Err(e) = self.alloc.allocate(AllocId(id), size_bytes) else {
            return;
        };
        if self.oom.is_some() {
            return;
        }
        let (free_bytes, largest) = match e.kind() {
            outcore_alloc::AllocErrorKind::OutOfMemory {
                free_bytes,
                largest_free_block_bytes,
                ..
            } => (*free_bytes, *largest_free_block_bytes),
            _ => (0, 0),
        };
        let tensor = (id < self.scratch_id_base).then_some(TensorId(id as u32));
        self.oom = Some(SimOom {
            at,
            tensor,
            requested_bytes: size_bytes,
            live_bytes: self.alloc.stats().live_bytes,
            free_bytes,
            largest_free_block_bytes: largest,
            message: e.to_string(),
        });
    }

    fn free(&mut self, id: u64, _size_bytes: u64) {
        // A free of a failed allocation is not an error worth stopping for:
        // the OOM is already reported.
        let _ = self.alloc.free(AllocId(id));
    }

    fn live(&self) -> u64 {
        self.alloc.stats().live_bytes
    }

    fn finish(self) -> (u64, Option<f64>, u64, Option<SimOom>) {
        let st = self.alloc.stats();
        (
            st.peak_reserved_bytes,
            st.fragmentation(),
            st.peak_live_bytes,
            self.oom,
        )
    }
}

/// A memory model with the optional allocation trace.
struct Sim<M> {
    memory: M,
    alloc_trace: Option<Trace>,
}

impl<M: Memory> Sim<M> {
    #[inline]
    fn allocate(&mut self, id: u64, size_bytes: u64, at: Option<StepRef>) {
        if let Some(t) = self.alloc_trace.as_mut() {
            t.push_alloc(AllocId(id), size_bytes);
        }
        self.memory.allocate(id, size_bytes, at);
    }

    #[inline]
    fn free(&mut self, id: u64, size_bytes: u64) {
        if let Some(t) = self.alloc_trace.as_mut() {
            t.push_free(AllocId(id));
        }
        self.memory.free(id, size_bytes);
    }
}

/// What the simulator needs of a (graph, cost model) pair, computed once: op
/// times and copy rates from the cost model, and the graph's lookup tables.
#[derive(Debug, Clone)]
pub struct SimPrepared {
    /// Seconds of each op (by op id) under the cost model.
    pub op_time_s: Vec<f64>,
    pub copy: CopyRates,
    /// Sum of every op's time: the iteration time with unlimited memory.
    pub ideal_time_s: f64,
    pub graph: PreparedGraph,
}

impl SimPrepared {
    pub fn new(graph: &Graph, cost: &dyn CostModel) -> Self {
        let op_time_s: Vec<f64> = (0..graph.ops.len())
            .map(|i| cost.op_time_s(graph, OpId(i as u32)))
            .collect();
        SimPrepared {
            ideal_time_s: op_time_s.iter().sum(),
            op_time_s,
            copy: cost.copy_rates(),
            graph: PreparedGraph::new(graph),
        }
    }
}

/// Reusable buffers of [`simulate_program`].
#[derive(Debug, Clone, Default)]
pub struct SimScratch {
    /// Per step (global id: compute, then h2d, then d2h): when it finished in
    /// the current iteration (infinity: not yet).
    done_at: Vec<f64>,
    initial: Vec<Option<Residency>>,
}

/// Simulates `plan` on `graph` under `cost`.
pub fn simulate(
    graph: &Graph,
    plan: &Plan,
    cost: &dyn CostModel,
    options: &SimOptions,
) -> Result<SimOutput, SimError> {
    let prepared = SimPrepared::new(graph, cost);
    simulate_program(
        graph,
        &prepared,
        plan,
        &plan.allocator,
        options,
        &mut SimScratch::default(),
    )
}

/// Checks that every wait, op and tensor a program names exists (stream by
/// stream, step by step); returns the swapped-in and swapped-out bytes.
#[cold]
fn check_program<P: Program>(
    graph: &Graph,
    prepared: &SimPrepared,
    program: &P,
) -> Result<(u64, u64), SimError> {
    let pg = &prepared.graph;
    let n_t = pg.n_tensors();
    let bad = |what: String| SimError {
        kind: SimErrorKind::BadReference(what),
    };
    let size = |t: TensorId| -> Result<u64, SimError> {
        match pg.size_bytes.get(t.index()) {
            Some(&size) if t.index() < n_t => Ok(size),
            _ => Err(bad(format!("tensor {t}"))),
        }
    };
    let mut swap_in_bytes = 0u64;
    let mut swap_out_bytes = 0u64;
    for st in Stream::ALL {
        for i in 0..program.stream_len(st) {
            for w in program.waits(st, i) {
                if w.index as usize >= program.stream_len(w.stream) {
                    return Err(bad(format!("step {w}")));
                }
            }
            match program.instr(st, i) {
                StepInstr::Compute(op) | StepInstr::Recompute { op, .. } => {
                    if op.index() >= graph.ops.len() {
                        return Err(bad(format!("op {op}")));
                    }
                }
                StepInstr::SwapIn(t) => swap_in_bytes += size(t)?,
                StepInstr::SwapOut(t) => swap_out_bytes += size(t)?,
                StepInstr::Free(t) => {
                    size(t)?;
                }
            }
        }
    }
    Ok((swap_in_bytes, swap_out_bytes))
}

/// The label of a finished step in the trace.
fn trace_name<P: Program>(graph: &Graph, program: &P, at: StepRef) -> String {
    match program.instr(at.stream, at.index as usize) {
        StepInstr::Compute(op) => graph.op(op).name.clone(),
        StepInstr::Recompute { op, .. } => format!("recompute {}", graph.op(op).name),
        StepInstr::SwapIn(t) => format!("swap-in {}", graph.tensor(t).name),
        StepInstr::SwapOut(t) => format!("swap-out {}", graph.tensor(t).name),
        StepInstr::Free(_) => String::new(),
    }
}

/// The op a step runs, for the trace.
fn label_op<P: Program>(program: &P, at: StepRef) -> Option<u32> {
    match program.instr(at.stream, at.index as usize) {
        StepInstr::Compute(op) | StepInstr::Recompute { op, .. } => Some(op.0),
        _ => None,
    }
}

/// [`simulate`] on any [`Program`] with `allocator`, reusing `scratch`.
/// `prepared` must be `SimPrepared::new(graph, cost)`.
pub fn simulate_program<P: Program>(
    graph: &Graph,
    prepared: &SimPrepared,
    program: &P,
    allocator: &AllocatorSpec,
    options: &SimOptions,
    scratch: &mut SimScratch,
) -> Result<SimOutput, SimError> {
    let run = Run::new(graph, prepared, program, options);
    let result = match allocator.config() {
        None => run.simulate(Perfect::default(), scratch),
        Some(config) => match outcore_alloc::build(&config, program.budget_bytes()) {
            Ok(alloc) => {
                let memory = Real {
                    alloc,
                    oom: None,
                    scratch_id_base: prepared.graph.n_tensors() as u64,
                };
                run.simulate(memory, scratch)
            }
            Err(e) => Err(SimError {
                kind: SimErrorKind::BadAllocator(e.to_string()),
            }),
        },
    };
    // The run checks each reference as it meets it, so a program that runs
    // through has none bad. When it fails, a bad reference (the first in
    // stream order) is the error, whatever the run ran into first.
    result.map_err(|e| check_program(graph, prepared, program).err().unwrap_or(e))
}

/// A reference the run met that the graph or program lacks; reported as
/// `check_program` words it.
fn bad_reference(what: String) -> SimError {
    SimError {
        kind: SimErrorKind::BadReference(what),
    }
}

/// What step `at` of `program` does, with the allocations it makes as it
/// starts: each output tensor it keeps goes through `allocate(tensor,
/// size_bytes)`, in the order the event loop allocates them. Returns the work
/// and the scratch bytes (workspace, and outputs a recomputation does not keep)
/// the step holds until it finishes; the caller allocates those. A reference
/// to an op or tensor the graph lacks is an error. The simulator's own loop
/// starts every step through this function, so another event loop over the
/// same programs (the multi-job simulator of `outcore-colocate`) prices and
/// allocates steps exactly as [`simulate`] does.
pub fn step_work<P: Program>(
    prepared: &SimPrepared,
    program: &P,
    at: StepRef,
    mut allocate: impl FnMut(TensorId, u64),
) -> Result<(StepWork, u64), SimError> {
    let pg = &prepared.graph;
    let instr = program.instr(at.stream, at.index as usize);
    let size = |t: TensorId| match pg.size_bytes.get(t.index()) {
        Some(&size) if t.index() < pg.n_tensors() => Ok(size),
        _ => Err(bad_reference(format!("tensor {t}"))),
    };
    let mut scratch_bytes = 0;
    let work = match instr {
        StepInstr::Compute(op) | StepInstr::Recompute { op, .. } => {
            if op.index() >= prepared.op_time_s.len() {
                return Err(bad_reference(format!("op {op}")));
            }
            let kept = match instr {
                StepInstr::Recompute { outputs, .. } => Some(outputs),
                _ => None,
            };
            scratch_bytes += pg.workspace_bytes[op.index()];
            for &o in pg.op_allocated(op) {
                let size = pg.size_bytes[o.index()];
                if kept.is_none_or(|k| k.contains(&o)) {
                    allocate(o, size);
                } else {
                    // Outputs not asked for live in scratch for the step only.
                    scratch_bytes += size;
                }
            }
            StepWork::Kernel {
                time_s: prepared.op_time_s[op.index()],
                recompute: kept.is_some(),
            }
        }
        StepInstr::SwapIn(t) => {
            let size = size(t)?;
            allocate(t, size);
            StepWork::Copy {
                bytes: size,
                swap_in: true,
            }
        }
        StepInstr::SwapOut(t) => StepWork::Copy {
            bytes: size(t)?,
            swap_in: false,
        },
        StepInstr::Free(t) => {
            size(t)?;
            StepWork::Instant(t)
        }
    };
    Ok((work, scratch_bytes))
}

/// One simulation: the program, its shape and what to record.
struct Run<'a, P> {
    graph: &'a Graph,
    prepared: &'a SimPrepared,
    program: &'a P,
    options: &'a SimOptions,
    /// Per stream: the global id of its first step, and its length.
    offset: [usize; 3],
    len: [usize; 3],
}

/// What the loop records across iterations.
struct Recorder {
    peak_live: u64,
    tracer: TraceBuilder,
    start_order: Option<Vec<StepRef>>,
    /// The last iteration's starts (end times filled in at the end).
    timeline: Option<Vec<TimedStep>>,
    /// Bytes the last iteration copies in and out.
    swap_in_bytes: u64,
    swap_out_bytes: u64,
}

/// The event loop's state within one iteration.
struct Iteration {
    /// Iterations are separated by a barrier (the plan's waits are within one
    /// iteration), so each runs on its own clock from zero.
    now: f64,
    start_s: f64,
    next: [usize; 3],
    running: [Option<Running>; 3],
    /// Per stream: a wait of its next step known not to be done yet (a
    /// global id, `usize::MAX`: none known), checked first when it polls.
    blocker: [usize; 3],
    /// Steps finished so far.
    done: usize,
    busy: StreamBusy,
    recompute_s: f64,
    /// The last iteration: the one traced and reported.
    last: bool,
}

impl<'a, P: Program> Run<'a, P> {
    fn new(
        graph: &'a Graph,
        prepared: &'a SimPrepared,
        program: &'a P,
        options: &'a SimOptions,
    ) -> Self {
        let mut offset = [0usize; 3];
        let mut len = [0usize; 3];
        let mut total = 0;
        for st in Stream::ALL {
            offset[st.index()] = total;
            len[st.index()] = program.stream_len(st);
            total += len[st.index()];
        }
        Run {
            graph,
            prepared,
            program,
            options,
            offset,
            len,
        }
    }

    fn total(&self) -> usize {
        self.offset[2] + self.len[2]
    }

    /// Runs every iteration and reports the last.
    fn simulate<M: Memory>(
        &self,
        memory: M,
        scratch: &mut SimScratch,
    ) -> Result<SimOutput, SimError> {
        let pg = &self.prepared.graph;
        let n_t = pg.n_tensors();
        let mut sim = Sim {
            memory,
            alloc_trace: self.options.record_alloc_trace.then(|| Trace::new(None)),
        };
        let SimScratch { done_at, initial } = scratch;
        // Persistent tensors resident at the start stay allocated across iterations.
        initial.clear();
        initial.resize(n_t, None);
        for &(t, r) in self.program.initial_residency() {
            if let Some(slot) = initial.get_mut(t.index()) {
                *slot = Some(r);
            }
        }
        for &t in &pg.persistent_ids {
            let residency = initial[t.index()].unwrap_or(Residency::Device);
            if residency != Residency::Host {
                sim.allocate(t.0 as u64, pg.size_bytes[t.index()], None);
            }
        }

        let iterations = self.options.iterations.max(1);
        done_at.clear();
        done_at.resize(self.total(), f64::INFINITY);
        let mut rec = Recorder {
            peak_live: 0,
            tracer: TraceBuilder::new(),
            start_order: self.options.record_start_order.then(Vec::new),
            timeline: self.options.record_timeline.then(Vec::new),
            swap_in_bytes: 0,
            swap_out_bytes: 0,
        };
        let mut per_iteration = Vec::with_capacity(iterations);
        let mut busy = StreamBusy::default();
        let mut recompute_time_s = 0.0;
        for iter in 0..iterations {
            done_at.iter_mut().for_each(|d| *d = f64::INFINITY);
            for &t in &pg.batch_input_ids {
                sim.allocate(t.0 as u64, pg.size_bytes[t.index()], None);
            }
            rec.peak_live = rec.peak_live.max(sim.memory.live());
            let mut it = Iteration {
                now: 0.0,
                start_s: 0.0,
                next: [0; 3],
                running: [None; 3],
                blocker: [usize::MAX; 3],
                done: 0,
                busy: StreamBusy::default(),
                recompute_s: 0.0,
                last: iter + 1 == iterations,
            };
            loop {
                self.start_ready(&mut it, &mut sim, done_at, &mut rec)?;
                if it.done == self.total() {
                    break;
                }
                self.advance(&mut it, &mut sim, done_at, &mut rec)?;
            }
            per_iteration.push(it.now - it.start_s);
            if it.last
                && let Some(timeline) = rec.timeline.as_mut()
            {
                for t in timeline.iter_mut() {
                    let id = self.offset[t.at.stream.index()] + t.at.index as usize;
                    t.end_s = done_at[id] - it.start_s;
                }
            }
            busy = it.busy;
            recompute_time_s = it.recompute_s;
        }

        let ideal_time_s = self.prepared.ideal_time_s;
        let iter_time_s = per_iteration.last().copied().unwrap_or(0.0);
        let (peak_reserved, fragmentation, peak_live_bytes, oom) = sim.memory.finish();
        let report = SimReport {
            iter_time_s,
            ideal_time_s,
            throughput_vs_ideal: if iter_time_s > 0.0 {
                ideal_time_s / iter_time_s
            } else {
                1.0
            },
            peak_live_bytes: peak_live_bytes.max(rec.peak_live),
            peak_reserved_bytes: peak_reserved,
            fragmentation,
            swap_in_bytes: rec.swap_in_bytes,
            swap_out_bytes: rec.swap_out_bytes,
            recompute_time_s,
            stall_time_s: (iter_time_s - busy.compute_s).max(0.0),
            busy,
            iterations,
            per_iteration_time_s: per_iteration,
            oom,
        };
        Ok(SimOutput {
            report,
            trace: self
                .options
                .record_trace
                .then(|| rec.tracer.finish(&self.graph.meta.model)),
            alloc_trace: sim.alloc_trace,
            start_order: rec.start_order,
            timeline: rec.timeline,
        })
    }

    /// Starts every step that can start now, sweeping the streams in order
    /// until a sweep completes no instant step (a free completes at once and
    /// may unblock a step of another stream).
    fn start_ready<M: Memory>(
        &self,
        it: &mut Iteration,
        sim: &mut Sim<M>,
        done_at: &mut [f64],
        rec: &mut Recorder,
    ) -> Result<(), SimError> {
        let mut progressed = true;
        while progressed {
            progressed = false;
            for s in 0..3 {
                if it.running[s].is_some() || it.next[s] >= self.len[s] {
                    continue;
                }
                let blocker = it.blocker[s];
                if blocker != usize::MAX && done_at[blocker] > it.now {
                    continue;
                }
                let st = Stream::ALL[s];
                let i = it.next[s];
                let mut pending = None;
                for w in self.program.waits(st, i) {
                    let ws = w.stream.index();
                    if w.index as usize >= self.len[ws] {
                        return Err(bad_reference(format!("step {w}")));
                    }
                    let w = self.offset[ws] + w.index as usize;
                    if done_at[w] > it.now {
                        pending = Some(w);
                        break;
                    }
                }
                if let Some(w) = pending {
                    it.blocker[s] = w;
                    continue;
                }
                it.blocker[s] = usize::MAX;
                let at = StepRef {
                    stream: st,
                    index: i as u32,
                };
                let id = self.offset[s] + i;
                if it.last
                    && let Some(order) = rec.start_order.as_mut()
                {
                    order.push(at);
                }
                if it.last
                    && let Some(timeline) = rec.timeline.as_mut()
                {
                    timeline.push(TimedStep {
                        at,
                        start_s: it.now - it.start_s,
                        end_s: f64::NAN,
                    });
                }
                let (work, scratch_bytes) = self.allocate_step(sim, at, id)?;
                let record_trace = it.last && self.options.record_trace;
                rec.peak_live = rec.peak_live.max(sim.memory.live());
                if record_trace {
                    rec.tracer.memory(it.now - it.start_s, sim.memory.live());
                }
                let (flight, recompute) = match work {
                    StepWork::Instant(t) => {
                        sim.free(t.0 as u64, self.prepared.graph.size_bytes[t.index()]);
                        if record_trace {
                            rec.tracer.memory(it.now - it.start_s, sim.memory.live());
                        }
                        done_at[id] = it.now;
                        it.next[s] += 1;
                        it.done += 1;
                        progressed = true;
                        continue;
                    }
                    StepWork::Kernel { time_s, recompute } => {
                        (InFlight::kernel(it.now, time_s), recompute)
                    }
                    StepWork::Copy { bytes, swap_in } => {
                        if it.last {
                            match swap_in {
                                true => rec.swap_in_bytes += bytes,
                                false => rec.swap_out_bytes += bytes,
                            }
                        }
                        (InFlight::copy(self.prepared.copy.latency_s, bytes), false)
                    }
                };
                it.running[s] = Some(Running {
                    step: id,
                    flight,
                    started_s: it.now,
                    scratch_bytes,
                    recompute,
                });
            }
        }
        Ok(())
    }

    /// Makes the allocations of step `at` (global id `id`) as it starts;
    /// returns its work and the scratch bytes it holds while it runs. A
    /// reference to an op or tensor the graph lacks is an error.
    fn allocate_step<M: Memory>(
        &self,
        sim: &mut Sim<M>,
        at: StepRef,
        id: usize,
    ) -> Result<(StepWork, u64), SimError> {
        let (work, scratch_bytes) = step_work(self.prepared, self.program, at, |t, size| {
            sim.allocate(t.0 as u64, size, Some(at))
        })?;
        if scratch_bytes > 0 {
            let scratch_id = self.prepared.graph.n_tensors() as u64 + id as u64;
            sim.allocate(scratch_id, scratch_bytes, Some(at));
        }
        Ok((work, scratch_bytes))
    }

    /// Advances the clock to the next completion and finishes every step that
    /// completes then. Copy rates depend on whether the other direction is busy.
    fn advance<M: Memory>(
        &self,
        it: &mut Iteration,
        sim: &mut Sim<M>,
        done_at: &mut [f64],
        rec: &mut Recorder,
    ) -> Result<(), SimError> {
        let copy = &self.prepared.copy;
        let now = it.now;
        let flights = it.running.each_ref().map(|r| r.as_ref().map(|r| &r.flight));
        let ends = ends_s(copy, now, flights);
        let t_next = ends.iter().copied().fold(f64::INFINITY, f64::min);
        if !t_next.is_finite() {
            return Err(self.stuck(it));
        }
        let flights = it
            .running
            .each_mut()
            .map(|r| r.as_mut().map(|r| &mut r.flight));
        let finished = advance_to(copy, now, t_next, &ends, flights);
        for s in (0..3).filter(|&s| finished[s]) {
            let Some(r) = it.running[s] else {
                continue;
            };
            let dur = t_next - r.started_s;
            match s {
                0 => {
                    it.busy.compute_s += dur;
                    if r.recompute {
                        it.recompute_s += dur;
                    }
                }
                1 => it.busy.h2d_s += dur,
                _ => it.busy.d2h_s += dur,
            }
            if r.scratch_bytes > 0 {
                let scratch_id = self.prepared.graph.n_tensors() as u64 + r.step as u64;
                sim.free(scratch_id, r.scratch_bytes);
            }
            if it.last && self.options.record_trace {
                let at = StepRef {
                    stream: Stream::ALL[s],
                    index: (r.step - self.offset[s]) as u32,
                };
                let name = trace_name(self.graph, self.program, at);
                let op = label_op(self.program, at);
                rec.tracer.span(s, &name, r.started_s - it.start_s, dur, op);
                rec.tracer.memory(t_next - it.start_s, sim.memory.live());
            }
            done_at[r.step] = t_next;
            it.next[s] += 1;
            it.done += 1;
            it.running[s] = None;
        }
        it.now = t_next;
        Ok(())
    }

    /// Why nothing can complete: something running never ends (a rate of 0
    /// or an infinite op time), or nothing runs and steps remain (a deadlock).
    fn stuck(&self, it: &Iteration) -> SimError {
        let step_at = |s: usize, id: usize| StepRef {
            stream: Stream::ALL[s],
            index: (id - self.offset[s]) as u32,
        };
        if let Some((s, r)) = (0..3).find_map(|s| it.running[s].map(|r| (s, r))) {
            return SimError {
                kind: SimErrorKind::InfiniteTime(step_at(s, r.step)),
            };
        }
        let stuck = (0..3)
            .find(|&s| it.next[s] < self.len[s])
            .map(|s| step_at(s, self.offset[s] + it.next[s]))
            .unwrap_or(StepRef {
                stream: Stream::Compute,
                index: 0,
            });
        SimError {
            kind: SimErrorKind::Deadlock(stuck),
        }
    }
}
