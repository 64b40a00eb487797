//! Jobs and job sets: what shares a device, validated on construction.

use std::sync::Arc;

use outcore_graph::Graph;
use outcore_plan::{Plan, verify};

/// The most iterations a job may run: enough for steady state and for
/// staggered arrivals, and a bound on how long one simulation can take.
pub const MAX_ITERATIONS: usize = 10_000;

/// The latest a job may arrive, in seconds (11.6 days). Why a bound: the
/// simulated clock is f64 seconds, whose step at 1e6 s is about 1e-10 s, fine
/// for kernels of microseconds; at 1e20 s it is hours, and every iteration
/// time rounds to 0 (a reviewer's job list reported "the vanilla run's time
/// cost is 0").
pub const MAX_ARRIVAL_S: f64 = 1e6;

/// One training job: a graph, its verified plan, how many iterations it runs,
/// when it arrives and its priority.
#[derive(Debug, Clone)]
pub struct Job {
    name: String,
    graph: Arc<Graph>,
    plan: Arc<Plan>,
    iterations: usize,
    arrival_s: f64,
    priority: f64,
}

impl Job {
    /// A job, checked: 1 to [`MAX_ITERATIONS`] iterations, an arrival time in
    /// [0, [`MAX_ARRIVAL_S`]] s, a priority in [0, 1], and a plan made for `graph` that
    /// passes `verify()` (under its own budget).
    ///
    /// `priority` is TENSILE's max swapping rate (Sec. IV-C: the share of the
    /// job's tensors its scheduler may swap; lower means higher priority). The
    /// simulator does not use it: in the paper it bounds what the scheduler
    /// plans, not how the device arbitrates at run time.
    pub fn new(
        name: impl Into<String>,
        graph: Arc<Graph>,
        plan: Arc<Plan>,
        iterations: usize,
        arrival_s: f64,
        priority: f64,
    ) -> Result<Job, ColocateError> {
        let name = name.into();
        let err = |kind| Err(ColocateError { kind });
        if !(1..=MAX_ITERATIONS).contains(&iterations) {
            return err(ColocateErrorKind::BadIterations {
                job: name,
                iterations,
            });
        }
        if !(0.0..=MAX_ARRIVAL_S).contains(&arrival_s) {
            return err(ColocateErrorKind::BadArrival {
                job: name,
                arrival_s,
            });
        }
        if !(0.0..=1.0).contains(&priority) {
            return err(ColocateErrorKind::BadPriority {
                job: name,
                priority,
            });
        }
        if let Err(e) = plan.check_graph(&graph) {
            return err(ColocateErrorKind::PlanForAnotherGraph {
                job: name,
                detail: e.to_string(),
            });
        }
        let violations = verify(&plan, &graph);
        if let Some(first) = violations.first() {
            return err(ColocateErrorKind::PlanDoesNotVerify {
                job: name,
                violations: violations.len(),
                first: first.to_string(),
            });
        }
        Ok(Job {
            name,
            graph,
            plan,
            iterations,
            arrival_s,
            priority,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn iterations(&self) -> usize {
        self.iterations
    }

    pub fn arrival_s(&self) -> f64 {
        self.arrival_s
    }

    pub fn priority(&self) -> f64 {
        self.priority
    }
}

/// Jobs sharing one device: one memory budget for all of them together, one
/// host link in each direction, and one compute stream time-sliced between
/// them kernel by kernel.
#[derive(Debug, Clone)]
pub struct JobSet {
    budget_bytes: u64,
    jobs: Vec<Job>,
}

impl JobSet {
    /// A job set, checked: at least one job, a budget of at least 1 byte,
    /// distinct job names (reports and metrics match jobs by name), and no
    /// job planned for more memory than the whole set has.
    pub fn new(budget_bytes: u64, jobs: Vec<Job>) -> Result<JobSet, ColocateError> {
        let err = |kind| Err(ColocateError { kind });
        if jobs.is_empty() {
            return err(ColocateErrorKind::EmptySet);
        }
        if budget_bytes == 0 {
            return err(ColocateErrorKind::ZeroBudget);
        }
        for (i, job) in jobs.iter().enumerate() {
            if jobs[..i].iter().any(|other| other.name == job.name) {
                return err(ColocateErrorKind::DuplicateName {
                    job: job.name.clone(),
                });
            }
            if job.plan.budget_bytes > budget_bytes {
                return err(ColocateErrorKind::PlanOverSetBudget {
                    job: job.name.clone(),
                    plan_budget_bytes: job.plan.budget_bytes,
                    budget_bytes,
                });
            }
        }
        Ok(JobSet { budget_bytes, jobs })
    }

    /// The device memory all jobs share.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// The jobs, in the order given (the order breaks ties between jobs).
    pub fn jobs(&self) -> &[Job] {
        &self.jobs
    }
}

/// Why a job, a job set or a multi-job simulation was rejected.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct ColocateError {
    pub kind: ColocateErrorKind,
}

/// What was wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ColocateErrorKind {
    #[error("a job set needs at least one job; add a job")]
    EmptySet,
    #[error(
        "the job set's budget is 0 bytes; give the device memory the jobs share (at least 1 byte)"
    )]
    ZeroBudget,
    #[error(
        "job `{job}` runs {iterations} iterations; the accepted range is 1 to {MAX_ITERATIONS}"
    )]
    BadIterations { job: String, iterations: usize },
    #[error(
        "job `{job}` arrives at {arrival_s} s; an arrival time must be at least 0 s and at most {MAX_ARRIVAL_S:e} s (11.6 days: later, the simulated clock's f64 seconds no longer resolve a kernel's microseconds)"
    )]
    BadArrival { job: String, arrival_s: f64 },
    #[error(
        "job `{job}` has priority {priority}; a priority is a max swapping rate in [0, 1] (lower is higher priority)"
    )]
    BadPriority { job: String, priority: f64 },
    #[error("job `{job}`: {detail}")]
    PlanForAnotherGraph { job: String, detail: String },
    #[error(
        "job `{job}`: the plan fails verification ({violations} violations, the first: {first}); re-plan it (`outcore plan` verifies)"
    )]
    PlanDoesNotVerify {
        job: String,
        violations: usize,
        first: String,
    },
    #[error("two jobs are named `{job}`; give every job its own name")]
    DuplicateName { job: String },
    #[error(
        "job `{job}` was planned for {plan_budget_bytes} bytes, more than the {budget_bytes} bytes the whole job set shares; re-plan it within the set's budget"
    )]
    PlanOverSetBudget {
        job: String,
        plan_budget_bytes: u64,
        budget_bytes: u64,
    },
    #[error(
        "job `{job}`: its plan runs under the `{allocator}` allocator; the multi-job simulator models the perfect allocator only: re-plan with the perfect allocator"
    )]
    UnsupportedAllocator { job: String, allocator: String },
    #[error("job `{job}`: {source}")]
    Sim {
        job: String,
        #[source]
        source: outcore_sim::SimError,
    },
    #[error(
        "the reports to compare differ: {detail}; compare the same jobs run with and without memory limits"
    )]
    MismatchedReports { detail: String },
    #[error(
        "the vanilla run's {what} is {value}; MSR and EOR divide by it, so it must be positive"
    )]
    DegenerateVanilla { what: &'static str, value: f64 },
}
