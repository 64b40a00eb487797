//! `dtr` and the exact recompute-only reference `checkmate-milp` (issue 10):
//! DTR's plans verify, never swap, fit the budget or say why not, and are the
//! same on every run, in graph and random orders; the reference refuses large
//! graphs, reports infeasibility and time-outs as values, and its proven
//! optimum is at most every recompute-only heuristic's recomputation time on
//! small graphs (a check of both sides), with a plan that verifies.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_eval::testing::random_graph_batch;
use outcore_graph::{Graph, OpId, footprint, zoo};
use outcore_plan::{
    InfeasibleKind, Instr, Plan, PlanOutcome, PlanRequest, Planner, PlannerErrorKind,
    random_topological_order, verify,
};
use outcore_planners::framework::Ctx;
use outcore_planners::{CheckmateMilp, Dtr, MILP_MAX_OPS, MilpAnswer, solve_recompute_milp};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

fn cost() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"))
}

fn zoo_graph(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|&(k, v)| (k.into(), v)).collect();
    zoo::build(name, Some(batch), &knobs, None).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Small DAGs whose activations dominate (batch 256 over width 64).
fn random_dags() -> Vec<Graph> {
    let choices: [&[u8]; 3] = [
        &[0, 1, 4, 2, 9, 3, 17, 5, 6, 33],
        &[8, 13, 2, 1, 21, 7, 4, 0, 18, 3, 2, 41],
        &[1, 5, 9, 13, 2, 6, 10, 14, 3, 11],
    ];
    choices
        .iter()
        .map(|c| random_graph_batch(c, 64, 256).expect("valid random graph"))
        .collect()
}

fn budget(g: &Graph, fraction: f64) -> u64 {
    (footprint(g).0 as f64 * fraction) as u64
}

fn plan_with(
    planner: &dyn Planner,
    g: &Graph,
    budget_bytes: u64,
    order: Option<&[OpId]>,
    time_limit_s: f64,
) -> PlanOutcome {
    let cost = cost();
    let request = PlanRequest {
        order,
        time_limit_s,
        ..PlanRequest::new(g, &cost, budget_bytes)
    };
    planner
        .plan(&request)
        .unwrap_or_else(|e| panic!("{} errs: {e}", planner.name()))
}

fn iter_time_s(g: &Graph, plan: &Plan) -> f64 {
    simulate(g, plan, &cost(), &SimOptions::default())
        .expect("simulates")
        .report
        .iter_time_s
}

fn recomputations(plan: &Plan) -> usize {
    plan.streams
        .iter()
        .flatten()
        .filter(|s| matches!(s.instr, Instr::Recompute { .. }))
        .count()
}

fn swaps(plan: &Plan) -> usize {
    plan.streams
        .iter()
        .flatten()
        .filter(|s| matches!(s.instr, Instr::SwapIn(_) | Instr::SwapOut(_)))
        .count()
}

/// Verified, within budget, no swap; returns the simulated recomputation time.
fn check_recompute_only(what: &str, g: &Graph, plan: &Plan, budget_bytes: u64) -> f64 {
    let violations = verify(plan, g);
    assert!(violations.is_empty(), "{what}: {}", violations[0]);
    assert_eq!(swaps(plan), 0, "{what} swaps");
    let report = simulate(g, plan, &cost(), &SimOptions::default())
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .report;
    assert!(
        report.peak_live_bytes <= budget_bytes,
        "{what}: peak {} over the budget {budget_bytes}",
        report.peak_live_bytes
    );
    report.recompute_time_s
}

#[test]
fn dtr_plans_verify_fit_and_are_reproducible() {
    // Activation-heavy settings, so that recomputation has something to do;
    // budgets per graph as fractions of its footprint.
    let zoo_budgets = [0.8, 0.6, 0.4];
    let mut graphs: Vec<(String, Graph, [f64; 3])> = vec![
        (
            "tiny-cnn b64".into(),
            zoo_graph("tiny-cnn", 64, &[]),
            zoo_budgets,
        ),
        (
            "resnet18 b32".into(),
            zoo_graph("resnet18", 32, &[]),
            zoo_budgets,
        ),
        (
            "lstm".into(),
            zoo_graph("lstm", 256, &[("hidden", 256), ("seq", 16), ("vocab", 500)]),
            zoo_budgets,
        ),
        (
            "tiny-transformer b128".into(),
            zoo_graph("tiny-transformer", 128, &[]),
            zoo_budgets,
        ),
    ];
    for (i, g) in random_dags().into_iter().enumerate() {
        graphs.push((format!("random DAG {i}"), g, [0.95, 0.85, 0.75]));
    }
    let (mut feasible, mut infeasible, mut recomputing) = (0, 0, 0);
    for (name, g, fractions) in &graphs {
        let shuffled = random_topological_order(g, 3);
        for &fraction in fractions {
            let budget_bytes = budget(g, fraction);
            for (order_name, order) in [("graph", None), ("random", Some(&shuffled[..]))] {
                let what = format!("dtr on {name} at {fraction} in {order_name} order");
                let first = plan_with(&Dtr, g, budget_bytes, order, 60.0);
                eprintln!(
                    "{what}: {}",
                    match &first {
                        PlanOutcome::Feasible(p) => format!("{} recomputations", recomputations(p)),
                        PlanOutcome::Infeasible(why) => why.message.clone(),
                    }
                );
                let again = plan_with(&Dtr, g, budget_bytes, order, 60.0);
                match (&first, &again) {
                    (PlanOutcome::Feasible(a), PlanOutcome::Feasible(b)) => {
                        assert_eq!(a, b, "{what}: two runs differ");
                        check_recompute_only(&what, g, a, budget_bytes);
                        feasible += 1;
                        recomputing += usize::from(recomputations(a) > 0);
                    }
                    (PlanOutcome::Infeasible(a), PlanOutcome::Infeasible(b)) => {
                        assert_eq!(a, b, "{what}: two runs differ");
                        assert_eq!(a.kind, InfeasibleKind::OverBudget, "{what}: {a}");
                        assert!(
                            a.needed_bytes.is_some_and(|n| n > budget_bytes),
                            "{what}: {a:?}"
                        );
                        assert!(a.message.contains("DTR needs"), "{what}: {a}");
                        infeasible += 1;
                    }
                    _ => panic!("{what}: one run feasible, the other not"),
                }
            }
        }
    }
    // Measured: 34 feasible and 8 infeasible of 42; every feasible plan
    // recomputes something.
    assert!(feasible >= 30, "only {feasible} feasible runs");
    assert!(
        infeasible >= 1,
        "no budget was too small: the check of infeasibility ran on nothing"
    );
    assert!(recomputing >= 30, "only {recomputing} plans recompute");
}

#[test]
fn dtr_spends_less_recomputation_with_more_memory() {
    // A budget-aware planner: on ResNet-18 and an LSTM, recomputation time
    // never rises as the budget grows, and it is zero at the footprint.
    for (name, g) in [
        ("resnet18 b16", zoo_graph("resnet18", 16, &[])),
        (
            "lstm",
            zoo_graph("lstm", 64, &[("hidden", 256), ("seq", 8), ("vocab", 500)]),
        ),
    ] {
        let mut previous: Option<f64> = None;
        for fraction in [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0] {
            let budget_bytes = budget(&g, fraction);
            let what = format!("dtr on {name} at {fraction}");
            let PlanOutcome::Feasible(plan) = plan_with(&Dtr, &g, budget_bytes, None, 60.0) else {
                assert!(
                    previous.is_none(),
                    "{what}: infeasible above a feasible budget"
                );
                continue;
            };
            let recompute_s = check_recompute_only(&what, &g, &plan, budget_bytes);
            if let Some(p) = previous {
                assert!(recompute_s <= p + 1e-12, "{what}: {recompute_s} s > {p} s");
            }
            if fraction == 1.0 {
                assert_eq!(recompute_s, 0.0, "{what} recomputes at the footprint");
            }
            previous = Some(recompute_s);
        }
        assert!(previous.is_some(), "{name}: never feasible");
    }
}

#[test]
fn the_reference_refuses_graphs_over_its_limit() {
    let g = zoo_graph("resnet18", 2, &[]);
    assert!(g.ops.len() > MILP_MAX_OPS);
    let cost = cost();
    let request = PlanRequest::new(&g, &cost, budget(&g, 0.5));
    let err = CheckmateMilp.plan(&request).expect_err("refused");
    assert_eq!(err.kind, PlannerErrorKind::InvalidRequest);
    assert!(
        err.message.contains(&g.ops.len().to_string()) && err.message.contains("100"),
        "{err}"
    );
    // Reachable by name, though not in `all()`.
    assert!(outcore_planners::by_name("checkmate-milp").is_ok());
    assert!(!outcore_planners::names().contains(&"checkmate-milp"));
}

#[test]
fn the_reference_reports_infeasibility_and_time_outs_as_values() {
    let g = &random_dags()[2];
    let cost = cost();
    // Far below what persistent tensors alone take.
    let tiny = footprint(g).0 / 20;
    match plan_with(&CheckmateMilp, g, tiny, None, 10.0) {
        PlanOutcome::Infeasible(why) => {
            assert_eq!(why.kind, InfeasibleKind::OverBudget, "{why}");
            assert!(why.message.contains("checkmate-milp"), "{why}");
        }
        PlanOutcome::Feasible(_) => panic!("a plan within 5% of the footprint"),
    }
    // No time at all: no proof; either no solution or DTR's incumbent.
    let ctx = Ctx::in_graph_order(g, &cost);
    match solve_recompute_milp(&ctx, budget(g, 0.9), 0.0).expect("solves") {
        MilpAnswer::NoSolutionWithinTimeLimit { time_limit_s, .. } => {
            assert_eq!(time_limit_s, 0.0)
        }
        MilpAnswer::Solved(s) => assert!(!s.proven_optimal, "proven in no time"),
        MilpAnswer::Infeasible { message, .. } => panic!("infeasible: {message}"),
    }
}

/// The graphs and budgets on which the reference proves its optimum quickly
/// (measured: each well under a second in a release build).
fn reference_cases() -> Vec<(String, Graph, f64)> {
    let mut out = Vec::new();
    let cnn = zoo_graph("tiny-cnn", 32, &[]);
    // At 0.62 the optimum recomputes both outputs of one producer in one
    // step (a shared run: see `checkmate`'s module docs).
    for fraction in [0.87, 0.75, 0.62] {
        out.push(("tiny-cnn".to_string(), cnn.clone(), fraction));
    }
    for (i, g) in random_dags().into_iter().enumerate() {
        for fraction in [0.95, 0.87] {
            out.push((format!("random DAG {i}"), g.clone(), fraction));
        }
    }
    out
}

/// `outcore-recompute` bounded by move and kick counts, so that its plan is
/// the same on every machine.
fn bounded_outcore_recompute() -> outcore_planners::Joint {
    outcore_planners::Joint {
        max_kicks: 8,
        max_moves: 4_000,
        ..outcore_planners::Joint::recompute_only()
    }
}

#[test]
fn the_proven_optimum_bounds_every_recompute_heuristic() {
    let mut heuristics: Vec<Box<dyn Planner>> = outcore_planners::all()
        .into_iter()
        .filter(|p| p.name() == "dtr" || p.name().starts_with("checkpoint"))
        .collect();
    heuristics.push(Box::new(bounded_outcore_recompute()));
    assert!(heuristics.len() >= 4);
    let (mut compared, mut strictly_better) = (0, 0);
    for (name, g, fraction) in reference_cases() {
        let budget_bytes = budget(&g, fraction);
        let what = format!("checkmate-milp on {name} at {fraction}");
        let PlanOutcome::Feasible(plan) = plan_with(&CheckmateMilp, &g, budget_bytes, None, 60.0)
        else {
            panic!("{what}: infeasible");
        };
        assert_eq!(
            plan.planner.settings["proven_optimal"].as_bool(),
            Some(true),
            "{what}: not proven within the time limit"
        );
        assert_eq!(
            plan.planner.settings["milp"]["tiny_pinned"].as_u64(),
            Some(0),
            "{what}: storage pinned for being tiny; the optimum may be over-constrained"
        );
        let optimum_s = check_recompute_only(&what, &g, &plan, budget_bytes);
        let claimed_s = plan.planner.settings["recompute_time_s"]
            .as_f64()
            .expect("recorded");
        assert!(
            (optimum_s - claimed_s).abs() <= 1e-9 * (1.0 + claimed_s),
            "{what}: simulated {optimum_s} s, claimed {claimed_s} s"
        );
        let optimum_iter_s = iter_time_s(&g, &plan);
        let mut best_iter_s = f64::INFINITY;
        for h in &heuristics {
            let hwhat = format!("{} on {name} at {fraction}", h.name());
            let PlanOutcome::Feasible(hp) = plan_with(h.as_ref(), &g, budget_bytes, None, 60.0)
            else {
                continue;
            };
            let heuristic_s = check_recompute_only(&hwhat, &g, &hp, budget_bytes);
            assert!(
                optimum_s <= heuristic_s + 1e-12,
                "{what}: the optimum {optimum_s} s exceeds {hwhat}'s {heuristic_s} s"
            );
            best_iter_s = best_iter_s.min(iter_time_s(&g, &hp));
            compared += 1;
            strictly_better += usize::from(optimum_s < heuristic_s - 1e-12);
        }
        // Issue 10: the best recompute-only heuristic within 5% of the exact
        // reference (in iteration time) wherever the reference proves one.
        assert!(
            best_iter_s <= optimum_iter_s * 1.05,
            "{what}: the best heuristic's {best_iter_s} s is over 5% above the optimum's {optimum_iter_s} s"
        );
    }
    assert!(compared >= 8, "only {compared} comparisons");
    // The reference beats DTR somewhere (measured: on random DAG 2 and on
    // tiny-cnn), so the bound is not met by the reference merely copying its
    // DTR warm start.
    assert!(strictly_better >= 1, "the optimum never beats a heuristic");
}

#[test]
fn the_reference_plans_a_random_order() {
    let g = &random_dags()[2];
    let order = random_topological_order(g, 5);
    let budget_bytes = budget(g, 0.9);
    match plan_with(&CheckmateMilp, g, budget_bytes, Some(&order), 60.0) {
        PlanOutcome::Feasible(plan) => {
            check_recompute_only("checkmate-milp in a random order", g, &plan, budget_bytes);
        }
        PlanOutcome::Infeasible(why) => {
            // DTR must then be infeasible in that order too.
            assert!(
                plan_with(&Dtr, g, budget_bytes, Some(&order), 60.0)
                    .plan()
                    .is_none(),
                "the reference is infeasible where dtr is not: {why}"
            );
        }
    }
}
