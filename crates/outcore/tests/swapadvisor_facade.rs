//! `swapadvisor` through the facade: the plan keeps the size-class pool it was
//! searched with (its CLS / CNT encoding is not replaced by a pool sized from
//! the plan's trace), verifies, and runs under it; `compare` judges it alike.

use outcore::{AllocatorSpec, GraphSource, PlanOptions, Runnability, Target};

fn resnet18() -> outcore::LoadedGraph {
    outcore::load_graph(&GraphSource::Zoo {
        model: "resnet18".into(),
        batch: Some(16),
        knobs: Default::default(),
        optimizer: None,
    })
    .expect("zoo model builds")
}

#[test]
fn a_swapadvisor_plan_keeps_its_own_pool() {
    let graph = resnet18();
    let options = PlanOptions {
        time_limit_s: 1.0,
        ..PlanOptions::default()
    };
    for allocator in ["perfect", "size-class"] {
        let target = Target::parse(&graph, "v100-16gb-pcie3", "70%", allocator).unwrap();
        let result = outcore::plan(&graph, "swapadvisor", &target, &options).expect("plans");
        let AllocatorSpec::SizeClass(config) = &result.plan.allocator else {
            panic!("{allocator}: not a size-class plan")
        };
        let encoding = config.encoding.as_ref().expect("the searched encoding");
        assert!(
            config.classes.is_empty(),
            "{allocator}: the pool was resized"
        );
        assert!(!encoding.cnt.is_empty());
        assert!(result.verification.passed, "{allocator}");
        assert!(result.report.oom.is_none(), "{allocator}");
        // The pool reserves itself up front: the searched pool, within the budget.
        assert_eq!(
            Some(result.report.peak_reserved_bytes),
            result.plan.planner.settings["pool_bytes"].as_u64(),
            "{allocator}"
        );
        assert!(result.report.peak_reserved_bytes <= target.budget_bytes);
    }
    let target = Target::parse(&graph, "v100-16gb-pcie3", "70%", "perfect").unwrap();
    let comparison = outcore::compare(
        &graph,
        &["swapadvisor".to_string(), "window".to_string()],
        &target,
        &options,
    )
    .expect("compares");
    assert_eq!(comparison.results[0].status, Runnability::Feasible);
}

/// The CLI hides its spinner for the planners that draw their own progress
/// line: SwapAdvisor's three searches, and no other planner of the list.
#[test]
fn only_swapadvisor_draws_its_own_progress() {
    for name in [
        "swapadvisor",
        "swapadvisor-order-only",
        "swapadvisor-alloc-only",
    ] {
        assert!(outcore::planner_draws_own_progress(name), "{name}");
    }
    for name in ["outcore", "home", "dtr", "tensile", "window", "nosuch"] {
        assert!(!outcore::planner_draws_own_progress(name), "{name}");
    }
}
