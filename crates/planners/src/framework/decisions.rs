//! Per-tensor decisions (keep, swap, recompute) and how they become gaps under
//! the shared lowering, with recomputation chains.
//!
//! [`materialise`] turns decisions into gaps with recomputation chains: a
//! dropped tensor comes back at the first position that needs it (its first
//! backward use, an anchor such as the start of a Chen et al. segment, or a
//! recomputation that reads it); a recomputation at position `p` needs its
//! inputs resident at `p`, so inputs that are gone by then (dropped, swapped,
//! or dead after forward, e.g. a batch-norm output that only feeds a ReLU) are
//! brought back at `p` too, recursively. The lowering runs the recomputations
//! at one position in producer order, lets the first step at `p` carry the
//! swap-in waits, and frees tensors brought back only for recomputations right
//! after them. Positions are positions in the context's order.

use super::ctx::Ctx;
use outcore_graph::{Graph, TensorId};
use outcore_plan::{Gap, Restore};

/// Flattens per-tensor gap lists.
pub fn flatten(gaps: Vec<Vec<Gap>>) -> Vec<Gap> {
    gaps.into_iter().flatten().collect()
}

/// Number of tensors with at least one gap restored by `how`.
pub fn count(gaps: &[Vec<Gap>], how: Restore) -> usize {
    gaps.iter()
        .filter(|g| g.iter().any(|x| x.how == how))
        .count()
}

/// Bytes of the tensors with at least one gap restored by `how`.
pub fn bytes(graph: &Graph, gaps: &[Vec<Gap>], how: Restore) -> u64 {
    gaps.iter()
        .enumerate()
        .filter(|(_, g)| g.iter().any(|x| x.how == how))
        .map(|(i, _)| graph.tensors[i].size_bytes)
        .sum()
}

/// A recomputation of `tensor`: dropped after `after`, re-run before `before`.
pub fn recompute_gap(tensor: TensorId, after: usize, before: usize) -> Gap {
    Gap {
        tensor,
        after: Some(after),
        before: Some(before),
        how: Restore::Recompute,
        prefetch_after: None,
        reclaim_before: None,
        copy_out_after: None,
    }
}

/// A swap gap over `(after, before)`: the swap-in starts `lead_ops` ops before
/// the use (once the op at `before - lead_ops` has finished), and the op
/// `reclaim_lag_ops` after the last use waits for the offload (clamped to the gap).
pub fn swap_gap(
    t: TensorId,
    after: usize,
    before: usize,
    lead_ops: usize,
    reclaim_lag_ops: usize,
) -> Gap {
    let trigger = before.saturating_sub(lead_ops).max(after);
    let reclaim = (after + reclaim_lag_ops.max(1)).min(before);
    Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(trigger),
        reclaim_before: Some(reclaim),
        copy_out_after: None,
    }
}

/// What a planner decides for one storage owner between forward and backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Resident from production to its last use (brought back after that only
    /// when a recomputation reads it).
    Keep,
    /// Freed after its last forward use, recomputed when first needed again.
    Recompute,
    /// Offloaded after its last forward use, swapped in when first needed again.
    Swap,
}

/// Per-owner decisions for [`materialise`].
#[derive(Debug, Clone)]
pub struct Decisions {
    pub how: Vec<Decision>,
    /// Extra positions at which a tensor must be resident (before any
    /// recomputation there), e.g. the first backward op of its Chen segment.
    pub anchors: Vec<Vec<usize>>,
}

impl Decisions {
    /// Every tensor kept, no anchors.
    pub fn keep_all(graph: &Graph) -> Self {
        Decisions {
            how: vec![Decision::Keep; graph.tensors.len()],
            anchors: vec![Vec::new(); graph.tensors.len()],
        }
    }

    pub fn set(&mut self, t: TensorId, how: Decision) {
        if let Some(slot) = self.how.get_mut(t.index()) {
            *slot = how;
        }
    }

    pub fn anchor(&mut self, t: TensorId, position: usize) {
        if let Some(list) = self.anchors.get_mut(t.index()) {
            list.push(position);
        }
    }
}

/// Swap timing of the swap gaps [`materialise`] makes (see [`swap_gap`]).
#[derive(Debug, Clone, Copy)]
pub struct SwapTiming {
    pub lead_ops: usize,
    pub reclaim_lag_ops: usize,
}

/// Gaps for a set of decisions, and what it took.
#[derive(Debug, Default)]
pub struct Materialised {
    pub gaps: Vec<Vec<Gap>>,
    /// Tensors decided `Keep` (or never read by backward) brought back only to
    /// feed recomputations.
    pub chain_only: usize,
    /// Recompute gaps, i.e. recomputation steps in the plan.
    pub recompute_steps: usize,
    /// Decided tensors set back to `Keep` because no chain could bring back
    /// what their recomputation reads (an input with no recomputable producer
    /// and no host copy).
    pub relaxed: usize,
}

/// A demand at `position` on `tensor` that nothing can satisfy.
struct Unsatisfiable {
    position: usize,
    /// Per owner: the positions where it was recomputed, up to the failure.
    regen: Vec<Vec<usize>>,
}

/// Turns decisions into gaps, with recomputation chains (see the module docs).
/// Never fails: a decision whose chain cannot be built is relaxed to `Keep`.
///
/// `rebuild` says whether a tensor decided `Keep` may be recomputed when a
/// recomputation reads it after its last use (a dead intermediate of a chain);
/// when it may not, the recomputations that need it are relaxed.
pub fn materialise(
    an: &Ctx<'_>,
    decisions: &Decisions,
    timing: SwapTiming,
    rebuild: &dyn Fn(TensorId) -> bool,
) -> Materialised {
    let mut d = decisions.clone();
    let mut relaxed = 0;
    loop {
        match materialise_once(an, &d, timing, rebuild) {
            Ok(mut m) => {
                m.relaxed = relaxed;
                return m;
            }
            Err(failure) => {
                // Relax the decided recomputations that run at the failing position.
                let mut any = false;
                for (i, positions) in failure.regen.iter().enumerate() {
                    if d.how[i] == Decision::Recompute && positions.contains(&failure.position) {
                        d.how[i] = Decision::Keep;
                        d.anchors[i].clear();
                        relaxed += 1;
                        any = true;
                    }
                }
                if !any {
                    relaxed += d.how.iter().filter(|&&h| h != Decision::Keep).count();
                    d = Decisions::keep_all(an.graph);
                }
            }
        }
    }
}

fn materialise_once(
    an: &Ctx<'_>,
    d: &Decisions,
    timing: SwapTiming,
    rebuild: &dyn Fn(TensorId) -> bool,
) -> Result<Materialised, Unsatisfiable> {
    let g = an.graph;
    let nt = g.tensors.len();
    let output_storage = g.output_storage();
    let mut demands: Vec<Vec<usize>> = d.anchors.clone();
    demands.resize(nt, Vec::new());
    let mut regen: Vec<Vec<usize>> = vec![Vec::new(); nt];
    let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); nt];
    let mut m = Materialised::default();
    // Consumers before producers, so every demand on a tensor is known when it
    // is decided.
    let mut owners: Vec<(usize, TensorId)> = g
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
        .map(|t| (t.producer.map_or(0, |p| an.position(p) + 1), t.id))
        .collect();
    owners.sort_unstable_by(|a, b| b.cmp(a));
    for (_, u) in owners {
        let tensor = g.tensor(u);
        let ui = u.index();
        let uses = &an.uses[ui];
        let mut dem = std::mem::take(&mut demands[ui]);
        dem.sort_unstable();
        dem.dedup();
        let fail = |position: usize, regen: Vec<Vec<usize>>| Unsatisfiable { position, regen };
        let producer = tensor.producer;
        let recomputable = producer.is_some_and(|p| g.op(p).recomputable);
        let never_freed = output_storage.get(ui).copied().unwrap_or(false);
        let Some(&last_use) = uses.last() else {
            if let Some(&p) = dem.first() {
                return Err(fail(p, regen));
            }
            continue;
        };
        let last_use = if never_freed { usize::MAX } else { last_use };
        // How it comes back when it is gone: by its decision, or for a kept
        // tensor needed after its last use, whichever works.
        let decided = d.how.get(ui).copied().unwrap_or(Decision::Keep);
        let dropped = match decided {
            Decision::Recompute if recomputable => Some(Restore::Recompute),
            Decision::Swap => Some(Restore::Swap),
            _ => None,
        };
        let backward_uses = uses.iter().copied().filter(|&p| p >= an.backward_start);
        let mut spans: Vec<(usize, usize, Restore)> = Vec::new();
        let dropped_from = dropped.and_then(|how| {
            if never_freed {
                return None;
            }
            let lf = an.last_forward_use(u)?;
            let mut q: Vec<usize> = backward_uses.chain(dem.iter().copied()).collect();
            q.sort_unstable();
            q.dedup();
            let &q1 = q.first()?;
            (q1 > lf).then_some((lf, q1, how, q))
        });
        match dropped_from {
            Some((lf, q1, how, q)) => {
                // Back at q1; it stays from a use or an anchor on, but leaves
                // again after a position where it only fed recomputations, and
                // after its last use.
                spans.push((lf, q1, how));
                let anchors = d.anchors.get(ui).map_or(&[][..], |a| &a[..]);
                let stays = |p: usize| uses.binary_search(&p).is_ok() || anchors.contains(&p);
                let mut came_back = true;
                for w in q.windows(2) {
                    let (p, next) = (w[0], w[1]);
                    if (came_back && !stays(p)) || p >= last_use {
                        spans.push((p, next, how));
                        came_back = true;
                    } else {
                        came_back = false;
                    }
                }
            }
            None => {
                let made_at = producer.map(|p| an.position(p));
                let mut prev = last_use;
                for &p in &dem {
                    if made_at.is_some_and(|a| p <= a) {
                        return Err(fail(p, regen));
                    }
                    if p <= prev {
                        continue;
                    }
                    let how = if recomputable && rebuild(u) {
                        Restore::Recompute
                    } else if producer.is_none() {
                        // The input batch: its host copy is current.
                        Restore::Swap
                    } else {
                        return Err(fail(p, regen));
                    };
                    spans.push((prev, p, how));
                    prev = p;
                }
                if !spans.is_empty() {
                    m.chain_only += 1;
                }
            }
        }
        for (after, before, how) in spans {
            match how {
                Restore::Recompute => {
                    gaps[ui].push(Gap {
                        tensor: u,
                        after: Some(after),
                        before: Some(before),
                        how,
                        prefetch_after: None,
                        reclaim_before: None,
                        copy_out_after: None,
                    });
                    regen[ui].push(before);
                    m.recompute_steps += 1;
                }
                Restore::Swap => gaps[ui].push(swap_gap(
                    u,
                    after,
                    before,
                    timing.lead_ops,
                    timing.reclaim_lag_ops,
                )),
            }
        }
        if regen[ui].is_empty() {
            continue;
        }
        let Some(op) = producer.map(|p| g.op(p)) else {
            continue;
        };
        for &i in &op.inputs {
            let v = g.storage_owner(i);
            if g.tensor(v).is_persistent() {
                continue;
            }
            if v == u {
                let p = regen[ui].first().copied().unwrap_or(0);
                return Err(fail(p, regen));
            }
            let positions = regen[ui].clone();
            demands[v.index()].extend(positions);
        }
    }
    m.gaps = gaps;
    Ok(m)
}
