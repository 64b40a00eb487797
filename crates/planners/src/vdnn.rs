//! vDNN (Rhu et al., MICRO 2016) as HOME Sec. 2.2 / 4.1 and TENSILE Sec. II / V-A
//! describe it: offload the feature maps that forward layers read once their last
//! forward use is done, and prefetch each one layer ahead in backward.
//! `vdnn-all` offloads every such feature map, `vdnn-conv` only those read by a
//! convolution.
//!
//! Choices where the descriptions are vague:
//! - A "layer" is one op of the graph, so "one layer ahead" is one op ahead.
//! - A feature map is a non-persistent storage owner that a forward op reads and
//!   a backward op reads again (the input batch included; its offload is free,
//!   since the host already holds it). `vdnn-conv` takes a tensor if any forward
//!   convolution (`OpClass::Convolution`) reads it, even if other ops read it too.
//! - Synchronous form (`-sync`, the original): the op after the last forward use
//!   waits for the offload (`reclaim_before = after + 1`), and the prefetch starts
//!   only when the backward op before the one that needs it is done, which then
//!   waits for the copy.
//! - Overlapped form (the default names, as in the improved vDNN TENSILE cites):
//!   the prefetch starts when the op two before the use is done, so it overlaps
//!   the op just before the use; the offload is awaited `k` ops after the last
//!   forward use, `k` picked from {1, 2, 3, 5} by simulation (fastest that verifies;
//!   `k = 1` keeps the prefetch overlapped when the budget is too tight for more).
//! - vDNN has no budget knob: it offloads its whole set; if the plan still does
//!   not fit, the planner reports the peak it needs.

use crate::framework::{Ctx, Pick, Search, bytes, count, flatten, swap_gap};
use outcore_graph::OpClass;
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError, Restore};

/// Which feature maps vDNN offloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VdnnScope {
    /// Every feature map a forward op reads.
    All,
    /// Only the inputs of forward convolutions.
    Conv,
}

/// The vDNN planner in one of its four forms.
#[derive(Debug, Clone, Copy)]
pub struct Vdnn {
    pub scope: VdnnScope,
    /// Overlap copies with compute (`true`) or wait for each copy (`false`).
    pub overlapped: bool,
}

/// Offload lags tried by the overlapped form, in ops after the last forward use.
const OVERLAP_RECLAIM_LAGS_OPS: [usize; 4] = [1, 2, 3, 5];

impl Vdnn {
    /// The tensors this form offloads, in production order.
    pub fn offloaded(&self, an: &Ctx<'_>) -> Vec<outcore_graph::TensorId> {
        let read_by = match self.scope {
            VdnnScope::All => an.forward_inputs_where(|_| true),
            VdnnScope::Conv => {
                an.forward_inputs_where(|op| op.kind.class() == OpClass::Convolution)
            }
        };
        an.saved_activations()
            .into_iter()
            .filter(|t| read_by[t.index()])
            .collect()
    }

    fn gaps(&self, an: &Ctx<'_>, lead_ops: usize, reclaim_lag_ops: usize) -> Vec<Vec<Gap>> {
        let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); an.graph.tensors.len()];
        for t in self.offloaded(an) {
            if let Some((after, before)) = an.forward_backward_gap(t) {
                gaps[t.index()].push(swap_gap(t, after, before, lead_ops, reclaim_lag_ops));
            }
        }
        gaps
    }
}

impl Planner for Vdnn {
    fn name(&self) -> &'static str {
        match (self.scope, self.overlapped) {
            (VdnnScope::All, true) => "vdnn-all",
            (VdnnScope::Conv, true) => "vdnn-conv",
            (VdnnScope::All, false) => "vdnn-all-sync",
            (VdnnScope::Conv, false) => "vdnn-conv-sync",
        }
    }

    fn description(&self) -> &'static str {
        match (self.scope, self.overlapped) {
            (VdnnScope::All, true) => {
                "vDNN-all (HOME 2.2, TENSILE V-A): offload every forward feature map, prefetch one op ahead, copies overlapped"
            }
            (VdnnScope::Conv, true) => {
                "vDNN-conv (HOME 2.2, TENSILE V-A): offload convolution inputs, prefetch one op ahead, copies overlapped"
            }
            (VdnnScope::All, false) => {
                "vDNN-all, synchronous (Rhu et al. 2016 via HOME 4.1): compute waits for every offload and prefetch"
            }
            (VdnnScope::Conv, false) => {
                "vDNN-conv, synchronous (Rhu et al. 2016 via HOME 4.1): compute waits for every offload and prefetch"
            }
        }
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        // (prefetch lead, reclaim lag) in ops.
        let forms: Vec<(usize, usize)> = if self.overlapped {
            OVERLAP_RECLAIM_LAGS_OPS
                .iter()
                .map(|&lag| (2, lag))
                .collect()
        } else {
            vec![(1, 1)]
        };
        search.best(
            "after offloading every feature map it may",
            &forms,
            Pick::Fastest,
            |&(lead_ops, reclaim_lag_ops), scratch| {
                let gaps = self.gaps(&ctx, lead_ops, reclaim_lag_ops);
                let settings = serde_json::json!({
                    "scope": match self.scope { VdnnScope::All => "all", VdnnScope::Conv => "conv" },
                    "overlapped": self.overlapped,
                    "prefetch_lead_ops": lead_ops,
                    "reclaim_lag_ops": reclaim_lag_ops,
                    "offloaded_tensors": count(&gaps, Restore::Swap),
                    "offloaded_bytes": bytes(request.graph, &gaps, Restore::Swap),
                });
                search.scored(settings, flatten(gaps), scratch)
            },
        )
    }
}
