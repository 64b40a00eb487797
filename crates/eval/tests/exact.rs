//! The evaluator's answers equal the full pipeline's (lower_schedule -> verify
//! -> simulate) on random DAGs and zoo models, with swap and recompute gaps, in
//! graph order and in random topological orders, within and over budget, under
//! the perfect and a real allocator, with one scratch reused across all of them;
//! and the screens (`evaluate_unless_slower`, `evaluate_within_budget`) answer
//! as `evaluate` wherever they do not screen.

use outcore_cost::{CostModel, DeviceProfile, RooflineModel};
use outcore_eval::testing::{
    mixed_schedule, random_decisions, random_graph, random_topological_order,
};
use outcore_eval::{Evaluation, Evaluator, Scratch, Screened, SimSummary};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{
    AllocatorSpec, PlannerInfo, Restore, Schedule, ViolationKind, lower_schedule, verify,
};
use outcore_sim::{SimOptions, simulate};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn info() -> PlannerInfo {
    PlannerInfo {
        name: "exact".into(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

fn v100() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin device"))
}

/// Evaluates `schedule` and checks every answer against the full pipeline.
fn assert_exact(
    g: &Graph,
    cost: &dyn CostModel,
    schedule: &Schedule,
    budget_bytes: u64,
    allocator: AllocatorSpec,
    scratch: &mut Scratch,
) -> Evaluation {
    let evaluator = Evaluator::new(g, cost, budget_bytes, allocator.clone());
    let got = evaluator.evaluate(schedule, scratch);
    let plan = match lower_schedule(g, schedule, info(), budget_bytes) {
        Ok(mut plan) => {
            plan.allocator = allocator;
            plan
        }
        Err(e) => {
            assert_eq!(got.schedule_error, Some(e));
            assert!(got.sim.is_none() && got.violations == 0);
            return got;
        }
    };
    assert_eq!(got.schedule_error, None);
    // The evaluator's full plan is the pipeline's plan.
    let mut lowered = evaluator.lower_plan(schedule, info()).expect("lowers");
    lowered.allocator = plan.allocator.clone();
    assert_eq!(lowered, plan);
    let violations = verify(&plan, g);
    assert_eq!(got.violations, violations.len());
    assert_eq!(got.first_violation.as_ref(), violations.first());
    let over: Vec<u64> = violations
        .iter()
        .filter_map(|v| match v.kind {
            ViolationKind::OverBudget { bytes, .. } => Some(bytes),
            _ => None,
        })
        .collect();
    let only_over_budget = over.len() == violations.len();
    assert_eq!(got.only_over_budget, only_over_budget);
    if let Some(&worst) = over.iter().max() {
        assert_eq!(
            got.bound.peak_bytes, worst,
            "the bound is verify's worst step"
        );
    } else {
        assert!(got.bound.peak_bytes <= budget_bytes);
    }
    if !only_over_budget {
        assert!(got.sim.is_none());
        return got;
    }
    let want = simulate(g, &plan, cost, &SimOptions::default())
        .map(|o| SimSummary::of(&o.report))
        .map_err(|e| e.to_string());
    assert_eq!(got.sim.as_ref(), Some(&want));
    assert_eq!(
        got.feasible(),
        violations.is_empty() && want.as_ref().is_ok_and(|s| s.oom.is_none())
    );
    got
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Each answer is the full pipeline's, and the screens answer as
    /// `assert_screens_exactly` says.
    #[test]
    fn random_dags_evaluate_exactly(
        layers in proptest::collection::vec(any::<u8>(), 3..24),
        decisions in proptest::collection::vec(any::<u8>(), 1..16),
        width in 8u64..64,
        order_seed in proptest::option::of(any::<u64>()),
        budget_percent in 20u64..130,
        best_fit in any::<bool>(),
        screen_at in 0.5f64..1.5,
    ) {
        let g = random_graph(&layers, width).expect("random graph");
        let order = match order_seed {
            Some(seed) => random_topological_order(&g, seed),
            None => Schedule::in_graph_order(&g).order,
        };
        let schedule = mixed_schedule(&g, order, &decisions);
        let budget_bytes = footprint(&g).0 * budget_percent / 100;
        let allocator = if best_fit {
            AllocatorSpec::BestFit(Default::default())
        } else {
            AllocatorSpec::Perfect
        };
        let mut scratch = Scratch::default();
        let full = assert_exact(&g, &v100(), &schedule, budget_bytes, allocator.clone(), &mut scratch);
        assert_screens_exactly(&g, &schedule, budget_bytes, allocator, &full, screen_at);
    }
}

/// `evaluate_within_budget` answers as `evaluate` (`full`) but for the
/// simulation of a schedule with violations, which it leaves out.
/// `evaluate_unless_slower` answers as `evaluate` wherever it does not
/// screen, and screens exactly the schedules simulated in `screen_at` times
/// their simulated time or more (a threshold below or above it), with that
/// time; under a real allocator it never screens.
fn assert_screens_exactly(
    g: &Graph,
    schedule: &Schedule,
    budget_bytes: u64,
    allocator: AllocatorSpec,
    full: &Evaluation,
    screen_at: f64,
) {
    let cost = v100();
    let evaluator = Evaluator::new(g, &cost, budget_bytes, allocator.clone());
    let mut scratch = Scratch::default();
    let mut unsimulated = full.clone();
    if unsimulated.violations > 0 {
        unsimulated.sim = None;
    }
    assert_eq!(
        evaluator.evaluate_within_budget(schedule, &mut scratch),
        unsimulated
    );
    // The time `evaluate` gives, or (not simulated there: unsafe) the
    // simulator's own.
    let sim_s = full.iter_time_s().or_else(|| {
        let plan = lower_schedule(g, schedule, info(), budget_bytes).ok()?;
        simulate(g, &plan, &cost, &SimOptions::default())
            .ok()
            .map(|o| o.report.iter_time_s)
    });
    let slower_from_s = sim_s.map_or(1.0, |t| t * screen_at);
    let got = evaluator.evaluate_unless_slower(schedule, &mut scratch, slower_from_s);
    match (sim_s, allocator) {
        (Some(t), AllocatorSpec::Perfect) if t >= slower_from_s => {
            assert_eq!(got, Screened::Slower { iter_time_s: t });
        }
        _ => assert_eq!(got, Screened::Evaluated(full.clone())),
    }
}

/// A zoo model name, its batch and knob overrides.
type ZooCase = (&'static str, u64, &'static [(&'static str, u64)]);

#[test]
fn zoo_models_evaluate_exactly_with_one_scratch() {
    let cost = v100();
    let mut scratch = Scratch::default();
    let mut feasible = 0;
    let mut over_budget = 0;
    let models: [ZooCase; 4] = [
        ("resnet50", 8, &[]),
        ("gpt2", 2, &[("layers", 2), ("seq", 64)]),
        ("nasnet", 2, &[("repeats", 2)]),
        ("densenet121", 4, &[]),
    ];
    for (name, batch, knobs) in models {
        let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let g = zoo::build(name, Some(batch), &knobs, None).expect("zoo model");
        let fp = footprint(&g).0;
        let (mut swaps, mut recomputes) = (0, 0);
        for seed in 0..3u64 {
            let order = if seed == 0 {
                Schedule::in_graph_order(&g).order
            } else {
                random_topological_order(&g, seed)
            };
            let schedule = mixed_schedule(&g, order, &random_decisions(32, seed));
            swaps += schedule
                .gaps
                .iter()
                .filter(|x| x.how == Restore::Swap)
                .count();
            recomputes += schedule
                .gaps
                .iter()
                .filter(|x| x.how == Restore::Recompute)
                .count();
            for budget_bytes in [fp, fp * 6 / 10, fp / 4] {
                let e = assert_exact(
                    &g,
                    &cost,
                    &schedule,
                    budget_bytes,
                    AllocatorSpec::Perfect,
                    &mut scratch,
                );
                if e.feasible() {
                    feasible += 1;
                } else if e.only_over_budget {
                    over_budget += 1;
                }
            }
        }
        assert!(
            swaps > 0 && recomputes > 0,
            "{name}: {swaps} swap and {recomputes} recompute gaps"
        );
    }
    // Both outcomes are exercised (a check that cannot pass vacuously).
    assert!(
        feasible > 0 && over_budget > 0,
        "{feasible} feasible, {over_budget} over budget"
    );
}

#[test]
fn broken_schedules_evaluate_exactly() {
    let g = random_graph(&[1, 0, 1, 2, 0, 1, 3, 0], 16).expect("random graph");
    let cost = v100();
    let mut scratch = Scratch::default();
    let base = mixed_schedule(&g, Schedule::in_graph_order(&g).order, &[1, 2, 1]);
    let budget_bytes = footprint(&g).0;
    // A schedule the lowering refuses: the order misses an op.
    let mut short = base.clone();
    short.order.pop();
    let e = assert_exact(
        &g,
        &cost,
        &short,
        budget_bytes,
        AllocatorSpec::Perfect,
        &mut scratch,
    );
    assert!(e.schedule_error.is_some() && e.is_broken());
    // A schedule that lowers but is unsafe: a weight starts on the host and
    // nothing brings it back before it is read.
    let weight = g
        .tensors
        .iter()
        .find(|t| t.is_persistent())
        .map(|t| t.id)
        .expect("the graph has weights");
    let mut unsafe_schedule = base.clone();
    unsafe_schedule
        .initial_residency
        .push((weight, outcore_plan::Residency::Host));
    let e = assert_exact(
        &g,
        &cost,
        &unsafe_schedule,
        budget_bytes,
        AllocatorSpec::Perfect,
        &mut scratch,
    );
    assert!(e.violations > 0 && !e.only_over_budget && e.is_broken() && !e.feasible());
}

/// The lowering caches what it derives from an op order (keyed by the
/// prepared graph and the order): one evaluator and one scratch scoring
/// schedules one after another in the same order, then in another order,
/// with another graph's evaluator using the same scratch in between, answer
/// each time exactly as a fresh scratch does.
#[test]
fn reused_scratch_answers_as_a_fresh_one_across_orders_and_graphs() {
    let cost = v100();
    let g = zoo::build("resnet18", Some(4), &BTreeMap::new(), None).expect("zoo model");
    let h = zoo::build("tiny-cnn", Some(4), &BTreeMap::new(), None).expect("zoo model");
    let ev_g = Evaluator::new(&g, &cost, footprint(&g).0 / 2, AllocatorSpec::Perfect);
    let ev_h = Evaluator::new(&h, &cost, footprint(&h).0 / 2, AllocatorSpec::Perfect);
    let orders_g = [
        Schedule::in_graph_order(&g).order,
        random_topological_order(&g, 1),
        random_topological_order(&g, 2),
    ];
    assert_ne!(orders_g[0], orders_g[1]);
    let mut shared = Scratch::default();
    let mut gapped = 0;
    for round in 0..2u64 {
        // Each order twice in a row (the second call finds it cached), and
        // each change of order right after another order was cached.
        for (i, order) in orders_g.iter().enumerate() {
            for repeat in 0..2u64 {
                let seed = round * 100 + i as u64 * 10 + repeat;
                let s = mixed_schedule(&g, order.clone(), &random_decisions(32, seed));
                gapped += s.gaps.len();
                let got = ev_g.evaluate(&s, &mut shared);
                assert_eq!(got, ev_g.evaluate(&s, &mut Scratch::default()), "{seed}");
            }
        }
        let s_h = mixed_schedule(
            &h,
            Schedule::in_graph_order(&h).order,
            &random_decisions(32, round),
        );
        let got_h = ev_h.evaluate(&s_h, &mut shared);
        assert_eq!(got_h, ev_h.evaluate(&s_h, &mut Scratch::default()));
    }
    assert!(gapped > 0, "the schedules have gaps");
}

/// Two graphs with as many ops (relu vs gelu chains: the same order, other
/// saved tensors) share one scratch: the cache key's graph id keeps one
/// graph's order analysis from answering for the other.
#[test]
fn reused_scratch_tells_graphs_with_the_same_order_apart() {
    let cost = v100();
    let a = random_graph(&[1, 5, 9, 13], 16).expect("graph");
    let b = random_graph(&[3, 7, 11, 15], 16).expect("graph");
    assert_eq!(a.ops.len(), b.ops.len());
    let ev_a = Evaluator::new(&a, &cost, footprint(&a).0 / 2, AllocatorSpec::Perfect);
    let ev_b = Evaluator::new(&b, &cost, footprint(&b).0 / 2, AllocatorSpec::Perfect);
    let mut shared = Scratch::default();
    for seed in 0..4u64 {
        for (g, ev) in [(&a, &ev_a), (&b, &ev_b)] {
            let s = mixed_schedule(
                g,
                Schedule::in_graph_order(g).order,
                &random_decisions(32, seed),
            );
            let got = ev.evaluate(&s, &mut shared);
            assert_eq!(got, ev.evaluate(&s, &mut Scratch::default()), "{seed}");
        }
    }
}
