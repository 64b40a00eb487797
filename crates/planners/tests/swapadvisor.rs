//! SwapAdvisor (paper 000): the swap planner's safety under its own pool on
//! random orders and pools, the paper's Fig. 3 example, its victim when none
//! is free in time, the genetic operators' invariants on real graphs, and the
//! planner's contract (plans verify and run under the pool they carry, the
//! same seed gives the same plan for any number of threads, the limits stop
//! the search, the ablations keep their fixed half).

use outcore_alloc::{SizeClassConfig, SizeClassSpec};
use outcore_cost::{DeviceProfile, RooflineModel, UnitCostModel};
use outcore_eval::{Evaluator, Scratch};
use outcore_graph::{
    DType, Graph, GraphMeta, Op, OpId, OpKind, Phase, Tensor, TensorId, TensorKind, footprint,
};
use outcore_plan::{
    AllocatorSpec, Gap, Instr, Plan, PlanOutcome, PlanRequest, Planner, Schedule, Stream,
    check_order, eager_update_order, framework_default_order, random_topological_order, verify,
};
use outcore_planners::swapadvisor::{
    Adaptation, AllocGene, Breeder, Dag, Facts, FixedOrder, PoolModel, SearchSpace, SizeDemand,
    SwapAdvisor, cls_valid, plan_first_pass, plan_swaps, tensor_sizes,
};
use outcore_sim::{SimOptions, simulate};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

fn v100() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"))
}

fn zoo(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    outcore_graph::zoo::build(name, Some(batch), &knobs, None).expect("zoo model builds")
}

/// Small graphs of different shapes: a CNN, a transformer, an unrolled RNN, a
/// branchy CNN.
fn small_graphs() -> Vec<Graph> {
    vec![
        zoo("tiny-cnn", 16, &[("depth", 4)]),
        zoo("tiny-transformer", 16, &[]),
        zoo("lstm", 8, &[("layers", 2), ("hidden", 256), ("seq", 6)]),
        zoo("resnet18", 8, &[]),
        zoo("inception_v3", 4, &[]),
    ]
}

fn encoding_config(ts: &[u64], gene: &AllocGene) -> SizeClassConfig {
    SizeClassConfig {
        classes: Vec::new(),
        encoding: Some(outcore_alloc::SizeClassEncoding {
            tensor_sizes_bytes: ts.to_vec(),
            cls: gene.cls.clone(),
            cnt: gene.cnt.clone(),
        }),
    }
}

/// The swap planner's claim (module doc of `swap_planner`): whenever it
/// plans, the plan passes `verify()` within the budget and never fails in its
/// pool, on random orders and random pools that fit the budget.
#[test]
fn swap_plans_verify_and_fit_their_pool_on_random_orders_and_pools() {
    let cost = v100();
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let (mut planned, mut short, mut delayed) = (0usize, 0usize, 0usize);
    for g in small_graphs() {
        let (fp, _) = footprint(&g);
        let ts = tensor_sizes(&g);
        let demand = SizeDemand::new(&g, &ts);
        let dag = Dag::new(&g);
        let op_times = Evaluator::new(&g, &cost, fp, AllocatorSpec::Perfect);
        let facts = Facts::new(&g, &cost, op_times.op_time_s());
        for trial in 0..12 {
            let budget = (fp as f64 * [0.9, 0.7, 0.5, 0.4][trial % 4]) as u64;
            let breeder = Breeder {
                dag: &dag,
                demand: &demand,
                ts: &ts,
                budget_bytes: budget,
                p: 0.1,
                adaptation: Adaptation::Fixed,
                search: SearchSpace::Joint,
            };
            let order = if trial % 2 == 0 {
                g.ops.iter().map(|o| o.id).collect()
            } else {
                breeder.random_order(&mut rng)
            };
            let gene = breeder.random_alloc(&order, &mut rng);
            let config = encoding_config(&ts, &gene);
            let pool = PoolModel::of_config(&config).expect("valid encoding");
            if pool.bytes() > budget {
                continue;
            }
            let Ok(plan) = plan_swaps(&facts, &order, &pool, budget) else {
                short += 1;
                continue;
            };
            planned += 1;
            delayed += plan.delayed_swap_outs;
            let ev = Evaluator::new(&g, &cost, budget, AllocatorSpec::Perfect);
            let e = ev.evaluate_under(
                &plan.schedule,
                &AllocatorSpec::SizeClass(config),
                &mut Scratch::default(),
            );
            let what = format!("{} trial {trial}", g.meta.model);
            assert!(e.schedule_error.is_none(), "{what}: {:?}", e.schedule_error);
            assert_eq!(e.violations, 0, "{what}: {:?}", e.first_violation);
            let sim = e.sim.expect("simulated").expect("simulates");
            assert!(sim.oom.is_none(), "{what}: {:?}", sim.oom);
        }
    }
    // Measured: 20 planned, 23 short of objects, 1290 copy-outs delayed by
    // the d2h stream's order (seed 42); the floors keep the test from
    // passing on nothing, and on no delayed copy-out.
    assert!(planned >= 11, "only {planned} plans ({short} shortfalls)");
    assert!(delayed > 0, "no plan delayed a copy-out ({planned} plans)");
}

/// A 512 B tensor (one unit of the hand-made examples), made by op
/// `producer` (`None`: a graph input).
fn unit_tensor(id: u32, name: &str, kind: TensorKind, producer: Option<u32>) -> Tensor {
    Tensor {
        id: TensorId(id),
        name: name.into(),
        shape: vec![512],
        dtype: DType::Uint8,
        size_bytes: 512,
        kind,
        producer: producer.map(OpId),
        view_of: None,
        inplace_update_of: None,
        is_output: false,
    }
}

/// A forward op of `flops` (its seconds under the unit cost model) with one
/// output.
fn unit_op(id: u32, inputs: &[u32], output: u32, flops: u64) -> Op {
    Op {
        id: OpId(id),
        name: format!("op{}", id + 1),
        kind: OpKind::Named { name: "k".into() },
        phase: Phase::Forward,
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

/// A hand-made graph whose last tensor is its output.
fn unit_graph(model: &str, source: &str, mut tensors: Vec<Tensor>, ops: Vec<Op>) -> Graph {
    if let Some(last) = tensors.last_mut() {
        last.is_output = true;
    }
    Graph {
        meta: GraphMeta {
            model: model.into(),
            batch: 1,
            seq: None,
            optimizer: "none".into(),
            source: source.into(),
        },
        tensors,
        ops,
    }
}

/// A pool of `count` objects of 512 B (the unit tensors' size).
fn unit_pool(count: u64) -> SizeClassConfig {
    SizeClassConfig {
        classes: vec![SizeClassSpec {
            size_bytes: 512,
            count,
        }],
        encoding: None,
    }
}

/// `schedule` verifies and simulates without running out of memory under
/// the `size-class` pool `config`.
fn assert_runs_in_pool(ev: &Evaluator<'_>, schedule: &Schedule, config: SizeClassConfig) {
    let e = ev.evaluate_under(
        schedule,
        &AllocatorSpec::SizeClass(config),
        &mut Scratch::default(),
    );
    assert_eq!(e.violations, 0, "{:?}", e.first_violation);
    let sim = e.sim.expect("simulated").expect("simulates");
    assert!(sim.oom.is_none(), "{:?}", sim.oom);
}

/// Fig. 3: op1(W1) -> A1, op2(W2, A1) -> A2, op3(W3, A1, A2) -> A3, every
/// tensor one unit (512 B), four units of memory, one unit of time per op and
/// per copy, parameters on the host at the start (the first pass). The
/// planner picks W1 to make room for W3 and W2 for A3; W3's swap-in waits for
/// W1's release and op3 for both. The second pass then finds that W3 can stay
/// on the device across iterations (W1 makes room for A2 instead).
#[test]
fn figure_3_pairs_w1_with_w3_and_w2_with_a3() {
    let p = TensorKind::Parameter;
    let a = TensorKind::Activation;
    let names = ["W1", "W2", "W3", "A1", "A2", "A3"];
    let g = unit_graph(
        "figure-3",
        "SwapAdvisor Fig. 3",
        (0..6u32)
            .map(|i| {
                let (kind, producer) = if i < 3 { (p, None) } else { (a, Some(i - 3)) };
                unit_tensor(i, names[i as usize], kind, producer)
            })
            .collect(),
        vec![
            unit_op(0, &[0], 3, 512),
            unit_op(1, &[1, 3], 4, 512),
            unit_op(2, &[2, 3, 4], 5, 512),
        ],
    );
    let cost = UnitCostModel;
    let budget = 4 * 512;
    let config = unit_pool(4);
    let pool = PoolModel::of_config(&config).expect("pool");
    let ev = Evaluator::new(&g, &cost, budget, AllocatorSpec::Perfect);
    let facts = Facts::new(&g, &cost, ev.op_time_s());
    let order: Vec<OpId> = (0..3).map(OpId).collect();
    let plan = plan_first_pass(&facts, &order, &pool, budget).expect("plans");
    let gap = |t: u32, after: Option<usize>| -> &Gap {
        plan.schedule
            .gaps
            .iter()
            .find(|g| g.tensor == TensorId(t) && g.after == after)
            .unwrap_or_else(|| panic!("no gap on {t} after {after:?}: {:?}", plan.schedule.gaps))
    };
    // W1 leaves after op1; op2 runs before W1's object is taken.
    let w1 = gap(0, Some(0));
    assert_eq!((w1.before, w1.reclaim_before), (None, Some(1)));
    // W3 comes in once op2 (which waited for W1's release) has run.
    let w3 = gap(2, None);
    assert_eq!((w3.before, w3.prefetch_after), (Some(2), Some(1)));
    // W2 leaves after op2, and op3 waits for it before allocating A3.
    let w2 = gap(1, Some(1));
    assert_eq!((w2.before, w2.reclaim_before), (None, Some(2)));
    // Every parameter starts and ends on the host.
    assert_eq!(plan.schedule.initial_residency.len(), 3);
    assert_runs_in_pool(&ev, &plan.schedule, config);
    // The double pass: W3 starts (and ends) resident, W1 gives way to A2.
    let both = plan_swaps(&facts, &order, &pool, budget).expect("plans");
    assert!(!both.schedule.gaps.iter().any(|g| g.tensor == TensorId(2)));
    assert_eq!(both.schedule.initial_residency.len(), 2);
    assert!(
        both.schedule.gaps.iter().any(|g| {
            g.tensor == TensorId(0) && g.after == Some(0) && g.reclaim_before == Some(1)
        })
    );
    assert_runs_in_pool(&ev, &both.schedule, unit_pool(4));
}

/// When no candidate's object is free in time, the victim is Belady's
/// choice among them all (the next use furthest away), not the least
/// recently used one. Seven activations of 512 B, a pool of three 512 B
/// objects, ops of 1 s (1 FLOP) against copies of 512 s (the unit model), so
/// no copy-out is ever done by the op that needs its object:
/// op0 -> A; op1(A) -> B; op2(B) -> C; op3(C) -> D; op4(A, D) -> E;
/// op5(E) -> F; op6(B, F) -> G. At op3 the pool holds A, B and C (C its
/// operand): A was last used at op1 and is next used at op4, B last at op2
/// and next at op6. Belady's choice is B, brought back for op6 into an
/// object A or D leaves at op4: the one swap. Least recently used would
/// evict A, needed again at op4.
#[test]
fn with_no_candidate_free_in_time_the_furthest_next_use_leaves() {
    let activation = |id: u32, name: &str| unit_tensor(id, name, TensorKind::Activation, Some(id));
    let op = |id: u32, inputs: &[u32]| unit_op(id, inputs, id, 1);
    let g = unit_graph(
        "belady-fallback",
        "hand-made",
        ["A", "B", "C", "D", "E", "F", "G"]
            .iter()
            .zip(0u32..)
            .map(|(name, i)| activation(i, name))
            .collect(),
        vec![
            op(0, &[]),
            op(1, &[0]),
            op(2, &[1]),
            op(3, &[2]),
            op(4, &[0, 3]),
            op(5, &[4]),
            op(6, &[1, 5]),
        ],
    );
    let cost = UnitCostModel;
    let budget = 3 * 512;
    let config = unit_pool(3);
    let pool = PoolModel::of_config(&config).expect("pool");
    let ev = Evaluator::new(&g, &cost, budget, AllocatorSpec::Perfect);
    let facts = Facts::new(&g, &cost, ev.op_time_s());
    let order: Vec<OpId> = (0..7).map(OpId).collect();
    let plan = plan_swaps(&facts, &order, &pool, budget).expect("plans");
    let swapped: Vec<(TensorId, Option<usize>, Option<usize>)> = plan
        .schedule
        .gaps
        .iter()
        .map(|g| (g.tensor, g.after, g.before))
        .collect();
    assert_eq!(swapped, vec![(TensorId(1), Some(2), Some(6))]);
    assert_runs_in_pool(&ev, &plan.schedule, config);
}

/// Crossover and mutation on real graphs (in-place updates included) give
/// valid compute orders and valid CLS / CNT that fit the budget whenever the
/// smallest pool does.
#[test]
fn children_are_valid_orders_and_pools_on_zoo_graphs() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for g in small_graphs() {
        let (fp, _) = footprint(&g);
        let ts = tensor_sizes(&g);
        let demand = SizeDemand::new(&g, &ts);
        let dag = Dag::new(&g);
        let breeder = Breeder {
            dag: &dag,
            demand: &demand,
            ts: &ts,
            budget_bytes: fp / 2,
            p: 0.3,
            adaptation: Adaptation::Fixed,
            search: SearchSpace::Joint,
        };
        let order_a = random_topological_order(&g, 1);
        let order_b: Vec<OpId> = g.ops.iter().map(|o| o.id).collect();
        let mut a = outcore_planners::swapadvisor::Individual {
            alloc: breeder.random_alloc(&order_a, &mut rng),
            order: order_a,
        };
        let mut b = outcore_planners::swapadvisor::Individual {
            alloc: breeder.random_alloc(&order_b, &mut rng),
            order: order_b,
        };
        for round in 0..6 {
            let children = breeder.children(&a, &b, &mut rng);
            for c in &children {
                let what = format!("{} round {round}", g.meta.model);
                assert_eq!(check_order(&g, &c.order), Ok(()), "{what}");
                assert!(cls_valid(&c.alloc.cls), "{what}: {:?}", c.alloc.cls);
                let bounds = demand.bounds(&c.alloc.cls, &c.order);
                assert_eq!(c.alloc.cnt.len(), bounds.min.len(), "{what}");
                for k in 0..bounds.min.len() {
                    assert!(c.alloc.cnt[k] >= bounds.min[k], "{what}: class {k}");
                }
                let min_pool = outcore_planners::swapadvisor::pool_bytes(
                    &outcore_planners::swapadvisor::class_sizes(&ts, &c.alloc.cls),
                    &bounds.min,
                );
                let pool = PoolModel::of_config(&encoding_config(&ts, &c.alloc)).expect("pool");
                if min_pool <= fp / 2 {
                    assert!(pool.bytes() <= fp / 2, "{what}: the repair left it over");
                }
            }
            let [c1, _, _, c4] = children;
            a = c1;
            b = c4;
        }
    }
}

/// A quick search: small population, few generations.
fn quick(search: SearchSpace) -> SwapAdvisor {
    SwapAdvisor {
        population: 8,
        max_generations: Some(3),
        ..SwapAdvisor::new(search)
    }
}

fn feasible(planner: &dyn Planner, request: &PlanRequest<'_>) -> Box<Plan> {
    match planner.plan(request) {
        Ok(PlanOutcome::Feasible(plan)) => plan,
        Ok(PlanOutcome::Infeasible(why)) => panic!("{}: infeasible: {why}", planner.name()),
        Err(e) => panic!("{e}"),
    }
}

/// The plan carries the pool it was searched with (a CLS / CNT encoding),
/// verifies, and runs under that pool without an allocation failure.
fn check_plan(g: &Graph, plan: &Plan, cost: &RooflineModel) {
    let AllocatorSpec::SizeClass(config) = &plan.allocator else {
        panic!("not a size-class plan: {:?}", plan.allocator)
    };
    assert!(config.encoding.is_some(), "no encoding: {config:?}");
    let violations = verify(plan, g);
    assert!(violations.is_empty(), "{}", violations[0]);
    let report = simulate(g, plan, cost, &SimOptions::default())
        .expect("simulates")
        .report;
    assert!(report.oom.is_none(), "{:?}", report.oom);
    assert!(report.throughput_vs_ideal > 0.0 && report.throughput_vs_ideal <= 1.0 + 1e-9);
}

#[test]
fn plans_verify_and_run_under_their_pool_at_70_and_50_percent() {
    let cost = v100();
    let mut feasible_runs = 0;
    for g in [
        zoo("resnet50", 8, &[]),
        zoo("lstm", 16, &[("layers", 2), ("hidden", 512), ("seq", 8)]),
        zoo("nasnet", 2, &[("repeats", 1), ("filters", 96)]),
    ] {
        let (fp, _) = footprint(&g);
        let random = random_topological_order(&g, 5);
        for fraction in [0.7, 0.5] {
            for order in [None, Some(&random[..])] {
                let request = PlanRequest {
                    order,
                    ..PlanRequest::new(&g, &cost, (fp as f64 * fraction) as u64)
                };
                match quick(SearchSpace::Joint).plan(&request) {
                    Ok(PlanOutcome::Feasible(plan)) => {
                        check_plan(&g, &plan, &cost);
                        assert_eq!(plan.planner.seed, Some(0));
                        feasible_runs += 1;
                    }
                    Ok(PlanOutcome::Infeasible(why)) => {
                        assert!(!why.message.is_empty());
                    }
                    Err(e) => panic!("{} at {fraction}: {e}", g.meta.model),
                }
            }
        }
    }
    // Measured: 10 of 12.
    assert!(feasible_runs >= 9, "only {feasible_runs} feasible runs");
}

/// The plan without its wall-clock entries (elapsed seconds per generation).
fn without_times(mut plan: Plan) -> Plan {
    if let Some(history) = plan.planner.settings["history"].as_array_mut() {
        for h in history {
            h["elapsed_s"] = serde_json::Value::Null;
        }
    }
    plan
}

#[test]
fn the_same_seed_gives_the_same_plan_for_one_thread_and_four() {
    let g = zoo("resnet18", 16, &[]);
    let cost = v100();
    let (fp, _) = footprint(&g);
    let request = PlanRequest {
        seed: 7,
        ..PlanRequest::new(&g, &cost, fp * 8 / 10)
    };
    let planner = quick(SearchSpace::Joint);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        pool.install(|| feasible(&planner, &request))
    };
    let one = without_times(*run(1));
    let four = without_times(*run(4));
    assert_eq!(one, four);
    assert_eq!(one.planner.settings["generations"], 3);
    assert_eq!(one.planner.settings["evaluations"], 8 + 3 * 8);
    // Another seed searches elsewhere (the plan may coincide, the history not).
    let other = feasible(&planner, &PlanRequest { seed: 8, ..request });
    assert_ne!(
        one.planner.settings["history"],
        without_times(*other).planner.settings["history"]
    );
}

/// The simulated iteration time of a plan.
fn iter_time_s(g: &Graph, plan: &Plan, cost: &RooflineModel) -> f64 {
    simulate(g, plan, cost, &SimOptions::default())
        .expect("simulates")
        .report
        .iter_time_s
}

#[test]
fn the_pool_polish_is_recorded_and_never_makes_the_plan_slower() {
    let g = zoo("resnet18", 16, &[]);
    let cost = v100();
    let (fp, _) = footprint(&g);
    let request = PlanRequest::new(&g, &cost, fp * 6 / 10);
    let plan = feasible(&quick(SearchSpace::Joint), &request);
    check_plan(&g, &plan, &cost);
    let s = &plan.planner.settings;
    let polishes = s["polish"].as_array().expect("the polish is recorded");
    // Three generations end long before the GA's phase: one polish, after.
    assert_eq!(polishes.len(), 1, "{s}");
    let p = &polishes[0];
    let (before_s, after_s) = (p["before_s"].as_f64(), p["after_s"].as_f64());
    let (Some(before_s), Some(after_s)) = (before_s, after_s) else {
        panic!("{p}")
    };
    // Measured: 0.0697 s to 0.0607 s in 9 moves of 160 scored.
    assert!(after_s < before_s, "{p}");
    assert!(p["accepted"].as_u64() > Some(0), "{p}");
    let time_s = iter_time_s(&g, &plan, &cost);
    assert!(
        (time_s - after_s).abs() <= 1e-9 * after_s,
        "{time_s} against {p}"
    );
    // The same search without the polish ends at the polish's start.
    let plain_planner = SwapAdvisor {
        polish_share: 0.0,
        ..quick(SearchSpace::Joint)
    };
    let plain = feasible(&plain_planner, &request);
    assert!(plain.planner.settings["polish"].is_null());
    let plain_s = iter_time_s(&g, &plain, &cost);
    assert!(
        (plain_s - before_s).abs() <= 1e-9 * before_s,
        "{plain_s} against {p}"
    );
    // A search that keeps its pool does not polish it (at 80%: the seed's
    // pool alone has no plan at 60%).
    let roomier = PlanRequest::new(&g, &cost, fp * 8 / 10);
    let order_only = feasible(&quick(SearchSpace::OrderOnly), &roomier);
    assert!(order_only.planner.settings["polish"].is_null());
}

#[test]
fn a_zero_time_limit_scores_the_first_generation_only() {
    let g = zoo("resnet18", 16, &[]);
    let cost = v100();
    let (fp, _) = footprint(&g);
    let request = PlanRequest {
        time_limit_s: 0.0,
        ..PlanRequest::new(&g, &cost, fp * 8 / 10)
    };
    let planner = SwapAdvisor {
        population: 8,
        ..SwapAdvisor::new(SearchSpace::Joint)
    };
    let plan = feasible(&planner, &request);
    let s = &plan.planner.settings;
    assert_eq!(s["generations"], 0, "{s}");
    assert_eq!(s["evaluations"], 8, "{s}");
    assert_eq!(s["time_limit_cut_search"], true, "{s}");
    assert_eq!(s["history"].as_array().map(Vec::len), Some(1), "{s}");
    // The pool's polish had no time either.
    assert_eq!(s["polish"][0]["evaluations"], 0, "{s}");
    assert_eq!(s["polish"][0]["cut_by_time"], true, "{s}");
}

#[test]
fn the_ablations_keep_their_fixed_half() {
    let g = zoo("resnet18", 16, &[]);
    let cost = v100();
    let (fp, _) = footprint(&g);
    // The seed's finest pool (one class per size) needs room: 90%.
    let request = PlanRequest::new(&g, &cost, fp * 9 / 10);
    let computed = |plan: &Plan| -> Vec<OpId> {
        plan.stream(Stream::Compute)
            .iter()
            .filter_map(|s| match s.instr {
                Instr::Compute(op) => Some(op),
                _ => None,
            })
            .collect()
    };
    // Allocation only, by default: MXNet's default schedule (the paper's
    // setting), which differs from the graph's order on this graph.
    let plan = feasible(&quick(SearchSpace::AllocationOnly), &request);
    let framework = framework_default_order(&g);
    let graph_order: Vec<OpId> = g.ops.iter().map(|o| o.id).collect();
    assert_ne!(framework, graph_order);
    assert_eq!(computed(&plan), framework);
    assert_eq!(
        plan.planner.settings["fixed_order"], "framework default",
        "{}",
        plan.planner.settings
    );
    check_plan(&g, &plan, &cost);
    // Or the fastest seed's order, the graph's or the eager-update one.
    let seeded = SwapAdvisor {
        fixed_order: FixedOrder::FastestSeed,
        ..quick(SearchSpace::AllocationOnly)
    };
    let plan = feasible(&seeded, &request);
    let eager = eager_update_order(&g);
    let order = computed(&plan);
    assert!(
        order == graph_order || order == eager,
        "allocation only planned in an order of its own"
    );
    check_plan(&g, &plan, &cost);
    // Order only: the seed's pool, whatever the request's seed.
    let plan = feasible(&quick(SearchSpace::OrderOnly), &request);
    let other = feasible(
        &quick(SearchSpace::OrderOnly),
        &PlanRequest {
            seed: 99,
            ..request
        },
    );
    assert!(matches!(plan.allocator, AllocatorSpec::SizeClass(_)));
    assert_eq!(plan.allocator, other.allocator);
    check_plan(&g, &plan, &cost);
}

/// A pool given in the request is the plan's, unchanged.
#[test]
fn a_given_pool_is_kept() {
    let g = zoo("resnet18", 16, &[]);
    let cost = v100();
    let (fp, _) = footprint(&g);
    let budget = fp * 9 / 10;
    // The seed's pool of a search, given back as a fixed pool.
    let searched = feasible(
        &quick(SearchSpace::OrderOnly),
        &PlanRequest::new(&g, &cost, budget),
    );
    let given = searched.allocator.clone();
    let request = PlanRequest {
        allocator: &given,
        ..PlanRequest::new(&g, &cost, budget)
    };
    let plan = feasible(&quick(SearchSpace::Joint), &request);
    assert_eq!(plan.allocator, given);
    check_plan(&g, &plan, &cost);
}

#[test]
fn bad_settings_are_invalid_requests() {
    let g = zoo("resnet18", 16, &[]);
    let cost = v100();
    let request = PlanRequest::new(&g, &cost, footprint(&g).0 / 2);
    for planner in [
        SwapAdvisor {
            population: 1,
            ..quick(SearchSpace::Joint)
        },
        SwapAdvisor {
            mutation_probability: 1.5,
            ..quick(SearchSpace::Joint)
        },
        SwapAdvisor {
            polish_share: 1.0,
            ..quick(SearchSpace::Joint)
        },
        SwapAdvisor {
            polish_share: f64::NAN,
            ..quick(SearchSpace::Joint)
        },
    ] {
        let e = planner.plan(&request).expect_err("refused");
        assert_eq!(
            e.kind,
            outcore_plan::PlannerErrorKind::InvalidRequest,
            "{e}"
        );
        assert!(e.message.contains("give"), "{e}");
    }
}
