//! The neighbourhood of a schedule: small edits of its gaps that the local
//! search scores one by one.
//!
//! A move changes how one tensor leaves the device and comes back, on the
//! schedule's own order:
//! - [`Move::Drop`] keeps the tensor resident through one gap (faster, more memory);
//! - [`Move::ToSwap`] brings a recomputed tensor back by a swap-in instead,
//!   started early enough to hide the copy behind compute;
//! - [`Move::ToRecompute`] recomputes a swapped tensor instead (for a producer
//!   cheaper than the copy, or a link that is busy);
//! - [`Move::Retime`] moves a swap-in's start earlier or later;
//! - [`Move::Exchange`] keeps one tensor and swaps another, at least as large,
//!   whose forward-backward interval covers the kept one's gap: about the same
//!   memory at that peak, but perhaps a copy that hides better or a
//!   recomputation avoided. Single moves cannot find this: the first half alone
//!   is over budget, the second alone slower.
//!
//! - [`Move::ExchangeRecompute`] is the recompute-only exchange: keep one
//!   recomputed tensor and recompute another, at least as large, whose
//!   interval covers the kept one's gap (the only sideways move of
//!   [`Kinds::RecomputeOnly`], which offers no swap).
//!
//! - [`Move::AddSwap`] and [`Move::AddRecompute`] take a tensor with no gap
//!   off the device: they only save memory, so the search offers them only
//!   while the schedule is over the budget (repairing a start that does not
//!   fit, e.g. every tensor kept).
//!
//! Moves never check validity themselves: a move whose recomputation chain no
//! longer holds (a recomputation reading a tensor that is now gone) fails in
//! the lowering or the verifier, and the search counts it as invalid.

use crate::framework::Ctx;
use crate::framework::pressure::resident_bytes;
use crate::tensile::link::{earliest_slot, latest_slot, merged};
use outcore_cost::CostModel;
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore, Schedule};

/// One edit of a schedule's gaps; `gap` indexes `Schedule::gaps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    Drop {
        gap: usize,
    },
    ToSwap {
        gap: usize,
    },
    ToRecompute {
        gap: usize,
    },
    Retime {
        gap: usize,
        prefetch_after: usize,
    },
    Exchange {
        gap: usize,
        tensor: TensorId,
        /// The partner's swap interval (see [`Neighbourhood::ungapped`]).
        after: usize,
        before: usize,
    },
    /// Keep the tensor of `gap` resident and recompute another (with no gap)
    /// where its interval ends.
    ExchangeRecompute {
        gap: usize,
        tensor: TensorId,
        after: usize,
        before: usize,
    },
    /// Repair: swap out a tensor with no gap over its interval.
    AddSwap {
        tensor: TensorId,
        after: usize,
        before: usize,
    },
    /// Repair: recompute a tensor with no gap where its interval ends.
    AddRecompute {
        tensor: TensorId,
        after: usize,
        before: usize,
    },
    /// Repair: keep a persistent tensor (parameter, optimizer state) on the
    /// host between iterations: swapped in before its first use, out after
    /// its last.
    AddOffload {
        tensor: TensorId,
        first: usize,
        last: usize,
    },
    /// Keep the tensor of `gap` resident and offload a persistent tensor, at
    /// least as large, whose absence covers the gap instead.
    ExchangeOffload {
        gap: usize,
        tensor: TensorId,
        first: usize,
        last: usize,
    },
    /// Swap the recomputed tensor of `gap` instead (its swap-in lands early
    /// and holds memory longer) and offload a persistent tensor to pay for it.
    SwapAndOffload {
        gap: usize,
        tensor: TensorId,
        first: usize,
        last: usize,
    },
}

impl Move {
    /// The index of the gap the move edits, for those that edit one.
    fn gap_mut(&mut self) -> Option<&mut usize> {
        match self {
            Move::Drop { gap }
            | Move::ToSwap { gap }
            | Move::ToRecompute { gap }
            | Move::Retime { gap, .. }
            | Move::Exchange { gap, .. }
            | Move::ExchangeRecompute { gap, .. }
            | Move::ExchangeOffload { gap, .. }
            | Move::SwapAndOffload { gap, .. } => Some(gap),
            Move::AddSwap { .. } | Move::AddRecompute { .. } | Move::AddOffload { .. } => None,
        }
    }

    /// The same move made on `to` (a schedule made from `from` by other
    /// moves): its gap found again in `to` by equality, since the moves
    /// before it may have removed or reordered gaps. `None` where `to` no
    /// longer has that gap (another move changed it).
    pub fn carried_over(self, from: &Schedule, to: &Schedule) -> Option<Move> {
        let mut mv = self;
        if let Some(gap) = mv.gap_mut() {
            let g = from.gaps.get(*gap)?;
            *gap = to.gaps.iter().position(|x| x == g)?;
        }
        Some(mv)
    }
}

/// At most this many exchange partners per gap (the longest intervals first:
/// they leave the most compute to hide a copy behind).
const EXCHANGE_PARTNERS: usize = 3;

/// Which moves a search may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    /// Every move: keep, swap, recompute, retime, exchange, offload.
    All,
    /// Only keep and recompute (a recompute-only plan stays one): drop a
    /// gap, exchange a recomputation for another, add a recomputation.
    RecomputeOnly,
    /// Only the swap-ins' start ([`Move::Retime`]), densely: the
    /// [`RETIME_NEAR`] triggers on either side of each swap-in's and
    /// [`RETIME_SPREAD`] spread over its gap, offload swap-ins from the
    /// iteration's start included ([`Neighbourhood::retimes`]).
    SwapTiming,
}

/// Triggers on either side of a swap-in's current one that
/// [`Kinds::SwapTiming`] offers. One swap-in started earlier overtakes the
/// ones triggered between on the in-order h2d stream, so the time is not
/// monotone in the trigger: on the PyTorch VGG-16 b32 export at 50% on
/// `v100-16gb-pcie3`, with the 392 MB momentum buffer of `classifier.0`
/// swapped in after op 18 the iteration takes 0.3535 s (1.1 ms of it
/// stalled), after ops 14 to 17 0.3552 to 0.3564 s, after ops 12 and 13
/// 0.3525 s, and after ops 4 to 9 0.3545 to 0.3546 s. Halving the distance to
/// the gap's start (the main neighbourhood's retime) steps over such a
/// window; neighbours do not.
pub const RETIME_NEAR: usize = 8;
/// Triggers spread evenly over a swap-in's gap that [`Kinds::SwapTiming`]
/// offers besides the near ones.
pub const RETIME_SPREAD: usize = 8;

/// What moves need to know about a schedule's tensors, built once per
/// accepted schedule.
#[derive(Debug)]
pub struct Neighbourhood {
    /// The moves offered.
    pub kinds: Kinds,
    /// Persistent tensors with no gap that are used after the first position,
    /// with their first and last use.
    pub offloadable: Vec<(TensorId, usize, usize)>,
    /// Saved activations with no gap, with the interval a swap of them may
    /// cover: from the last forward use to the first backward use, a
    /// recomputation reading them or an in-place write, whichever is first.
    pub ungapped: Vec<(TensorId, usize, usize)>,
}

impl Neighbourhood {
    pub fn of(ctx: &Ctx<'_>, schedule: &Schedule, kinds: Kinds) -> Self {
        let mut gapped = vec![false; ctx.graph.tensors.len()];
        for g in &schedule.gaps {
            gapped[g.tensor.index()] = true;
        }
        let reads = recompute_reads(ctx, schedule);
        let ungapped = ctx
            .saved_activations()
            .into_iter()
            .filter(|t| !gapped[t.index()])
            .filter_map(|t| {
                let (a, b) = swap_interval(ctx, &reads, t)?;
                Some((t, a, b))
            })
            .collect();
        let offloadable = ctx
            .owners()
            .filter(|&t| ctx.persistent(t) && !gapped[t.index()] && ctx.size(t) > 0)
            .filter_map(|t| {
                let uses = &ctx.uses[t.index()];
                let (&first, &last) = (uses.first()?, uses.last()?);
                (first > 0).then_some((t, first, last))
            })
            .collect();
        Neighbourhood {
            kinds,
            offloadable,
            ungapped,
        }
    }

    /// The repair moves: each ungapped tensor swapped, or recomputed (none
    /// for [`Kinds::SwapTiming`]).
    pub fn repairs(&self, ctx: &Ctx<'_>, schedule: &Schedule, out: &mut Vec<Move>) {
        out.clear();
        if self.kinds == Kinds::SwapTiming {
            // Retiming never frees memory.
            return;
        }
        if self.kinds == Kinds::RecomputeOnly {
            out.extend(
                self.ungapped
                    .iter()
                    .filter(|&&(tensor, _, before)| inputs_resident(ctx, schedule, tensor, before))
                    .map(|&(tensor, after, before)| Move::AddRecompute {
                        tensor,
                        after,
                        before,
                    }),
            );
            return;
        }
        out.extend(
            self.offloadable
                .iter()
                .map(|&(tensor, first, last)| Move::AddOffload {
                    tensor,
                    first,
                    last,
                }),
        );
        for &(tensor, after, before) in &self.ungapped {
            out.push(Move::AddSwap {
                tensor,
                after,
                before,
            });
            if inputs_resident(ctx, schedule, tensor, before) {
                out.push(Move::AddRecompute {
                    tensor,
                    after,
                    before,
                });
            }
        }
    }

    /// Every move of `schedule`, in a fixed order (the search shuffles them
    /// with its seeded generator), into `out`.
    pub fn moves(&self, ctx: &Ctx<'_>, schedule: &Schedule, out: &mut Vec<Move>) {
        out.clear();
        if self.kinds == Kinds::SwapTiming {
            Self::retimes(schedule, None, out);
            return;
        }
        for (i, g) in schedule.gaps.iter().enumerate() {
            // A gap ending after the tensor's last use brings it back only to
            // feed recomputations: without the gap the lowering frees it at
            // its last use, so dropping it (alone or in an exchange) always
            // breaks the chain.
            let chain_only = ctx.chain_link(g);
            if !chain_only {
                out.push(Move::Drop { gap: i });
            }
            let (Some(after), Some(before)) = (g.after, g.before) else {
                continue;
            };
            if self.kinds == Kinds::RecomputeOnly {
                if g.how == Restore::Swap && inputs_resident(ctx, schedule, g.tensor, before) {
                    out.push(Move::ToRecompute { gap: i });
                }
                if !chain_only {
                    self.recompute_exchanges(ctx, schedule, (i, g.tensor), after, before, out);
                }
                continue;
            }
            match g.how {
                Restore::Recompute => out.push(Move::ToSwap { gap: i }),
                Restore::Swap => {
                    if inputs_resident(ctx, schedule, g.tensor, before) {
                        out.push(Move::ToRecompute { gap: i });
                    }
                    let p = g.prefetch_after.unwrap_or(after).clamp(after, before);
                    let earlier = after + (p - after) / 2;
                    let later = p + (before - p) / 2;
                    for q in [earlier, later] {
                        if q != p {
                            out.push(Move::Retime {
                                gap: i,
                                prefetch_after: q,
                            });
                        }
                    }
                }
            }
            if !chain_only {
                self.exchanges(ctx, i, g, after, before, out);
            }
        }
    }

    /// [`Kinds::SwapTiming`]'s moves, into `out` (cleared): for every
    /// swapped gap that ends in a swap-in (of a tensor in `targets`, when
    /// given), its trigger moved to each of the [`RETIME_NEAR`] positions
    /// on either side and to [`RETIME_SPREAD`] positions spread over the
    /// gap, within the positions a trigger may take (from the gap's start,
    /// or from the first position for a tensor on the host at the
    /// iteration's start, to the position before its use).
    pub fn retimes(schedule: &Schedule, targets: Option<&[TensorId]>, out: &mut Vec<Move>) {
        out.clear();
        for (gap, g) in schedule.gaps.iter().enumerate() {
            let Some(before) = g.before.filter(|_| g.how == Restore::Swap) else {
                continue;
            };
            if targets.is_some_and(|t| !t.contains(&g.tensor)) {
                continue;
            }
            let first = g.after.unwrap_or(0);
            if before <= first {
                continue;
            }
            let last = before - 1;
            let p = g.prefetch_after.unwrap_or(first).clamp(first, last);
            let near = p.saturating_sub(RETIME_NEAR).max(first)..=(p + RETIME_NEAR).min(last);
            let spread = (0..RETIME_SPREAD).map(|k| first + (last - first) * k / RETIME_SPREAD);
            let mut triggers: Vec<usize> = near.chain(spread).filter(|&q| q != p).collect();
            triggers.sort_unstable();
            triggers.dedup();
            out.extend(triggers.into_iter().map(|prefetch_after| Move::Retime {
                gap,
                prefetch_after,
            }));
        }
    }

    /// [`Move::ExchangeRecompute`] partners of gap `i` (of `tensor`, over
    /// `after..before`): the longest covering intervals first, as
    /// [`Self::exchanges`] picks swap partners.
    fn recompute_exchanges(
        &self,
        ctx: &Ctx<'_>,
        schedule: &Schedule,
        (i, tensor): (usize, TensorId),
        after: usize,
        before: usize,
        out: &mut Vec<Move>,
    ) {
        let size = ctx.size(tensor);
        let mut partners: Vec<(usize, TensorId, usize, usize)> = self
            .ungapped
            .iter()
            .filter(|&&(t, a, b)| a <= after && b >= before && ctx.size(t) >= size)
            .filter(|&&(t, _, b)| inputs_resident(ctx, schedule, t, b))
            .map(|&(t, a, b)| (b - a, t, a, b))
            .collect();
        partners.sort_unstable_by(|x, y| y.cmp(x));
        out.extend(partners.into_iter().take(EXCHANGE_PARTNERS).map(
            |(_, tensor, after, before)| Move::ExchangeRecompute {
                gap: i,
                tensor,
                after,
                before,
            },
        ));
    }

    fn exchanges(
        &self,
        ctx: &Ctx<'_>,
        i: usize,
        g: &Gap,
        after: usize,
        before: usize,
        out: &mut Vec<Move>,
    ) {
        let size = ctx.size(g.tensor);
        let mut partners: Vec<(usize, TensorId, usize, usize)> = self
            .ungapped
            .iter()
            .filter(|&&(t, a, b)| a <= after && b >= before && ctx.size(t) >= size)
            .map(|&(t, a, b)| (b - a, t, a, b))
            .collect();
        partners.sort_unstable_by(|x, y| y.cmp(x));
        // Persistent partners absent over the whole gap: off the device from
        // the iteration start to their first use.
        let mut offloads: Vec<(u64, TensorId, usize, usize)> = self
            .offloadable
            .iter()
            .filter(|&&(t, first, _)| first > before && ctx.size(t) >= size)
            .map(|&(t, first, last)| (ctx.size(t), t, first, last))
            .collect();
        offloads.sort_unstable();
        let recomputed = g.how == Restore::Recompute;
        for (_, tensor, first, last) in offloads.into_iter().take(EXCHANGE_PARTNERS) {
            out.push(Move::ExchangeOffload {
                gap: i,
                tensor,
                first,
                last,
            });
            if recomputed {
                out.push(Move::SwapAndOffload {
                    gap: i,
                    tensor,
                    first,
                    last,
                });
            }
        }
        out.extend(partners.into_iter().take(EXCHANGE_PARTNERS).map(
            |(_, tensor, after, before)| Move::Exchange {
                gap: i,
                tensor,
                after,
                before,
            },
        ));
    }
}

/// Whether recomputing `t` at `at` finds its producer's inputs on the device
/// without bringing any back: each input's owner is persistent, used at or
/// after `at`, or held until `at` by the lowering (not persistent, and every
/// gap of it ends before `at`: `outcore_plan::lower_schedule`'s holds), and
/// no gap of it spans `at`. (A cheap filter: a recomputation that needs a
/// chain is left to the seeds that build chains, and the lowering and
/// verifier still judge every move.)
fn inputs_resident(ctx: &Ctx<'_>, schedule: &Schedule, t: TensorId, at: usize) -> bool {
    let g = ctx.graph;
    let Some(producer) = g.tensor(t).producer else {
        return false;
    };
    g.op(producer).inputs.iter().all(|&input| {
        let owner = g.storage_owner(input);
        let persistent = ctx.persistent(owner);
        let used_later = persistent
            || ctx.uses[owner.index()]
                .last()
                .is_some_and(|&last| last >= at);
        let mut gaps = schedule.gaps.iter().filter(|gap| gap.tensor == owner);
        if used_later {
            let gone = gaps
                .any(|gap| gap.after.is_none_or(|a| a < at) && gap.before.is_none_or(|b| b > at));
            !gone
        } else {
            // Held: dead before `at`, and back from every gap before it.
            !persistent && gaps.all(|gap| gap.before.is_some_and(|b| b < at))
        }
    })
}

/// The interval a swap of `t` may cover: from its last forward use to its
/// first backward use, a recomputation reading it (`reads`, from
/// [`recompute_reads`]) or an in-place write, whichever is first; `None`
/// when no op runs in between.
pub(crate) fn swap_interval(
    ctx: &Ctx<'_>,
    reads: &[Vec<usize>],
    t: TensorId,
) -> Option<(usize, usize)> {
    let (a, b) = ctx.forward_backward_gap(t)?;
    let first_read = reads[t.index()].iter().copied().filter(|&p| p > a);
    let first_write = ctx.writes[t.index()].iter().copied().filter(|&p| p > a);
    let b = first_read.chain(first_write).fold(b, usize::min);
    (b >= a + 2).then_some((a, b))
}

/// Per storage owner: the positions where a recomputation of `schedule`
/// reads it (a recompute gap's producer runs again where the gap ends).
pub(crate) fn recompute_reads(ctx: &Ctx<'_>, schedule: &Schedule) -> Vec<Vec<usize>> {
    let g = ctx.graph;
    let mut reads = vec![Vec::new(); g.tensors.len()];
    for gap in &schedule.gaps {
        let (Restore::Recompute, Some(at)) = (gap.how, gap.before) else {
            continue;
        };
        for input in ctx.producer_inputs(gap.tensor) {
            reads[input.index()].push(at);
        }
    }
    reads
}

/// `schedule` with `mv` applied; `ctx` is the context of `schedule.order`.
pub fn apply(ctx: &Ctx<'_>, cost: &dyn CostModel, schedule: &Schedule, mv: Move) -> Schedule {
    let mut gaps = schedule.gaps.clone();
    // A recomputation given up may leave the chain links brought back for
    // it with no reader: they are dropped below.
    let recompute_changed = match mv {
        Move::Drop { gap }
        | Move::ToSwap { gap }
        | Move::Exchange { gap, .. }
        | Move::ExchangeRecompute { gap, .. }
        | Move::ExchangeOffload { gap, .. }
        | Move::SwapAndOffload { gap, .. } => schedule
            .gaps
            .get(gap)
            .is_some_and(|g| g.how == Restore::Recompute),
        _ => false,
    };
    match mv {
        Move::Drop { gap } => {
            // An offloaded persistent tensor has two open-ended gaps (out
            // after its last use, in before its first): drop both, or the
            // plan would not repeat.
            let g = gaps.remove(gap);
            if g.after.is_none() || g.before.is_none() {
                gaps.retain(|x| x.tensor != g.tensor || (x.after.is_some() && x.before.is_some()));
            }
        }
        Move::ToSwap { gap } => {
            let g = &gaps[gap];
            if let (Some(after), Some(before)) = (g.after, g.before) {
                // Placed around the other gaps' copies where the link has
                // room, else timed as if it were idle (the gap itself is a
                // recomputation: it holds no link time).
                let t = g.tensor;
                gaps[gap] = placed_swap(ctx, cost, &gaps, t, after, before)
                    .unwrap_or_else(|| hidden_swap(ctx, cost, t, after, before));
            }
        }
        Move::ToRecompute { gap } => {
            let g = &mut gaps[gap];
            g.how = Restore::Recompute;
            g.prefetch_after = None;
            g.reclaim_before = None;
            g.copy_out_after = None;
        }
        Move::Retime {
            gap,
            prefetch_after,
        } => gaps[gap].prefetch_after = Some(prefetch_after),
        Move::Exchange {
            gap,
            tensor,
            after,
            before,
        } => gaps[gap] = hidden_swap(ctx, cost, tensor, after, before),
        Move::AddSwap {
            tensor,
            after,
            before,
        } => gaps.push(hidden_swap(ctx, cost, tensor, after, before)),
        Move::AddOffload {
            tensor,
            first,
            last,
        } => gaps.extend(offload(ctx, cost, tensor, first, last)),
        Move::ExchangeOffload {
            gap,
            tensor,
            first,
            last,
        } => {
            gaps.remove(gap);
            gaps.extend(offload(ctx, cost, tensor, first, last));
        }
        Move::SwapAndOffload {
            gap,
            tensor,
            first,
            last,
        } => {
            let g = &gaps[gap];
            if let (Some(after), Some(before)) = (g.after, g.before) {
                gaps[gap] = hidden_swap(ctx, cost, g.tensor, after, before);
            }
            gaps.extend(offload(ctx, cost, tensor, first, last));
        }
        Move::AddRecompute {
            tensor,
            after,
            before,
        } => gaps.push(recompute_gap(tensor, after, before)),
        Move::ExchangeRecompute {
            gap,
            tensor,
            after,
            before,
        } => gaps[gap] = recompute_gap(tensor, after, before),
    }
    if recompute_changed {
        super::held::drop_orphan_links(ctx, &mut gaps);
    }
    // `ctx` is built on `schedule.order` (the search's context for this
    // start), so its schedule has the same order: no second copy of it.
    ctx.schedule(gaps)
}

pub(crate) use crate::framework::decisions::recompute_gap;

/// A swap gap of `t` over `(after, before)` whose copies are timed to hide
/// behind compute under the cost model: the swap-out has the ops after
/// `after` whose time covers the d2h copy before a compute op waits for it,
/// and the swap-in starts early enough that the ops before `before` cover
/// the h2d copy. Both are clamped to the gap (a copy longer than the gap's
/// compute stalls whatever the timing).
pub fn hidden_swap(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    t: TensorId,
    after: usize,
    before: usize,
) -> Gap {
    let size = ctx.size(t);
    let out_s = cost.d2h_time_s(size);
    let in_s = cost.h2d_time_s(size);
    let reclaim = first_covered(ctx, after, before, out_s);
    let prefetch = last_covering(ctx, before, reclaim, in_s);
    Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(prefetch.max(after)),
        reclaim_before: Some(reclaim.min(before)),
        copy_out_after: None,
    }
}

/// The first position `r > from` such that the ops in `(from, r)` take at
/// least `copy_s` (a copy started when `from` ends is done by `r`'s start),
/// or `limit` if none before it.
fn first_covered(ctx: &Ctx<'_>, from: usize, limit: usize, copy_s: f64) -> usize {
    let mut r = from + 1;
    while r < limit && ctx.time_s(from + 1, r) < copy_s {
        r += 1;
    }
    r
}

/// The last position `p < to` such that the ops in `(p, to)` take at least
/// `copy_s` (a copy started when `p` ends is done by `to`'s start), or
/// `floor` if none above it.
fn last_covering(ctx: &Ctx<'_>, to: usize, floor: usize, copy_s: f64) -> usize {
    let mut p = to.saturating_sub(1);
    while p > floor && ctx.time_s(p + 1, to) < copy_s {
        p -= 1;
    }
    p
}

/// `schedule` with the swap-in of every gap of a tensor in `targets`
/// started earlier: at the last position whose ops up to the swap-in's use
/// take `lead` times its copy (never later than it starts now, never
/// before its gap opens). `None` where no trigger moves.
///
/// Why: the polish retimes one swap-in per move, and where compute waits
/// on many of them (a plan that streams the optimizer state, each moment
/// swapped in just before its update while the link also carries the
/// others) that is a move per swap-in, each scored alone. This moves them
/// all at once, as far as the lead says, and the score decides whether the
/// memory they then hold longer still fits.
pub fn led_swap_ins(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    targets: &[TensorId],
    lead: f64,
) -> Option<Schedule> {
    lead_within(ctx, cost, schedule, targets, lead, None)
}

/// [`led_swap_ins`], but each swap-in is started only as much earlier as
/// the resident bytes (`resident_bytes`, a model; verify judges) leave
/// room for it under `budget_bytes`, the targets taken in the schedule's
/// gap order, each one's bytes counted before the next. `None` where no
/// trigger moves.
///
/// Why: one swap-in whose lead runs into a stretch where memory is full
/// (the PyTorch GPT-2 export's LM head holds 589 MiB of its 883 MB budget
/// at 25%) makes the whole [`led_swap_ins`] candidate infeasible, and then
/// none of the others is led either.
pub fn fitted_swap_ins(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    targets: &[TensorId],
    lead: f64,
    budget_bytes: u64,
) -> Option<Schedule> {
    lead_within(ctx, cost, schedule, targets, lead, Some(budget_bytes))
}

/// The triggers of [`led_swap_ins`], held to `budget_bytes` of resident
/// bytes where one is given.
fn lead_within(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    schedule: &Schedule,
    targets: &[TensorId],
    lead: f64,
    budget_bytes: Option<u64>,
) -> Option<Schedule> {
    let mut resident = budget_bytes.map(|_| resident_bytes(ctx, &schedule.gaps));
    let room = i128::from(budget_bytes.unwrap_or(0));
    let mut led = schedule.clone();
    let mut moved = false;
    for g in &mut led.gaps {
        let (Some(before), Some(now)) = (g.before, g.prefetch_after) else {
            continue;
        };
        if g.how != Restore::Swap || !targets.contains(&g.tensor) {
            continue;
        }
        let first = g.after.unwrap_or(0);
        let copy_s = lead * cost.h2d_time_s(ctx.size(g.tensor));
        let mut trigger = last_covering(ctx, before, first, copy_s).max(first);
        if let Some(resident) = resident.as_mut() {
            // Resident from the op after the trigger: each position the
            // trigger passes must hold the tensor's bytes too.
            let size = i128::from(ctx.size(g.tensor));
            let mut fits = now;
            while fits > trigger && resident[fits] + size <= room {
                fits -= 1;
            }
            trigger = fits;
            for held in resident.iter_mut().take(now + 1).skip(trigger + 1) {
                *held += size;
            }
        }
        if trigger < now {
            g.prefetch_after = Some(trigger);
            moved = true;
        }
    }
    moved.then_some(led)
}

/// The two gaps that keep persistent `t` on the host between iterations:
/// swapped in so that the ops before `first` cover the h2d copy, swapped out
/// after `last`. The first op after `last` whose predecessors cover the d2h
/// copy waits for the swap-out (if there is one before the order's end; else
/// the iteration's end waits): without that wait no later allocation is
/// ordered after the free, so the verifier counts the bytes as held to the
/// end (on BERT-base with Adam, the optimizer state offloaded this way
/// otherwise counted 0.8 GiB more at the peak).
pub fn offload(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    t: TensorId,
    first: usize,
    last: usize,
) -> [Gap; 2] {
    [
        out_for_next(ctx, cost, t, last),
        in_from_host(ctx, cost, t, first),
    ]
}

/// The gap that swaps persistent `t` out after its last use `last` for the
/// next iteration, waited for by the first op whose predecessors after `last`
/// cover the d2h copy (see [`offload`]).
fn out_for_next(ctx: &Ctx<'_>, cost: &dyn CostModel, t: TensorId, last: usize) -> Gap {
    let reclaim = first_covered(ctx, last, ctx.n, cost.d2h_time_s(ctx.size(t)));
    Gap {
        tensor: t,
        after: Some(last),
        before: None,
        how: Restore::Swap,
        prefetch_after: None,
        reclaim_before: (reclaim < ctx.n).then_some(reclaim),
        copy_out_after: None,
    }
}

/// The gap that brings persistent `t` in from the host before its first use
/// `first`, started so that the ops before `first` cover the h2d copy.
fn in_from_host(ctx: &Ctx<'_>, cost: &dyn CostModel, t: TensorId, first: usize) -> Gap {
    let prefetch = last_covering(ctx, first, 0, cost.h2d_time_s(ctx.size(t)));
    Gap {
        tensor: t,
        after: None,
        before: Some(first),
        how: Restore::Swap,
        prefetch_after: Some(prefetch),
        reclaim_before: None,
        copy_out_after: None,
    }
}

/// A swap of `t` over `after..before` timed around the copies of the swaps
/// in `others` (as the lowering starts those, on the order's compute
/// times, without stalls):
/// - the copy-out is counted done at the end of the earliest stretch after
///   `after` ends that overlaps none of their copy-outs, and the memory is
///   reclaimed by the first op that starts then. That is late on purpose:
///   the in-order d2h stream may run it before a copy that starts later,
///   but the op that waits for it then never stalls. Where such a stretch
///   fits wholly between the tensor's production (or its last write, or
///   its previous gap's end) and `after`, the copy starts there instead
///   ([`Gap::copy_out_after`]) and the memory is reclaimed right after the
///   gap starts;
/// - the copy-in is timed into the latest stretch that ends by the start
///   of `before` and overlaps none of their copy-ins, started after the
///   last op that ends by that stretch's start (so it may overlap an
///   earlier copy by less than an op), and not before the reclaim.
///
/// `None` when the link has no such stretches in the interval. The stretches
/// are found as TENSILE's link timeline finds its slots
/// ([`crate::tensile::link`]), over the other swaps' copies merged.
///
/// Why: [`hidden_swap`] times the copies as if the link were idle, so
/// where other swaps already use it, a recomputation turned into a swap
/// ([`Move::ToSwap`]) had its copy-in queued behind theirs and the compute
/// stream waited. With this timing and [`super::local`]'s ordering, the
/// local search turns more recomputations into swaps (RESULTS.md, issue-16
/// section, "Swaps placed on the idle link"). Placing the copy-out by
/// stream order instead (done when the copies that start before it are)
/// and the copy-in strictly clear of every other was measured too and did
/// worse (same subsection).
pub(crate) fn placed_swap(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    others: &[Gap],
    t: TensorId,
    after: usize,
    before: usize,
) -> Option<Gap> {
    let start_s = |p: usize| ctx.prefix_time_s[p];
    let end_s = |p: usize| ctx.prefix_time_s[p + 1];
    let size_bytes = ctx.size(t);
    let out_s = cost.d2h_time_s(size_bytes);
    let in_s = cost.h2d_time_s(size_bytes);
    let [busy_out, busy_in] = link_use(ctx, cost, others);
    // The copy-out may start before the gap, from where the tensor is made
    // (`Gap::copy_out_after`), where the link is idle there.
    let floor = super::early_out::resident_since(ctx, others, t, after).unwrap_or(after);
    let early = earliest_slot(&busy_out, end_s(floor), end_s(after), out_s).and_then(|s| {
        let c = ctx.ending_by(after, s).checked_sub(1)?.max(floor);
        (c < after).then_some((c, s))
    });
    let (copy_out_after, out_begin_s) = match early {
        Some((c, s)) => (Some(c), s),
        None => (
            None,
            earliest_slot(&busy_out, end_s(after), f64::INFINITY, out_s)?,
        ),
    };
    let reclaim = ctx.first_starting_from(after + 1, before, out_begin_s + out_s)?;
    let in_begin_s = latest_slot(&busy_in, 0.0, start_s(before), in_s)?;
    // The copy-in starts when its prefetch position ends: the last that
    // ends by `in_begin_s`.
    let prefetch = ctx
        .ending_by(before, in_begin_s)
        .checked_sub(1)
        .filter(|&p| p >= reclaim && p < before)?;
    Some(Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(prefetch),
        reclaim_before: Some(reclaim),
        copy_out_after,
    })
}

/// When the swaps of `gaps` keep each link busy, as sorted, disjoint
/// (start, end) seconds on the order's compute times: [d2h, h2d]. A
/// copy-out starts when its last use ends (or its early start,
/// `Gap::copy_out_after`, ends); a copy-in when its prefetch
/// position ends, or without one when its copy-out is done (at the
/// iteration's start for a tensor that begins on the host).
///
/// A swap whose tensor's host copy is still current has no copy-out (the
/// lowering skips it, see [`host_copy_current`]): a parameter brought in
/// from the host and not written since, or a batch input. Counting those
/// too, the link looked busy through the forward pass of a plan that
/// streams parameters (the PyTorch GPT-2 export at 25%), where it is mostly
/// idle.
pub(crate) fn link_use(ctx: &Ctx<'_>, cost: &dyn CostModel, gaps: &[Gap]) -> [Vec<(f64, f64)>; 2] {
    let end_s = |p: usize| ctx.prefix_time_s[p + 1];
    let (mut out, mut inward) = (Vec::new(), Vec::new());
    let current = host_copy_current(ctx, gaps);
    for (g, current) in gaps
        .iter()
        .zip(current)
        .filter(|(g, _)| g.how == Restore::Swap)
    {
        let size_bytes = ctx.size(g.tensor);
        let out_s = if current {
            0.0
        } else {
            cost.d2h_time_s(size_bytes)
        };
        // An early copy-out starts where it says (`Gap::copy_out_after`).
        let out_end_s = g.after.map(|a| {
            let from_s = end_s(g.copy_out_after.unwrap_or(a));
            if !current {
                out.push((from_s, from_s + out_s));
            }
            (from_s + out_s).max(end_s(a))
        });
        if g.before.is_some() {
            let begin_s = g.prefetch_after.map(end_s).or(out_end_s).unwrap_or(0.0);
            inward.push((begin_s, begin_s + cost.h2d_time_s(size_bytes)));
        }
    }
    [merged(out), merged(inward)]
}

/// Per gap of `gaps`: whether its tensor's host copy is current where the
/// gap starts, so that the lowering frees it without a copy-out (as
/// `outcore_plan`'s lowering decides: a batch input's always is; a
/// persistent tensor's is from the iteration's start where it begins on the
/// host; any tensor's is after a swap gap starts; an in-place write makes it
/// stale). A gap from the iteration's start has no copy-out and answers
/// `false`.
pub(crate) fn host_copy_current(ctx: &Ctx<'_>, gaps: &[Gap]) -> Vec<bool> {
    let mut by_start: Vec<usize> = (0..gaps.len()).collect();
    by_start.sort_by_key(|&i| (gaps[i].tensor, gaps[i].after.map_or(0, |a| a + 1)));
    let mut out = vec![false; gaps.len()];
    // Per tensor in turn: the position after which the host copy is
    // current (`Some(None)`: since the iteration's start).
    let mut tensor = None;
    let mut current_since: Option<Option<usize>> = None;
    for i in by_start {
        let g = &gaps[i];
        if tensor != Some(g.tensor) {
            tensor = Some(g.tensor);
            let t = ctx.graph.tensor(g.tensor);
            // Sorted by start, a gap from the iteration's start is its
            // tensor's first.
            let on_host = g.after.is_none();
            let batch_input = t.producer.is_none() && !t.is_persistent();
            current_since = (batch_input || on_host).then_some(None);
        }
        let Some(a) = g.after else {
            continue;
        };
        let writes = &ctx.writes[g.tensor.index()];
        out[i] = current_since.is_some_and(|since| {
            !writes
                .iter()
                .any(|&w| w <= a && since.is_none_or(|s| w > s))
        });
        if g.how == Restore::Swap {
            current_since = Some(Some(a));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{info, mlp_chain, v100};

    /// The saved activations made by an op (the input batch and labels
    /// have no producer).
    fn saved_feature_maps(ctx: &Ctx<'_>) -> Vec<TensorId> {
        ctx.saved_activations()
            .into_iter()
            .filter(|&t| ctx.graph.tensor(t).producer.is_some())
            .collect()
    }

    #[test]
    fn a_hidden_swap_leaves_the_copies_the_compute_they_need() {
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let t = ctx.saved_activations()[2];
        let (after, before) = ctx.forward_backward_gap(t).expect("a saved activation");
        let gap = hidden_swap(&ctx, &cost, t, after, before);
        let (p, r) = (
            gap.prefetch_after.expect("timed"),
            gap.reclaim_before.expect("timed"),
        );
        assert!(
            after <= r && r <= p && p < before,
            "{after} {r} {p} {before}"
        );
        // The ops between the reclaim point and the offload cover the d2h copy
        // unless the reclaim point had to stop at the gap's end.
        let size = ctx.size(t);
        assert!(r == before || ctx.time_s(after + 1, r) >= cost.d2h_time_s(size));
        // Likewise the ops after the prefetch point cover the h2d copy.
        assert!(p == r || ctx.time_s(p + 1, before) >= cost.h2d_time_s(size));
    }

    #[test]
    fn every_gap_offers_a_drop_and_swaps_offer_retiming() {
        let g = mlp_chain(8, 512, 64);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let saved = saved_feature_maps(&ctx);
        // A tensor whose producer's inputs are still on the device where it
        // is needed again, so that recomputing it needs no chain.
        let empty = ctx.schedule(Vec::new());
        let swapped = saved
            .iter()
            .copied()
            .find(|&t| {
                ctx.forward_backward_gap(t)
                    .is_some_and(|(_, b)| inputs_resident(&ctx, &empty, t, b))
            })
            .expect("an mlp has such a tensor");
        let recomputed = *saved.iter().find(|&&t| t != swapped).expect("saved");
        let (a, b) = ctx.forward_backward_gap(swapped).expect("saved");
        let gaps = vec![
            Gap {
                tensor: swapped,
                after: Some(a),
                before: Some(b),
                how: Restore::Swap,
                prefetch_after: Some(a),
                reclaim_before: Some(a + 1),
                copy_out_after: None,
            },
            Gap {
                tensor: recomputed,
                after: ctx.forward_backward_gap(recomputed).map(|x| x.0),
                before: ctx.forward_backward_gap(recomputed).map(|x| x.1),
                how: Restore::Recompute,
                prefetch_after: None,
                reclaim_before: None,
                copy_out_after: None,
            },
        ];
        let schedule = ctx.schedule(gaps);
        let hood = Neighbourhood::of(&ctx, &schedule, Kinds::All);
        let mut moves = Vec::new();
        hood.moves(&ctx, &schedule, &mut moves);
        assert!(moves.contains(&Move::Drop { gap: 0 }));
        assert!(moves.contains(&Move::Drop { gap: 1 }));
        assert!(moves.contains(&Move::ToRecompute { gap: 0 }));
        assert!(moves.contains(&Move::ToSwap { gap: 1 }));
        // Prefetch at `a`: only "later" differs, halfway to the use.
        assert!(moves.contains(&Move::Retime {
            gap: 0,
            prefetch_after: a + (b - a) / 2
        }));
        // Drop removes exactly that gap.
        let dropped = apply(&ctx, &cost, &schedule, Move::Drop { gap: 0 });
        assert_eq!(dropped.gaps.len(), 1);
        assert_eq!(dropped.gaps[0].tensor, recomputed);
        // An exchange partner is an ungapped saved activation covering the gap.
        for m in &moves {
            if let Move::Exchange {
                gap,
                tensor,
                after: pa,
                before: pb,
            } = *m
            {
                let g = &schedule.gaps[gap];
                assert!(pa <= g.after.unwrap_or(0) && pb >= g.before.unwrap_or(usize::MAX));
                assert!(tensor != swapped && tensor != recomputed);
            }
        }
    }

    /// Every swap-in, an offload's from the iteration's start included, is
    /// offered its near and spread triggers, all inside its gap; nothing
    /// else is offered, and every retimed schedule still lowers and verifies.
    #[test]
    fn the_swap_timing_neighbourhood_retimes_every_swap_in_and_nothing_else() {
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let saved = saved_feature_maps(&ctx);
        let swapped = saved[1];
        let (a, b) = ctx.forward_backward_gap(swapped).expect("saved");
        // A tensor whose recomputation needs no chain, as in
        // `every_gap_offers_a_drop_and_swaps_offer_retiming`.
        let empty = ctx.schedule(Vec::new());
        let (recomputed, (ra, rb)) = saved
            .iter()
            .filter(|&&t| t != swapped)
            .find_map(|&t| {
                let (ra, rb) = ctx.forward_backward_gap(t)?;
                let reads_swapped = g
                    .tensor(t)
                    .producer
                    .is_some_and(|p| g.op(p).inputs.contains(&swapped));
                (inputs_resident(&ctx, &empty, t, rb) && !reads_swapped).then_some((t, (ra, rb)))
            })
            .expect("an mlp has such a tensor");
        // A weight used after the first position, kept on the host between
        // iterations: swapped in from the start, out after its last use.
        let weight = ctx
            .owners()
            .find(|&t| ctx.persistent(t) && ctx.uses[t.index()].first().is_some_and(|&f| f > 20))
            .expect("a later layer's weight");
        let uses = &ctx.uses[weight.index()];
        let (first, last) = (uses[0], *uses.last().expect("used"));
        let middle = a + (b - a) / 2;
        let mut gaps = vec![
            Gap {
                tensor: swapped,
                after: Some(a),
                before: Some(b),
                how: Restore::Swap,
                prefetch_after: Some(middle),
                reclaim_before: Some(a + 1),
                copy_out_after: None,
            },
            recompute_gap(recomputed, ra, rb),
        ];
        gaps.extend(offload(&ctx, &cost, weight, first, last));
        let schedule = ctx.schedule(gaps);
        let hood = Neighbourhood::of(&ctx, &schedule, Kinds::SwapTiming);
        let mut moves = Vec::new();
        hood.moves(&ctx, &schedule, &mut moves);
        let mut repairs = vec![Move::Drop { gap: 0 }];
        hood.repairs(&ctx, &schedule, &mut repairs);
        assert!(repairs.is_empty(), "{repairs:?}");
        let mut retimed = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for m in &moves {
            let Move::Retime {
                gap,
                prefetch_after,
            } = *m
            else {
                panic!("{m:?} in the swap-timing neighbourhood");
            };
            retimed[gap].push(prefetch_after);
        }
        // The swapped activation: the 8 triggers either side of its own, and
        // 8 spread from the gap's start, all within the gap and not its own.
        let near: Vec<usize> = (middle - RETIME_NEAR..=middle + RETIME_NEAR)
            .filter(|&q| q != middle)
            .collect();
        assert!(
            near.iter().all(|q| retimed[0].contains(q)),
            "{:?}",
            retimed[0]
        );
        assert!(retimed[0].contains(&a));
        assert!(retimed[0].iter().all(|&q| a <= q && q < b && q != middle));
        assert!(retimed[0].len() <= 2 * RETIME_NEAR + RETIME_SPREAD);
        // Neither the recomputation nor the swap-out for the next iteration
        // (no swap-in) is retimed.
        assert!(retimed[1].is_empty() && retimed[2].is_empty());
        // The weight's swap-in from the start: triggers from position 0 on.
        assert!(retimed[3].contains(&0), "{:?}", retimed[3]);
        assert!(retimed[3].iter().all(|&q| q < first));
        let request = outcore_plan::PlanRequest::new(&g, &cost, u64::MAX);
        let search = crate::framework::Search::new(&ctx, &request, "test");
        let mut scratch = crate::framework::Scratch::default();
        for m in &moves {
            let next = apply(&ctx, &cost, &schedule, *m);
            let score = search.score(&next, &mut scratch);
            assert!(
                matches!(score, Ok(crate::framework::Score::Feasible { .. })),
                "{m:?}: {score:?}"
            );
        }
    }

    #[test]
    fn the_recompute_only_neighbourhood_offers_no_swap() {
        let g = mlp_chain(8, 512, 64);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let empty = ctx.schedule(Vec::new());
        // Every feature map whose recomputation needs no chain, recomputed.
        let gaps: Vec<Gap> = ctx
            .saved_activations()
            .into_iter()
            .filter(|&t| g.tensor(t).producer.is_some())
            .filter_map(|t| {
                let (a, b) = ctx.forward_backward_gap(t)?;
                inputs_resident(&ctx, &empty, t, b).then(|| recompute_gap(t, a, b))
            })
            .collect();
        assert!(!gaps.is_empty(), "an mlp has such a tensor");
        let mut offered = Vec::new();
        // With nothing recomputed, the repairs add recomputations; with every
        // such tensor recomputed, the moves keep or exchange them.
        for schedule in [empty.clone(), ctx.schedule(gaps.clone())] {
            let hood = Neighbourhood::of(&ctx, &schedule, Kinds::RecomputeOnly);
            let mut moves = Vec::new();
            hood.moves(&ctx, &schedule, &mut moves);
            let mut repairs = Vec::new();
            hood.repairs(&ctx, &schedule, &mut repairs);
            for m in moves.iter().chain(&repairs) {
                assert!(
                    matches!(
                        m,
                        Move::Drop { .. }
                            | Move::ExchangeRecompute { .. }
                            | Move::AddRecompute { .. }
                    ),
                    "{m:?} in a recompute-only neighbourhood"
                );
                let next = apply(&ctx, &cost, &schedule, *m);
                assert!(next.gaps.iter().all(|x| x.how == Restore::Recompute));
                offered.push((schedule.clone(), *m));
            }
        }
        assert!(
            offered
                .iter()
                .any(|(_, m)| matches!(m, Move::AddRecompute { .. }))
        );
        assert!(offered.iter().any(|(_, m)| matches!(m, Move::Drop { .. })));
        let moves: Vec<Move> = offered.iter().map(|(_, m)| *m).collect();
        let schedule = ctx.schedule(gaps);
        // An exchange keeps one recomputed tensor and recomputes another instead.
        let exchange = moves
            .iter()
            .find(|m| matches!(m, Move::ExchangeRecompute { .. }));
        if let Some(&Move::ExchangeRecompute { gap, tensor, .. }) = exchange {
            let next = apply(&ctx, &cost, &schedule, *exchange.expect("found"));
            assert_eq!(next.gaps.len(), schedule.gaps.len());
            assert_eq!(next.gaps[gap].tensor, tensor);
            assert_ne!(schedule.gaps[gap].tensor, tensor);
        }
    }

    #[test]
    fn a_placed_swap_counts_its_copy_out_after_the_others() {
        let g = mlp_chain(12, 1024, 256);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let saved = ctx.saved_activations();
        let (t, u) = (saved[2], saved[3]);
        let (after, before) = ctx.forward_backward_gap(t).expect("a saved activation");
        let (ua, ub) = ctx.forward_backward_gap(u).expect("a saved activation");
        // Alone, the placed swap is the idle-link one's equal in reach.
        let alone = placed_swap(&ctx, &cost, &[], t, after, before).expect("room on an idle link");
        let (p, r) = (alone.prefetch_after.unwrap(), alone.reclaim_before.unwrap());
        assert!(
            after < r && r <= p && p < before,
            "{after} {r} {p} {before}"
        );
        // Beside another swap (timed as if the link were idle), its
        // copy-out is counted done only after the other's where they would
        // overlap, so the memory comes back no earlier than alone; its
        // copy-in starts after the reclaim and, as alone, is timed to end
        // by the next use.
        let other = hidden_swap(&ctx, &cost, u, ua, ub);
        let placed = placed_swap(&ctx, &cost, std::slice::from_ref(&other), t, after, before)
            .expect("room around one other swap");
        assert!(placed.reclaim_before >= alone.reclaim_before);
        let (p, r) = (
            placed.prefetch_after.unwrap(),
            placed.reclaim_before.unwrap(),
        );
        assert!(r <= p && p < before, "{r} {p} {before}");
        let [_, copy_in] = link_use(&ctx, &cost, std::slice::from_ref(&placed));
        assert!(copy_in[0].1 <= ctx.prefix_time_s[before] + 1e-12);
        // The other's copy-out runs where this one's would start alone, so
        // this one's stretch is moved past it.
        let [out_other, _] = link_use(&ctx, &cost, std::slice::from_ref(&other));
        let [out_alone, _] = link_use(&ctx, &cost, std::slice::from_ref(&alone));
        let overlaps = out_other[0].0 < out_alone[0].1 && out_other[0].1 > out_alone[0].0;
        assert!(overlaps, "{out_other:?} {out_alone:?}");
        let done_s = out_other[0].1 + cost.d2h_time_s(ctx.size(t));
        assert!(ctx.prefix_time_s[r] >= done_s - 1e-12);
    }

    /// A residual block's input is read by the block's first op and again
    /// by its addition: on an idle link, the placed swap over its forward-
    /// backward gap copies it out from where it is made, done before the
    /// addition, and the memory comes back right after the gap starts.
    #[test]
    fn a_placed_swap_starts_its_copy_out_before_the_gap_where_the_link_is_idle() {
        let g =
            outcore_graph::zoo::build("resnet18", Some(2), &Default::default(), None).expect("zoo");
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let end_s = |p: usize| ctx.prefix_time_s[p + 1];
        let (t, after, before, made) = ctx
            .saved_activations()
            .into_iter()
            .filter_map(|t| {
                let (a, b) = ctx.forward_backward_gap(t)?;
                let made = ctx.uses[t.index()][0];
                // Long enough before the gap for the whole copy.
                (end_s(a) - end_s(made) > 2.0 * cost.d2h_time_s(ctx.size(t)))
                    .then_some((t, a, b, made))
            })
            .next()
            .expect("a residual input");
        let placed = placed_swap(&ctx, &cost, &[], t, after, before).expect("an idle link");
        let c = placed.copy_out_after.expect("copied out early");
        assert!(made <= c && c < after, "{made} {c} {after}");
        assert_eq!(placed.reclaim_before, Some(after + 1));
        let schedule = ctx.schedule(vec![placed]);
        let plan = outcore_plan::lower_schedule(&g, &schedule, info(), u64::MAX).expect("lowers");
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
    }

    #[test]
    fn idle_stretches_skip_overlapping_copies() {
        // How `placed_swap` finds room: the copies merged, then the slots
        // TENSILE's link timeline uses.
        let latest_idle = |busy: &[(f64, f64)], until_s: f64, len_s: f64| {
            latest_slot(&merged(busy.to_vec()), 0.0, until_s, len_s)
        };
        let earliest_idle = |busy: &[(f64, f64)], from_s: f64, len_s: f64| {
            earliest_slot(&merged(busy.to_vec()), from_s, f64::INFINITY, len_s)
        };
        // (0, 100) covers (50, 60): a stretch of 10 ending by 90 would
        // start before 0, so none; one from 5 on starts at 100.
        let busy = [(0.0, 100.0), (50.0, 60.0)];
        assert_eq!(latest_idle(&busy, 90.0, 10.0), None);
        // Two busy stretches with a hole of 10 between them.
        let busy = [(10.0, 20.0), (30.0, 40.0)];
        assert_eq!(latest_idle(&busy, 38.0, 10.0), Some(20.0));
        assert_eq!(latest_idle(&busy, 38.0, 11.0), None);
        assert_eq!(latest_idle(&busy, 50.0, 10.0), Some(40.0));
        assert_eq!(earliest_idle(&busy, 12.0, 10.0), Some(20.0));
        assert_eq!(earliest_idle(&busy, 12.0, 11.0), Some(40.0));
        assert_eq!(
            earliest_idle(&[(0.0, 100.0), (50.0, 60.0)], 5.0, 10.0),
            Some(100.0)
        );
        assert_eq!(earliest_idle(&[], 3.0, 1.0), Some(3.0));
    }
}
