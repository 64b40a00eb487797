//! `ideal` (unlimited memory) and `none` (no swapping or recomputation): the two
//! reference points every other planner is measured against.

use outcore_graph::footprint;
use outcore_plan::{PlanOutcome, PlanRequest, Planner, PlannerInfo, fmt_bytes, lower_in_order};

/// Runs the graph in its own order with unlimited device memory: the plan whose
/// simulated time is the ideal time. Its budget is the footprint, whatever was asked.
#[derive(Debug, Default)]
pub struct Ideal;

impl Planner for Ideal {
    fn name(&self) -> &'static str {
        "ideal"
    }

    fn description(&self) -> &'static str {
        "unlimited device memory: graph order, no swapping (the reference for throughput)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> PlanOutcome {
        let (footprint_bytes, _) = footprint(request.graph);
        let info = PlannerInfo {
            name: self.name().into(),
            seed: None,
            settings: serde_json::json!({ "note": "budget ignored: unlimited memory" }),
        };
        PlanOutcome::Feasible(Box::new(lower_in_order(
            request.graph,
            info,
            footprint_bytes,
        )))
    }
}

/// Runs the graph in its own order, freeing each tensor after its last use; no
/// swapping, no recomputation. Infeasible when the footprint exceeds the budget.
#[derive(Debug, Default)]
pub struct NoSwap;

impl Planner for NoSwap {
    fn name(&self) -> &'static str {
        "none"
    }

    fn description(&self) -> &'static str {
        "no swapping or recomputation: feasible only when the footprint fits the budget"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> PlanOutcome {
        let (footprint_bytes, _) = footprint(request.graph);
        if footprint_bytes > request.budget_bytes {
            return PlanOutcome::Infeasible {
                reason: format!(
                    "the footprint is {} but the budget is {}: {} over; swap or recompute (try another planner) or lower the batch",
                    fmt_bytes(footprint_bytes),
                    fmt_bytes(request.budget_bytes),
                    fmt_bytes(footprint_bytes - request.budget_bytes)
                ),
            };
        }
        let info = PlannerInfo {
            name: self.name().into(),
            seed: None,
            settings: serde_json::Value::Null,
        };
        PlanOutcome::Feasible(Box::new(lower_in_order(
            request.graph,
            info,
            request.budget_bytes,
        )))
    }
}
