//! verify(): proves a plan safe for every timing consistent with stream order and
//! waits, or lists located violations.
//!
//! The proof works on the happens-before order of steps (same-stream order plus
//! waits), computed as vector clocks over the three streams. For every storage
//! owner it collects the plan's events (materialise, read, in-place write,
//! copy-out, free) and requires that every event other than a read is ordered
//! with respect to every other event on that tensor; reads may overlap each
//! other (a copy-out concurrent with a kernel that reads the same tensor is fine).
//! With that, residency and versions follow one order whatever the timing, and
//! the state machine below checks them. Memory is bounded per step by the bytes
//! that *may* be resident while it runs: a buffer counts unless its free is
//! ordered before the step or its allocation after it. The bound is checked at
//! every allocating step, where any timing's peak occurs.

use crate::plan::{Plan, Residency, StepRef, Stream};
use crate::prepared::PreparedGraph;
use crate::program::{Program, StepInstr};
use outcore_graph::{Graph, OpId, TensorId};
use std::fmt;

/// The kinds of unsafety verify() detects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViolationKind {
    /// An instruction names an op or tensor that does not exist, is on the wrong
    /// stream, or moves a tensor that owns no storage (a view or an update).
    Malformed { reason: String },
    /// A wait names a step that does not exist.
    BadWait { target: StepRef },
    /// The waits form a cycle: the plan deadlocks.
    Deadlock { steps: usize },
    /// A graph op is never computed.
    MissingCompute { op: OpId },
    /// A graph op is computed more than once.
    DuplicateCompute { op: OpId },
    /// A recomputation of an op that may not be re-executed.
    NotRecomputable { op: OpId },
    /// A read of a tensor that is not resident: before it is produced or swapped in, or after its free.
    ReadNotResident { tensor: TensorId },
    /// A recomputation whose input is not resident.
    RecomputeInputMissing { tensor: TensorId },
    /// A read or in-place write that sees the wrong version of a tensor updated in place.
    StaleVersion {
        tensor: TensorId,
        expected: u32,
        found: u32,
    },
    /// Two events on one tensor that are not ordered by stream order or waits,
    /// at least one of which is not a read.
    Unordered { tensor: TensorId, other: StepRef },
    /// A tensor is materialised while it is already resident.
    AlreadyResident { tensor: TensorId },
    /// A free or copy-out of a tensor that is not resident.
    NotResident { tensor: TensorId },
    /// A tensor that is needed later is freed without a current host copy and
    /// is not recomputed.
    FreedWithoutHostCopy { tensor: TensorId },
    /// A swap-in with no host copy, or only a stale one.
    SwapInWithoutHostCopy { tensor: TensorId },
    /// Device memory may exceed the budget while this step runs.
    OverBudget { bytes: u64, budget_bytes: u64 },
    /// The residency at the end of the iteration differs from the start.
    EndResidency {
        tensor: TensorId,
        expected: String,
        found: String,
    },
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ViolationKind::*;
        match self {
            Malformed { reason } => write!(f, "malformed instruction: {reason}"),
            BadWait { target } => write!(f, "waits for {target}, which does not exist"),
            Deadlock { steps } => write!(f, "the waits form a cycle; {steps} steps can never run"),
            MissingCompute { op } => write!(f, "{op} is never computed"),
            DuplicateCompute { op } => write!(f, "{op} is computed twice"),
            NotRecomputable { op } => write!(f, "{op} may not be recomputed"),
            ReadNotResident { tensor } => write!(
                f,
                "{tensor} is read while not resident (before it is produced or swapped in, or after its free)"
            ),
            RecomputeInputMissing { tensor } => {
                write!(f, "recomputation input {tensor} is not resident")
            }
            StaleVersion {
                tensor,
                expected,
                found,
            } => write!(
                f,
                "{tensor} is accessed at version {found} but the graph order needs version {expected}"
            ),
            Unordered { tensor, other } => write!(
                f,
                "races with {other} on {tensor}: add a wait so that one finishes before the other starts"
            ),
            AlreadyResident { tensor } => {
                write!(f, "{tensor} is materialised while already resident")
            }
            NotResident { tensor } => write!(f, "{tensor} is not resident here"),
            FreedWithoutHostCopy { tensor } => write!(
                f,
                "{tensor} is freed while needed later without a current host copy; swap it out first and wait for the copy"
            ),
            SwapInWithoutHostCopy { tensor } => {
                write!(f, "{tensor} is swapped in without a current host copy")
            }
            OverBudget {
                bytes,
                budget_bytes,
            } => write!(
                f,
                "device memory may reach {bytes} bytes, over the budget of {budget_bytes} bytes"
            ),
            EndResidency {
                tensor,
                expected,
                found,
            } => write!(
                f,
                "{tensor} ends the iteration {found} but starts it {expected}; the plan would not repeat"
            ),
        }
    }
}

/// One located violation; `at` is `None` for whole-plan problems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub at: Option<StepRef>,
    pub kind: ViolationKind,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) => write!(f, "{at}: {}", self.kind),
            None => write!(f, "plan: {}", self.kind),
        }
    }
}

/// Global step numbering: steps of stream 0, then 1, then 2.
#[derive(Debug, Clone, Copy, Default)]
struct Layout {
    offset: [usize; 3],
    len: [usize; 3],
}

impl Layout {
    fn of<P: Program>(program: &P) -> Layout {
        let mut layout = Layout::default();
        let mut total = 0;
        for s in Stream::ALL {
            layout.offset[s.index()] = total;
            layout.len[s.index()] = program.stream_len(s);
            total += layout.len[s.index()];
        }
        layout
    }

    fn total(&self) -> usize {
        self.offset[2] + self.len[2]
    }

    fn id(&self, r: StepRef) -> usize {
        self.offset[r.stream.index()] + r.index as usize
    }

    fn valid(&self, r: StepRef) -> bool {
        (r.index as usize) < self.len[r.stream.index()]
    }
}

/// Reusable buffers of [`verify_program`]: a search verifies many programs of
/// one graph; keeping these avoids allocating per step and per tensor.
#[derive(Debug, Clone, Default)]
pub struct VerifyScratch {
    layout: Layout,
    /// The stream and index of every step, by global id.
    refs: Vec<StepRef>,
    /// Fill cursors of the event grouping.
    event_fill: Vec<u32>,
    /// Steps in a topological order (all steps when there is no deadlock).
    topo: Vec<u32>,
    /// `vc[id][s]`: highest index on stream `s` that completes before step `id` starts (-1: none).
    vc: Vec<[i32; 3]>,
    /// Events in topological order, then grouped by tensor (stable).
    raw_events: Vec<(u32, Event)>,
    event_start: Vec<u32>,
    events: Vec<Event>,
    computed: Vec<u32>,
    buffers: Vec<Buffer>,
    initial: Vec<Option<Residency>>,
    reads_since: Vec<usize>,
    delta: Vec<i128>,
    /// Per stream: see `check_budget`.
    first_after: [Vec<u32>; 3],
}

impl VerifyScratch {
    /// Does step `a` complete before step `b` starts, in every timing?
    fn hb(&self, a: usize, b: usize) -> bool {
        let ra = self.refs[a];
        self.vc[b][ra.stream.index()] >= ra.index as i32
    }
}

/// What [`verify_program`] found besides the violations: the most bytes that
/// may be resident at any allocating step, and where (whether or not it is
/// within the budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryBound {
    pub peak_bytes: u64,
    pub at: Option<StepRef>,
}

/// Orders the steps and computes their vector clocks in one pass: the three
/// streams advance in turn, each as far as its next step's waits are done (a
/// step's predecessors are the previous step of its stream and its waits, so
/// this is a topological order). A pass in which no stream advances leaves the
/// remaining steps in a cycle of waits: a deadlock.
fn build_order<P: Program>(program: &P, s: &mut VerifyScratch, v: &mut Vec<Violation>) {
    let layout = Layout::of(program);
    s.layout = layout;
    let total = layout.total();
    s.refs.clear();
    for st in Stream::ALL {
        s.refs
            .extend((0..layout.len[st.index()] as u32).map(|index| StepRef { stream: st, index }));
    }
    // Waits on steps that do not exist are reported (in stream order) and ignored.
    for st in Stream::ALL {
        for i in 0..layout.len[st.index()] {
            for &w in program.waits(st, i) {
                if !layout.valid(w) {
                    v.push(Violation {
                        at: Some(StepRef {
                            stream: st,
                            index: i as u32,
                        }),
                        kind: ViolationKind::BadWait { target: w },
                    });
                }
            }
        }
    }
    s.topo.clear();
    s.vc.clear();
    s.vc.resize(total, [-1i32; 3]);
    let mut next = [0usize; 3];
    loop {
        let mut progressed = false;
        for st in Stream::ALL {
            let k = st.index();
            while next[k] < layout.len[k] {
                let i = next[k];
                let waits = program.waits(st, i);
                let blocked = waits
                    .iter()
                    .any(|w| layout.valid(*w) && w.index as usize >= next[w.stream.index()]);
                if blocked {
                    break;
                }
                let id = layout.offset[k] + i;
                let mut clock = if i > 0 {
                    let mut c = s.vc[id - 1];
                    c[k] = c[k].max(i as i32 - 1);
                    c
                } else {
                    [-1i32; 3]
                };
                for w in waits.iter().filter(|w| layout.valid(**w)) {
                    for (c, wc) in clock.iter_mut().zip(s.vc[layout.id(*w)]) {
                        *c = (*c).max(wc);
                    }
                    let wk = w.stream.index();
                    clock[wk] = clock[wk].max(w.index as i32);
                }
                s.vc[id] = clock;
                s.topo.push(id as u32);
                next[k] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    if s.topo.len() < total {
        v.push(Violation {
            at: None,
            kind: ViolationKind::Deadlock {
                steps: total - s.topo.len(),
            },
        });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    /// Allocation by the producing op.
    Produce,
    /// Allocation by a recomputation.
    Rematerialise,
    SwapIn,
    /// A kernel reads it; `expected` is the version graph order implies.
    Read {
        expected: u32,
        by_recompute: bool,
    },
    /// A kernel updates it in place, expecting version `expected` before the write.
    Write {
        expected: u32,
    },
    SwapOut,
    Free,
}

impl EventKind {
    fn is_read(self) -> bool {
        matches!(self, EventKind::Read { .. } | EventKind::SwapOut)
    }
}

#[derive(Debug, Clone, Copy)]
struct Event {
    step: u32,
    kind: EventKind,
}

/// A device buffer's allocation and free steps, for the memory bound.
#[derive(Debug, Clone, Copy)]
struct Buffer {
    size_bytes: u64,
    /// `None`: resident from the start.
    alloc: Option<usize>,
    /// `None`: resident to the end.
    free: Option<usize>,
}

/// Verifies `plan` against `graph`; an empty list means the plan is safe.
pub fn verify(plan: &Plan, graph: &Graph) -> Vec<Violation> {
    let prepared = PreparedGraph::new(graph);
    let mut violations = Vec::new();
    verify_program(
        graph,
        &prepared,
        plan,
        &mut VerifyScratch::default(),
        &mut violations,
    );
    violations
}

/// [`verify`] on any [`Program`], appending violations to `v` (in the order
/// `verify` lists them) and returning the memory bound. `prepared` must be
/// `PreparedGraph::new(graph)`.
pub fn verify_program<P: Program>(
    graph: &Graph,
    prepared: &PreparedGraph,
    program: &P,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) -> MemoryBound {
    build_order(program, s, v);
    collect_events(graph, prepared, program, s, v);
    if v.iter()
        .any(|x| matches!(x.kind, ViolationKind::Deadlock { .. }))
    {
        // Without a complete order the per-tensor checks would report noise.
        return MemoryBound::default();
    }
    for (i, &count) in s.computed.iter().enumerate() {
        let op = OpId(i as u32);
        if count == 0 {
            v.push(Violation {
                at: None,
                kind: ViolationKind::MissingCompute { op },
            });
        } else if count > 1 {
            v.push(Violation {
                at: None,
                kind: ViolationKind::DuplicateCompute { op },
            });
        }
    }
    group_events(prepared.n_tensors(), s);
    s.initial.clear();
    s.initial.resize(prepared.n_tensors(), None);
    let mut foreign_residency = Vec::new();
    for &(t, r) in program.initial_residency() {
        match s.initial.get_mut(t.index()) {
            Some(slot) => *slot = Some(r),
            None => foreign_residency.push(t),
        }
    }
    for ti in 0..prepared.n_tensors() {
        if prepared.allocates[ti] {
            check_tensor(prepared, TensorId(ti as u32), s, v);
        }
    }
    for t in foreign_residency {
        v.push(Violation {
            at: None,
            kind: ViolationKind::Malformed {
                reason: format!("initial residency given for {t}, which does not exist"),
            },
        });
    }
    check_budget(program, s, v)
}

/// Walks the steps in topological order and records every event per tensor,
/// with the per-step checks (stream, existence, recomputability).
fn collect_events<P: Program>(
    graph: &Graph,
    prepared: &PreparedGraph,
    program: &P,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) {
    let n_t = graph.tensors.len();
    let n_ops = graph.ops.len();
    s.raw_events.clear();
    s.computed.clear();
    s.computed.resize(n_ops, 0);
    s.buffers.clear();
    let malformed = |at: StepRef, reason: String| Violation {
        at: Some(at),
        kind: ViolationKind::Malformed { reason },
    };
    for k in 0..s.topo.len() {
        let id = s.topo[k] as usize;
        let at = s.refs[id];
        let instr = program.instr(at.stream, at.index as usize);
        if let Some(required) = instr.required_stream()
            && required != at.stream
        {
            v.push(malformed(
                at,
                format!("`{instr}` must be on the {required} stream"),
            ));
            continue;
        }
        let movable = |t: TensorId, v: &mut Vec<Violation>| -> Option<TensorId> {
            if t.index() >= n_t {
                v.push(malformed(at, format!("tensor {t} does not exist")));
                return None;
            }
            if !prepared.allocates[t.index()] {
                v.push(malformed(
                    at,
                    format!(
                        "{t} owns no storage (a view or in-place update); move its owner instead"
                    ),
                ));
                return None;
            }
            Some(t)
        };
        let event = |t: TensorId, kind: EventKind| {
            (
                t.0,
                Event {
                    step: id as u32,
                    kind,
                },
            )
        };
        match instr {
            StepInstr::Compute(op_id) | StepInstr::Recompute { op: op_id, .. } => {
                if op_id.index() >= n_ops {
                    v.push(malformed(at, format!("op {op_id} does not exist")));
                    continue;
                }
                op_events(prepared, instr, op_id, id, s, v);
            }
            StepInstr::SwapIn(t) => {
                if let Some(t) = movable(t, v) {
                    s.raw_events.push(event(t, EventKind::SwapIn));
                }
            }
            StepInstr::SwapOut(t) => {
                if let Some(t) = movable(t, v) {
                    s.raw_events.push(event(t, EventKind::SwapOut));
                }
            }
            StepInstr::Free(t) => {
                if let Some(t) = movable(t, v) {
                    s.raw_events.push(event(t, EventKind::Free));
                }
            }
        }
    }
}

/// The events of one compute or recompute step.
fn op_events(
    prepared: &PreparedGraph,
    instr: StepInstr<'_>,
    op_id: OpId,
    id: usize,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) {
    let at = s.refs[id];
    let recompute = matches!(instr, StepInstr::Recompute { .. });
    if recompute && !prepared.recomputable[op_id.index()] {
        v.push(Violation {
            at: Some(at),
            kind: ViolationKind::NotRecomputable { op: op_id },
        });
    }
    if !recompute {
        s.computed[op_id.index()] += 1;
    }
    let event = |t: TensorId, kind: EventKind| {
        (
            t.0,
            Event {
                step: id as u32,
                kind,
            },
        )
    };
    // In-place targets: the write subsumes the op's read of the same storage
    // (the prepared read list leaves them out).
    for &(owner, expected) in prepared.op_reads(op_id) {
        s.raw_events.push(event(
            owner,
            EventKind::Read {
                expected,
                by_recompute: recompute,
            },
        ));
    }
    let allocated = prepared.op_allocated(op_id);
    let workspace_bytes = prepared.workspace_bytes[op_id.index()];
    if let StepInstr::Recompute { outputs, .. } = instr {
        // Outputs not asked for are rematerialised into scratch for the step only.
        let mut scratch_bytes = workspace_bytes;
        for &o in allocated {
            if outputs.contains(&o) {
                s.raw_events.push(event(o, EventKind::Rematerialise));
            } else {
                scratch_bytes += prepared.size_bytes[o.index()];
            }
        }
        for &o in outputs {
            if !allocated.contains(&o) {
                v.push(Violation {
                    at: Some(at),
                    kind: ViolationKind::Malformed {
                        reason: format!("{o} is not a storage-owning output of {op_id}"),
                    },
                });
            }
        }
        s.buffers.push(Buffer {
            size_bytes: scratch_bytes,
            alloc: Some(id),
            free: Some(id),
        });
    } else {
        for &o in allocated {
            s.raw_events.push(event(o, EventKind::Produce));
        }
        for &(owner, expected) in prepared.op_writes(op_id) {
            s.raw_events
                .push(event(owner, EventKind::Write { expected }));
        }
        if workspace_bytes > 0 {
            s.buffers.push(Buffer {
                size_bytes: workspace_bytes,
                alloc: Some(id),
                free: Some(id),
            });
        }
    }
}

/// Groups the raw events by tensor, keeping topological order within a tensor.
fn group_events(n_t: usize, s: &mut VerifyScratch) {
    s.event_start.clear();
    s.event_start.resize(n_t + 1, 0);
    for &(t, _) in &s.raw_events {
        s.event_start[t as usize + 1] += 1;
    }
    for i in 0..n_t {
        s.event_start[i + 1] += s.event_start[i];
    }
    s.events.clear();
    s.events.resize(
        s.raw_events.len(),
        Event {
            step: 0,
            kind: EventKind::Free,
        },
    );
    s.event_fill.clear();
    s.event_fill.extend_from_slice(&s.event_start[..n_t]);
    for &(t, e) in &s.raw_events {
        let slot = &mut s.event_fill[t as usize];
        s.events[*slot as usize] = e;
        *slot += 1;
    }
}

/// The per-tensor state machine: ordering, residency, versions, host copies and
/// the residency at the end; records the tensor's device buffers.
fn check_tensor(
    prepared: &PreparedGraph,
    t_id: TensorId,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) {
    let ti = t_id.index();
    let size_bytes = prepared.size_bytes[ti];
    let evs = &s.events[s.event_start[ti] as usize..s.event_start[ti + 1] as usize];
    let persistent = prepared.persistent[ti];
    let given = s.initial[ti];
    let residency = if persistent {
        given.unwrap_or(Residency::Device)
    } else {
        Residency::Host
    };
    if !persistent && given.is_some() {
        v.push(Violation {
            at: None,
            kind: ViolationKind::Malformed {
                reason: format!("initial residency given for {t_id}, which is not persistent"),
            },
        });
    }
    // Inputs and labels arrive on the device with the batch (and exist on the host).
    let arrives_with_batch = prepared.batch_input[ti];
    let mut present = match residency {
        Residency::Device | Residency::DeviceAndHost => true,
        Residency::Host => arrives_with_batch,
    };
    let mut dev_version: u32 = 0;
    let mut host_version: Option<u32> = match residency {
        Residency::DeviceAndHost | Residency::Host if persistent => Some(0),
        _ if arrives_with_batch => Some(0),
        _ => None,
    };
    let mut alloc_at: Option<usize> = None;
    let mut resident_from_start = present;
    let mut last_nonread: Option<usize> = None;
    s.reads_since.clear();
    for (k, e) in evs.iter().enumerate() {
        let step = e.step as usize;
        let at = Some(s.refs[step]);
        // Ordering: a non-read must follow everything before it; a read must
        // follow the last non-read.
        if let Some(prev) = last_nonread
            && prev != step
            && !s.hb(prev, step)
        {
            v.push(Violation {
                at,
                kind: ViolationKind::Unordered {
                    tensor: t_id,
                    other: s.refs[prev],
                },
            });
        }
        if !e.kind.is_read() {
            for &r in &s.reads_since {
                if r != step && !s.hb(r, step) {
                    v.push(Violation {
                        at,
                        kind: ViolationKind::Unordered {
                            tensor: t_id,
                            other: s.refs[r],
                        },
                    });
                    break;
                }
            }
            s.reads_since.clear();
            last_nonread = Some(step);
        } else {
            s.reads_since.push(step);
        }
        match e.kind {
            EventKind::Produce | EventKind::Rematerialise | EventKind::SwapIn => {
                if present {
                    v.push(Violation {
                        at,
                        kind: ViolationKind::AlreadyResident { tensor: t_id },
                    });
                    continue;
                }
                if e.kind == EventKind::SwapIn {
                    match host_version {
                        Some(h) => dev_version = h,
                        None => {
                            v.push(Violation {
                                at,
                                kind: ViolationKind::SwapInWithoutHostCopy { tensor: t_id },
                            });
                        }
                    }
                } else {
                    dev_version = 0;
                }
                present = true;
                alloc_at = Some(step);
            }
            EventKind::Read {
                expected,
                by_recompute,
            } => {
                let missing = if by_recompute {
                    ViolationKind::RecomputeInputMissing { tensor: t_id }
                } else {
                    ViolationKind::ReadNotResident { tensor: t_id }
                };
                check_access(t_id, (present, dev_version, expected), missing, at, v);
            }
            EventKind::Write { expected } => {
                let missing = ViolationKind::ReadNotResident { tensor: t_id };
                check_access(t_id, (present, dev_version, expected), missing, at, v);
                dev_version = expected + 1;
            }
            EventKind::SwapOut => {
                if !present {
                    v.push(Violation {
                        at,
                        kind: ViolationKind::NotResident { tensor: t_id },
                    });
                } else {
                    host_version = Some(dev_version);
                }
            }
            EventKind::Free => {
                if !present {
                    v.push(Violation {
                        at,
                        kind: ViolationKind::NotResident { tensor: t_id },
                    });
                    continue;
                }
                // Needed later: the next materialising or reading event is a
                // swap-in, or (persistent) the tensor must survive the iteration.
                let next = evs[k + 1..]
                    .iter()
                    .find(|n| !matches!(n.kind, EventKind::Free));
                let needs_host = match next {
                    Some(n) => n.kind == EventKind::SwapIn,
                    None => persistent,
                };
                if needs_host && host_version != Some(dev_version) {
                    v.push(Violation {
                        at,
                        kind: ViolationKind::FreedWithoutHostCopy { tensor: t_id },
                    });
                }
                s.buffers.push(Buffer {
                    size_bytes,
                    alloc: if resident_from_start { None } else { alloc_at },
                    free: Some(step),
                });
                resident_from_start = false;
                present = false;
            }
        }
    }
    if present {
        s.buffers.push(Buffer {
            size_bytes,
            alloc: if resident_from_start { None } else { alloc_at },
            free: None,
        });
    }
    check_end(
        prepared,
        t_id,
        persistent,
        residency,
        present,
        dev_version,
        host_version,
        v,
    );
}

/// A kernel's access (read or in-place write) of `tensor` needs it resident
/// (`missing` otherwise) at the version graph order implies.
fn check_access(
    tensor: TensorId,
    (present, dev_version, expected): (bool, u32, u32),
    missing: ViolationKind,
    at: Option<StepRef>,
    v: &mut Vec<Violation>,
) {
    let kind = if !present {
        missing
    } else if dev_version != expected {
        ViolationKind::StaleVersion {
            tensor,
            expected,
            found: dev_version,
        }
    } else {
        return;
    };
    v.push(Violation { at, kind });
}

/// The residency at the end of the iteration must equal the start's.
#[allow(clippy::too_many_arguments)]
fn check_end(
    prepared: &PreparedGraph,
    t: TensorId,
    persistent: bool,
    residency: Residency,
    present: bool,
    dev_version: u32,
    host_version: Option<u32>,
    v: &mut Vec<Violation>,
) {
    let final_version = prepared.writers(t).len() as u32;
    let describe = |present: bool, host: Option<u32>| -> String {
        match (present, host == Some(final_version)) {
            (true, true) => "on the device and host".into(),
            (true, false) => "on the device".into(),
            (false, true) => "on the host".into(),
            (false, false) => "nowhere (its data is lost)".into(),
        }
    };
    if persistent {
        let ok = match residency {
            Residency::Device => present && dev_version == final_version,
            Residency::DeviceAndHost => {
                present && dev_version == final_version && host_version == Some(final_version)
            }
            Residency::Host => !present && host_version == Some(final_version),
        };
        if !ok {
            let expected = match residency {
                Residency::Device => "on the device",
                Residency::DeviceAndHost => "on the device and host",
                Residency::Host => "on the host",
            };
            v.push(Violation {
                at: None,
                kind: ViolationKind::EndResidency {
                    tensor: t,
                    expected: expected.into(),
                    found: describe(present, host_version),
                },
            });
        }
    } else if present {
        v.push(Violation {
            at: None,
            kind: ViolationKind::EndResidency {
                tensor: t,
                expected: "freed".into(),
                found: "still on the device".into(),
            },
        });
    }
}

/// Bounds, at every allocating step, the bytes that may be resident while it
/// runs; reports the worst step over budget per stream, and returns the largest
/// bound anywhere.
fn check_budget<P: Program>(
    program: &P,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) -> MemoryBound {
    let layout = s.layout;
    let budget_bytes = program.budget_bytes();
    let mut bound = MemoryBound::default();
    for st in Stream::ALL {
        let n = layout.len[st.index()];
        if n == 0 {
            continue;
        }
        let base = layout.offset[st.index()];
        // For each other stream `col` and step `k` on it: the first step on `st`
        // that `k` happens before. Vector clocks only grow along a stream, so
        // one merge-like sweep per stream pair replaces a binary search per buffer.
        for col in Stream::ALL.iter().map(|c| c.index()) {
            let table = &mut s.first_after[col];
            table.clear();
            if col == st.index() {
                continue;
            }
            let mut i = 0;
            for k in 0..layout.len[col] {
                while i < n && s.vc[base + i][col] < k as i32 {
                    i += 1;
                }
                table.push(i as u32);
            }
        }
        s.delta.clear();
        s.delta.resize(n + 1, 0);
        for b in &s.buffers {
            // Steps i on stream st with `step_i hb alloc` form a prefix: i <= vc[alloc][st].
            let lo = match b.alloc {
                None => 0,
                Some(a) => {
                    let ra = s.refs[a];
                    if ra.stream == st {
                        ra.index as usize
                    } else {
                        (s.vc[a][st.index()] + 1) as usize
                    }
                }
            };
            // Steps with `free hb step_i` form a suffix; find its start by binary search.
            let hi = match b.free {
                None => n,
                Some(f) => {
                    let rf = s.refs[f];
                    if rf.stream == st {
                        rf.index as usize + 1
                    } else {
                        s.first_after[rf.stream.index()][rf.index as usize] as usize
                    }
                }
            };
            if lo < hi {
                s.delta[lo] += b.size_bytes as i128;
                s.delta[hi] -= b.size_bytes as i128;
            }
        }
        let mut cur: i128 = 0;
        let mut worst: Option<(usize, u64)> = None;
        for i in 0..n {
            cur += s.delta[i];
            let allocates = matches!(
                program.instr(st, i),
                StepInstr::Compute(_) | StepInstr::Recompute { .. } | StepInstr::SwapIn(_)
            );
            if !allocates {
                continue;
            }
            let bytes = cur.clamp(0, u64::MAX as i128) as u64;
            let here = StepRef {
                stream: st,
                index: i as u32,
            };
            // The first step (compute, then h2d, then d2h) with the largest bound.
            if bound.at.is_none() || bytes > bound.peak_bytes {
                bound = MemoryBound {
                    peak_bytes: bytes,
                    at: Some(here),
                };
            }
            if cur > budget_bytes as i128 && worst.is_none_or(|(_, w)| cur as u64 > w) {
                worst = Some((i, cur as u64));
            }
        }
        if let Some((i, bytes)) = worst {
            v.push(Violation {
                at: Some(StepRef {
                    stream: st,
                    index: i as u32,
                }),
                kind: ViolationKind::OverBudget {
                    bytes,
                    budget_bytes,
                },
            });
        }
    }
    bound
}
