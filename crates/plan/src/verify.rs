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
//! that *may* be resident while it runs: on the compute stream a buffer counts
//! unless its free is ordered before the step or its allocation after it; at a
//! swap-in, whose window may span many compute steps, the bound is the maximum
//! over the compute positions of that window of the bytes that may be resident
//! at both (see `Bounds::h2d_bounds`), not the sum over the window. The bound
//! is checked at every allocating step, where any timing's peak occurs;
//! [`crate::peak_over_all_timings`] enumerates every timing instead and is
//! the reference the bound is tested against.
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
    /// The plan's `offsets` layout does not hold: an allocation it does not
    /// place as the plan makes it, or two buffers that may be resident
    /// together at overlapping addresses.
    Layout { reason: String },
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
            Layout { reason } => write!(f, "the memory layout does not hold: {reason}"),
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

    fn valid(&self, r: StepRef) -> bool {
        (r.index as usize) < self.len[r.stream.index()]
    }

    /// The step with global id `id`.
    fn step_ref(&self, id: usize) -> StepRef {
        let k = if id < self.offset[1] {
            0
        } else if id < self.offset[2] {
            1
        } else {
            2
        };
        StepRef {
            stream: Stream::ALL[k],
            index: (id - self.offset[k]) as u32,
        }
    }
}

/// "No step", "no read" in the per-tensor state and the buffer records.
pub(crate) const NONE: u32 = u32::MAX;

/// Where a per-tensor violation goes in verify's list: by tensor (high 32
/// bits), then by event (events are numbered from 1 in walk order, saturating;
/// 0 is before the first, `u32::MAX` the end of the iteration). Violations
/// are found in walk order, so a stable sort by this key lists them tensor by
/// tensor, event by event.
type TensorKey = u64;

fn tensor_key(t: TensorId, event: u32) -> TensorKey {
    ((t.0 as u64) << 32) | event as u64
}

/// Reusable buffers of [`verify_program`]: a search verifies many programs of
/// one graph; keeping these avoids allocating per step and per tensor.
#[derive(Debug, Clone, Default)]
pub struct VerifyScratch {
    layout: Layout,
    /// `vc[id][s]`: highest index on stream `s` that completes before step `id`
    /// starts (-1: none). Written when the walk reaches the step; entries of
    /// steps it never reaches (a deadlock) are stale and never read.
    vc: Vec<[i32; 3]>,
    /// Steps the walk reached (all of them unless the waits deadlock).
    visited: usize,
    /// Per step: it allocates (compute, recompute, swap-in), so the memory
    /// bound is checked there; per stream, how many do.
    allocating: Vec<bool>,
    allocating_steps: [usize; 3],
    /// Per op: how many `Compute` steps run it.
    computed: Vec<u32>,
    /// Per tensor: where its state machine stands.
    tensors: Vec<TensorState>,
    /// Every read as (step, the previous read of its tensor since that
    /// tensor's last non-read, or `NONE`): read back only to name the read a
    /// step races with.
    reads: Vec<(u32, u32)>,
    /// Violations of single steps (malformed, not recomputable), in walk order.
    step_violations: Vec<Violation>,
    /// Violations of the per-tensor checks; a stable sort by key lists them
    /// tensor by tensor, event by event.
    tensor_violations: Vec<(TensorKey, Violation)>,
    /// Device buffers with an allocation or a free inside the iteration, and
    /// (with `record_resident`) those resident for all of it.
    buffers: Vec<Buffer>,
    /// List the buffers resident for the whole iteration in `buffers` too
    /// (a layout needs them; the bound only needs `resident_bytes`).
    pub(crate) record_resident: bool,
    /// Bytes of buffers resident for the whole iteration.
    resident_bytes: i128,
    /// Per stream: see `check_budget` (`delta_wide` only when the bytes of
    /// every buffer summed do not fit an `i64`).
    delta: [Vec<i64>; 3],
    delta_wide: [Vec<i128>; 3],
    /// The bound at swap-ins (see `Bounds::h2d_bounds`), in `i64` or `i128`
    /// like `delta`.
    h2d: H2dSweep<i64>,
    h2d_wide: H2dSweep<i128>,
    /// Per stream `k`, per other stream: see `first_after`.
    first_after: [[Vec<u32>; 3]; 3],
}

impl VerifyScratch {
    /// Scratch that also lists the buffers resident for a whole iteration
    /// (for a layout).
    pub(crate) fn recording_resident() -> Self {
        VerifyScratch {
            record_resident: true,
            ..VerifyScratch::default()
        }
    }

    /// The device buffers of the program last verified with this scratch, in
    /// walk order (for one owner, in allocation order).
    pub(crate) fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Where buffer `b` starts and ends in compute-stream positions (compute
    /// steps that complete before its allocation / free starts; -1 from the
    /// start, `i64::MAX` to the end): a time proxy to order a layout by.
    pub(crate) fn compute_span(&self, b: &Buffer) -> (i64, i64) {
        let start = if b.alloc == NONE {
            -1
        } else {
            self.vc[b.alloc as usize][0] as i64 + 1
        };
        let end = self
            .free_id(b)
            .map_or(i64::MAX, |id| self.vc[id][0] as i64 + 1);
        (start, end)
    }

    /// Steps of stream `s` in the program last verified.
    pub(crate) fn stream_len(&self, s: Stream) -> usize {
        self.layout.len[s.index()]
    }

    /// The stream and index of global step `id` in the program last verified.
    pub(crate) fn step_ref(&self, id: usize) -> StepRef {
        self.layout.step_ref(id)
    }

    /// Steps in the program last verified.
    pub(crate) fn n_steps(&self) -> usize {
        self.layout.total()
    }

    /// The global id of step `at` in the program last verified (its
    /// compute, then h2d, then d2h steps, as `Buffer::alloc` numbers them);
    /// `None` past the end of its stream.
    pub(crate) fn step_id(&self, at: StepRef) -> Option<usize> {
        let k = at.stream.index();
        let i = at.index as usize;
        (i < self.layout.len[k]).then(|| self.layout.offset[k] + i)
    }

    /// The global id of the step that frees `b` (`None`: resident to the end).
    pub(crate) fn free_id(&self, b: &Buffer) -> Option<usize> {
        (b.free_index != NONE)
            .then(|| self.layout.offset[b.free_stream as usize] + b.free_index as usize)
    }

    /// The vector clock of global step `id` in the program last verified:
    /// per stream, the highest index that completes before it starts (-1:
    /// none).
    pub(crate) fn clock(&self, id: usize) -> [i32; 3] {
        self.vc[id]
    }

    /// Whether `a`'s free completes before `b`'s allocation starts in every
    /// timing of the program last verified (then the two may share bytes).
    pub(crate) fn freed_before(&self, a: &Buffer, b: &Buffer) -> bool {
        a.free_index != NONE
            && b.alloc != NONE
            && self.vc[b.alloc as usize][a.free_stream as usize] >= a.free_index as i32
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

impl Access {
    /// Reads may overlap each other; every other access is ordered with
    /// respect to every access of the tensor.
    fn is_read(self) -> bool {
        matches!(self, Access::Read(_) | Access::SwapOut)
    }
}

/// A device buffer's allocation and free, for the memory bound and the
/// layout ([`crate::layout`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buffer {
    /// The tensor id, or (`scratch`) the global id of the step whose scratch
    /// it is; see [`Buffer::owner`]. Two `u32`s keep the record at 24 bytes,
    /// as before it had an owner (the bound's loop reads every buffer).
    owner_id: u32,
    scratch: bool,
    pub(crate) size_bytes: u64,
    /// Global id of the allocating step (`NONE`: resident from the start).
    pub(crate) alloc: u32,
    /// Stream and index of the freeing step (index `NONE`: resident to the end).
    pub(crate) free_stream: u8,
    pub(crate) free_index: u32,
}

impl Buffer {
    /// The allocation id the simulator gives it: the tensor id, or the number
    /// of tensors plus the global id of the step whose scratch it is.
    pub(crate) fn owner(&self, n_tensors: usize) -> u64 {
        if self.scratch {
            n_tensors as u64 + self.owner_id as u64
        } else {
            self.owner_id as u64
        }
    }
}

/// One storage owner's state during the walk: residency, versions, host copy,
/// and what its next event must be ordered after. [`initial_states`] computes
/// every tensor's start once per graph (kept small: it is copied per program).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorState {
    /// The program gave it an initial residency.
    given: bool,
    /// Where it starts (and must end) the iteration.
    residency: Residency,
    present: bool,
    /// Resident since the start, never freed yet.
    resident_from_start: bool,
    dev_version: u32,
    host_version: Option<u32>,
    /// The step that materialised the current device copy (`NONE`: none).
    alloc_at: u32,
    /// The last event that is not a read: stream and index (-1: none).
    nonread_stream: u8,
    nonread_index: i32,
    /// Per stream: the highest index of a read since the last non-read (-1: none).
    read_max: [i32; 3],
    /// The latest read since the last non-read, in `VerifyScratch::reads`.
    last_read: u32,
    /// A free without a current host copy (`NONE`: none) and its key. It is a
    /// violation if the tensor is needed later: the next event other than a
    /// free is a swap-in, or (persistent) there is none.
    pending_free: u32,
    pending_event: u32,
}

impl TensorState {
    /// The state at the iteration start, with the initial residency the program gives.
    fn start(prepared: &PreparedGraph, ti: usize, given: Option<Residency>) -> TensorState {
        let persistent = prepared.persistent[ti];
        let residency = if persistent {
            given.unwrap_or(Residency::Device)
        } else {
            Residency::Host
        };
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
            given: given.is_some(),
            residency,
            present,
            resident_from_start: present,
            dev_version: 0,
            host_version,
            alloc_at: NONE,
            nonread_stream: 0,
            nonread_index: -1,
            read_max: [-1; 3],
            last_read: NONE,
            pending_free: NONE,
            pending_event: 0,
        }
    }
}

/// Every tensor's state at the iteration start when the program gives no
/// initial residency: computed once per graph (see [`PreparedGraph`]).
pub(crate) fn initial_states(prepared: &PreparedGraph) -> Vec<TensorState> {
    (0..prepared.n_tensors())
        .map(|ti| TensorState::start(prepared, ti, None))
        .collect()
}

/// Verifies `plan` against `graph`; an empty list means the plan is safe.
/// A plan with an `offsets` layout is also checked against its layout
/// ([`crate::layout`]), once the rest holds.
pub fn verify(plan: &Plan, graph: &Graph) -> Vec<Violation> {
    let prepared = PreparedGraph::new(graph);
    let mut violations = Vec::new();
    let mut scratch = if matches!(plan.allocator, crate::AllocatorSpec::Offsets(_)) {
        VerifyScratch::recording_resident()
    } else {
        VerifyScratch::default()
    };
    verify_program(graph, &prepared, plan, &mut scratch, &mut violations);
    if violations.is_empty() {
        violations = crate::layout::layout_violations(plan, &prepared, &scratch);
    }
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
    let bad_waits = walk(graph, prepared, program, s);
    let total = s.layout.total();
    if bad_waits || s.visited < total {
        report_bad_waits(program, &s.layout, v);
    }
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
        if count != 1 {
            let op = OpId(i as u32);
            let kind = if count == 0 {
                ViolationKind::MissingCompute { op }
            } else {
                ViolationKind::DuplicateCompute { op }
            };
            v.push(Violation { at: None, kind });
        }
    }
    finish_tensors(prepared, s);
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
    s.tensors.clear();
    s.tensors.extend_from_slice(&prepared.verify_start);
    let mut foreign = Vec::new();
    for &(t, r) in program.initial_residency() {
        let Some(st) = s.tensors.get_mut(t.index()) else {
            foreign.push(t);
            continue;
        };
        let persistent = prepared.persistent[t.index()];
        if !persistent || (r == Residency::Device && st.residency == Residency::Device) {
            // The start state is the default one (a later entry overrides an
            // earlier one, so compare with where it stands now).
            st.given = true;
        } else {
            *st = TensorState::start(prepared, t.index(), Some(r));
        }
    }
    s.reads.clear();
    s.tensor_violations.clear();
    s.step_violations.clear();
    s.buffers.clear();
    s.resident_bytes = 0;
    foreign
}

/// Reports the waits on steps that do not exist, in stream order.
fn report_bad_waits<P: Program>(program: &P, layout: &Layout, v: &mut Vec<Violation>) {
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
}

/// Walks the steps in a topological order of happens-before, computing each
/// step's vector clock and checking its events as it is reached: the three
/// streams advance in turn, each as far as its next step's waits are done (a
/// step's predecessors are the previous step of its stream and its waits). A
/// pass in which no stream advances leaves the remaining steps in a cycle of
/// waits: a deadlock. Waits on steps that do not exist are ignored; returns
/// whether a visited step had one.
fn walk<P: Program>(
    graph: &Graph,
    prepared: &PreparedGraph,
    program: &P,
    s: &mut VerifyScratch,
) -> bool {
    let layout = Layout::of(program);
    s.layout = layout;
    s.computed.clear();
    s.computed.resize(graph.ops.len(), 0);
    // Every entry is written before it is read (see the field docs).
    s.vc.resize(layout.total(), [-1i32; 3]);
    s.allocating.resize(layout.total(), false);
    let mut allocating_steps = [0usize; 3];
    let VerifyScratch {
        vc,
        allocating,
        computed,
        tensors,
        reads,
        step_violations,
        tensor_violations,
        buffers,
        resident_bytes,
        ..
    } = s;
    let mut checker = Checker {
        prepared,
        layout,
        computed,
        tensors,
        reads,
        step_violations,
        found: tensor_violations,
        buffers,
        resident_bytes,
        events: 0,
    };
    let mut visited = 0;
    let mut bad_waits = false;
    let mut next = [0usize; 3];
    loop {
        let mut progressed = false;
        for (k, st) in Stream::ALL.into_iter().enumerate() {
            if next[k] >= layout.len[k] {
                continue;
            }
            // The clock of the stream's previous step, carried in registers
            // along the stream (see `Clock`).
            let mut prev = match next[k] {
                0 => Clock::NONE,
                i => Clock::of(vc[layout.offset[k] + i - 1]),
            };
            while next[k] < layout.len[k] {
                let i = next[k];
                let id = layout.offset[k] + i;
                let mut clock = prev.raise(k, i as i32 - 1);
                let mut blocked = false;
                for w in program.waits(st, i) {
                    let wk = w.stream.index();
                    let wi = w.index as usize;
                    if wi >= layout.len[wk] {
                        bad_waits = true;
                    } else if wi >= next[wk] {
                        blocked = true;
                        break;
                    } else {
                        clock = clock
                            .join(Clock::of(vc[layout.offset[wk] + wi]))
                            .raise(wk, wi as i32);
                    }
                }
                if blocked {
                    break;
                }
                vc[id] = clock.array();
                prev = clock;
                let here = Here {
                    id: id as u32,
                    at: StepRef {
                        stream: st,
                        index: i as u32,
                    },
                    cover: clock.set(k, i as i32).cover(),
                    recompute: false,
                };
                let instr = program.instr(st, i);
                let allocates = matches!(
                    instr,
                    StepInstr::Compute(_) | StepInstr::Recompute { .. } | StepInstr::SwapIn(_)
                );
                allocating[id] = allocates;
                allocating_steps[k] += allocates as usize;
                checker.visit_step(instr, &here);
                visited += 1;
                next[k] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    s.visited = visited;
    s.allocating_steps = allocating_steps;
    bad_waits
}

/// A vector clock held as three scalars, so that the walk keeps it in
/// registers. Updating one lane of an `[i32; 3]` in memory with a 32-bit
/// store and then copying the array with a 64-bit load defeats the CPU's
/// store-to-load forwarding; on ResNet-50 those stalls were about 8% of an
/// evaluation (perf, 2026-11-23). Lanes are chosen with selects, never by
/// indexing memory.
#[derive(Debug, Clone, Copy)]
struct Clock {
    c0: i32,
    c1: i32,
    c2: i32,
}

impl Clock {
    const NONE: Clock = Clock {
        c0: -1,
        c1: -1,
        c2: -1,
    };

    #[inline(always)]
    fn of(a: [i32; 3]) -> Clock {
        Clock {
            c0: a[0],
            c1: a[1],
            c2: a[2],
        }
    }

    #[inline(always)]
    fn array(self) -> [i32; 3] {
        [self.c0, self.c1, self.c2]
    }

    #[inline(always)]
    fn cover(self) -> Cover {
        Cover {
            lo: self.c0 as u32 as u64 | (self.c1 as u32 as u64) << 32,
            hi: self.c2 as u32 as u64,
        }
    }

    /// Lane-wise maximum.
    #[inline(always)]
    fn join(self, o: Clock) -> Clock {
        Clock {
            c0: self.c0.max(o.c0),
            c1: self.c1.max(o.c1),
            c2: self.c2.max(o.c2),
        }
    }

    /// Lane `k` raised to at least `v`.
    #[inline(always)]
    fn raise(self, k: usize, v: i32) -> Clock {
        Clock {
            c0: if k == 0 { self.c0.max(v) } else { self.c0 },
            c1: if k == 1 { self.c1.max(v) } else { self.c1 },
            c2: if k == 2 { self.c2.max(v) } else { self.c2 },
        }
    }

    /// Lane `k` set to `v`.
    #[inline(always)]
    fn set(self, k: usize, v: i32) -> Clock {
        Clock {
            c0: if k == 0 { v } else { self.c0 },
            c1: if k == 1 { v } else { self.c1 },
            c2: if k == 2 { v } else { self.c2 },
        }
    }
}

/// A step's cover (see [`Here::cover`]), its three lanes packed in two
/// 64-bit words. The walk builds it in registers and stores whole words, and
/// `Checker::event` reads it back in words or lanes within them: an array of
/// three `i32`s stored lane by lane and read back eight bytes at a time
/// stalled store-to-load forwarding (see [`Clock`]).
#[derive(Debug, Clone, Copy)]
struct Cover {
    lo: u64,
    hi: u64,
}

impl Cover {
    /// Lane `k`, a stream index (0 to 2).
    #[inline(always)]
    fn lane(self, k: usize) -> i32 {
        let word = if k < 2 { self.lo } else { self.hi };
        (word >> (32 * (k & 1))) as u32 as i32
    }
}

/// The step the walk is at.
struct Here {
    id: u32,
    at: StepRef,
    /// Per stream, the highest index that is this step or completes before it
    /// starts: its vector clock with its own index on its own stream. An event
    /// at step `e` is ordered before this one iff `cover.lane(e.stream) >= e.index`.
    cover: Cover,
    /// A recomputation: its reads of missing inputs are reported as such.
    recompute: bool,
}

/// The checks of the walk, over the parts of the scratch they update.
struct Checker<'s> {
    prepared: &'s PreparedGraph,
    layout: Layout,
    computed: &'s mut [u32],
    tensors: &'s mut [TensorState],
    reads: &'s mut Vec<(u32, u32)>,
    step_violations: &'s mut Vec<Violation>,
    found: &'s mut Vec<(TensorKey, Violation)>,
    buffers: &'s mut Vec<Buffer>,
    resident_bytes: &'s mut i128,
    /// Events seen so far (saturating).
    events: u32,
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
    /// step's events on each tensor. Inlined into the walk, its one caller:
    /// a call per step cost about 3% of an evaluation's instructions (saved
    /// registers, the step passed by reference).
    #[inline(always)]
    fn visit_step(&mut self, instr: StepInstr<'_>, h: &Here) {
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
        if workspace_bytes > 0 {
            self.push_buffer(Owner::Scratch(h.id), workspace_bytes, h.id, h.at);
        }
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
    fn recompute(&mut self, op: OpId, outputs: &[TensorId], h: &Here) {
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
            self.event_outlined(owner, Access::Read(expected), h);
        }
        // Outputs not asked for are rematerialised into scratch for the step only.
        let allocated = prepared.op_allocated(op);
        let mut scratch_bytes = prepared.workspace_bytes[op.index()];
        for &o in allocated {
            if outputs.contains(&o) {
                self.event_outlined(o, Access::Produce, h);
            } else {
                scratch_bytes += prepared.size_bytes[o.index()];
            }
        }
        for &o in outputs {
            if !allocated.contains(&o) {
                self.malformed(h.at, format!("{o} is not a storage-owning output of {op}"));
            }
        }
        if scratch_bytes > 0 {
            self.push_buffer(Owner::Scratch(h.id), scratch_bytes, h.id, h.at);
        }
    }

    /// A device buffer allocated at step `alloc` (global id, `NONE`: from the
    /// start) and freed at `free` (index `NONE`: at the end).
    fn push_buffer(&mut self, owner: Owner, size_bytes: u64, alloc: u32, free: StepRef) {
        // Never resident all iteration: `free` is a step of this iteration.
        push_buffer(
            self.buffers,
            self.resident_bytes,
            false,
            owner,
            size_bytes,
            alloc,
            free,
        );
    }

    #[inline(never)]
    fn event_outlined(&mut self, t: TensorId, access: Access, h: &Here) {
        self.event(t, access, h);
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
    #[inline(always)]
    fn event(&mut self, t: TensorId, access: Access, h: &Here) {
        self.events = self.events.saturating_add(1);
        let key = tensor_key(t, self.events);
        let found = &mut *self.found;
        let st = &mut self.tensors[t.index()];
        let c = h.cover;
        // `lane` takes any index (no bounds check): the stream, which only
        // this function sets (to 0..3), is reduced only where it indexes.
        let nonread_stream = st.nonread_stream as usize;
        if c.lane(nonread_stream) < st.nonread_index {
            let other = StepRef {
                stream: Stream::ALL[nonread_stream % 3],
                index: st.nonread_index as u32,
            };
            report(
                found,
                key,
                h.at,
                ViolationKind::Unordered { tensor: t, other },
            );
        }
        let k = h.at.stream.index();
        if access.is_read() {
            // Steps are visited in stream order: this is the stream's latest read.
            st.read_max[k] = h.at.index as i32;
            self.reads.push((h.id, st.last_read));
            st.last_read = (self.reads.len() - 1) as u32;
        } else {
            let m = &st.read_max;
            if (m[0] > c.lane(0)) | (m[1] > c.lane(1)) | (m[2] > c.lane(2)) {
                report_race(found, self.reads, st.last_read, &self.layout, t, key, h);
            }
            st.read_max = [-1; 3];
            st.last_read = NONE;
            st.nonread_stream = k as u8;
            st.nonread_index = h.at.index as i32;
        }
        if st.pending_free != NONE && access != Access::Free {
            if access == Access::SwapIn {
                report_pending_free(found, &self.layout, t, st);
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
                        st.pending_event = self.events;
                    }
                    let alloc = if st.resident_from_start {
                        NONE
                    } else {
                        st.alloc_at
                    };
                    st.resident_from_start = false;
                    st.present = false;
                    push_buffer(
                        self.buffers,
                        self.resident_bytes,
                        false,
                        Owner::Tensor(t.0),
                        self.prepared.size_bytes[t.index()],
                        alloc,
                        h.at,
                    );
                    None
                } else {
                    Some(Problem::NotResident)
                }
            }
        };
        if let Some(problem) = problem {
            report_problem(found, key, t, problem, h);
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
    h: &Here,
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

/// Records a race of a non-read of `tensor` at `h` with a read since the
/// tensor's last non-read: the first such read in walk order that is not
/// ordered before `h`. The reads are chained from `latest` back.
#[cold]
#[inline(never)]
fn report_race(
    found: &mut Vec<(TensorKey, Violation)>,
    reads: &[(u32, u32)],
    latest: u32,
    layout: &Layout,
    tensor: TensorId,
    key: TensorKey,
    h: &Here,
) {
    let mut first = None;
    let mut read = latest;
    while let Some(&(step, previous)) = reads.get(read as usize) {
        let r = layout.step_ref(step as usize);
        if h.cover.lane(r.stream.index()) < r.index as i32 {
            first = Some(r);
        }
        read = previous;
    }
    // The caller saw such a read; `h.at` is never reported.
    let other = first.unwrap_or(h.at);
    report(found, key, h.at, ViolationKind::Unordered { tensor, other });
}

/// Records the pending free of `t` as a free while needed later.
#[cold]
#[inline(never)]
fn report_pending_free(
    found: &mut Vec<(TensorKey, Violation)>,
    layout: &Layout,
    t: TensorId,
    st: &TensorState,
) {
    let at = layout.step_ref(st.pending_free as usize);
    let kind = ViolationKind::FreedWithoutHostCopy { tensor: t };
    report(found, tensor_key(t, st.pending_event), at, kind);
}

/// Whose a buffer is: a tensor's, or a step's scratch (by global step id).
#[derive(Debug, Clone, Copy)]
enum Owner {
    Tensor(u32),
    Scratch(u32),
}

/// Records a device buffer for the memory bound (see `Checker::push_buffer`)
/// and the layout. A buffer resident for the whole iteration counts in
/// `resident_bytes`, which the bound starts from; it is listed in `buffers`
/// too only with `record_resident` (a layout needs it, the bound skips it;
/// a search verifies many programs, and most persistent tensors are such).
#[inline]
fn push_buffer(
    buffers: &mut Vec<Buffer>,
    resident_bytes: &mut i128,
    record_resident: bool,
    owner: Owner,
    size_bytes: u64,
    alloc: u32,
    free: StepRef,
) {
    if alloc == NONE && free.index == NONE {
        *resident_bytes += size_bytes as i128;
        if !record_resident {
            return;
        }
    }
    let (owner_id, scratch) = match owner {
        Owner::Tensor(t) => (t, false),
        Owner::Scratch(step) => (step, true),
    };
    buffers.push(Buffer {
        owner_id,
        scratch,
        size_bytes,
        alloc,
        free_stream: free.stream.index() as u8,
        free_index: free.index,
    });
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

/// "Resident to the end" as a buffer's free.
const END: StepRef = StepRef {
    stream: Stream::Compute,
    index: NONE,
};

/// The end of the iteration for every storage owner: a pending free, the
/// buffer still resident, and the residency the next iteration starts from.
fn finish_tensors(prepared: &PreparedGraph, s: &mut VerifyScratch) {
    for (ti, st) in s.tensors.iter().enumerate() {
        if !prepared.allocates[ti] {
            continue;
        }
        let persistent = prepared.persistent[ti];
        // Most tensors are freed and owe nothing (a pending free matters only
        // for a persistent tensor: see `finish_tensor`); most persistent ones
        // stay on the device at their final version.
        if !persistent && !st.present && !st.given {
            continue;
        }
        if st.present {
            let alloc = if st.resident_from_start {
                NONE
            } else {
                st.alloc_at
            };
            push_buffer(
                &mut s.buffers,
                &mut s.resident_bytes,
                s.record_resident,
                Owner::Tensor(ti as u32),
                prepared.size_bytes[ti],
                alloc,
                END,
            );
        }
        let settled = persistent
            && st.present
            && st.residency == Residency::Device
            && st.pending_free == NONE
            && st.dev_version == prepared.writers(TensorId(ti as u32)).len() as u32;
        if !settled {
            finish_tensor(prepared, ti, st, &s.layout, &mut s.tensor_violations);
        }
    }
}

/// [`finish_tensors`] for one owner, in full (its violations; its buffer
/// still resident is recorded by the caller).
#[inline(never)]
fn finish_tensor(
    prepared: &PreparedGraph,
    ti: usize,
    st: &TensorState,
    layout: &Layout,
    found: &mut Vec<(TensorKey, Violation)>,
) {
    let t = TensorId(ti as u32);
    let persistent = prepared.persistent[ti];
    if !persistent && st.given {
        let reason = format!("initial residency given for {t}, which is not persistent");
        found.push((
            tensor_key(t, 0),
            Violation {
                at: None,
                kind: ViolationKind::Malformed { reason },
            },
        ));
    }
    if st.pending_free != NONE && persistent {
        report_pending_free(found, layout, t, st);
    }
    let final_version = prepared.writers(t).len() as u32;
    if let Some(kind) = check_end(t, persistent, final_version, st) {
        found.push((tensor_key(t, u32::MAX), Violation { at: None, kind }));
    }
}

/// The residency at the end of the iteration must equal the start's.
fn check_end(
    t: TensorId,
    persistent: bool,
    final_version: u32,
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
    let ok = match st.residency {
        Residency::Device => present && st.dev_version == final_version,
        Residency::DeviceAndHost => {
            present && st.dev_version == final_version && host_version == Some(final_version)
        }
        Residency::Host => !present && host_version == Some(final_version),
    };
    if ok {
        return None;
    }
    let expected = match st.residency {
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
    // The bound is checked at allocating steps only (a well-formed d2h
    // stream has none).
    let active: [bool; 3] = std::array::from_fn(|k| s.allocating_steps[k] > 0);
    // The swap-in bound reads the compute stream's tables too.
    let tables: [bool; 3] = std::array::from_fn(|k| active[k] || (k == 0 && active[1]));
    for k in (0..3).filter(|&k| tables[k]) {
        let steps = layout.offset[k]..layout.offset[k] + layout.len[k];
        first_after(&layout, k, &s.vc[steps], &mut s.first_after[k]);
    }
    // Every partial sum lies between 0 and this total, so when it fits an
    // `i64` (any real graph) the sums run in `i64`; else in `i128`.
    let total = s
        .buffers
        .iter()
        .filter(|b| b.alloc != NONE || b.free_index != NONE)
        .fold(s.resident_bytes.max(0) as u128, |t, b| {
            t + b.size_bytes as u128
        });
    let bounds = Bounds {
        layout: &layout,
        active,
        buffers: &s.buffers,
        vc: &s.vc,
        first_after: &s.first_after,
        allocating: &s.allocating,
        resident_bytes: s.resident_bytes,
        budget_bytes: program.budget_bytes(),
    };
    if total <= i64::MAX as u128 {
        bounds.run(&mut s.delta, &mut s.h2d, v)
    } else {
        bounds.run(&mut s.delta_wide, &mut s.h2d_wide, v)
    }
}

/// A signed byte count the memory bound sums in (see `check_budget`).
trait ByteSum: Copy + Default + PartialOrd + std::ops::AddAssign + std::ops::SubAssign {
    /// `bytes`, which the caller has checked fits.
    fn of(bytes: u64) -> Self;
    fn of_wide(bytes: i128) -> Self;
    fn wide(self) -> i128;
}

impl ByteSum for i64 {
    #[inline(always)]
    fn of(bytes: u64) -> Self {
        bytes as i64
    }
    #[inline(always)]
    fn of_wide(bytes: i128) -> Self {
        bytes as i64
    }
    #[inline(always)]
    fn wide(self) -> i128 {
        self as i128
    }
}

impl ByteSum for i128 {
    #[inline(always)]
    fn of(bytes: u64) -> Self {
        bytes as i128
    }
    #[inline(always)]
    fn of_wide(bytes: i128) -> Self {
        bytes
    }
    #[inline(always)]
    fn wide(self) -> i128 {
        self
    }
}

/// What the memory bound reads (see `check_budget`).
struct Bounds<'s> {
    layout: &'s Layout,
    active: [bool; 3],
    buffers: &'s [Buffer],
    vc: &'s [[i32; 3]],
    first_after: &'s [[Vec<u32>; 3]; 3],
    allocating: &'s [bool],
    resident_bytes: i128,
    budget_bytes: u64,
}

impl Bounds<'_> {
    /// The bound at every allocating step of each active stream, summed in
    /// `T` (which the caller checked holds every partial sum).
    fn run<T: ByteSum>(
        &self,
        delta: &mut [Vec<T>; 3],
        h2d: &mut H2dSweep<T>,
        v: &mut Vec<Violation>,
    ) -> MemoryBound {
        self.sum_by_stream(delta);
        if self.active[1] {
            self.h2d_bounds(h2d);
        }
        let budget = self.budget_bytes as i128;
        let resident = T::of_wide(self.resident_bytes);
        let mut bound = MemoryBound::default();
        for st in Stream::ALL {
            let k = st.index();
            if !self.active[k] {
                continue;
            }
            let layout = self.layout;
            let n = layout.len[k];
            let steps = layout.offset[k]..layout.offset[k] + n;
            let allocating = &self.allocating[steps];
            let mut cur = resident;
            let mut worst: Option<(usize, T)> = None;
            for (i, &allocates) in allocating.iter().enumerate() {
                if k == 1 {
                    cur = resident;
                    cur += h2d.at[i];
                } else {
                    cur += delta[k][i];
                }
                if !allocates {
                    continue;
                }
                let bytes = cur.wide().clamp(0, u64::MAX as i128) as u64;
                // The first step (compute, then h2d, then d2h) with the largest bound.
                if bound.at.is_none() || bytes > bound.peak_bytes {
                    bound = MemoryBound {
                        peak_bytes: bytes,
                        at: Some(StepRef {
                            stream: st,
                            index: i as u32,
                        }),
                    };
                }
                if cur.wide() > budget && worst.is_none_or(|(_, w)| cur > w) {
                    worst = Some((i, cur));
                }
            }
            if let Some((i, bytes)) = worst {
                v.push(Violation {
                    at: Some(StepRef {
                        stream: st,
                        index: i as u32,
                    }),
                    kind: ViolationKind::OverBudget {
                        bytes: bytes.wide() as u64,
                        budget_bytes: self.budget_bytes,
                    },
                });
            }
        }
        bound
    }

    /// For each active stream other than h2d, `delta[k][i]`: the change at
    /// step `i` of the bytes that may be resident while it runs, a buffer
    /// counting unless its free happens before the step or the step happens
    /// before its allocation. On the compute stream that is exact for the
    /// compute stream's own buffers, as the step fixes its position; on h2d
    /// it would not be (see `h2d_bounds`).
    fn sum_by_stream<T: ByteSum>(&self, delta: &mut [Vec<T>; 3]) {
        let layout = self.layout;
        let summed: [bool; 3] = std::array::from_fn(|k| self.active[k] && k != 1);
        for k in (0..3).filter(|&k| summed[k]) {
            delta[k].clear();
            delta[k].resize(layout.len[k] + 1, T::default());
        }
        if !summed.iter().any(|&a| a) {
            return;
        }
        // One pass over the buffers for every stream (each buffer's clock is
        // read once).
        for b in self.buffers {
            if b.alloc == NONE && b.free_index == NONE {
                continue; // in `resident_bytes`
            }
            let alloc_clock = (b.alloc != NONE).then(|| self.vc[b.alloc as usize]);
            for k in (0..3).filter(|&k| summed[k]) {
                let n = layout.len[k];
                // Steps i on stream k with `step_i hb alloc` form a prefix: i <= vc[alloc][k]
                // (on the allocation's own stream, vc[alloc][k] + 1 is its index).
                let lo = alloc_clock.map_or(0, |c| (c[k] + 1) as usize);
                // Steps with `free hb step_i` form a suffix.
                let hi = if b.free_index == NONE {
                    n
                } else if b.free_stream as usize == k {
                    b.free_index as usize + 1
                } else {
                    self.first_after[k][b.free_stream as usize % 3][b.free_index as usize] as usize
                };
                if lo < hi {
                    delta[k][lo] += T::of(b.size_bytes);
                    delta[k][hi] -= T::of(b.size_bytes);
                }
            }
        }
    }

    /// `h2d.at[j]`: the most bytes (besides `resident_bytes`) that may be
    /// resident while swap-in `j` runs.
    ///
    /// A swap-in is ordered only by its waits, so it may run beside any
    /// compute step of its window: after the last compute step it waits for,
    /// up to the first that waits for it. Counting every buffer that may be
    /// resident at *some* point of that window, as `sum_by_stream` does,
    /// sums buffers the compute stream never holds together (the window of a
    /// copy queued far ahead spans many layers). Instead this fixes where the
    /// compute stream stands as well, at one of `2 n + 1` half-positions `q`
    /// (`2i`: steps before `i` complete, `i` not started; `2i + 1`: step `i`
    /// running), and takes the maximum over the window of the bytes that may
    /// be resident at `q` while `j` runs. A buffer may be resident there if
    /// its allocating step may have started and its freeing step may not
    /// have completed, given both positions:
    /// - on the compute stream, at index `i`: started iff `q >= 2i + 1`,
    ///   completed iff `q >= 2i + 2`;
    /// - on h2d, at index `i`: started iff `i <= j`, completed iff `i < j`
    ///   (and surely completed once a compute step waiting for it started);
    /// - on d2h: started unless `j` or a compute step not yet complete
    ///   happens before it; completed if it happens before `j` or before a
    ///   started compute step (otherwise counted as possibly not).
    ///
    /// Each condition bounds `q` to an interval and `j` to an interval that
    /// does not depend on `q`, so a sweep over `j` adds each buffer to a
    /// range-add / range-max tree over `q` while `j` is in its interval.
    /// Every timing puts the compute stream at one `q` of the window, and a
    /// buffer resident then passes every test, so the bound stays sound.
    /// O((buffers + swap-ins) log steps).
    ///
    /// The tree keeps only the odd half-positions (step `i` running), half
    /// the size: an interval with an even end is widened by one to the odd
    /// position beyond it (an even start `2i` to `2i - 1`, an even end `2i`
    /// to `2i + 1`). Then a buffer counted at an even position `2i` is also
    /// counted at `2i - 1` and at `2i + 1`, so the window's odd positions,
    /// or its one even position's odd neighbour below, bound it. Only
    /// buffers allocated by a d2h step or freed by a copy have even ends.
    /// Lowered plans allocate nothing on d2h but free swapped-out copies
    /// there; such a copy counts beside a swap-in until the first compute
    /// step that waits for its free starts, and the widening adds that
    /// step's running position, where the free has in fact completed. On
    /// the 48 random plans of `tests/random_dags.rs`, wherever the bound
    /// exceeded the exact peak the step was a compute step, not a swap-in.
    fn h2d_bounds<T: ByteSum>(&self, h2d: &mut H2dSweep<T>) {
        let layout = self.layout;
        let (n0, n1) = (layout.len[0], layout.len[1]);
        let last_q = 2 * n0;
        // The tree holds the odd half-positions only (see the doc comment).
        let slots = n0.max(1);
        let first_compute_after = &self.first_after[0];
        // Buffers beside every swap-in (most: the compute stream's own) go
        // into `fixed` by difference and build the tree once; the others
        // (swap-ins' own, mostly) are added and removed as the sweep passes.
        h2d.fixed.clear();
        h2d.fixed.resize(slots + 1, T::default());
        h2d.events.clear();
        for b in self.buffers {
            if b.alloc == NONE && b.free_index == NONE {
                continue; // in `resident_bytes`
            }
            let (mut q_lo, mut j_lo) = (0, 0);
            if b.alloc != NONE {
                let a = b.alloc as usize;
                let at = layout.step_ref(a);
                let i = at.index as usize;
                match at.stream {
                    Stream::Compute => q_lo = 2 * i + 1,
                    Stream::H2d => j_lo = i,
                    Stream::D2h => {
                        let c = self.vc[a];
                        j_lo = (c[1] + 1) as usize;
                        q_lo = 2 * (c[0] + 1) as usize;
                    }
                }
            }
            let (mut q_hi, mut j_end) = (last_q, n1);
            if b.free_index != NONE {
                let f = b.free_index as usize;
                match b.free_stream {
                    0 => q_hi = 2 * f + 1,
                    1 => {
                        j_end = f + 1;
                        q_hi = 2 * first_compute_after[1][f] as usize;
                    }
                    _ => {
                        j_end = self.first_after[1][2][f] as usize;
                        q_hi = 2 * first_compute_after[2][f] as usize;
                    }
                }
            }
            let q_hi = q_hi.min(last_q);
            if q_lo > q_hi || j_lo >= j_end {
                continue;
            }
            // Even ends widen to the odd neighbour outside them.
            let lo = (q_lo.max(1) - 1) / 2;
            let hi = (q_hi / 2).min(slots - 1);
            if j_lo == 0 && j_end == n1 {
                h2d.fixed[lo] += T::of(b.size_bytes);
                h2d.fixed[hi + 1] -= T::of(b.size_bytes);
                continue;
            }
            let (q_lo, q_hi) = (lo as u32, hi as u32);
            h2d.events
                .push((j_lo as u32, q_lo, q_hi, b.size_bytes, true));
            if j_end < n1 {
                h2d.events
                    .push((j_end as u32, q_lo, q_hi, b.size_bytes, false));
            }
        }
        let mut sum = T::default();
        for d in &mut h2d.fixed[..slots] {
            sum += *d;
            *d = sum;
        }
        h2d.tree.build(&h2d.fixed[..slots]);
        h2d.events.sort_unstable_by_key(|e| e.0);
        h2d.at.clear();
        h2d.at.resize(n1, T::default());
        let mut next = 0;
        for (j, &w) in first_compute_after[1].iter().enumerate().take(n1) {
            while let Some(&(at, q_lo, q_hi, size_bytes, add)) = h2d.events.get(next) {
                if at as usize != j {
                    break;
                }
                h2d.tree
                    .add(q_lo as usize, q_hi as usize, T::of(size_bytes), add);
                next += 1;
            }
            let id = layout.offset[1] + j;
            if !self.allocating[id] {
                continue;
            }
            // The window: past the last compute step `j` waits for, up to
            // (not into) the first that waits for it, `w`: half-positions
            // `2c + 2 ..= 2w`, whose odd ones are the steps `c + 1 .. w`. With
            // none, the one even position is bounded by step `w - 1`.
            let w = w as usize;
            let first = (self.vc[id][0] + 1) as usize;
            let last = w.saturating_sub(1);
            let first = first.min(last);
            h2d.at[j] = h2d.tree.max_in(first.min(slots - 1), last.min(slots - 1));
        }
    }
}

/// Reusable buffers of the swap-in bound (`Bounds::h2d_bounds`).
#[derive(Debug, Clone, Default)]
struct H2dSweep<T> {
    tree: MaxTree<T>,
    /// Per compute half-position: the bytes of the buffers that may be
    /// resident beside every swap-in (a difference array, then its sums).
    fixed: Vec<T>,
    /// (h2d index, first and last compute half-position, bytes, add or
    /// remove): a buffer enters the tree at the first swap-in it may be
    /// resident beside and leaves it at the first it may not.
    events: Vec<(u32, u32, u32, u64, bool)>,
    /// Per h2d step: the bound there (allocating steps only).
    at: Vec<T>,
}

/// A segment tree over positions `0..n`: add a value to a range, read the
/// maximum of a range, both in O(log n) without recursion. Node `i` covers
/// the leaves below it; `max[i]` is the maximum over them, counting what was
/// added to `i` and its descendants but not to its ancestors; `add[i]`
/// (internal nodes only) is what was added to all of `i`'s range and not yet
/// pushed to its children. A query pushes those down the two paths it reads.
#[derive(Debug, Clone, Default)]
struct MaxTree<T> {
    leaves: usize,
    height: u32,
    max: Vec<T>,
    add: Vec<T>,
}

impl<T: ByteSum> MaxTree<T> {
    /// One position per value of `values` (at least one), each holding it.
    fn build(&mut self, values: &[T]) {
        self.leaves = values.len().max(1).next_power_of_two();
        self.height = self.leaves.trailing_zeros();
        let leaves = self.leaves;
        self.max.clear();
        self.max.resize(2 * leaves, T::default());
        self.add.clear();
        self.add.resize(leaves, T::default());
        self.max[leaves..leaves + values.len()].copy_from_slice(values);
        for node in (1..leaves).rev() {
            self.max[node] = max_of(self.max[2 * node], self.max[2 * node + 1]);
        }
    }

    fn bump(&mut self, node: usize, value: T, add: bool) {
        if add {
            self.max[node] += value;
        } else {
            self.max[node] -= value;
        }
        if node < self.leaves {
            if add {
                self.add[node] += value;
            } else {
                self.add[node] -= value;
            }
        }
    }

    /// Recomputes the ancestors of leaves `left` and `right` from their
    /// children, once where the two paths have met.
    fn pull(&mut self, mut left: usize, mut right: usize) {
        while left > 1 {
            left >>= 1;
            right >>= 1;
            self.pull_one(left);
            if right != left {
                self.pull_one(right);
            }
        }
    }

    fn pull_one(&mut self, node: usize) {
        let mut m = max_of(self.max[2 * node], self.max[2 * node + 1]);
        m += self.add[node];
        self.max[node] = m;
    }

    /// Moves the pending additions of `node`'s ancestors down to it.
    fn push(&mut self, node: usize) {
        for shift in (1..=self.height).rev() {
            let i = node >> shift;
            let pending = self.add[i];
            if pending != T::default() {
                self.bump(2 * i, pending, true);
                self.bump(2 * i + 1, pending, true);
                self.add[i] = T::default();
            }
        }
    }

    /// Adds (`add`) or subtracts `value` at positions `lo..=hi`.
    fn add(&mut self, lo: usize, hi: usize, value: T, add: bool) {
        let (mut l, mut r) = (lo + self.leaves, hi + self.leaves + 1);
        let (first, last) = (l, r - 1);
        while l < r {
            if l & 1 == 1 {
                self.bump(l, value, add);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.bump(r, value, add);
            }
            l >>= 1;
            r >>= 1;
        }
        self.pull(first, last);
    }

    /// The maximum over positions `lo..=hi` (`lo <= hi < n`).
    fn max_in(&mut self, lo: usize, hi: usize) -> T {
        let (mut l, mut r) = (lo + self.leaves, hi + self.leaves + 1);
        self.push(l);
        self.push(r - 1);
        let mut best: Option<T> = None;
        let mut take = |v: T| best = Some(best.map_or(v, |b| max_of(b, v)));
        while l < r {
            if l & 1 == 1 {
                take(self.max[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                take(self.max[r]);
            }
            l >>= 1;
            r >>= 1;
        }
        best.unwrap_or_default()
    }
}

fn max_of<T: PartialOrd>(a: T, b: T) -> T {
    if b > a { b } else { a }
}

/// For each stream `col` other than `k` and each step `j` on it: the first
/// step on stream `k` that `j` happens before (`clocks` are stream `k`'s
/// vector clocks, which only grow along the stream), so one sweep fills them.
fn first_after(layout: &Layout, k: usize, clocks: &[[i32; 3]], tables: &mut [Vec<u32>; 3]) {
    let n = clocks.len();
    let mut filled = [0usize; 3];
    for (col, table) in tables.iter_mut().enumerate() {
        table.clear();
        if col != k {
            table.resize(layout.len[col], n as u32);
        }
    }
    for (i, clock) in clocks.iter().enumerate() {
        for col in (0..3).filter(|&c| c != k) {
            // Steps of `col` up to clock[col] complete before step i starts.
            let upto = (clock[col] + 1) as usize;
            if upto > filled[col] {
                tables[col][filled[col]..upto].fill(i as u32);
                filled[col] = upto;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MaxTree;
    use proptest::prelude::*;

    proptest! {
        /// The tree answers like a plain array that is updated and scanned.
        #[test]
        fn max_tree_matches_an_array(
            n in 1usize..40,
            ops in proptest::collection::vec((any::<u16>(), any::<u16>(), 0i64..1000, any::<bool>(), any::<u16>(), any::<u16>()), 1..60),
        ) {
            let mut plain: Vec<i64> = (0..n as i64).map(|i| (i * 37) % 11).collect();
            let mut tree = MaxTree::<i64>::default();
            tree.build(&plain);
            for (a, b, value, add, c, d) in ops {
                let (lo, hi) = ((a as usize % n).min(b as usize % n), (a as usize % n).max(b as usize % n));
                tree.add(lo, hi, value, add);
                for x in &mut plain[lo..=hi] {
                    *x += if add { value } else { -value };
                }
                let (qlo, qhi) = ((c as usize % n).min(d as usize % n), (c as usize % n).max(d as usize % n));
                let expected = *plain[qlo..=qhi].iter().max().expect("non-empty");
                prop_assert_eq!(tree.max_in(qlo, qhi), expected);
            }
        }
    }
}
