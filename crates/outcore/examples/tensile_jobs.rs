//! TENSILE's multi-job experiments (paper 004, Sec. V-D and V-E) on the
//! multi-job simulator: Table IV (five jobs launched one by one in a random
//! order) and Fig. 6 (1 to 4 identical jobs of one model), MSR / EOR / CBR of
//! TENSILE's scheduler over all jobs beside per-job Capuchin and per-job
//! vDNN-conv, each run through `outcore::colocate_tensile` (what
//! `outcore colocate --tensile` prints).
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
//!
//! `-- table4-min` (not in the default run): Table IV with TENSILE at the
//! smallest budget it plans for instead of the device's memory (see
//! `table4_min`), as `tensile_table -- protocol-min` does for one job.

use std::collections::BTreeMap;

use outcore::{JOBS_FORMAT, JobList, JobSpec, TensileComparison, colocate_tensile};
use outcore_colocate::Metrics;

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

/// A job list: `(name, zoo model, arrival)` each, at [`BATCH`], for
/// [`ITERATIONS`] iterations, unlimited swapping rate. The `planner` and
/// `budget` fields are not read by `colocate_tensile`.
fn job_list(jobs: &[(String, &str, f64)]) -> JobList {
    JobList {
        format: JOBS_FORMAT.into(),
        jobs: jobs
            .iter()
            .map(|(name, model, arrival_s)| JobSpec {
                name: name.clone(),
                model: Some(model.to_string()),
                batch: Some(BATCH),
                knobs: BTreeMap::new(),
                optimizer: None,
                graph: None,
                planner: "none".into(),
                budget: None,
                iterations: ITERATIONS,
                arrival_s: *arrival_s,
                priority: 1.0,
            })
            .collect(),
    }
}

/// The three groups' global metrics: vDNN-conv, Capuchin, TENSILE.
fn groups(r: &TensileComparison) -> [(&'static str, Metrics); 3] {
    [
        ("vDNN-conv", r.vdnn_conv.metrics.global),
        ("Capuchin", r.capuchin.metrics.global),
        ("TENSILE", r.tensile.metrics.global),
    ]
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

/// The global peaks (vanilla, then each group's) and each job's own peak in
/// each group, in MB, to see which jobs' peaks line up.
fn peaks(r: &TensileComparison) -> String {
    let mb = |b: u64| b / 1_000_000;
    let mut out = format!(
        "global peak MB: vanilla {}",
        mb(r.tensile.vanilla.peak_live_bytes)
    );
    let runs = [
        ("vDNN-conv", &r.vdnn_conv),
        ("Capuchin", &r.capuchin),
        ("TENSILE", &r.tensile),
    ];
    for (label, run) in runs {
        out += &format!(", {label} {}", mb(run.report.peak_live_bytes));
    }
    out += "; job peaks MB (vanilla / vDNN-conv / Capuchin / TENSILE):";
    for (k, job) in r.tensile.vanilla.jobs.iter().enumerate() {
        let own = runs.map(|(_, run)| mb(run.report.jobs[k].peak_live_bytes));
        out += &format!(
            " {} {} / {} / {} / {};",
            job.name,
            mb(job.peak_live_bytes),
            own[0],
            own[1],
            own[2]
        );
    }
    out
}

fn fmt(m: &Metrics) -> String {
    format!("{:.4} | {:.4} | {:.4}", m.msr, m.eor, m.cbr)
}

/// The jobs of Table IV's launch order for `seed`, and their names in order.
fn table4_jobs(seed: u64) -> (Vec<(String, &'static str, f64)>, Vec<&'static str>) {
    let order = shuffled(MODELS.len(), seed);
    let jobs = order
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            (
                MODELS[i].0.to_string(),
                MODELS[i].1,
                k as f64 * LAUNCH_INTERVAL_S,
            )
        })
        .collect();
    (jobs, order.iter().map(|&i| MODELS[i].0).collect())
}

/// Table IV with TENSILE at the smallest budget it plans for: the bisection
/// (7 steps) over a fraction of the jobs' vanilla peaks summed (the merged
/// peak TENSILE's budget bounds), the run at the smallest feasible fraction
/// printed. There Algorithm 3's recomputation phase runs, which the whole
/// device memory never asks for; Capuchin and vDNN-conv plan each job at
/// the bound TENSILE's plan for it proves, as in [`table4`].
fn table4_min() -> Res<()> {
    eprintln!("| seed | TENSILE budget / summed vanilla peaks | method | MSR | EOR | CBR |");
    eprintln!("|---|---|---|---|---|---|");
    for seed in 0..3u64 {
        let (jobs, _) = table4_jobs(seed);
        let list = job_list(&jobs);
        let full = colocate_tensile(&list, DEVICE, None, false).map_err(err)?;
        let summed: u64 = full
            .tensile
            .vanilla
            .jobs
            .iter()
            .map(|j| j.peak_live_bytes)
            .sum();
        let at = |f: f64| {
            let budget = format!("{}", (f * summed as f64) as u64);
            colocate_tensile(&list, DEVICE, Some(&budget), false).ok()
        };
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        let mut best = at(hi);
        for _ in 0..7 {
            let mid = (lo + hi) / 2.0;
            match at(mid) {
                Some(r) => {
                    hi = mid;
                    best = Some(r);
                }
                None => lo = mid,
            }
        }
        let Some(r) = best else {
            eprintln!("| {seed} | not planned at the summed vanilla peaks | | | | |");
            continue;
        };
        eprintln!("<!-- tensile-multi: {:?} -->", r.summary);
        eprintln!("<!-- {} -->", peaks(&r));
        for (label, m) in groups(&r) {
            eprintln!("| {seed} | {hi:.4} | {label} | {} |", fmt(&m));
        }
    }
    Ok(())
}

/// Table IV: the five models, launched one by one in three seeded orders.
fn table4() -> Res<()> {
    eprintln!(
        "| seed | launch order | method | MSR | EOR | CBR | paper MSR | paper EOR | paper CBR |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|");
    for seed in 0..3u64 {
        let (jobs, launch) = table4_jobs(seed);
        let r = colocate_tensile(&job_list(&jobs), DEVICE, None, false).map_err(err)?;
        eprintln!("<!-- tensile-multi: {:?} -->", r.summary);
        eprintln!("<!-- {} -->", peaks(&r));
        for ((label, m), (_, paper)) in groups(&r).iter().zip(PAPER_TABLE4) {
            eprintln!(
                "| {seed} | {} | {label} | {} | {:.4} | {:.4} | {:.4} |",
                launch.join(", "),
                fmt(m),
                paper[0],
                paper[1],
                paper[2]
            );
        }
    }
    Ok(())
}

/// Fig. 6: 1 to 4 identical jobs of each model, launched together.
fn fig6() -> Res<()> {
    eprintln!(
        "| model | jobs | TENSILE MSR | EOR | CBR | Capuchin MSR | EOR | CBR | vDNN-conv MSR | EOR | CBR |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, model) in MODELS {
        for n in 1..=4usize {
            let jobs: Vec<(String, &str, f64)> = (0..n)
                .map(|i| (format!("{label} #{i}"), model, 0.0))
                .collect();
            let cells = match colocate_tensile(&job_list(&jobs), DEVICE, None, false) {
                Ok(r) => {
                    let [v, c, t] = groups(&r);
                    format!("{} | {} | {}", fmt(&t.1), fmt(&c.1), fmt(&v.1))
                }
                Err(e) => format!("not planned ({e})"),
            };
            eprintln!("| {label} | {n} | {cells} |");
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all = args.is_empty();
    if all || args.iter().any(|a| a == "table4") {
        table4()?;
    }
    if all || args.iter().any(|a| a == "fig6") {
        fig6()?;
    }
    if args.iter().any(|a| a == "table4-min") {
        table4_min()?;
    }
    Ok(())
}
