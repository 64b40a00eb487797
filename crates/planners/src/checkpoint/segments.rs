//! The analyses behind Chen et al.'s segment recomputation: where the forward
//! pass may be cut (the candidate checkpoints), the segmentations of the paper
//! (sqrt(n) segments, Algorithm 2's budget-driven greedy), what recomputing one
//! segment drops and costs, and the gaps of a set of recomputed segments.
//!
//! Positions are positions in the context's order; "forward" means positions
//! before `ctx.backward_start`.

use crate::framework::{
    Ctx, Decision, Decisions, Materialised, SwapTiming, live_bytes, materialise,
};
use outcore_graph::TensorId;
use outcore_plan::Restore;
use std::collections::{BTreeMap, BTreeSet};

/// A position after which the forward pass may be cut: every activation made
/// at or before it and read by forward after it is a `member`, and all members
/// stay resident until backward reads them, so the segment after the cut can
/// be recomputed from the members alone. With one member it is Chen et al.'s
/// articulation point (the tensor whose removal splits the forward graph).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub position: usize,
    pub members: Vec<TensorId>,
    pub bytes: u64,
}

/// The valid cuts of the forward pass, in position order (see [`Cut`]).
///
/// A member must have a use in backward (or be a step output): a tensor that
/// only forward reads is freed after its last forward reader, so a later
/// segment's recomputation would have to recompute it, and with it part of the
/// segment before the cut, a second time. The input batch and persistent
/// tensors are never members (always available).
pub fn cuts(ctx: &Ctx<'_>) -> Vec<Cut> {
    let g = ctx.graph;
    let fwd = ctx.backward_start;
    let output_storage = g.output_storage();
    // (first, last) positions at which each crossing tensor is a member.
    let mut starts: Vec<Vec<TensorId>> = vec![Vec::new(); fwd + 1];
    let mut ends: Vec<Vec<TensorId>> = vec![Vec::new(); fwd + 1];
    let mut holdable = vec![false; g.tensors.len()];
    for t in g
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
    {
        let Some(made) = t.producer.map(|p| ctx.position(p)) else {
            continue;
        };
        let Some(last_forward) = ctx.last_forward_use(t.id) else {
            continue;
        };
        if made >= last_forward || made >= fwd {
            continue;
        }
        holdable[t.id.index()] =
            output_storage[t.id.index()] || ctx.first_backward_use(t.id).is_some();
        starts[made].push(t.id);
        ends[last_forward].push(t.id);
    }
    let mut active: BTreeSet<TensorId> = BTreeSet::new();
    let mut not_holdable = 0usize;
    let mut out = Vec::new();
    for p in 0..fwd {
        for &t in &ends[p] {
            active.remove(&t);
            not_holdable -= usize::from(!holdable[t.index()]);
        }
        for &t in &starts[p] {
            active.insert(t);
            not_holdable += usize::from(!holdable[t.index()]);
        }
        if active.is_empty() || not_holdable > 0 {
            continue;
        }
        let members: Vec<TensorId> = active.iter().copied().collect();
        let bytes = members.iter().map(|&t| ctx.size(t)).sum();
        out.push(Cut {
            position: p,
            members,
            bytes,
        });
    }
    out
}

/// How a segmentation was chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Chen et al. Sec. 4.2: a segment ends at a cut once it holds `len`
    /// recompute candidates (`len` about sqrt(n) gives sqrt(n) segments).
    Sqrt { len: usize, choice: CutChoice },
    /// Chen et al. Algorithm 2: a segment ends at a cut once the candidates it
    /// holds exceed `budget_bytes`.
    Greedy {
        budget_bytes: u64,
        choice: CutChoice,
    },
}

/// Which cut ends a segment once its threshold is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutChoice {
    /// The first one (Chen et al.).
    First,
    /// The one with the fewest member bytes (the earliest on ties) among those
    /// reached before the segment holds twice the threshold: fewer bytes kept
    /// at each checkpoint (in a transformer, the residual stream between
    /// sublayers instead of a cut through an attention block) for segments up
    /// to twice as long, which recompute more at once (worse where the first
    /// layers are the largest, as in VGG).
    CheapestAhead,
}

/// One segment: forward positions `first..=last`.
#[derive(Debug, Clone)]
pub struct Segment {
    pub first: usize,
    pub last: usize,
    /// Candidates made in it that no chosen cut keeps: dropped after their
    /// last forward use when the segment is recomputed.
    pub dropped: Vec<TensorId>,
    pub dropped_bytes: u64,
    /// Where the segment is recomputed: the first backward use of any dropped
    /// tensor (`None` when nothing is dropped).
    pub recompute_at: Option<usize>,
    /// Compute time of the ops re-run to bring the dropped tensors back.
    pub recompute_time_s: f64,
}

/// A segmentation of the forward pass.
#[derive(Debug, Clone)]
pub struct Segmentation {
    pub rule: Rule,
    /// Positions of the chosen cuts (segment ends), ascending.
    pub boundaries: Vec<usize>,
    /// Members of the chosen cuts: kept whatever is recomputed.
    pub kept: Vec<TensorId>,
    pub segments: Vec<Segment>,
}

impl Segmentation {
    /// Chen et al.'s `sqrt(n)` rule (see [`Rule::Sqrt`]) over `candidates`
    /// (recompute candidates in production order).
    pub fn sqrt(
        ctx: &Ctx<'_>,
        cuts: &[Cut],
        candidates: &[TensorId],
        len: usize,
        choice: CutChoice,
    ) -> Self {
        let held = accumulated(ctx, cuts, candidates, |_| 1);
        let chosen = choose_cuts(cuts, &held, len.max(1) as u64, false, choice);
        Self::build(ctx, Rule::Sqrt { len, choice }, &chosen, candidates)
    }

    /// Chen et al.'s Algorithm 2 (see [`Rule::Greedy`]).
    pub fn greedy(
        ctx: &Ctx<'_>,
        cuts: &[Cut],
        candidates: &[TensorId],
        budget_bytes: u64,
        choice: CutChoice,
    ) -> Self {
        let held = accumulated(ctx, cuts, candidates, |t| ctx.size(t));
        let chosen = choose_cuts(cuts, &held, budget_bytes, true, choice);
        let rule = Rule::Greedy {
            budget_bytes,
            choice,
        };
        Self::build(ctx, rule, &chosen, candidates)
    }

    fn build(ctx: &Ctx<'_>, rule: Rule, chosen: &[&Cut], candidates: &[TensorId]) -> Self {
        let mut kept: Vec<TensorId> = chosen.iter().flat_map(|c| c.members.clone()).collect();
        kept.sort_unstable();
        kept.dedup();
        let boundaries: Vec<usize> = chosen.iter().map(|c| c.position).collect();
        let fwd = ctx.backward_start;
        let mut segments = Vec::with_capacity(boundaries.len() + 1);
        let mut first = 0;
        for &end in boundaries
            .iter()
            .chain(std::iter::once(&fwd.saturating_sub(1)))
        {
            if end < first || first >= fwd {
                continue;
            }
            segments.push(segment(ctx, first, end, candidates, &kept));
            first = end + 1;
        }
        Segmentation {
            rule,
            boundaries,
            kept,
            segments,
        }
    }

    /// Segments worth recomputing (they drop something), by index.
    pub fn droppable(&self) -> Vec<usize> {
        (0..self.segments.len())
            .filter(|&s| self.segments[s].recompute_at.is_some())
            .collect()
    }
}

/// For each cut, the `weight` of the candidates made at or before it.
fn accumulated(
    ctx: &Ctx<'_>,
    cuts: &[Cut],
    candidates: &[TensorId],
    weight: impl Fn(TensorId) -> u64,
) -> Vec<u64> {
    let mut per_position = vec![0u64; ctx.backward_start + 1];
    for &t in candidates {
        if let Some(p) = ctx.graph.tensor(t).producer.map(|p| ctx.position(p))
            && p < per_position.len()
        {
            per_position[p] += weight(t);
        }
    }
    let mut prefix = Vec::with_capacity(per_position.len());
    let mut acc = 0u64;
    for w in per_position {
        acc += w;
        prefix.push(acc);
    }
    cuts.iter().map(|c| prefix[c.position]).collect()
}

/// Segment ends: once the weight held since the last end reaches `threshold`
/// (exceeds it, when `strict`), the segment ends at the cut `choice` picks.
fn choose_cuts<'c>(
    cuts: &'c [Cut],
    held: &[u64],
    threshold: u64,
    strict: bool,
    choice: CutChoice,
) -> Vec<&'c Cut> {
    let reached = |w: u64| {
        if strict {
            w > threshold
        } else {
            w >= threshold
        }
    };
    let mut chosen = Vec::new();
    let mut base = 0u64;
    let mut i = 0;
    while i < cuts.len() {
        if !reached(held[i] - base) {
            i += 1;
            continue;
        }
        let mut best = i;
        if choice == CutChoice::CheapestAhead {
            let limit = (held[i] - base).max(threshold.saturating_mul(2));
            let mut j = i + 1;
            while j < cuts.len() && held[j] - base <= limit {
                if cuts[j].bytes < cuts[best].bytes {
                    best = j;
                }
                j += 1;
            }
        }
        chosen.push(&cuts[best]);
        base = held[best];
        i = best + 1;
    }
    chosen
}

/// The segment over forward positions `first..=last`.
fn segment(
    ctx: &Ctx<'_>,
    first: usize,
    last: usize,
    candidates: &[TensorId],
    kept: &[TensorId],
) -> Segment {
    let made_in = |t: TensorId| {
        ctx.graph
            .tensor(t)
            .producer
            .map(|p| ctx.position(p))
            .is_some_and(|p| p >= first && p <= last)
    };
    let dropped: Vec<TensorId> = candidates
        .iter()
        .copied()
        .filter(|&t| made_in(t) && kept.binary_search(&t).is_err())
        .collect();
    let recompute_at = dropped
        .iter()
        .filter_map(|&t| ctx.first_backward_use(t))
        .min();
    Segment {
        first,
        last,
        dropped_bytes: dropped.iter().map(|&t| ctx.size(t)).sum(),
        recompute_time_s: recompute_time_s(ctx, &dropped, kept, first, last),
        dropped,
        recompute_at,
    }
}

/// Compute time of the ops re-run to bring `dropped` back: their producers and,
/// recursively, the producers in the segment of inputs that are gone by then
/// (dropped too, or dead after forward); kept, persistent and non-recomputable
/// inputs are resident.
fn recompute_time_s(
    ctx: &Ctx<'_>,
    dropped: &[TensorId],
    kept: &[TensorId],
    first: usize,
    last: usize,
) -> f64 {
    let g = ctx.graph;
    let mut seen_ops: BTreeSet<usize> = BTreeSet::new();
    let mut stack: Vec<TensorId> = dropped.to_vec();
    let mut seen_tensors: BTreeSet<TensorId> = stack.iter().copied().collect();
    while let Some(t) = stack.pop() {
        let Some(p) = g.tensor(t).producer else {
            continue;
        };
        let position = ctx.position(p);
        let op = g.op(p);
        if !op.recomputable || position < first || position > last {
            continue;
        }
        if !seen_ops.insert(position) {
            continue;
        }
        for &i in &op.inputs {
            let v = g.storage_owner(i);
            let resident = ctx.persistent(v)
                || kept.binary_search(&v).is_ok()
                || ctx.first_backward_use(v).is_some() && !dropped.contains(&v);
            if !resident && seen_tensors.insert(v) {
                stack.push(v);
            }
        }
    }
    seen_ops.iter().map(|&p| ctx.op_time_s[p]).sum()
}

/// The order in which a budget-driven planner recomputes segments, and the
/// modelled peak after each prefix (`peaks[j]`: the first `j` recomputed).
///
/// Greedy on the live-bytes model ([`live_bytes`]): at the current peak, take
/// the segment whose dropped tensors free the most bytes there per second of
/// recomputation (ties: the earlier segment); stop when no segment lowers the
/// peak. The order depends on the graph and the segmentation only, never on
/// the budget, so a larger budget recomputes a prefix of what a smaller one
/// does: the plan's time only falls as the budget grows.
pub fn recompute_order(ctx: &Ctx<'_>, seg: &Segmentation) -> (Vec<usize>, Vec<i128>) {
    let mut live = live_bytes(ctx, &[]);
    let mut order = Vec::new();
    let mut peaks = vec![peak(&live).1];
    let mut left = seg.droppable();
    while !left.is_empty() {
        let (at, _) = peak(&live);
        let mut best: Option<(f64, usize)> = None;
        for (i, &s) in left.iter().enumerate() {
            let freed = freed_at(ctx, &seg.segments[s], at);
            if freed == 0 {
                continue;
            }
            let score = freed as f64 / seg.segments[s].recompute_time_s.max(1e-12);
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, i));
            }
        }
        let Some((_, i)) = best else {
            break;
        };
        let s = left.remove(i);
        apply_drop(ctx, &seg.segments[s], &mut live);
        order.push(s);
        peaks.push(peak(&live).1);
    }
    (order, peaks)
}

/// The position and value of the highest live-bytes entry (the first, on ties).
fn peak(live: &[i128]) -> (usize, i128) {
    live.iter().copied().enumerate().fold(
        (0, i128::MIN),
        |best, (i, v)| if v > best.1 { (i, v) } else { best },
    )
}

/// The range of positions a dropped tensor is off the device (see
/// `absent_range` of a recompute gap from its last forward use).
fn absent(ctx: &Ctx<'_>, t: TensorId, back_at: usize) -> Option<(usize, usize)> {
    let after = ctx.last_forward_use(t)?;
    (back_at > after + 1).then_some((after + 1, back_at - 1))
}

fn freed_at(ctx: &Ctx<'_>, s: &Segment, at: usize) -> u64 {
    let Some(back_at) = s.recompute_at else {
        return 0;
    };
    s.dropped
        .iter()
        .filter(|&&t| absent(ctx, t, back_at).is_some_and(|(lo, hi)| lo <= at && at <= hi))
        .map(|&t| ctx.size(t))
        .sum()
}

fn apply_drop(ctx: &Ctx<'_>, s: &Segment, live: &mut [i128]) {
    let Some(back_at) = s.recompute_at else {
        return;
    };
    for &t in &s.dropped {
        if let Some((lo, hi)) = absent(ctx, t, back_at) {
            for v in &mut live[lo..=hi] {
                *v -= ctx.size(t) as i128;
            }
        }
    }
}

/// Gaps when the segments `selected` are recomputed: their dropped tensors are
/// brought back at the segment's recompute position (Chen et al.: the
/// segment's forward re-runs once, just before its backward), with what the
/// chains need. `None` when some op would be recomputed at two positions (a
/// kept input freed before a later segment's recomputation), which Chen's
/// scheme never does.
pub fn segment_gaps(ctx: &Ctx<'_>, seg: &Segmentation, selected: &[usize]) -> Option<Materialised> {
    let mut d = Decisions::keep_all(ctx.graph);
    for &s in selected {
        let segment = seg.segments.get(s)?;
        let Some(at) = segment.recompute_at else {
            continue;
        };
        for &t in &segment.dropped {
            d.set(t, Decision::Recompute);
            d.anchor(t, at);
        }
    }
    let timing = SwapTiming {
        lead_ops: 2,
        reclaim_lag_ops: 1,
    };
    let m = materialise(ctx, &d, timing, &|_| true);
    (max_recomputations_per_op(ctx, &m) <= 1).then_some(m)
}

/// The most positions at which one op is recomputed (the lowering runs one
/// recomputation per producer and position).
pub fn max_recomputations_per_op(ctx: &Ctx<'_>, m: &Materialised) -> usize {
    let mut positions: BTreeSet<(u32, usize)> = BTreeSet::new();
    for gap in m.gaps.iter().flatten() {
        if gap.how != Restore::Recompute {
            continue;
        }
        if let (Some(p), Some(b)) = (ctx.graph.tensor(gap.tensor).producer, gap.before) {
            positions.insert((p.0, b));
        }
    }
    let mut per_op: BTreeMap<u32, usize> = BTreeMap::new();
    for (op, _) in positions {
        *per_op.entry(op).or_insert(0) += 1;
    }
    per_op.values().copied().max().unwrap_or(0)
}
