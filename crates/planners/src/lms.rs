//! TFLMS / LMS (Le et al. 2019) as the schedule-window paper (003) Sec. 2
//! describes it: graph-distance rules. A tensor used at op `i` is swapped out
//! after it when its next use `j` is more than `swapout_threshold` ops away, and
//! swapped back in `swapin_ahead` ops before `j`; both knobs are tuned
//! automatically under the budget.
//!
//! Choices where the description is vague:
//! - Distance is the number of ops between two positions of the graph order.
//! - Every non-persistent storage owner is eligible (activations, gradients,
//!   the batch), and every pair of consecutive uses is judged on its own, so a
//!   tensor may be swapped several times (forward skip connections included).
//! - "Swapped in `swapin_ahead` ops before the use" means the swap-in starts
//!   when the op `swapin_ahead` positions before the use starts (it is triggered
//!   once the op before that has finished).
//! - LMS frees memory when the copy ends; the shared verifier only credits a free
//!   to compute that is ordered after it, so the op `reclaim_lag_ops` after the
//!   last use waits for the offload. It is tuned with the other two knobs.
//! - Auto-tuning (LMS simulates with its own cost estimates): every candidate of
//!   a fixed grid is lowered, verified and simulated under the request's cost
//!   model; the fastest that verifies wins, the first on ties, so the choice is
//!   deterministic. The search stops scoring new knobs when the request's time
//!   limit is spent.

use crate::framework::{Ctx, Pick, Search, bytes, count, flatten, swap_gap};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError, Restore};

/// The LMS planner.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lms;

/// LMS knob values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmsKnobs {
    /// Swap when the next use is more than this many ops away.
    pub swapout_threshold_ops: usize,
    /// Start the swap-in this many ops before the use.
    pub swapin_ahead_ops: usize,
    /// The op this many ops after the last use waits for the offload.
    pub reclaim_lag_ops: usize,
}

const THRESHOLDS_OPS: [usize; 9] = [2, 4, 8, 16, 32, 64, 128, 256, 512];
const AHEADS_OPS: [usize; 3] = [1, 2, 4];
const RECLAIM_LAGS_OPS: [usize; 2] = [1, 3];

impl Lms {
    /// The swap gaps under `knobs`.
    pub fn gaps(&self, an: &Ctx<'_>, knobs: LmsKnobs) -> Vec<Vec<Gap>> {
        let graph = an.graph;
        let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); graph.tensors.len()];
        for t in graph
            .tensors
            .iter()
            .filter(|t| t.allocates() && !t.is_persistent() && !t.is_output)
        {
            for w in an.uses[t.id.index()].windows(2) {
                let (i, j) = (w[0], w[1]);
                if j - i > knobs.swapout_threshold_ops {
                    // Swap-in starts with op `j - ahead`: triggered once the op
                    // before it has finished.
                    let lead_ops = knobs.swapin_ahead_ops + 1;
                    gaps[t.id.index()].push(swap_gap(t.id, i, j, lead_ops, knobs.reclaim_lag_ops));
                }
            }
        }
        gaps
    }

    /// The grid the auto-tuner searches, in a fixed order.
    pub fn grid() -> Vec<LmsKnobs> {
        let mut out = Vec::new();
        for &swapout_threshold_ops in &THRESHOLDS_OPS {
            for &swapin_ahead_ops in AHEADS_OPS.iter().filter(|&&a| a < swapout_threshold_ops) {
                for &reclaim_lag_ops in &RECLAIM_LAGS_OPS {
                    out.push(LmsKnobs {
                        swapout_threshold_ops,
                        swapin_ahead_ops,
                        reclaim_lag_ops,
                    });
                }
            }
        }
        out
    }
}

impl Planner for Lms {
    fn name(&self) -> &'static str {
        "lms"
    }

    fn description(&self) -> &'static str {
        "TFLMS (003 Sec. 2): swap when the next use is over swapout_threshold ops away, swap in swapin_ahead ops early; knobs auto-tuned by simulation"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let grid = Self::grid();
        let n_grid = grid.len();
        search.best(
            "with the most aggressive knobs tried",
            &grid,
            Pick::Fastest,
            |&knobs, scratch| {
                let gaps = self.gaps(&ctx, knobs);
                let settings = serde_json::json!({
                    "swapout_threshold_ops": knobs.swapout_threshold_ops,
                    "swapin_ahead_ops": knobs.swapin_ahead_ops,
                    "reclaim_lag_ops": knobs.reclaim_lag_ops,
                    "grid_size": n_grid,
                    "swapped_tensors": count(&gaps, Restore::Swap),
                    "swapped_bytes": bytes(request.graph, &gaps, Restore::Swap),
                });
                search.scored(settings, flatten(gaps), scratch)
            },
        )
    }
}
