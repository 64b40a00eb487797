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

/// One pass of [`materialise`]: every non-persistent tensor's gaps, decided
/// consumers first, or the first demand that nothing satisfies.
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
    for u in consumers_first(an) {
        let ui = u.index();
        let mut dem = std::mem::take(&mut demands[ui]);
        dem.sort_unstable();
        dem.dedup();
        let never_freed = output_storage.get(ui).copied().unwrap_or(false);
        let Some(&last_use) = an.uses[ui].last() else {
            if let Some(&position) = dem.first() {
                return Err(Unsatisfiable { position, regen });
            }
            continue;
        };
        let last_use = if never_freed { usize::MAX } else { last_use };
        let spans = match dropped_spans(an, d, u, &dem, never_freed, last_use) {
            Some(spans) => spans,
            None => match demanded_spans(an, u, &dem, last_use, rebuild) {
                Ok(spans) => {
                    if !spans.is_empty() {
                        m.chain_only += 1;
                    }
                    spans
                }
                Err(position) => return Err(Unsatisfiable { position, regen }),
            },
        };
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
        if let Err(position) = demand_producer_inputs(g, u, &regen[ui], &mut demands) {
            return Err(Unsatisfiable { position, regen });
        }
    }
    m.gaps = gaps;
    Ok(m)
}

/// The non-persistent tensors that allocate, consumers before producers
/// (by their producer's position, latest first), so that every demand on a
/// tensor is known when it is decided.
fn consumers_first(an: &Ctx<'_>) -> Vec<TensorId> {
    let mut owners: Vec<(usize, TensorId)> = an
        .graph
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
        .map(|t| (t.producer.map_or(0, |p| an.position(p) + 1), t.id))
        .collect();
    owners.sort_unstable_by(|a, b| b.cmp(a));
    owners.into_iter().map(|(_, u)| u).collect()
}

/// A span `(after, before, how)`: the tensor is off the device between
/// those positions and restored `how` before `before`.
type Span = (usize, usize, Restore);

/// The spans of a tensor its decision drops (swap, or recompute where its
/// producer may re-run) after its last forward use: back at its first
/// backward use or demand, staying from a use or an anchor on, leaving again
/// after a position where it only fed recomputations, and after its last
/// use. `None` where it is kept, never freed, or not needed after the
/// forward pass.
fn dropped_spans(
    an: &Ctx<'_>,
    d: &Decisions,
    u: TensorId,
    dem: &[usize],
    never_freed: bool,
    last_use: usize,
) -> Option<Vec<Span>> {
    let g = an.graph;
    let ui = u.index();
    let recomputable = g.tensor(u).producer.is_some_and(|p| g.op(p).recomputable);
    let how = match d.how.get(ui).copied().unwrap_or(Decision::Keep) {
        Decision::Recompute if recomputable => Restore::Recompute,
        Decision::Swap => Restore::Swap,
        _ => return None,
    };
    if never_freed {
        return None;
    }
    let uses = &an.uses[ui];
    let lf = an.last_forward_use(u)?;
    let backward_uses = uses.iter().copied().filter(|&p| p >= an.backward_start);
    let mut q: Vec<usize> = backward_uses.chain(dem.iter().copied()).collect();
    q.sort_unstable();
    q.dedup();
    let &q1 = q.first()?;
    if q1 <= lf {
        return None;
    }
    let mut spans = vec![(lf, q1, how)];
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
    Some(spans)
}

/// The spans of a kept tensor demanded after its last use (by
/// recomputations that read it): recomputed where `rebuild` allows, the
/// input batch swapped (its host copy is current); `Err` with the first
/// demand that neither can meet, or that comes before the tensor is made.
fn demanded_spans(
    an: &Ctx<'_>,
    u: TensorId,
    dem: &[usize],
    last_use: usize,
    rebuild: &dyn Fn(TensorId) -> bool,
) -> Result<Vec<Span>, usize> {
    let g = an.graph;
    let producer = g.tensor(u).producer;
    let recomputable = producer.is_some_and(|p| g.op(p).recomputable);
    let made_at = producer.map(|p| an.position(p));
    let mut spans = Vec::new();
    let mut prev = last_use;
    for &p in dem {
        if made_at.is_some_and(|a| p <= a) {
            return Err(p);
        }
        if p <= prev {
            continue;
        }
        let how = if recomputable && rebuild(u) {
            Restore::Recompute
        } else if producer.is_none() {
            Restore::Swap
        } else {
            return Err(p);
        };
        spans.push((prev, p, how));
        prev = p;
    }
    Ok(spans)
}

/// Where `u` is recomputed (at `regen`), each non-persistent input of its
/// producer is demanded there too; `Err` with the first such position where
/// the producer reads `u`'s own storage (a recomputation that needs what it
/// restores).
fn demand_producer_inputs(
    g: &Graph,
    u: TensorId,
    regen: &[usize],
    demands: &mut [Vec<usize>],
) -> Result<(), usize> {
    if regen.is_empty() {
        return Ok(());
    }
    let Some(op) = g.tensor(u).producer.map(|p| g.op(p)) else {
        return Ok(());
    };
    for &i in &op.inputs {
        let v = g.storage_owner(i);
        if g.tensor(v).is_persistent() {
            continue;
        }
        if v == u {
            return Err(regen.first().copied().unwrap_or(0));
        }
        demands[v.index()].extend_from_slice(regen);
    }
    Ok(())
}
