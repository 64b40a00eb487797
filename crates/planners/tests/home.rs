//! The `home` planner: Algorithm 2 against the simulator on a hand graph under
//! the unit cost model (expected numbers derived in comments), policies
//! lowered to plans that verify, the plan independent of the thread count and
//! of repeated runs, the time limit, and infeasibility as a value.

use outcore_cost::{DeviceProfile, RooflineModel, UnitCostModel};
use outcore_eval::{Evaluator, Scratch as EvalScratch};
use outcore_graph::{
    DType, Graph, GraphMeta, Op, OpId, OpKind, Phase, Tensor, TensorId, TensorKind, footprint,
};
use outcore_plan::{
    AllocatorSpec, PlanOutcome, PlanRequest, Planner, PlannerInfo, ViolationKind, lower_schedule,
    random_topological_order, verify,
};
use outcore_planners::framework::Ctx;
use outcore_planners::home::estimate::{Algorithm2, Estimate, Scratch};
use outcore_planners::home::policy::{Action, PolicySpace};
use outcore_planners::home::pso::random_policy;
use outcore_planners::{Home, Scoring};
use outcore_sim::{SimOptions, simulate};

fn tensor(id: u32, size_bytes: u64, kind: TensorKind, producer: Option<u32>) -> Tensor {
    Tensor {
        id: TensorId(id),
        name: format!("t{id}"),
        shape: vec![size_bytes],
        dtype: DType::Uint8,
        size_bytes,
        kind,
        producer: producer.map(OpId),
        view_of: None,
        inplace_update_of: None,
        is_output: false,
    }
}

fn op(id: u32, phase: Phase, inputs: &[u32], output: u32, flops: u64) -> Op {
    Op {
        id: OpId(id),
        name: format!("op{id}"),
        kind: OpKind::Named { name: "k".into() },
        phase,
        inputs: inputs.iter().map(|&t| TensorId(t)).collect(),
        outputs: vec![TensorId(output)],
        flops,
        bytes_read: 0,
        bytes_written: 0,
        workspace_bytes: 0,
        recomputable: true,
        module: None,
    }
}

/// Four forward ops and their backward, one position each (op i at position i):
///
/// ```text
/// x (1 B) -F0(1 s)-> a0 (10 B) -F1(2 s)-> a1 (10 B) -F2(3 s)-> a2 (10 B) -F3(1 s)-> l (1 B)
/// B3(2 s): l, a2 -> g2;  B2(4 s): g2, a1 -> g1;  B1(4 s): g1, a0 -> g0;  B0(2 s): g0, x -> gx
/// ```
///
/// Under the unit model an op takes its FLOPs in seconds and a copy its bytes.
/// Ops end at 1, 3, 6, 7, 9, 13, 17, 19 s. Feature maps (read again after
/// forward, at least one op apart): x (last forward use 0, first backward
/// use 7), a0 (1, 6), a1 (2, 5); a2 is read by the very next op. Bytes
/// resident while each op runs, nothing swapped: 11, 21, 31, 32, 33, 23, 13, 3.
fn chain() -> Graph {
    use Phase::{Backward as B, Forward as F};
    use TensorKind::{Activation, Gradient, Input, Loss};
    Graph {
        meta: GraphMeta {
            model: "home-chain".into(),
            batch: 1,
            seq: None,
            optimizer: "none".into(),
            source: "test".into(),
        },
        tensors: vec![
            tensor(0, 1, Input, None),
            tensor(1, 10, Activation, Some(0)),
            tensor(2, 10, Activation, Some(1)),
            tensor(3, 10, Activation, Some(2)),
            tensor(4, 1, Loss, Some(3)),
            tensor(5, 1, Gradient, Some(4)),
            tensor(6, 1, Gradient, Some(5)),
            tensor(7, 1, Gradient, Some(6)),
            tensor(8, 1, Gradient, Some(7)),
        ],
        ops: vec![
            op(0, F, &[0], 1, 1),
            op(1, F, &[1], 2, 2),
            op(2, F, &[2], 3, 3),
            op(3, F, &[3], 4, 1),
            op(4, B, &[4, 3], 5, 2),
            op(5, B, &[5, 2], 6, 4),
            op(6, B, &[6, 1], 7, 4),
            op(7, B, &[7, 0], 8, 2),
        ],
    }
}

/// Algorithm 2's estimate of a policy at a capacity, and what the evaluator
/// and the full lower + simulate say of the same lowered policy.
struct Compared {
    estimate: Estimate,
    simulated_s: f64,
    evaluator_feasible: bool,
    evaluator_bound_bytes: u64,
}

fn compare_on_chain(policy: [Action; 3], capacity_bytes: u64) -> Compared {
    let g = chain();
    let cost = UnitCostModel;
    let ctx = Ctx::in_graph_order(&g, &cost);
    let model = Algorithm2::new(&ctx, &cost);
    let space = PolicySpace::new(&ctx);
    assert_eq!(
        space.feature_maps,
        vec![TensorId(0), TensorId(1), TensorId(2)]
    );
    let lowered = space.lower(&model, &policy, capacity_bytes, &mut Scratch::default());
    let schedule = ctx.schedule(lowered.gaps);
    let e = Evaluator::new(&g, &cost, capacity_bytes, AllocatorSpec::Perfect)
        .evaluate(&schedule, &mut EvalScratch::default());
    let info = PlannerInfo {
        name: "test".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let plan = lower_schedule(&g, &schedule, info, capacity_bytes).expect("lowers");
    let report = simulate(&g, &plan, &cost, &SimOptions::default())
        .expect("simulates")
        .report;
    Compared {
        estimate: lowered.estimate,
        simulated_s: report.iter_time_s,
        evaluator_feasible: e.feasible(),
        evaluator_bound_bytes: e.bound.peak_bytes,
    }
}

#[test]
fn algorithm2_matches_the_simulator_when_a_swap_must_be_synced() {
    use Action::{Retain, Swap};
    // a0 swapped, capacity 23 B. The prefetch is planned as late as the link
    // allows: B1 starts at 13 s, the copy takes 10 s, so it may start after
    // F1 (ends 3 s). The swap-out runs 3-13 s. At F2, 31 B > 23 B: the walk
    // syncs a0 there (line 8), F2 waits 3 -> 13 s (10 s sync stall), leaving
    // 21 B. The swap-in waits while its window does not fit (at F1: 21 + 10
    // + the 13 B F2..B2 allocate = 44 B) until B2, the op before its use:
    // 13 B resident + 10 B = 23 B. F2 13-16, F3 16-17, B3 17-19, B2 19-23;
    // the swap-in runs 23-33 (the link was idle), B1 waits to 33 (10 s swap
    // stall), runs to 37, B0 to 39. Peak 23 B (at B3: x, a1, a2, l, g2).
    let c = compare_on_chain([Retain, Swap, Retain], 23);
    assert_eq!(c.estimate.time_s, 39.0);
    assert_eq!(c.simulated_s, 39.0);
    assert_eq!(c.estimate.sync_stall_s, 10.0);
    assert_eq!(c.estimate.swap_stall_s, 10.0);
    assert_eq!(c.estimate.syncs, 1);
    assert_eq!(c.estimate.peak_bytes, 23);
    assert!(c.estimate.fits());
    assert!(c.evaluator_feasible);
    assert_eq!(c.evaluator_bound_bytes, 23);
    // One byte less: B3's own 23 B cannot shrink (nothing left to sync).
    let c = compare_on_chain([Retain, Swap, Retain], 22);
    assert_eq!(c.estimate.excess_bytes, 1);
    assert_eq!(c.estimate.over_at, Some(4));
    assert!(!c.evaluator_feasible);
}

#[test]
fn algorithm2_matches_the_simulator_on_a_recomputation() {
    use Action::{Recompute, Retain};
    // a1 recomputed from a0 (still resident) before B2: F1's 2 s again, so
    // 19 + 2 = 21 s. a1 is gone while F3 and B3 run: 32 - 10 and 33 - 10 B;
    // the peak stays F2's 31 B.
    let c = compare_on_chain([Retain, Retain, Recompute], 1 << 20);
    assert_eq!(c.estimate.time_s, 21.0);
    assert_eq!(c.simulated_s, 21.0);
    assert_eq!(c.estimate.recompute_s, 2.0);
    assert_eq!(c.estimate.peak_bytes, 31);
    assert_eq!(c.evaluator_bound_bytes, 31);
}

#[test]
fn algorithm2_matches_the_simulator_on_a_swapped_input_batch() {
    use Action::{Retain, Swap};
    // x's host copy is current: no swap-out, it is freed after F0. Its
    // prefetch (1 s) must end by B0's start (17 s): triggered after B2 (ends
    // 13 s), it arrives at 14 s, long before B0 needs it: 19 s, no stall.
    let c = compare_on_chain([Swap, Retain, Retain], 1 << 20);
    assert_eq!(c.estimate.time_s, 19.0);
    assert_eq!(c.simulated_s, 19.0);
    assert_eq!(c.estimate.swap_stall_s, 0.0);
    assert_eq!(c.estimate.syncs, 0);
}

fn v100() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"))
}

fn zoo(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    outcore_graph::zoo::build(name, Some(batch), &knobs, None).expect("zoo")
}

#[test]
fn random_policies_lower_to_plans_that_verify_and_algorithm2_is_conservative() {
    let cost = v100();
    let mut fits = 0;
    for g in [
        zoo("resnet18", 64, &[]),
        zoo("tiny-transformer", 32, &[("layers", 4)]),
    ] {
        let budget_bytes = footprint(&g).0 * 7 / 10;
        let random = random_topological_order(&g, 5);
        for order in [None, Some(random)] {
            let ctx = match order {
                Some(o) => Ctx::new(&g, &cost, o),
                None => Ctx::in_graph_order(&g, &cost),
            };
            let model = Algorithm2::new(&ctx, &cost);
            let space = PolicySpace::new(&ctx);
            assert!(!space.is_empty(), "{}", g.meta.model);
            let mut scratch = Scratch::default();
            let (floor_bytes, _) = space.floor_bytes(&ctx);
            let evaluator = Evaluator::new(&g, &cost, budget_bytes, AllocatorSpec::Perfect);
            // Twelve random policies, then every feature map swapped, then
            // every one recomputed where that is offered (swapped elsewhere):
            // the policies nearest the floor.
            let extremes = [Action::Swap, Action::Recompute].map(|wanted| {
                (0..space.len())
                    .map(|j| {
                        if space.actions(j).contains(&wanted) {
                            wanted
                        } else {
                            Action::Swap
                        }
                    })
                    .collect::<Vec<_>>()
            });
            for i in 0..14 {
                let policy = match i {
                    12 | 13 => extremes[i - 12].clone(),
                    _ => random_policy(&space, 9, i),
                };
                let lowered = space.lower(&model, &policy, budget_bytes, &mut scratch);
                // No policy needs less than the space's floor.
                let needed_bytes = evaluator
                    .evaluate(
                        &ctx.schedule(lowered.gaps.clone()),
                        &mut EvalScratch::default(),
                    )
                    .bound
                    .peak_bytes;
                assert!(
                    needed_bytes >= floor_bytes,
                    "{} policy {i}: needs {needed_bytes} B, below the floor {floor_bytes} B",
                    g.meta.model
                );
                let info = PlannerInfo {
                    name: "home-test".into(),
                    seed: None,
                    settings: serde_json::Value::Null,
                };
                let plan = lower_schedule(&g, &ctx.schedule(lowered.gaps), info, budget_bytes)
                    .expect("a lowered policy is a valid schedule");
                let violations = verify(&plan, &g);
                let unsafe_ones: Vec<_> = violations
                    .iter()
                    .filter(|v| !matches!(v.kind, ViolationKind::OverBudget { .. }))
                    .collect();
                assert!(
                    unsafe_ones.is_empty(),
                    "{} policy {i}: {}",
                    g.meta.model,
                    unsafe_ones[0]
                );
                // Algorithm 2's memory model counts at least what verify does
                // wherever it says a policy fits.
                if lowered.estimate.fits() {
                    fits += 1;
                    assert!(
                        violations.is_empty(),
                        "{} policy {i}: Algorithm 2 says it fits, verify: {}",
                        g.meta.model,
                        violations[0]
                    );
                }
                let sim = simulate(&g, &plan, &cost, &SimOptions::default())
                    .expect("simulates")
                    .report
                    .iter_time_s;
                let error = (lowered.estimate.time_s - sim).abs() / sim;
                // Measured: at most 1.1% on these (RESULTS.md lists zoo models).
                assert!(error < 0.05, "{} policy {i}: {error}", g.meta.model);
            }
        }
    }
    // Measured: 30 of the 48 random policies fit at 70%; the floor keeps the
    // check above meaningful.
    assert!(fits >= 20, "only {fits} policies fit");
}

/// The floor of the chain's policy space, derived by hand: feature maps x
/// (1 B, off strictly between positions 0 and 7), a0 (10 B, between 1 and
/// 6) and a1 (10 B, between 2 and 5). From the bytes resident with nothing
/// moved (11, 21, 31, 32, 33, 23, 13, 3): 11, 21 - 1, 31 - 1 - 10,
/// 32 - 21, 33 - 21, 23 - 11, 13 - 1, 3, so 20 B, first at position 1.
/// Below it `home` answers at once that no policy fits, naming the floor.
#[test]
fn the_floor_of_the_policy_space_rules_a_budget_out_before_the_search() {
    let g = chain();
    let cost = UnitCostModel;
    let ctx = Ctx::in_graph_order(&g, &cost);
    let space = PolicySpace::new(&ctx);
    assert_eq!(space.floor_bytes(&ctx), (20, 1));
    let request = PlanRequest::new(&g, &cost, 19);
    match Home::default().plan(&request) {
        Ok(PlanOutcome::Infeasible(why)) => {
            assert_eq!(why.needed_bytes, Some(20));
            assert_eq!(why.at.as_deref(), Some("op `op1`"));
            assert!(
                why.message
                    .contains("with every feature map off the device"),
                "{}",
                why.message
            );
        }
        other => panic!("expected infeasible below the floor, got {other:?}"),
    }
    // At the floor the search runs (and says so if it finds nothing).
    let request = PlanRequest::new(&g, &cost, 20);
    if let Ok(PlanOutcome::Infeasible(why)) = Home::default().plan(&request) {
        assert!(
            !why.message
                .contains("with every feature map off the device"),
            "{}",
            why.message
        );
    }
}

fn request<'a>(g: &'a Graph, cost: &'a RooflineModel, fraction: f64) -> PlanRequest<'a> {
    PlanRequest::new(g, cost, (footprint(g).0 as f64 * fraction) as u64)
}

fn feasible(outcome: Result<PlanOutcome, outcore_plan::PlannerError>) -> Box<outcore_plan::Plan> {
    match outcome {
        Ok(PlanOutcome::Feasible(p)) => p,
        Ok(PlanOutcome::Infeasible(why)) => panic!("infeasible: {why}"),
        Err(e) => panic!("{e}"),
    }
}

/// The defaults with a swarm of 32 instead of 512: the property tests below
/// are about determinism and limits, not plan quality, and keep their CI
/// time with the smaller swarm. (With 16, at seed 0 no start of ResNet-18
/// b64 fits 60%, so a search cut after its first round finds no plan.)
fn small_swarm() -> Home {
    Home {
        particles: 32,
        ..Home::default()
    }
}

#[test]
fn the_plan_is_the_same_for_any_thread_count_and_run() {
    let g = zoo("resnet18", 64, &[]);
    let cost = v100();
    let order = random_topological_order(&g, 2);
    for order in [None, Some(&order[..])] {
        let request = PlanRequest {
            order,
            seed: 11,
            ..request(&g, &cost, 0.6)
        };
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool")
                .install(|| feasible(small_swarm().plan(&request)))
        };
        let mut one = run(1);
        let mut four = run(4);
        let again = run(4);
        assert!(verify(&one, &g).is_empty());
        assert_eq!(four.streams, again.streams);
        // The recorded search time differs between runs; nothing else may.
        for p in [&mut one, &mut four] {
            if let Some(map) = p.planner.settings.as_object_mut() {
                map.remove("search_s");
            }
        }
        assert_eq!(one, four);
        let report = simulate(&g, &one, &cost, &SimOptions::default())
            .expect("simulates")
            .report;
        assert!(report.throughput_vs_ideal > 0.0 && report.throughput_vs_ideal <= 1.0);
    }
}

#[test]
fn every_scoring_gives_a_verified_plan_and_a_zero_time_limit_stops_after_one_round() {
    let g = zoo("resnet18", 64, &[]);
    let cost = v100();
    for scoring in [Scoring::Algorithm2, Scoring::Hybrid, Scoring::Evaluator] {
        // 32 particles: with fewer, whether a swarm of half-stratified starts
        // reaches a fitting policy at 60% depends on the seed (at seed 0, 12
        // and 16 stop 42 MiB over while 6 and 24 fit).
        let planner = Home {
            particles: 32,
            iterations: 4,
            scoring,
            ..Home::default()
        };
        let plan = feasible(planner.plan(&request(&g, &cost, 0.6)));
        assert!(verify(&plan, &g).is_empty(), "{scoring:?}");
        assert!(plan.planner.settings["iterations_run"].as_u64() >= Some(1));
    }
    let zero = PlanRequest {
        time_limit_s: 0.0,
        ..request(&g, &cost, 0.6)
    };
    let a = small_swarm().plan(&zero);
    let b = small_swarm().plan(&zero);
    let (a, b) = (feasible(a), feasible(b));
    assert_eq!(a.planner.settings["iterations_run"], 1);
    assert_eq!(a.planner.settings["stop"], "time_limit");
    assert_eq!(a.streams, b.streams);
}

#[test]
fn infeasible_is_a_value_with_a_reason() {
    // At 30% of resnet18 b32 the parameters, gradients and optimizer state
    // (which HOME does not place) and one backward op's working set leave no
    // room: every policy stays over the budget.
    let g = zoo("resnet18", 32, &[]);
    let cost = v100();
    match small_swarm().plan(&request(&g, &cost, 0.3)) {
        Ok(PlanOutcome::Infeasible(why)) => {
            assert!(why.message.starts_with("home: "), "{}", why.message);
            assert!(why.needed_bytes.is_some_and(|n| n > why.budget_bytes));
        }
        Ok(PlanOutcome::Feasible(_)) => panic!("a plan at 30%"),
        Err(e) => panic!("{e}"),
    }
    // A graph with nothing to place (no backward) fits as it is or not at all.
    let mut forward_only = chain();
    forward_only.ops.truncate(4);
    forward_only.tensors.truncate(5);
    let unit = UnitCostModel;
    let tiny = PlanRequest::new(&forward_only, &unit, 5);
    match Home::default().plan(&tiny) {
        Ok(PlanOutcome::Infeasible(why)) => assert!(!why.message.is_empty()),
        other => panic!("expected infeasible, got {other:?}"),
    }
}

/// Issue 12's fixed-batch check on HOME's Plain20 (CIFAR-10), where a swarm of
/// 16 fell behind: at 1.5x `none`'s maximum batch on HOME's RTX 2080 Ti under
/// its 11 GiB, the default `home` is at least as fast as every recompute-only
/// planner (the best single-method planners there; RESULTS.md, "HOME").
#[test]
fn default_home_beats_the_recompute_only_planners_on_plain20_cifar() {
    let g = zoo("plain20", 11410, &[]);
    let cost = RooflineModel::new(DeviceProfile::builtin("rtx2080ti-11gb").expect("profile"));
    let budget_bytes = cost.device.memory_bytes;
    let time_s = |planner: &dyn Planner| {
        let plan = feasible(planner.plan(&PlanRequest::new(&g, &cost, budget_bytes)));
        assert!(verify(&plan, &g).is_empty(), "{}", planner.name());
        simulate(&g, &plan, &cost, &SimOptions::default())
            .expect("simulates")
            .report
            .iter_time_s
    };
    let home_s = time_s(&Home::default());
    for name in ["dtr", "checkpoint-sqrt", "checkpoint-greedy"] {
        let other = outcore_planners::by_name(name).expect("registered");
        let other_s = time_s(other.as_ref());
        assert!(home_s <= other_s, "home {home_s} s vs {name} {other_s} s");
    }
}
