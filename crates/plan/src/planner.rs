//! The Planner trait every strategy implements; infeasibility as a structured
//! value, and planner errors (bugs or bad input) kept apart from it.

use crate::plan::{AllocatorSpec, Plan};
use outcore_cost::CostModel;
use outcore_graph::{Graph, OpId};
use std::fmt;

/// What a planner is asked: plan `graph` for a device under a budget.
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest<'a> {
    pub graph: &'a Graph,
    pub cost: &'a dyn CostModel,
    pub budget_bytes: u64,
    /// Seed for any randomness. The same seed gives the same plan where the
    /// search is bounded by counts (moves, generations, swarms) before the
    /// time limit; where the clock ends it, how far it got depends on the
    /// machine's speed, so the plan may differ from run to run.
    pub seed: u64,
    /// Wall-clock budget for search-based planners: once it is spent they stop
    /// scoring new candidates and return the best so far.
    pub time_limit_s: f64,
    /// The allocator the plan must run under: a planner plans for it or says
    /// it cannot.
    pub allocator: &'a AllocatorSpec,
    /// The compute order to plan on: every op once, dependencies respected
    /// (`None`: the graph's own order). A bad order is a
    /// [`PlannerErrorKind::InvalidRequest`].
    pub order: Option<&'a [OpId]>,
    /// `graph`'s [`graph_fingerprint`](crate::graph_fingerprint), when the
    /// caller has it (`None`: computed where a plan needs it). It serialises
    /// the whole graph, milliseconds on a large one, and every search and
    /// every plan needs it: a portfolio (outcore's joint planner runs a few
    /// dozen planners and merges) computes it once and hands it down. It must
    /// be the fingerprint of `graph`.
    pub fingerprint: Option<&'a str>,
}

impl<'a> PlanRequest<'a> {
    /// A request in graph order with the perfect allocator, seed 0 and a
    /// generous time limit: what tests and simple callers want.
    pub fn new(graph: &'a Graph, cost: &'a dyn CostModel, budget_bytes: u64) -> Self {
        PlanRequest {
            graph,
            cost,
            budget_bytes,
            seed: 0,
            time_limit_s: 60.0,
            allocator: &AllocatorSpec::Perfect,
            order: None,
            fingerprint: None,
        }
    }

    /// The graph's fingerprint: the one the request carries, else computed.
    pub fn graph_fingerprint(&self) -> String {
        self.fingerprint
            .map_or_else(|| crate::graph_fingerprint(self.graph), str::to_owned)
    }
}

/// Why no plan exists under a planner. Every planner scores its candidates
/// under the requested allocator, so none is "unsupported"; a planner that
/// cannot model an allocator would add that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InfeasibleKind {
    /// Every plan the planner could build needs more device memory than the budget.
    OverBudget,
    /// Plans fit the budget in bytes, but the allocator cannot place them
    /// (fragmentation, or a size-class pool larger than the budget).
    AllocatorFailure,
    /// The planner had no candidate to try (e.g. its rules select nothing).
    NoCandidate,
}

impl fmt::Display for InfeasibleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InfeasibleKind::OverBudget => "over budget",
            InfeasibleKind::AllocatorFailure => "allocator failure",
            InfeasibleKind::NoCandidate => "no candidate",
        })
    }
}

/// No plan under this planner, with what it would take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infeasible {
    pub kind: InfeasibleKind,
    /// The least device memory any plan the planner built still needs, when known.
    pub needed_bytes: Option<u64>,
    pub budget_bytes: u64,
    /// Where that plan's peak falls, in words, when known.
    pub at: Option<String>,
    /// One or two sentences for a person: what failed and what would help.
    pub message: String,
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A plan, or why none exists under this planner.
#[derive(Debug, Clone)]
pub enum PlanOutcome {
    Feasible(Box<Plan>),
    Infeasible(Infeasible),
}

impl PlanOutcome {
    /// The plan, if feasible.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            PlanOutcome::Feasible(p) => Some(p),
            PlanOutcome::Infeasible(_) => None,
        }
    }

    /// The infeasibility, if infeasible.
    pub fn infeasible(&self) -> Option<&Infeasible> {
        match self {
            PlanOutcome::Feasible(_) => None,
            PlanOutcome::Infeasible(i) => Some(i),
        }
    }
}

/// What went wrong inside a planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlannerErrorKind {
    /// The request itself is wrong (e.g. `order` is not a valid topological
    /// order of the graph): the caller's mistake, not the planner's.
    InvalidRequest,
    /// The planner's own schedule did not lower (a planner bug).
    Lowering,
    /// The plan the planner would return fails `verify()` for a reason other
    /// than memory (a planner bug).
    Verification,
    /// The simulator refused a verified plan (a bug in the planner or the simulator).
    Simulation,
}

impl fmt::Display for PlannerErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlannerErrorKind::InvalidRequest => "invalid request",
            PlannerErrorKind::Lowering => "lowering failed",
            PlannerErrorKind::Verification => "verification failed",
            PlannerErrorKind::Simulation => "simulation failed",
        })
    }
}

/// A planner failure that is not infeasibility: bad input, or a bug. Tests
/// treat every kind but [`PlannerErrorKind::InvalidRequest`] as a failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("planner {planner}: {kind}: {message}")]
pub struct PlannerError {
    pub planner: String,
    pub kind: PlannerErrorKind,
    pub message: String,
}

impl PlannerError {
    pub fn new(planner: &str, kind: PlannerErrorKind, message: impl Into<String>) -> Self {
        PlannerError {
            planner: planner.to_string(),
            kind,
            message: message.into(),
        }
    }
}

/// A planning strategy. Every strategy lowers to the one [`Plan`] type.
pub trait Planner: std::fmt::Debug + Send + Sync {
    /// The name used on the command line and in plans.
    fn name(&self) -> &'static str;
    /// One line: what it does and which paper section it follows.
    fn description(&self) -> &'static str;
    /// Plans the request: a verified plan, or why none exists under this
    /// planner; `Err` only for bad input or a planner bug.
    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError>;
    /// Whether [`Planner::plan`] draws its own progress on a terminal's
    /// standard error (SwapAdvisor's line per generation), so that a
    /// caller's spinner there would garble it. No planner does by default.
    fn draws_own_progress(&self) -> bool {
        false
    }
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
