//! SuperNeurons (Wang et al., PPoPP 2018) as HOME Sec. 4.1 reimplements it: a
//! fixed rule per layer type. Convolution outputs are offloaded in forward and
//! prefetched for backward (as vDNN does); outputs of pooling, activation and
//! normalisation layers are freed after forward and recomputed for backward;
//! everything else stays resident.
//!
//! Choices where the description is vague:
//! - "Convolution" is `OpClass::Convolution`; the cheap layers are the pooling
//!   class, the activations (ReLU, ReLU6, GELU, tanh, sigmoid, softmax) and batch
//!   and layer norm (local response norm does not occur in the zoo).
//! - Only tensors backward reads are touched; swaps use vDNN's overlapped form
//!   (prefetch overlapping the op before the use, offload awaited `k` ops later,
//!   `k` in {2, 3, 5} picked by simulation).
//! - Swaps are decided first, then recomputation in production order. Under the
//!   shared lowering a recomputation must find its inputs resident at the first
//!   backward use (one hop), so a cheap output whose input is swapped out or
//!   already freed then (e.g. a ReLU after a batch norm, whose output backward
//!   never reads) stays resident; `cheap_kept_by_lowering` counts them.

use crate::common::{Analysis, Candidate, best_of, bytes, count, fits_as_is, flatten, swap_gap};
use outcore_graph::{OpClass, OpKind, TensorId};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, Restore};

/// The SuperNeurons planner.
#[derive(Debug, Clone, Copy, Default)]
pub struct SuperNeurons;

const RECLAIM_LAGS_OPS: [usize; 3] = [2, 3, 5];

/// Whether SuperNeurons recomputes outputs of this op kind (its "cheap" layers).
pub fn is_cheap(kind: &OpKind) -> bool {
    matches!(kind.class(), OpClass::Pooling)
        || matches!(
            kind,
            OpKind::Relu
                | OpKind::Relu6
                | OpKind::Gelu
                | OpKind::Tanh
                | OpKind::Sigmoid
                | OpKind::Softmax
                | OpKind::BatchNorm { .. }
                | OpKind::LayerNorm { .. }
        )
}

/// What SuperNeurons decided.
#[derive(Debug)]
pub struct SuperNeuronsDecision {
    pub swapped: Vec<TensorId>,
    pub recomputed: Vec<TensorId>,
    pub cheap_kept: Vec<TensorId>,
    pub gaps: Vec<Vec<Gap>>,
}

impl SuperNeurons {
    /// Decides per tensor; `reclaim_lag_ops` is the offload wait distance.
    pub fn decide(&self, an: &Analysis<'_>, reclaim_lag_ops: usize) -> SuperNeuronsDecision {
        let graph = an.graph;
        let saved = an.saved_activations();
        let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); graph.tensors.len()];
        let mut swapped = Vec::new();
        let mut recomputed = Vec::new();
        let mut cheap_kept = Vec::new();
        let producer_kind = |t: TensorId| graph.tensor(t).producer.map(|p| &graph.op(p).kind);
        for &t in &saved {
            if producer_kind(t).is_some_and(|k| k.class() == OpClass::Convolution)
                && let Some((after, before)) = an.forward_backward_gap(t)
            {
                gaps[t.index()].push(swap_gap(t, after, before, 2, reclaim_lag_ops));
                swapped.push(t);
            }
        }
        for &t in &saved {
            if producer_kind(t).is_some_and(is_cheap) {
                if an.try_recompute(t, &mut gaps) {
                    recomputed.push(t);
                } else {
                    cheap_kept.push(t);
                }
            }
        }
        SuperNeuronsDecision {
            swapped,
            recomputed,
            cheap_kept,
            gaps,
        }
    }
}

impl Planner for SuperNeurons {
    fn name(&self) -> &'static str {
        "superneurons"
    }

    fn description(&self) -> &'static str {
        "SuperNeurons (HOME 4.1): swap convolution outputs, recompute pooling/activation/normalisation outputs"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> PlanOutcome {
        if let Some(outcome) = fits_as_is(request, self.name()) {
            return outcome;
        }
        let an = Analysis::new(request.graph);
        let candidates = RECLAIM_LAGS_OPS
            .iter()
            .map(|&lag| {
                let d = self.decide(&an, lag);
                Candidate {
                    settings: serde_json::json!({
                        "prefetch_lead_ops": 2,
                        "reclaim_lag_ops": lag,
                        "swapped_tensors": count(&d.gaps, Restore::Swap),
                        "swapped_bytes": bytes(request.graph, &d.gaps, Restore::Swap),
                        "recomputed_tensors": count(&d.gaps, Restore::Recompute),
                        "recomputed_bytes": bytes(request.graph, &d.gaps, Restore::Recompute),
                        "cheap_kept_by_lowering": d.cheap_kept.len(),
                    }),
                    gaps: flatten(d.gaps),
                }
            })
            .collect();
        best_of(
            request,
            self.name(),
            "after swapping convolution outputs and recomputing cheap layers",
            candidates,
        )
    }
}
