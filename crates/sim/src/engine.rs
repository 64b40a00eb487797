//! The discrete-event engine: three streams, waits, duplex-aware copies, and memory
//! through an allocator model, run for several iterations to reach steady state.

use crate::report::{SimOom, SimReport, StreamBusy};
use crate::trace::TraceBuilder;
use outcore_alloc::{AllocId, Allocator, Trace};
use outcore_cost::{CopyRates, CostModel};
use outcore_graph::{Graph, OpId, TensorId};
use outcore_plan::{
    AllocatorSpec, Plan, PreparedGraph, Program, Residency, StepInstr, StepRef, Stream,
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
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            iterations: 2,
            record_trace: false,
            record_alloc_trace: false,
            record_start_order: false,
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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Work {
    /// Fixed duration on the compute stream.
    Kernel { time_s: f64, recompute: bool },
    /// A copy: fixed latency, then bytes at a rate that depends on the other direction.
    Copy { bytes: u64 },
    /// No duration.
    Instant,
}

/// One step, flattened for the inner loop.
#[derive(Debug, Clone)]
struct SimStep {
    at: StepRef,
    work: Work,
    waits: std::ops::Range<usize>,
    allocs: std::ops::Range<usize>,
    frees: std::ops::Range<usize>,
    /// Scratch bytes held only while the step runs.
    scratch_bytes: u64,
    label_op: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Running {
    step: usize,
    /// Kernels: end time. Copies: unused.
    end_s: f64,
    latency_left_s: f64,
    bytes_left: f64,
    started_s: f64,
}

/// Memory model: a perfect allocator (bytes only) or a real one over addresses.
enum Memory {
    Perfect { live: u64, peak_live: u64 },
    Real { alloc: Box<dyn Allocator> },
}

impl Memory {
    fn live(&self) -> u64 {
        match self {
            Memory::Perfect { live, .. } => *live,
            Memory::Real { alloc } => alloc.stats().live_bytes,
        }
    }
}

struct Sim {
    memory: Memory,
    alloc_trace: Option<Trace>,
    oom: Option<SimOom>,
    scratch_id_base: u64,
}

impl Sim {
    fn allocate(&mut self, id: u64, size_bytes: u64, at: Option<StepRef>) -> bool {
        if let Some(t) = self.alloc_trace.as_mut() {
            t.push_alloc(AllocId(id), size_bytes);
        }
        match &mut self.memory {
            Memory::Perfect { live, peak_live } => {
                *live += size_bytes;
                *peak_live = (*peak_live).max(*live);
                true
            }
            Memory::Real { alloc } => match alloc.allocate(AllocId(id), size_bytes) {
                Ok(_) => true,
                Err(e) => {
                    if self.oom.is_none() {
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
                            live_bytes: alloc.stats().live_bytes,
                            free_bytes,
                            largest_free_block_bytes: largest,
                            message: e.to_string(),
                        });
                    }
                    false
                }
            },
        }
    }

    fn free(&mut self, id: u64, size_bytes: u64) {
        if let Some(t) = self.alloc_trace.as_mut() {
            t.push_free(AllocId(id));
        }
        match &mut self.memory {
            Memory::Perfect { live, .. } => *live = live.saturating_sub(size_bytes),
            Memory::Real { alloc } => {
                // A free of a failed allocation is not an error worth stopping for:
                // the OOM is already reported.
                let _ = alloc.free(AllocId(id));
            }
        }
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
    steps: Vec<SimStep>,
    waits: Vec<usize>,
    allocs: Vec<(u64, u64)>,
    frees: Vec<(u64, u64)>,
    done_at: Vec<f64>,
    initial: Vec<Option<Residency>>,
    batch_inputs: Vec<(u64, u64)>,
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

/// Flattens a program's steps for the event loop; returns the swapped-in and
/// swapped-out bytes.
fn flatten<P: Program>(
    graph: &Graph,
    prepared: &SimPrepared,
    program: &P,
    s: &mut SimScratch,
) -> Result<(u64, u64), SimError> {
    let pg = &prepared.graph;
    let n_t = pg.n_tensors();
    s.steps.clear();
    s.waits.clear();
    s.allocs.clear();
    s.frees.clear();
    let mut offset = [0usize; 3];
    let mut total = 0;
    for st in Stream::ALL {
        offset[st.index()] = total;
        total += program.stream_len(st);
    }
    let bad = |what: String| SimError {
        kind: SimErrorKind::BadReference(what),
    };
    let tensor_ok = |t: TensorId| -> Result<(), SimError> {
        if t.index() < n_t {
            Ok(())
        } else {
            Err(bad(format!("tensor {t}")))
        }
    };
    let mut swap_in_bytes = 0u64;
    let mut swap_out_bytes = 0u64;
    for st in Stream::ALL {
        for i in 0..program.stream_len(st) {
            let at = StepRef {
                stream: st,
                index: i as u32,
            };
            let w0 = s.waits.len();
            for w in program.waits(st, i) {
                if w.index as usize >= program.stream_len(w.stream) {
                    return Err(bad(format!("step {w}")));
                }
                s.waits.push(offset[w.stream.index()] + w.index as usize);
            }
            let a0 = s.allocs.len();
            let f0 = s.frees.len();
            let mut scratch_bytes = 0;
            let mut label_op = None;
            let instr = program.instr(st, i);
            let work = match instr {
                StepInstr::Compute(op) | StepInstr::Recompute { op, .. } => {
                    if op.index() >= graph.ops.len() {
                        return Err(bad(format!("op {op}")));
                    }
                    label_op = Some(op.0);
                    let kept = match instr {
                        StepInstr::Recompute { outputs, .. } => Some(outputs),
                        _ => None,
                    };
                    scratch_bytes += pg.workspace_bytes[op.index()];
                    for &o in pg.op_allocated(op) {
                        let size = pg.size_bytes[o.index()];
                        if kept.is_none_or(|k| k.contains(&o)) {
                            s.allocs.push((o.0 as u64, size));
                        } else {
                            scratch_bytes += size;
                        }
                    }
                    Work::Kernel {
                        time_s: prepared.op_time_s[op.index()],
                        recompute: kept.is_some(),
                    }
                }
                StepInstr::SwapIn(t) => {
                    tensor_ok(t)?;
                    let size = pg.size_bytes[t.index()];
                    s.allocs.push((t.0 as u64, size));
                    swap_in_bytes += size;
                    Work::Copy { bytes: size }
                }
                StepInstr::SwapOut(t) => {
                    tensor_ok(t)?;
                    let size = pg.size_bytes[t.index()];
                    swap_out_bytes += size;
                    Work::Copy { bytes: size }
                }
                StepInstr::Free(t) => {
                    tensor_ok(t)?;
                    s.frees.push((t.0 as u64, pg.size_bytes[t.index()]));
                    Work::Instant
                }
            };
            s.steps.push(SimStep {
                at,
                work,
                waits: w0..s.waits.len(),
                allocs: a0..s.allocs.len(),
                frees: f0..s.frees.len(),
                scratch_bytes,
                label_op,
            });
        }
    }
    Ok((swap_in_bytes, swap_out_bytes))
}

/// The memory model for an allocator over `budget_bytes`.
fn memory_model(allocator: &AllocatorSpec, budget_bytes: u64) -> Result<Memory, SimError> {
    Ok(match allocator.config() {
        None => Memory::Perfect {
            live: 0,
            peak_live: 0,
        },
        Some(config) => {
            let alloc = outcore_alloc::build(&config, budget_bytes).map_err(|e| SimError {
                kind: SimErrorKind::BadAllocator(e.to_string()),
            })?;
            Memory::Real { alloc }
        }
    })
}

/// The label of a finished step in the trace.
fn trace_name<P: Program>(graph: &Graph, program: &P, step: &SimStep) -> String {
    match program.instr(step.at.stream, step.at.index as usize) {
        StepInstr::Compute(op) => graph.op(op).name.clone(),
        StepInstr::Recompute { op, .. } => format!("recompute {}", graph.op(op).name),
        StepInstr::SwapIn(t) => format!("swap-in {}", graph.tensor(t).name),
        StepInstr::SwapOut(t) => format!("swap-out {}", graph.tensor(t).name),
        StepInstr::Free(_) => String::new(),
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
    let pg = &prepared.graph;
    let n_t = pg.n_tensors();
    let latency_s = prepared.copy.latency_s;
    let one_way = prepared.copy.one_way_bytes_per_s;
    let duplex = prepared.copy.duplex_bytes_per_s;
    let (swap_in_bytes, swap_out_bytes) = flatten(graph, prepared, program, scratch)?;
    let budget_bytes = program.budget_bytes();
    let mut sim = Sim {
        memory: memory_model(allocator, budget_bytes)?,
        alloc_trace: options.record_alloc_trace.then(|| Trace::new(None)),
        oom: None,
        scratch_id_base: n_t as u64,
    };
    let SimScratch {
        steps,
        waits,
        allocs,
        frees,
        done_at,
        initial,
        batch_inputs,
    } = scratch;
    let mut offset = [0usize; 3];
    let mut total = 0;
    for st in Stream::ALL {
        offset[st.index()] = total;
        total += program.stream_len(st);
    }

    // Persistent tensors resident at the start stay allocated across iterations.
    initial.clear();
    initial.resize(n_t, None);
    for &(t, r) in program.initial_residency() {
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
    batch_inputs.clear();
    batch_inputs.extend(
        (0..n_t)
            .filter(|&i| pg.batch_input[i] && pg.allocates[i])
            .map(|i| (i as u64, pg.size_bytes[i])),
    );

    let iterations = options.iterations.max(1);
    done_at.clear();
    done_at.resize(total, f64::INFINITY);
    let mut now: f64;
    let mut per_iteration = Vec::with_capacity(iterations);
    let mut busy = StreamBusy::default();
    let mut recompute_time_s = 0.0;
    let mut peak_live = 0u64;
    let mut tracer = TraceBuilder::new();
    let mut start_order = options.record_start_order.then(Vec::new);
    let len = [
        program.stream_len(Stream::Compute),
        program.stream_len(Stream::H2d),
        program.stream_len(Stream::D2h),
    ];
    for iter in 0..iterations {
        let last = iter + 1 == iterations;
        // Iterations are separated by a barrier (the plan's waits are within one
        // iteration), so each runs on its own clock from zero.
        now = 0.0;
        let start_s = now;
        done_at.iter_mut().for_each(|d| *d = f64::INFINITY);
        for &(id, size) in batch_inputs.iter() {
            sim.allocate(id, size, None);
        }
        peak_live = peak_live.max(sim.memory.live());
        let mut next = [0usize; 3];
        let mut running: [Option<Running>; 3] = [None; 3];
        let mut it_busy = StreamBusy::default();
        let mut it_recompute_s = 0.0;
        loop {
            // Start every step that can start now; instant steps complete at once.
            let mut progressed = true;
            while progressed {
                progressed = false;
                for s in 0..3 {
                    if running[s].is_some() || next[s] >= len[s] {
                        continue;
                    }
                    let id = offset[s] + next[s];
                    let step = &steps[id];
                    if waits[step.waits.clone()].iter().any(|&w| done_at[w] > now) {
                        continue;
                    }
                    if last && let Some(order) = start_order.as_mut() {
                        order.push(step.at);
                    }
                    for &(tid, size) in &allocs[step.allocs.clone()] {
                        sim.allocate(tid, size, Some(step.at));
                    }
                    let scratch_id = sim.scratch_id_base + id as u64;
                    if step.scratch_bytes > 0 {
                        sim.allocate(scratch_id, step.scratch_bytes, Some(step.at));
                    }
                    peak_live = peak_live.max(sim.memory.live());
                    if last && options.record_trace {
                        tracer.memory(now - start_s, sim.memory.live());
                    }
                    match step.work {
                        Work::Instant => {
                            for &(tid, size) in &frees[step.frees.clone()] {
                                sim.free(tid, size);
                            }
                            if last && options.record_trace {
                                tracer.memory(now - start_s, sim.memory.live());
                            }
                            done_at[id] = now;
                            next[s] += 1;
                            progressed = true;
                        }
                        Work::Kernel { time_s, .. } => {
                            running[s] = Some(Running {
                                step: id,
                                end_s: now + time_s,
                                latency_left_s: 0.0,
                                bytes_left: 0.0,
                                started_s: now,
                            });
                        }
                        Work::Copy { bytes } => {
                            running[s] = Some(Running {
                                step: id,
                                end_s: f64::INFINITY,
                                latency_left_s: latency_s,
                                bytes_left: bytes as f64,
                                started_s: now,
                            });
                        }
                    }
                }
            }
            if (0..3).all(|s| next[s] >= len[s] && running[s].is_none()) {
                break;
            }
            // Next completion. Copy rates depend on whether the other direction is busy.
            let both_copying = running[1].is_some() && running[2].is_some();
            let rate = |s: usize| {
                if both_copying {
                    duplex[s - 1]
                } else {
                    one_way[s - 1]
                }
            };
            let mut t_next = f64::INFINITY;
            for (s, slot) in running.iter().enumerate() {
                if let Some(r) = slot {
                    let end = if s == 0 {
                        r.end_s
                    } else {
                        now + r.latency_left_s + r.bytes_left / rate(s)
                    };
                    t_next = t_next.min(end);
                }
            }
            // Something is running but never ends: a rate of 0 or an infinite
            // op time, not a deadlock.
            if !t_next.is_finite()
                && let Some(r) = running.iter().flatten().next()
            {
                return Err(SimError {
                    kind: SimErrorKind::InfiniteTime(steps[r.step].at),
                });
            }
            if !t_next.is_finite() {
                let stuck = (0..3)
                    .find(|&s| next[s] < len[s])
                    .map(|s| steps[offset[s] + next[s]].at)
                    .unwrap_or(StepRef {
                        stream: Stream::Compute,
                        index: 0,
                    });
                return Err(SimError {
                    kind: SimErrorKind::Deadlock(stuck),
                });
            }
            let dt = t_next - now;
            for s in 0..3 {
                let Some(mut r) = running[s] else { continue };
                let finished = if s == 0 {
                    r.end_s <= t_next
                } else {
                    // Decide completion from the end time computed before advancing,
                    // so rounding in the remaining bytes cannot end a copy early or late.
                    let end = now + r.latency_left_s + r.bytes_left / rate(s);
                    let lat = r.latency_left_s.min(dt);
                    r.latency_left_s -= lat;
                    r.bytes_left = (r.bytes_left - (dt - lat) * rate(s)).max(0.0);
                    end <= t_next + 1e-12 * t_next.abs().max(1.0)
                };
                if finished {
                    let step = &steps[r.step];
                    let dur = t_next - r.started_s;
                    match (s, step.work) {
                        (0, Work::Kernel { recompute, .. }) => {
                            it_busy.compute_s += dur;
                            if recompute {
                                it_recompute_s += dur;
                            }
                        }
                        (1, _) => it_busy.h2d_s += dur,
                        _ => it_busy.d2h_s += dur,
                    }
                    if step.scratch_bytes > 0 {
                        sim.free(sim.scratch_id_base + r.step as u64, step.scratch_bytes);
                    }
                    if last && options.record_trace {
                        let name = trace_name(graph, program, step);
                        tracer.span(s, &name, r.started_s - start_s, dur, step.label_op);
                        tracer.memory(t_next - start_s, sim.memory.live());
                    }
                    done_at[r.step] = t_next;
                    next[s] += 1;
                    running[s] = None;
                } else {
                    running[s] = Some(r);
                }
            }
            now = t_next;
        }
        per_iteration.push(now - start_s);
        busy = it_busy;
        recompute_time_s = it_recompute_s;
    }

    let ideal_time_s = prepared.ideal_time_s;
    let iter_time_s = per_iteration.last().copied().unwrap_or(0.0);
    let (peak_reserved, fragmentation, peak_live_bytes) = match &sim.memory {
        Memory::Perfect { peak_live, .. } => (*peak_live, Some(1.0), *peak_live),
        Memory::Real { alloc } => {
            let st = alloc.stats();
            (
                st.peak_reserved_bytes,
                st.fragmentation(),
                st.peak_live_bytes,
            )
        }
    };
    let report = SimReport {
        iter_time_s,
        ideal_time_s,
        throughput_vs_ideal: if iter_time_s > 0.0 {
            ideal_time_s / iter_time_s
        } else {
            1.0
        },
        peak_live_bytes: peak_live_bytes.max(peak_live),
        peak_reserved_bytes: peak_reserved,
        fragmentation,
        swap_in_bytes,
        swap_out_bytes,
        recompute_time_s,
        stall_time_s: (iter_time_s - busy.compute_s).max(0.0),
        busy,
        iterations,
        per_iteration_time_s: per_iteration,
        oom: sim.oom,
    };
    Ok(SimOutput {
        report,
        trace: options
            .record_trace
            .then(|| tracer.finish(&graph.meta.model)),
        alloc_trace: sim.alloc_trace,
        start_order,
    })
}
