//! Training tiny models for 10 iterations under an in-order plan and under
//! swapping / recomputing plans gives bit-identical parameters, with `check`
//! passing and the loss decreasing.

mod common;

use outcore_exec::{
    CpuBackend, CpuBackendOptions, ExecErrorKind, ExecOptions, RunReport, execute, test_plans,
};
use outcore_graph::Graph;
use outcore_plan::Plan;

const ITERS: u32 = 10;

fn run(
    graph: &Graph,
    plan: &Plan,
    link_bytes_per_s: Option<f64>,
) -> Result<RunReport, outcore_exec::ExecError> {
    let backend = CpuBackend::new(CpuBackendOptions {
        link_bytes_per_s,
        ..Default::default()
    });
    execute(
        graph,
        plan,
        &backend,
        &ExecOptions {
            iters: ITERS,
            check: true,
            ..Default::default()
        },
    )
}

/// Runs `plan` at the smallest of a few budgets above its verified peak at which the
/// best-fit arena does not fragment too much; returns the report and the budget.
fn run_fitted(graph: &Graph, mut plan: Plan) -> (RunReport, u64) {
    for slack in [0.05, 0.15, 0.3, 0.5, 0.8] {
        let budget = test_plans::fit_budget(&mut plan, graph, slack).expect("plan verifies");
        common::assert_verified(&plan, graph);
        match run(graph, &plan, None) {
            Ok(report) => return (report, budget),
            Err(e) if matches!(e.kind, ExecErrorKind::OutOfDeviceMemory { .. }) => continue,
            Err(e) => panic!("{} failed: {e}", plan.planner.name),
        }
    }
    panic!(
        "{} does not run even at 1.8x its verified peak",
        plan.planner.name
    );
}

fn compare(model: &str, batch: u64, knobs: &[(&str, u64)]) {
    let graph = common::model(model, batch, knobs);
    let footprint = common::footprint_bytes(&graph);
    let (reference, ref_budget) = run_fitted(&graph, test_plans::in_order_plan(&graph, 0));
    assert_eq!(reference.checks_passed, Some(true));
    assert_eq!(reference.losses.len(), ITERS as usize);
    assert!(
        reference.losses[ITERS as usize - 1] < reference.losses[0],
        "{model}: loss does not decrease: {:?}",
        reference.losses
    );
    eprintln!(
        "{model}: footprint {footprint} B; in-order budget {ref_budget} B, peak {} B, {:.4} s/iter, loss {:.4} -> {:.4}",
        reference.peak_device_bytes,
        reference.measured_iter_time_s,
        reference.losses[0],
        reference.losses[ITERS as usize - 1]
    );
    for plan in [
        test_plans::swapping_plan(&graph, 0, 3),
        test_plans::recompute_plan(&graph, 0, 3),
    ] {
        let name = plan.planner.name.clone();
        let verified_peak = test_plans::verified_peak_bytes(&plan, &graph).expect("verifies");
        let (report, budget) = run_fitted(&graph, plan);
        assert_eq!(report.checks_passed, Some(true), "{name}");
        assert_eq!(
            report
                .losses
                .iter()
                .map(|l| l.to_bits())
                .collect::<Vec<_>>(),
            reference
                .losses
                .iter()
                .map(|l| l.to_bits())
                .collect::<Vec<_>>(),
            "{model} {name}: losses differ"
        );
        assert_eq!(
            report.final_state(),
            reference.final_state(),
            "{model} {name}: final parameters differ"
        );
        eprintln!(
            "{model} {name}: verified peak {verified_peak} B ({:.0}% of footprint), budget {budget} B, peak {} B, swap-in {} B/iter, swap-out {} B/iter, recomputes {}/iter, checks {}, {:.4} s/iter",
            100.0 * verified_peak as f64 / footprint as f64,
            report.peak_device_bytes,
            report.swap_in_bytes,
            report.swap_out_bytes,
            report.recomputes,
            report.checks_run,
            report.measured_iter_time_s
        );
        assert!(report.checks_run > 0, "{name}: nothing was checked");
    }
}

#[test]
fn mlp_swapping_and_recompute_are_bit_identical() {
    compare("mlp", 8, &[]);
}

#[test]
fn tiny_cnn_swapping_and_recompute_are_bit_identical() {
    compare("tiny-cnn", 8, &[]);
}

#[test]
fn tiny_transformer_is_bit_identical_if_present() {
    if outcore_graph::zoo::find("tiny-transformer").is_err() {
        eprintln!("tiny-transformer is not in the zoo yet; skipped");
        return;
    }
    let info = outcore_graph::zoo::find("tiny-transformer").expect("found");
    compare("tiny-transformer", info.default_batch.min(4), &[]);
}

#[test]
fn swapping_plan_saves_memory_on_tiny_cnn() {
    let graph = common::model("tiny-cnn", 8, &[]);
    let footprint = common::footprint_bytes(&graph);
    let swap = test_plans::swapping_plan(&graph, 0, 3);
    let peak = test_plans::verified_peak_bytes(&swap, &graph).expect("verifies");
    assert!(peak < footprint * 85 / 100, "{peak} vs {footprint}");
}

#[test]
fn slow_link_run_reports_latencies_and_trace() {
    let graph = common::model("tiny-cnn", 4, &[]);
    let mut plan = test_plans::swapping_plan(&graph, 0, 3);
    test_plans::fit_budget(&mut plan, &graph, 0.8).expect("verifies");
    let backend = CpuBackend::new(CpuBackendOptions {
        link_bytes_per_s: Some(200e6),
        ..Default::default()
    });
    let report = execute(
        &graph,
        &plan,
        &backend,
        &ExecOptions {
            iters: 3,
            check: true,
            ..Default::default()
        },
    )
    .expect("runs");
    let table = &report.latency_table;
    assert_eq!(table.format, "outcore-latency-table/1");
    assert_eq!(table.device, "cpu");
    assert_eq!(table.entries.len(), graph.ops.len());
    assert!(
        table
            .entries
            .iter()
            .all(|e| e.samples == 2 && e.time_s >= 0.0)
    );
    // A copy of n bytes on a 200 MB/s link takes at least n / 200e6 seconds.
    assert!(!table.copy_entries.is_empty());
    for c in &table.copy_entries {
        assert!(c.time_s >= c.size_bytes as f64 / 200e6 * 0.9, "{c:?}");
    }
    // The fitted rates cannot beat the link either.
    let rates = table.copies.expect("both directions copied");
    assert!(rates.h2d_bytes_per_s <= 200e6 * 1.1, "{rates:?}");
    // What the executor writes, the cost model reads.
    let back = outcore_cost::MeasuredTable::from_json_str(&table.to_json_string(), "run")
        .expect("the cost model reads the executor's table");
    // Same entries; times equal up to serde_json's last-bit float parsing.
    assert_eq!(back.entries.len(), table.entries.len());
    assert_eq!(back.copy_entries.len(), table.copy_entries.len());
    for (read, written) in back.entries.iter().zip(&table.entries) {
        assert_eq!(read.name, written.name);
        assert!((read.time_s - written.time_s).abs() <= 1e-12 * written.time_s.abs());
    }
    let events = report.trace["traceEvents"]
        .as_array()
        .expect("trace events");
    let tids: std::collections::BTreeSet<i64> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| e["tid"].as_i64())
        .collect();
    assert_eq!(tids.len(), 3, "one track per stream");
    assert_eq!(report.iter_times_s.len(), 3);
}
