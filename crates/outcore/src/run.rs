//! Running a plan on the CPU reference executor: a prediction by the simulator
//! on the same device description, the measured run, and optionally an
//! unconstrained reference run to compare final parameters bit for bit.

use crate::error::{Error, ErrorKind, Result};
use crate::input::LoadedGraph;
use crate::planning::{Target, allocator_shortfall, verify_plan};
use outcore_cost::{CostModel, DeviceProfile, MeasuredTable, RooflineModel};
use outcore_graph::{Graph, OpId, footprint};
use outcore_plan::{AllocatorSpec, Plan, StepRef};
use outcore_sim::{SimOptions, simulate};
use serde::Serialize;

/// How to run a plan on the CPU reference backend.
#[derive(Debug, Clone, Serialize)]
pub struct RunOptions {
    /// Training iterations, at least 1.
    pub iters: u32,
    /// Checksum tensors at swap-out / swap-in and compare recomputed tensors.
    pub check: bool,
    /// Also run without swapping or recomputation and compare final parameters.
    pub reference: bool,
    pub seed: u64,
    /// Throttle host<->device copies to this rate (bytes/s); `None`: memcpy speed.
    pub link_bytes_per_s: Option<f64>,
    /// Run every op on a synthetic kernel that takes the cost model's time.
    pub synthetic_kernels: bool,
    /// Speed of stand-in kernels (ops without a CPU kernel), FLOP/s.
    pub synthetic_flops_per_s: f64,
    /// Record a Chrome trace of what ran.
    pub trace: bool,
    /// Lay a plan made for the `perfect` allocator out at exact offsets
    /// before it runs, when that layout fits its budget ([`run`]'s doc).
    /// `false` runs such a plan on the executor's best-fit list.
    pub lay_out_perfect: bool,
    /// Told after each iteration (progress); returning `false` stops the run
    /// (a Ctrl-C) with [`ErrorKind`] `Exec(Interrupted)`.
    #[serde(skip)]
    pub on_iteration: Option<crate::ProgressHook>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            iters: 10,
            check: false,
            reference: false,
            seed: 0,
            link_bytes_per_s: None,
            synthetic_kernels: false,
            synthetic_flops_per_s: 1e10,
            trace: false,
            lay_out_perfect: true,
            on_iteration: None,
        }
    }
}

impl RunOptions {
    /// The most iterations of one run: measured times settle within a few, and
    /// a run is also refused when its prediction exceeds [`Self::MAX_PREDICTED_RUN_S`].
    pub const MAX_ITERS: u32 = 100_000;

    /// The longest run accepted, by the simulator's prediction (one hour): a
    /// tiny `--link-gbps` or `--synthetic-flops`, or a huge `--iters`, is refused
    /// with the prediction instead of running silently for days.
    pub const MAX_PREDICTED_RUN_S: f64 = 3600.0;

    /// Checks every number against its accepted range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=Self::MAX_ITERS).contains(&self.iters) {
            return Err(Error::invalid(
                "iterations (--iters)",
                self.iters.to_string(),
                "out of range",
                format!("a whole number of iterations in [1, {}]", Self::MAX_ITERS),
            ));
        }
        if let Some(rate) = self.link_bytes_per_s
            && !(rate.is_finite() && rate > 0.0 && rate <= outcore_cost::MAX_RATE_PER_S)
        {
            return Err(Error::invalid(
                "link rate (bytes/s)",
                rate.to_string(),
                "out of range",
                "a rate in (0, 1e18] bytes/s, e.g. 12e9 (`--link-gbps 12`)",
            ));
        }
        let flops = self.synthetic_flops_per_s;
        if !(flops.is_finite() && flops > 0.0 && flops <= outcore_cost::MAX_RATE_PER_S) {
            return Err(Error::invalid(
                "synthetic kernel speed (FLOP/s)",
                flops.to_string(),
                "out of range",
                "a rate in (0, 1e18] FLOP/s, e.g. 1e10",
            ));
        }
        Ok(())
    }

    /// The CPU backend described as a device, with an arena of `budget_bytes`.
    pub fn cpu_device(&self, budget_bytes: u64) -> DeviceProfile {
        outcore_exec::cpu::device_profile(
            budget_bytes,
            self.link_bytes_per_s.map(|rate| rate / 1e9),
            self.synthetic_flops_per_s,
        )
    }
}

/// Lays a plan made for the `perfect` allocator (bytes only) out at exact
/// offsets, as `--allocator offsets` does, when the layout fits the plan's
/// budget; otherwise (or for any other allocator) leaves it as it is.
///
/// Why: the executor places a `perfect` plan's allocations with a best-fit
/// free list, which can fragment where the plan's bytes fit. `outcore run
/// --model gpt2 --knob layers=2 --knob seq=64 --batch 2 --optimizer adamw
/// --budget 60% --planner outcore` stopped with "out of device memory
/// allocating 154389504 bytes ... (318625280 bytes free, largest free
/// block 114250752 bytes)"; the same plan laid out ran within 657 MiB of
/// its 667 MiB arena. A layout holds for every timing of the plan
/// (`outcore_plan::lay_out`), so the run cannot fragment it. Where the
/// layout spans more than the budget the best-fit list runs the plan, as
/// before, and may still fit it.
fn lay_out_perfect(plan: &mut Plan, graph: &Graph) {
    if let Some(laid) = laid_out(plan, graph) {
        *plan = laid;
    }
}

/// `plan` laid out at exact offsets, where it is a `perfect` plan whose
/// layout fits its budget.
fn laid_out(plan: &Plan, graph: &Graph) -> Option<Plan> {
    if !matches!(plan.allocator, AllocatorSpec::Perfect) {
        return None;
    }
    let mut laid = plan.clone();
    let offsets = AllocatorSpec::Offsets(Default::default());
    crate::planning::set_allocator(&mut laid, graph, offsets)
        .is_ok()
        .then_some(laid)
}

/// Plans `graph` for [`run`] on the CPU backend with an arena of
/// `budget_bytes`: under `allocator` where one is named. Where none is, for
/// the `perfect` allocator, the plan returned laid out at exact offsets
/// (allocator `offsets`; its `report` and `verification` are the perfect
/// plan's, whose schedule it keeps) where that layout fits the budget; and
/// where that layout spans more than the budget, again for `offsets` (the
/// planner then plans at a lower budget until its layout fits), since the
/// best-fit list that would run the perfect plan can fragment where its
/// bytes fit. Measured: `outcore run --model tiny-cnn --budget 100%
/// --planner outcore` stopped with "out of device memory allocating
/// 524288 bytes ... (643584 bytes free, largest free block 352256 bytes)",
/// as did `checkpoint-sqrt` and `dtr` there (and `ideal`, which plans for
/// no layout); planned for `offsets` those three run. Where the planner finds no plan for `offsets`, the
/// perfect plan is returned and runs on the best-fit list, which may still
/// fit it. The second plan costs a second planning, only where the first
/// cannot be laid out: `outcore run --model tiny-transformer --budget 80%
/// --planner outcore --iters 2` took 21.7 s in all (2026-12-04, 2-core VM),
/// where it stopped out of memory after 5.4 s before.
pub fn plan_for_run(
    graph: &LoadedGraph,
    planner: &str,
    budget_bytes: u64,
    allocator: Option<AllocatorSpec>,
    plan_options: &crate::PlanOptions,
    options: &RunOptions,
) -> Result<crate::PlanResult> {
    let named = allocator.is_some();
    let target = cpu_target(graph, budget_bytes, allocator.unwrap_or_default(), options)?;
    let mut made = crate::plan(graph, planner, &target, plan_options)?;
    check_arena(&made.plan, budget_bytes)?;
    if named {
        return Ok(made);
    }
    if let Some(laid) = laid_out(&made.plan, &graph.graph) {
        // Returned laid out, so that [`run`] does not lay it out again.
        made.plan = laid;
        return Ok(made);
    }
    let offsets = AllocatorSpec::Offsets(Default::default());
    let target = cpu_target(graph, budget_bytes, offsets, options)?;
    Ok(crate::planning::plan_hinted(graph, planner, &target, plan_options, false).unwrap_or(made))
}

/// A plan that sets its own budget above the arena asked for (`ideal`
/// plans for unlimited memory, whatever the budget) is refused: [`run`]
/// sizes the arena by the plan's budget, so the one asked for would be
/// ignored without a word.
fn check_arena(plan: &Plan, budget_bytes: u64) -> Result<()> {
    if plan.budget_bytes <= budget_bytes {
        return Ok(());
    }
    Err(Error::invalid(
        "budget (--budget)",
        outcore_plan::fmt_bytes(budget_bytes),
        format!(
            "`{}` ignores the budget and plans for {}",
            plan.planner.name,
            outcore_plan::fmt_bytes(plan.budget_bytes)
        ),
        format!(
            "a budget of at least {} for this planner, or a planner that plans for the budget (e.g. `outcore`)",
            outcore_plan::fmt_bytes(plan.budget_bytes)
        ),
    ))
}

/// A target on the CPU reference backend: its device has exactly the budget.
pub fn cpu_target(
    graph: &LoadedGraph,
    budget_bytes: u64,
    allocator: AllocatorSpec,
    options: &RunOptions,
) -> Result<Target> {
    options.validate()?;
    Target::new(
        graph,
        options.cpu_device(budget_bytes),
        budget_bytes,
        allocator,
    )
}

/// What a run did, measured and predicted.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub planner: String,
    pub iters: u32,
    pub measured_iter_time_s: f64,
    /// The simulator's iteration time for the same plan on the CPU device.
    pub predicted_iter_time_s: f64,
    /// The device profile the prediction is for (the CPU backend's).
    pub predicted_device: String,
    /// The plan's simulated peak device memory (live or reserved).
    pub predicted_peak_bytes: u64,
    /// The highest address the executor used in the device arena (includes the
    /// arena's own fragmentation, so it can exceed the plan's peak).
    pub arena_high_water_bytes: u64,
    pub budget_bytes: u64,
    pub allocator: String,
    pub swap_in_bytes: u64,
    pub swap_out_bytes: u64,
    pub recomputes: u64,
    pub synthetic_kernels: bool,
    pub iter_times_s: Vec<f64>,
    /// `Some(true)` when checks ran and passed (a failure stops the run).
    pub checks_passed: Option<bool>,
    /// Whether final parameters equal an unconstrained run's, when asked.
    pub matches_reference: Option<bool>,
    /// Loss per iteration; `None` where the graph has no finite scalar loss.
    pub losses: Vec<Option<f32>>,
    /// Measured latencies, loadable as a latency table by `plan`, `compare`
    /// and `simulate`.
    pub latency_table: MeasuredTable,
    /// Chrome trace of what ran, when asked for.
    pub trace: Option<serde_json::Value>,
}

/// Runs `plan` on the CPU reference backend. The plan must verify and run under
/// its allocator in the simulator (else [`ErrorKind::VerificationFailed`] or
/// [`ErrorKind::NotRunnable`]); its device is replaced by the CPU's. A plan
/// for the `perfect` allocator is first laid out at exact offsets where that
/// fits its budget (unless [`RunOptions::lay_out_perfect`] is off; see
/// `lay_out_perfect`'s comment for why), and [`RunResult::allocator`] then
/// says `offsets`.
pub fn run(graph: &Graph, mut plan: Plan, options: &RunOptions) -> Result<RunResult> {
    options.validate()?;
    prepare(graph, &mut plan, options)?;
    let device = options.cpu_device(plan.budget_bytes);
    plan.device = Some(device.clone());
    let cost = RooflineModel::new(device);
    let (predicted, issue_order) = predict(graph, &plan, &cost, options)?;
    let exec_options = exec_options(graph, &cost, issue_order, options);
    let backend = outcore_exec::CpuBackend::new(outcore_exec::CpuBackendOptions {
        link_bytes_per_s: options.link_bytes_per_s,
        ..outcore_exec::CpuBackendOptions::default()
    });
    let report = outcore_exec::execute(graph, &plan, &backend, &exec_options)
        .map_err(|e| out_of_arena(e, &plan, graph))?;
    let matches_reference = if options.reference {
        Some(matches_reference(graph, &exec_options, &report)?)
    } else {
        None
    };
    Ok(RunResult::of(
        &plan,
        &predicted,
        report,
        matches_reference,
        options,
    ))
}

/// The executor's error, where a `perfect` plan (one not laid out: its
/// layout spans more than the arena) ran out of the best-fit list's
/// fragmented arena, with what the plan's exact layout needs: the budget
/// at which it runs laid out. The executor's own message names the fixes
/// but no number.
fn out_of_arena(e: outcore_exec::ExecError, plan: &Plan, graph: &Graph) -> Error {
    let out_of_memory = matches!(
        e.kind,
        outcore_exec::ExecErrorKind::OutOfDeviceMemory { .. }
    );
    if !out_of_memory || !matches!(plan.allocator, AllocatorSpec::Perfect) {
        return e.into();
    }
    match outcore_plan::lay_out(plan, graph) {
        Ok(layout) if layout.config.height_bytes > plan.budget_bytes => ErrorKind::NotRunnable {
            reason: format!(
                "{e}; laid out at exact offsets this plan needs {} bytes ({}) of device memory, more than its arena of {} bytes: with a budget of at least {} bytes (`--budget {}`) it runs laid out",
                layout.config.height_bytes,
                outcore_plan::fmt_bytes(layout.config.height_bytes),
                plan.budget_bytes,
                layout.config.height_bytes,
                layout.config.height_bytes,
            ),
        }
        .into(),
        _ => e.into(),
    }
}

/// The checks a plan passes before anything runs: made for the CPU backend,
/// within the host's memory, for this graph, laid out (where asked) and
/// verified.
fn prepare(graph: &Graph, plan: &mut Plan, options: &RunOptions) -> Result<()> {
    // A plan made for another device assumed its speeds and, above all, its
    // memory layout: run on the CPU arena, it can run out of memory or be judged
    // on the wrong times. The CPU backend's plans embed its own profile.
    let cpu_name = options.cpu_device(plan.budget_bytes.max(1)).name;
    if let Some(device) = &plan.device
        && device.name != cpu_name
    {
        return Err(ErrorKind::PlanForOtherDevice {
            device: device.name.clone(),
            backend_device: cpu_name,
        }
        .into());
    }
    check_host_memory(graph, plan.budget_bytes, options)?;
    crate::planning::check_chunk_fits(&plan.allocator, plan.budget_bytes)?;
    plan.check_graph(graph)?;
    if options.lay_out_perfect {
        lay_out_perfect(plan, graph);
    }
    match verify_plan(plan, graph).error() {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// The simulator's report for the plan on the CPU device, and the order it
/// issued allocations in; an error where the plan does not fit its allocator
/// or the run would be too long.
fn predict(
    graph: &Graph,
    plan: &Plan,
    cost: &RooflineModel,
    options: &RunOptions,
) -> Result<(outcore_sim::SimReport, Option<Vec<StepRef>>)> {
    let sim_options = SimOptions {
        record_start_order: true,
        ..SimOptions::default()
    };
    let predicted_run = simulate(graph, plan, cost, &sim_options)?;
    let predicted = predicted_run.report;
    if let Some(oom) = &predicted.oom {
        return Err(ErrorKind::NotRunnable {
            reason: allocator_shortfall(&plan.allocator, oom),
        }
        .into());
    }
    // The reference run takes about as long again.
    let runs = if options.reference { 2.0 } else { 1.0 };
    let predicted_run_s = predicted.iter_time_s * f64::from(options.iters) * runs;
    if !predicted_run_s.is_finite() || predicted_run_s > RunOptions::MAX_PREDICTED_RUN_S {
        return Err(Error::invalid(
            "run length (--iters, --link-gbps, --synthetic-flops)",
            format!(
                "{} iterations of {:.3e} s predicted = {predicted_run_s:.3e} s",
                options.iters, predicted.iter_time_s
            ),
            "out of range",
            format!(
                "a run predicted to take at most {} s; lower --iters, or raise --link-gbps or --synthetic-flops",
                RunOptions::MAX_PREDICTED_RUN_S
            ),
        ));
    }
    Ok((predicted, predicted_run.start_order))
}

/// The executor's options for `options`, with the simulator's issue order.
fn exec_options(
    graph: &Graph,
    cost: &RooflineModel,
    issue_order: Option<Vec<StepRef>>,
    options: &RunOptions,
) -> outcore_exec::ExecOptions {
    outcore_exec::ExecOptions {
        iters: options.iters,
        check: options.check,
        seed: options.seed,
        synthetic_flops_per_s: options.synthetic_flops_per_s,
        trace: options.trace,
        synthetic_kernels: options.synthetic_kernels,
        // Synthetic kernels take exactly the simulator's op times, so the measured
        // gap is the executor's own overhead (issue, copies, allocation, threads).
        op_time_s: options.synthetic_kernels.then(|| {
            (0..graph.ops.len())
                .map(|i| cost.op_time_s(graph, OpId(i as u32)))
                .collect()
        }),
        // The executor hands its allocator the allocations and frees in the
        // order the simulator checked the plan with: a size-class pool sized
        // from the simulated trace fits that sequence, not any other.
        issue_order,
        on_iteration: options.on_iteration.clone(),
        ..outcore_exec::ExecOptions::default()
    }
}

impl RunResult {
    /// The result of running `plan` (its device already the CPU's), from the
    /// simulator's prediction and the executor's report.
    fn of(
        plan: &Plan,
        predicted: &outcore_sim::SimReport,
        report: outcore_exec::RunReport,
        matches_reference: Option<bool>,
        options: &RunOptions,
    ) -> RunResult {
        RunResult {
            planner: plan.planner.name.clone(),
            iters: report.iters,
            measured_iter_time_s: report.measured_iter_time_s,
            predicted_iter_time_s: predicted.iter_time_s,
            predicted_device: plan
                .device
                .as_ref()
                .map(|d| d.name.clone())
                .unwrap_or_default(),
            predicted_peak_bytes: predicted.peak_live_bytes.max(predicted.peak_reserved_bytes),
            arena_high_water_bytes: report.peak_device_bytes,
            budget_bytes: plan.budget_bytes,
            allocator: plan.allocator.name().to_string(),
            swap_in_bytes: report.swap_in_bytes,
            swap_out_bytes: report.swap_out_bytes,
            recomputes: report.recomputes,
            synthetic_kernels: options.synthetic_kernels,
            checks_passed: report.checks_passed,
            matches_reference,
            losses: report
                .losses
                .iter()
                .map(|l| l.is_finite().then_some(*l))
                .collect(),
            trace: (!report.trace.is_null()).then_some(report.trace),
            iter_times_s: report.iter_times_s,
            latency_table: report.latency_table,
        }
    }
}

/// Runs the graph in order with room to spare, no swapping or recomputation,
/// and compares final persistent tensors with `report`'s.
pub(crate) fn matches_reference(
    graph: &Graph,
    options: &outcore_exec::ExecOptions,
    report: &outcore_exec::RunReport,
) -> Result<bool> {
    let (footprint_bytes, _) = footprint(graph);
    let info = outcore_plan::PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    // Twice the footprint: room for the arena's fragmentation.
    let reference_plan =
        outcore_plan::lower_in_order(graph, info, footprint_bytes.saturating_mul(2));
    let backend = outcore_exec::CpuBackend::new(outcore_exec::CpuBackendOptions::default());
    let reference_options = outcore_exec::ExecOptions {
        check: false,
        trace: false,
        // The issue order is the measured plan's, not the reference plan's.
        issue_order: None,
        ..options.clone()
    };
    let reference = outcore_exec::execute(graph, &reference_plan, &backend, &reference_options)?;
    Ok(reference.final_state() == report.final_state())
}

/// Host memory the run would take: the arena of the budget, host copies of
/// what is swapped out (at most the footprint), and a reference run's arena of
/// twice the footprint. Checked against the memory Linux reports available, so
/// that too large a budget is an error instead of an abort.
fn check_host_memory(graph: &Graph, budget_bytes: u64, options: &RunOptions) -> Result<()> {
    let (footprint_bytes, _) = footprint(graph);
    let reference_bytes = if options.reference {
        footprint_bytes.saturating_mul(2)
    } else {
        0
    };
    let needed_bytes = budget_bytes
        .saturating_add(footprint_bytes)
        .saturating_add(reference_bytes);
    let Some(available_bytes) = available_host_memory_bytes() else {
        // Elsewhere the backend's fallible allocation reports the failure.
        return Ok(());
    };
    if needed_bytes > available_bytes {
        return Err(ErrorKind::HostMemory {
            budget_bytes,
            needed_bytes,
            available_bytes,
        }
        .into());
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo, where there is one.
fn available_host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
