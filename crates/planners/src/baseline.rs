//! `ideal` (unlimited memory) and `none` (no swapping or recomputation): the two
//! reference points every other planner is measured against. Both run the
//! request's order (the graph's by default).

use crate::framework::{Ctx, Score, Scratch, Search};
use outcore_plan::{
    AllocatorSpec, Infeasible, InfeasibleKind, PlanOutcome, PlanRequest, Planner, PlannerError,
    fmt_bytes,
};

/// Runs the order with unlimited device memory: the plan whose simulated time is
/// the ideal time. Its budget is the most memory verify says the order needs
/// (the footprint in graph order), and its allocator the perfect one, whatever
/// was asked: it is the unlimited-memory reference.
#[derive(Debug, Default)]
pub struct Ideal;

impl Planner for Ideal {
    fn name(&self) -> &'static str {
        "ideal"
    }

    fn description(&self) -> &'static str {
        "unlimited device memory: no swapping, perfect allocator (the reference for throughput)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let probe = Search::new(&ctx, request, self.name());
        let needed_bytes = probe.needed_bytes(&ctx.schedule(Vec::new()))?;
        let unlimited = PlanRequest {
            budget_bytes: needed_bytes,
            allocator: &AllocatorSpec::Perfect,
            ..*request
        };
        let search = Search::new(&ctx, &unlimited, self.name());
        let settings = serde_json::json!({ "note": "budget ignored: unlimited memory" });
        let scored = search.scored(settings, Vec::new(), &mut Scratch::default())?;
        match scored.score {
            Score::Feasible { .. } => search.prove(scored, &[]),
            _ => Ok(PlanOutcome::Infeasible(search.infeasible(
                "with the budget set to its own peak",
                std::slice::from_ref(&scored),
            ))),
        }
    }
}

/// Runs the order, freeing each tensor after its last use; no swapping, no
/// recomputation. Infeasible when that needs more than the budget.
#[derive(Debug, Default)]
pub struct NoSwap;

impl Planner for NoSwap {
    fn name(&self) -> &'static str {
        "none"
    }

    fn description(&self) -> &'static str {
        "no swapping or recomputation: feasible only when the footprint fits the budget"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        let scored = search.scored(serde_json::Value::Null, Vec::new(), &mut Scratch::default())?;
        match &scored.score {
            Score::Feasible { .. } => search.prove(scored, &[]),
            Score::OverBudget {
                needed_bytes,
                at_step,
            } => Ok(PlanOutcome::Infeasible(Infeasible {
                kind: InfeasibleKind::OverBudget,
                needed_bytes: Some(*needed_bytes),
                budget_bytes: request.budget_bytes,
                at: scored
                    .schedule
                    .as_ref()
                    .and_then(|schedule| search.describe(schedule, *at_step)),
                message: format!(
                    "the footprint is {} but the budget is {}: {} over; swap or recompute (try another planner) or lower the batch",
                    fmt_bytes(*needed_bytes),
                    fmt_bytes(request.budget_bytes),
                    fmt_bytes(needed_bytes.saturating_sub(request.budget_bytes))
                ),
            })),
            _ => Ok(PlanOutcome::Infeasible(search.infeasible(
                "with nothing swapped or recomputed",
                std::slice::from_ref(&scored),
            ))),
        }
    }
}
