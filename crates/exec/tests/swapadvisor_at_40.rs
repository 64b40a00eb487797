//! SwapAdvisor's plans at 40% of the footprint, executed on the CPU backend
//! under the `size-class` pool each plan carries (its CLS / CNT encoding), for
//! 10 iterations with checks: losses and final parameters bit-identical to an
//! unconstrained run, and no allocation ever failing in the pool.

use outcore_cost::RooflineModel;
use outcore_exec::{CpuBackend, CpuBackendOptions, ExecOptions, execute};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{AllocatorSpec, PlanOutcome, PlanRequest, Planner, PlannerInfo, lower_in_order};
use outcore_planners::SwapAdvisor;
use outcore_planners::swapadvisor::SearchSpace;
use std::collections::BTreeMap;

const ITERS: u32 = 10;

fn graph(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    zoo::build(name, Some(batch), &knobs, None).expect("zoo model builds")
}

fn run_at_40(g: &Graph) {
    let (fp, _) = footprint(g);
    let budget = fp * 40 / 100;
    let options = ExecOptions {
        iters: ITERS,
        check: true,
        trace: false,
        ..ExecOptions::default()
    };
    let info = PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let reference_plan = lower_in_order(g, info, fp * 2);
    let reference = execute(
        g,
        &reference_plan,
        &CpuBackend::new(CpuBackendOptions::default()),
        &options,
    )
    .expect("the unconstrained run succeeds");
    let cost = RooflineModel::new(outcore_exec::cpu::device_profile(budget, None, 1e10));
    // A short search: enough for a feasible pool on these graphs.
    let planner = SwapAdvisor {
        population: 16,
        max_generations: Some(4),
        ..SwapAdvisor::new(SearchSpace::Joint)
    };
    let request = PlanRequest {
        time_limit_s: 60.0,
        ..PlanRequest::new(g, &cost, budget)
    };
    let plan = match planner.plan(&request) {
        Ok(PlanOutcome::Feasible(p)) => *p,
        Ok(PlanOutcome::Infeasible(why)) => panic!("{}: {why}", g.meta.model),
        Err(e) => panic!("{}: {e}", g.meta.model),
    };
    let AllocatorSpec::SizeClass(config) = &plan.allocator else {
        panic!("{}: not a size-class plan", g.meta.model)
    };
    assert!(config.encoding.is_some(), "{}: no encoding", g.meta.model);
    let report = execute(
        g,
        &plan,
        &CpuBackend::new(CpuBackendOptions::default()),
        &options,
    )
    .unwrap_or_else(|e| panic!("{} at 40%: {e}", g.meta.model));
    assert_eq!(report.checks_passed, Some(true));
    assert!(report.swap_in_bytes > 0, "nothing swapped");
    assert!(report.peak_device_bytes <= budget);
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&report.losses),
        bits(&reference.losses),
        "losses differ"
    );
    assert!(
        report.final_state() == reference.final_state(),
        "final parameters differ"
    );
}

#[test]
fn tiny_cnn_under_swapadvisor_at_40_percent() {
    run_at_40(&graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]));
}

#[test]
fn tiny_transformer_under_swapadvisor_at_40_percent() {
    run_at_40(&graph("tiny-transformer", 32, &[("layers", 8)]));
}
