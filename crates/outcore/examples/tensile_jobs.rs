//! TENSILE's multi-job experiments (paper 004, Sec. V-D and V-E) on the
//! multi-job simulator: Table IV (five jobs launched one by one in a random
//! order) and Fig. 6 (1 to 4 identical jobs of one model), MSR / EOR / CBR of
//! TENSILE's scheduler over all jobs (`tensile::multi`) beside per-job
//! Capuchin and per-job vDNN-conv.
//!
//! Setting, on `a6000-48gb` (TENSILE's RTX A6000), zoo models at batch 16:
//! - Each job runs [`ITERATIONS`] iterations. In Table IV job `k` of a launch
//!   order arrives at `k * LAUNCH_INTERVAL_S` ("launched one by one"), so each
//!   starts while the others run; the order is a seeded shuffle (seeds 0, 1,
//!   2). In Fig. 6 the identical jobs are launched together ("launch them
//!   simultaneously"); the simulator is deterministic, so the paper's three
//!   repetitions would be identical and one is run.
//! - TENSILE plans all jobs together for the whole device memory: it is the
//!   active scheduler that swaps whatever hides (recomputation only if the
//!   merged peak exceeds the memory, which it does not here).
//! - As in the paper ("we set Capuchin's GPU memory budget as the same as
//!   TENSILE"), each job's Capuchin and vDNN-conv plan is made alone at the
//!   bound TENSILE's plan for that job proves.
//! - The vanilla group is the same jobs with nothing moved. MSR / EOR / CBR of
//!   a group are over the global peak and the makespan
//!   (`outcore_colocate::SetMetrics`).
//!
//! Prints markdown tables to stderr.
//! `cargo run --release -p outcore --example tensile_jobs -- [table4] [fig6]`

use std::collections::BTreeMap;
use std::sync::Arc;

use outcore_colocate::{Job, JobSet, Metrics, SetMetrics, simulate_jobs};
use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{Plan, PlanOutcome, PlanRequest, PlannerInfo, lower_in_order};
use outcore_planners::tensile::multi::{JobInput, MultiOutcome, plan_jobs};

const DEVICE: &str = "a6000-48gb";
const BATCH: u64 = 16;
const ITERATIONS: usize = 10;
const LAUNCH_INTERVAL_S: f64 = 0.2;
const MODELS: [(&str, &str); 5] = [
    ("VGG-16", "vgg16"),
    ("Inception v3", "inception_v3"),
    ("Inception v4", "inception_v4"),
    ("ResNet-50", "resnet50"),
    ("DenseNet-121", "densenet121"),
];
/// Table IV (MSR, EOR, CBR) for vDNN, Capuchin, TENSILE.
const PAPER_TABLE4: [(&str, [f64; 3]); 3] = [
    ("vDNN", [0.0580, 1.6297, 0.0356]),
    ("Capuchin", [0.1150, 7.6545, 0.0150]),
    ("TENSILE", [0.1565, 1.1589, 0.1350]),
];

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The graphs and plans of one group: one plan per job, in job order.
struct Group {
    plans: Vec<Plan>,
}

/// TENSILE over all `graphs` for `budget_bytes`: the plans, or why not.
fn tensile(graphs: &[Arc<Graph>], cost: &RooflineModel, budget_bytes: u64) -> Res<Group> {
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .map(|g| JobInput {
            graph: g,
            max_swap_rate: 1.0,
        })
        .collect();
    match plan_jobs(&inputs, cost, budget_bytes).map_err(err)? {
        MultiOutcome::Feasible { jobs, summary } => {
            eprintln!("<!-- tensile-multi: {summary:?} -->");
            Ok(Group {
                plans: jobs.into_iter().map(|j| j.plan).collect(),
            })
        }
        MultiOutcome::Infeasible { message, .. } => Err(message),
    }
}

/// `planner` on each job alone at the budget TENSILE's plan for it proves.
fn per_job(planner: &str, graphs: &[Arc<Graph>], cost: &RooflineModel, like: &Group) -> Res<Group> {
    let p = outcore_planners::by_name(planner)?;
    let mut plans = Vec::new();
    for (g, t) in graphs.iter().zip(&like.plans) {
        match p
            .plan(&PlanRequest::new(g, cost, t.budget_bytes))
            .map_err(err)?
        {
            PlanOutcome::Feasible(plan) => plans.push(*plan),
            PlanOutcome::Infeasible(i) => return Err(format!("{planner}: {}", i.message)),
        }
    }
    Ok(Group { plans })
}

/// The jobs with nothing moved.
fn vanilla(graphs: &[Arc<Graph>]) -> Group {
    let info = PlannerInfo {
        name: "vanilla".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    Group {
        plans: graphs
            .iter()
            .map(|g| lower_in_order(g, info.clone(), footprint(g).0))
            .collect(),
    }
}

/// Runs `group` with the jobs launched in `order` (indices into `graphs`).
fn run(
    names: &[String],
    graphs: &[Arc<Graph>],
    group: &Group,
    order: &[usize],
    interval_s: f64,
    budget_bytes: u64,
    cost: &RooflineModel,
) -> Res<outcore_colocate::ColocateReport> {
    let mut jobs = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        jobs.push(
            Job::new(
                names[i].clone(),
                graphs[i].clone(),
                Arc::new(group.plans[i].clone()),
                ITERATIONS,
                k as f64 * interval_s,
                1.0,
            )
            .map_err(err)?,
        );
    }
    simulate_jobs(&JobSet::new(budget_bytes, jobs).map_err(err)?, cost).map_err(err)
}

/// `0..n` in a seeded random order (Fisher-Yates over SplitMix64 draws).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    order
}

fn fmt(m: &Metrics) -> String {
    format!("{:.4} | {:.4} | {:.4}", m.msr, m.eor, m.cbr)
}

/// Table IV: the five models, launched one by one in three seeded orders.
fn table4(cost: &RooflineModel, memory_bytes: u64) -> Res<()> {
    let graphs: Vec<Arc<Graph>> = MODELS
        .iter()
        .map(|(_, z)| zoo::build(z, Some(BATCH), &BTreeMap::new(), None).map(Arc::new))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let names: Vec<String> = MODELS.iter().map(|(l, _)| l.to_string()).collect();
    let t = tensile(&graphs, cost, memory_bytes)?;
    let groups = [
        ("vDNN-conv", per_job("vdnn-conv", &graphs, cost, &t)?),
        ("Capuchin", per_job("capuchin", &graphs, cost, &t)?),
        ("TENSILE", t),
    ];
    let vanilla_group = vanilla(&graphs);
    let unlimited: u64 = graphs.iter().map(|g| footprint(g).0).sum();
    eprintln!(
        "| seed | launch order | method | MSR | EOR | CBR | paper MSR | paper EOR | paper CBR |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|");
    for seed in 0..3u64 {
        let order = shuffled(graphs.len(), seed);
        let v = run(
            &names,
            &graphs,
            &vanilla_group,
            &order,
            LAUNCH_INTERVAL_S,
            unlimited,
            cost,
        )?;
        let launch: Vec<&str> = order.iter().map(|&i| MODELS[i].0).collect();
        for ((label, group), (_, paper)) in groups.iter().zip(PAPER_TABLE4) {
            let r = run(
                &names,
                &graphs,
                group,
                &order,
                LAUNCH_INTERVAL_S,
                memory_bytes,
                cost,
            )?;
            let m = SetMetrics::new(&v, &r).map_err(err)?;
            eprintln!(
                "| {seed} | {} | {label} | {} | {:.4} | {:.4} | {:.4} |",
                launch.join(", "),
                fmt(&m.global),
                paper[0],
                paper[1],
                paper[2]
            );
        }
    }
    Ok(())
}

/// Fig. 6: 1 to 4 identical jobs of each model, launched one by one.
fn fig6(cost: &RooflineModel, memory_bytes: u64) -> Res<()> {
    eprintln!(
        "| model | jobs | TENSILE MSR | EOR | CBR | Capuchin MSR | EOR | CBR | vDNN-conv MSR | EOR | CBR |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, z) in MODELS {
        let g = Arc::new(zoo::build(z, Some(BATCH), &BTreeMap::new(), None).map_err(err)?);
        for n in 1..=4usize {
            let graphs: Vec<Arc<Graph>> = (0..n).map(|_| g.clone()).collect();
            let names: Vec<String> = (0..n).map(|i| format!("{label} #{i}")).collect();
            let order: Vec<usize> = (0..n).collect();
            let unlimited = footprint(&g).0 * n as u64;
            let v = run(
                &names,
                &graphs,
                &vanilla(&graphs),
                &order,
                0.0,
                unlimited,
                cost,
            )?;
            let t = tensile(&graphs, cost, memory_bytes)?;
            let mut cells = Vec::new();
            let c = per_job("capuchin", &graphs, cost, &t);
            let d = per_job("vdnn-conv", &graphs, cost, &t);
            for group in [Ok(t), c, d] {
                cells.push(match group {
                    Ok(group) => {
                        let r = run(&names, &graphs, &group, &order, 0.0, memory_bytes, cost)?;
                        fmt(&SetMetrics::new(&v, &r).map_err(err)?.global)
                    }
                    Err(e) => format!("infeasible ({e}) | | "),
                });
            }
            eprintln!("| {label} | {n} | {} |", cells.join(" | "));
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let profile = DeviceProfile::builtin(DEVICE).map_err(err)?;
    let memory_bytes = profile.memory_bytes;
    let cost = RooflineModel::new(profile);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all = args.is_empty();
    if all || args.iter().any(|a| a == "table4") {
        table4(&cost, memory_bytes)?;
    }
    if all || args.iter().any(|a| a == "fig6") {
        fig6(&cost, memory_bytes)?;
    }
    Ok(())
}
