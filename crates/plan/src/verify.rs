//! verify(): proves a plan safe for every timing consistent with stream order and
//! waits, or lists located violations.
//!
//! The proof works on the happens-before order of steps (same-stream order plus
//! waits), computed as vector clocks over the three streams. Every storage
//! owner's events (materialise, read, in-place write, copy-out, free) must be
//! ordered with respect to each other, except that reads may overlap reads (a
//! copy-out concurrent with a kernel that reads the same tensor is fine). With
//! that, residency and versions follow one order whatever the timing, and a
//! state machine per tensor checks them. Memory is bounded per step by the bytes
//! that *may* be resident while it runs: a buffer counts unless its free is
//! ordered before the step or its allocation after it. The bound is checked at
//! every allocating step, where any timing's peak occurs.
//!
//! One walk does it all: the steps are visited in a topological order of
//! happens-before, each step's clock is computed from its predecessors', and
//! each event updates its tensor's state at once. The ordering check needs only
//! the tensor's last non-read and, per stream, its latest read since then
//! (happens-before is monotone along a stream). Violations found on a tensor
//! are keyed by (tensor, event) and sorted at the end, so the list reads tensor
//! by tensor as before. A search verifies every candidate, so this walk is hot:
//! no per-tensor event lists are built.

use crate::plan::{Plan, Residency, StepRef, Stream};
use crate::prepared::{Access, PreparedGraph};
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

/// "No step" in the per-tensor state and the buffer records.
const NONE: u32 = u32::MAX;

/// Where a per-tensor violation goes in verify's list: by tensor, then by
/// event (the event's place in the walk; 0 before the first event,
/// `u64::MAX` at the end of the iteration).
type TensorKey = (u32, u64);

/// Reusable buffers of [`verify_program`]: a search verifies many programs of
/// one graph; keeping these avoids allocating per step and per tensor.
#[derive(Debug, Clone, Default)]
pub struct VerifyScratch {
    layout: Layout,
    /// The stream and index of every step, by global id.
    refs: Vec<StepRef>,
    /// `vc[id][s]`: highest index on stream `s` that completes before step `id`
    /// starts (-1: none). Written when the walk reaches the step; entries of
    /// steps it never reaches (a deadlock) are stale and never read.
    vc: Vec<[i32; 3]>,
    /// Steps the walk reached (all of them unless the waits deadlock).
    visited: usize,
    /// Per op: how many `Compute` steps run it.
    computed: Vec<u32>,
    /// Per tensor: the initial residency the program gives.
    given: Vec<Option<Residency>>,
    /// Per tensor: where its state machine stands.
    tensors: Vec<TensorState>,
    /// Every event in walk order as (tensor, step, is a read): read back only
    /// to name the read a step races with.
    log: Vec<(u32, u32, bool)>,
    /// Violations of single steps (malformed, not recomputable), in walk order.
    step_violations: Vec<Violation>,
    /// Violations of the per-tensor checks; a stable sort by key lists them
    /// tensor by tensor, event by event.
    tensor_violations: Vec<(TensorKey, Violation)>,
    /// Device buffers with an allocation or a free inside the iteration.
    buffers: Vec<Buffer>,
    /// Bytes of buffers resident for the whole iteration.
    resident_bytes: i128,
    delta: Vec<i128>,
    /// Per stream: see `check_budget`.
    first_after: [Vec<u32>; 3],
}

/// What [`verify_program`] found besides the violations: the most bytes that
/// may be resident at any allocating step, and where (whether or not it is
/// within the budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryBound {
    pub peak_bytes: u64,
    pub at: Option<StepRef>,
}

impl Access {
    /// Reads may overlap each other; every other access is ordered with
    /// respect to every access of the tensor.
    fn is_read(self) -> bool {
        matches!(self, Access::Read(_) | Access::SwapOut)
    }
}

/// A device buffer's allocation and free steps (global ids), for the memory bound.
#[derive(Debug, Clone, Copy)]
struct Buffer {
    size_bytes: u64,
    /// `NONE`: resident from the start.
    alloc: u32,
    /// `NONE`: resident to the end.
    free: u32,
}

/// One storage owner's state during the walk: residency, versions, host copy,
/// and what its next event must be ordered after.
#[derive(Debug, Clone, Copy)]
struct TensorState {
    present: bool,
    /// Resident since the start, never freed yet.
    resident_from_start: bool,
    dev_version: u32,
    host_version: Option<u32>,
    /// The step that materialised the current device copy (`NONE`: none).
    alloc_at: u32,
    /// The last event that is not a read (`NONE`: none).
    last_nonread: u32,
    /// Per stream: the highest index of a read since `last_nonread` (-1: none).
    read_max: [i32; 3],
    /// A free without a current host copy (`NONE`: none) and its key. It is a
    /// violation if the tensor is needed later: the next event other than a
    /// free is a swap-in, or (persistent) there is none.
    pending_free: u32,
    pending_key: u64,
}

/// Where storage owner `ti` starts (and must end) the iteration.
fn start_residency(prepared: &PreparedGraph, ti: usize, given: Option<Residency>) -> Residency {
    if prepared.persistent[ti] {
        given.unwrap_or(Residency::Device)
    } else {
        Residency::Host
    }
}

impl TensorState {
    /// The state at the iteration start, with the initial residency the program gives.
    fn start(prepared: &PreparedGraph, ti: usize, given: Option<Residency>) -> TensorState {
        let persistent = prepared.persistent[ti];
        let residency = start_residency(prepared, ti, given);
        // Inputs and labels arrive on the device with the batch (and exist on the host).
        let arrives_with_batch = prepared.batch_input[ti];
        let present = match residency {
            Residency::Device | Residency::DeviceAndHost => true,
            Residency::Host => arrives_with_batch,
        };
        let host_version = match residency {
            Residency::DeviceAndHost | Residency::Host if persistent => Some(0),
            _ if arrives_with_batch => Some(0),
            _ => None,
        };
        TensorState {
            present,
            resident_from_start: present,
            dev_version: 0,
            host_version,
            alloc_at: NONE,
            last_nonread: NONE,
            read_max: [-1; 3],
            pending_free: NONE,
            pending_key: 0,
        }
    }
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
/// `verify` lists them: bad waits, a deadlock, malformed steps in walk order,
/// missing and duplicate computes, then tensor by tensor in event order, then
/// the budget per stream) and returning the memory bound. `prepared` must be
/// `PreparedGraph::new(graph)`.
pub fn verify_program<P: Program>(
    graph: &Graph,
    prepared: &PreparedGraph,
    program: &P,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) -> MemoryBound {
    let foreign_residency = start_tensors(prepared, program, s);
    walk(graph, prepared, program, s, v);
    let total = s.layout.total();
    if s.visited < total {
        v.push(Violation {
            at: None,
            kind: ViolationKind::Deadlock {
                steps: total - s.visited,
            },
        });
    }
    v.append(&mut s.step_violations);
    if s.visited < total {
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
    for ti in 0..prepared.n_tensors() {
        let st = &s.tensors[ti];
        // Most tensors are freed and owe nothing: skip them quickly.
        let quiet = !st.present
            && st.pending_free == NONE
            && !prepared.persistent[ti]
            && s.given[ti].is_none();
        if prepared.allocates[ti] && !quiet {
            finish_tensor(prepared, ti, s);
        }
    }
    // Stable: violations with one key stay in the order they were found.
    s.tensor_violations.sort_by_key(|e| e.0);
    v.extend(s.tensor_violations.drain(..).map(|e| e.1));
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

/// Resets the per-tensor states to the iteration start; returns the tensors
/// the program gives an initial residency that do not exist.
fn start_tensors<P: Program>(
    prepared: &PreparedGraph,
    program: &P,
    s: &mut VerifyScratch,
) -> Vec<TensorId> {
    let n_t = prepared.n_tensors();
    s.given.clear();
    s.given.resize(n_t, None);
    let mut foreign = Vec::new();
    for &(t, r) in program.initial_residency() {
        match s.given.get_mut(t.index()) {
            Some(slot) => *slot = Some(r),
            None => foreign.push(t),
        }
    }
    s.tensors.clear();
    s.tensors.extend(
        s.given
            .iter()
            .enumerate()
            .map(|(ti, &given)| TensorState::start(prepared, ti, given)),
    );
    s.log.clear();
    s.tensor_violations.clear();
    s.step_violations.clear();
    s.buffers.clear();
    s.resident_bytes = 0;
    foreign
}

/// Walks the steps in a topological order of happens-before, computing each
/// step's vector clock and checking its events as it is reached: the three
/// streams advance in turn, each as far as its next step's waits are done (a
/// step's predecessors are the previous step of its stream and its waits). A
/// pass in which no stream advances leaves the remaining steps in a cycle of
/// waits: a deadlock.
fn walk<P: Program>(
    graph: &Graph,
    prepared: &PreparedGraph,
    program: &P,
    s: &mut VerifyScratch,
    v: &mut Vec<Violation>,
) {
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
    s.computed.clear();
    s.computed.resize(graph.ops.len(), 0);
    // Every entry is written before it is read (see the field docs).
    s.vc.resize(total, [-1i32; 3]);
    let VerifyScratch {
        refs,
        vc,
        visited,
        computed,
        tensors,
        log,
        step_violations,
        tensor_violations,
        buffers,
        resident_bytes,
        ..
    } = s;
    let mut checker = Checker {
        prepared,
        refs,
        computed,
        tensors,
        log,
        step_violations,
        found: tensor_violations,
        buffers,
        resident_bytes,
    };
    *visited = 0;
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
                    let mut c = vc[id - 1];
                    c[k] = c[k].max(i as i32 - 1);
                    c
                } else {
                    [-1i32; 3]
                };
                for w in waits.iter().filter(|w| layout.valid(**w)) {
                    for (c, wc) in clock.iter_mut().zip(vc[layout.id(*w)]) {
                        *c = (*c).max(wc);
                    }
                    let wk = w.stream.index();
                    clock[wk] = clock[wk].max(w.index as i32);
                }
                vc[id] = clock;
                let here = Here {
                    id: id as u32,
                    at: StepRef {
                        stream: st,
                        index: i as u32,
                    },
                    clock,
                    vc,
                    recompute: false,
                };
                checker.visit_step(program.instr(st, i), &here);
                *visited += 1;
                next[k] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
}

/// The step the walk is at.
struct Here<'v> {
    id: u32,
    at: StepRef,
    /// `vc[id]`.
    clock: [i32; 3],
    /// The clocks of every step visited so far.
    vc: &'v [[i32; 3]],
    /// A recomputation: its reads of missing inputs are reported as such.
    recompute: bool,
}

/// The checks of the walk, over the parts of the scratch they update.
struct Checker<'s> {
    prepared: &'s PreparedGraph,
    refs: &'s [StepRef],
    computed: &'s mut [u32],
    tensors: &'s mut [TensorState],
    log: &'s mut Vec<(u32, u32, bool)>,
    step_violations: &'s mut Vec<Violation>,
    found: &'s mut Vec<(TensorKey, Violation)>,
    buffers: &'s mut Vec<Buffer>,
    resident_bytes: &'s mut i128,
}

/// What went wrong in one event, before it is described as a violation.
#[derive(Debug, Clone, Copy)]
enum Problem {
    AlreadyResident,
    SwapInWithoutHostCopy,
    /// Read or written while not resident.
    Missing,
    Stale {
        expected: u32,
        found: u32,
    },
    NotResident,
}

impl Checker<'_> {
    /// The per-step checks (stream, existence, recomputability), then the
    /// step's events on each tensor.
    fn visit_step(&mut self, instr: StepInstr<'_>, h: &Here<'_>) {
        let prepared = self.prepared;
        if let Some(required) = instr.required_stream()
            && required != h.at.stream
        {
            self.malformed(h.at, format!("`{instr}` must be on the {required} stream"));
            return;
        }
        let one: [(TensorId, Access); 1];
        let (accesses, workspace_bytes) = match instr {
            StepInstr::Compute(op) => {
                if op.index() >= prepared.n_ops() {
                    self.malformed(h.at, format!("op {op} does not exist"));
                    return;
                }
                self.computed[op.index()] += 1;
                let workspace_bytes = prepared.workspace_bytes[op.index()];
                (prepared.op_accesses(op), workspace_bytes)
            }
            StepInstr::Recompute { op, outputs } => {
                if op.index() >= prepared.n_ops() {
                    self.malformed(h.at, format!("op {op} does not exist"));
                } else {
                    self.recompute(op, outputs, h);
                }
                return;
            }
            StepInstr::SwapIn(t) | StepInstr::SwapOut(t) | StepInstr::Free(t) => {
                if t.index() >= prepared.n_tensors() {
                    self.malformed(h.at, format!("tensor {t} does not exist"));
                    return;
                }
                if !prepared.allocates[t.index()] {
                    self.malformed(
                        h.at,
                        format!(
                            "{t} owns no storage (a view or in-place update); move its owner instead"
                        ),
                    );
                    return;
                }
                let access = match instr {
                    StepInstr::SwapIn(_) => Access::SwapIn,
                    StepInstr::SwapOut(_) => Access::SwapOut,
                    _ => Access::Free,
                };
                one = [(t, access)];
                (&one[..], 0)
            }
        };
        for &(t, access) in accesses {
            self.event(t, access, h);
        }
        self.push_buffer(workspace_bytes, h.id, h.id);
    }

    #[cold]
    fn malformed(&mut self, at: StepRef, reason: String) {
        self.step_violations.push(Violation {
            at: Some(at),
            kind: ViolationKind::Malformed { reason },
        });
    }

    /// The checks and events of a recomputation of `op` (which exists).
    #[inline(never)]
    fn recompute(&mut self, op: OpId, outputs: &[TensorId], h: &Here<'_>) {
        let prepared = self.prepared;
        let h = &Here {
            recompute: true,
            ..*h
        };
        if !prepared.recomputable[op.index()] {
            self.step_violations.push(Violation {
                at: Some(h.at),
                kind: ViolationKind::NotRecomputable { op },
            });
        }
        for &(owner, expected) in prepared.op_reads(op) {
            self.event(owner, Access::Read(expected), h);
        }
        // Outputs not asked for are rematerialised into scratch for the step only.
        let allocated = prepared.op_allocated(op);
        let mut scratch_bytes = prepared.workspace_bytes[op.index()];
        for &o in allocated {
            if outputs.contains(&o) {
                self.event(o, Access::Produce, h);
            } else {
                scratch_bytes += prepared.size_bytes[o.index()];
            }
        }
        for &o in outputs {
            if !allocated.contains(&o) {
                self.malformed(h.at, format!("{o} is not a storage-owning output of {op}"));
            }
        }
        self.push_buffer(scratch_bytes, h.id, h.id);
    }

    /// Records a device buffer for the memory bound (empty ones add nothing).
    #[inline]
    fn push_buffer(&mut self, size_bytes: u64, alloc: u32, free: u32) {
        push_buffer(self.buffers, self.resident_bytes, size_bytes, alloc, free);
    }

    /// One event on storage owner `t` at step `h`: its ordering against the
    /// tensor's earlier events, then the state machine (residency, versions,
    /// host copies).
    ///
    /// Ordering: every event other than a read must follow every earlier event
    /// on the tensor; a read must follow the last non-read. Only the last
    /// non-read and, per stream, the latest read since it are kept: along one
    /// stream happens-before is monotone, so a step after a stream's latest
    /// read is after every earlier one.
    #[inline]
    fn event(&mut self, t: TensorId, access: Access, h: &Here<'_>) {
        let ti = t.index();
        let pos = self.log.len();
        let is_read = access.is_read();
        self.log.push((t.0, h.id, is_read));
        let st = &mut self.tensors[ti];
        let prev = st.last_nonread;
        if prev != NONE && prev != h.id {
            let other = self.refs[prev as usize];
            if h.clock[other.stream.index()] < other.index as i32 {
                let kind = ViolationKind::Unordered { tensor: t, other };
                report(self.found, (t.0, pos as u64 + 1), h.at, kind);
            }
        }
        let k = h.at.stream.index();
        if is_read {
            // Steps are visited in stream order: this is the stream's latest read.
            st.read_max[k] = h.at.index as i32;
        } else {
            // Reads on this step's own stream precede it (or are this step).
            let races = (0..3).any(|j| j != k && st.read_max[j] > h.clock[j]);
            st.read_max = [-1; 3];
            st.last_nonread = h.id;
            if races {
                report_race(self.found, self.log, self.refs, h);
            }
        }
        if st.pending_free != NONE && access != Access::Free {
            if access == Access::SwapIn {
                report_pending_free(self.found, self.refs, t, st);
            }
            st.pending_free = NONE;
        }
        let problem = match access {
            Access::Produce | Access::SwapIn => materialise(st, access, h.id),
            Access::Read(expected) => check_access(st, expected),
            Access::Write(expected) => {
                let problem = check_access(st, expected);
                st.dev_version = expected + 1;
                problem
            }
            Access::SwapOut => {
                if st.present {
                    st.host_version = Some(st.dev_version);
                    None
                } else {
                    Some(Problem::NotResident)
                }
            }
            Access::Free => {
                if st.present {
                    if st.host_version != Some(st.dev_version) {
                        // A violation only if the tensor is needed later: decided
                        // by its next event other than a free (see `TensorState`).
                        st.pending_free = h.id;
                        st.pending_key = pos as u64 + 1;
                    }
                    let alloc = if st.resident_from_start {
                        NONE
                    } else {
                        st.alloc_at
                    };
                    st.resident_from_start = false;
                    st.present = false;
                    let size_bytes = self.prepared.size_bytes[ti];
                    push_buffer(self.buffers, self.resident_bytes, size_bytes, alloc, h.id);
                    None
                } else {
                    Some(Problem::NotResident)
                }
            }
        };
        if let Some(problem) = problem {
            report_problem(self.found, (t.0, pos as u64 + 1), t, problem, h);
        }
    }
}

/// Records a tensor's violation.
#[cold]
fn report(
    found: &mut Vec<(TensorKey, Violation)>,
    key: TensorKey,
    at: StepRef,
    kind: ViolationKind,
) {
    found.push((key, Violation { at: Some(at), kind }));
}

/// Records an event's problem as a violation.
#[cold]
#[inline(never)]
fn report_problem(
    found: &mut Vec<(TensorKey, Violation)>,
    key: TensorKey,
    tensor: TensorId,
    problem: Problem,
    h: &Here<'_>,
) {
    let kind = match problem {
        Problem::AlreadyResident => ViolationKind::AlreadyResident { tensor },
        Problem::SwapInWithoutHostCopy => ViolationKind::SwapInWithoutHostCopy { tensor },
        Problem::Missing if h.recompute => ViolationKind::RecomputeInputMissing { tensor },
        Problem::Missing => ViolationKind::ReadNotResident { tensor },
        Problem::Stale { expected, found } => ViolationKind::StaleVersion {
            tensor,
            expected,
            found,
        },
        Problem::NotResident => ViolationKind::NotResident { tensor },
    };
    report(found, key, h.at, kind);
}

/// Records a race of the current non-read (the last event logged) with a read.
#[cold]
#[inline(never)]
fn report_race(
    found: &mut Vec<(TensorKey, Violation)>,
    log: &[(u32, u32, bool)],
    refs: &[StepRef],
    h: &Here<'_>,
) {
    let pos = log.len() - 1;
    let tensor = TensorId(log[pos].0);
    let other = first_unordered_read(log, refs, h);
    let kind = ViolationKind::Unordered { tensor, other };
    report(found, (tensor.0, pos as u64 + 1), h.at, kind);
}

/// Records the pending free of `t` as a free while needed later.
#[cold]
#[inline(never)]
fn report_pending_free(
    found: &mut Vec<(TensorKey, Violation)>,
    refs: &[StepRef],
    t: TensorId,
    st: &TensorState,
) {
    let at = refs[st.pending_free as usize];
    let kind = ViolationKind::FreedWithoutHostCopy { tensor: t };
    report(found, (t.0, st.pending_key), at, kind);
}

/// Records a device buffer for the memory bound (empty ones add nothing).
#[inline]
fn push_buffer(
    buffers: &mut Vec<Buffer>,
    resident_bytes: &mut i128,
    size_bytes: u64,
    alloc: u32,
    free: u32,
) {
    if size_bytes == 0 {
        return;
    }
    if alloc == NONE && free == NONE {
        *resident_bytes += size_bytes as i128;
    } else {
        buffers.push(Buffer {
            size_bytes,
            alloc,
            free,
        });
    }
}

/// A produce, rematerialisation or swap-in at step `id`.
#[inline]
fn materialise(st: &mut TensorState, access: Access, id: u32) -> Option<Problem> {
    if st.present {
        return Some(Problem::AlreadyResident);
    }
    let mut problem = None;
    if access == Access::SwapIn {
        match st.host_version {
            Some(h) => st.dev_version = h,
            None => problem = Some(Problem::SwapInWithoutHostCopy),
        }
    } else {
        st.dev_version = 0;
    }
    st.present = true;
    st.alloc_at = id;
    problem
}

/// A kernel's access (read or in-place write) needs the tensor resident at
/// the version graph order implies.
#[inline]
fn check_access(st: &TensorState, expected: u32) -> Option<Problem> {
    if !st.present {
        Some(Problem::Missing)
    } else if st.dev_version != expected {
        Some(Problem::Stale {
            expected,
            found: st.dev_version,
        })
    } else {
        None
    }
}

/// The first read of the current event's tensor since its last non-read, in
/// walk order, that is not ordered before step `h` (whose event is the last
/// one logged).
#[cold]
fn first_unordered_read(log: &[(u32, u32, bool)], refs: &[StepRef], h: &Here<'_>) -> StepRef {
    let (t, _, _) = log[log.len() - 1];
    let mut first = None;
    for &(tensor, step, is_read) in log[..log.len() - 1].iter().rev() {
        if tensor != t {
            continue;
        }
        if !is_read {
            break;
        }
        let r = refs[step as usize];
        if step != h.id && h.vc[h.id as usize][r.stream.index()] < r.index as i32 {
            first = Some(r);
        }
    }
    // The caller saw a read on another stream after this step's clock.
    first.unwrap_or(h.at)
}

/// The end of the iteration for storage owner `ti`: a pending free, the buffer
/// still resident, and the residency the next iteration starts from.
fn finish_tensor(prepared: &PreparedGraph, ti: usize, s: &mut VerifyScratch) {
    let st = s.tensors[ti];
    let t = TensorId(ti as u32);
    let persistent = prepared.persistent[ti];
    let given = s.given[ti];
    if !persistent && given.is_some() {
        s.tensor_violations.push((
            (t.0, 0),
            Violation {
                at: None,
                kind: ViolationKind::Malformed {
                    reason: format!("initial residency given for {t}, which is not persistent"),
                },
            },
        ));
    }
    if st.pending_free != NONE && persistent {
        let at = s.refs[st.pending_free as usize];
        let kind = ViolationKind::FreedWithoutHostCopy { tensor: t };
        report(&mut s.tensor_violations, (t.0, st.pending_key), at, kind);
    }
    if st.present {
        let alloc = if st.resident_from_start {
            NONE
        } else {
            st.alloc_at
        };
        let size_bytes = prepared.size_bytes[ti];
        push_buffer(
            &mut s.buffers,
            &mut s.resident_bytes,
            size_bytes,
            alloc,
            NONE,
        );
    }
    let residency = start_residency(prepared, ti, given);
    if let Some(kind) = check_end(prepared, t, persistent, residency, &st) {
        s.tensor_violations
            .push(((t.0, u64::MAX), Violation { at: None, kind }));
    }
}

/// The residency at the end of the iteration must equal the start's.
fn check_end(
    prepared: &PreparedGraph,
    t: TensorId,
    persistent: bool,
    residency: Residency,
    st: &TensorState,
) -> Option<ViolationKind> {
    let (present, host_version) = (st.present, st.host_version);
    if !persistent {
        return present.then(|| ViolationKind::EndResidency {
            tensor: t,
            expected: "freed".into(),
            found: "still on the device".into(),
        });
    }
    let final_version = prepared.writers(t).len() as u32;
    let ok = match residency {
        Residency::Device => present && st.dev_version == final_version,
        Residency::DeviceAndHost => {
            present && st.dev_version == final_version && host_version == Some(final_version)
        }
        Residency::Host => !present && host_version == Some(final_version),
    };
    if ok {
        return None;
    }
    let expected = match residency {
        Residency::Device => "on the device",
        Residency::DeviceAndHost => "on the device and host",
        Residency::Host => "on the host",
    };
    let found = match (present, host_version == Some(final_version)) {
        (true, true) => "on the device and host",
        (true, false) => "on the device",
        (false, true) => "on the host",
        (false, false) => "nowhere (its data is lost)",
    };
    Some(ViolationKind::EndResidency {
        tensor: t,
        expected: expected.into(),
        found: found.into(),
    })
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
        let k = st.index();
        let n = layout.len[k];
        let allocates = |i: usize| {
            matches!(
                program.instr(st, i),
                StepInstr::Compute(_) | StepInstr::Recompute { .. } | StepInstr::SwapIn(_)
            )
        };
        // The bound is checked at allocating steps only (a well-formed d2h
        // stream has none).
        if !(0..n).any(allocates) {
            continue;
        }
        let base = layout.offset[k];
        // For each other stream `col` and step `j` on it: the first step on `st`
        // that `j` happens before. Vector clocks only grow along a stream, so
        // one merge-like sweep per stream pair replaces a binary search per buffer.
        for col in 0..3 {
            let table = &mut s.first_after[col];
            table.clear();
            if col == k {
                continue;
            }
            let mut i = 0;
            for j in 0..layout.len[col] {
                while i < n && s.vc[base + i][col] < j as i32 {
                    i += 1;
                }
                table.push(i as u32);
            }
        }
        s.delta.clear();
        s.delta.resize(n + 1, 0);
        for b in &s.buffers {
            // Steps i on stream st with `step_i hb alloc` form a prefix: i <= vc[alloc][st]
            // (on the allocation's own stream, vc[alloc][st] + 1 is its index).
            let lo = if b.alloc == NONE {
                0
            } else {
                (s.vc[b.alloc as usize][k] + 1) as usize
            };
            // Steps with `free hb step_i` form a suffix.
            let hi = if b.free == NONE {
                n
            } else {
                let rf = s.refs[b.free as usize];
                if rf.stream == st {
                    rf.index as usize + 1
                } else {
                    s.first_after[rf.stream.index()][rf.index as usize] as usize
                }
            };
            if lo < hi {
                s.delta[lo] += b.size_bytes as i128;
                s.delta[hi] -= b.size_bytes as i128;
            }
        }
        let mut cur: i128 = s.resident_bytes;
        let mut worst: Option<(usize, u64)> = None;
        for i in 0..n {
            cur += s.delta[i];
            if !allocates(i) {
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
