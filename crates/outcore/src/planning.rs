//! Planning and judging: run a planner by name on a target, attach the device,
//! size the allocator, verify, and simulate under the plan's own allocator; a
//! plan that does not run under its allocator is never called feasible.

use crate::error::{Error, ErrorKind, Result};
use crate::input::{
    LoadedGraph, check_latency_table, check_moves_counted, check_time_limit_s, cost_model,
    graph_of_plan, planner_for,
};
use outcore_cost::{CostModel, DeviceProfile, MeasuredTable, RooflineModel};
use outcore_graph::{Graph, OpId};
use outcore_plan::{
    AllocatorSpec, Plan, PlanOutcome, PlanRequest, TimedStep, fmt_bytes, pin_frees, verify,
};
use outcore_sim::{SimOom, SimOptions, SimReport, simulate};
use serde::Serialize;
use std::time::Instant;

/// What to plan for: a device, a budget on it, and the allocator the plan runs under.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub device: DeviceProfile,
    pub budget_bytes: u64,
    /// The graph's footprint, for reporting the budget as a share of it.
    pub footprint_bytes: u64,
    pub allocator: AllocatorSpec,
}

impl Target {
    /// A target for `graph`; the budget must lie in `[1, device memory]`.
    pub fn new(
        graph: &LoadedGraph,
        device: DeviceProfile,
        budget_bytes: u64,
        allocator: AllocatorSpec,
    ) -> Result<Target> {
        device.validate()?;
        if budget_bytes == 0 {
            return Err(Error::invalid(
                "budget",
                "0",
                "must be positive",
                format!("[1, {}] bytes", device.memory_bytes),
            ));
        }
        if budget_bytes > device.memory_bytes {
            return Err(ErrorKind::BudgetOverDevice {
                budget_bytes,
                device: device.name.clone(),
                memory_bytes: device.memory_bytes,
            }
            .into());
        }
        check_chunk_fits(&allocator, budget_bytes)?;
        Ok(Target {
            device,
            budget_bytes,
            footprint_bytes: graph.footprint_bytes(),
            allocator,
        })
    }

    /// A target from command-line text: a device name or profile file, a budget
    /// (bytes, a size, or NN% of the footprint) and an allocator name.
    pub fn parse(
        graph: &LoadedGraph,
        device: &str,
        budget: &str,
        allocator: &str,
    ) -> Result<Target> {
        let budget_bytes = crate::input::parse_budget(budget, graph.footprint_bytes())?;
        // The CPU reference backend's device is the arena of the budget: a plan
        // made for it is one `outcore run --plan` accepts.
        let device = if device == CPU_REFERENCE_DEVICE {
            crate::RunOptions::default().cpu_device(budget_bytes)
        } else {
            crate::input::load_device(device)?
        };
        let allocator = crate::input::parse_allocator(allocator)?;
        Target::new(graph, device, budget_bytes, allocator)
    }
}

/// The device name of the CPU reference backend (`outcore run`), accepted by
/// [`Target::parse`] beside the built-in profiles: its memory is the budget,
/// its speeds the backend's defaults.
pub const CPU_REFERENCE_DEVICE: &str = "cpu-reference";

/// A `virtual-chunks` chunk, or a best-fit allocator's smallest segment,
/// larger than the budget: no tensor could be placed at all.
pub(crate) fn check_chunk_fits(allocator: &AllocatorSpec, budget_bytes: u64) -> Result<()> {
    if let AllocatorSpec::VirtualChunks(config) = allocator
        && config.chunk_bytes > budget_bytes
    {
        return Err(Error::invalid(
            "chunk size (--chunk-kib)",
            format!("{} KiB", config.chunk_bytes / 1024),
            format!(
                "larger than the {} budget (the whole arena)",
                fmt_bytes(budget_bytes)
            ),
            "a chunk of at most the budget, usually far smaller: 2048 KiB (CUDA's granularity), or 64 for tiny models",
        ));
    }
    // PyTorch's caching allocator takes device memory in segments, the
    // smallest its small pool's (2 MiB): under a smaller budget no tensor
    // gets one, and every planner's plan fails in the allocator with a
    // message about one allocation rather than the budget.
    if let AllocatorSpec::BestFit(config) = allocator
        && config.small_segment_bytes > budget_bytes
    {
        return Err(Error::invalid(
            "budget",
            fmt_bytes(budget_bytes),
            format!(
                "smaller than the {} allocator's smallest segment ({}, its small pool's, as PyTorch's caching allocator takes them): no tensor fits",
                allocator.name(),
                fmt_bytes(config.small_segment_bytes)
            ),
            format!(
                "a budget of at least {} with this allocator, or the `perfect` allocator for a model this small (allocator=\"perfect\" in Python, --allocator perfect on the command line)",
                fmt_bytes(config.small_segment_bytes)
            ),
        ));
    }
    Ok(())
}

/// Settings of planning that are not the target.
#[derive(Debug, Clone, Serialize)]
pub struct PlanOptions {
    /// Seed of any randomness. The same seed gives the same plan for the
    /// rule-based planners, and for `outcore`'s search bounded by
    /// [`PlanOptions::max_moves`]; a search that the time limit ends stops
    /// where the machine's speed lets it, so its plan may differ from run to
    /// run ([`outcore_plan::PlanRequest::seed`]).
    pub seed: u64,
    /// Wall-clock seconds for search-based planners; positive and finite.
    pub time_limit_s: f64,
    /// Ends `outcore`'s own search (`outcore`, `outcore-recompute`) after
    /// this many scored moves per start instead of at `time_limit_s`, so
    /// that the same seed gives the same plan whatever the machine's speed
    /// ([`outcore_planners::Joint::bounded_by_moves`]); the other planners
    /// still end at `time_limit_s`. At most
    /// [`outcore_planners::joint::MAX_COUNTED_MOVES`]. [`plan`],
    /// [`compare`] and [`crate::max_batch`] reject it where none of their
    /// planners counts moves (rather than ignore it), and
    /// [`crate::run_suite`] where the suite retries cases with more time
    /// (a retry bounded by the same count would plan the same again).
    pub max_moves: Option<u64>,
    /// Measured latencies that override the roofline model for the ops they list.
    pub latency_table: Option<MeasuredTable>,
    /// Told after each planner of [`compare`] (planners done, planners asked
    /// for); returning `false` stops the comparison with
    /// [`ErrorKind::Interrupted`].
    #[serde(skip)]
    pub on_progress: Option<crate::ProgressHook>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            seed: 0,
            time_limit_s: 10.0,
            max_moves: None,
            latency_table: None,
            on_progress: None,
        }
    }
}

/// The outcome of `verify()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verification {
    pub passed: bool,
    pub violation_count: usize,
    /// The first violations (at most [`Verification::MAX_LISTED`]), located.
    pub violations: Vec<String>,
}

impl Verification {
    /// How many violations are listed.
    pub const MAX_LISTED: usize = 20;

    /// The error for a failed verification, `None` when it passed.
    pub fn error(&self) -> Option<Error> {
        let first = self.violations.first()?;
        Some(
            ErrorKind::VerificationFailed {
                count: self.violation_count,
                first: first.clone(),
            }
            .into(),
        )
    }
}

/// Proves (or refutes) a plan's safety on its graph.
pub fn verify_plan(plan: &Plan, graph: &Graph) -> Verification {
    let violations = verify(plan, graph);
    Verification {
        passed: violations.is_empty(),
        violation_count: violations.len(),
        violations: violations
            .iter()
            .take(Verification::MAX_LISTED)
            .map(|v| v.to_string())
            .collect(),
    }
}

/// A feasible plan: verified, and simulated without an allocation failure under
/// its allocator.
#[derive(Debug, Clone, Serialize)]
pub struct PlanResult {
    pub planner: String,
    pub plan: Plan,
    pub verification: Verification,
    pub report: SimReport,
    pub planner_time_s: f64,
    pub simulate_time_s: f64,
}

/// Whether a planner's plan can be run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runnability {
    /// Verified, and runs under its allocator.
    Feasible,
    /// The planner found no plan, or its plan does not fit under its allocator
    /// (an allocation fails in the simulator).
    Infeasible,
    /// The plan fails verification or cannot be simulated: a planner bug.
    NotRunnable,
}

/// One planner's outcome on one target, as [`compare`] reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PlannerOutcome {
    pub planner: String,
    pub status: Runnability,
    /// Why the plan is not feasible; `None` when it is.
    pub reason: Option<String>,
    pub verified: bool,
    /// The simulation of the plan (also when it ran out of memory).
    pub report: Option<SimReport>,
    pub planner_time_s: f64,
    pub simulate_time_s: f64,
    /// The plan, when the planner made one (left out of JSON to keep it small;
    /// [`plan`] returns a single planner's plan).
    #[serde(skip)]
    pub plan: Option<Plan>,
}

impl PlannerOutcome {
    pub fn is_feasible(&self) -> bool {
        self.status == Runnability::Feasible
    }
}

/// Every chosen planner on one target.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub model: String,
    pub batch: u64,
    pub device: String,
    pub budget_bytes: u64,
    pub footprint_bytes: u64,
    pub allocator: String,
    /// The sum of every op's time: the iteration time with unlimited memory.
    pub ideal_time_s: f64,
    /// The lower bound on any plan's iteration time under this budget
    /// (`outcore_bound`), or the op that rules every plan out.
    pub lower_bound: outcore_bound::Bound,
    /// The same for plans that recompute nothing (`outcore_bound::swap_only_bound`):
    /// what a swap-only planner's gap is better measured against.
    pub swap_only_bound: outcore_bound::Bound,
    pub results: Vec<PlannerOutcome>,
}

impl Comparison {
    /// A feasible outcome's iteration time over the lower bound, minus one
    /// (0.05: 5% slower than any plan could be); `None` for plans not held
    /// to the budget (`ideal`).
    pub fn gap_to_bound(&self, outcome: &PlannerOutcome) -> Option<f64> {
        let bound_s = self.lower_bound.time_s()?;
        let report = outcome.report.as_ref()?;
        // `ideal` plans with unlimited memory: the bound is not about it.
        let within_budget = outcome
            .plan
            .as_ref()
            .is_some_and(|p| p.budget_bytes <= self.budget_bytes);
        (outcome.is_feasible() && within_budget && bound_s > 0.0)
            .then(|| report.iter_time_s / bound_s - 1.0)
    }

    /// The outcomes whose plans fail verification or cannot be simulated.
    pub fn not_runnable(&self) -> impl Iterator<Item = &PlannerOutcome> {
        self.results
            .iter()
            .filter(|o| o.status == Runnability::NotRunnable)
    }
}

/// Plans `graph` with the named planner for `target` and checks the plan: it is
/// returned only if it verifies and runs under its allocator in the simulator;
/// otherwise the error says why ([`ErrorKind::Infeasible`] names the allocator
/// and the shortfall, and a budget under which some planner has a plan where
/// one was found ([`crate::budget_hint`], a few seconds more at most);
/// [`ErrorKind::VerificationFailed`] the first violation).
pub fn plan(
    graph: &LoadedGraph,
    planner: &str,
    target: &Target,
    options: &PlanOptions,
) -> Result<PlanResult> {
    plan_hinted(graph, planner, target, options, true)
}

/// [`plan`], with the budget hint in its infeasibility error only when
/// `hint` (a caller with a plan to fall back on needs none).
pub(crate) fn plan_hinted(
    graph: &LoadedGraph,
    planner: &str,
    target: &Target,
    options: &PlanOptions,
    hint: bool,
) -> Result<PlanResult> {
    check_time_limit_s(options.time_limit_s)?;
    // An unknown name first: its error lists the planners.
    let planner_impl = planner_for(planner, options)?;
    check_moves_counted(std::slice::from_ref(&planner), options)?;
    check_latency_table(options.latency_table.as_ref(), &graph.graph)?;
    let cost = cost_model(target.device.clone(), options.latency_table.as_ref());
    let outcome = plan_and_check(planner_impl.as_ref(), graph, cost.as_ref(), target, options);
    let infeasible = |reason: String| -> Error {
        ErrorKind::Infeasible {
            planner: planner.to_string(),
            model: graph.graph.meta.model.clone(),
            budget_bytes: target.budget_bytes,
            reason,
        }
        .into()
    };
    match outcome.status {
        Runnability::Feasible => {}
        Runnability::Infeasible => {
            let reason = outcome.reason.unwrap_or_default();
            let hint = if hint {
                budget_hint_text(planner, graph, cost.as_ref(), target, options)
            } else {
                String::new()
            };
            return Err(infeasible(format!("{reason}{hint}")));
        }
        Runnability::NotRunnable => {
            return Err(ErrorKind::NotRunnable {
                reason: outcome.reason.unwrap_or_default(),
            }
            .into());
        }
    }
    let (Some(plan), Some(report)) = (outcome.plan, outcome.report) else {
        return Err(infeasible("no plan was produced".into()));
    };
    let verification = verify_plan(&plan, &graph.graph);
    Ok(PlanResult {
        planner: outcome.planner,
        plan,
        verification,
        report,
        planner_time_s: outcome.planner_time_s,
        simulate_time_s: outcome.simulate_time_s,
    })
}

/// What [`crate::budget_hint`] found, in words for [`plan`]'s error: "" if
/// none of its planners plans under any budget up to the ladder's top.
fn budget_hint_text(
    planner: &str,
    graph: &LoadedGraph,
    cost: &dyn CostModel,
    target: &Target,
    options: &PlanOptions,
) -> String {
    // `outcore` runs the hint's planners as seeds: under this budget they
    // have no plan either.
    let from_budget = planner != outcore_planners::joint::NAME;
    let Some(hint) = crate::budget_hint::smallest_budget(graph, cost, target, options, from_budget)
    else {
        return String::new();
    };
    let what = hint.describe(target);
    if !hint.at_budget_of(target) {
        return format!(
            "; {what}: give that budget, or lower the batch (`outcore max-batch` finds the largest batch under this one)"
        );
    }
    let or_outcore = if hint.planner == outcore_planners::joint::NAME {
        ""
    } else {
        ", or with `outcore`, which starts from it"
    };
    format!("; {what}: plan with it{or_outcore}")
}

/// Plans with each named planner and judges every plan alike.
pub fn compare(
    graph: &LoadedGraph,
    planners: &[String],
    target: &Target,
    options: &PlanOptions,
) -> Result<Comparison> {
    check_time_limit_s(options.time_limit_s)?;
    let chosen = planners
        .iter()
        .map(|name| planner_for(name, options))
        .collect::<Result<Vec<_>>>()?;
    check_moves_counted(planners, options)?;
    check_latency_table(options.latency_table.as_ref(), &graph.graph)?;
    let cost = cost_model(target.device.clone(), options.latency_table.as_ref());
    let g = &graph.graph;
    let ideal_time_s = (0..g.ops.len())
        .map(|i| cost.op_time_s(g, OpId(i as u32)))
        .sum();
    let total = u32::try_from(chosen.len()).unwrap_or(u32::MAX);
    let mut results = Vec::with_capacity(chosen.len());
    for p in &chosen {
        results.push(plan_and_check(
            p.as_ref(),
            graph,
            cost.as_ref(),
            target,
            options,
        ));
        let done = u32::try_from(results.len()).unwrap_or(u32::MAX);
        crate::planning::tell_progress(options, "planners", done, total)?;
    }
    Ok(Comparison {
        model: g.meta.model.clone(),
        batch: g.meta.batch,
        device: target.device.name.clone(),
        budget_bytes: target.budget_bytes,
        footprint_bytes: target.footprint_bytes,
        allocator: target.allocator.name().to_string(),
        ideal_time_s,
        lower_bound: outcore_bound::lower_bound(g, cost.as_ref(), target.budget_bytes),
        swap_only_bound: outcore_bound::swap_only_bound(g, cost.as_ref(), target.budget_bytes),
        results,
    })
}

/// Runs one planner, attaches the device and allocator, verifies and simulates.
pub(crate) fn plan_and_check(
    planner: &dyn outcore_plan::Planner,
    graph: &LoadedGraph,
    cost: &dyn CostModel,
    target: &Target,
    options: &PlanOptions,
) -> PlannerOutcome {
    let g = &graph.graph;
    let request = PlanRequest {
        graph: g,
        cost,
        budget_bytes: target.budget_bytes,
        seed: options.seed,
        time_limit_s: options.time_limit_s,
        allocator: &target.allocator,
        order: None,
        fingerprint: None,
    };
    let t0 = Instant::now();
    // An `offsets` request: plan in bytes, then lay the plan out.
    let outcome = if outcore_planners::layout::wants_layout(&target.allocator) {
        outcore_planners::layout::plan_laid_out(planner, &request)
    } else {
        planner.plan(&request)
    };
    let mut out = PlannerOutcome {
        planner: planner.name().to_string(),
        status: Runnability::Infeasible,
        reason: None,
        verified: false,
        report: None,
        planner_time_s: t0.elapsed().as_secs_f64(),
        simulate_time_s: 0.0,
        plan: None,
    };
    let mut plan = match outcome {
        Ok(PlanOutcome::Infeasible(why)) => {
            out.reason = Some(why.message);
            return out;
        }
        // A planner bug or a bad request: reported, never a plan.
        Err(e) => {
            out.status = Runnability::NotRunnable;
            out.reason = Some(e.to_string());
            return out;
        }
        Ok(PlanOutcome::Feasible(plan)) => *plan,
    };
    plan.device = Some(target.device.clone());
    crate::input::record_graph_source(&mut plan, graph);
    // A planner that does not plan for allocators leaves the perfect one: the
    // plan is then judged under the allocator it was asked for.
    if plan.allocator == AllocatorSpec::Perfect {
        plan.allocator = target.allocator.clone();
    }
    // Only a pool with neither classes nor a CLS / CNT encoding is sized here:
    // a planner's own pool (SwapAdvisor's) is the plan's and is kept.
    if let AllocatorSpec::SizeClass(config) = &plan.allocator
        && config.is_unsized()
    {
        plan.allocator = size_class_pool_for(g, &plan, cost);
    }
    judge(&mut out, plan, g, cost);
    out
}

/// Verifies and simulates `plan` into `out`: feasible only if it verifies
/// and runs under its allocator.
fn judge(out: &mut PlannerOutcome, plan: Plan, g: &Graph, cost: &dyn CostModel) {
    let verification = verify_plan(&plan, g);
    out.verified = verification.passed;
    let t1 = Instant::now();
    let simulated = simulate(g, &plan, cost, &SimOptions::default());
    out.simulate_time_s = t1.elapsed().as_secs_f64();
    (out.status, out.reason) = match (&verification.error(), &simulated) {
        (Some(err), _) => (Runnability::NotRunnable, Some(err.to_string())),
        (None, Err(e)) => (
            Runnability::NotRunnable,
            Some(format!("simulation failed: {e}")),
        ),
        (None, Ok(sim)) => match &sim.report.oom {
            Some(oom) => (
                Runnability::Infeasible,
                Some(allocator_shortfall(&plan.allocator, oom)),
            ),
            None => (Runnability::Feasible, None),
        },
    };
    out.report = simulated.ok().map(|s| s.report);
    out.plan = Some(plan);
}

/// Names the allocator and the shortfall of an allocation the simulator's
/// allocator model could not satisfy, and the fix.
pub fn allocator_shortfall(allocator: &AllocatorSpec, oom: &SimOom) -> String {
    // Short of one contiguous block; otherwise the allocator could not reserve
    // a new segment, which its own message explains.
    let short = oom
        .requested_bytes
        .checked_sub(oom.largest_free_block_bytes)
        .filter(|&b| b > 0)
        .map(|b| format!(", short by {}", fmt_bytes(b)))
        .unwrap_or_default();
    format!(
        "the plan does not run under the {} allocator: requested {} with {} free, largest free block {}{short} ({}); give a larger budget, or plan with --allocator perfect",
        allocator.name(),
        fmt_bytes(oom.requested_bytes),
        fmt_bytes(oom.free_bytes),
        fmt_bytes(oom.largest_free_block_bytes),
        oom.message,
    )
}

/// Makes `plan` run under `allocator`; a `size-class` pool is sized for the
/// plan's own allocations (on its device, or unit costs without one), as
/// `plan()` sizes it, since the default pool fits no particular plan.
///
/// An `offsets` allocator with no layout lays the plan out; that fails when
/// the plan does not verify or its layout spans more than its budget.
pub fn set_allocator(plan: &mut Plan, graph: &Graph, allocator: AllocatorSpec) -> Result<()> {
    if outcore_planners::layout::wants_layout(&allocator) {
        let layout = outcore_plan::lay_out(plan, graph).map_err(|e| {
            Error::invalid(
                "plan (--allocator offsets)",
                "the plan",
                e.to_string(),
                "a plan that `outcore verify` accepts",
            )
        })?;
        if layout.config.height_bytes > plan.budget_bytes {
            return Err(Error::invalid(
                "allocator (--allocator)",
                "offsets",
                format!(
                    "the plan's layout needs {}, more than its budget of {}",
                    fmt_bytes(layout.config.height_bytes),
                    fmt_bytes(plan.budget_bytes)
                ),
                "plan with `outcore plan --allocator offsets`, which plans at a lower budget until the layout fits, or run with another allocator",
            ));
        }
        plan.allocator = AllocatorSpec::Offsets(layout.config);
        return Ok(());
    }
    plan.allocator = allocator;
    if matches!(plan.allocator, AllocatorSpec::SizeClass(_)) {
        let sized = match &plan.device {
            Some(device) => size_class_pool_for(graph, plan, &RooflineModel::new(device.clone())),
            None => size_class_pool_for(graph, plan, &outcore_cost::UnitCostModel),
        };
        plan.allocator = sized;
    }
    Ok(())
}

/// A size-class pool sized for `plan`: replayed first with the perfect
/// allocator to record what it allocates.
fn size_class_pool_for(graph: &Graph, plan: &Plan, cost: &dyn CostModel) -> AllocatorSpec {
    let mut probe = plan.clone();
    probe.allocator = AllocatorSpec::Perfect;
    let options = SimOptions {
        iterations: 1,
        record_alloc_trace: true,
        ..SimOptions::default()
    };
    match simulate(graph, &probe, cost, &options).map(|o| o.alloc_trace) {
        Ok(Some(trace)) => size_classes_for_trace(&trace),
        // The simulation of the real allocator reports the failure.
        _ => plan.allocator.clone(),
    }
}

/// A size-class pool for a trace: one class per distinct size, with as many objects
/// as the trace ever holds live at once (the smallest pool of exact-size classes
/// that serves it; SwapAdvisor searches coarser merges of these classes).
pub fn size_classes_for_trace(trace: &outcore_alloc::Trace) -> AllocatorSpec {
    AllocatorSpec::SizeClass(outcore_alloc::SizeClassConfig::for_trace(trace))
}

/// How to simulate a plan file.
#[derive(Debug, Clone, Serialize)]
pub struct SimulateOptions {
    /// Iterations back to back (at least 1); the report is the last one's.
    pub iterations: usize,
    pub record_trace: bool,
    pub record_alloc_trace: bool,
    /// Measured latencies over the plan's device's roofline model.
    pub latency_table: Option<MeasuredTable>,
}

impl SimulateOptions {
    /// The most iterations simulated back to back: the report is the last
    /// one's, and allocator state settles within a few, so more only takes time.
    pub const MAX_ITERATIONS: usize = 1000;
}

impl Default for SimulateOptions {
    fn default() -> Self {
        SimulateOptions {
            iterations: 2,
            record_trace: false,
            record_alloc_trace: false,
            latency_table: None,
        }
    }
}

/// A simulated plan. `runnable` is false when an allocation failed under the
/// plan's allocator; `reason` then names the allocator and the shortfall.
#[derive(Debug, Clone, Serialize)]
pub struct SimulateResult {
    pub planner: String,
    pub verification: Verification,
    pub report: SimReport,
    pub runnable: bool,
    pub reason: Option<String>,
    pub simulate_time_s: f64,
    /// Chrome trace of the last iteration, when asked for.
    pub trace: Option<serde_json::Value>,
    /// Every allocation and free, when asked for (write it with
    /// `outcore_alloc::write_trace`).
    #[serde(skip)]
    pub alloc_trace: Option<outcore_alloc::Trace>,
}

/// Rebuilds the graph a plan names (checking its fingerprint), checks the
/// plan's device, verifies the plan (an error if it fails) and simulates it on
/// its own device under its own allocator.
pub fn simulate_plan(plan: &Plan, options: &SimulateOptions) -> Result<SimulateResult> {
    if !(1..=SimulateOptions::MAX_ITERATIONS).contains(&options.iterations) {
        return Err(Error::invalid(
            "iterations (--iterations)",
            options.iterations.to_string(),
            "out of range",
            format!(
                "a whole number of iterations in [1, {}]; the report is the last one's, and allocator caches settle within a few",
                SimulateOptions::MAX_ITERATIONS
            ),
        ));
    }
    plan.check_device("the plan")?;
    let device = plan.device.clone().ok_or(ErrorKind::PlanNamesNoDevice)?;
    let graph = graph_of_plan(plan)?;
    let verification = verify_plan(plan, &graph);
    if let Some(err) = verification.error() {
        return Err(err);
    }
    check_latency_table(options.latency_table.as_ref(), &graph)?;
    let cost = cost_model(device, options.latency_table.as_ref());
    let sim_options = SimOptions {
        iterations: options.iterations,
        record_trace: options.record_trace,
        record_alloc_trace: options.record_alloc_trace,
        ..SimOptions::default()
    };
    let t0 = Instant::now();
    let out = simulate(&graph, plan, cost.as_ref(), &sim_options)?;
    let simulate_time_s = t0.elapsed().as_secs_f64();
    let reason = out
        .report
        .oom
        .as_ref()
        .map(|oom| allocator_shortfall(&plan.allocator, oom));
    Ok(SimulateResult {
        planner: plan.planner.name.clone(),
        verification,
        runnable: reason.is_none(),
        reason,
        report: out.report,
        simulate_time_s,
        trace: out.trace,
        alloc_trace: out.alloc_trace,
    })
}

/// A plan pinned to its predicted iteration, for an executor that issues
/// steps from one host thread in the order they start and frees memory at
/// once (PyTorch's caching allocator through `outcore.torch`).
#[derive(Debug, Clone)]
pub struct PinnedPlan {
    /// The plan with [`pin_frees`]' waits added (verified again).
    pub plan: Plan,
    /// The last simulated iteration's steps in the order they started, with
    /// their start and end times: the order to issue them in.
    pub timeline: Vec<TimedStep>,
    /// How many waits pinning added.
    pub waits_added: usize,
}

/// The graph `plan` names, rebuilt and checked against its fingerprint, once
/// the plan is checked for its device and verified on it; and the cost model
/// of the plan's device (with `latency_table` over it when given): what every
/// re-simulation of a plan file starts from.
pub(crate) fn verified_graph_and_cost(
    plan: &Plan,
    latency_table: Option<&MeasuredTable>,
) -> Result<(Graph, Box<dyn CostModel>)> {
    plan.check_device("the plan")?;
    let device = plan.device.clone().ok_or(ErrorKind::PlanNamesNoDevice)?;
    let graph = graph_of_plan(plan)?;
    if let Some(err) = verify_plan(plan, &graph).error() {
        return Err(err);
    }
    check_latency_table(latency_table, &graph)?;
    Ok((graph, cost_model(device, latency_table)))
}

/// Pins `plan`'s frees to its predicted timeline (see [`pin_frees`]).
///
/// Why an executor needs it: a caching allocator hands a freed block to the
/// next allocation issued after the free, whatever stream the free's last
/// reader ran on. An executor that issues every step in the timeline's order
/// and releases a copy stream's frees where they stand gives the allocator
/// the simulated sequence of allocations and frees (what the plan's
/// allocator model was checked on), and the pinned waits order every later
/// allocating step after those frees on the device, so no kernel or copy
/// writes a block a copy still reads. The prediction is unchanged: each wait
/// is satisfied where the timeline starts its step. The timeline is the last
/// of two simulated iterations (allocator caches warm), under the plan's
/// device and `latency_table` when given.
pub fn pin_to_timeline(plan: &Plan, latency_table: Option<&MeasuredTable>) -> Result<PinnedPlan> {
    let (graph, cost) = verified_graph_and_cost(plan, latency_table)?;
    let options = SimOptions {
        iterations: 2,
        record_timeline: true,
        ..SimOptions::default()
    };
    let timeline = simulate(&graph, plan, cost.as_ref(), &options)?
        .timeline
        .unwrap_or_default();
    let mut pinned = plan.clone();
    let waits_added = pin_frees(&mut pinned, &timeline).map_err(|e| {
        Error::new(ErrorKind::NotRunnable {
            reason: e.to_string(),
        })
    })?;
    if let Some(err) = verify_plan(&pinned, &graph).error() {
        return Err(err);
    }
    Ok(PinnedPlan {
        plan: pinned,
        timeline,
        waits_added,
    })
}

/// An allocation trace replayed through an allocator.
#[derive(Debug, Clone, Serialize)]
pub struct AllocReplayResult {
    #[serde(flatten)]
    pub report: outcore_alloc::ReplayReport,
    pub replay_time_s: f64,
}

/// Replays `trace` through the named allocator (`size-class` sized for the
/// trace itself); `capacity_bytes` overrides the trace's capacity.
pub fn alloc_replay(
    mut trace: outcore_alloc::Trace,
    allocator: &str,
    capacity_bytes: Option<u64>,
) -> Result<AllocReplayResult> {
    if capacity_bytes.is_some() {
        trace.capacity_bytes = capacity_bytes;
    }
    const REPLAYABLE: &str = "best-fit, best-fit-paged, size-class or virtual-chunks";
    if allocator == "offsets" {
        return Err(Error::invalid(
            "allocator (--allocator)",
            allocator,
            "does not apply to alloc-replay: an offsets layout is made for one plan's allocations, not for a trace",
            REPLAYABLE,
        ));
    }
    // The one vocabulary: `best-fit-paged` is a best-fit configuration.
    let config = match crate::input::parse_allocator(allocator)?.config() {
        Some(outcore_alloc::AllocatorConfig::SizeClass(c)) => size_classes_for_trace(&trace)
            .config()
            .unwrap_or(outcore_alloc::AllocatorConfig::SizeClass(c)),
        Some(other) => other,
        // `perfect`: no configuration.
        None => {
            return Err(Error::invalid(
                "allocator (--allocator)",
                allocator,
                "does not apply to alloc-replay: the perfect allocator places no addresses, so there is nothing to replay",
                REPLAYABLE,
            ));
        }
    };
    let t0 = Instant::now();
    let report = outcore_alloc::replay_with_config(&trace, &config)?;
    Ok(AllocReplayResult {
        report,
        replay_time_s: t0.elapsed().as_secs_f64(),
    })
}

/// Tells `options.on_progress` that `done` of `total` `what` are done; an
/// `Interrupted` error when the hook asks to stop before the last.
pub(crate) fn tell_progress(
    options: &PlanOptions,
    what: &'static str,
    done: u32,
    total: u32,
) -> Result<()> {
    match &options.on_progress {
        Some(hook) if !(hook.0)(done, total) && done < total => {
            Err(ErrorKind::Interrupted { what, done, total }.into())
        }
        _ => Ok(()),
    }
}
