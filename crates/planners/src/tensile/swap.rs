//! Swap scheduling (TENSILE Algorithm 2, Sec. IV-C): the largest tensor resident
//! at the memory peak is swapped out after its access before the peak and back
//! in before its next access, each copy placed in a free slot of its link
//! direction so that no copy ever makes compute wait.
//!
//! Feasible intervals (Sec. IV-C): the swap-out starts after the access before
//! the peak ends (its TGA or last TUA) and must end by the time the peak op
//! starts; the swap-in starts after the peak op ends and after the swap-out,
//! and must end by the time the next access starts. The swap-out goes as early
//! as possible, the swap-in as late as possible. When the swap-in finds no
//! slot, the swap-out is withdrawn (Alg. 2 lines 17-20); a later swap-out
//! could only shrink the swap-in's window, so the retry loop of lines 32-33
//! ends there and the next peak tensor is tried.
//!
//! Optimizer-updated parameters (Alg. 2 lines 8-9, 26-27): when the peak lies
//! after the update (the last access) or before the first use, the parameter
//! is swapped out after the update and swapped in before its first use in the
//! next iteration. The Plan expresses this with two gaps, one to the end of the
//! iteration (`before: None`) and one from its start (`after: None`), and the
//! parameter starts the iteration on the host. Where the copy-out has no
//! room before the iteration ends, it is copied out from the next
//! iteration's start instead (one gap from op 0 to the first use; the
//! parameter starts the iteration on the device; see `from_the_start`).
//!
//! Choices where the paper is vague:
//! - One tensor is scheduled per call (per Algorithm 3 iteration): the paper
//!   says each scheduled tensor changes the peak and the peak is re-analysed
//!   between swaps, so later MPT entries of a stale peak are not tried.
//! - A tensor is taken only if the peak analysis after it is lower (or, at a
//!   tie, the old peak point is lower): the paper's greedy premise that each
//!   scheduled tensor reduces the peak. A swap absent at the peak always
//!   passes since the peak analysis is the live bytes alone (see
//!   [`super::peak`]); the check states the premise and guards it.
//!   It is also taken only if every copy, as the plan issues it, still ends
//!   before compute needs it ([`super::replay`]): the slots choose the
//!   trigger ops, the replay checks Alg. 2's "no stall" on what will run.
//! - Line 34 ("swap in the rest of the accesses greedily"): after a success,
//!   every later gap of at least one op between consecutive accesses of the
//!   same tensor is swapped too where both copies fit free link slots.
//! - Times come from the cost model's op times on the compute-only timeline;
//!   the max swapping rate (a multi-job priority) does not apply to one job.
//! - A swap-in's end: compute waits for the copy at the tensor's next
//!   access, the end of the feasible interval. The slot is placed to end
//!   before that access starts, and the replay checks that it does as
//!   issued. (From 2026-11-23 to 2026-12-02 the gap ended earlier, at the
//!   first op starting once the slot had ended, because `verify` then
//!   summed every allocation between the trigger and the waiting op beside
//!   the copy and a shorter window lowered that sum. Verify now takes the
//!   maximum over the window, which the live bytes count (see
//!   [`super::peak`]), so the early end bought no memory and only left the
//!   copy less room. `tensile_table -- protocol`, 2026-12-02, with the
//!   window view gone from the peak analysis: MSR 0.2516 / 0.2068 on
//!   Inception v4 / DenseNet-121 with the access as the waiting op, 0.2504
//!   / 0.2064 with the early end, equal on the other three.)
//! - Each copy is priced one way or at the duplex rate and placed so that it
//!   never runs slower than priced ([`super::link`]).

use super::access::AccessSequence;
use super::link::{Link, Side, Slot};
use crate::framework::pressure::pinned_inside;
use outcore_cost::CostModel;
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore};
use std::collections::HashSet;

/// Link timelines and the gaps already taken, across Algorithm 3 iterations.
#[derive(Debug, Clone, Default)]
pub struct SwapState {
    pub d2h: Link,
    pub h2d: Link,
    /// `(tensor, access before the gap)` of every gap scheduled.
    pub gapped: HashSet<(TensorId, usize)>,
    /// Per tensor: positions where a recomputation reads it (it must stay).
    pub pins: Vec<Vec<usize>>,
}

impl SwapState {
    pub fn new(n_tensors: usize) -> Self {
        SwapState {
            pins: vec![Vec::new(); n_tensors],
            ..SwapState::default()
        }
    }
}

/// Algorithm 2 on one peak: the gaps of the first peak tensor (largest first)
/// that can be swapped without stalling and that `lowers` accepts (the peak
/// goes down), or none. A rejected tensor's link slots are given back.
pub fn schedule_peak(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    peak_position: usize,
    peak_tensors: &[TensorId],
    lowers: impl Fn(&[Gap]) -> bool,
) -> Vec<Gap> {
    for &t in peak_tensors {
        let before = state.clone();
        let gaps = schedule_tensor(tas, cost, state, t, peak_position);
        if gaps.is_empty() {
            continue;
        }
        if lowers(&gaps) {
            return gaps;
        }
        *state = before;
    }
    Vec::new()
}

/// Swaps `t` around the peak at `q` and, on success, its later gaps too.
fn schedule_tensor(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    t: TensorId,
    q: usize,
) -> Vec<Gap> {
    let ctx = tas.ctx;
    if ctx.graph.tensor(t).is_output {
        return Vec::new();
    }
    match tas.around(t, q) {
        (Some(a), Some(b)) => {
            let Some(first) = in_iteration(tas, cost, state, t, a, b, Some(q)) else {
                return Vec::new();
            };
            let mut gaps = vec![first];
            gaps.extend(rest_of_accesses(tas, cost, state, t, b));
            gaps
        }
        _ if tas.updated_parameter(t) => across_iterations(tas, cost, state, t, q),
        _ => Vec::new(),
    }
}

/// A swap over the accesses `a < b`, absent at `absent_at` when given (else
/// at some position between them); `None` when a copy would stall compute.
pub fn in_iteration(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    t: TensorId,
    a: usize,
    b: usize,
    absent_at: Option<usize>,
) -> Option<Gap> {
    if b < a + 2
        || state.gapped.contains(&(t, a))
        || pinned_inside(&state.pins[t.index()], Some(a), Some(b), tas.ctx.n)
    {
        return None;
    }
    let size = tas.ctx.size(t);
    let times = CopyTimes::of(cost, size);
    let out_latest_s = absent_at.map_or(tas.start_s(b), |q| tas.start_s(q));
    let out = times.place_out(state, (tas.end_s(a), out_latest_s))?;
    let out_end_s = out.end_s();
    let in_earliest_s = absent_at.map_or(out_end_s, |q| out_end_s.max(tas.end_s(q)));
    let (d2h, swap_in) = times.place_in(state, out, (in_earliest_s, tas.start_s(b)))?;
    let in_start_s = swap_in.start_s;
    // The op that waits for the swap-out (it has ended by then), and the op
    // after which the swap-in starts; the tensor is absent in between.
    let reclaim = tas.first_starting_at(out_end_s).max(a + 1);
    let trigger = tas.last_ending_by(in_start_s)?.min(b - 1);
    let absent_ok = match absent_at {
        Some(q) => reclaim <= q && q <= trigger,
        None => reclaim <= trigger,
    };
    if !absent_ok || trigger < a {
        return None;
    }
    state.d2h = d2h;
    state.h2d.reserve(swap_in);
    state.gapped.insert((t, a));
    Some(Gap {
        tensor: t,
        after: Some(a),
        before: Some(b),
        how: Restore::Swap,
        prefetch_after: Some(trigger),
        reclaim_before: Some(reclaim),
        copy_out_after: None,
    })
}

/// Alg. 2 line 34: the later gaps between consecutive accesses from `b` on.
fn rest_of_accesses(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    t: TensorId,
    b: usize,
) -> Vec<Gap> {
    let later: Vec<usize> = tas
        .accesses(t)
        .iter()
        .copied()
        .filter(|&u| u >= b)
        .collect();
    later
        .windows(2)
        .filter_map(|w| in_iteration(tas, cost, state, t, w[0], w[1], None))
        .collect()
}

/// An updated parameter swapped out after its update (the last access) and in
/// before its first use of the next iteration, absent at the peak `q` (which
/// lies after the update or before the first use); where the peak precedes
/// the first use and the copy-out has no room after the update, copied out
/// from the iteration's start instead (`from_the_start`).
pub fn across_iterations(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    t: TensorId,
    q: usize,
) -> Vec<Gap> {
    let (Some(&first), Some(&last)) = (tas.accesses(t).first(), tas.accesses(t).last()) else {
        return Vec::new();
    };
    if first == 0 || state.gapped.contains(&(t, last)) {
        return Vec::new();
    }
    let pins = &state.pins[t.index()];
    if pins.iter().any(|&p| p > last || p < first) {
        return Vec::new();
    }
    let after_last = q > last;
    let paper = after_the_update(tas, cost, state, t, first, last, q);
    if !paper.is_empty() || after_last {
        return paper;
    }
    from_the_start(tas, cost, state, t, first, last, q)
        .into_iter()
        .collect()
}

/// [`across_iterations`] as the paper places it: out right after the update
/// `last`, in before `first`.
fn after_the_update(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    t: TensorId,
    first: usize,
    last: usize,
    q: usize,
) -> Vec<Gap> {
    let ctx = tas.ctx;
    let size = ctx.size(t);
    let times = CopyTimes::of(cost, size);
    let after_last = q > last;
    // Out after the update; by the peak when it follows the update, else by
    // the end of the iteration.
    let out_latest_s = if after_last {
        tas.start_s(q)
    } else {
        tas.iteration_s()
    };
    let Some(out) = times.place_out(state, (tas.end_s(last), out_latest_s)) else {
        return Vec::new();
    };
    // In before the first use; after the peak when the peak precedes it.
    let in_earliest_s = if after_last { 0.0 } else { tas.end_s(q) };
    let Some((d2h, swap_in)) = times.place_in(state, out, (in_earliest_s, tas.start_s(first)))
    else {
        return Vec::new();
    };
    let in_start_s = swap_in.start_s;
    let out_end_s = out.end_s();
    let reclaim = tas.first_starting_at(out_end_s).max(last + 1);
    let trigger = tas.last_ending_by(in_start_s).unwrap_or(0).min(first - 1);
    let absent_ok = if after_last {
        reclaim <= q
    } else {
        q <= trigger
    };
    if !absent_ok {
        return Vec::new();
    }
    state.d2h = d2h;
    state.h2d.reserve(swap_in);
    state.gapped.insert((t, last));
    vec![
        Gap {
            tensor: t,
            after: Some(last),
            before: None,
            how: Restore::Swap,
            prefetch_after: None,
            // No op waits when the copy ends with the iteration.
            reclaim_before: (reclaim < ctx.n).then_some(reclaim),
            copy_out_after: None,
        },
        Gap {
            tensor: t,
            after: None,
            before: Some(first),
            how: Restore::Swap,
            prefetch_after: Some(trigger),
            reclaim_before: None,
            copy_out_after: None,
        },
    ]
}

/// [`across_iterations`] with the peak `q` before the first use `first`,
/// where the copy-out has no room between the update `last` and the
/// iteration's end: the parameter stays on the device from its update to
/// the iteration's end and is copied out from the next iteration's start
/// instead (after its first op), done by the peak, and back in after the
/// peak, done before `first` ([`in_iteration`] over a gap from op 0).
///
/// A choice where the paper's setting and ours differ: the paper runs
/// iterations back to back, so its copy-out started after the update runs on
/// into the next iteration's forward pass; the simulator ends an iteration
/// when its last copy has ended, so a copy-out that cannot end by then would
/// stretch the iteration. Started at the next iteration's start, the same
/// bytes cross the link where the paper's copy would still be running, later
/// by the ops after the update. On VGG-16 (batch 16, `a6000-48gb`) this is
/// the classifier's momentum buffers (411 MB each, a 16.5 ms copy) with 4.4
/// ms left after their updates, resident at the peak 27 ms into the next
/// iteration (RESULTS.md, TENSILE single job).
fn from_the_start(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    state: &mut SwapState,
    t: TensorId,
    first: usize,
    last: usize,
    q: usize,
) -> Option<Gap> {
    if q >= first || state.gapped.contains(&(t, 0)) {
        return None;
    }
    let gap = in_iteration(tas, cost, state, t, 0, first, Some(q))?;
    // Neither form again for this tensor.
    state.gapped.insert((t, last));
    Some(gap)
}

/// Seconds of a swap-out and of a swap-in of one tensor, each alone on the
/// link (`one_way`) and beside a copy in the other direction (`duplex`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyTimes {
    pub out_one_way_s: f64,
    pub out_duplex_s: f64,
    pub in_one_way_s: f64,
    pub in_duplex_s: f64,
}

impl CopyTimes {
    /// `latency + size / rate` at the cost model's rates.
    pub fn of(cost: &dyn CostModel, size_bytes: u64) -> Self {
        let rates = cost.copy_rates();
        let bytes = size_bytes as f64;
        // Index 0 is host-to-device, 1 device-to-host (`CopyRates`).
        let at = |rate: f64| rates.latency_s + bytes / rate;
        CopyTimes {
            out_one_way_s: at(rates.one_way_bytes_per_s[1]),
            out_duplex_s: at(rates.duplex_bytes_per_s[1]),
            in_one_way_s: at(rates.one_way_bytes_per_s[0]),
            in_duplex_s: at(rates.duplex_bytes_per_s[0]),
        }
    }

    /// The swap-out's slot, as early as possible in `window_s`.
    fn place_out(&self, state: &SwapState, window_s: (f64, f64)) -> Option<Slot> {
        state.d2h.place(
            &state.h2d,
            Side::Earliest,
            window_s,
            self.out_one_way_s,
            self.out_duplex_s,
        )
    }

    /// The swap-in's slot, as late as possible in `window_s`, placed with the
    /// swap-out `out` already on the d2h timeline; returns that timeline too.
    fn place_in(&self, state: &SwapState, out: Slot, window_s: (f64, f64)) -> Option<(Link, Slot)> {
        let mut d2h = state.d2h.clone();
        d2h.reserve(out);
        let slot = state.h2d.place(
            &d2h,
            Side::Latest,
            window_s,
            self.in_one_way_s,
            self.in_duplex_s,
        )?;
        Some((d2h, slot))
    }
}
