//! Streamed seeds: persistent tensors kept on the host and streamed through
//! the device around their uses, with the activations recomputed by a
//! recomputation planner planned for the memory those offloads free.
//!
//! Why: where the parameters and the optimizer state alone come near the
//! budget, no recomputation planner finds a plan (each keeps every
//! persistent tensor resident) and every other seed swaps activations. On
//! BERT-base b32 at 25% of its footprint on `v100-16gb-pcie3` the
//! parameters and Adam state are 1.22 GiB against a 1.06 GiB budget; the
//! best seed (`window`) swapped 3.5 GiB of activations in per iteration,
//! 0.40 of ideal. Streaming the optimizer state instead moves its 0.82 GiB
//! in and out once, under the backward pass (in the eager-update order each
//! optimizer op runs as soon as its gradient is complete), and leaves the
//! activations to recomputation, which costs compute rather than link time.
//! The local search's `AddOffload` repair move reaches such plans only one
//! tensor at a time from a schedule far over the budget, and did not within
//! the time limit.
//!
//! What a seed is made of, for each order (the request's, and the
//! eager-update order when the joint planner plans in both) and each
//! offload set ([`OffloadSet`]):
//! 1. the offloaded tensors' bytes `X` are added to the budget, and a
//!    recomputation planner ([`RECOMPUTE_PLANNERS`]) plans for `B + X`;
//! 2. its schedule gets the offload gaps ([`super::moves::offload`]: on the
//!    host between iterations, swapped in so that compute covers the copy,
//!    out after the last use) and, for [`OffloadSet::All`] and
//!    [`OffloadSet::Large`], a hidden swap of
//!    each parameter from its last forward use to its first backward use or
//!    first recomputation reading it;
//! 3. the merged schedule is scored under the real budget; over it by `e`
//!    bytes, step 1 is planned again for `B + X - e`, bisecting where the
//!    planner has no plan (at most [`ROUNDS`] rounds, `merge_rounds`):
//!    the offloaded tensors are present around their uses, which the
//!    recomputation planner did not know.
//!
//! The fastest feasible merge of each (order, set) is a seed; the local
//! search then improves it like any other.
//!
//! Each set is also merged without the tensors whose copies the link
//! cannot hide under compute (`link_hidden`; typically the state of the
//! parameters updated last, the embeddings at the end of the backward pass,
//! whose copy-out would otherwise end the iteration), with the winning
//! timing and planner only. It costs the recomputation planner their bytes;
//! which is faster depends on the case, so both are seeds. Where no merge of
//! the whole set fits, the smaller set is tried with every timing and
//! planner instead; where none of those fits either, the whole set again
//! with the large parameters, then every parameter, also off the device
//! from its last read in the backward pass to its update
//! ([`Variant::updates`], [`UpdateGaps`], `update_interval`).
//! On the PyTorch GPT-2 export at a quarter of its footprint on
//! `v100-16gb-pcie3` every parameter's gap gave the first streamed seed
//! (0.370 s an iteration, where the fastest seed before, `window` in the
//! eager order, swapped 1.16 GB of activations and ran 0.426 s); the token
//! embedding's alone gives 0.344 s (`outcore` 0.3677 to 0.3387 s, 0.304 to
//! 0.330 of ideal, at 5 s).
//!
//! Step 1 for DTR also runs with a budget per position ([`DTR_BY_POSITION`]):
//! the budget plus the offloaded bytes that are off the device at that
//! position, rather than plus all of them everywhere. Measured on
//! `tools/examples/vgg16_b32.json` (in-place ReLUs) at 50% on
//! `v100-16gb-pcie3`: no streamed seed had a plan before; by position, the
//! optimizer state's merge gave 0.68 of ideal, the link-hidden set of every
//! persistent tensor 0.69, and `outcore` went from 0.54 to 0.86 of ideal
//! (`outcore compare --graph tools/examples/vgg16_b32.json --device
//! v100-16gb-pcie3 --budget 50% --planners outcore --seconds 5`, at
//! 36007aa). Since the eager-update order stopped hoisting the momentum
//! updates to the iteration's start (b7e050e), no optimizer-state merge is
//! among the seeds there, and the same command gives 0.66 (at af00cc7; the
//! best seed is the large set's). On the benchmark suite's graphs it
//! changed no plan at 36007aa: in their VGG-16 export (out-of-place ReLUs)
//! the hoisted momentum product left DTR too little to evict.

use super::{Round, moves};
use crate::framework::{Ctx, graph_order};
use outcore_cost::CostModel;
use outcore_graph::{OpId, Phase, TensorId};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, PlannerError, Restore, Schedule};
use std::time::Instant;

/// The recomputation planners whose plans the offloads are merged into:
/// the fast ones (milliseconds on the suite's graphs), and DTR run against
/// the memory the offloads leave at each position ([`DTR_BY_POSITION`]).
pub const RECOMPUTE_PLANNERS: [&str; 5] = [
    "checkpoint-greedy",
    "checkpoint-sqrt",
    "dtr",
    DTR_BY_POSITION,
    DTR_KEPT_BY_POSITION,
];

/// DTR planned with a budget per position (`crate::dtr::dtr_gaps_under`):
/// the request's budget plus the bytes of the offloaded tensors that are
/// off the device at that position (DTR counts every persistent tensor as
/// resident), rather than the budget plus all their bytes everywhere. The
/// others see room for activations where the streamed tensors are in fact
/// on the device, and the merge goes over the budget there.
pub const DTR_BY_POSITION: &str = "dtr by position";

/// [`DTR_BY_POSITION`] keeping the dead storages it rematerialises for
/// recomputations (`crate::dtr::Remade::Kept`; see [`super::kept`]).
pub const DTR_KEPT_BY_POSITION: &str = "dtr by position, chain links kept";

/// Plans per (order, variant, planner): the first for `B + X`, then lower
/// (`merge_rounds`).
pub const ROUNDS: usize = 6;

/// Which persistent tensors a seed keeps on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadSet {
    /// Those only optimizer ops use (optimizer state): each is on the device
    /// only around its update.
    OptimizerState,
    /// Every persistent tensor: the optimizer state as above, and the
    /// parameters also swapped out between their forward and backward uses.
    All,
    /// The persistent tensors of at least [`LARGE_SHARE`] of the budget,
    /// streamed as [`OffloadSet::All`] streams them.
    ///
    /// Why: streaming every persistent tensor can ask more of the link than
    /// compute hides, and the optimizer state alone may free too little. On
    /// VGG-16 the classifier's first layer holds 392 MiB of weights and as
    /// much momentum, three quarters of the persistent bytes; streamed with
    /// the rest, the copies queued late and held memory, so that no merge
    /// fit. With this set, `outcore` on VGG-16 b64 at 50% went from no plan
    /// (no planner had one) to 0.895 / 0.886 of ideal (`h100-80gb` /
    /// `v100-16gb-pcie3`), and on the suite's PyTorch VGG-16 b32 export at
    /// 50% from 0.629 / 0.599 to 0.680 / 0.638 (`outcore bench-suite
    /// --planners outcore --seconds 5`; no other case of the suite moved by
    /// more than 0.005). A sixteenth is a choice: the tensors it takes are
    /// each large enough to matter at the peak and few enough to copy.
    Large,
}

impl OffloadSet {
    pub(super) fn label(self) -> &'static str {
        match self {
            OffloadSet::OptimizerState => "optimizer state",
            OffloadSet::All => "all persistent",
            OffloadSet::Large => "large persistent",
        }
    }
}

/// How the offloads' copies are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// Each copy on its own ([`moves::offload`]): the least memory held,
    /// stalls where copies queue.
    Each,
    /// As queues on each link (`queued_offloads`): fewer stalls, more memory
    /// held by copies that start early.
    Queued,
}

impl Timing {
    fn label(self) -> &'static str {
        match self {
            Timing::Each => "each",
            Timing::Queued => "queued",
        }
    }
}

/// One way to make a streamed seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub set: OffloadSet,
    pub timing: Timing,
    /// Which chosen parameters are also off the device from their last read
    /// in the backward pass to their update (`update_interval`); only for
    /// a set none of whose merges fits without (see [`streamed_seeds`]).
    pub updates: UpdateGaps,
}

/// Which chosen parameters get an update gap (`update_interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateGaps {
    /// None.
    No,
    /// Those of at least [`LARGE_SHARE`] of the budget, tried first.
    ///
    /// Why: the gap is there for a tied parameter read early in the
    /// backward pass and updated at its end (the token embedding); given to
    /// every parameter, it costs each a copy in between a read and an
    /// update a few ops later. On the PyTorch GPT-2 export at a quarter of
    /// its footprint on `v100-16gb-pcie3` that was 0.46 GiB of the plan's
    /// 2.39 GiB of copies in (each weight copied in again about 2 ms after
    /// its backward read).
    Large,
    /// Every chosen parameter, where no merge with [`UpdateGaps::Large`]
    /// fits.
    Every,
}

/// Every variant: which of them is fastest depends on the graph and the
/// budget. Measured while building this, before the rounds bisected, on
/// BERT-base b32 at 25% on `v100-16gb-pcie3` in the eager order: the
/// optimizer state timed one by one gave 0.61 of ideal and queued had no
/// plan; every persistent tensor queued gave 0.71, one by one 0.56. On
/// BERT-base at 50% on `h100-80gb` the fastest is the optimizer state
/// queued. The large tensors alone came last (`OffloadSet::Large`).
pub const VARIANTS: [Variant; 6] = [
    Variant {
        set: OffloadSet::OptimizerState,
        timing: Timing::Each,
        updates: UpdateGaps::No,
    },
    Variant {
        set: OffloadSet::OptimizerState,
        timing: Timing::Queued,
        updates: UpdateGaps::No,
    },
    Variant {
        set: OffloadSet::All,
        timing: Timing::Each,
        updates: UpdateGaps::No,
    },
    Variant {
        set: OffloadSet::All,
        timing: Timing::Queued,
        updates: UpdateGaps::No,
    },
    Variant {
        set: OffloadSet::Large,
        timing: Timing::Each,
        updates: UpdateGaps::No,
    },
    Variant {
        set: OffloadSet::Large,
        timing: Timing::Queued,
        updates: UpdateGaps::No,
    },
];

/// Share of the budget from which a persistent tensor is in
/// [`OffloadSet::Large`].
pub const LARGE_SHARE: f64 = 1.0 / 16.0;

/// The streamed seeds for `request` on `order` (`None`: the graph's), each
/// named after its set and planner, planned until `until`: for each offload
/// set, the fastest feasible merge over timings and recomputation planners.
/// `counted`: a search bounded by counts (`Joint::bounded_by_moves`), whose
/// recomputation plans are not cut at [`super::INNER_PLAN_LIMIT_S`]
/// ([`super::inner_plan_limit_s`]).
pub fn streamed_seeds(
    request: &PlanRequest<'_>,
    order: Option<&[OpId]>,
    until: Instant,
    counted: bool,
) -> Vec<(String, Result<PlanOutcome, PlannerError>)> {
    let order = order.map_or_else(|| graph_order(request.graph), <[OpId]>::to_vec);
    let ctx = Ctx::new(request.graph, request.cost, order);
    let mut out = Vec::new();
    for set in [
        OffloadSet::OptimizerState,
        OffloadSet::All,
        OffloadSet::Large,
    ] {
        let chosen = offloaded(&ctx, request.cost, set, request.budget_bytes);
        if chosen.is_empty() {
            continue;
        }
        let best = best_merge(request, &ctx, &chosen, set, UpdateGaps::No, until, counted);
        let hidden = link_hidden(&ctx, request.cost, chosen.clone());
        let hidden_differs = !hidden.is_empty() && hidden.len() < chosen.len();
        let Some(best) = best else {
            // No merge of the whole set fits: the same search over what the
            // link can hide, and then over the whole set with the parameters
            // also off the device until their updates.
            let mut fallback = None;
            if hidden_differs {
                fallback = best_merge(request, &ctx, &hidden, set, UpdateGaps::No, until, counted)
                    .map(|m| ("streamed link-hidden", m));
            }
            for updates in [UpdateGaps::Large, UpdateGaps::Every] {
                if fallback.is_none() && set != OffloadSet::OptimizerState {
                    fallback = best_merge(request, &ctx, &chosen, set, updates, until, counted)
                        .map(|m| ("streamed", m));
                }
            }
            if let Some((kind, m)) = fallback {
                let name = seed_name(kind, set, m.planner, m.variant);
                out.push((
                    name.clone(),
                    super::prove_seed(request, "streamed", &name, m.schedule),
                ));
            }
            continue;
        };
        // The same set without what the link cannot hide, merged with the
        // winner's timing, its planner first (every combination would
        // double the cost).
        if hidden_differs {
            let planners = std::iter::once(best.planner).chain(
                RECOMPUTE_PLANNERS
                    .into_iter()
                    .filter(|&p| p != best.planner),
            );
            for planner in planners {
                if let Some((_, schedule)) = merge_rounds(
                    request,
                    &ctx,
                    &hidden,
                    best.variant,
                    planner,
                    until,
                    counted,
                ) {
                    let name = seed_name("streamed link-hidden", set, planner, best.variant);
                    out.push((
                        name.clone(),
                        super::prove_seed(request, "streamed", &name, schedule),
                    ));
                    break;
                }
            }
        }
        let name = seed_name("streamed", set, best.planner, best.variant);
        out.push((
            name.clone(),
            super::prove_seed(request, "streamed", &name, best.schedule),
        ));
    }
    out
}

/// The fastest feasible merge of `chosen` over the set's timings and the
/// recomputation planners (with [`Variant::updates`] as `updates` says), or
/// `None`.
fn best_merge(
    request: &PlanRequest<'_>,
    ctx: &Ctx<'_>,
    chosen: &[(TensorId, usize, usize)],
    set: OffloadSet,
    updates: UpdateGaps,
    until: Instant,
    counted: bool,
) -> Option<Merge> {
    let mut best: Option<Merge> = None;
    for variant in VARIANTS.iter().filter(|v| v.set == set) {
        let variant = &Variant {
            updates,
            ..*variant
        };
        for planner in RECOMPUTE_PLANNERS {
            if Instant::now() >= until {
                return best;
            }
            if let Some((time_s, schedule)) =
                merge_rounds(request, ctx, chosen, *variant, planner, until, counted)
                && best.as_ref().is_none_or(|b| time_s < b.time_s)
            {
                best = Some(Merge {
                    time_s,
                    variant: *variant,
                    planner,
                    schedule,
                });
            }
        }
    }
    best
}

/// The fastest merge of one offload set.
struct Merge {
    time_s: f64,
    variant: Variant,
    planner: &'static str,
    schedule: Schedule,
}

/// A streamed seed's name: `kind`, its set, its planner and timing, and
/// whether the parameters are off the device until their updates.
fn seed_name(kind: &str, set: OffloadSet, planner: &str, variant: Variant) -> String {
    format!(
        "{kind} {} + {planner}, {}",
        set.label(),
        variant_label(variant)
    )
}

/// A variant's timing, and whether the parameters are off the device until
/// their updates.
pub(super) fn variant_label(variant: Variant) -> String {
    format!(
        "{} timing{}",
        variant.timing.label(),
        match variant.updates {
            UpdateGaps::No => "",
            UpdateGaps::Large => ", large ones off until updates",
            UpdateGaps::Every => ", off until updates",
        }
    )
}

/// Plans `planner` for the budget plus the set's bytes ([`DTR_BY_POSITION`]:
/// plus those absent at each position), merges the offloads timed by
/// `timing` and scores the merge. Over the budget by `e` bytes, the
/// planner's budget goes down by `e`; where the planner then finds no plan,
/// the next budget is halfway between that one and the last over-budget
/// merge's. The first feasible merge (the one at the largest planner budget
/// tried) and its time.
fn merge_rounds(
    request: &PlanRequest<'_>,
    ctx: &Ctx<'_>,
    chosen: &[(TensorId, usize, usize)],
    variant: Variant,
    planner: &str,
    until: Instant,
    counted: bool,
) -> Option<(f64, Schedule)> {
    let base_plan = BasePlanner::new(ctx, request, chosen, variant, planner)?;
    let round = |next| {
        Some(match base_plan.plan(next, until, counted).ok()? {
            Some(base) => {
                Round::Merged(ctx.schedule(merged_gaps(ctx, request, &base, chosen, variant)))
            }
            None => Round::NoPlan,
        })
    };
    let first_bytes = base_plan.first_budget(request.budget_bytes);
    super::run_merge_rounds(request, ctx, first_bytes, ROUNDS, until, round)
}

/// The recomputation plan a merge starts from, at a budget the rounds lower.
enum BasePlanner<'c, 'r> {
    /// A planner of the registry, planned for one budget.
    Named {
        planner: Box<dyn crate::Planner>,
        request: &'c PlanRequest<'r>,
        order: &'c [OpId],
        offloaded_bytes: u64,
    },
    /// DTR under the budget plus `absent_bytes[k]` at position `k`.
    DtrByPosition {
        ctx: &'c Ctx<'r>,
        facts: Box<crate::remat::RematFacts>,
        absent_bytes: Vec<u64>,
        remade: crate::dtr::Remade,
    },
}

impl<'c, 'r> BasePlanner<'c, 'r> {
    fn new(
        ctx: &'c Ctx<'r>,
        request: &'c PlanRequest<'r>,
        chosen: &[(TensorId, usize, usize)],
        variant: Variant,
        planner: &str,
    ) -> Option<Self> {
        let remade = match planner {
            DTR_BY_POSITION => crate::dtr::Remade::Evicted,
            DTR_KEPT_BY_POSITION => crate::dtr::Remade::Kept,
            _ => {
                return Some(BasePlanner::Named {
                    planner: crate::by_name(planner).ok()?,
                    request,
                    order: &ctx.order,
                    offloaded_bytes: chosen.iter().map(|&(t, _, _)| ctx.size(t)).sum(),
                });
            }
        };
        // Where the offloads alone keep each tensor off the device.
        let offloads = offload_gaps(ctx, request, chosen, variant);
        Some(BasePlanner::DtrByPosition {
            ctx,
            facts: Box::new(crate::remat::RematFacts::new(ctx)),
            absent_bytes: crate::framework::absent_bytes(ctx, &offloads),
            remade,
        })
    }

    /// The first budget tried: the request's plus every offloaded byte for
    /// a planner that sees one budget, the request's for DTR by position
    /// (which adds what is absent where it is absent).
    fn first_budget(&self, budget_bytes: u64) -> u64 {
        match self {
            BasePlanner::Named {
                offloaded_bytes, ..
            } => budget_bytes.saturating_add(*offloaded_bytes),
            BasePlanner::DtrByPosition { .. } => budget_bytes,
        }
    }

    /// The plan's schedule at `budget_bytes`: `Ok(None)` where the planner
    /// has none, `Err` where it failed otherwise or planned another order.
    /// A named planner gets the time left until `until`, at most
    /// [`super::INNER_PLAN_LIMIT_S`] unless `counted`
    /// ([`super::inner_plan_limit_s`]).
    fn plan(
        &self,
        budget_bytes: u64,
        until: Instant,
        counted: bool,
    ) -> Result<Option<Schedule>, ()> {
        match self {
            BasePlanner::Named {
                planner,
                request,
                order,
                ..
            } => {
                let sub = PlanRequest {
                    budget_bytes,
                    order: Some(order),
                    time_limit_s: super::inner_plan_limit_s(counted, until),
                    ..**request
                };
                let plan = match planner.plan(&sub) {
                    Ok(PlanOutcome::Feasible(plan)) => plan,
                    Ok(PlanOutcome::Infeasible(_)) => return Ok(None),
                    Err(_) => return Err(()),
                };
                let base = plan.lowered_from.ok_or(())?;
                if base.order != *order {
                    return Err(());
                }
                Ok(Some(std::sync::Arc::unwrap_or_clone(base)))
            }
            BasePlanner::DtrByPosition {
                ctx,
                facts,
                absent_bytes,
                remade,
            } => {
                let budget_at: Vec<u64> = absent_bytes
                    .iter()
                    .map(|&a| budget_bytes.saturating_add(a))
                    .collect();
                Ok(
                    crate::dtr::dtr_gaps_under_remade(ctx, facts, &budget_at, *remade)
                        .map(|g| ctx.schedule(g)),
                )
            }
        }
    }
}

/// The set's persistent storage owners with their first and last use
/// position, for those used after the first position (one used by the first
/// op gains nothing from starting on the host) and, for
/// [`OffloadSet::All`], not [`latency_bound`]; `budget_bytes` sets what is
/// large and how many bytes stay resident as latency-bound.
pub(super) fn offloaded(
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    set: OffloadSet,
    budget_bytes: u64,
) -> Vec<(TensorId, usize, usize)> {
    let large = large_bytes(budget_bytes);
    let resident = match set {
        OffloadSet::All => latency_bound(ctx, cost, budget_bytes),
        OffloadSet::OptimizerState | OffloadSet::Large => Vec::new(),
    };
    ctx.owners()
        .filter(|&t| ctx.persistent(t) && ctx.size(t) > 0)
        .filter(|&t| match set {
            OffloadSet::OptimizerState => optimizer_only(ctx, t),
            OffloadSet::All => !resident[t.index()],
            OffloadSet::Large => ctx.size(t) >= large,
        })
        .filter_map(|t| {
            let uses = &ctx.uses[t.index()];
            let (&first, &last) = (uses.first()?, uses.last()?);
            (first > 0).then_some((t, first, last))
        })
        .collect()
}

/// Share of the budget that persistent tensors too small to stream
/// ([`latency_bound`]) may keep resident.
pub const LATENCY_BOUND_SHARE: f64 = 1.0 / 64.0;

/// Per tensor: whether it is a persistent storage owner that the streamed
/// seeds keep resident because its copies would be mostly latency: at most
/// as many bytes as the slower direction moves in one copy's latency (so
/// each copy spends at least half its time in latency), taken smallest
/// first while their sum stays within [`LATENCY_BOUND_SHARE`] of the
/// budget.
///
/// Why: each copy pays the link's fixed latency whatever its size. The
/// PyTorch GPT-2 export's layer norms and biases and their Adam moments
/// (about 300 tensors of at most 12 KiB, 2 MiB together) were each copied
/// in and out once an iteration: on `h100-80gb` at a quarter of its
/// footprint, 392 of the plan's 603 copies in and 294 of its 455 copies out,
/// 4.0 and 3.0 ms of a link that bounded the iteration (0.0622 s), for
/// 0.2% of the budget. Kept resident, the plan took 0.0521 s. The share is
/// a cap for graphs with thousands of such tensors: kept alone, they would
/// leave the recomputation planners that much less room.
///
/// Only [`OffloadSet::All`] keeps them. Kept by the optimizer-state set
/// too, the seeds that won at 50% of the footprint (optimizer state
/// streamed, activations recomputed or offloaded) came out slower, in one
/// direct run of each build (`outcore plan ... --seconds 5`): the GPT-2
/// export on `v100-16gb-pcie3` 0.911 to 0.898 of ideal, BERT-base b32 on
/// `h100-80gb` 0.938 to 0.932, the VGG-16 export on `v100-16gb-pcie3` 0.923
/// to 0.909, and likewise in a suite run against two of the build before
/// (RESULTS.md). Not explained: the GPT-2 plan copied fewer bytes and
/// recomputed less, yet stalled more.
pub(super) fn latency_bound(ctx: &Ctx<'_>, cost: &dyn CostModel, budget_bytes: u64) -> Vec<bool> {
    let rates = cost.copy_rates();
    let slower_bytes_per_s = rates.one_way_bytes_per_s[0].min(rates.one_way_bytes_per_s[1]);
    let small_bytes = rates.latency_s * slower_bytes_per_s;
    let cap_bytes = budget_bytes as f64 * LATENCY_BOUND_SHARE;
    let mut small: Vec<TensorId> = ctx
        .owners()
        .filter(|&t| ctx.persistent(t) && ctx.size(t) > 0 && ctx.size(t) as f64 <= small_bytes)
        .collect();
    small.sort_by_key(|&t| (ctx.size(t), t));
    let mut resident = vec![false; ctx.graph.tensors.len()];
    let mut kept_bytes = 0.0;
    for t in small {
        kept_bytes += ctx.size(t) as f64;
        if kept_bytes > cap_bytes {
            break;
        }
        resident[t.index()] = true;
    }
    resident
}

/// `chosen` without the tensors whose offload copies the link cannot hide
/// under compute, as queues: walking back from the end of the order, the
/// copy-outs (each after its tensor's last use) queued one after another
/// must end by the end of the order, and walking forward from its start, the
/// copy-ins (each before its first use) must fit into the compute before
/// that use; a tensor whose copy would not is left on the device (its copy
/// leaves the queue). Why: on BERT-base b32 at 25% on `v100-16gb-pcie3`,
/// the word embeddings' Adam state (179 MiB) was swapped in for the update
/// that ends the backward pass and out again after it, with no compute left
/// to cover either: 12 ms of stalls near the end, then 15 ms of copy-outs
/// alone, of a 290 ms iteration.
/// Times are the order's compute prefix sums, without stalls.
fn link_hidden(
    ctx: &Ctx<'_>,
    cost: &dyn outcore_cost::CostModel,
    chosen: Vec<(TensorId, usize, usize)>,
) -> Vec<(TensorId, usize, usize)> {
    let total_s = ctx.prefix_time_s[ctx.n];
    let mut keep = vec![true; chosen.len()];
    // Copy-outs, latest last use first.
    let mut idx: Vec<usize> = (0..chosen.len()).collect();
    idx.sort_by_key(|&i| (std::cmp::Reverse(chosen[i].2), chosen[i].0));
    let mut queued_s = 0.0;
    for &i in &idx {
        let (t, _, last) = chosen[i];
        let copy_s = cost.d2h_time_s(ctx.size(t));
        if queued_s + copy_s > total_s - ctx.prefix_time_s[last + 1] {
            keep[i] = false;
        } else {
            queued_s += copy_s;
        }
    }
    // Copy-ins, earliest first use first.
    idx.sort_by_key(|&i| (chosen[i].1, chosen[i].0));
    let mut queued_s = 0.0;
    for &i in &idx {
        if !keep[i] {
            continue;
        }
        let (t, first, _) = chosen[i];
        let copy_s = cost.h2d_time_s(ctx.size(t));
        if queued_s + copy_s > ctx.prefix_time_s[first] {
            keep[i] = false;
        } else {
            queued_s += copy_s;
        }
    }
    chosen
        .into_iter()
        .zip(keep)
        .filter_map(|(c, kept)| kept.then_some(c))
        .collect()
}

/// The size from which a persistent tensor is large ([`LARGE_SHARE`]).
fn large_bytes(budget_bytes: u64) -> u64 {
    (budget_bytes as f64 * LARGE_SHARE) as u64
}

/// Whether every use of `t` is by an optimizer op.
fn optimizer_only(ctx: &Ctx<'_>, t: TensorId) -> bool {
    ctx.uses[t.index()]
        .iter()
        .all(|&p| ctx.op_at(p).phase == Phase::Optimizer)
}

/// `base`'s gaps with the offloads of `chosen` added (persistent tensors
/// `base` already takes off the device are left as they are), their copies
/// timed by `variant.timing`, and, for [`OffloadSet::All`] and
/// [`OffloadSet::Large`], each chosen tensor's forward-to-backward interval
/// swapped ([`moves::swap_interval`]: it ends before the first
/// recomputation or in-place write that reads it) with a hidden swap, and
/// with [`Variant::updates`] its interval from the backward pass to its
/// update too ([`update_interval`]). Only the offloads
/// queue: queueing the parameters' round trips too started their swap-ins
/// earlier, and on BERT-base b32 at 25% the extra memory left no feasible
/// merge (0.64 of ideal, against 0.74).
pub(super) fn merged_gaps(
    ctx: &Ctx<'_>,
    request: &PlanRequest<'_>,
    base: &Schedule,
    chosen: &[(TensorId, usize, usize)],
    variant: Variant,
) -> Vec<Gap> {
    let mut gapped = vec![false; ctx.graph.tensors.len()];
    for g in &base.gaps {
        gapped[g.tensor.index()] = true;
    }
    let offloads: Vec<(TensorId, usize, usize)> = chosen
        .iter()
        .copied()
        .filter(|c| !gapped[c.0.index()])
        .collect();
    let mut gaps = base.gaps.clone();
    match variant.timing {
        Timing::Queued => gaps.extend(queued_offloads(ctx, request.cost, &offloads)),
        Timing::Each => {
            for &(t, first, last) in &offloads {
                gaps.extend(moves::offload(ctx, request.cost, t, first, last));
            }
        }
    }
    if variant.set != OffloadSet::OptimizerState {
        let reads = moves::recompute_reads(ctx, base);
        for &(t, _, _) in &offloads {
            if let Some((after, before)) = moves::swap_interval(ctx, &reads, t) {
                gaps.push(moves::hidden_swap(ctx, request.cost, t, after, before));
            }
            let update_gap = match variant.updates {
                UpdateGaps::No => false,
                UpdateGaps::Large => ctx.size(t) >= large_bytes(request.budget_bytes),
                UpdateGaps::Every => true,
            };
            if update_gap && let Some((after, before)) = update_interval(ctx, &reads, t) {
                gaps.push(moves::hidden_swap(ctx, request.cost, t, after, before));
            }
        }
    }
    gaps
}

/// The offloads of `chosen` alone, before any recomputation plan: what
/// [`merged_gaps`] adds to an empty schedule.
pub(super) fn offload_gaps(
    ctx: &Ctx<'_>,
    request: &PlanRequest<'_>,
    chosen: &[(TensorId, usize, usize)],
    variant: Variant,
) -> Vec<Gap> {
    merged_gaps(ctx, request, &ctx.schedule(Vec::new()), chosen, variant)
}

/// The interval from a persistent tensor's last use in the backward pass
/// (an op's or a recomputation's, `reads` from [`moves::recompute_reads`])
/// to its first use by an optimizer op, when at least one op runs in
/// between; `None` when it has no backward use before its update.
///
/// Why: a tied parameter is read early in the backward pass and updated at
/// its end. The PyTorch GPT-2 export's token embedding (147 MiB) is read by
/// the LM head's backward at the start of the backward pass (and by DTR's
/// recomputations of the embedding's output) and updated at its end. Kept
/// on the device in between, it sat beside its two gradients, their sum and
/// its Adam moments coming in for the update, and every streamed merge was
/// over the budget there (DTR's of every persistent tensor by 43 MB at a
/// quarter of the footprint on `v100-16gb-pcie3`). Its host copy is still
/// current (nothing wrote it since it came in), so the gap costs one copy
/// in. Most parameters are read a few ops before their update, and their
/// gaps cost a copy each for little: in that export's eager-update order,
/// nine ops before, less compute than their copy. Tried, not kept: only the
/// gaps whose compute covers the copy; then no merge fitted there either
/// (the embedding's own gap was short where a DTR recomputation read it
/// late).
fn update_interval(ctx: &Ctx<'_>, reads: &[Vec<usize>], t: TensorId) -> Option<(usize, usize)> {
    let uses = &ctx.uses[t.index()];
    let update = *uses
        .iter()
        .find(|&&p| ctx.op_at(p).phase == Phase::Optimizer)?;
    let last_read = uses
        .iter()
        .chain(&reads[t.index()])
        .copied()
        .filter(|&p| p < update)
        .max()?;
    (last_read >= ctx.backward_start && update >= last_read + 2).then_some((last_read, update))
}

/// The offload gaps of `offloads` (each a tensor with its first and last
/// use; see [`moves::offload`]) with their copies timed as queues on each
/// link rather than one by one: the swap-ins, latest need first, each
/// finishing by the predicted start of its first use and before the next one
/// on the link starts; the swap-outs, earliest first, each starting when its
/// last use ends or the link is free, and waited for by the first op that
/// starts after the copy ends. Timed one by one, as [`moves::offload`] does,
/// a run of optimizer updates each found "enough" compute before it, and the
/// copies queued behind one another into stalls. Times are the compute
/// stream's without stalls (the order's prefix sums), the link's rate the
/// cost model's one-way rate.
fn queued_offloads(
    ctx: &Ctx<'_>,
    cost: &dyn outcore_cost::CostModel,
    offloads: &[(TensorId, usize, usize)],
) -> Vec<Gap> {
    let end_s = |p: usize| ctx.prefix_time_s[p + 1];
    // Swap-ins, backwards from the last need (`first > 0`: [`offloaded`]
    // leaves out what the first op uses).
    let mut by_first = offloads.to_vec();
    by_first.sort_by_key(|&(t, first, _)| (std::cmp::Reverse(first), t));
    let swap_ins = by_first
        .iter()
        .map(|&(t, first, _)| Gap {
            tensor: t,
            after: None,
            before: Some(first),
            how: Restore::Swap,
            prefetch_after: None,
            reclaim_before: None,
            copy_out_after: None,
        })
        .collect();
    let mut gaps = super::offloaded::queued_swap_ins(ctx, cost, swap_ins);
    gaps.reserve(offloads.len());
    // Swap-outs, forwards from the first.
    let mut by_last = offloads.to_vec();
    by_last.sort_by_key(|&(t, _, last)| (last, t));
    let mut link_busy_until_s = 0.0f64;
    for &(t, _, last) in &by_last {
        let begin_s = end_s(last).max(link_busy_until_s);
        let finish_s = begin_s + cost.d2h_time_s(ctx.size(t));
        link_busy_until_s = finish_s;
        gaps.push(Gap {
            tensor: t,
            after: Some(last),
            before: None,
            how: Restore::Swap,
            prefetch_after: None,
            // The first position after `last` that starts once the copy is done.
            reclaim_before: ctx.first_starting_from(last + 1, ctx.n, finish_s),
            copy_out_after: None,
        });
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::v100;
    use outcore_cost::CostModel;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    use outcore_graph::{DType, Graph, footprint};
    use outcore_plan::{eager_update_order, verify};
    use std::time::Duration;

    /// Eight linear + relu layers 2048 wide, trained with AdamW: the
    /// parameters and their state take 48 MiB a layer, an activation
    /// `batch` x 8 KiB (4 MiB at batch 512, where the persistent tensors
    /// outweigh the activations as in a transformer at a small batch).
    fn wide_mlp(batch: u64) -> Graph {
        mlp_2048(batch, false)
    }

    /// [`wide_mlp`] with biases: each layer adds a 8 KiB bias and its two
    /// 8 KiB Adam moments.
    fn wide_mlp_with_biases(batch: u64) -> Graph {
        mlp_2048(batch, true)
    }

    /// Eight linear + relu layers 2048 wide, with or without biases, trained
    /// with AdamW.
    fn mlp_2048(batch: u64, bias: bool) -> Graph {
        let width = 2048;
        let mut b = GraphBuilder::new("wide-mlp", batch, DType::Float32);
        let mut x = b.input("x", &[batch, width]);
        for i in 0..8 {
            let y = b.linear(&format!("fc{i}"), x, width, bias);
            x = b.relu(y);
        }
        let labels = b.label("labels", &[batch]);
        let loss = b.softmax_cross_entropy(x, labels);
        b.finish(loss, Optimizer::adamw()).expect("hand graph")
    }

    /// On `v100-16gb-pcie3` (12 GB/s each way, 10 us a copy) a copy of at
    /// most 120 kB is at least half latency: the 24 biases and moments of
    /// 8 KiB stay resident and only the 16 MiB weights and moments stream;
    /// with a budget whose 64th is 100 KiB, only the first 12 of them (96
    /// KiB) stay, and the rest stream again.
    #[test]
    fn tensors_whose_copies_are_mostly_latency_stay_resident() {
        let g = wide_mlp_with_biases(512);
        let cost = v100();
        let rates = cost.copy_rates();
        assert!((rates.latency_s * rates.one_way_bytes_per_s[0] - 120e3).abs() < 1.0);
        let ctx = Ctx::new(&g, &cost, eager_update_order(&g));
        let bias_bytes = 8 << 10;
        let small = |t: TensorId| ctx.size(t) == bias_bytes && ctx.persistent(t);
        let n_small = ctx.owners().filter(|&t| small(t)).count();
        assert_eq!(n_small, 24);
        let all = offloaded(&ctx, &cost, OffloadSet::All, 1 << 30);
        assert!(all.iter().all(|c| ctx.size(c.0) == 16 << 20), "{all:?}");
        // Every weight but the first (read by the first op) and every moment.
        assert_eq!(all.len(), 7 + 16);
        let resident = latency_bound(&ctx, &cost, 1 << 30);
        assert_eq!(resident.iter().filter(|&&r| r).count(), 24);
        // The cap: 100 KiB of the budget, twelve 8 KiB tensors.
        let capped = latency_bound(&ctx, &cost, 64 * (100 << 10));
        assert_eq!(capped.iter().filter(|&&r| r).count(), 12);
        let streamed_small = offloaded(&ctx, &cost, OffloadSet::All, 64 * (100 << 10))
            .into_iter()
            .filter(|c| small(c.0))
            .count();
        // Ties go to the lower id: the eight biases (made before the
        // optimizer's moments) and four moments stay, so the first layer's
        // bias, read by the first op and never streamed, is among them; the
        // other twelve moments stream.
        assert_eq!(streamed_small, 12);
    }

    /// Below the bytes of its parameters and Adam state, no recomputation
    /// planner has a plan (each keeps every persistent tensor resident); a
    /// streamed seed has one, verified and within the budget.
    #[test]
    fn streaming_reaches_below_the_persistent_bytes() {
        let g = wide_mlp(512);
        let cost = v100();
        let persistent: u64 = g
            .tensors
            .iter()
            .filter(|t| t.allocates() && t.is_persistent())
            .map(|t| t.size_bytes)
            .sum();
        let (footprint_bytes, _) = footprint(&g);
        let budget = persistent * 9 / 10;
        assert!(
            budget < footprint_bytes * 7 / 10,
            "{budget} of {footprint_bytes}"
        );
        let request = PlanRequest::new(&g, &cost, budget);
        for name in RECOMPUTE_PLANNERS
            .into_iter()
            .filter(|&p| p != DTR_BY_POSITION && p != DTR_KEPT_BY_POSITION)
        {
            let outcome = crate::by_name(name).expect("planner").plan(&request);
            assert!(
                matches!(outcome, Ok(PlanOutcome::Infeasible(_))),
                "{name} at {budget} B: {outcome:?}"
            );
        }
        let eager = eager_update_order(&g);
        let seeds = streamed_seeds(
            &request,
            Some(&eager),
            Instant::now() + Duration::from_secs(60),
            false,
        );
        let plans: Vec<_> = seeds
            .into_iter()
            .filter_map(|(name, outcome)| match outcome {
                Ok(PlanOutcome::Feasible(plan)) => Some((name, plan)),
                _ => None,
            })
            .collect();
        assert!(!plans.is_empty(), "no streamed seed at {budget} B");
        for (name, plan) in &plans {
            assert!(verify(plan, &g).is_empty(), "{name} fails verify");
            assert!(plan.budget_bytes <= budget, "{name}");
            // Every offloaded tensor starts the iteration on the host.
            assert!(!plan.initial_residency.is_empty(), "{name}");
        }
    }

    /// The large set is every persistent tensor of at least a sixteenth of
    /// the budget: in the wide MLP each weight and moment is 16 MiB.
    #[test]
    fn the_large_set_holds_the_tensors_of_a_sixteenth_of_the_budget() {
        let g = wide_mlp(512);
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, eager_update_order(&g));
        let tensor_bytes: u64 = 16 << 20;
        let all = offloaded(&ctx, &cost, OffloadSet::All, u64::MAX);
        let large = offloaded(&ctx, &cost, OffloadSet::Large, 16 * tensor_bytes);
        // The first layer's weight is read by the first op: not offloaded.
        assert_eq!(large.len(), 7 + 16, "weights and moments: {large:?}");
        let expected: Vec<_> = all
            .iter()
            .copied()
            .filter(|c| ctx.size(c.0) >= tensor_bytes)
            .collect();
        assert_eq!(large, expected);
        assert!(offloaded(&ctx, &cost, OffloadSet::Large, 16 * tensor_bytes + 16).is_empty());
    }

    /// Queued swap-ins, started when their trigger op ends and run one at a
    /// time in order of need, each finish by the predicted start of their
    /// first use; queued swap-outs are waited for only once the queue has
    /// copied them. At batch 4096 the compute before each update leaves the
    /// link room (each layer's backward takes about 4.4 ms, its two moments'
    /// copy 5.3 ms, and the queue reaches back into the forward pass).
    #[test]
    fn queued_copies_finish_before_their_use_one_at_a_time() {
        let g = wide_mlp(4096);
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, eager_update_order(&g));
        let chosen = offloaded(&ctx, &cost, OffloadSet::OptimizerState, u64::MAX);
        assert!(!chosen.is_empty());
        let gaps = queued_offloads(&ctx, &cost, &chosen);
        assert_eq!(gaps.len(), 2 * chosen.len());
        let mut ins: Vec<(usize, usize, u64)> = gaps
            .iter()
            .filter_map(|g| Some((g.before?, g.prefetch_after?, ctx.size(g.tensor))))
            .collect();
        ins.sort();
        // Replays the link: a copy starts when its trigger op ends and the
        // link is free.
        let mut link_free_s = 0.0f64;
        for &(first, prefetch, size) in &ins {
            assert!(
                0 < prefetch && prefetch < first,
                "trigger {prefetch} for use {first}"
            );
            let start_s = ctx.prefix_time_s[prefetch + 1].max(link_free_s);
            link_free_s = start_s + cost.h2d_time_s(size);
            assert!(
                link_free_s <= ctx.prefix_time_s[first] * (1.0 + 1e-9),
                "copy for {first} ends at {link_free_s} s, after its use at {} s",
                ctx.prefix_time_s[first]
            );
        }
        // Swap-outs of one update (a parameter's two moments) queue in
        // tensor order.
        let mut outs: Vec<(usize, TensorId, Option<usize>, u64)> = gaps
            .iter()
            .filter(|g| g.before.is_none())
            .map(|g| {
                let last = g.after.expect("out gap");
                (last, g.tensor, g.reclaim_before, ctx.size(g.tensor))
            })
            .collect();
        outs.sort();
        let mut link_busy_s = 0.0f64;
        for &(last, _, reclaim, size) in &outs {
            link_busy_s = ctx.prefix_time_s[last + 1].max(link_busy_s) + cost.d2h_time_s(size);
            if let Some(r) = reclaim {
                assert!(r > last);
                assert!(ctx.prefix_time_s[r] >= link_busy_s * (1.0 - 1e-9));
            }
        }
    }

    /// In the eager-update order the state of the parameter updated last has
    /// no compute after its update to cover its copy-out, so it is left on
    /// the device; what is kept has its copies hidden as queues (replayed
    /// here: copy-outs from the latest last use back end by the end of the
    /// order, copy-ins from the first use forward fit before their use).
    #[test]
    fn link_hidden_keeps_only_the_copies_compute_covers() {
        let g = wide_mlp(512);
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, eager_update_order(&g));
        let chosen = offloaded(&ctx, &cost, OffloadSet::OptimizerState, u64::MAX);
        let hidden = link_hidden(&ctx, &cost, chosen.clone());
        assert!(!hidden.is_empty() && hidden.len() < chosen.len());
        let last_update = chosen.iter().map(|c| c.2).max().expect("some state");
        assert!(hidden.iter().all(|c| c.2 != last_update));
        let total_s = ctx.prefix_time_s[ctx.n];
        let mut by_last = hidden.clone();
        by_last.sort_by_key(|c| std::cmp::Reverse(c.2));
        let mut queued_s = 0.0;
        for &(t, _, last) in &by_last {
            queued_s += cost.d2h_time_s(ctx.size(t));
            assert!(queued_s <= total_s - ctx.prefix_time_s[last + 1] + 1e-12);
        }
        let mut by_first = hidden;
        by_first.sort_by_key(|c| c.1);
        let mut queued_s = 0.0;
        for &(t, first, _) in &by_first {
            queued_s += cost.h2d_time_s(ctx.size(t));
            assert!(queued_s <= ctx.prefix_time_s[first] + 1e-12);
        }
    }

    /// A parameter's update interval runs from its last read in the
    /// backward pass (an op's, or a recomputation's) to its first optimizer
    /// use, with no use in between; the optimizer state, which the backward
    /// pass does not read, has none. (In the graph's order every update
    /// comes after the whole backward pass; in the eager-update order this
    /// MLP's are right after their last read, with no op between.)
    #[test]
    fn the_update_interval_runs_from_the_last_backward_read_to_the_update() {
        let g = wide_mlp(512);
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, graph_order(&g));
        let mut reads = vec![Vec::new(); g.tensors.len()];
        let mut params = 0;
        for t in ctx.owners().filter(|&t| ctx.persistent(t)) {
            let uses = &ctx.uses[t.index()];
            let interval = update_interval(&ctx, &reads, t);
            if uses.iter().all(|&p| ctx.op_at(p).phase == Phase::Optimizer) {
                assert_eq!(interval, None, "{}", g.tensor(t).name);
                continue;
            }
            let Some((after, before)) = interval else {
                // Only a parameter read right before its update has none.
                let update = uses
                    .iter()
                    .find(|&&p| ctx.op_at(p).phase == Phase::Optimizer)
                    .expect("an update");
                assert!(uses.contains(&(update - 1)), "{}", g.tensor(t).name);
                continue;
            };
            params += 1;
            assert_eq!(ctx.op_at(before).phase, Phase::Optimizer);
            assert!(after >= ctx.backward_start && before >= after + 2);
            assert!(uses.contains(&after) && uses.contains(&before));
            assert!(uses.iter().all(|&p| p <= after || p >= before));
            // A recomputation reading it in between moves the start there.
            reads[t.index()].push(before - 1);
            assert_eq!(update_interval(&ctx, &reads, t), None);
            reads[t.index()].clear();
        }
        assert!(params > 0);
    }

    /// On the PyTorch GPT-2 export at a quarter of its footprint no merge of
    /// every persistent tensor fits while a parameter stays on the device
    /// from its last read in the backward pass to its update (the tied token
    /// embedding, read at the LM head's backward and updated at the end); with
    /// the update gaps one does, verified and within the budget.
    #[test]
    fn the_gpt2_export_streams_with_parameters_off_until_their_updates() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/examples/gpt2_b4_s256_adamw.json");
        let g = outcore_graph::format::load_graph_file(&path)
            .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
        let cost = v100();
        let (footprint_bytes, _) = footprint(&g);
        let budget = footprint_bytes / 4;
        let request = PlanRequest::new(&g, &cost, budget);
        let eager = eager_update_order(&g);
        let seeds = streamed_seeds(
            &request,
            Some(&eager),
            Instant::now() + Duration::from_secs(600),
            false,
        );
        let names: Vec<&str> = seeds.iter().map(|(name, _)| name.as_str()).collect();
        let plan = seeds
            .iter()
            .find_map(|(name, outcome)| match outcome {
                Ok(PlanOutcome::Feasible(plan)) if name.contains("off until updates") => Some(plan),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no seed with update gaps among {names:?}"));
        // The embedding's gap alone is enough (the large set of the gaps).
        assert!(
            names
                .iter()
                .any(|n| n.contains("large ones off until updates")),
            "{names:?}"
        );
        assert!(verify(plan, &g).is_empty());
        assert!(plan.budget_bytes <= budget);
    }
}
