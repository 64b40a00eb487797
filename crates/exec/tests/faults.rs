//! Faults stop the run with a clear error: a budget too small, a corrupted host
//! copy (caught by `check`), a failing kernel.

mod common;

use outcore_exec::{
    CpuBackend, CpuBackendOptions, CpuFaults, ExecErrorKind, ExecOptions, execute, test_plans,
};

#[test]
fn too_small_budget_is_out_of_device_memory() {
    let graph = common::model("mlp", 8, &[]);
    let footprint = common::footprint_bytes(&graph);
    let plan = test_plans::in_order_plan(&graph, footprint / 2);
    let backend = CpuBackend::new(CpuBackendOptions::default());
    let err = execute(&graph, &plan, &backend, &ExecOptions::default()).expect_err("must not fit");
    match &err.kind {
        ExecErrorKind::OutOfDeviceMemory {
            bytes,
            free_bytes,
            largest_free_block,
            ..
        } => assert!(largest_free_block < bytes && free_bytes <= &(footprint / 2)),
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("raise the plan's budget"), "{err}");
}

#[test]
fn corrupted_host_copy_is_caught_by_check() {
    let graph = common::model("tiny-cnn", 4, &[]);
    let mut plan = test_plans::swapping_plan(&graph, 0, 3);
    test_plans::fit_budget(&mut plan, &graph, 0.8).expect("verifies");
    let backend = CpuBackend::new(CpuBackendOptions {
        faults: CpuFaults {
            flip_byte_after_d2h_copy: Some(1),
            ..Default::default()
        },
        ..Default::default()
    });
    let opts = ExecOptions {
        iters: 2,
        check: true,
        ..Default::default()
    };
    let err = execute(&graph, &plan, &backend, &opts).expect_err("corruption must be caught");
    assert!(
        matches!(&err.kind, ExecErrorKind::CheckFailed { stage, .. } if stage == "swap-in"),
        "{err}"
    );
    // Without the fault the same plan passes.
    let clean = CpuBackend::new(CpuBackendOptions::default());
    let report = execute(&graph, &plan, &clean, &opts).expect("clean run");
    assert_eq!(report.checks_passed, Some(true));
}

#[test]
fn failing_kernel_stops_the_run_naming_the_op() {
    let graph = common::model("mlp", 8, &[]);
    let plan = common::in_order(&graph);
    let op_name = graph.ops[3].name.clone();
    let backend = CpuBackend::new(CpuBackendOptions {
        faults: CpuFaults {
            fail_kernel_named: Some(op_name.clone()),
            ..Default::default()
        },
        ..Default::default()
    });
    let err = execute(&graph, &plan, &backend, &ExecOptions::default()).expect_err("kernel fails");
    match &err.kind {
        ExecErrorKind::KernelFailed { op, .. } => assert_eq!(op, &op_name),
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains(&op_name), "{err}");
}

#[test]
fn plan_for_another_graph_is_rejected() {
    let graph = common::model("mlp", 8, &[]);
    let other = common::model("tiny-cnn", 4, &[]);
    let plan = common::in_order(&other);
    let backend = CpuBackend::new(CpuBackendOptions::default());
    let err = execute(&graph, &plan, &backend, &ExecOptions::default()).expect_err("mismatch");
    assert!(matches!(err.kind, ExecErrorKind::BadPlan { .. }), "{err}");
}

#[test]
fn plan_allocator_from_outcore_alloc_is_used() {
    let graph = common::model("mlp", 8, &[]);
    let mut plan = test_plans::in_order_plan(&graph, 0);
    test_plans::fit_budget(&mut plan, &graph, 0.3).expect("verifies");
    let reference = execute(
        &graph,
        &plan,
        &CpuBackend::new(CpuBackendOptions::default()),
        &ExecOptions {
            iters: 2,
            ..Default::default()
        },
    )
    .expect("perfect allocator runs");
    // The caching model keeps freed segments for reuse by similar sizes, so it
    // needs headroom over the fragmentation-free bound.
    plan.allocator = outcore_plan::AllocatorSpec::BestFit(Default::default());
    plan.budget_bytes *= 2;
    let report = execute(
        &graph,
        &plan,
        &CpuBackend::new(CpuBackendOptions::default()),
        &ExecOptions {
            iters: 2,
            ..Default::default()
        },
    )
    .expect("best-fit allocator runs");
    assert_eq!(report.final_state(), reference.final_state());
    // A size-class pool with no classes cannot be built.
    plan.allocator = outcore_plan::AllocatorSpec::SizeClass(Default::default());
    let err = execute(
        &graph,
        &plan,
        &CpuBackend::new(CpuBackendOptions::default()),
        &ExecOptions::default(),
    )
    .expect_err("unbuildable allocator");
    assert!(matches!(err.kind, ExecErrorKind::Allocator { .. }), "{err}");
}
