//! The facade's one error type: the crates' own errors wrapped, plus the checks
//! the facade itself makes (names, numbers, budgets, runnability), each message
//! naming the value, what is accepted and the fix.

use outcore_plan::fmt_bytes;

/// Any error of the facade.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct Error {
    pub kind: ErrorKind,
}

impl Error {
    pub fn new(kind: ErrorKind) -> Self {
        Error { kind }
    }

    /// A value outside what is accepted (see [`ErrorKind::InvalidValue`]).
    pub fn invalid(
        what: impl Into<String>,
        value: impl Into<String>,
        problem: impl Into<String>,
        accepted: impl Into<String>,
    ) -> Self {
        Error::new(ErrorKind::InvalidValue {
            what: what.into(),
            value: value.into(),
            problem: problem.into(),
            accepted: accepted.into(),
        })
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Error { kind }
    }
}

/// Wraps a crate's error as the matching kind.
macro_rules! wrap {
    ($($source:ty => $variant:ident),* $(,)?) => {$(
        impl From<$source> for Error {
            fn from(e: $source) -> Self {
                Error::new(ErrorKind::$variant(e))
            }
        }
    )*};
}

wrap! {
    outcore_graph::GraphError => Graph,
    outcore_cost::CostError => Cost,
    outcore_plan::PlanError => Plan,
    outcore_sim::SimError => Sim,
    outcore_exec::ExecError => Exec,
    outcore_alloc::AllocError => Alloc,
    outcore_alloc::TraceError => AllocTrace,
    outcore_colocate::ColocateError => Colocate,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Loading, building or validating a graph.
    #[error(transparent)]
    Graph(outcore_graph::GraphError),
    /// A device profile or latency table.
    #[error(transparent)]
    Cost(outcore_cost::CostError),
    /// Reading or matching a plan (including its embedded device).
    #[error(transparent)]
    Plan(outcore_plan::PlanError),
    /// The simulator could not run a plan.
    #[error(transparent)]
    Sim(outcore_sim::SimError),
    /// The executor or its backend.
    #[error(transparent)]
    Exec(outcore_exec::ExecError),
    /// An allocator name or configuration.
    #[error(transparent)]
    Alloc(outcore_alloc::AllocError),
    /// An allocation trace file.
    #[error(transparent)]
    AllocTrace(outcore_alloc::TraceError),
    /// A job, job set or multi-job simulation (`outcore colocate`).
    #[error(transparent)]
    Colocate(outcore_colocate::ColocateError),
    /// A number or text outside what is accepted.
    #[error("{what} `{value}`: {problem}; accepted: {accepted}")]
    InvalidValue {
        what: String,
        value: String,
        problem: String,
        accepted: String,
    },
    /// A name (planner, allocator, optimizer) that is not known.
    #[error("unknown {what} `{name}`; use one of: {known}")]
    UnknownName {
        what: &'static str,
        name: String,
        known: String,
    },
    /// A budget larger than the device's memory.
    #[error(
        "the budget {} is larger than {device}'s memory ({}); give at most {memory_bytes} bytes or a larger device",
        fmt_bytes(*budget_bytes),
        fmt_bytes(*memory_bytes)
    )]
    BudgetOverDevice {
        budget_bytes: u64,
        device: String,
        memory_bytes: u64,
    },
    /// A plan that says neither which zoo model nor which file it was made for.
    #[error(
        "the plan names neither a zoo model nor a graph file; re-run `outcore plan`, which records the graph"
    )]
    PlanNamesNoGraph,
    /// A plan without a device profile cannot be simulated.
    #[error(
        "the plan embeds no device profile; re-run `outcore plan`, which embeds the device it planned for"
    )]
    PlanNamesNoDevice,
    /// The planner found no plan, or its plan does not fit under its allocator.
    #[error("{planner} finds no plan for {model} under {}: {reason}", fmt_bytes(*budget_bytes))]
    Infeasible {
        planner: String,
        model: String,
        budget_bytes: u64,
        reason: String,
    },
    /// The plan breaks an invariant `verify()` checks.
    #[error(
        "the plan fails verification ({count} violations), first: {first}; re-plan, or report the planner's bug"
    )]
    VerificationFailed { count: usize, first: String },
    /// The caller's progress hook asked to stop (a Ctrl-C) after `done` of
    /// `total` units of `what`.
    #[error(
        "interrupted after {done} of {total} {what}; nothing was written: run again to get the full result"
    )]
    Interrupted {
        what: &'static str,
        done: u32,
        total: u32,
    },
    /// The plan cannot run under its allocator (see [`crate::Runnability`]).
    #[error("{reason}")]
    NotRunnable { reason: String },
    /// `run --plan` of a plan made for another device than the backend's.
    #[error(
        "the plan was made for device `{device}`, but `run` executes on the cpu backend (device `{backend_device}`: an arena of exactly the budget, with its own speeds), where its memory layout and times do not hold; make the plan for the cpu backend with `outcore plan ... --device cpu-reference`, or plan and run in one step with `outcore run --model NAME --budget B --planner P`"
    )]
    PlanForOtherDevice {
        device: String,
        backend_device: String,
    },
    /// The CPU backend's arena (and host buffers) would not fit in host memory.
    #[error(
        "the cpu backend allocates its device arena for real: a budget of {} needs about {} of host memory (arena, host copies, reference run) but {} is available; give a smaller --budget",
        fmt_bytes(*budget_bytes),
        fmt_bytes(*needed_bytes),
        fmt_bytes(*available_bytes)
    )]
    HostMemory {
        budget_bytes: u64,
        needed_bytes: u64,
        available_bytes: u64,
    },
    /// A file could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Shorthand for the facade's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
