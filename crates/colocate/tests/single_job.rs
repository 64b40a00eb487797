//! One job alone simulates exactly as `outcore_sim::simulate` does: the same
//! iteration times (f64 equality, not closeness) and the same peak, for zoo
//! models planned by several planners, arriving at 0 s or later.

use std::collections::BTreeMap;
use std::sync::Arc;

use outcore_colocate::{Job, JobSet, simulate_jobs};
use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{Plan, PlanOutcome, PlanRequest};
use outcore_sim::{SimOptions, simulate};

const ITERATIONS: usize = 3;

fn cost() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("built-in device"))
}

fn graph(name: &str) -> Graph {
    zoo::build(name, Some(32), &BTreeMap::new(), None).expect("zoo model builds")
}

/// `planner`'s plan at `percent` of the footprint; `None` when infeasible.
fn plan(g: &Graph, cost: &RooflineModel, planner: &str, percent: u64) -> Option<Plan> {
    let budget_bytes = footprint(g).0 * percent / 100;
    let planner = outcore_planners::by_name(planner).expect("known planner");
    match planner
        .plan(&PlanRequest::new(g, cost, budget_bytes))
        .expect("planner runs")
    {
        PlanOutcome::Feasible(p) => Some(*p),
        PlanOutcome::Infeasible(_) => None,
    }
}

/// Checks one (model, planner, budget) case; returns whether it was planned.
fn check(model: &str, planner: &str, percent: u64, arrival_s: f64) -> bool {
    let cost = cost();
    let g = graph(model);
    let Some(p) = plan(&g, &cost, planner, percent) else {
        return false;
    };
    let options = SimOptions {
        iterations: ITERATIONS,
        ..SimOptions::default()
    };
    let alone = simulate(&g, &p, &cost, &options).expect("simulates").report;
    let budget_bytes = p.budget_bytes;
    let job =
        Job::new(model, Arc::new(g), Arc::new(p), ITERATIONS, arrival_s, 1.0).expect("valid job");
    let set = JobSet::new(budget_bytes, vec![job]).expect("valid set");
    let r = simulate_jobs(&set, &cost).expect("simulates");
    let case = format!("{model} / {planner} at {percent}%, arrival {arrival_s} s");
    let j = &r.jobs[0];
    assert_eq!(
        j.per_iteration_time_s, alone.per_iteration_time_s,
        "{case}: iteration times"
    );
    assert_eq!(
        r.peak_live_bytes, alone.peak_live_bytes,
        "{case}: global peak"
    );
    assert_eq!(j.peak_live_bytes, alone.peak_live_bytes, "{case}: job peak");
    assert_eq!(j.start_s, arrival_s, "{case}: start");
    let sum_s: f64 = alone.per_iteration_time_s.iter().sum();
    assert!(
        (j.finish_s - (arrival_s + sum_s)).abs() <= 1e-9 * sum_s,
        "{case}: finish {} vs {}",
        j.finish_s,
        arrival_s + sum_s
    );
    assert!(r.fits_budget, "{case}: a verified plan fits its own budget");
    // The last iteration's copies are the report's; all iterations copy alike.
    assert_eq!(
        j.swap_in_bytes,
        alone.swap_in_bytes * ITERATIONS as u64,
        "{case}"
    );
    assert_eq!(
        j.swap_out_bytes,
        alone.swap_out_bytes * ITERATIONS as u64,
        "{case}"
    );
    true
}

/// The lowest of `percents` at which `planner` plans `model`, checked.
fn check_lowest(model: &str, planner: &str, percents: &[u64]) -> Option<u64> {
    let percent = percents.iter().copied().find(|&percent| {
        let cost = cost();
        plan(&graph(model), &cost, planner, percent).is_some()
    })?;
    for arrival_s in [0.0, 2.5] {
        assert!(check(model, planner, percent, arrival_s));
    }
    Some(percent)
}

#[test]
fn one_job_simulates_as_simulate() {
    for model in ["tiny-cnn", "resnet18", "vgg16", "squeezenet-cifar"] {
        assert_eq!(check_lowest(model, "none", &[100]), Some(100), "{model}");
    }
    let below = [50, 60, 70, 80, 90];
    let mut swapping = 0;
    for model in ["resnet18", "squeezenet-cifar"] {
        for planner in ["checkpoint-sqrt", "vdnn-conv", "capuchin"] {
            // Every case must plan below the footprint, or it checks little.
            let percent = check_lowest(model, planner, &below);
            assert!(percent.is_some(), "{model} / {planner}: no plan below 100%");
            if planner != "checkpoint-sqrt" {
                let cost = cost();
                let g = graph(model);
                let p = plan(&g, &cost, planner, percent.unwrap_or(100)).expect("planned");
                let r = simulate(&g, &p, &cost, &SimOptions::default()).expect("simulates");
                swapping += usize::from(r.report.swap_in_bytes > 0);
            }
        }
    }
    // The swapping planners' plans must move data, or the links are not exercised.
    assert_eq!(swapping, 4, "only {swapping} of 4 swapping cases swap");
}
