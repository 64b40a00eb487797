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
use crate::tensile::link::{earliest_slot, latest_slot, least_busy_slot};
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
///
/// Where no stretch before `first` is clear, the copy-out takes the one the
/// others' copies occupy least ([`least_busy_slot`]) and delays the copies
/// queued after it, which the caller's score weighs. Why: a large state
/// among the forward pass's many short activation copies finds no clear
/// stretch however idle the link is on the whole. On BERT-base b32 at an
/// eighth of its footprint on `h100-80gb` the token embedding's two Adam
/// moments (94 MB, 1.7 ms each) found none, were copied out after the
/// last op, and the iteration ended with 3.4 ms of copies alone.
/// `None` when the stretch before `first` is shorter than the copy, or no
/// op up to `first` starts once it is done.
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
    let (lo_s, hi_s) = (ctx.prefix_time_s[1], start_s(first));
    let out_begin_s = earliest_slot(&busy_out, lo_s, hi_s, out_s)
        .or_else(|| least_busy_slot(&busy_out, lo_s, hi_s, out_s).map(|(s, _)| s))?;
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
        let clear_s = earliest_slot(busy_out, ready_s, f64::INFINITY, out_s)?;
        let reclaim = match ctx.first_starting_from(after + 1, first + 1, clear_s + out_s) {
            Some(reclaim) => {
                clock_s = clear_s + out_s;
                reclaim
            }
            // No clear stretch before the first use (`placed_early` took
            // the least busy one, or the stream order pushed a clear one
            // past it, which gave no schedule before): the copy runs when
            // the copies queued before it are done, and delays those queued
            // after it (not modelled here; the score weighs it).
            None => {
                let queued_s = earliest_slot(busy_out, ready_s, f64::INFINITY, 0.0)?;
                clock_s = queued_s + out_s;
                ctx.first_starting_from(after + 1, first + 1, clock_s)?
            }
        };
        g.reclaim_before = Some(reclaim);
        g.prefetch_after = g.prefetch_after.map(|q| q.max(reclaim).min(first - 1));
    }
    Some(())
}

/// Persistent tensors that [`kept_across`] can keep on the device across
/// the iteration's turn, largest first: those whose only open-ended gaps
/// are an offload's two (in from the iteration's start before their first
/// use, out after their last for the next iteration) and that leave the
/// device in between too (at least one gap with both ends). The middle gap
/// is what makes the offload's two copies avoidable: the tensor leaves the
/// device there anyway, and copied out there instead of after its update,
/// it is on the device from its update across the turn to its first use.
/// A tensor with no such gap, kept across, would be kept throughout (a
/// plain [`super::moves::Move::Drop`]); an optimizer state is only used by
/// its update, so it has none.
pub fn boundary_candidates(ctx: &Ctx<'_>, schedule: &Schedule) -> Vec<TensorId> {
    let mut by_tensor: Vec<&Gap> = schedule.gaps.iter().collect();
    by_tensor.sort_by_key(|g| g.tensor);
    let mut out: Vec<TensorId> = by_tensor
        .chunk_by(|a, b| a.tensor == b.tensor)
        .filter(|gaps| {
            let count = |after: bool, before: bool| {
                gaps.iter()
                    .filter(|g| g.after.is_some() == after && g.before.is_some() == before)
                    .count()
            };
            ctx.persistent(gaps[0].tensor)
                && gaps.iter().all(|g| g.how == Restore::Swap)
                && count(false, true) == 1
                && count(true, false) == 1
                && count(true, true) >= 1
        })
        .map(|gaps| gaps[0].tensor)
        .collect();
    out.sort_by_key(|&t| (std::cmp::Reverse(ctx.size(t)), t));
    out
}

/// `schedule` with `t`'s offload (its two open-ended gaps) removed: on the
/// device from its last use across the iteration's turn to its first use,
/// which saves the offload's copy in at the start and copy out after the
/// update. Its other gaps stay; the first of them now copies the tensor out
/// (updated in the iteration before, its host copy is stale), where the
/// offload's copy-in ran before, and that copy starts early
/// ([`Gap::copy_out_after`]): after the last op that ends by the earliest
/// stretch, from the tensor's last write before the gap (the iteration's
/// start if none), where the other swaps leave the d2h link idle, if that
/// op is before the gap's start; reclaimed where the modelled copy is done
/// (`early_copy_out`). What it costs is
/// memory at the turn (its bytes from its last use to the end and from the
/// start to its first use) and a copy-out in the middle, so
/// `joint::early_out_variant` keeps it only where the score says it is
/// faster.
///
/// Why: on the PyTorch GPT-2 export at a quarter of its footprint on
/// `v100-16gb-pcie3` the tied token embedding (147 MiB) is updated last,
/// read by the first op, and off the device through the backward pass. Its
/// offload's copy-in stalled the iteration's first 13 ms and its copy-out
/// was the iteration's last 13 ms of d2h. Kept across the turn with its
/// copy-out where its backward gap starts, every variant was over the budget:
/// the gap starts at the LM head's backward, beside the logits' gradients,
/// and the 13 ms copy held it there. Copied out from the LM head's forward
/// instead, where the d2h link is idle (by hand, on a plan `outcore plan`
/// wrote), the iteration went from 0.3127 s to 0.2995 s.
pub fn kept_across(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    t: TensorId,
) -> Schedule {
    let mut gaps: Vec<Gap> = schedule
        .gaps
        .iter()
        .filter(|g| g.tensor != t || (g.after.is_some() && g.before.is_some()))
        .cloned()
        .collect();
    let first = gaps
        .iter()
        .enumerate()
        .filter(|(_, g)| g.tensor == t)
        .min_by_key(|(_, g)| g.after)
        .map(|(i, _)| i);
    if let Some(i) = first
        && let Some(copy) = early_copy_out(ctx, cost, &gaps, i)
    {
        copy.apply(&mut gaps[i]);
    }
    Schedule {
        order: schedule.order.clone(),
        gaps,
        initial_residency: schedule
            .initial_residency
            .iter()
            .filter(|&&(x, _)| x != t)
            .copied()
            .collect(),
    }
}

/// [`boundary_candidates`] smaller than `below_bytes`, the shortest turn
/// first: the ops from the tensor's last use to the iteration's end plus
/// those before its first use, how long [`kept_across`] holds it at the
/// turn (ties by id). A transformer's or a CNN's later layers are read
/// late in the forward pass and updated early in the backward pass, so
/// kept across they would hold memory through most of both; the first
/// layers hold it least.
///
/// Why all at once: `kept_across_pass` tries the large parameters one at a
/// time, an evaluation each. The small ones are many (49 on the PyTorch
/// GPT-2 export at a quarter of its footprint, 9 MiB at most) and each saves
/// a copy of a millisecond or less, within the search's noise; taken by
/// count (`joint::early_out_count`, powers of two) they are a handful of
/// evaluations. Measured there on `v100-16gb-pcie3` (`outcore plan ...
/// --seconds 20`): a seed went from 0.2743 s to 0.2706 s with 8 kept (16
/// were slower, 32 over the budget), another from 0.2827 s to 0.2821 s
/// with 3.
pub fn shortest_turn_first(ctx: &Ctx<'_>, schedule: &Schedule, below_bytes: u64) -> Vec<TensorId> {
    let turn = |t: TensorId| -> usize {
        schedule
            .gaps
            .iter()
            .filter(|g| g.tensor == t)
            .map(|g| match (g.after, g.before) {
                (None, Some(b)) => b,
                (Some(a), None) => ctx.n - a,
                _ => 0,
            })
            .sum()
    };
    let mut out: Vec<(usize, TensorId)> = boundary_candidates(ctx, schedule)
        .into_iter()
        .filter(|&t| ctx.size(t) < below_bytes)
        .map(|t| (turn(t), t))
        .collect();
    out.sort_unstable();
    out.into_iter().map(|(_, t)| t).collect()
}

/// `schedule` with each of `tensors` kept across the turn ([`kept_across`]),
/// in that order (each one's early copy-out placed beside those before it).
pub fn kept_across_all(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    tensors: &[TensorId],
) -> Schedule {
    let mut out = schedule.clone();
    for &t in tensors {
        out = kept_across(ctx, cost, &out, t);
    }
    out
}

/// Where swap gap `gaps[i]` can start its copy-out early
/// ([`Gap::copy_out_after`]): after the last op that ends by the earliest
/// stretch of the d2h link that the other gaps' copy-outs leave idle for the
/// copy, if that stretch starts before the gap does; not before the tensor
/// is resident with its value at the gap ([`resident_from`]); with the
/// reclaim point where the copy is done. `None` where there is no such
/// stretch or it starts after the gap's own position.
fn early_copy_out(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    gaps: &[Gap],
    i: usize,
) -> Option<EarlyCopy> {
    let others: Vec<Gap> = gaps
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, g)| g.clone())
        .collect();
    let [busy_out, _] = link_use(ctx, cost, &others);
    placed_copy_out(ctx, cost, &busy_out, gaps, i)
}

/// [`early_copy_out`] against `busy_out`, the other copy-outs' (start, end)
/// seconds sorted by start (they may overlap).
fn placed_copy_out(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    busy_out: &[(f64, f64)],
    gaps: &[Gap],
    i: usize,
) -> Option<EarlyCopy> {
    let g = &gaps[i];
    let a = g.after?;
    let floor = resident_from(ctx, gaps, i)?;
    let out_s = cost.d2h_time_s(ctx.size(g.tensor));
    let end_s = |p: usize| ctx.prefix_time_s[p + 1];
    // `earliest_slot` steps past each interval that overlaps the candidate,
    // so intervals sorted by start need not be merged.
    let begin_s = earliest_slot(busy_out, end_s(floor), f64::INFINITY, out_s)?;
    let c = ctx.ending_by(a, begin_s).checked_sub(1)?.max(floor);
    if c >= a {
        return None;
    }
    // Reclaimed by the first op that starts once the copy is done (the op
    // at the gap's end at the latest): the free waits for the copy there.
    let limit = g.before.map_or(ctx.n, |b| b + 1);
    let reclaim = ctx
        .first_starting_from(a + 1, limit, begin_s + out_s)
        .or(limit.checked_sub(1))
        .filter(|&r| r > a);
    Some(EarlyCopy {
        after: c,
        reclaim_before: reclaim,
    })
}

/// An early copy-out's start and the reclaim point that waits for it.
#[derive(Debug, Clone, Copy)]
struct EarlyCopy {
    after: usize,
    reclaim_before: Option<usize>,
}

impl EarlyCopy {
    fn apply(self, g: &mut Gap) {
        g.copy_out_after = Some(self.after);
        g.reclaim_before = self.reclaim_before;
    }
}

/// The first position from which the tensor of gap `gaps[i]` is on the
/// device with the value it has at the gap ([`resident_since`]).
fn resident_from(ctx: &Ctx<'_>, gaps: &[Gap], i: usize) -> Option<usize> {
    let g = &gaps[i];
    resident_since(ctx, gaps, g.tensor, g.after?)
}

/// The first position from which `t` is on the device with the value it has
/// after position `a`, given its gaps among `gaps`: its production (the
/// iteration's start for a persistent tensor), the end of its last gap
/// before `a`, its last in-place write up to `a`, whichever is latest.
pub(crate) fn resident_since(ctx: &Ctx<'_>, gaps: &[Gap], t: TensorId, a: usize) -> Option<usize> {
    let made = if ctx.persistent(t) {
        0
    } else {
        *ctx.uses[t.index()].first()?
    };
    let back = gaps
        .iter()
        .filter(|x| x.tensor == t)
        .filter_map(|x| x.before)
        .filter(|&b| b <= a)
        .max();
    let written = ctx.writes[t.index()]
        .iter()
        .copied()
        .filter(|&w| w <= a)
        .max();
    [Some(made), back, written].into_iter().flatten().max()
}

/// A schedule whose swaps' copy-outs start early ([`copied_out_early`]), and
/// how many do.
#[derive(Debug)]
pub struct CopiedOutEarly {
    pub schedule: Schedule,
    pub copies: usize,
}

/// `schedule` with the copy-out of every swap gap that copies (its host
/// copy is stale) started early where the d2h link has room
/// (`early_copy_out`), the earliest gaps first, each placed around the
/// copies placed before it; `None` where none moved.
///
/// Why: a swap's copy-out otherwise starts where its gap starts, after the
/// tensor's last use before it, and tensors that die together load the link
/// together (a dense block's features at its last concatenation, the
/// parameters and activations freed around the LM head of a transformer),
/// while it was idle since they were made. Started early, the copy is done
/// or nearly so when the gap starts, and the gap's memory is free by its
/// reclaim point, where the link model times it. Where the link has no
/// idle stretch until after the gap starts, the reclaim point can come
/// later than before (it follows the modelled copy), so this is not free:
/// `joint::early_out_variant` keeps it only where the score says it is
/// faster. Measured with a first version (the free at the reclaim point
/// the gap already had, not at the copy's modelled end): the PyTorch GPT-2
/// export at a quarter of its footprint on `v100-16gb-pcie3`, a seed from
/// 0.3239 s to 0.3228 s; MobileNet v2 at half its footprint (link
/// saturated in the forward pass), no change; DenseNet-121 at an eighth
/// (its plan recomputes, and swaps almost nothing), none to move. Not
/// measured on its own since.
pub fn copied_out_early(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
) -> Option<CopiedOutEarly> {
    let current = super::moves::host_copy_current(ctx, &schedule.gaps);
    let mut gaps = schedule.gaps.clone();
    let end_s = |p: usize| ctx.prefix_time_s[p + 1];
    // Every copy-out's (start, end, gap) on the link model, sorted by start
    // (as `link_use` times them, unmerged): each gap moved takes its own out
    // and puts it back where it is placed.
    let copy_out = |g: &Gap| {
        let start_s = end_s(g.copy_out_after.or(g.after)?);
        Some((start_s, start_s + cost.d2h_time_s(ctx.size(g.tensor))))
    };
    let copies_out = |i: usize, g: &Gap| g.how == Restore::Swap && g.after.is_some() && !current[i];
    let mut busy: Vec<(f64, f64, usize)> = gaps
        .iter()
        .enumerate()
        .filter(|&(i, g)| copies_out(i, g))
        .filter_map(|(i, g)| copy_out(g).map(|(s, e)| (s, e, i)))
        .collect();
    busy.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.2.cmp(&y.2)));
    let mut idx: Vec<usize> = (0..gaps.len())
        .filter(|&i| copies_out(i, &gaps[i]) && gaps[i].copy_out_after.is_none())
        .collect();
    idx.sort_by_key(|&i| (gaps[i].after, gaps[i].tensor));
    let mut copies = 0;
    let mut others: Vec<(f64, f64)> = Vec::with_capacity(busy.len());
    for i in idx {
        let own = busy.iter().position(|b| b.2 == i).expect("listed");
        others.clear();
        others.extend(busy.iter().filter(|b| b.2 != i).map(|b| (b.0, b.1)));
        let Some(copy) = placed_copy_out(ctx, cost, &others, &gaps, i) else {
            continue;
        };
        copy.apply(&mut gaps[i]);
        copies += 1;
        busy.remove(own);
        let (s, e) = copy_out(&gaps[i]).expect("a copy-out");
        let at = busy.partition_point(|b| b.0 < s || (b.0 == s && b.2 < i));
        busy.insert(at, (s, e, i));
    }
    (copies > 0).then(|| CopiedOutEarly {
        schedule: Schedule {
            gaps,
            ..schedule.clone()
        },
        copies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{info, mlp_chain_with, v100};
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

    #[test]
    fn a_state_with_no_clear_stretch_is_copied_out_where_the_link_is_least_busy() {
        // Width 4096, batch 1024 on `v100-16gb-pcie3`: a layer's forward
        // pass takes about 3 ms, its saved activation (16 MiB) 1.4 ms to
        // copy out, and a weight or one of its Adam moments (64 MiB) 5.6
        // ms. Every saved activation and the last two layers' weights
        // swapped between their forward and backward uses: the d2h link
        // has no clear stretch of 5.6 ms from the first op to the last
        // layer's update (the first in the eager-update order), though it
        // is idle for a third of the forward pass.
        let g = mlp_chain_with(6, 4096, 1024, Optimizer::adamw());
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, outcore_plan::eager_update_order(&g));
        let reads = vec![Vec::new(); g.tensors.len()];
        let mut weights: Vec<TensorId> = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Parameter && t.allocates())
            .map(|t| t.id)
            .collect();
        weights.sort_by_key(|t| std::cmp::Reverse(ctx.uses[t.index()][0]));
        weights.truncate(2);
        let mut gaps: Vec<Gap> = ctx
            .saved_activations()
            .into_iter()
            .chain(weights)
            .filter_map(|t| {
                let (a, b) = super::super::moves::swap_interval(&ctx, &reads, t)?;
                Some(super::super::moves::hidden_swap(&ctx, &cost, t, a, b))
            })
            .collect();
        let swaps = gaps.len();
        assert!(swaps >= 7, "{swaps} tensors swapped");
        gaps.extend(states_offloaded(&ctx).gaps);
        let schedule = ctx.schedule(gaps);
        let chosen = candidates(&ctx, &schedule);
        // In the eager-update order the last layer's states are updated
        // first, early in the backward pass.
        let earliest = *chosen.last().expect("states");
        let [busy_out, _] = link_use(&ctx, &cost, &schedule.gaps[..swaps]);
        let out_s = cost.d2h_time_s(ctx.size(earliest.tensor));
        let (lo_s, hi_s) = (ctx.prefix_time_s[1], ctx.prefix_time_s[earliest.first]);
        assert_eq!(earliest_slot(&busy_out, lo_s, hi_s, out_s), None);
        // Turned around alone (the sweep over counts tries the latest
        // updated first; all of them do not fit the link before their
        // updates here).
        let turned = turned_around(&ctx, &cost, &schedule, &[earliest], 1).expect("turned");
        let gap = turned
            .gaps
            .iter()
            .find(|x| x.tensor == earliest.tensor && x.after.is_some())
            .expect("turned around");
        let (a, r) = (
            gap.after.expect("early"),
            gap.reclaim_before.expect("timed"),
        );
        assert_eq!(gap.before, Some(earliest.first), "{gap:?}");
        // Reclaimed no earlier than the copy could be done.
        assert!(
            ctx.prefix_time_s[r] + 1e-9 >= ctx.prefix_time_s[a + 1] + out_s,
            "{gap:?}"
        );
        let plan = outcore_plan::lower_schedule(&g, &turned, info(), u64::MAX).expect("lowers");
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
    }

    /// Every parameter not read by the first op offloaded (in from the
    /// start, out after its update) and off the device between its forward
    /// and backward reads too.
    fn parameters_streamed(ctx: &Ctx<'_>) -> Schedule {
        let cost = v100();
        let reads = vec![Vec::new(); ctx.graph.tensors.len()];
        let mut gaps = Vec::new();
        for t in ctx
            .graph
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Parameter && t.allocates())
        {
            let u = &ctx.uses[t.id.index()];
            if u[0] == 0 {
                // Read by the first op: nothing to copy in behind.
                continue;
            }
            gaps.extend(super::super::moves::offload(
                ctx,
                &cost,
                t.id,
                u[0],
                *u.last().expect("used"),
            ));
            if let Some((a, b)) = super::super::moves::swap_interval(ctx, &reads, t.id) {
                gaps.push(super::super::moves::hidden_swap(ctx, &cost, t.id, a, b));
            }
        }
        ctx.schedule(gaps)
    }

    #[test]
    fn a_parameter_kept_across_the_turn_is_copied_out_early_and_verifies() {
        let g = mlp_chain_with(4, 512, 8192, Optimizer::adamw());
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let streamed = parameters_streamed(&ctx);
        let chosen = boundary_candidates(&ctx, &streamed);
        let weights = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Parameter && t.allocates())
            .filter(|t| ctx.uses[t.id.index()][0] > 0 && swap_interval_of(&ctx, t.id).is_some())
            .count();
        assert_eq!(chosen.len(), weights, "each parameter with a middle gap");
        assert!(chosen.windows(2).all(|w| ctx.size(w[0]) >= ctx.size(w[1])));
        // The largest not read by the first op (whose gap starts there, with
        // no op before it to copy after).
        let t = chosen
            .iter()
            .copied()
            .find(|&t| ctx.uses[t.index()][0] > 0)
            .expect("a later layer's weight");
        let kept = kept_across(&ctx, &cost, &streamed, t);
        let own: Vec<&Gap> = kept.gaps.iter().filter(|g| g.tensor == t).collect();
        let [middle] = own[..] else {
            panic!("only the middle gap stays: {own:?}");
        };
        // Nothing else copies out before it: from the first op.
        assert_eq!(middle.copy_out_after, Some(0), "{middle:?}");
        assert!(middle.after.expect("middle") > 0);
        assert!(kept.initial_residency.iter().all(|&(x, _)| x != t));
        assert_eq!(kept.gaps.len(), streamed.gaps.len() - 2);
        let plan = outcore_plan::lower_schedule(&g, &kept, info(), u64::MAX).expect("lowers");
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
        // Two copies fewer per iteration: its offload's in and out; the
        // middle gap now copies out, where its host copy was current.
        let copies = |p: &outcore_plan::Plan, s: outcore_plan::Stream| {
            p.streams[s.index()]
                .iter()
                .filter(|st| matches!(st.instr, outcore_plan::Instr::SwapIn(x) | outcore_plan::Instr::SwapOut(x) if x == t))
                .count()
        };
        let before = outcore_plan::lower_schedule(&g, &streamed, info(), u64::MAX).expect("lowers");
        use outcore_plan::Stream::{D2h, H2d};
        assert_eq!((copies(&before, H2d), copies(&before, D2h)), (2, 1));
        assert_eq!((copies(&plan, H2d), copies(&plan, D2h)), (1, 1));
    }

    /// On a 4-layer MLP with its parameters streamed, the candidates below
    /// a size come shortest turn first: the weights and biases of the layer
    /// nearest the input first (read early in the forward pass, updated
    /// late in the backward pass), its weight's turn no longer than the
    /// next layer's. Kept all at once, each has one gap left, the plan
    /// verifies and copies one fewer of each in.
    #[test]
    fn small_parameters_kept_across_together_shortest_turn_first() {
        let g = mlp_chain_with(4, 512, 8192, Optimizer::adamw());
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let streamed = parameters_streamed(&ctx);
        let all = boundary_candidates(&ctx, &streamed);
        let largest = ctx.size(all[0]);
        let small = shortest_turn_first(&ctx, &streamed, largest + 1);
        assert_eq!(small.len(), all.len(), "every candidate is below the cap");
        assert!(shortest_turn_first(&ctx, &streamed, 1).is_empty());
        let turn = |t: TensorId| {
            let u = &ctx.uses[t.index()];
            u[0] + (ctx.n - u.last().expect("used"))
        };
        assert!(
            small.windows(2).all(|w| turn(w[0]) <= turn(w[1])),
            "{small:?}"
        );
        // The first is read before every other candidate's first read.
        let first_read = |t: TensorId| ctx.uses[t.index()][0];
        assert!(small.iter().all(|&t| first_read(small[0]) <= first_read(t)));
        let k = 2.min(small.len());
        let kept = kept_across_all(&ctx, &cost, &streamed, &small[..k]);
        for &t in &small[..k] {
            assert_eq!(
                kept.gaps.iter().filter(|g| g.tensor == t).count(),
                1,
                "{t:?}"
            );
        }
        assert_eq!(kept.gaps.len(), streamed.gaps.len() - 2 * k);
        let plan = outcore_plan::lower_schedule(&g, &kept, info(), u64::MAX).expect("lowers");
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
        let ins = |p: &outcore_plan::Plan| {
            p.streams[outcore_plan::Stream::H2d.index()]
                .iter()
                .filter(|st| matches!(st.instr, outcore_plan::Instr::SwapIn(_)))
                .count()
        };
        let before = outcore_plan::lower_schedule(&g, &streamed, info(), u64::MAX).expect("lowers");
        assert_eq!(ins(&plan), ins(&before) - k);
    }

    fn swap_interval_of(ctx: &Ctx<'_>, t: TensorId) -> Option<(usize, usize)> {
        let reads = vec![Vec::new(); ctx.graph.tensors.len()];
        super::super::moves::swap_interval(ctx, &reads, t)
    }

    #[test]
    fn swaps_copied_out_early_start_before_their_gaps_on_an_idle_link() {
        let g = mlp_chain_with(4, 512, 8192, Optimizer::adamw());
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        // The saved activations swapped from their last forward use to their
        // first backward use, copies timed as if the link were idle.
        let mut gaps = Vec::new();
        for t in ctx.saved_activations() {
            if let Some((a, b)) = ctx.forward_backward_gap(t) {
                gaps.push(super::super::moves::hidden_swap(&ctx, &cost, t, a, b));
            }
        }
        let swapped = ctx.schedule(gaps);
        let early = copied_out_early(&ctx, &cost, &swapped).expect("some move");
        assert!(early.copies > 0);
        let moved: Vec<&Gap> = early
            .schedule
            .gaps
            .iter()
            .filter(|g| g.copy_out_after.is_some())
            .collect();
        assert_eq!(moved.len(), early.copies);
        for g in &moved {
            let (c, a) = (g.copy_out_after.expect("moved"), g.after.expect("swap"));
            // After the tensor is made, before its gap.
            assert!(ctx.uses[g.tensor.index()][0] <= c && c < a, "{g:?}");
        }
        let plan =
            outcore_plan::lower_schedule(&g, &early.schedule, info(), u64::MAX).expect("lowers");
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
        // Asked again, nothing is left to move.
        assert!(copied_out_early(&ctx, &cost, &early.schedule).is_none());
    }
}
