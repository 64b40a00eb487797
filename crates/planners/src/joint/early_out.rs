//! Offloaded persistent tensors copied out early in the next iteration
//! instead of right after their update.
//!
//! An offload ([`super::moves::offload`]) keeps a persistent tensor on the host
//! between iterations: copied in before its first use and out after its last.
//! For an optimizer state both uses are its update, late in the iteration, so
//! both copies load the link in the backward pass, where the swap-ins of the
//! activations need it, and the last updates' copy-outs run after the last op
//! (the iteration waits for them). Turned around, the state stays on the
//! device from its update to the iteration's end and is copied out early in
//! the next iteration, before its first use ([`outcore_plan::Gap::after`]),
//! while the forward pass leaves the link mostly idle: the same bytes cross
//! the link, the copy-out in the other half of the iteration. The lower
//! bound (`outcore-bound`'s cut program) has allowed this since it splits
//! the updated tensors' copy-outs before and after its cut; no schedule could
//! express it before.
//!
//! The price is memory: the state is resident from its update to the end and
//! from the start to its copy-out. A state updated early in the backward pass
//! pays the most, so [`turned_around`] turns around the states updated
//! latest first, as many as asked; [`super::Joint`] scores a few counts and
//! keeps the fastest as a seed.
//!
//! What is turned around is any persistent tensor offloaded this way whose
//! first use is in the backward pass or later ([`candidates`]): in practice
//! optimizer states, since a parameter's first use is in the forward pass.

use super::moves::link_use;
use crate::framework::Ctx;
use crate::tensile::link::{earliest_slot, latest_slot};
use outcore_cost::CostModel;
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore, Schedule};

/// A persistent tensor offloaded between iterations whose first use is in
/// the backward pass or later: the two gaps of its offload and that use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offloaded {
    pub tensor: TensorId,
    /// Its first use, where its copy-in is waited for.
    pub first: usize,
}

/// The tensors of `schedule` that [`turned_around`] can turn around, latest
/// first use first: persistent tensors whose only gaps are an offload's two
/// (swapped in from the iteration's start before their first use, out after
/// their last for the next iteration), first used at or after
/// `ctx.backward_start`. A tensor first used in the forward pass is left
/// alone: copied out early in the iteration it would have to come back at
/// once.
pub fn candidates(ctx: &Ctx<'_>, schedule: &Schedule) -> Vec<Offloaded> {
    let mut by_tensor: Vec<&Gap> = schedule.gaps.iter().collect();
    by_tensor.sort_by_key(|g| g.tensor);
    let mut out: Vec<Offloaded> = by_tensor
        .chunk_by(|a, b| a.tensor == b.tensor)
        .filter_map(|gaps| {
            let swap = |after: bool, before: bool| {
                gaps.iter().find(|g| {
                    g.how == Restore::Swap
                        && g.after.is_some() == after
                        && g.before.is_some() == before
                })
            };
            let (t, first) = (gaps[0].tensor, swap(false, true)?.before?);
            swap(true, false)?;
            (gaps.len() == 2
                && ctx.persistent(t)
                && first >= ctx.backward_start
                && ctx.uses[t.index()].first() == Some(&first))
            .then_some(Offloaded { tensor: t, first })
        })
        .collect();
    out.sort_by_key(|o| (std::cmp::Reverse(o.first), o.tensor));
    out
}

/// `schedule` with the first `count` of `chosen` (see [`candidates`])
/// turned around: each one's two offload gaps replaced by one gap from early
/// in the iteration to its first use, its copies placed where the other
/// swaps leave the link idle (`placed_early`), the earliest-needed placed
/// first; one that finds no room on the link keeps its offload. `None` when
/// none finds room, or where the d2h stream would finish a copy-out after
/// its tensor's first use begins.
pub fn turned_around(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    chosen: &[Offloaded],
    count: usize,
) -> Option<Schedule> {
    let mut turned: Vec<Offloaded> = chosen[..count.min(chosen.len())].to_vec();
    turned.sort_by_key(|o| (o.first, o.tensor));
    let mut gaps: Vec<Gap> = schedule
        .gaps
        .iter()
        .filter(|g| !turned.iter().any(|o| o.tensor == g.tensor))
        .cloned()
        .collect();
    let others = gaps.len();
    let mut kept: Vec<Gap> = Vec::new();
    for o in &turned {
        let own = || {
            schedule
                .gaps
                .iter()
                .filter(|g| g.tensor == o.tensor)
                .cloned()
        };
        // A state the link has no room for keeps its offload.
        let Some(mut gap) = placed_early(ctx, cost, &gaps, o.tensor, o.first) else {
            kept.extend(own());
            continue;
        };
        // The copy-in keeps the seed's trigger (timed by the seed among its
        // other swap-ins), moved to the reclaim point where it is before it.
        let seed_trigger = own()
            .find(|g| g.after.is_none())
            .and_then(|g| g.prefetch_after);
        if let (Some(q), Some(r)) = (seed_trigger, gap.reclaim_before) {
            gap.prefetch_after = Some(q.max(r).min(o.first - 1));
        }
        gaps.push(gap);
    }
    if gaps.len() == others {
        return None;
    }
    let [busy_out, _] = link_use(ctx, cost, &gaps[..others]);
    reclaimed_in_stream_order(ctx, cost, &busy_out, &mut gaps[others..])?;
    let now_on_device: Vec<TensorId> = gaps[others..].iter().map(|g| g.tensor).collect();
    gaps.extend(kept);
    Some(Schedule {
        order: schedule.order.clone(),
        gaps,
        // As the seed's, less the tensors that now begin on the device (a
        // seed may list tensors with no gap as on the host).
        initial_residency: schedule
            .initial_residency
            .iter()
            .filter(|(t, _)| !now_on_device.contains(t))
            .copied()
            .collect(),
    })
}

/// The gap that copies persistent `t` (on the device at the iteration's
/// start) out early and back before its first use `first`, timed around the
/// copies of `others` as [`moves::placed_swap`] times a swap: the copy-out in
/// the earliest stretch of the d2h link after the first op that overlaps none
/// of theirs, started after the last op that ends by then (so that the
/// in-order d2h stream meets it among the others where it was placed, not
/// ahead of them all), the memory reclaimed by the first op that starts after
/// it is done; the copy-in in the latest stretch that ends by `first`'s
/// start, started after the last op that ends by then and not before the
/// reclaim (just before `first` where the reclaim is `first` itself).
/// `None` when the link has no such stretch before `first`.
pub(crate) fn placed_early(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    others: &[Gap],
    t: TensorId,
    first: usize,
) -> Option<Gap> {
    let start_s = |p: usize| ctx.prefix_time_s[p];
    let size_bytes = ctx.size(t);
    let out_s = cost.d2h_time_s(size_bytes);
    let in_s = cost.h2d_time_s(size_bytes);
    let [busy_out, busy_in] = link_use(ctx, cost, others);
    let out_begin_s = earliest_slot(&busy_out, ctx.prefix_time_s[1], start_s(first), out_s)?;
    // Op 0 ends by the slot's start: at least one op does.
    let after = ctx.ending_by(first, out_begin_s).checked_sub(1)?;
    // The reclaim may be the first use itself (its swap-in then waits for
    // the copy-out, and the use for the swap-in).
    let reclaim = ctx.first_starting_from(after + 1, first + 1, out_begin_s + out_s)?;
    let prefetch = latest_slot(&busy_in, 0.0, start_s(first), in_s)
        .map_or(reclaim, |s| ctx.ending_by(first, s).saturating_sub(1))
        .max(reclaim)
        .min(first - 1);
    Some(Gap {
        tensor: t,
        after: Some(after),
        before: Some(first),
        how: Restore::Swap,
        prefetch_after: Some(prefetch),
        reclaim_before: Some(reclaim),
        copy_out_after: None,
    })
}

/// Sets the reclaim points of the turned-around gaps `turned` (and their
/// copy-ins' triggers, not before them) where the in-order d2h stream
/// finishes their copy-outs: it runs them by start position and then by
/// tensor (the lowering's order within a position), each when its op has
/// ended, the one before it is done, and the other swaps' copy-outs
/// (`busy_out`) leave room. [`placed_early`] places each copy-out in a
/// stretch of its own, but copies that start after the same op leave in
/// tensor order, not in the order they were placed: with the reclaim points
/// of the placement, on the PyTorch GPT-2 export an op near the start waited
/// half a millisecond for copy-outs it had not been timed behind. `None`
/// where one finishes after its tensor's first use begins.
fn reclaimed_in_stream_order(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    busy_out: &[(f64, f64)],
    turned: &mut [Gap],
) -> Option<()> {
    turned.sort_by_key(|g| (g.after, g.tensor));
    let mut clock_s = 0.0f64;
    for g in turned.iter_mut() {
        let (after, first) = (g.after?, g.before?);
        let out_s = cost.d2h_time_s(ctx.size(g.tensor));
        let ready_s = ctx.prefix_time_s[after + 1].max(clock_s);
        let begin_s = earliest_slot(busy_out, ready_s, f64::INFINITY, out_s)?;
        clock_s = begin_s + out_s;
        let reclaim = ctx.first_starting_from(after + 1, first + 1, clock_s)?;
        g.reclaim_before = Some(reclaim);
        g.prefetch_after = g.prefetch_after.map(|q| q.max(reclaim).min(first - 1));
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{mlp_chain_with, v100};
    use outcore_graph::TensorKind;
    use outcore_graph::builder::Optimizer;

    /// Every optimizer state offloaded (copied in before its update, out
    /// after it).
    fn states_offloaded(ctx: &Ctx<'_>) -> Schedule {
        let gaps = ctx
            .graph
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::OptimizerState && t.allocates())
            .flat_map(|t| {
                let u = &ctx.uses[t.id.index()];
                super::super::moves::offload(ctx, &v100(), t.id, u[0], *u.last().expect("used"))
            })
            .collect();
        ctx.schedule(gaps)
    }

    #[test]
    fn turned_around_states_leave_early_and_repeat_across_iterations() {
        // Two AdamW states per weight.
        let g = mlp_chain_with(8, 512, 8192, Optimizer::adamw());
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let offloaded = states_offloaded(&ctx);
        let chosen = candidates(&ctx, &offloaded);
        let states = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::OptimizerState && t.allocates())
            .count();
        assert_eq!(chosen.len(), states, "every state's offload is a candidate");
        assert!(chosen.windows(2).all(|w| w[0].first >= w[1].first));
        let turned = turned_around(&ctx, &cost, &offloaded, &chosen, chosen.len()).expect("room");
        assert_eq!(
            turned.gaps.len(),
            states,
            "one gap per state instead of two"
        );
        assert!(
            turned.initial_residency.is_empty(),
            "every state starts on the device"
        );
        for g in &turned.gaps {
            let first = ctx.uses[g.tensor.index()][0];
            let (a, r, p) = (
                g.after.expect("early"),
                g.reclaim_before.expect("timed"),
                g.prefetch_after.expect("timed"),
            );
            assert!(
                a < r && r <= p && p < first && g.before == Some(first),
                "{g:?}"
            );
            // Copied out in the forward pass, where the first offload's
            // copy-out ran after the update.
            assert!(a < ctx.backward_start, "{g:?}");
        }
        let plan = outcore_plan::lower_schedule(&g, &turned, info(), u64::MAX).expect("lowers");
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
        // Half of them: the latest updated.
        let half = turned_around(&ctx, &cost, &offloaded, &chosen, states / 2).expect("room");
        let early: Vec<TensorId> = half
            .gaps
            .iter()
            .filter(|g| g.after.is_some() && g.before.is_some())
            .map(|g| g.tensor)
            .collect();
        let latest: Vec<TensorId> = chosen[..states / 2].iter().map(|o| o.tensor).collect();
        assert_eq!(early.len(), latest.len());
        assert!(early.iter().all(|t| latest.contains(t)));
        // The offload's last copy-outs ran after the last op, the iteration
        // waiting for them; turned around, they run in the next forward pass.
        let request = outcore_plan::PlanRequest::new(&g, &cost, u64::MAX);
        let search = crate::framework::Search::new(&ctx, &request, "test");
        let time_s = |s: &Schedule| match search.score(s, &mut Default::default()) {
            Ok(crate::framework::Score::Feasible { iter_time_s, .. }) => iter_time_s,
            other => panic!("{other:?}"),
        };
        let (offloaded_s, turned_s) = (time_s(&offloaded), time_s(&turned));
        let last_out_s = cost.d2h_time_s(ctx.size(chosen[0].tensor));
        assert!(
            turned_s <= offloaded_s - last_out_s,
            "{turned_s} vs {offloaded_s}"
        );
    }

    fn info() -> outcore_plan::PlannerInfo {
        outcore_plan::PlannerInfo {
            name: "test".into(),
            seed: None,
            settings: serde_json::Value::Null,
        }
    }
}
