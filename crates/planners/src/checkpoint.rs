//! Recompute-only checkpointing after Chen et al. 2016 ("Training Deep Nets
//! with Sublinear Memory Cost", Sec. 4): cut the forward pass into segments at
//! checkpoints, keep the checkpoints, drop what a segment makes after its last
//! forward use, and re-run the segment's forward once, just before the first
//! backward op that needs any of it. Nothing is swapped (the input batch, whose
//! host copy is current, may be brought back by a free copy when a
//! recomputation reads it).
//!
//! Three planners share the machinery of `segments`:
//! - `checkpoint-sqrt`: the paper's sqrt(n) segmentation (segments of about
//!   sqrt(n) recompute candidates, ending at checkpoints), then the budget
//!   decides which segments are recomputed (below).
//! - `checkpoint-greedy`: the paper's Algorithm 2 (a segment ends at the
//!   first checkpoint once the candidates it holds exceed `B` bytes), `B`
//!   searched, then the same budget-driven choice of segments.
//! - `checkpoint-all`: the paper's scheme taken literally: every segment is
//!   recomputed; the budget chooses the segmentation (the fastest of the sqrt
//!   and Algorithm 2 segmentations that fits).
//!
//! Choices where the paper is vague:
//! - Checkpoints are the paper's "candidate stage splitting points" for
//!   general graphs: positions whose removal splits the forward graph
//!   ([`segments::cuts`]): every activation made before and read after is a
//!   checkpoint member, kept; with one member it is an articulation point. A
//!   member must have a backward use, so that it is still resident when the
//!   segment after the cut is recomputed; a graph such as DenseNet, whose dense
//!   blocks hand forward-only feature maps to every later layer, is cut only
//!   between blocks.
//! - n is the number of recompute candidates: saved activations (feature maps
//!   backward reads) whose producer may be re-run, in production order.
//! - Each op is recomputed at most once: a segment's dropped tensors all come
//!   back at one position (the lowering runs one recomputation per op there,
//!   whatever outputs it brings back), and a candidate plan that would need an
//!   op at two positions is discarded (see [`segments::segment_gaps`]).
//! - The budget is used: recomputing a segment costs its forward time, so the
//!   sqrt and greedy planners recompute the fewest, cheapest segments that fit.
//!   The segments are ordered once per segmentation, greedily by the bytes each
//!   frees at the modelled peak per second of recomputation
//!   ([`segments::recompute_order`]); a plan recomputes a prefix of that order,
//!   the shortest that the evaluator finds feasible, starting from the first
//!   prefix whose modelled peak fits. The order does not depend on the budget,
//!   so a larger budget recomputes a prefix of what a smaller one does and the
//!   plan's time never grows with the budget.
//! - Several segmentations are tried (sqrt: `k` = sqrt(n), the paper's default,
//!   and 2, 3, 4, 6, 8, sqrt(n)/2, 2 sqrt(n); greedy: `B` = the candidates'
//!   total over 2..64, and sqrt(x y) with x the bytes the finest segmentation
//!   keeps and y the total, the paper's balance point), each with segments
//!   ending at the first cut past the threshold (the paper) and at the
//!   cheapest cut a little further ([`CutChoice`]); the fastest feasible plan
//!   wins (ties: the earlier segmentation).

mod segments;

pub use segments::{
    Cut, CutChoice, Rule, Segment, Segmentation, cuts, max_recomputations_per_op, recompute_order,
    segment_gaps,
};

use crate::framework::{Ctx, Pick, Score, Scored, Scratch, Search, bytes, count, flatten};
use outcore_graph::TensorId;
use outcore_plan::{PlanOutcome, PlanRequest, Planner, PlannerError, Restore};
use serde_json::{Value, json};

/// Which of Chen et al.'s segmentations, and how the budget is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segments {
    /// Every segment recomputed; the budget picks the segmentation.
    All,
    /// About sqrt(n) segments; the budget picks which are recomputed.
    Sqrt,
    /// Algorithm 2's segmentation for searched `B`; the budget picks which
    /// segments are recomputed.
    Greedy,
}

/// The checkpointing planner.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint {
    pub segments: Segments,
}

/// Segment lengths the sqrt rule tries, the sqrt(n) default first.
fn sqrt_lens(n: usize) -> Vec<usize> {
    let sqrt_n = sqrt_len(n);
    let mut out: Vec<usize> = Vec::new();
    for k in [sqrt_n, 2, 3, 4, 6, 8, sqrt_n / 2, sqrt_n * 2] {
        let k = k.clamp(2, n.max(2));
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// The paper's default segment length, `round(sqrt(n))`, at least 2.
fn sqrt_len(n: usize) -> usize {
    ((n as f64).sqrt().round() as usize).max(2)
}

/// The `B` values Algorithm 2 is run with (module docs).
fn greedy_budgets(ctx: &Ctx<'_>, cuts: &[Cut], candidates: &[TensorId]) -> Vec<u64> {
    let total: u64 = candidates.iter().map(|&t| ctx.size(t)).sum();
    let finest = Segmentation::greedy(ctx, cuts, candidates, 0, CutChoice::First);
    let x: u64 = finest.kept.iter().map(|&t| ctx.size(t)).sum();
    let balance = ((x as f64) * (total as f64)).sqrt() as u64;
    let mut out = vec![balance];
    for m in [2u64, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64] {
        out.push(total / m);
    }
    out.dedup();
    out
}

impl Checkpoint {
    /// Saved activations whose producer may be re-run, in production order.
    pub fn candidates(ctx: &Ctx<'_>) -> Vec<TensorId> {
        let graph = ctx.graph;
        ctx.saved_activations()
            .into_iter()
            .filter(|&t| {
                graph
                    .tensor(t)
                    .producer
                    .is_some_and(|p| graph.op(p).recomputable)
            })
            .collect()
    }

    /// The segmentations this planner tries, distinct, in trying order.
    pub fn segmentations(&self, ctx: &Ctx<'_>) -> Vec<Segmentation> {
        let cuts = cuts(ctx);
        let candidates = Self::candidates(ctx);
        let mut out: Vec<Segmentation> = Vec::new();
        for choice in [CutChoice::First, CutChoice::CheapestAhead] {
            if self.segments != Segments::Greedy {
                for len in sqrt_lens(candidates.len()) {
                    out.push(Segmentation::sqrt(ctx, &cuts, &candidates, len, choice));
                }
            }
            if self.segments != Segments::Sqrt {
                for b in greedy_budgets(ctx, &cuts, &candidates) {
                    out.push(Segmentation::greedy(ctx, &cuts, &candidates, b, choice));
                }
            }
        }
        let mut distinct: Vec<Segmentation> = Vec::new();
        for s in out {
            if !distinct.iter().any(|d| d.boundaries == s.boundaries) {
                distinct.push(s);
            }
        }
        distinct
    }

    /// The settings recorded for one candidate plan.
    fn settings(
        &self,
        request: &PlanRequest<'_>,
        seg: &Segmentation,
        selected: &[usize],
        m: &crate::framework::Materialised,
    ) -> Value {
        let (rule, param, choice) = match seg.rule {
            Rule::Sqrt { len, choice } => ("sqrt", json!({ "segment_len": len }), choice),
            Rule::Greedy {
                budget_bytes,
                choice,
            } => ("greedy", json!({ "budget_bytes": budget_bytes }), choice),
        };
        json!({
            "segmentation": rule,
            "rule": param,
            "segment_end": match choice {
                CutChoice::First => "first cut past the threshold",
                CutChoice::CheapestAhead => "cheapest cut before twice the threshold",
            },
            "segments": seg.segments.len(),
            "boundaries": seg.boundaries.len(),
            "kept_at_boundaries": seg.kept.len(),
            "recomputed_segments": selected.len(),
            "chain_only_tensors": m.chain_only,
            "recompute_steps": m.recompute_steps,
            "relaxed_decisions": m.relaxed,
            "recomputed_tensors": count(&m.gaps, Restore::Recompute),
            "recomputed_bytes": bytes(request.graph, &m.gaps, Restore::Recompute),
            "selection": match self.segments {
                Segments::All => "every segment recomputed; the fastest segmentation that fits",
                _ => "the shortest prefix of the recompute order that fits; the fastest segmentation",
            },
        })
    }

    /// Scores recomputing `selected`; `None` when the plan would recompute an
    /// op twice (see [`segment_gaps`]).
    fn score_selection(
        &self,
        search: &Search<'_, '_>,
        seg: &Segmentation,
        selected: &[usize],
        scratch: &mut Scratch,
    ) -> Result<Option<Scored>, PlannerError> {
        let Some(m) = segment_gaps(search.ctx, seg, selected) else {
            return Ok(None);
        };
        let settings = self.settings(&search.request, seg, selected, &m);
        search.scored(settings, flatten(m.gaps), scratch).map(Some)
    }

    /// The plan for one segmentation: every segment (`checkpoint-all`), or the
    /// shortest feasible prefix of the recompute order from the first whose
    /// modelled peak fits; otherwise the candidate that needed the least.
    fn plan_segmentation(
        &self,
        search: &Search<'_, '_>,
        seg: &Segmentation,
        scratch: &mut Scratch,
    ) -> Result<Scored, PlannerError> {
        let budget = search.request.budget_bytes as i128;
        let mut prefixes: Vec<Vec<usize>> = if self.segments == Segments::All {
            vec![seg.droppable()]
        } else {
            let (order, peaks) = recompute_order(search.ctx, seg);
            let first_fit = (1..=order.len())
                .find(|&j| peaks[j] <= budget)
                .unwrap_or(order.len());
            (first_fit.max(1)..=order.len())
                .map(|j| order[..j].to_vec())
                .collect()
        };
        if prefixes.is_empty() {
            // No segment lowers the modelled peak: score them all, for an
            // infeasibility that says how much memory that still needs.
            prefixes.push(seg.droppable());
        }
        let mut closest: Option<Scored> = None;
        for selected in prefixes {
            let Some(scored) = self.score_selection(search, seg, &selected, scratch)? else {
                continue;
            };
            if scored.is_feasible() {
                return Ok(scored);
            }
            if needed(&scored) < closest.as_ref().map_or(u64::MAX, needed) {
                closest = Some(scored);
            }
        }
        Ok(closest.unwrap_or(Scored {
            settings: Value::Null,
            schedule: None,
            score: Score::Skipped,
        }))
    }
}

/// The bytes a failed candidate needed (`u64::MAX` when unknown).
fn needed(s: &Scored) -> u64 {
    match &s.score {
        Score::OverBudget { needed_bytes, .. } => *needed_bytes,
        _ => u64::MAX,
    }
}

impl Planner for Checkpoint {
    fn name(&self) -> &'static str {
        match self.segments {
            Segments::All => "checkpoint-all",
            Segments::Sqrt => "checkpoint-sqrt",
            Segments::Greedy => "checkpoint-greedy",
        }
    }

    fn description(&self) -> &'static str {
        match self.segments {
            Segments::All => {
                "Chen et al. 2016 segment recomputation, every segment re-run once before its backward; the fastest segmentation that fits; no swapping"
            }
            Segments::Sqrt => {
                "Chen et al. 2016 sqrt(n) segments between checkpoints; the fewest, cheapest segments re-run (once, before their backward) that fit the budget; no swapping"
            }
            Segments::Greedy => {
                "Chen et al. 2016 Algorithm 2 (budget-driven greedy segmentation); the fewest, cheapest segments re-run (once, before their backward) that fit the budget; no swapping"
            }
        }
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let segmentations = self.segmentations(&ctx);
        search.best(
            "after recomputing segments of every segmentation it tried",
            &segmentations,
            Pick::Fastest,
            |seg, scratch| self.plan_segmentation(&search, seg, scratch),
        )
    }
}
