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

use crate::plan::{Instr, Plan, Residency, StepRef, Stream};
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
struct Layout {
    offset: [usize; 3],
    len: [usize; 3],
}

impl Layout {
    fn id(&self, r: StepRef) -> usize {
        self.offset[r.stream.index()] + r.index as usize
    }

    fn step_ref(&self, id: usize) -> StepRef {
        for s in Stream::ALL.iter().rev() {
            if id >= self.offset[s.index()] {
                return StepRef {
                    stream: *s,
                    index: (id - self.offset[s.index()]) as u32,
                };
            }
        }
        StepRef {
            stream: Stream::Compute,
            index: id as u32,
        }
    }

    fn valid(&self, r: StepRef) -> bool {
        (r.index as usize) < self.len[r.stream.index()]
    }
}

/// Happens-before facts of a plan.
pub(crate) struct Order {
    layout: Layout,
    /// `vc[id][s]`: highest index on stream `s` that completes before step `id` starts (-1: none).
    vc: Vec<[i64; 3]>,
    /// Steps in a topological order (all steps when there is no deadlock).
    topo: Vec<usize>,
}

impl Order {
    /// Does step `a` complete before step `b` starts, in every timing?
    fn hb(&self, a: usize, b: usize) -> bool {
        let ra = self.layout.step_ref(a);
        self.vc[b][ra.stream.index()] >= ra.index as i64
    }
}

fn build_order(plan: &Plan, v: &mut Vec<Violation>) -> Order {
    let mut offset = [0; 3];
    let mut len = [0; 3];
    let mut total = 0;
    for s in Stream::ALL {
        offset[s.index()] = total;
        len[s.index()] = plan.stream(s).len();
        total += len[s.index()];
    }
    let layout = Layout { offset, len };
    // Predecessors: previous step on the stream, and valid waits.
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); total];
    for s in Stream::ALL {
        for (i, step) in plan.stream(s).iter().enumerate() {
            let id = layout.offset[s.index()] + i;
            if i > 0 {
                preds[id].push(id - 1);
            }
            for &w in &step.waits {
                let here = StepRef {
                    stream: s,
                    index: i as u32,
                };
                if !layout.valid(w) {
                    v.push(Violation {
                        at: Some(here),
                        kind: ViolationKind::BadWait { target: w },
                    });
                } else {
                    preds[id].push(layout.id(w));
                }
            }
        }
    }
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); total];
    let mut indegree = vec![0usize; total];
    for (id, ps) in preds.iter().enumerate() {
        indegree[id] = ps.len();
        for &p in ps {
            succs[p].push(id);
        }
    }
    let mut ready: Vec<usize> = (0..total).filter(|&i| indegree[i] == 0).collect();
    ready.reverse();
    let mut topo = Vec::with_capacity(total);
    let mut vc = vec![[-1i64; 3]; total];
    while let Some(id) = ready.pop() {
        let mut clock = [-1i64; 3];
        for &p in &preds[id] {
            let rp = layout.step_ref(p);
            for k in 0..3 {
                clock[k] = clock[k].max(vc[p][k]);
            }
            let k = rp.stream.index();
            clock[k] = clock[k].max(rp.index as i64);
        }
        vc[id] = clock;
        topo.push(id);
        for &s in &succs[id] {
            indegree[s] -= 1;
            if indegree[s] == 0 {
                ready.push(s);
            }
        }
    }
    if topo.len() < total {
        v.push(Violation {
            at: None,
            kind: ViolationKind::Deadlock {
                steps: total - topo.len(),
            },
        });
    }
    Order { layout, vc, topo }
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
    step: usize,
    kind: EventKind,
}

/// A device buffer's allocation and free steps, for the memory bound.
struct Buffer {
    size_bytes: u64,
    /// `None`: resident from the start.
    alloc: Option<usize>,
    /// `None`: resident to the end.
    free: Option<usize>,
}

/// Verifies `plan` against `graph`; an empty list means the plan is safe.
pub fn verify(plan: &Plan, graph: &Graph) -> Vec<Violation> {
    let mut v = Vec::new();
    let order = build_order(plan, &mut v);
    let n_t = graph.tensors.len();
    let n_ops = graph.ops.len();

    // Version bookkeeping: in-place writers of each storage owner, in graph order.
    let mut writers: Vec<Vec<OpId>> = vec![Vec::new(); n_t];
    for op in &graph.ops {
        for &o in &op.outputs {
            if let Some(target) = graph.tensor(o).inplace_update_of {
                writers[graph.storage_owner(target).index()].push(op.id);
            }
        }
    }
    let version_before = |owner: TensorId, op: OpId| -> u32 {
        writers[owner.index()].iter().filter(|w| **w < op).count() as u32
    };

    // Collect events per storage owner in topological order.
    let mut events: Vec<Vec<Event>> = vec![Vec::new(); n_t];
    let mut computed = vec![0u32; n_ops];
    let mut scratch: Vec<Buffer> = Vec::new();
    let malformed = |at: StepRef, reason: String| Violation {
        at: Some(at),
        kind: ViolationKind::Malformed { reason },
    };
    for &id in &order.topo {
        let at = order.layout.step_ref(id);
        let Some(step) = plan.step(at) else { continue };
        if let Some(required) = step.instr.required_stream()
            && required != at.stream
        {
            v.push(malformed(
                at,
                format!("`{}` must be on the {required} stream", step.instr),
            ));
            continue;
        }
        let owner_of = |t: TensorId, v: &mut Vec<Violation>| -> Option<TensorId> {
            if t.index() >= n_t {
                v.push(malformed(at, format!("tensor {t} does not exist")));
                return None;
            }
            Some(graph.storage_owner(t))
        };
        let movable = |t: TensorId, v: &mut Vec<Violation>| -> Option<TensorId> {
            if t.index() >= n_t {
                v.push(malformed(at, format!("tensor {t} does not exist")));
                return None;
            }
            if !graph.tensor(t).allocates() {
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
        match &step.instr {
            Instr::Compute(op_id) | Instr::Recompute { op: op_id, .. } => {
                if op_id.index() >= n_ops {
                    v.push(malformed(at, format!("op {op_id} does not exist")));
                    continue;
                }
                let op = graph.op(*op_id);
                let recompute = matches!(step.instr, Instr::Recompute { .. });
                if recompute && !op.recomputable {
                    v.push(Violation {
                        at: Some(at),
                        kind: ViolationKind::NotRecomputable { op: op.id },
                    });
                }
                if !recompute {
                    computed[op_id.index()] += 1;
                }
                // In-place targets: the write subsumes the op's read of the same storage.
                let mut written: Vec<TensorId> = Vec::new();
                for &o in &op.outputs {
                    if let Some(target) = graph.tensor(o).inplace_update_of {
                        written.push(graph.storage_owner(target));
                    }
                }
                let mut read: Vec<TensorId> = Vec::new();
                for &t in &op.inputs {
                    let Some(owner) = owner_of(t, &mut v) else {
                        continue;
                    };
                    if !written.contains(&owner) && !read.contains(&owner) {
                        read.push(owner);
                        let expected = version_before(owner, op.id);
                        events[owner.index()].push(Event {
                            step: id,
                            kind: EventKind::Read {
                                expected,
                                by_recompute: recompute,
                            },
                        });
                    }
                }
                if recompute {
                    let Instr::Recompute { outputs, .. } = &step.instr else {
                        continue;
                    };
                    let mut scratch_bytes = op.workspace_bytes;
                    for &o in &op.outputs {
                        let t = graph.tensor(o);
                        if !t.allocates() {
                            continue;
                        }
                        if outputs.contains(&o) {
                            events[o.index()].push(Event {
                                step: id,
                                kind: EventKind::Rematerialise,
                            });
                        } else {
                            scratch_bytes += t.size_bytes;
                        }
                    }
                    for &o in outputs {
                        if !op.outputs.contains(&o) || !graph.tensor(o).allocates() {
                            v.push(malformed(
                                at,
                                format!("{o} is not a storage-owning output of {}", op.id),
                            ));
                        }
                    }
                    scratch.push(Buffer {
                        size_bytes: scratch_bytes,
                        alloc: Some(id),
                        free: Some(id),
                    });
                } else {
                    for &o in &op.outputs {
                        let t = graph.tensor(o);
                        if t.allocates() {
                            events[o.index()].push(Event {
                                step: id,
                                kind: EventKind::Produce,
                            });
                        }
                    }
                    for &owner in &written {
                        let expected = version_before(owner, op.id);
                        events[owner.index()].push(Event {
                            step: id,
                            kind: EventKind::Write { expected },
                        });
                    }
                    if op.workspace_bytes > 0 {
                        scratch.push(Buffer {
                            size_bytes: op.workspace_bytes,
                            alloc: Some(id),
                            free: Some(id),
                        });
                    }
                }
            }
            Instr::SwapIn(t) => {
                if let Some(t) = movable(*t, &mut v) {
                    events[t.index()].push(Event {
                        step: id,
                        kind: EventKind::SwapIn,
                    });
                }
            }
            Instr::SwapOut(t) => {
                if let Some(t) = movable(*t, &mut v) {
                    events[t.index()].push(Event {
                        step: id,
                        kind: EventKind::SwapOut,
                    });
                }
            }
            Instr::Free(t) => {
                if let Some(t) = movable(*t, &mut v) {
                    events[t.index()].push(Event {
                        step: id,
                        kind: EventKind::Free,
                    });
                }
            }
        }
    }
    if v.iter()
        .any(|x| matches!(x.kind, ViolationKind::Deadlock { .. }))
    {
        // Without a complete order the per-tensor checks would report noise.
        return v;
    }
    for (i, &count) in computed.iter().enumerate() {
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

    // Per-tensor state machine.
    let initial: std::collections::HashMap<TensorId, Residency> =
        plan.initial_residency.iter().copied().collect();
    let mut buffers: Vec<Buffer> = scratch;
    for t in graph.tensors.iter().filter(|t| t.allocates()) {
        let evs = &events[t.id.index()];
        let persistent = t.is_persistent();
        let residency = if persistent {
            initial.get(&t.id).copied().unwrap_or(Residency::Device)
        } else {
            Residency::Host
        };
        if !persistent && initial.contains_key(&t.id) {
            v.push(Violation {
                at: None,
                kind: ViolationKind::Malformed {
                    reason: format!(
                        "initial residency given for {}, which is not persistent",
                        t.id
                    ),
                },
            });
        }
        // Inputs and labels arrive on the device with the batch (and exist on the host).
        let arrives_with_batch = t.producer.is_none() && !persistent;
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
        let mut reads_since: Vec<usize> = Vec::new();
        for (k, e) in evs.iter().enumerate() {
            let at = Some(order.layout.step_ref(e.step));
            // Ordering: a non-read must follow everything before it; a read must
            // follow the last non-read.
            if let Some(prev) = last_nonread
                && prev != e.step
                && !order.hb(prev, e.step)
            {
                v.push(Violation {
                    at,
                    kind: ViolationKind::Unordered {
                        tensor: t.id,
                        other: order.layout.step_ref(prev),
                    },
                });
            }
            if !e.kind.is_read() {
                for &r in &reads_since {
                    if r != e.step && !order.hb(r, e.step) {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::Unordered {
                                tensor: t.id,
                                other: order.layout.step_ref(r),
                            },
                        });
                        break;
                    }
                }
                reads_since.clear();
                last_nonread = Some(e.step);
            } else {
                reads_since.push(e.step);
            }
            match e.kind {
                EventKind::Produce | EventKind::Rematerialise | EventKind::SwapIn => {
                    if present {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::AlreadyResident { tensor: t.id },
                        });
                        continue;
                    }
                    if e.kind == EventKind::SwapIn {
                        match host_version {
                            Some(h) => dev_version = h,
                            None => {
                                v.push(Violation {
                                    at,
                                    kind: ViolationKind::SwapInWithoutHostCopy { tensor: t.id },
                                });
                            }
                        }
                    } else {
                        dev_version = 0;
                    }
                    present = true;
                    alloc_at = Some(e.step);
                }
                EventKind::Read {
                    expected,
                    by_recompute,
                } => {
                    if !present {
                        let kind = if by_recompute {
                            ViolationKind::RecomputeInputMissing { tensor: t.id }
                        } else {
                            ViolationKind::ReadNotResident { tensor: t.id }
                        };
                        v.push(Violation { at, kind });
                    } else if dev_version != expected {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::StaleVersion {
                                tensor: t.id,
                                expected,
                                found: dev_version,
                            },
                        });
                    }
                }
                EventKind::Write { expected } => {
                    if !present {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::ReadNotResident { tensor: t.id },
                        });
                    } else if dev_version != expected {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::StaleVersion {
                                tensor: t.id,
                                expected,
                                found: dev_version,
                            },
                        });
                    }
                    dev_version = expected + 1;
                }
                EventKind::SwapOut => {
                    if !present {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::NotResident { tensor: t.id },
                        });
                    } else {
                        host_version = Some(dev_version);
                    }
                }
                EventKind::Free => {
                    if !present {
                        v.push(Violation {
                            at,
                            kind: ViolationKind::NotResident { tensor: t.id },
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
                            kind: ViolationKind::FreedWithoutHostCopy { tensor: t.id },
                        });
                    }
                    buffers.push(Buffer {
                        size_bytes: t.size_bytes,
                        alloc: if resident_from_start { None } else { alloc_at },
                        free: Some(e.step),
                    });
                    resident_from_start = false;
                    present = false;
                }
            }
        }
        if present {
            buffers.push(Buffer {
                size_bytes: t.size_bytes,
                alloc: if resident_from_start { None } else { alloc_at },
                free: None,
            });
        }
        // End of iteration.
        let final_version = writers[t.id.index()].len() as u32;
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
                        tensor: t.id,
                        expected: expected.into(),
                        found: describe(present, host_version),
                    },
                });
            }
        } else if present {
            v.push(Violation {
                at: None,
                kind: ViolationKind::EndResidency {
                    tensor: t.id,
                    expected: "freed".into(),
                    found: "still on the device".into(),
                },
            });
        }
    }

    check_budget(plan, &order, &buffers, &mut v);
    v
}

/// Bounds, at every allocating step, the bytes that may be resident while it runs.
fn check_budget(plan: &Plan, order: &Order, buffers: &[Buffer], v: &mut Vec<Violation>) {
    let layout = &order.layout;
    for s in Stream::ALL {
        let n = layout.len[s.index()];
        if n == 0 {
            continue;
        }
        let base = layout.offset[s.index()];
        let mut delta = vec![0i128; n + 1];
        for b in buffers {
            // Steps i on stream s with `step_i hb alloc` form a prefix: i <= vc[alloc][s].
            let lo = match b.alloc {
                None => 0,
                Some(a) => {
                    let ra = layout.step_ref(a);
                    if ra.stream == s {
                        ra.index as usize
                    } else {
                        (order.vc[a][s.index()] + 1) as usize
                    }
                }
            };
            // Steps with `free hb step_i` form a suffix; find its start by binary search.
            let hi = match b.free {
                None => n,
                Some(f) => {
                    let rf = layout.step_ref(f);
                    if rf.stream == s {
                        rf.index as usize + 1
                    } else {
                        let col = rf.stream.index();
                        let (mut lo_i, mut hi_i) = (0usize, n);
                        while lo_i < hi_i {
                            let mid = (lo_i + hi_i) / 2;
                            if order.vc[base + mid][col] >= rf.index as i64 {
                                hi_i = mid;
                            } else {
                                lo_i = mid + 1;
                            }
                        }
                        lo_i
                    }
                }
            };
            if lo < hi {
                delta[lo] += b.size_bytes as i128;
                delta[hi] -= b.size_bytes as i128;
            }
        }
        let mut cur: i128 = 0;
        let mut worst: Option<(usize, u64)> = None;
        for (i, step) in plan.stream(s).iter().enumerate() {
            cur += delta[i];
            let allocates = matches!(
                step.instr,
                Instr::Compute(_) | Instr::Recompute { .. } | Instr::SwapIn(_)
            );
            if allocates
                && cur > plan.budget_bytes as i128
                && worst.is_none_or(|(_, w)| cur as u64 > w)
            {
                worst = Some((i, cur as u64));
            }
        }
        if let Some((i, bytes)) = worst {
            v.push(Violation {
                at: Some(StepRef {
                    stream: s,
                    index: i as u32,
                }),
                kind: ViolationKind::OverBudget {
                    bytes,
                    budget_bytes: plan.budget_bytes,
                },
            });
        }
    }
}
