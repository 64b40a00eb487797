//! The complete scheduling loop (TENSILE Algorithm 3, Sec. IV-F) for one job:
//! activity analysis (every tensor released after its last access, which the
//! live-bytes model does), then, each iteration, the peak analysis
//! (Algorithm 1) and either one swap (Algorithm 2, while swapping keeps
//! succeeding) or, once swapping has failed and the peak still exceeds the
//! budget, one MSPS recomputation (Sec. IV-D).
//!
//! Stopping rule: the loop ends when neither swapping nor recomputation
//! schedules anything, or (the paper's line 4) after more than
//! [`MIN_ITERATIONS_BEFORE_STALL_CHECK`] iterations when the peak fell by less
//! than [`STALL_FRACTION`] on average over the last [`STALL_WINDOW`] ones.
//! Deviation: the paper breaks the whole loop there; with one job and a
//! budget that returns a plan over budget when swapping stalls on many tiny
//! tensors (e.g. optimizer state), before recomputation (reached only once
//! swapping ends) is tried. So a stall during swapping ends the swapping
//! phase, its window restarts, and a stall during recomputation ends the loop.
//! When
//! swapping has failed and the peak fits, the paper's loop does nothing until
//! that rule fires; this loop stops at once (the same plan, sooner).
//! Swapping never needs the budget: as in the paper it lowers the peak as far
//! as hidden copies allow, and only recomputation is driven by the budget.

use super::access::AccessSequence;
use super::peak::{Peak, analyse, as_bytes, peak_of};
use super::recompute;
use super::replay;
use super::swap::{SwapState, schedule_peak};
use crate::framework::{Ctx, Shortfall, live_bytes};
use outcore_cost::CostModel;
use outcore_plan::{Gap, fmt_bytes};

/// Algorithm 3 line 4: iterations before the stall check applies.
pub const MIN_ITERATIONS_BEFORE_STALL_CHECK: usize = 100;
/// Algorithm 3 line 4: the least average relative peak reduction (0.05%).
pub const STALL_FRACTION: f64 = 0.0005;
/// Algorithm 3 line 4: the iterations the reduction is averaged over.
pub const STALL_WINDOW: usize = 3;

/// What the loop did, for the plan's settings and the tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub iterations: usize,
    pub swapped_tensors: usize,
    pub swap_gaps: usize,
    /// Updated parameters swapped out after their update and in next iteration.
    pub cross_iteration_swaps: usize,
    pub recomputations: usize,
    pub stopped_by_stall_rule: bool,
    pub first_peak_bytes: u64,
    pub final_peak_bytes: u64,
}

/// The gaps Algorithm 3 schedules under `budget_bytes`, or a shortfall when
/// the modelled peak still exceeds it.
pub fn schedule(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    budget_bytes: u64,
) -> (Summary, Result<Vec<Gap>, Shortfall>) {
    let tas = AccessSequence::new(ctx);
    let mut state = SwapState::new(ctx.graph.tensors.len());
    let mut released = vec![false; ctx.graph.tensors.len()];
    let mut gaps: Vec<Gap> = Vec::new();
    let mut summary = Summary::default();
    let (mut swap_ok, mut recompute_ok) = (true, true);
    let mut peaks: Vec<u64> = Vec::new();
    let mut peak = analyse(ctx, &gaps);
    summary.first_peak_bytes = peak.peak_bytes;
    while swap_ok || recompute_ok {
        if stalled(&peaks, summary.iterations) {
            summary.stopped_by_stall_rule = true;
            if !swap_ok {
                break;
            }
            // The stall ends the swapping phase; recomputation gets its turn.
            swap_ok = false;
            peaks.clear();
        }
        peaks.push(peak.peak_bytes);
        let new_gaps = if swap_ok {
            let lowers = |new: &[Gap]| lowers_and_hides(&tas, cost, &gaps, new, &peak);
            let new = schedule_peak(&tas, cost, &mut state, peak.position, &peak.tensors, lowers);
            swap_ok = !new.is_empty();
            if swap_ok {
                summary.swapped_tensors += 1;
                summary.swap_gaps += new.len();
                summary.cross_iteration_swaps += new.iter().filter(|g| g.before.is_none()).count();
            }
            new
        } else if peak.peak_bytes > budget_bytes {
            let best = recompute::candidates(&tas, &state, &released, peak.position, &peak.tensors)
                .into_iter()
                .next();
            recompute_ok = best.is_some();
            summary.recomputations += usize::from(recompute_ok);
            best.map(|c| recompute::take(&tas, &mut state, &c))
                .into_iter()
                .collect()
        } else {
            break;
        };
        for g in &new_gaps {
            released[g.tensor.index()] = true;
        }
        gaps.extend(new_gaps);
        summary.iterations += 1;
        peak = analyse(ctx, &gaps);
    }
    summary.final_peak_bytes = peak.peak_bytes;
    if peak.peak_bytes > budget_bytes {
        return (summary, Err(shortfall(ctx, &peak, budget_bytes)));
    }
    (summary, Ok(gaps))
}

/// Whether adding `new` to `gaps` is taken: the peak analysis after it is
/// lower (or, at a tie, the old peak point is lower: the greedy premise that
/// each scheduled tensor reduces the peak), and every copy, as the plan will
/// issue it, still ends before compute needs it ([`replay::hidden`]).
pub(crate) fn lowers_and_hides(
    tas: &AccessSequence<'_, '_>,
    cost: &dyn CostModel,
    gaps: &[Gap],
    new: &[Gap],
    peak: &Peak,
) -> bool {
    let ctx = tas.ctx;
    let mut trial = gaps.to_vec();
    trial.extend_from_slice(new);
    // One live-bytes pass gives both the new peak and the old peak point.
    let live = live_bytes(ctx, &trial);
    let (bytes, _) = peak_of(&live);
    let at_old_point = live.get(peak.position).copied().map_or(0, as_bytes);
    let lower =
        bytes < peak.peak_bytes || (bytes == peak.peak_bytes && at_old_point < peak.peak_bytes);
    lower && replay::hidden(tas, cost, &trial)
}

/// Algorithm 3 line 4 on the peaks seen so far.
pub(crate) fn stalled(peaks: &[u64], iterations: usize) -> bool {
    if iterations <= MIN_ITERATIONS_BEFORE_STALL_CHECK || peaks.len() <= STALL_WINDOW {
        return false;
    }
    let window = &peaks[peaks.len() - STALL_WINDOW - 1..];
    let reduction: f64 = window
        .windows(2)
        .map(|w| (w[0] as f64 - w[1] as f64) / (w[0].max(1) as f64))
        .sum::<f64>()
        / STALL_WINDOW as f64;
    reduction < STALL_FRACTION
}

fn shortfall(ctx: &Ctx<'_>, peak: &Peak, budget_bytes: u64) -> Shortfall {
    let op = &ctx.op_at(peak.position.min(ctx.n.saturating_sub(1))).name;
    Shortfall {
        needed_bytes: Some(peak.peak_bytes),
        at: Some(format!("op `{op}`")),
        message: format!(
            "after hidden swaps and MSPS recomputation the modelled peak at op `{op}` is {}, over the {} budget; nothing else at the peak can be swapped without a stall or recomputed from resident inputs",
            fmt_bytes(peak.peak_bytes),
            fmt_bytes(budget_bytes)
        ),
    }
}
