//! Running a plan on the CPU reference executor: a prediction by the simulator
//! on the same device description, the measured run, and optionally an
//! unconstrained reference run to compare final parameters bit for bit.

use crate::error::{Error, ErrorKind, Result};
use crate::input::LoadedGraph;
use crate::planning::{Target, allocator_shortfall, verify_plan};
use outcore_cost::{CostModel, DeviceProfile, MeasuredTable, RooflineModel};
use outcore_graph::{Graph, OpId, footprint};
use outcore_plan::{AllocatorSpec, Plan};
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
        }
    }
}

impl RunOptions {
    /// Checks every number against its accepted range.
    pub fn validate(&self) -> Result<()> {
        if self.iters == 0 {
            return Err(Error::invalid(
                "iterations",
                "0",
                "out of range",
                "a whole number of iterations, at least 1",
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
    pub peak_device_bytes: u64,
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
/// [`ErrorKind::NotRunnable`]); its device is replaced by the CPU's.
pub fn run(graph: &Graph, mut plan: Plan, options: &RunOptions) -> Result<RunResult> {
    options.validate()?;
    plan.check_graph(graph)?;
    if let Some(err) = verify_plan(&plan, graph).error() {
        return Err(err);
    }
    let device = options.cpu_device(plan.budget_bytes);
    plan.device = Some(device.clone());
    let cost = RooflineModel::new(device);
    let predicted = simulate(graph, &plan, &cost, &SimOptions::default())?.report;
    if let Some(oom) = &predicted.oom {
        return Err(ErrorKind::NotRunnable {
            reason: allocator_shortfall(&plan.allocator, oom),
        }
        .into());
    }
    let exec_options = outcore_exec::ExecOptions {
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
        ..outcore_exec::ExecOptions::default()
    };
    let backend = outcore_exec::CpuBackend::new(outcore_exec::CpuBackendOptions {
        link_bytes_per_s: options.link_bytes_per_s,
        ..outcore_exec::CpuBackendOptions::default()
    });
    let report = outcore_exec::execute(graph, &plan, &backend, &exec_options)?;
    let matches_reference = if options.reference {
        Some(matches_reference(graph, &exec_options, &report)?)
    } else {
        None
    };
    Ok(RunResult {
        planner: plan.planner.name.clone(),
        iters: report.iters,
        measured_iter_time_s: report.measured_iter_time_s,
        predicted_iter_time_s: predicted.iter_time_s,
        peak_device_bytes: report.peak_device_bytes,
        budget_bytes: plan.budget_bytes,
        allocator: plan.allocator.name().to_string(),
        swap_in_bytes: report.swap_in_bytes,
        swap_out_bytes: report.swap_out_bytes,
        recomputes: report.recomputes,
        synthetic_kernels: options.synthetic_kernels,
        iter_times_s: report.iter_times_s.clone(),
        checks_passed: report.checks_passed,
        matches_reference,
        losses: report
            .losses
            .iter()
            .map(|l| l.is_finite().then_some(*l))
            .collect(),
        latency_table: report.latency_table.clone(),
        trace: (!report.trace.is_null()).then(|| report.trace.clone()),
    })
}

/// Runs the graph in order with room to spare, no swapping or recomputation,
/// and compares final persistent tensors with `report`'s.
fn matches_reference(
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
        ..options.clone()
    };
    let reference = outcore_exec::execute(graph, &reference_plan, &backend, &reference_options)?;
    Ok(reference.final_state() == report.final_state())
}
