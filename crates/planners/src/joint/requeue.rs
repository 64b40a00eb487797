//! Reclaim points re-timed behind the d2h link's queue.
//!
//! A swap's reclaim point ([`outcore_plan::Gap::reclaim_before`]) is the op
//! that waits until the copy-out is done and the memory freed: what lets
//! `verify()` count the memory as free from there on. Each move that makes
//! a swap times its reclaim point by that one copy alone, as if the link
//! were idle (`moves::offload`, `moves::hidden_swap`). Where many copies
//! leave together the d2h stream runs them one after another, in the
//! lowering's order, and a reclaim point timed alone waits for the whole
//! queue before it. On the PyTorch GPT-2 export at a quarter of its
//! footprint, an MLP weight's update is followed by the copy-outs of the
//! weight and its two Adam moments (three 9 MiB copies, 2.4 ms on
//! `v100-16gb-pcie3`) while the next op waited for the last of them after
//! 0.06 ms of compute, layer after layer through the backward pass.
//!
//! [`reclaims_queued`] runs the copy-outs through one in-order queue on the
//! compute times of the order (no stalls) and moves each reclaim point
//! that comes before its copy is done to the first op that starts after
//! it. Only later: the memory is then held longer, which `verify()` counts,
//! so the caller scores the result and keeps it only where it is faster.

use super::moves::host_copy_current;
use crate::framework::Ctx;
use outcore_cost::CostModel;
use outcore_plan::{Restore, Schedule};

/// `schedule` with every swap's reclaim point moved, no earlier, to the
/// first op that starts once the in-order d2h queue has finished its
/// copy-out, but no later than the first op that starts `max_delay_s`
/// after the reclaim point did, nor after the gap's end (the last position
/// for a gap open to the iteration's end). The queue runs copy-outs in the
/// lowering's order: by the position they start after (an early copy-out's,
/// [`outcore_plan::Gap::copy_out_after`], before a gap's own at the same
/// position, a delayed one's after them by its reclaim point), then by
/// tensor; each starts when that op ends and the one
/// before it is done. A swap whose host copy is current has no copy-out
/// and is left as it is. Returns how many reclaim points moved with the
/// schedule; `None` where none does.
pub fn reclaims_queued(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    max_delay_s: f64,
) -> Option<(usize, Schedule)> {
    let current = host_copy_current(ctx, &schedule.gaps);
    // (position, early / own / delayed, the key within those, tensor, gap).
    let mut queue: Vec<(usize, u8, u32, u32, usize)> = schedule
        .gaps
        .iter()
        .enumerate()
        .filter(|&(i, g)| g.how == Restore::Swap && !current[i])
        .filter_map(|(i, g)| {
            let a = g.after?;
            let t = g.tensor.0;
            Some(match g.copy_out_after {
                Some(c) if c > a => {
                    let need = g.reclaim_before.or(g.before).map_or(u32::MAX, |p| p as u32);
                    (c, 2, need, t, i)
                }
                Some(c) => (c, 0, 0, t, i),
                None => (a, 1, 0, t, i),
            })
        })
        .collect();
    queue.sort_unstable();
    let mut out = schedule.clone();
    let mut clock_s = 0.0f64;
    let mut moved = 0;
    for (position, _, _, _, i) in queue {
        let g = &mut out.gaps[i];
        let begin_s = clock_s.max(ctx.prefix_time_s[position + 1]);
        clock_s = begin_s + cost.d2h_time_s(ctx.size(g.tensor));
        let Some(r) = g.reclaim_before else {
            continue;
        };
        let last = g.before.unwrap_or(ctx.n - 1);
        let at_s = clock_s.min(ctx.prefix_time_s[r] + max_delay_s);
        let queued = ctx.first_starting_from(r, last + 1, at_s).unwrap_or(last);
        if queued > r {
            g.reclaim_before = Some(queued);
            moved += 1;
        }
    }
    (moved > 0).then_some((moved, out))
}

/// The fastest of [`reclaims_queued`]'s variants of `schedule` that
/// `score` finds faster than `time_s` (its own time), over delays of
/// `compute_s / 1024` doubling up to `compute_s` (the order's compute
/// time), ascending until [`PATIENCE`] in a row are slower than the
/// fastest so far or over the budget (a longer delay holds more memory:
/// past some delay the schedule is over the budget, and stays so); one
/// as fast is a plateau and the sweep goes on.
///
/// Why a sweep: with no limit on the delay, every reclaim point waits for
/// the whole queue before it, and the memory held meanwhile put the
/// PyTorch GPT-2 export at a quarter of its footprint 30% over the budget;
/// the fastest limit differs between schedules of the same case (64 ops'
/// worth for one seed, 16 for another when counted in ops).
pub fn fastest_requeued(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    time_s: f64,
    score: &mut impl FnMut(&Schedule) -> Option<f64>,
) -> Option<Requeued> {
    let compute_s = ctx.prefix_time_s[ctx.n];
    let mut best: Option<Requeued> = None;
    let mut worse_in_a_row = 0;
    for k in 0..=STEPS {
        let delay_s = compute_s * 0.5f64.powi((STEPS - k) as i32);
        let Some((moved, candidate)) = reclaims_queued(ctx, cost, schedule, delay_s) else {
            continue;
        };
        let best_s = best.as_ref().map_or(time_s, |b| b.time_s);
        match score(&candidate) {
            Some(t) if t < best_s => {
                best = Some(Requeued {
                    time_s: t,
                    delay_s,
                    moved,
                    schedule: candidate,
                });
                worse_in_a_row = 0;
            }
            // As fast: a plateau (the queue's copies all fit the shorter
            // delay where it binds), go on.
            Some(t) if t == best_s => {}
            _ => {
                worse_in_a_row += 1;
                if worse_in_a_row == PATIENCE {
                    break;
                }
            }
        }
    }
    best
}

/// Doublings of the delay [`fastest_requeued`] tries (from a 1024th of the
/// compute time to all of it).
pub const STEPS: usize = 10;
/// [`fastest_requeued`] stops after this many delays in a row slower or
/// over the budget.
pub const PATIENCE: usize = 2;

/// A faster schedule with its reclaim points re-timed.
#[derive(Debug, Clone)]
pub struct Requeued {
    pub time_s: f64,
    /// The longest a reclaim point was moved by, in compute seconds.
    pub delay_s: f64,
    /// How many reclaim points moved.
    pub moved: usize,
    pub schedule: Schedule,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{mlp_chain_with, v100};
    use crate::framework::{Score, Search};
    use outcore_graph::builder::Optimizer;
    use outcore_graph::{TensorId, TensorKind};
    use outcore_plan::{PlanRequest, eager_update_order};

    /// The optimizer states of the `weights` weights updated first
    /// offloaded (in before their update, out after it), each reclaim point
    /// timed by its own copy alone.
    fn first_states_offloaded(ctx: &Ctx<'_>, weights: usize) -> Schedule {
        let mut states: Vec<(usize, TensorId)> = ctx
            .graph
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::OptimizerState && t.allocates())
            .map(|t| (ctx.uses[t.id.index()][0], t.id))
            .collect();
        states.sort_unstable();
        let gaps = states[..2 * weights]
            .iter()
            .flat_map(|&(first, t)| {
                let last = *ctx.uses[t.index()].last().expect("used");
                super::super::moves::offload(ctx, &v100(), t, first, last)
            })
            .collect();
        ctx.schedule(gaps)
    }

    #[test]
    fn reclaim_points_wait_for_the_copies_queued_before_them() {
        // In the eager-update order each weight's update runs inside the
        // backward pass and its two AdamW states (4 MiB, 0.36 ms each on the
        // test's v100 link) leave together after it, where the layer's
        // backward takes about 0.6 ms: alone each copy is covered by it, the
        // two together are not, and the three weights updated first load
        // the queue for 2.2 ms while the other five's backward leaves it
        // idle.
        let g = mlp_chain_with(8, 1024, 1024, Optimizer::adamw());
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, eager_update_order(&g));
        let offloaded = first_states_offloaded(&ctx, 3);
        let (moved, queued) =
            reclaims_queued(&ctx, &cost, &offloaded, f64::INFINITY).expect("some reclaim moves");
        let mut changed = 0;
        for (was, now) in offloaded.gaps.iter().zip(&queued.gaps) {
            assert_eq!(
                (was.tensor, was.after, was.before),
                (now.tensor, now.after, now.before)
            );
            if was.reclaim_before != now.reclaim_before {
                changed += 1;
                assert!(
                    now.reclaim_before > was.reclaim_before,
                    "{was:?} -> {now:?}"
                );
            }
        }
        assert_eq!(moved, changed);
        // The copy-outs (every gap open to the end copies: the states are
        // written by their updates) in queue order: the k-th cannot be done
        // before k + 1 copies have run one after another from the end of
        // the first one's op, so its reclaim point starts no earlier (or is
        // the last position, where an open gap's reclaim stops).
        let mut outs: Vec<&outcore_plan::Gap> =
            queued.gaps.iter().filter(|g| g.before.is_none()).collect();
        outs.sort_by_key(|g| (g.after, g.tensor));
        let first_end_s = ctx.prefix_time_s[outs[0].after.expect("after its update") + 1];
        for (k, g) in outs.iter().enumerate() {
            let r = g.reclaim_before.expect("timed");
            let done_s = first_end_s + (k + 1) as f64 * cost.d2h_time_s(ctx.size(g.tensor));
            assert!(
                r == ctx.n - 1 || ctx.prefix_time_s[r] >= done_s * (1.0 - 1e-12),
                "copy {k}: reclaim at {r} starts at {} s, before {done_s} s",
                ctx.prefix_time_s[r]
            );
        }
        // No delay allowed, nothing moves.
        assert!(reclaims_queued(&ctx, &cost, &offloaded, 0.0).is_none());
        // Still safe, and compute no longer waits for the queue where it
        // has the rest of the backward pass to drain in: faster (measured
        // 6.70 ms before, 6.37 ms after).
        let request = PlanRequest::new(&g, &cost, u64::MAX);
        let search = Search::new(&ctx, &request, "test");
        let score = |s: &Schedule| match search.score(s, &mut Default::default()) {
            Ok(Score::Feasible { iter_time_s, .. }) => iter_time_s,
            other => panic!("{other:?}"),
        };
        let (was_s, now_s) = (score(&offloaded), score(&queued));
        assert!(now_s < was_s, "{now_s} vs {was_s}");
        // The sweep finds it (or a faster limit) and says by how much.
        let mut scored = |s: &Schedule| Some(score(s));
        let best = fastest_requeued(&ctx, &cost, &offloaded, was_s, &mut scored).expect("faster");
        assert!(best.time_s <= now_s && best.moved > 0 && best.delay_s > 0.0);
    }
}
