//! Several jobs at once on one shared CPU arena (issue 13, item 5): TENSILE
//! plans of two tiny models trained concurrently, each bit-identical to training
//! alone without a plan; one job's failure leaving another bit-identical; a plan
//! swapped between iterations; windows that cannot reach each other; bad input.

mod common;

use outcore_cost::{LATENCY_TABLE_FORMAT, RooflineModel};
use outcore_exec::multi::layout_windows;
use outcore_exec::{
    Backend, CpuBackendOptions, CpuDevice, CpuFaults, ExecErrorKind, ExecOptions, IterationHook,
    Job, PlanSwap, RunReport, SharedUsage, execute, execute_jobs,
};
use outcore_graph::{Graph, footprint};
use outcore_plan::{
    AllocatorSpec, Plan, PlanOutcome, PlanRequest, PlannerInfo, Residency, StepRef, lower_in_order,
    verify,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

const ITERS: u32 = 3;
/// Iterations of the job that swaps plans after iterations 1, 2 and 3.
const SWAP_ITERS: u32 = 5;

fn tiny_cnn() -> Graph {
    common::model("tiny-cnn", 4, &[("depth", 4), ("width", 8)])
}

fn tiny_transformer() -> Graph {
    common::model("tiny-transformer", 4, &[("layers", 2)])
}

/// `planner`'s plan of `g` at `percent`% of its footprint, verified, with the
/// simulated issue order (so the arena allocator sees the sequence it was
/// planned for, as `outcore run` issues).
fn planned(planner: &str, g: &Graph, percent: u64) -> (Plan, Option<Vec<StepRef>>) {
    let (fp, _) = footprint(g);
    let budget = fp * percent / 100;
    let cost = RooflineModel::new(outcore_exec::cpu::device_profile(budget, None, 1e10));
    let allocator = AllocatorSpec::Perfect;
    let request = PlanRequest {
        graph: g,
        cost: &cost,
        budget_bytes: budget,
        seed: 0,
        time_limit_s: 30.0,
        allocator: &allocator,
        order: None,
        fingerprint: None,
    };
    let p = outcore_planners::by_name(planner).expect("planner exists");
    let plan = match p.plan(&request) {
        Ok(PlanOutcome::Feasible(p)) => *p,
        Ok(PlanOutcome::Infeasible(why)) => {
            panic!("{planner} on {} at {percent}%: {why}", g.meta.model)
        }
        Err(e) => panic!("{planner} on {} at {percent}%: {e}", g.meta.model),
    };
    let v = verify(&plan, g);
    assert!(v.is_empty(), "{planner}: {}", v[0]);
    let sim_options = outcore_sim::SimOptions {
        record_start_order: true,
        ..outcore_sim::SimOptions::default()
    };
    let predicted = outcore_sim::simulate(g, &plan, &cost, &sim_options).expect("simulates");
    assert!(predicted.report.oom.is_none(), "{planner}: simulated OOM");
    (plan, predicted.start_order)
}

/// The model trained alone without a plan (in order, twice its footprint).
fn alone(g: &Graph, seed: u64) -> RunReport {
    let (fp, _) = footprint(g);
    let info = PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let plan = lower_in_order(g, info, fp * 2);
    let backend = outcore_exec::CpuBackend::new(CpuBackendOptions::default());
    execute(g, &plan, &backend, &options(seed, None)).expect("the run alone succeeds")
}

fn options(seed: u64, issue_order: Option<Vec<StepRef>>) -> ExecOptions {
    ExecOptions {
        iters: ITERS,
        check: true,
        seed,
        trace: false,
        issue_order,
        ..ExecOptions::default()
    }
}

fn job<'a>(
    name: &str,
    g: &'a Graph,
    plan: &'a Plan,
    order: Option<Vec<StepRef>>,
    seed: u64,
) -> Job<'a> {
    Job {
        name: name.into(),
        graph: g,
        plan,
        swaps: Vec::new(),
        options: options(seed, order),
        backend: CpuBackendOptions::default(),
    }
}

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|x| x.to_bits()).collect()
}

/// Same final parameters and optimizer state, same loss every iteration.
fn assert_identical(name: &str, got: &RunReport, want: &RunReport) {
    assert_eq!(
        bits(&got.losses),
        bits(&want.losses),
        "{name}: losses differ"
    );
    assert!(
        got.final_state() == want.final_state(),
        "{name}: final parameters differ"
    );
    assert!(!got.final_state().is_empty(), "{name}: no persistent state");
}

/// Each op of the graph timed, in the latency table format.
fn assert_latency_table(name: &str, g: &Graph, report: &RunReport) {
    let table = &report.latency_table;
    assert_eq!(table.format, LATENCY_TABLE_FORMAT, "{name}");
    assert_eq!(table.graph_model, g.meta.model, "{name}");
    assert_eq!(
        table.entries.len(),
        g.ops.len(),
        "{name}: not every op timed"
    );
    assert!(
        table
            .entries
            .iter()
            .all(|e| e.samples == u64::from(ITERS) - 1),
        "{name}: ops measured over the wrong iterations"
    );
}

#[test]
fn two_tensile_jobs_in_one_arena_train_as_if_alone() {
    let (cnn, transformer) = (tiny_cnn(), tiny_transformer());
    let (cnn_plan, cnn_order) = planned("tensile", &cnn, 50);
    let (tf_plan, tf_order) = planned("tensile", &transformer, 50);
    let jobs = vec![
        job("cnn", &cnn, &cnn_plan, cnn_order, 1),
        job("transformer", &transformer, &tf_plan, tf_order, 2),
    ];
    // The arena is exactly the two windows: nothing to spare.
    let capacity: u64 = jobs.iter().map(Job::window_bytes).sum();
    let run = execute_jobs(&jobs, capacity).expect("the co-located run starts");
    assert_eq!(run.jobs.len(), 2);
    let (w0, w1) = (run.jobs[0].window, run.jobs[1].window);
    assert!(
        w0.offset_bytes + w0.size_bytes <= w1.offset_bytes,
        "windows overlap"
    );
    // The global peak: at least either job's, at most both together.
    let peaks: Vec<u64> = run
        .jobs
        .iter()
        .map(|j| j.result.as_ref().map_or(0, |r| r.peak_device_bytes))
        .collect();
    assert!(run.peak_device_bytes >= peaks[0].max(peaks[1]), "{peaks:?}");
    assert!(run.peak_device_bytes <= (peaks[0] + peaks[1]).min(capacity));
    for (name, g, seed) in [("cnn", &cnn, 1), ("transformer", &transformer, 2)] {
        let outcome = run.job(name).expect("job reported");
        let report = outcome
            .result
            .as_ref()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.checks_passed, Some(true), "{name}");
        assert!(report.checks_run > 0, "{name}: nothing checked");
        assert!(
            report.swap_in_bytes > 0 || report.recomputes > 0,
            "{name}: the tensile plan neither swaps nor recomputes at 50%"
        );
        assert!(
            report.peak_device_bytes <= outcome.window.size_bytes,
            "{name}"
        );
        assert_identical(name, report, &alone(g, seed));
        assert_latency_table(name, g, report);
    }
}

#[test]
fn a_failing_job_leaves_the_other_bit_identical() {
    let cnn = tiny_cnn();
    let (plan, order) = planned("tensile", &cnn, 50);
    // A plan whose budget was cut below its peak: the job runs out of memory.
    let mut starved = plan.clone();
    starved.budget_bytes /= 3;
    let failing_op = cnn.ops[cnn.ops.len() / 2].name.clone();
    let mut faulty = job("kernel-fault", &cnn, &plan, order.clone(), 3);
    let iterations_done = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&iterations_done);
    faulty.options.on_iteration = Some(IterationHook(Arc::new(move |done, _| {
        counter.store(done, Ordering::SeqCst);
        true
    })));
    faulty.backend.faults = CpuFaults {
        fail_kernel_named: Some(failing_op.clone()),
        fail_kernel_at_step: Some(3),
        ..CpuFaults::default()
    };
    let jobs = vec![
        faulty,
        job("healthy", &cnn, &plan, order.clone(), 4),
        job("out-of-memory", &cnn, &starved, order, 5),
    ];
    let capacity: u64 = jobs.iter().map(Job::window_bytes).sum();
    let run = execute_jobs(&jobs, capacity).expect("the co-located run starts");
    let err = run.jobs[0].result.as_ref().expect_err("the kernel fails");
    assert!(
        matches!(&err.kind, ExecErrorKind::KernelFailed { op, .. } if *op == failing_op),
        "{err}"
    );
    // It failed mid-run: two iterations had finished.
    assert_eq!(iterations_done.load(Ordering::SeqCst), 2);
    let err = run.jobs[2].result.as_ref().expect_err("out of memory");
    assert!(
        matches!(err.kind, ExecErrorKind::OutOfDeviceMemory { .. }),
        "{err}"
    );
    let healthy = run.jobs[1]
        .result
        .as_ref()
        .expect("the healthy job finishes");
    assert_eq!(healthy.losses.len(), ITERS as usize);
    assert_eq!(healthy.checks_passed, Some(true));
    assert_identical("healthy", healthy, &alone(&cnn, 4));
}

#[test]
fn a_plan_swapped_between_iterations_keeps_the_training_state() {
    let (cnn, transformer) = (tiny_cnn(), tiny_transformer());
    let (tensile, tensile_order) = planned("tensile", &cnn, 50);
    let in_order = common::in_order(&cnn);
    // The swap must move state: tensile keeps some persistent tensor on the
    // host across iterations, the in-order plan keeps everything on the device.
    let host_resident = |p: &Plan| {
        p.initial_residency
            .iter()
            .filter(|(_, r)| *r == Residency::Host)
            .count()
    };
    assert!(
        host_resident(&tensile) > 0,
        "tensile keeps nothing on the host"
    );
    assert_eq!(host_resident(&in_order), 0);
    // The last plan's arena allocator is another kind: the allocator is
    // rebuilt at the swap (tensors become lists of 64 KiB chunk segments).
    let mut chunked = outcore_exec::test_plans::in_order_plan(&cnn, 0);
    outcore_exec::test_plans::fit_budget(&mut chunked, &cnn, 0.5).expect("verifies");
    chunked.allocator = AllocatorSpec::VirtualChunks(outcore_alloc::VirtualChunksConfig {
        chunk_bytes: 64 * 1024,
        small_alloc_max_bytes: 16 * 1024,
    });
    chunked.planner.name = "in-order-chunked".into();
    let mut swapper = job("swapper", &cnn, &tensile, tensile_order.clone(), 6);
    swapper.options.iters = SWAP_ITERS;
    swapper.swaps = vec![
        PlanSwap {
            after_iteration: 1,
            plan: &in_order,
            issue_order: None,
        },
        PlanSwap {
            after_iteration: 2,
            plan: &tensile,
            issue_order: tensile_order,
        },
        PlanSwap {
            after_iteration: 3,
            plan: &chunked,
            issue_order: None,
        },
    ];
    let (tf_plan, tf_order) = planned("tensile", &transformer, 50);
    let jobs = vec![swapper, job("steady", &transformer, &tf_plan, tf_order, 7)];
    let capacity: u64 = jobs.iter().map(Job::window_bytes).sum();
    assert_eq!(
        jobs[0].window_bytes(),
        chunked.budget_bytes.div_ceil(512) * 512,
        "the window holds the largest of the job's plans"
    );
    let run = execute_jobs(&jobs, capacity).expect("the co-located run starts");
    let report = run.jobs[0]
        .result
        .as_ref()
        .expect("the swapping job finishes");
    assert_eq!(
        report.planner,
        "tensile -> in-order -> tensile -> in-order-chunked"
    );
    assert_eq!(report.checks_passed, Some(true));
    assert!(report.checks_run > 0);
    let mut reference_options = options(6, None);
    reference_options.iters = SWAP_ITERS;
    let (fp, _) = footprint(&cnn);
    let info = PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let reference = execute(
        &cnn,
        &lower_in_order(&cnn, info, fp * 2),
        &outcore_exec::CpuBackend::new(CpuBackendOptions::default()),
        &reference_options,
    )
    .expect("the run alone succeeds");
    assert_identical("swapper", report, &reference);
    let steady = run.jobs[1].result.as_ref().expect("the other job finishes");
    assert_identical("steady", steady, &alone(&transformer, 7));
}

#[test]
fn shared_usage_counts_a_run_and_forgets_it_when_it_ends() {
    let cnn = tiny_cnn();
    let (plan, order) = planned("tensile", &cnn, 50);
    let usage = Arc::new(SharedUsage::default());
    let counted = ExecOptions {
        shared_usage: Some(Arc::clone(&usage)),
        iters: 2,
        ..options(0, order.clone())
    };
    let backend = outcore_exec::CpuBackend::new(CpuBackendOptions::default());
    let report = execute(&cnn, &plan, &backend, &counted).expect("runs");
    // One run alone: the shared peak is its own.
    assert_eq!(usage.peak_bytes(), report.peak_device_bytes);
    assert_eq!(usage.live_bytes(), 0, "a finished run still counted");
    // A run that fails (out of memory) is forgotten too.
    let mut starved = plan.clone();
    starved.budget_bytes /= 3;
    let backend = outcore_exec::CpuBackend::new(CpuBackendOptions::default());
    let err = execute(&cnn, &starved, &backend, &counted).expect_err("out of memory");
    assert!(
        matches!(err.kind, ExecErrorKind::OutOfDeviceMemory { .. }),
        "{err}"
    );
    assert_eq!(usage.live_bytes(), 0, "a failed run still counted");
}

#[test]
fn a_window_cannot_reach_its_neighbours_bytes() {
    let device = CpuDevice::new(4096).expect("arena");
    let a = device
        .backend_in_window(0, 2048, CpuBackendOptions::default())
        .expect("window a");
    let b = device
        .backend_in_window(2048, 2048, CpuBackendOptions::default())
        .expect("window b");
    let overlap = device
        .backend_in_window(1024, 2048, CpuBackendOptions::default())
        .expect_err("overlapping windows are refused");
    assert!(overlap.to_string().contains("overlaps"), "{overlap}");
    a.alloc_region(2048).expect("a's region");
    b.alloc_region(1024).expect("b's region");
    let ones = b.alloc_host(1024).expect("host");
    b.write_host(ones, 0, &[1u8; 1024]).expect("write");
    b.copy_h2d(b.stream(outcore_exec::StreamKind::H2d), ones, 0, 0, 1024)
        .expect("b copies into its own region");
    b.synchronize(b.stream(outcore_exec::StreamKind::H2d))
        .expect("sync");
    assert_eq!(device.read(2048, 1024).expect("read"), vec![1u8; 1024]);
    // a's offsets are relative to its window: 2048 is past its end, not b's start.
    let sevens = a.alloc_host(1024).expect("host");
    a.write_host(sevens, 0, &[7u8; 1024]).expect("write");
    let err = a
        .copy_h2d(
            a.stream(outcore_exec::StreamKind::H2d),
            sevens,
            0,
            2048,
            1024,
        )
        .expect_err("out of a's window");
    assert!(
        matches!(err.kind, ExecErrorKind::OutOfRange { .. }),
        "{err}"
    );
    let err = b
        .alloc_region(4096)
        .expect_err("a region larger than the window");
    assert!(err.to_string().contains("region"), "{err}");
    a.copy_h2d(
        a.stream(outcore_exec::StreamKind::H2d),
        sevens,
        0,
        1024,
        1024,
    )
    .expect("a copies into its own region");
    a.synchronize(a.stream(outcore_exec::StreamKind::H2d))
        .expect("sync");
    assert_eq!(device.read(1024, 1024).expect("read"), vec![7u8; 1024]);
    assert_eq!(device.read(2048, 1024).expect("read"), vec![1u8; 1024]);
    // A dropped backend gives its window back.
    drop(b);
    device
        .backend_in_window(2048, 2048, CpuBackendOptions::default())
        .expect("the window is free again");
}

#[test]
fn bad_job_lists_are_refused_before_anything_runs() {
    let cnn = tiny_cnn();
    let plan = common::in_order(&cnn);
    let err = execute_jobs(&[], 1 << 30).expect_err("no jobs");
    assert!(err.to_string().contains("no jobs"), "{err}");

    let twins = vec![
        job("a", &cnn, &plan, None, 0),
        job("a", &cnn, &plan, None, 1),
    ];
    let err = execute_jobs(&twins, 1 << 30).expect_err("duplicate names");
    assert!(err.to_string().contains("two jobs are named `a`"), "{err}");

    let jobs = vec![
        job("a", &cnn, &plan, None, 0),
        job("b", &cnn, &plan, None, 1),
    ];
    let window = jobs[0].window_bytes();
    let err = execute_jobs(&jobs, 2 * window - 1).expect_err("windows do not fit");
    let msg = err.to_string();
    for needle in [
        format!("`a` {window} bytes"),
        format!("total {} bytes", 2 * window),
        format!("{}-byte shared arena", 2 * window - 1),
        format!("at least {} bytes", 2 * window),
    ] {
        assert!(msg.contains(&needle), "`{needle}` missing from: {msg}");
    }
    assert!(layout_windows(&jobs, 2 * window).is_ok());

    let mut late = job("late", &cnn, &plan, None, 0);
    late.swaps = vec![PlanSwap {
        after_iteration: ITERS,
        plan: &plan,
        issue_order: None,
    }];
    let err = execute_jobs(&[late], 1 << 30).expect_err("swap after the last iteration");
    let msg = err.to_string();
    assert!(
        msg.contains("job `late`") && msg.contains(&format!("after iteration {ITERS}")),
        "{msg}"
    );

    let transformer = tiny_transformer();
    let other_graph = common::in_order(&transformer);
    let mut mixed = job("mixed", &cnn, &plan, None, 0);
    mixed.swaps = vec![PlanSwap {
        after_iteration: 1,
        plan: &other_graph,
        issue_order: None,
    }];
    let err = execute_jobs(&[mixed], 1 << 30).expect_err("a swap to another graph's plan");
    let msg = err.to_string();
    assert!(
        msg.contains("job `mixed`") && msg.contains("plan was made for a graph of"),
        "{msg}"
    );
}
