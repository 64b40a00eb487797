//! outcore: the library facade. One place that loads graphs, parses budgets,
//! sizes, devices and allocators, plans (a planner by name, the device
//! attached, verified, simulated under the plan's own allocator), verifies,
//! simulates, compares planners, finds each planner's largest batch under a
//! budget ([`max_batch`]) and runs plans on the CPU executor, with typed,
//! serialisable results and one [`Error`]. The `outcore` command line and the
//! Python package both call it, so they accept the same input and refuse the
//! same bad input with the same messages.
//!
//! ```no_run
//! use outcore::{GraphSource, PlanOptions, Target};
//! let graph = outcore::load_graph(&GraphSource::zoo("resnet50"))?;
//! let target = Target::parse(&graph, "v100-16gb-pcie3", "50%", "best-fit")?;
//! let result = outcore::plan(&graph, "window", &target, &PlanOptions::default())?;
//! println!("{} s/iteration", result.report.iter_time_s);
//! # Ok::<(), outcore::Error>(())
//! ```
//!
//! A plan is only ever returned (or written by the CLI) when it verifies and
//! its simulation under its allocator has no allocation failure.

mod budget_hint;
mod colocate;
mod colocate_run;
mod error;
mod input;
mod max_batch;
mod planning;
pub mod report;
mod run;
mod suite;

pub use budget_hint::{BudgetHint, budget_hint};
pub use colocate::{
    ColocateJobRow, ColocateResult, JOBS_FORMAT, JobList, JobSpec, TensileComparison, colocate,
    colocate_tensile, load_job_list, parse_job_list,
};
pub use colocate_run::{ColocateRunOptions, ColocateRunResult, ColocateRunRow, colocate_run};
pub use error::{Error, ErrorKind, Result};
pub use input::{
    GraphSource, LoadedGraph, check_latency_table, check_moves, check_time_limit_s, cost_model,
    graph_of_plan, load_device, load_graph, load_latency_table, load_plan, parse_allocator,
    parse_budget, parse_knobs, parse_optimizer, parse_planner_list, parse_size,
    planner_draws_own_progress, record_graph_source, strip_bom, virtual_chunks_allocator,
    write_plan,
};
pub use max_batch::{MaxBatchRequest, MaxBatchResult, MaxBatchRow, max_batch};
pub use planning::{
    AllocReplayResult, CPU_REFERENCE_DEVICE, Comparison, PinnedPlan, PlanOptions, PlanResult,
    PlannerOutcome, Runnability, SimulateOptions, SimulateResult, Target, Verification,
    alloc_replay, allocator_shortfall, compare, pin_to_timeline, plan, set_allocator,
    simulate_plan, size_classes_for_trace, verify_plan,
};
pub use report::{Report, compare_report, parse_compare, plan_report};
pub use run::{RunOptions, RunResult, cpu_target, plan_for_run, run};
pub use suite::{
    Retry, Suite, SuiteCase, SuiteGraph, SuiteResult, SuiteRow, default_repo_root, run_suite,
    standard_suite,
};

/// A progress hook: told (units done, units asked for) after each iteration of
/// [`run`] or planner of [`compare`]; returning `false` stops the operation
/// (a Ctrl-C) with [`ErrorKind::Interrupted`] or the executor's
/// `Interrupted`, before anything is written.
pub use outcore_exec::IterationHook as ProgressHook;

// The types results are made of, so that callers need no other crate.
pub use outcore_bound::{Bound, TimeBound};
pub use outcore_cost::{DeviceProfile, MeasuredTable};
pub use outcore_graph::Graph;
pub use outcore_plan::{AllocatorSpec, Plan};
pub use outcore_sim::SimReport;
