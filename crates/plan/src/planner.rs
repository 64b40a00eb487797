//! The Planner trait every strategy implements, and infeasibility as a value.

use crate::plan::{AllocatorSpec, Plan};
use outcore_cost::CostModel;
use outcore_graph::Graph;

/// What a planner is asked: plan `graph` for a device under a budget.
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest<'a> {
    pub graph: &'a Graph,
    pub cost: &'a dyn CostModel,
    pub budget_bytes: u64,
    /// Seed for any randomness; the same seed gives the same plan.
    pub seed: u64,
    /// Wall-clock budget for search-based planners.
    pub time_limit_s: f64,
    /// The allocator the plan must run under: a planner plans for it or says
    /// it cannot.
    pub allocator: &'a AllocatorSpec,
}

/// A plan, or the reason none exists under this planner.
#[derive(Debug, Clone)]
pub enum PlanOutcome {
    Feasible(Box<Plan>),
    Infeasible { reason: String },
}

impl PlanOutcome {
    /// The plan, if feasible.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            PlanOutcome::Feasible(p) => Some(p),
            PlanOutcome::Infeasible { .. } => None,
        }
    }
}

/// A planning strategy. Every strategy lowers to the one [`Plan`] type.
pub trait Planner: std::fmt::Debug + Send + Sync {
    /// The name used on the command line and in plans.
    fn name(&self) -> &'static str;
    /// One line: what it does and which paper section it follows.
    fn description(&self) -> &'static str;
    /// Plans the request.
    fn plan(&self, request: &PlanRequest<'_>) -> PlanOutcome;
}

/// Human-readable bytes, e.g. `3.71 GiB`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
