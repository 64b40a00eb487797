//! outcore's own planner against every other planner: on small zoo models at
//! 50% and 30% of the footprint it is feasible wherever one of them is, never
//! slower than any of them (simulated, within 0.5%), nor than the fast seeds
//! planned in the eager-update order, and the same seed gives the same plan;
//! the seeds that keep and swap only are skipped where the swap-only bound
//! rules their plans out, and none of them recomputes.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{
    Plan, PlanOutcome, PlanRequest, Planner, eager_update_order, graph_fingerprint, verify,
};
use outcore_planners::Joint;
use outcore_planners::joint::{EAGER_ORDER_SEEDS, SWAP_ONLY_SEEDS};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

fn graph(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    zoo::build(name, Some(batch), &knobs, None).expect("zoo model builds")
}

/// The tiny CNN most tests here plan (depth 8, width 8, batch 16) on
/// `v100-16gb-pcie3`, with 40% of its footprint as the budget.
fn tiny_cnn_at_40_percent() -> (Graph, RooflineModel, u64) {
    let g = graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]);
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let budget_bytes = footprint(&g).0 * 2 / 5;
    (g, cost, budget_bytes)
}

/// Bounded by move and kick counts, not the clock, so that the plan is the
/// same on every machine; SwapAdvisor's seed runs two generations of eight,
/// HOME's a swarm of 32 then one of 64 (its default 512 would be most of
/// this test's time).
fn bounded() -> Joint {
    Joint {
        max_kicks: 4,
        max_moves: 3_000,
        swapadvisor: outcore_planners::SwapAdvisor {
            population: 8,
            max_generations: Some(2),
            ..outcore_planners::SwapAdvisor::new(outcore_planners::swapadvisor::SearchSpace::Joint)
        },
        home: outcore_planners::Home {
            particles: 32,
            ..outcore_planners::Home::default()
        },
        home_runs: 2,
        ..Joint::default()
    }
}

/// A request no run reaches the time limit of.
fn request<'a>(g: &'a Graph, cost: &'a RooflineModel, budget_bytes: u64) -> PlanRequest<'a> {
    PlanRequest {
        time_limit_s: 3600.0,
        ..PlanRequest::new(g, cost, budget_bytes)
    }
}

fn simulated_s(g: &Graph, plan: &Plan, cost: &RooflineModel) -> f64 {
    let out = simulate(g, plan, cost, &SimOptions::default()).expect("a verified plan simulates");
    assert!(
        out.report.oom.is_none(),
        "{}: out of memory",
        plan.planner.name
    );
    out.report.iter_time_s
}

fn check_not_slower(g: &Graph, fraction: f64) {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let (fp, _) = footprint(g);
    let budget = (fp as f64 * fraction) as u64;
    let what = format!("{} at {fraction}", g.meta.model);
    let ours = match bounded().plan(&request(g, &cost, budget)) {
        Ok(PlanOutcome::Feasible(p)) => Some(*p),
        Ok(PlanOutcome::Infeasible(_)) => None,
        Err(e) => panic!("outcore on {what}: {e}"),
    };
    if let Some(plan) = &ours {
        let v = verify(plan, g);
        assert!(v.is_empty(), "outcore on {what}: {}", v[0]);
        assert_eq!(plan.planner.name, "outcore");
    }
    let ours_s = ours.as_ref().map(|p| simulated_s(g, p, &cost));
    for planner in outcore_planners::all() {
        if matches!(planner.name(), "outcore" | "ideal") {
            continue;
        }
        let planner: Box<dyn Planner> = match planner.name() {
            "swapadvisor" => Box::new(bounded().swapadvisor),
            "home" => Box::new(bounded().home),
            _ => planner,
        };
        let Ok(PlanOutcome::Feasible(theirs)) = planner.plan(&request(g, &cost, budget)) else {
            continue;
        };
        let theirs_s = simulated_s(g, &theirs, &cost);
        let Some(ours_s) = ours_s else {
            panic!("outcore found no plan on {what}, {} did", planner.name());
        };
        assert!(
            ours_s <= theirs_s * 1.005,
            "outcore on {what}: {ours_s} s, slower than {} at {theirs_s} s",
            planner.name()
        );
    }
    // Nor slower than the eager-order seeds' own plans (they are seeds too).
    let eager = eager_update_order(g);
    assert!(
        eager.iter().enumerate().any(|(i, op)| op.index() != i),
        "{what}: the eager order is the graph's, so this part tests nothing"
    );
    let mut eager_feasible = 0;
    for name in EAGER_ORDER_SEEDS {
        let planner = outcore_planners::by_name(name).expect("a planner of the list");
        let req = PlanRequest {
            order: Some(&eager),
            ..request(g, &cost, budget)
        };
        let Ok(PlanOutcome::Feasible(theirs)) = planner.plan(&req) else {
            continue;
        };
        eager_feasible += 1;
        let theirs_s = simulated_s(g, &theirs, &cost);
        let ours_s = ours_s.unwrap_or_else(|| {
            panic!("outcore found no plan on {what}, {name} in the eager order did")
        });
        assert!(
            ours_s <= theirs_s * 1.005,
            "outcore on {what}: {ours_s} s, slower than {name} in the eager order at {theirs_s} s"
        );
    }
    if let Some(plan) = &ours
        && eager_feasible > 0
    {
        let seeds = plan.planner.settings["seeds"].to_string();
        assert!(seeds.contains("(eager order)"), "{what}: seeds {seeds}");
    }
}

#[test]
fn not_slower_than_any_planner_on_a_tiny_cnn() {
    let g = graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]);
    check_not_slower(&g, 0.5);
    check_not_slower(&g, 0.3);
}

#[test]
fn not_slower_than_any_planner_on_a_tiny_transformer() {
    let g = graph("tiny-transformer", 32, &[("layers", 8)]);
    check_not_slower(&g, 0.5);
    check_not_slower(&g, 0.3);
}

#[test]
fn the_same_seed_gives_the_same_plan() {
    let (g, cost, budget_bytes) = tiny_cnn_at_40_percent();
    let plan = || match bounded().plan(&request(&g, &cost, budget_bytes)) {
        Ok(PlanOutcome::Feasible(p)) => p,
        other => panic!("outcore on tiny-cnn at 40%: {other:?}"),
    };
    let (a, b) = (plan(), plan());
    assert_eq!(a.streams, b.streams);
    assert_eq!(a.planner.settings, b.planner.settings);
}

/// Bounded by moves ([`Joint::bounded_by_moves`]) the search does not read
/// the request's time limit: a microsecond and an hour give the same plan,
/// and the plan records the move count that bounded it.
#[test]
fn bounded_by_moves_the_time_limit_is_not_read() {
    let (g, cost, budget_bytes) = tiny_cnn_at_40_percent();
    let joint = bounded().bounded_by_moves(300);
    let plan = |time_limit_s: f64| {
        let request = PlanRequest {
            time_limit_s,
            ..PlanRequest::new(&g, &cost, budget_bytes)
        };
        match joint.plan(&request) {
            Ok(PlanOutcome::Feasible(p)) => p,
            other => panic!("outcore on tiny-cnn at 40%, {time_limit_s} s: {other:?}"),
        }
    };
    let (a, b) = (plan(1e-6), plan(3600.0));
    assert_eq!(a.streams, b.streams);
    assert_eq!(a.planner.settings, b.planner.settings);
    assert_eq!(a.planner.settings["bounded_by"]["moves_per_start"], 300);
    // The count is checked after each parallel batch: a phase ends at the
    // first batch that reaches it. (The early-out entry scores no moves and
    // has no count.)
    let phases: Vec<_> = a.planner.settings["local_search"]
        .as_array()
        .expect("the search's phases")
        .iter()
        .filter(|phase| phase.get("early_out_states").is_none())
        .collect();
    assert!(!phases.is_empty());
    for phase in phases {
        let scored = phase["moves_scored"].as_u64().expect("moves_scored");
        assert!(
            scored < 300 + outcore_planners::joint::local::BATCH as u64,
            "{scored} moves: {phase}"
        );
    }
}

/// Bounded by moves the plan does not depend on how many threads score
/// the moves either: rayon pools of 1 and 4 threads give the same plan
/// (each parallel batch's results are judged in the candidates' order).
#[test]
fn bounded_by_moves_the_thread_count_does_not_change_the_plan() {
    let (g, cost, budget_bytes) = tiny_cnn_at_40_percent();
    let joint = bounded().bounded_by_moves(300);
    let plan = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a rayon pool");
        match pool.install(|| joint.plan(&PlanRequest::new(&g, &cost, budget_bytes))) {
            Ok(PlanOutcome::Feasible(p)) => p,
            other => panic!("outcore on tiny-cnn at 40%, {threads} threads: {other:?}"),
        }
    };
    let (one, four) = (plan(1), plan(4));
    assert_eq!(one.streams, four.streams);
    assert_eq!(one.planner.settings, four.planner.settings);
}

/// The joint planner computes the graph's fingerprint once and hands it to
/// every seed and search (`PlanRequest::fingerprint`): the plan carries the
/// graph's own, and a request that brings it gets the same plan.
#[test]
fn the_plan_carries_the_graphs_fingerprint() {
    let (g, cost, budget_bytes) = tiny_cnn_at_40_percent();
    let fingerprint = graph_fingerprint(&g);
    let plan = |request: &PlanRequest<'_>| match bounded().plan(request) {
        Ok(PlanOutcome::Feasible(p)) => p,
        other => panic!("outcore on tiny-cnn at 40%: {other:?}"),
    };
    let asked = request(&g, &cost, budget_bytes);
    let computed = plan(&asked);
    let given = plan(&PlanRequest {
        fingerprint: Some(&fingerprint),
        ..asked
    });
    assert_eq!(computed.graph.fingerprint, fingerprint);
    assert!(computed.check_graph(&g).is_ok());
    assert_eq!(computed.streams, given.streams);
    assert_eq!(given.graph.fingerprint, fingerprint);
}

/// HOME runs inside `outcore` as restarts with a doubling swarm, each with the
/// next seed, and every run's plan is a seed; with no time limit in reach,
/// `home_runs` bounds them.
#[test]
fn home_restarts_double_the_swarm_up_to_their_bound() {
    let (g, cost, budget_bytes) = tiny_cnn_at_40_percent();
    let joint = Joint {
        home_runs: 3,
        ..bounded()
    };
    let plan = match joint.plan(&request(&g, &cost, budget_bytes)) {
        Ok(PlanOutcome::Feasible(p)) => p,
        other => panic!("outcore on tiny-cnn at 40%: {other:?}"),
    };
    let seeds: Vec<String> = plan.planner.settings["seeds"]
        .as_array()
        .expect("the seeds' summary")
        .iter()
        .filter_map(|s| s["planner"].as_str())
        .filter(|name| name.starts_with("home"))
        .map(str::to_string)
        .collect();
    let mut seeds_sorted = seeds.clone();
    seeds_sorted.sort();
    assert_eq!(
        seeds_sorted,
        [
            "home (128 particles, seed +2)",
            "home (32 particles, seed +0)",
            "home (64 particles, seed +1)"
        ],
        "HOME's runs among the seeds: {seeds:?}"
    );
}

/// The seeds that keep and swap only are skipped where the swap-only lower
/// bound says their plans could not be among the local search's starts:
/// slower than the third-fastest seed family. DenseNet-121 at batch 4 and a
/// quarter of its footprint is such a case (the bound about twice the
/// third family's seed); the skips are recorded, `swapadvisor` among them,
/// the bound holds for `swapadvisor`'s own plan, and `outcore`'s plan is no
/// slower than that family's seed.
#[test]
fn swap_only_seeds_are_skipped_where_the_swap_only_bound_rules_them_out() {
    let g = graph("densenet121", 4, &[]);
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let (fp, _) = footprint(&g);
    let budget = fp / 4;
    let joint = Joint {
        max_moves: 30,
        max_kicks: 0,
        ..bounded()
    };
    let plan = match joint.plan(&request(&g, &cost, budget)) {
        Ok(PlanOutcome::Feasible(p)) => *p,
        other => panic!("outcore on densenet121 b4 at 25%: {other:?}"),
    };
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let settings = &plan.planner.settings;
    let skipped = settings["seeds_skipped"].as_array().expect("a list");
    assert!(
        skipped.iter().any(|s| s["planner"] == "swapadvisor"),
        "{skipped:?}"
    );
    let seeds = settings["seeds"].as_array().expect("a list");
    let mut floor_s = f64::INFINITY;
    let mut bound_s = 0.0;
    for s in skipped {
        let name = s["planner"].as_str().expect("a name");
        let planner = name.split_whitespace().next().expect("a word");
        assert!(SWAP_ONLY_SEEDS.contains(&planner), "{name}");
        bound_s = s["swap_only_bound_s"].as_f64().expect("the bound");
        let floor = s["start_floor_s"].as_f64().expect("the floor");
        assert!(bound_s > floor, "{s:?}");
        floor_s = f64::min(floor_s, floor);
        assert!(
            seeds.iter().all(|x| x["planner"] != name),
            "{name} in {seeds:?}"
        );
    }
    let ours_s = simulated_s(&g, &plan, &cost);
    assert!(ours_s <= floor_s * 1.005, "{ours_s} s against {floor_s} s");
    if let Ok(PlanOutcome::Feasible(theirs)) =
        bounded().swapadvisor.plan(&request(&g, &cost, budget))
    {
        let theirs_s = simulated_s(&g, &theirs, &cost);
        assert!(
            theirs_s >= bound_s * (1.0 - 1e-9),
            "{theirs_s} s below the bound {bound_s} s"
        );
    }
}

/// What makes skipping them sound: the seeds of `SWAP_ONLY_SEEDS` keep and
/// swap only, so no plan of theirs recomputes (one that did could beat the
/// swap-only bound).
#[test]
fn the_swap_only_seeds_never_recompute() {
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
    let cases = [
        (graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]), 0.3),
        (graph("tiny-transformer", 32, &[("layers", 8)]), 0.3),
        (graph("densenet121", 4, &[]), 0.25),
    ];
    for (g, fraction) in &cases {
        let (fp, _) = footprint(g);
        let budget = (fp as f64 * fraction) as u64;
        let mut planned = 0;
        for name in SWAP_ONLY_SEEDS {
            let planner: Box<dyn Planner> = match name {
                "swapadvisor" => Box::new(bounded().swapadvisor),
                _ => outcore_planners::by_name(name).expect("a planner of the list"),
            };
            let Ok(PlanOutcome::Feasible(plan)) = planner.plan(&request(g, &cost, budget)) else {
                continue;
            };
            planned += 1;
            let out = simulate(g, &plan, &cost, &SimOptions::default()).expect("simulates");
            assert_eq!(
                out.report.recompute_time_s, 0.0,
                "{name} recomputes on {}",
                g.meta.model
            );
        }
        assert!(planned >= 3, "{} planned on {}", planned, g.meta.model);
    }
}
