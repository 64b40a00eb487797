//! A large parameter kept on the device from its last read in the backward
//! pass to its update, the swap-ins that then no longer fit started later.
//!
//! Why: where the backward pass is bound by the h2d link, every byte that
//! crosses it twice costs twice. On the PyTorch GPT-2 export at a quarter
//! of its footprint the tied token embedding's weight (147 MiB) is read by
//! the LM head's backward `mm` right after the loss and updated last, at
//! the iteration's end; the fastest schedules drop it between the two and
//! fetch it again for the update (12.9 ms of the h2d link on
//! `v100-16gb-pcie3`, 2.8 ms on `h100-80gb`), while the link is the
//! bottleneck from the LM head to the end. Keeping it costs 147 MiB over
//! the whole backward pass, so the schedule no longer fits: the swap-ins
//! prefetched across the new peak (the optimizer states of the same
//! update, fetched early) have to start later. No move of the local
//! search does both at once: the gap dropped alone is 65-137 MiB over the
//! budget, and the repair moves (swaps and recomputations added) left a
//! 20 s search at 50 MiB over it on `h100-80gb` (a probe).
//!
//! [`kept_to_update`]: the swap gap of the largest persistent tensor that
//! lies inside the backward pass dropped, then, while `verify` puts the
//! peak over the budget, the swap-in prefetched across the peak whose use
//! is the furthest away is triggered right after it instead
//! ([`fit_by_delays`]). The caller (`turns`) polishes from there and takes
//! the result where it is faster.
//!
//! Measured in a probe on the `outcore` plan's schedule where the polish
//! had converged (54 s searches): `v100-16gb-pcie3` 0.2121 s to 0.2019 s
//! once fitted (one trigger moved), 0.1973 s after a 25 s continued search
//! and 0.1951 s after the polish (the plan without it: 0.2058 s); on
//! `h100-80gb` 0.04807 s to 0.04817 s once fitted (208 triggers moved) and
//! 0.04802 s after the same, no gain.

use super::local::Cost;
use super::moves::{Move, apply};
use crate::framework::ctx::backward_start;
use crate::framework::{Ctx, PeakAt, Score, Scratch, Search};
use outcore_cost::CostModel;
use outcore_plan::{Gap, Restore, Schedule};
use std::time::Instant;

/// At most this many swap-ins are triggered later to fit the kept tensor
/// (each costs a score and a lowering). On the GPT-2 export at 25% on
/// `h100-80gb` it took 208, one op at a time along the update's own
/// swap-ins' windows.
pub const MAX_DELAYS: usize = 512;

/// The position the swap-in of `g` waits for (`0` for one that starts with
/// the iteration: it is queued before any trigger).
fn trigger(g: &Gap) -> usize {
    g.prefetch_after.or(g.after).unwrap_or(0)
}

/// The gap whose drop keeps a tensor to its update: the swap gap of the
/// largest persistent tensor that starts in the backward pass and ends at a
/// use (the first of equals in gap order); `None` where there is none.
pub fn kept_gap(ctx: &Ctx<'_>, schedule: &Schedule) -> Option<usize> {
    let backward = backward_start(ctx.graph, &schedule.order);
    schedule
        .gaps
        .iter()
        .enumerate()
        .filter(|(_, g)| {
            g.how == Restore::Swap
                && ctx.persistent(g.tensor)
                && g.after.is_some_and(|a| a >= backward)
                && g.before.is_some()
        })
        // The least of the reversed sizes is the largest, the first of equals.
        .min_by_key(|(_, g)| std::cmp::Reverse(ctx.size(g.tensor)))
        .map(|(i, _)| i)
}

/// `schedule` with gap `gap` dropped (its tensor kept on the device over
/// it), fitted to the budget by [`fit_by_delays`]; `None` where it does
/// not fit within [`MAX_DELAYS`] or `deadline`.
pub fn kept_to_update(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    gap: usize,
    deadline: Instant,
) -> Option<(Schedule, Cost)> {
    let kept = apply(ctx, cost, schedule, Move::Drop { gap });
    fit_by_delays(search, kept, deadline)
}

/// `schedule` fitted to the budget by starting swap-ins later: while
/// `verify`'s peak is over the budget, at position `p` (or at a swap-in,
/// whose own trigger is then `p`), the swap-in whose trigger is at or
/// before `p` and whose use is the furthest after it is triggered after
/// the op at `p + 1` instead (its early copy-out, if delayed past that,
/// starts at its gap's start). Returns the fitted schedule and its cost;
/// `None` where it does not lower, no swap-in spans the peak, or it is
/// still over the budget after [`MAX_DELAYS`] delays or at `deadline`.
///
/// Why the furthest use: it is the swap-in that can start latest without
/// making compute wait (Belady's choice, applied to prefetches).
pub fn fit_by_delays(
    search: &Search<'_, '_>,
    mut schedule: Schedule,
    deadline: Instant,
) -> Option<(Schedule, Cost)> {
    let mut scratch = Scratch::default();
    for _ in 0..=MAX_DELAYS {
        let score = search.score(&schedule, &mut scratch).ok()?;
        match score {
            Score::Feasible { iter_time_s, .. } => {
                return Some((schedule, Cost::feasible(iter_time_s)));
            }
            Score::OverBudget { .. } if Instant::now() < deadline => {}
            _ => return None,
        }
        let p = match search.peak_at(&schedule, &score)? {
            PeakAt::Position(p) => p,
            PeakAt::SwapIn(t) => schedule
                .gaps
                .iter()
                .filter(|g| g.tensor == t && g.how == Restore::Swap && g.before.is_some())
                .map(trigger)
                .min()?,
        };
        let (j, _) = schedule
            .gaps
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                g.how == Restore::Swap && g.before.is_some_and(|b| b > p + 1) && trigger(g) <= p
            })
            .max_by_key(|(_, g)| g.before)?;
        let g = &mut schedule.gaps[j];
        let q = (p + 1).max(g.after.unwrap_or(0));
        if g.copy_out_after.is_some_and(|c| c >= q) {
            g.copy_out_after = None;
        }
        g.prefetch_after = Some(q);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_cost::{DeviceProfile, RooflineModel};
    use outcore_graph::{Graph, TensorId, zoo};
    use outcore_plan::PlanRequest;
    use std::time::Duration;

    /// A 6-layer MLP (batch 256, width 1024) in the graph's order, where
    /// every optimizer op runs after the whole backward pass: each weight
    /// is read last in the backward pass well before its update.
    fn mlp() -> Graph {
        let knobs = [("layers".to_string(), 6), ("hidden".to_string(), 1024)]
            .into_iter()
            .collect();
        zoo::build("mlp", Some(256), &knobs, None).expect("zoo mlp")
    }

    /// Positions in `order` of the ops that read or write `t`, ascending.
    fn uses(g: &Graph, order: &[outcore_graph::OpId], t: TensorId) -> Vec<usize> {
        (0..order.len())
            .filter(|&p| {
                let op = g.op(order[p]);
                op.inputs.contains(&t) || op.outputs.contains(&t)
            })
            .collect()
    }

    /// One swap gap per parameter, from its last read before its update to
    /// the update (the last use), its swap-in triggered after the op at
    /// `trigger(after, before)`.
    fn backward_gaps(
        g: &Graph,
        order: &[outcore_graph::OpId],
        trigger: fn(usize, usize) -> usize,
    ) -> Vec<Gap> {
        g.parameters()
            .filter_map(|w| {
                let u = uses(g, order, w.id);
                let (&before, rest) = u.split_last()?;
                let &after = rest.last()?;
                (before > after + 1).then(|| Gap {
                    tensor: w.id,
                    after: Some(after),
                    before: Some(before),
                    how: Restore::Swap,
                    prefetch_after: Some(trigger(after, before)),
                    reclaim_before: None,
                    copy_out_after: None,
                })
            })
            .collect()
    }

    /// The smallest budget (to 1 KiB) at which `schedule` scores feasible.
    fn least_budget(g: &Graph, cost: &RooflineModel, schedule: &Schedule) -> u64 {
        let fits = |budget: u64| {
            let request = PlanRequest::new(g, cost, budget);
            let ctx = Ctx::new(g, cost, schedule.order.clone());
            let search = Search::new(&ctx, &request, "outcore");
            matches!(
                search.score(schedule, &mut Scratch::default()),
                Ok(Score::Feasible { .. })
            )
        };
        let (mut lo, mut hi) = (0u64, 1u64 << 40);
        assert!(fits(hi));
        while hi - lo > 1024 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) { hi = mid } else { lo = mid }
        }
        hi
    }

    #[test]
    fn the_largest_parameter_gap_inside_the_backward_pass_is_the_one_kept() {
        let g = mlp();
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        let mut schedule = Schedule::in_graph_order(&g);
        let ctx = Ctx::new(&g, &cost, schedule.order.clone());
        let mut gaps = backward_gaps(&g, &schedule.order, |_, before| before - 1);
        // The largest parameter also gets a gap in the forward pass (from
        // its forward read to its first backward read): never the one kept.
        let largest = g
            .parameters()
            .max_by_key(|w| ctx.size(w.id))
            .expect("weights")
            .id;
        let u = uses(&g, &schedule.order, largest);
        gaps.retain(|gap| gap.tensor != largest);
        gaps.push(Gap {
            tensor: largest,
            after: Some(u[0]),
            before: Some(u[1]),
            how: Restore::Swap,
            prefetch_after: Some(u[1] - 1),
            reclaim_before: None,
            copy_out_after: None,
        });
        schedule.gaps = gaps;
        let kept = kept_gap(&ctx, &schedule).expect("a gap in the backward pass");
        let backward = backward_start(&g, &schedule.order);
        let chosen = &schedule.gaps[kept];
        assert!(chosen.after.is_some_and(|a| a >= backward), "{chosen:?}");
        assert_ne!(
            chosen.tensor, largest,
            "the forward gap is not inside the backward pass"
        );
        for gap in &schedule.gaps {
            if gap.after.is_some_and(|a| a >= backward) {
                assert!(ctx.size(gap.tensor) <= ctx.size(chosen.tensor), "{gap:?}");
            }
        }
        // Without such a gap there is nothing to keep.
        schedule.gaps.retain(|gap| gap.tensor == largest);
        assert_eq!(kept_gap(&ctx, &schedule), None);
    }

    #[test]
    fn swap_ins_prefetched_across_the_peak_start_later_until_the_schedule_fits() {
        let g = mlp();
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        let mut late = Schedule::in_graph_order(&g);
        late.gaps = backward_gaps(&g, &late.order, |_, before| before - 1);
        assert!(late.gaps.len() >= 4, "{:?}", late.gaps);
        // The least budget the late swap-ins fit: the same gaps with every
        // swap-in started at once after its copy-out hold each weight's
        // memory over its whole gap, so they do not fit it.
        let budget = least_budget(&g, &cost, &late);
        let mut early = late.clone();
        for gap in &mut early.gaps {
            gap.prefetch_after = gap.after;
        }
        let request = PlanRequest::new(&g, &cost, budget);
        let ctx = Ctx::new(&g, &cost, late.order.clone());
        let search = Search::new(&ctx, &request, "outcore");
        let score = search
            .score(&early, &mut Scratch::default())
            .expect("lowers");
        assert!(matches!(score, Score::OverBudget { .. }), "{score:?}");
        let far = Instant::now() + Duration::from_secs(600);
        let (fitted, fitted_cost) =
            fit_by_delays(&search, early.clone(), far).expect("delays make it fit");
        assert!(fitted_cost.is_feasible());
        match search.score(&fitted, &mut Scratch::default()) {
            Ok(Score::Feasible { iter_time_s, .. }) => assert_eq!(iter_time_s, fitted_cost.time_s),
            other => panic!("the fitted schedule does not fit: {other:?}"),
        }
        // Only triggers moved, each later or not at all, some of them.
        let mut moved = 0;
        for (a, b) in early.gaps.iter().zip(&fitted.gaps) {
            assert_eq!((a.tensor, a.after, a.before), (b.tensor, b.after, b.before));
            assert!(trigger(b) >= trigger(a), "{a:?} -> {b:?}");
            assert!(trigger(b) < b.before.unwrap(), "{b:?}");
            moved += usize::from(trigger(b) > trigger(a));
        }
        assert!(moved > 0);
        // Over the budget at its deadline it gives up.
        assert!(fit_by_delays(&search, early, Instant::now()).is_none());
    }

    #[test]
    fn a_kept_parameter_has_no_gap_left_and_the_result_fits() {
        let g = mlp();
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        let mut schedule = Schedule::in_graph_order(&g);
        schedule.gaps = backward_gaps(&g, &schedule.order, |after, _| after);
        let probe_ctx = Ctx::new(&g, &cost, schedule.order.clone());
        let gap = kept_gap(&probe_ctx, &schedule).expect("a gap");
        let tensor = schedule.gaps[gap].tensor;
        // The budget the schedule needs with that weight kept and every
        // other swap-in as late as it goes.
        let mut late = schedule.clone();
        late.gaps.remove(gap);
        for g in &mut late.gaps {
            g.prefetch_after = g.before.map(|b| b - 1);
        }
        let budget = least_budget(&g, &cost, &late);
        let request = PlanRequest::new(&g, &cost, budget);
        let ctx = Ctx::new(&g, &cost, schedule.order.clone());
        let search = Search::new(&ctx, &request, "outcore");
        // Kept, with the other swap-ins still at once after their
        // copy-outs, it does not fit.
        let unfitted = apply(&ctx, &cost, &schedule, Move::Drop { gap });
        let score = search
            .score(&unfitted, &mut Scratch::default())
            .expect("lowers");
        assert!(matches!(score, Score::OverBudget { .. }), "{score:?}");
        let far = Instant::now() + Duration::from_secs(600);
        let (kept, kept_cost) = kept_to_update(&search, &ctx, &cost, &schedule, gap, far)
            .expect("it fits once the other swap-ins start later");
        assert!(kept_cost.is_feasible());
        assert!(kept.gaps.iter().all(|g| g.tensor != tensor));
        assert_eq!(kept.gaps.len(), schedule.gaps.len() - 1);
    }
}
