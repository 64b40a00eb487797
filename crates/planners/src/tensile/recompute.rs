//! Recomputation scheduling (TENSILE Sec. IV-D): when swapping is exhausted and
//! the peak still exceeds the memory, the peak tensor with the largest MSPS
//! (memory saving per second of recomputation, Capuchin's metric, Eq. 4) is
//! released after its access before the peak and recomputed before its next
//! access.
//!
//! "Only tensor accesses which have never been released": the tensor has no
//! swap or recomputation gap yet, and neither has any input of its producer,
//! each of which must be resident (inside its own lifetime) at the
//! recomputation; those inputs are then pinned there, so no later decision
//! releases them. A recomputation therefore never triggers another swap-in or
//! recomputation and never disturbs the swap plan already made.
//!
//! Choices where the paper is vague:
//! - The memory saving is the tensor's size (what leaves the device over the
//!   gap); the recomputation time is its producer's op time.
//! - Producers that write in place, have an output that does not allocate, or
//!   whose inputs are written in place between the producer and the reuse, are
//!   not recomputed (the recomputed value would differ).
//! - One recomputation per Algorithm 3 iteration, the peak re-analysed between.

use super::access::AccessSequence;
use super::swap::SwapState;
use crate::framework::decisions::recompute_gap;
use crate::framework::pressure::pinned_inside;
use outcore_graph::TensorId;
use outcore_plan::Gap;

/// A recomputation candidate at a peak.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub tensor: TensorId,
    pub after: usize,
    pub before: usize,
    /// Bytes saved per second of recomputation.
    pub msps: f64,
}

/// The candidates among the peak tensors at `q`, largest MSPS first.
pub fn candidates(
    tas: &AccessSequence<'_, '_>,
    state: &SwapState,
    released: &[bool],
    q: usize,
    peak_tensors: &[TensorId],
) -> Vec<Candidate> {
    let ctx = tas.ctx;
    let mut out: Vec<Candidate> = peak_tensors
        .iter()
        .filter_map(|&t| {
            if released[t.index()] || ctx.persistent(t) || ctx.graph.tensor(t).is_output {
                return None;
            }
            let (Some(a), Some(b)) = tas.around(t, q) else {
                return None;
            };
            if pinned_inside(&state.pins[t.index()], Some(a), Some(b), ctx.n) {
                return None;
            }
            let time_s = recompute_time_s(tas, released, t, b)?;
            Some(Candidate {
                tensor: t,
                after: a,
                before: b,
                msps: ctx.size(t) as f64 / time_s.max(f64::MIN_POSITIVE),
            })
        })
        .collect();
    out.sort_by(|x, y| y.msps.total_cmp(&x.msps).then(x.tensor.cmp(&y.tensor)));
    out
}

/// The producer's op time when recomputing `t` at `b` needs only inputs that
/// were never released and are resident at `b` with their original values.
fn recompute_time_s(
    tas: &AccessSequence<'_, '_>,
    released: &[bool],
    t: TensorId,
    b: usize,
) -> Option<f64> {
    let ctx = tas.ctx;
    let graph = ctx.graph;
    let p = graph.tensor(t).producer?;
    let op = graph.op(p);
    if !op.recomputable
        || op.outputs.iter().any(|&o| {
            let o = graph.tensor(o);
            !o.allocates() || o.inplace_update_of.is_some()
        })
    {
        return None;
    }
    let p_pos = ctx.position(p);
    for &x in &op.inputs {
        let x = graph.storage_owner(x);
        let (lo, hi) = ctx.base_interval(x);
        let resident = lo <= b && b <= hi && !released[x.index()];
        let rewritten = ctx.writes[x.index()].iter().any(|&w| w > p_pos && w <= b);
        if !resident || rewritten {
            return None;
        }
    }
    Some(ctx.op_time_s[p_pos])
}

/// Takes the best candidate: its gap, its producer's inputs pinned at the reuse.
pub fn take(tas: &AccessSequence<'_, '_>, state: &mut SwapState, c: &Candidate) -> Gap {
    let graph = tas.ctx.graph;
    if let Some(p) = graph.tensor(c.tensor).producer {
        for &x in &graph.op(p).inputs {
            state.pins[graph.storage_owner(x).index()].push(c.before);
        }
    }
    gap(c)
}

/// The recomputation gap of a candidate (what [`take`] schedules, without
/// pinning anything).
pub fn gap(c: &Candidate) -> Gap {
    recompute_gap(c.tensor, c.after, c.before)
}
