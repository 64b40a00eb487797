//! Recompute-only checkpointing after Chen et al. 2016 ("Training deep nets with
//! sublinear memory cost", Sec. 4.1-4.3): split the forward chain into segments,
//! keep each segment's boundary (its checkpoint), drop everything inside a
//! segment after forward, and before the first backward op that needs any
//! tensor of the segment re-run the segment's forward from the checkpoint.
//! `checkpoint-sqrt` starts from the paper's sqrt(n) segments; `checkpoint-all`
//! drops every activation it can and takes the segmentation with the least
//! memory. Nothing is swapped (the input batch, whose host copy is current, may
//! be brought back by a free copy when a recomputation reads it).
//!
//! Choices where the paper is vague:
//! - n is the number of saved activations (feature maps backward reads) whose
//!   producer may be re-run, in production order; this list is "the forward
//!   chain" even for DAGs. A segment is `k` consecutive entries; the last of each
//!   segment is its checkpoint and stays resident, the others are dropped.
//! - Segment recomputation is a chain of `Recompute` gaps that all end at the
//!   segment's first backward need (the lowering runs them in producer order).
//!   Tensors backward never reads but that the chain passes through (e.g. a
//!   batch-norm output feeding a ReLU) are recomputed there too and freed right
//!   after the chain; so is anything the chain reads that is gone by then (see
//!   `framework::materialise`). A recomputed tensor then stays until its last use.
//! - `checkpoint-sqrt`: `k = round(sqrt(n))` is the paper's default; the planner
//!   also simulates a few other `k` (2, 3, 4, 6, 8, sqrt(n)/2, 2 sqrt(n)) and
//!   keeps the fastest plan that fits the budget (smaller `k` keeps more
//!   checkpoints and recomputes less). Settings record `k`, the default and how
//!   many segments there are.
//! - `checkpoint-all`: the literal "keep only inputs and parameters" (one
//!   segment) re-runs all of forward at the first backward op, so its peak is
//!   the whole forward's activations; the memory-minimal single-level schedule
//!   is Chen's segmentation with the `k` of least peak, so `checkpoint-all`
//!   tries the same and more `k` and keeps the plan with the least simulated
//!   peak (ties: the fastest), whatever the budget. It is the slowest of the two
//!   where the budget leaves room for more checkpoints.
//! - Activations of non-recomputable producers (and graph inputs) stay resident;
//!   batch-norm running-stat updates are separate ops and do not block it.

use crate::framework::{
    Ctx, Decision, Decisions, Materialised, Pick, Search, SwapTiming, bytes, count, flatten,
    materialise,
};
use outcore_graph::TensorId;
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError, Restore};

/// Where segment boundaries go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segments {
    /// Drop all that can be recomputed; the segmentation of least peak.
    All,
    /// About sqrt(n) segments (Chen et al. 2016), tuned by simulation.
    Sqrt,
}

/// The checkpointing planner.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint {
    pub segments: Segments,
}

/// What a checkpointing pass decided for one segment length.
#[derive(Debug)]
pub struct CheckpointDecision {
    /// Recompute candidates (saved activations of recomputable producers).
    pub candidates: Vec<TensorId>,
    /// Entries per segment.
    pub segment_len: usize,
    /// Candidates kept as segment boundaries.
    pub boundaries: Vec<TensorId>,
    /// Interior candidates that stay because no chain can bring back their
    /// inputs (none in graphs whose forward ops are all recomputable).
    pub interior_kept: Vec<TensorId>,
    /// Tensors recomputed only to feed the chains.
    pub chain_only: usize,
    /// Recomputation steps.
    pub recompute_steps: usize,
    pub gaps: Vec<Vec<Gap>>,
}

/// Segment lengths a planner tries, the sqrt(n) default first.
fn segment_lens(n: usize, segments: Segments) -> Vec<usize> {
    let sqrt_n = sqrt_len(n);
    let mut ks = vec![sqrt_n, 2, 3, 4, 6, 8, sqrt_n / 2, sqrt_n * 2];
    if segments == Segments::All {
        ks.extend([sqrt_n.saturating_sub(1), sqrt_n + 1, sqrt_n * 3 / 2, 12, 16]);
    }
    let mut out: Vec<usize> = Vec::new();
    for k in ks {
        let k = k.clamp(2, n.max(2));
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// Per candidate: whether it is a cut of forward (Chen et al. Sec. 4.3 split at
/// articulation points): no other activation made before it is read by a
/// forward op after it, so recomputing the next segment needs only it.
fn cut_points(an: &Ctx<'_>, candidates: &[TensorId]) -> Vec<bool> {
    let graph = an.graph;
    let n = an.backward_start;
    // crossing[i]: activations made at or before i and read by forward after i.
    let mut delta: Vec<i64> = vec![0; n + 1];
    for t in graph
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
    {
        let Some(made) = t.producer.map(|p| an.position(p)) else {
            continue;
        };
        let Some(last) = an.last_forward_use(t.id) else {
            continue;
        };
        if made < last && last <= n {
            delta[made] += 1;
            delta[last] -= 1;
        }
    }
    let mut crossing: Vec<i64> = Vec::with_capacity(n);
    let mut acc = 0i64;
    for x in delta.iter().take(n) {
        acc += x;
        crossing.push(acc);
    }
    candidates
        .iter()
        .map(|&t| {
            graph
                .tensor(t)
                .producer
                .map(|p| an.position(p))
                .and_then(|i| crossing.get(i))
                .is_some_and(|&c| c <= 1)
        })
        .collect()
}

/// The paper's default segment length, `round(sqrt(n))`, at least 2.
fn sqrt_len(n: usize) -> usize {
    ((n as f64).sqrt().round() as usize).max(2)
}

impl Checkpoint {
    /// Decides which activations to drop with the paper's default segment length.
    pub fn decide(&self, an: &Ctx<'_>) -> CheckpointDecision {
        let candidates = Self::candidates(an);
        let k = sqrt_len(candidates.len());
        Self::decide_with(an, candidates, k)
    }

    /// Saved activations whose producer may be re-run, in production order.
    pub fn candidates(an: &Ctx<'_>) -> Vec<TensorId> {
        let graph = an.graph;
        an.saved_activations()
            .into_iter()
            .filter(|&t| {
                graph
                    .tensor(t)
                    .producer
                    .is_some_and(|p| graph.op(p).recomputable)
            })
            .collect()
    }

    /// Segments of `segment_len` candidates: the last of each kept, the others
    /// recomputed from it at the segment's first backward need.
    pub fn decide_with(
        an: &Ctx<'_>,
        candidates: Vec<TensorId>,
        segment_len: usize,
    ) -> CheckpointDecision {
        let graph = an.graph;
        let segment_len = segment_len.max(1);
        let mut d = Decisions::keep_all(graph);
        let cuts = cut_points(an, &candidates);
        // Segments end at a cut once they hold `segment_len` candidates (or, when
        // no cut comes, at four times that).
        let mut segments: Vec<(Vec<TensorId>, Option<TensorId>)> = Vec::new();
        let mut current: Vec<TensorId> = Vec::new();
        for (&t, &cut) in candidates.iter().zip(&cuts) {
            let len = current.len() + 1;
            if (len >= segment_len && cut) || len >= segment_len * 4 {
                segments.push((std::mem::take(&mut current), Some(t)));
            } else {
                current.push(t);
            }
        }
        // A last segment without a checkpoint of its own.
        segments.push((current, None));
        let mut boundaries = Vec::new();
        for (interior, boundary) in segments {
            boundaries.extend(boundary);
            let Some(start) = interior
                .iter()
                .filter_map(|&t| an.first_backward_use(t))
                .min()
            else {
                continue;
            };
            for &t in &interior {
                d.set(t, Decision::Recompute);
                d.anchor(t, start);
            }
        }
        let timing = SwapTiming {
            lead_ops: 2,
            reclaim_lag_ops: 1,
        };
        let Materialised {
            gaps,
            chain_only,
            recompute_steps,
            ..
        } = materialise(an, &d, timing, &|_| true);
        let interior_kept = candidates
            .iter()
            .copied()
            .filter(|t| !boundaries.contains(t) && gaps[t.index()].is_empty())
            .collect();
        CheckpointDecision {
            candidates,
            segment_len,
            boundaries,
            interior_kept,
            chain_only,
            recompute_steps,
            gaps,
        }
    }
}

impl Planner for Checkpoint {
    fn name(&self) -> &'static str {
        match self.segments {
            Segments::All => "checkpoint-all",
            Segments::Sqrt => "checkpoint-sqrt",
        }
    }

    fn description(&self) -> &'static str {
        match self.segments {
            Segments::All => {
                "Chen et al. 2016 segment recomputation, dropping all it can, with the segmentation of least peak memory; no swapping"
            }
            Segments::Sqrt => {
                "Chen et al. 2016: about sqrt(n) segments (tuned by simulation), checkpoints kept, segments re-run before their backward; no swapping"
            }
        }
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let candidates = Self::candidates(&ctx);
        let n = candidates.len();
        let sqrt_default = sqrt_len(n);
        let pick = match self.segments {
            Segments::All => Pick::LeastPeak,
            Segments::Sqrt => Pick::Fastest,
        };
        search.best(
            "after recomputing every segment of every segmentation it tried",
            &segment_lens(n, self.segments),
            pick,
            |&k, scratch| {
                let d = Self::decide_with(&ctx, candidates.clone(), k);
                let settings = serde_json::json!({
                    "candidates": n,
                    "segment_len": d.segment_len,
                    "segment_len_sqrt_default": sqrt_default,
                    "segments": n.div_ceil(d.segment_len),
                    "boundaries": d.boundaries.len(),
                    "interior_kept": d.interior_kept.len(),
                    "chain_only_tensors": d.chain_only,
                    "recompute_steps": d.recompute_steps,
                    "recomputed_tensors": count(&d.gaps, Restore::Recompute),
                    "recomputed_bytes": bytes(request.graph, &d.gaps, Restore::Recompute),
                    "selection": match self.segments {
                        Segments::All => "least simulated peak",
                        Segments::Sqrt => "fastest that fits",
                    },
                });
                search.scored(settings, flatten(d.gaps), scratch)
            },
        )
    }
}
