//! `tensile`: TENSILE's scheduler (Zhang et al., paper 004, Sec. III-IV) for one
//! job: tensor access sequences ([`access`]), the memory peak analysis
//! (Algorithm 1, [`peak`]), greedy swap scheduling of the largest peak tensor
//! in free link slots that never stall compute, with cross-iteration swaps of
//! optimizer-updated parameters (Algorithm 2, [`swap`], [`link`], checked on
//! the copies as issued by [`replay`]), MSPS
//! recomputation of never-released accesses (Sec. IV-D, [`recompute`]) and the
//! loop of Algorithm 3 with its stopping rule ([`scheduler`]).
//!
//! [`multi`] runs the same pieces over several jobs sharing one device (merged
//! peak, biggest peak tensor among all jobs, max swapping rate). The planner
//! takes its latencies from the request's cost model; cold start (predicted
//! latencies) and EWMA updates are cost models too (`outcore_cost::predict`),
//! and the `tensile_coldstart` example replans with them between iterations.
//!
//! Choices where the paper is vague (see also each module):
//! - When the plan with nothing moved fits the budget it is returned as is
//!   (like every other planner here); otherwise Algorithm 3 runs, and its
//!   schedule is scored by the framework's one scoring path against the
//!   tightening margins (a tighter margin only drives more recomputation).

pub mod access;
pub mod link;
pub mod multi;
pub mod peak;
pub mod recompute;
pub mod replay;
pub mod scheduler;
pub mod swap;
#[cfg(test)]
mod tests;

use crate::framework::{Ctx, Pick, Search};
use outcore_plan::{PlanOutcome, PlanRequest, Planner, PlannerError};

/// TENSILE's single-job scheduler.
#[derive(Debug, Default)]
pub struct Tensile;

impl Planner for Tensile {
    fn name(&self) -> &'static str {
        "tensile"
    }

    fn description(&self) -> &'static str {
        "peak analysis, then hidden swaps of the largest peak tensor (cross-iteration for updated parameters), then MSPS recomputation of never-released tensors (TENSILE Alg. 1-3, single job)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        search.best(
            "after hidden swaps and MSPS recomputation",
            &[()],
            Pick::Fastest,
            |_, scratch| {
                search.with_margins(scratch, |budget_bytes, margin| {
                    let (summary, gaps) = scheduler::schedule(&ctx, request.cost, budget_bytes);
                    let settings = serde_json::json!({
                        "planning_margin": margin,
                        "algorithm3_iterations": summary.iterations,
                        "swapped_tensors": summary.swapped_tensors,
                        "swap_gaps": summary.swap_gaps,
                        "cross_iteration_swaps": summary.cross_iteration_swaps,
                        "recomputations": summary.recomputations,
                        "stopped_by_stall_rule": summary.stopped_by_stall_rule,
                        "modelled_peak_bytes": summary.final_peak_bytes,
                    });
                    (settings, gaps)
                })
            },
        )
    }
}
