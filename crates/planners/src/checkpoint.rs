//! Recompute-only checkpointing: `checkpoint-sqrt` after Chen et al. 2016
//! ("Training deep nets with sublinear memory cost", Sec. 4: split the forward
//! chain into about sqrt(n) segments, keep the segment boundaries, recompute the
//! interiors for backward) and `checkpoint-all`, which drops every activation it
//! can recompute. Nothing is swapped.
//!
//! Choices where the description is vague, and limits of the shared lowering:
//! - n is the number of saved activations (feature maps backward reads) whose
//!   producer may be re-run, in production order; this list is "the forward
//!   chain" even for DAGs. Segments are `round(sqrt(n))` consecutive entries; the
//!   last of each segment is its boundary and stays resident.
//! - A dropped activation is freed after its last forward use and recomputed
//!   just before its first backward use, then stays until its last use.
//! - The lowering only ends gaps at positions that use a tensor, so a
//!   recomputation must find its inputs resident (one hop); Chen's chained
//!   re-forward of a whole segment cannot be expressed. An interior activation
//!   whose inputs are not resident at its first backward use therefore stays
//!   resident too (reported as `interior_kept_by_lowering`). In a plain chain
//!   this drops about every other interior activation.
//! - `checkpoint-all`: every op is its own segment, i.e. every recomputable
//!   activation whose producer's inputs are resident at its backward use is
//!   dropped, deciding in production order.
//! - Activations of non-recomputable producers (and graph inputs) stay resident.

use crate::common::{Analysis, Candidate, best_of, bytes, fits_as_is, flatten};
use outcore_graph::TensorId;
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, Restore};

/// Where segment boundaries go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segments {
    /// Every op its own segment: drop all that can be recomputed.
    All,
    /// About sqrt(n) segments (Chen et al. 2016).
    Sqrt,
}

/// The checkpointing planner.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint {
    pub segments: Segments,
}

/// What a checkpointing pass decided.
#[derive(Debug)]
pub struct CheckpointDecision {
    /// Recompute candidates (saved activations of recomputable producers).
    pub candidates: Vec<TensorId>,
    /// Entries per segment.
    pub segment_len: usize,
    /// Candidates kept as segment boundaries.
    pub boundaries: Vec<TensorId>,
    /// Interior candidates that stay because their inputs are not resident.
    pub interior_kept: Vec<TensorId>,
    pub gaps: Vec<Vec<Gap>>,
}

impl Checkpoint {
    /// Decides which activations to drop.
    pub fn decide(&self, an: &Analysis<'_>) -> CheckpointDecision {
        let graph = an.graph;
        let candidates: Vec<TensorId> = an
            .saved_activations()
            .into_iter()
            .filter(|&t| {
                graph
                    .tensor(t)
                    .producer
                    .is_some_and(|p| graph.op(p).recomputable)
            })
            .collect();
        let n = candidates.len();
        let segment_len = match self.segments {
            Segments::All => 1,
            Segments::Sqrt => ((n as f64).sqrt().round() as usize).max(1),
        };
        let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); graph.tensors.len()];
        let mut boundaries = Vec::new();
        let mut interior_kept = Vec::new();
        for (i, &t) in candidates.iter().enumerate() {
            // With one-op segments there are no boundaries to keep: the inputs of
            // each op are what must stay resident, and `try_recompute` checks that.
            let boundary = segment_len > 1 && i % segment_len == segment_len - 1;
            if boundary {
                boundaries.push(t);
            } else if !an.try_recompute(t, &mut gaps) {
                interior_kept.push(t);
            }
        }
        CheckpointDecision {
            candidates,
            segment_len,
            boundaries,
            interior_kept,
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
                "recompute every activation backward needs whose inputs stay resident (one-op segments); no swapping"
            }
            Segments::Sqrt => {
                "Chen et al. 2016: about sqrt(n) segments, boundaries kept, interiors recomputed before backward; no swapping"
            }
        }
    }

    fn plan(&self, request: &PlanRequest<'_>) -> PlanOutcome {
        if let Some(outcome) = fits_as_is(request, self.name()) {
            return outcome;
        }
        let an = Analysis::new(request.graph);
        let d = self.decide(&an);
        let settings = serde_json::json!({
            "candidates": d.candidates.len(),
            "segment_len": d.segment_len,
            "boundaries": d.boundaries.len(),
            "interior_kept_by_lowering": d.interior_kept.len(),
            "recomputed_tensors": crate::common::count(&d.gaps, Restore::Recompute),
            "recomputed_bytes": bytes(request.graph, &d.gaps, Restore::Recompute),
        });
        best_of(
            request,
            self.name(),
            "after dropping every activation it may recompute",
            vec![Candidate {
                settings,
                gaps: flatten(d.gaps),
            }],
        )
    }
}
