//! SuperNeurons (Wang et al., PPoPP 2018, Sec. 3.3-3.4) as HOME Sec. 4.1
//! reimplements it: a fixed rule per layer type. Convolution outputs are
//! offloaded in forward and prefetched for backward (as vDNN does); outputs of
//! pooling, activation and normalisation layers are freed after forward and
//! recomputed for backward; everything else stays resident.
//!
//! Choices where the description is vague:
//! - "Convolution" is `OpClass::Convolution`; the cheap layers are the pooling
//!   class, the activations (ReLU, ReLU6, GELU, tanh, sigmoid, softmax) and batch
//!   and layer norm (local response norm does not occur in the zoo).
//! - Only tensors backward reads are decided; swaps use vDNN's overlapped form
//!   (prefetch overlapping the op before the use, offload awaited `k` ops later,
//!   `k` in {2, 3, 5} picked by simulation).
//! - Recomputation follows chains (SuperNeurons' "cost-aware recomputation"
//!   re-runs a segment of cheap layers from the nearest kept or swapped tensor):
//!   for conv -> bn -> relu, the ReLU output is rebuilt at its first backward
//!   need by recomputing the (otherwise dead) batch-norm output from the
//!   convolution output, which is swapped in early enough for that; see
//!   `framework::materialise`. Tensors rebuilt only to feed a chain are freed right
//!   after it (`chain_only_tensors`). Chains cost recomputation and bring swapped
//!   tensors back early, so the planner also simulates the same rule without
//!   rebuilding dead intermediates (such ReLUs then stay resident) and keeps the
//!   faster plan that fits (`chains_through_dead_cheap_outputs`).

use crate::framework::{
    Ctx, Decision, Decisions, Pick, Search, SwapTiming, bytes, count, flatten, materialise,
};
use outcore_graph::{OpClass, OpKind, TensorId};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError, Restore};

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
                | OpKind::Silu
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
    /// Cheap outputs that stay because no chain can bring back their inputs.
    pub cheap_kept: Vec<TensorId>,
    /// Tensors recomputed or swapped in only to feed recomputations.
    pub chain_only: usize,
    pub gaps: Vec<Vec<Gap>>,
}

impl SuperNeurons {
    /// Decides per tensor; `reclaim_lag_ops` is the offload wait distance.
    pub fn decide(&self, an: &Ctx<'_>, reclaim_lag_ops: usize) -> SuperNeuronsDecision {
        self.decide_with(an, reclaim_lag_ops, true)
    }

    /// Decides per tensor; with `chains == false` a recomputation may read only
    /// what is still resident or swapped (no dead intermediate is rebuilt), so
    /// e.g. a ReLU after a batch norm stays resident.
    pub fn decide_with(
        &self,
        an: &Ctx<'_>,
        reclaim_lag_ops: usize,
        chains: bool,
    ) -> SuperNeuronsDecision {
        let graph = an.graph;
        let saved = an.saved_activations();
        let mut d = Decisions::keep_all(graph);
        let producer_kind = |t: TensorId| graph.tensor(t).producer.map(|p| &graph.op(p).kind);
        let mut swapped = Vec::new();
        let mut cheap = Vec::new();
        for &t in &saved {
            if producer_kind(t).is_some_and(|k| k.class() == OpClass::Convolution) {
                d.set(t, Decision::Swap);
                swapped.push(t);
            } else if producer_kind(t).is_some_and(is_cheap) {
                d.set(t, Decision::Recompute);
                cheap.push(t);
            }
        }
        let timing = SwapTiming {
            lead_ops: 2,
            reclaim_lag_ops,
        };
        // Chains pass only through cheap layers: a dead output of anything else
        // (e.g. the sum of a residual block) is not rebuilt, so what reads it
        // stays resident.
        let rebuild = |t: TensorId| chains && producer_kind(t).is_some_and(is_cheap);
        let m = materialise(an, &d, timing, &rebuild);
        let gaps = m.gaps;
        let dropped = |t: &TensorId| !gaps[t.index()].is_empty();
        let swapped: Vec<TensorId> = swapped.into_iter().filter(dropped).collect();
        let (recomputed, cheap_kept): (Vec<TensorId>, Vec<TensorId>) =
            cheap.into_iter().partition(dropped);
        let chain_only = m.chain_only;
        SuperNeuronsDecision {
            swapped,
            recomputed,
            cheap_kept,
            chain_only,
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

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let forms: Vec<(usize, bool)> = RECLAIM_LAGS_OPS
            .iter()
            .flat_map(|&lag| [(lag, true), (lag, false)])
            .collect();
        search.best(
            "after swapping convolution outputs and recomputing cheap layers",
            &forms,
            Pick::Fastest,
            |&(lag, chains), scratch| {
                let d = self.decide_with(&ctx, lag, chains);
                let settings = serde_json::json!({
                    "prefetch_lead_ops": 2,
                    "reclaim_lag_ops": lag,
                    "chains_through_dead_cheap_outputs": chains,
                    "swapped_tensors": count(&d.gaps, Restore::Swap),
                    "swapped_bytes": bytes(request.graph, &d.gaps, Restore::Swap),
                    "recomputed_tensors": count(&d.gaps, Restore::Recompute),
                    "recomputed_bytes": bytes(request.graph, &d.gaps, Restore::Recompute),
                    "cheap_kept": d.cheap_kept.len(),
                    "chain_only_tensors": d.chain_only,
                });
                search.scored(settings, flatten(d.gaps), scratch)
            },
        )
    }
}
