//! The discrete-event engine: three streams, waits, duplex-aware copies, and memory
//! through an allocator model, run for several iterations to reach steady state.

use crate::report::{SimOom, SimReport, StreamBusy};
use crate::trace::TraceBuilder;
use outcore_alloc::{AllocId, Allocator, Trace};
use outcore_cost::CostModel;
use outcore_graph::{Graph, TensorId};
use outcore_plan::{Instr, Plan, Residency, StepRef, Stream};

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
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            iterations: 2,
            record_trace: false,
            record_alloc_trace: false,
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

struct Sim<'a> {
    graph: &'a Graph,
    plan: &'a Plan,
    memory: Memory,
    alloc_trace: Option<Trace>,
    oom: Option<SimOom>,
    scratch_id_base: u64,
}

impl Sim<'_> {
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

/// Simulates `plan` on `graph` under `cost`.
pub fn simulate(
    graph: &Graph,
    plan: &Plan,
    cost: &dyn CostModel,
    options: &SimOptions,
) -> Result<SimOutput, SimError> {
    let n_t = graph.tensors.len();
    let device = cost.device();
    let latency_s = device.copy_latency_s;
    let one_way = [device.h2d_bytes_per_s, device.d2h_bytes_per_s];
    let duplex = [
        device.h2d_duplex_bytes_per_s(),
        device.d2h_duplex_bytes_per_s(),
    ];

    // Flatten the steps.
    let mut steps: Vec<SimStep> = Vec::with_capacity(plan.n_steps());
    let mut waits: Vec<usize> = Vec::new();
    let mut allocs: Vec<(u64, u64)> = Vec::new();
    let mut frees: Vec<(u64, u64)> = Vec::new();
    let mut offset = [0usize; 3];
    let mut total = 0;
    for s in Stream::ALL {
        offset[s.index()] = total;
        total += plan.stream(s).len();
    }
    let bad = |what: String| SimError {
        kind: SimErrorKind::BadReference(what),
    };
    let mut swap_in_bytes = 0u64;
    let mut swap_out_bytes = 0u64;
    for s in Stream::ALL {
        for (i, step) in plan.stream(s).iter().enumerate() {
            let at = StepRef {
                stream: s,
                index: i as u32,
            };
            let w0 = waits.len();
            for w in &step.waits {
                let len = plan.stream(w.stream).len();
                if w.index as usize >= len {
                    return Err(bad(format!("step {w}")));
                }
                waits.push(offset[w.stream.index()] + w.index as usize);
            }
            let a0 = allocs.len();
            let f0 = frees.len();
            let mut scratch_bytes = 0;
            let mut label_op = None;
            let tensor_ok = |t: TensorId| -> Result<(), SimError> {
                if t.index() < n_t {
                    Ok(())
                } else {
                    Err(bad(format!("tensor {t}")))
                }
            };
            let work = match &step.instr {
                Instr::Compute(op) | Instr::Recompute { op, .. } => {
                    if op.index() >= graph.ops.len() {
                        return Err(bad(format!("op {op}")));
                    }
                    let g_op = graph.op(*op);
                    label_op = Some(op.0);
                    let recompute = matches!(step.instr, Instr::Recompute { .. });
                    scratch_bytes += g_op.workspace_bytes;
                    for &o in &g_op.outputs {
                        let t = graph.tensor(o);
                        if !t.allocates() {
                            continue;
                        }
                        let keep = match &step.instr {
                            Instr::Recompute { outputs, .. } => outputs.contains(&o),
                            _ => true,
                        };
                        if keep {
                            allocs.push((o.0 as u64, t.size_bytes));
                        } else {
                            scratch_bytes += t.size_bytes;
                        }
                    }
                    Work::Kernel {
                        time_s: cost.op_time_s(graph, *op),
                        recompute,
                    }
                }
                Instr::SwapIn(t) => {
                    tensor_ok(*t)?;
                    let size = graph.tensor(*t).size_bytes;
                    allocs.push((t.0 as u64, size));
                    swap_in_bytes += size;
                    Work::Copy { bytes: size }
                }
                Instr::SwapOut(t) => {
                    tensor_ok(*t)?;
                    let size = graph.tensor(*t).size_bytes;
                    swap_out_bytes += size;
                    Work::Copy { bytes: size }
                }
                Instr::Free(t) => {
                    tensor_ok(*t)?;
                    frees.push((t.0 as u64, graph.tensor(*t).size_bytes));
                    Work::Instant
                }
            };
            steps.push(SimStep {
                at,
                work,
                waits: w0..waits.len(),
                allocs: a0..allocs.len(),
                frees: f0..frees.len(),
                scratch_bytes,
                label_op,
            });
        }
    }

    // Memory model.
    let memory = match plan.allocator.config() {
        None => Memory::Perfect {
            live: 0,
            peak_live: 0,
        },
        Some(config) => {
            let alloc = outcore_alloc::build(&config, plan.budget_bytes).map_err(|e| SimError {
                kind: SimErrorKind::BadAllocator(e.to_string()),
            })?;
            Memory::Real { alloc }
        }
    };
    let mut sim = Sim {
        graph,
        plan,
        memory,
        alloc_trace: options.record_alloc_trace.then(|| Trace::new(None)),
        oom: None,
        scratch_id_base: n_t as u64,
    };

    // Persistent tensors resident at the start stay allocated across iterations.
    let initial: std::collections::HashMap<TensorId, Residency> =
        plan.initial_residency.iter().copied().collect();
    for t in sim.graph.persistent_tensors() {
        let residency = initial.get(&t.id).copied().unwrap_or(Residency::Device);
        if residency != Residency::Host {
            sim.allocate(t.id.0 as u64, t.size_bytes, None);
        }
    }
    let batch_inputs: Vec<(u64, u64)> = sim
        .graph
        .tensors
        .iter()
        .filter(|t| t.producer.is_none() && !t.kind.is_persistent() && t.allocates())
        .map(|t| (t.id.0 as u64, t.size_bytes))
        .collect();

    let iterations = options.iterations.max(1);
    let mut done_at = vec![f64::INFINITY; total];
    let mut now: f64;
    let mut per_iteration = Vec::with_capacity(iterations);
    let mut busy = StreamBusy::default();
    let mut recompute_time_s = 0.0;
    let mut peak_live = 0u64;
    let mut tracer = TraceBuilder::new();
    for iter in 0..iterations {
        let last = iter + 1 == iterations;
        // Iterations are separated by a barrier (the plan's waits are within one
        // iteration), so each runs on its own clock from zero.
        now = 0.0;
        let start_s = now;
        done_at.iter_mut().for_each(|d| *d = f64::INFINITY);
        for &(id, size) in &batch_inputs {
            sim.allocate(id, size, None);
        }
        peak_live = peak_live.max(sim.memory.live());
        let mut next = [0usize; 3];
        let len = [
            plan.stream(Stream::Compute).len(),
            plan.stream(Stream::H2d).len(),
            plan.stream(Stream::D2h).len(),
        ];
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
                        let name = match sim.plan.step(step.at).map(|st| &st.instr) {
                            Some(Instr::Compute(op)) | Some(Instr::Recompute { op, .. }) => {
                                let prefix = if matches!(
                                    step.work,
                                    Work::Kernel {
                                        recompute: true,
                                        ..
                                    }
                                ) {
                                    "recompute "
                                } else {
                                    ""
                                };
                                format!("{prefix}{}", sim.graph.op(*op).name)
                            }
                            Some(Instr::SwapIn(t)) => {
                                format!("swap-in {}", sim.graph.tensor(*t).name)
                            }
                            Some(Instr::SwapOut(t)) => {
                                format!("swap-out {}", sim.graph.tensor(*t).name)
                            }
                            _ => String::new(),
                        };
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

    let ideal_time_s: f64 = (0..graph.ops.len())
        .map(|i| cost.op_time_s(graph, outcore_graph::OpId(i as u32)))
        .sum();
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
    })
}
