//! HOME's policy space (paper 002, Sec. 3.3): one action per feature map, 0
//! retain, 1 swap, 2 recompute, and its lowering through the shared
//! decision-to-schedule path (`framework::materialise`) to gaps.
//!
//! Choices where the paper is vague, and why:
//! - A *feature map* is what [`Ctx::saved_activations`] lists: a
//!   non-persistent storage owner made by a forward op (or the input batch)
//!   and read again after forward. The paper has "one feature map per layer";
//!   outcore's layers are ops, so every saved op output is a dimension.
//! - Saved tensors below 1/256 of the largest ([`SMALLEST_FRACTION`]) are
//!   always retained and are not dimensions.
//! - Recompute is offered only where the producer may be re-run
//!   (`Op::recomputable`) and recomputing that feature map alone builds its
//!   chain (`materialise` relaxes nothing); elsewhere the dimension has two
//!   actions and random initial policies draw only among those. Without the
//!   second test, on graphs imported from PyTorch (batch norm updating its
//!   running statistics in place is not recomputable) most recompute actions
//!   were relaxed one failing position at a time, and lowering a policy took
//!   5.4 ms instead of 0.1 ms on MobileNetV2 b64.
//! - Executor semantics of Sec. 3.6: a swapped feature map is offloaded after
//!   its last forward use and prefetched for its first backward use; a
//!   recomputed one is freed after its last forward use and rebuilt before its
//!   first backward use; a retained one stays.
//! - Recomputation chains (Sec. 2.2, "the recomputation of a feature map may
//!   trigger the feature maps in the precedent layers to be recomputed as
//!   well"): `materialise` rebuilds, at the position that needs it, every
//!   input of a recomputation that is gone by then, recursively. An input
//!   decided *recompute* is recomputed there too; an input the policy
//!   *retains* but whose last use has passed (e.g. a batch-norm output that
//!   only feeds a ReLU) is rebuilt by recomputation if its producer may be
//!   re-run.
//! - **A recomputation that needs a swapped input**: the input's swap-in is
//!   moved forward to the recomputation's position (its swap gap ends there),
//!   so the recomputation waits for that copy. If the input has no use of its
//!   own there, it leaves again right after the recomputations (its host copy
//!   is still current, so no second copy-out: a free) and is swapped in again
//!   for its own first backward use. A recomputation whose chain cannot be
//!   built (an input with no recomputable producer and no host copy) is
//!   relaxed to *retain* by `materialise` ([`Lowered::relaxed`] counts them);
//!   the particle keeps its action, its cost is that of the relaxed policy.
//! - Swap timing is not in the particle (HOME's policy has none). Prefetches
//!   are placed as late as the host-to-device link allows (see
//!   [`prefetch_as_late_as_possible`]): the paper prefetches "when its
//!   backward propagation begins", which on an op-level graph is too late to
//!   hide a large copy. Swap-outs are waited for only where memory runs out,
//!   by Algorithm 2 itself (lines 3-9, see `estimate`).

use super::estimate::{Algorithm2, Estimate, Scratch};
use crate::framework::decisions::recompute_gap;
use crate::framework::pressure::resident_bytes;
use crate::framework::{Ctx, Decision, Decisions, SwapTiming, materialise};
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore};
use serde::Serialize;

/// One feature map's placement (the paper's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Action {
    Retain = 0,
    Swap = 1,
    Recompute = 2,
}

/// A saved tensor smaller than the largest one divided by this is not a
/// dimension (it is retained): batch norm's saved mean and inverse standard
/// deviation, a few hundred bytes per layer beside megabytes of activations,
/// would otherwise double the dimensions of a CNN (and the cost of Algorithm
/// 3's update) for nothing a memory plan can notice.
pub const SMALLEST_FRACTION: u64 = 256;

/// The actions every feature map may take.
const ALL: [Action; 3] = [Action::Retain, Action::Swap, Action::Recompute];
/// The actions of a feature map whose producer may not be re-run.
const NO_RECOMPUTE: [Action; 2] = [Action::Retain, Action::Swap];

/// The search space of one context: its feature maps and their actions.
#[derive(Debug, Clone)]
pub struct PolicySpace {
    /// The dimensions, in production order.
    pub feature_maps: Vec<TensorId>,
    /// Per dimension: whether recompute is offered.
    pub recomputable: Vec<bool>,
}

/// A policy lowered to gaps, with Algorithm 2's estimate of it.
#[derive(Debug, Clone)]
pub struct Lowered {
    pub gaps: Vec<Gap>,
    pub estimate: Estimate,
    /// Recompute actions relaxed to retain (their chain cannot be built).
    pub relaxed: usize,
    /// Retained tensors rebuilt only to feed recomputations.
    pub chain_only: usize,
}

impl PolicySpace {
    pub fn new(ctx: &Ctx<'_>) -> Self {
        let g = ctx.graph;
        let feature_maps = feature_maps(ctx);
        let recomputable = feature_maps
            .iter()
            .map(|&t| {
                g.tensor(t).producer.is_some_and(|p| g.op(p).recomputable)
                    && recompute_alone_builds(ctx, t)
            })
            .collect();
        PolicySpace {
            feature_maps,
            recomputable,
        }
    }

    /// The least device memory any policy of this space can need, and
    /// where: [`floor_bytes`] of its feature maps.
    pub fn floor_bytes(&self, ctx: &Ctx<'_>) -> (u64, usize) {
        floor_bytes(ctx, &self.feature_maps)
    }

    /// Number of dimensions.
    pub fn len(&self) -> usize {
        self.feature_maps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.feature_maps.is_empty()
    }

    /// The actions dimension `j` may take.
    pub fn actions(&self, j: usize) -> &'static [Action] {
        if self.recomputable.get(j).copied().unwrap_or(false) {
            &ALL
        } else {
            &NO_RECOMPUTE
        }
    }

    /// The policy that retains everything.
    pub fn retain_all(&self) -> Vec<Action> {
        vec![Action::Retain; self.len()]
    }

    /// The shared framework's decisions for a policy.
    pub fn decisions(&self, ctx: &Ctx<'_>, policy: &[Action]) -> Decisions {
        let mut d = Decisions::keep_all(ctx.graph);
        for (&t, &a) in self.feature_maps.iter().zip(policy) {
            d.set(
                t,
                match a {
                    Action::Retain => Decision::Keep,
                    Action::Swap => Decision::Swap,
                    Action::Recompute => Decision::Recompute,
                },
            );
        }
        d
    }

    /// Lowers a policy to gaps under `capacity_bytes`: decisions, chains,
    /// prefetch triggers, then Algorithm 2, which places the syncs and
    /// estimates the iteration.
    pub fn lower(
        &self,
        model: &Algorithm2<'_, '_>,
        policy: &[Action],
        capacity_bytes: u64,
        scratch: &mut Scratch,
    ) -> Lowered {
        let ctx = model.ctx();
        let decisions = self.decisions(ctx, policy);
        // The timing here is a placeholder: triggers and syncs are set below.
        let timing = SwapTiming {
            lead_ops: 1,
            reclaim_lag_ops: 1,
        };
        let m = materialise(ctx, &decisions, timing, &|_| true);
        let mut gaps: Vec<Gap> = m.gaps.into_iter().flatten().collect();
        prefetch_as_late_as_possible(model, &mut gaps);
        let estimate = model.run(&mut gaps, capacity_bytes, scratch);
        Lowered {
            gaps,
            estimate,
            relaxed: m.relaxed,
            chain_only: m.chain_only,
        }
    }
}

/// HOME's dimensions in a context: the saved activations
/// ([`Ctx::saved_activations`]) of at least 1/[`SMALLEST_FRACTION`] of the
/// largest, in production order.
pub fn feature_maps(ctx: &Ctx<'_>) -> Vec<TensorId> {
    let saved = ctx.saved_activations();
    let largest = saved.iter().map(|&t| ctx.size(t)).max().unwrap_or(0);
    saved
        .into_iter()
        .filter(|&t| ctx.size(t).saturating_mul(SMALLEST_FRACTION) >= largest)
        .collect()
}

/// The least device memory any HOME policy over `feature_maps` can need,
/// and the position where that floor peaks: at each position, every storage
/// owner live there in the context's order (its [`Ctx::base_interval`])
/// plus the op's workspace, less the feature maps that may be off the
/// device there, strictly between their last forward use and first
/// backward use ([`resident_bytes`] of those absences).
///
/// Why it is a floor: a policy only takes feature maps off the device,
/// each within that span at most (`materialise` brings a dropped
/// feature map back by its first backward use, and keeps it from there
/// on); everything else is allocated from its first use to its last
/// (persistent tensors and outputs to the end), and what a policy adds
/// (chain links, copies in flight, later reclaims) only raises the peak.
pub fn floor_bytes(ctx: &Ctx<'_>, feature_maps: &[TensorId]) -> (u64, usize) {
    if ctx.n == 0 {
        return (0, 0);
    }
    // A recomputation gap over each feature map's span is exactly that
    // absence for `resident_bytes` (which adds no recomputation scratch).
    let off: Vec<Gap> = feature_maps
        .iter()
        .filter_map(|&t| {
            let (after, before) = ctx.forward_backward_gap(t)?;
            Some(recompute_gap(t, after, before))
        })
        .collect();
    let mut floor = (0, 0);
    for (position, &live) in resident_bytes(ctx, &off).iter().enumerate() {
        let workspace = ctx.graph.op(ctx.order[position]).workspace_bytes;
        let bytes = u64::try_from(live.max(0))
            .unwrap_or(u64::MAX)
            .saturating_add(workspace);
        if bytes > floor.0 {
            floor = (bytes, position);
        }
    }
    floor
}

/// Whether recomputing `t` alone (everything else retained) keeps its chain:
/// `materialise` relaxes nothing.
fn recompute_alone_builds(ctx: &Ctx<'_>, t: TensorId) -> bool {
    let mut d = Decisions::keep_all(ctx.graph);
    d.set(t, Decision::Recompute);
    let timing = SwapTiming {
        lead_ops: 1,
        reclaim_lag_ops: 1,
    };
    materialise(ctx, &d, timing, &|_| true).relaxed == 0
}

/// Counts of each action in a policy: (retain, swap, recompute).
pub fn action_counts(policy: &[Action]) -> (usize, usize, usize) {
    policy.iter().fold((0, 0, 0), |(r, s, c), a| match a {
        Action::Retain => (r + 1, s, c),
        Action::Swap => (r, s + 1, c),
        Action::Recompute => (r, s, c + 1),
    })
}

/// Sets every swap gap's prefetch trigger: walking the swap-ins from the last
/// needed to the first, each is scheduled to finish when its use starts (or
/// when the next one on the link starts, if earlier), on the compute timeline
/// without stalls, and is triggered by the latest op that ends before that
/// start (never before the gap begins). The link then carries the prefetches
/// back to back, each as late as it can be: the least memory held by copies in
/// flight for copies that, on that timeline, never stall.
pub fn prefetch_as_late_as_possible(model: &Algorithm2<'_, '_>, gaps: &mut [Gap]) {
    let ctx = model.ctx();
    let mut swaps: Vec<usize> = (0..gaps.len())
        .filter(|&i| {
            let g = &gaps[i];
            g.how == Restore::Swap && g.after.is_some() && g.before.is_some()
        })
        .collect();
    // Latest use first; ties by tensor so the result does not depend on input order.
    swaps.sort_unstable_by_key(|&i| {
        let g = &gaps[i];
        (std::cmp::Reverse(g.before), std::cmp::Reverse(g.tensor))
    });
    let mut link_free_from_s = f64::INFINITY;
    for i in swaps {
        let g = &mut gaps[i];
        let (Some(a), Some(b)) = (g.after, g.before) else {
            continue;
        };
        let finish_s = ctx.prefix_time_s[b].min(link_free_from_s);
        let start_s = finish_s - model.h2d_time_s(g.tensor);
        link_free_from_s = start_s;
        // The latest p in [a, b - 1] whose op ends by `start_s`:
        // prefix_time_s[p + 1] <= start_s.
        let p = ctx.ending_by(b, start_s).saturating_sub(1).clamp(a, b - 1);
        g.prefetch_after = Some(p);
    }
}
