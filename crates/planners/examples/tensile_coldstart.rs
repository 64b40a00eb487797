//! TENSILE's cold start and EWMA replanning (paper 004, Sec. IV-A, IV-E,
//! Table II), issue 13 item 4. Four sections, each a markdown table on stderr
//! (the workspace denies printing to stdout):
//!
//! 1. `cpu`: the latency predictors trained on latency tables measured by the
//!    CPU executor (`crates/cost/data/predict/cpu`, one file per
//!    `model__b<batch>__<knob>=<value>`), error on held-out tables.
//! 2. `roofline`: the predictors trained on the roofline model's times of zoo
//!    models on `a6000-48gb`, error on a held-out model whose family is not in
//!    the training set. This is the predictor the simulated experiments use.
//! 3. `coldstart`: first-iteration EOR of `tensile` planned with predicted
//!    latencies (predictor of section 2, not trained on the model's family)
//!    vs with the true (roofline) latencies, and with no latency information
//!    (swapping on demand: `odswap`'s first iteration), all simulated with the
//!    roofline model, beside Table II.
//! 4. `ewma`: after every op of the job slows down 2x, iterations of EWMA
//!    updates (with TENSILE's replanning trigger) until the replanned plan's
//!    simulated time is within 1% of the plan made with the slowed times.
//!
//! `cargo run --release -p outcore-planners --example tensile_coldstart [-- SECTION...]`

mod common;
use common::plan_and_simulate;

use outcore_cost::predict::{
    Dataset, EwmaTracker, LatencyPredictor, MlpConfig, MlpPredictor, PerKindLeastSquares,
    PredictedModel, ReplanTrigger, evaluate,
};
use outcore_cost::{CostModel, DeviceProfile, MeasuredTable, RooflineModel, ScaledOps};
use outcore_graph::{Graph, OpId, footprint, zoo};
use std::collections::BTreeMap;
use std::path::Path;

const DEVICE: &str = "a6000-48gb";
const BATCH: u64 = 16;

/// The five models of Table II: (label, zoo name, family, tensile's smallest
/// feasible budget / VMP from RESULTS.md "TENSILE, single job" (re-measured
/// on 2026-12-02, after the peak analysis lost its swap-in window view), Table II's
/// first-iteration EOR of TENSILE and of Capuchin).
const TARGETS: [(&str, &str, &str, f64, f64, f64); 5] = [
    ("VGG-16", "vgg16", "vgg", 0.8594, 1.2523, 5.8053),
    (
        "Inception v3",
        "inception_v3",
        "inception",
        0.5703,
        1.4744,
        6.7529,
    ),
    (
        "Inception v4",
        "inception_v4",
        "inception",
        0.5703,
        1.3797,
        10.2088,
    ),
    ("ResNet-50", "resnet50", "resnet", 0.5391, 1.3924, 9.6073),
    (
        "DenseNet-121",
        "densenet121",
        "densenet",
        0.7344,
        1.3855,
        10.0925,
    ),
];

/// The roofline training pool: (zoo name, family), each at batches 8, 16, 32.
const POOL: [(&str, &str); 11] = [
    ("resnet18", "resnet"),
    ("resnet50", "resnet"),
    ("resnet101", "resnet"),
    ("vgg16", "vgg"),
    ("vgg19", "vgg"),
    ("inception_v3", "inception"),
    ("inception_v4", "inception"),
    ("densenet121", "densenet"),
    ("mobilenet_v2", "mobilenet"),
    ("efficientnet_b0", "efficientnet"),
    ("squeezenet1_1", "squeezenet"),
];
const POOL_BATCHES: [u64; 3] = [8, 16, 32];

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn build(name: &str, batch: u64, knobs: &BTreeMap<String, u64>) -> Res<Graph> {
    zoo::build(name, Some(batch), knobs, None).map_err(err)
}

fn roofline() -> Res<RooflineModel> {
    Ok(RooflineModel::new(
        DeviceProfile::builtin(DEVICE).map_err(err)?,
    ))
}

// ---------------------------------------------------------------- section 1

/// One measured table with the configuration its file name states.
struct CpuTable {
    model: String,
    batch: u64,
    knob: (String, u64),
    data: Dataset,
}

/// Parses `model__b<batch>__<knob>=<value>.json`.
fn parse_name(stem: &str) -> Res<(String, u64, (String, u64))> {
    let parts: Vec<&str> = stem.split("__").collect();
    let bad = || format!("`{stem}` is not model__b<batch>__<knob>=<value>");
    let [model, batch, knob] = parts[..] else {
        return Err(bad());
    };
    let batch = batch
        .strip_prefix('b')
        .and_then(|b| b.parse().ok())
        .ok_or_else(bad)?;
    let (k, v) = knob.split_once('=').ok_or_else(bad)?;
    Ok((
        model.to_string(),
        batch,
        (k.to_string(), v.parse().map_err(|_| bad())?),
    ))
}

fn load_cpu_tables() -> Res<Vec<CpuTable>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cost/data/predict/cpu");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut tables = Vec::new();
    for path in paths {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let (model, batch, knob) = parse_name(stem)?;
        let knobs = BTreeMap::from([knob.clone()]);
        let graph = build(&model, batch, &knobs)?;
        let table = MeasuredTable::from_json_file(&path).map_err(err)?;
        let data = Dataset::from_table(&graph, &table, stem).map_err(err)?;
        tables.push(CpuTable {
            model,
            batch,
            knob,
            data,
        });
    }
    Ok(tables)
}

/// One table row; `many_sources`: the test set has several graphs, so the
/// summed-latency error is given as mean and max over them.
fn report_row(label: &str, p: &dyn LatencyPredictor, test: &Dataset, many_sources: bool) {
    let r = evaluate(p, test);
    let sums = if many_sources {
        format!(
            "{:.3} | {:.3}",
            r.mean_sum_rel_error(),
            r.max_sum_rel_error()
        )
    } else {
        format!("{:.3}", r.mean_sum_rel_error())
    };
    eprintln!(
        "| {label} | {} | {} | {:.3} | {:.3} | {sums} |",
        p.name(),
        r.n,
        r.median_rel_error,
        r.p90_rel_error,
    );
}

fn split_and_report(
    label: &str,
    tables: &[CpuTable],
    held_out: impl Fn(&CpuTable) -> bool,
) -> Res<()> {
    let (train, test) = common::split(tables, held_out, |t| &t.data);
    let (mlp, lsq) = common::fit_both(&train)?;
    report_row(label, &mlp, &test, true);
    report_row(label, &lsq, &test, true);
    Ok(())
}

fn section_cpu() -> Res<()> {
    let tables = load_cpu_tables()?;
    eprintln!(
        "\n### Predictors on CPU-executor measurements ({} tables, {} ops)\n",
        tables.len(),
        tables.iter().map(|t| t.data.samples.len()).sum::<usize>()
    );
    eprintln!(
        "| held out | predictor | test ops | median rel. error / op | p90 | summed-latency error, mean over tables | max |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    split_and_report("batches 16 and 64", &tables, |t| {
        t.batch == 16 || t.batch == 64
    })?;
    split_and_report("largest width of each model", &tables, |t| {
        matches!(
            (t.model.as_str(), t.knob.0.as_str(), t.knob.1),
            ("mlp", "hidden", 512)
                | ("tiny-cnn", "width", 32)
                | ("tiny-transformer", "hidden", 128)
        )
    })?;
    for model in ["mlp", "tiny-cnn", "tiny-transformer"] {
        split_and_report(&format!("model {model}"), &tables, |t| t.model == model)?;
    }
    Ok(())
}

// ---------------------------------------------------------------- section 2

/// Roofline rows of the pool, keyed by (model, family, batch).
fn roofline_pool(cost: &RooflineModel) -> Res<Vec<(&'static str, &'static str, u64, Dataset)>> {
    let mut out = Vec::new();
    for (name, family) in POOL {
        for batch in POOL_BATCHES {
            let g = build(name, batch, &BTreeMap::new())?;
            let data = Dataset::from_cost_model(&g, cost, &format!("{name}@{batch}"));
            out.push((name, family, batch, data));
        }
    }
    Ok(out)
}

/// Every pool row outside `family`.
fn train_set(pool: &[(&str, &str, u64, Dataset)], family: &str) -> Dataset {
    let mut train = Dataset::default();
    for (_, f, _, data) in pool {
        if *f != family {
            train.extend(data.clone());
        }
    }
    train
}

fn section_roofline(
    cost: &RooflineModel,
    pool: &[(&str, &str, u64, Dataset)],
    predictors: &BTreeMap<&str, MlpPredictor>,
) -> Res<()> {
    eprintln!("\n### Predictors on roofline times (`{DEVICE}`), held-out family, batch {BATCH}\n");
    eprintln!(
        "| held-out model (family not trained on) | predictor | test ops | median rel. error / op | p90 | summed-latency error |"
    );
    eprintln!("|---|---|---|---|---|---|");
    for (label, name, family, ..) in TARGETS {
        let g = build(name, BATCH, &BTreeMap::new())?;
        let test = Dataset::from_cost_model(&g, cost, name);
        let lsq = PerKindLeastSquares::fit(&train_set(pool, family).deduplicated().samples)
            .map_err(err)?;
        report_row(label, &predictors[name], &test, false);
        report_row(label, &lsq, &test, false);
    }
    Ok(())
}

// ---------------------------------------------------------------- section 3

/// The vanilla group: `none` at the footprint, simulated (VTC, VMP).
fn vanilla(g: &Graph, cost: &RooflineModel) -> Res<(f64, u64)> {
    let (t, peak, _) = plan_and_simulate("none", g, cost, cost, footprint(g).0)?
        .ok_or("the vanilla plan is infeasible")?;
    Ok((t, peak))
}

/// The smallest budget (fraction of `vmp`, bisection to 1/128) at which
/// `tensile` planning with `plan_cost` is feasible.
fn smallest_fraction(
    g: &Graph,
    plan_cost: &dyn CostModel,
    true_cost: &dyn CostModel,
    vmp: u64,
) -> Res<f64> {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..7 {
        let mid = (lo + hi) / 2.0;
        let budget = (mid * vmp as f64) as u64;
        if plan_and_simulate("tensile", g, plan_cost, true_cost, budget)?.is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

fn fmt_eor(x: Option<f64>) -> String {
    x.map_or("inf.".into(), |v| format!("{v:.4}"))
}

fn section_coldstart(cost: &RooflineModel, predictors: &BTreeMap<&str, MlpPredictor>) -> Res<()> {
    eprintln!("\n### Cold start: first-iteration EOR, `{DEVICE}`, batch {BATCH}\n");
    eprintln!(
        "| model | budget / VMP | paper TENSILE | paper Capuchin | `tensile`, true latencies (warm) | `tensile`, predicted (cold) | predicted iteration latency sum / true | no latency information (`odswap` first iteration) | cold's smallest feasible budget / VMP | there: cold | warm | no latency information |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, name, _, fraction, paper_t, paper_c) in TARGETS {
        let g = build(name, BATCH, &BTreeMap::new())?;
        let (vtc, vmp) = vanilla(&g, cost)?;
        let budget = (fraction * vmp as f64) as u64;
        let predicted = PredictedModel::new(&predictors[name], cost.device().clone());
        let warm = plan_and_simulate("tensile", &g, cost, cost, budget)?;
        let cold = plan_and_simulate("tensile", &g, &predicted, cost, budget)?;
        let passive = |budget: u64| -> Res<Option<f64>> {
            Ok(
                plan_and_simulate("odswap", &g, cost, cost, budget)?.and_then(|(_, _, s)| {
                    // `odswap` records its first iteration (evict LRU on pressure,
                    // synchronous swap-out, swap-in on demand) as throughput vs
                    // ideal, ideal = the sum of the true op times.
                    s["first_iteration_throughput"]
                        .as_f64()
                        .map(|thr| 1.0 / thr)
                }),
            )
        };
        let ideal: f64 = (0..g.n_ops())
            .map(|i| cost.op_time_s(&g, OpId(i as u32)))
            .sum();
        let pred_sum: f64 = (0..g.n_ops())
            .map(|i| predicted.op_time_s(&g, OpId(i as u32)))
            .sum();
        let cold_fraction = smallest_fraction(&g, &predicted, cost, vmp)?;
        let cold_budget = (cold_fraction * vmp as f64) as u64;
        let cold_there = plan_and_simulate("tensile", &g, &predicted, cost, cold_budget)?;
        let warm_there = plan_and_simulate("tensile", &g, cost, cost, cold_budget)?;
        eprintln!(
            "| {label} | {fraction:.4} | {paper_t:.4} | {paper_c:.4} | {} | {} | {:.3} | {} | {cold_fraction:.4} | {} | {} | {} |",
            fmt_eor(warm.map(|w| w.0 / vtc)),
            fmt_eor(cold.map(|c| c.0 / vtc)),
            pred_sum / ideal,
            fmt_eor(passive(budget)?.map(|p| p * ideal / vtc)),
            fmt_eor(cold_there.map(|c| c.0 / vtc)),
            fmt_eor(warm_there.map(|w| w.0 / vtc)),
            fmt_eor(passive(cold_budget)?.map(|p| p * ideal / vtc)),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- section 4

/// Longest run of EWMA iterations simulated.
const MAX_ITERS: usize = 40;
/// "Reached the warm plan's time": within this fraction of it.
const WITHIN: f64 = 0.01;

struct EwmaRun {
    /// Iteration after which the plan in use first simulated within `WITHIN`.
    reached_at: Option<usize>,
    /// Iteration after which the tracked latency sum was first within `WITHIN`
    /// of the changed sum.
    sum_within_at: Option<usize>,
    /// Replans the trigger asked for, and how many of them were infeasible.
    replans: usize,
    infeasible_replans: usize,
    /// The plan in use's time over the target's, before and at the end.
    first_ratio: f64,
    last_ratio: f64,
}

/// Starts from the plan made with the unchanged times, then each iteration
/// measures the changed times, folds them in, and replans when triggered.
fn ewma_run(
    g: &Graph,
    cost: &RooflineModel,
    changed: &ScaledOps<'_>,
    budget: u64,
    target_s: f64,
    alpha: f64,
    threshold: f64,
) -> Res<EwmaRun> {
    let trigger = ReplanTrigger::new(threshold).map_err(err)?;
    let mut tracker = EwmaTracker::from_cost_model(g, cost, alpha).map_err(err)?;
    let measured: Vec<Option<f64>> = (0..g.n_ops())
        .map(|i| Some(changed.op_time_s(g, OpId(i as u32))))
        .collect();
    let (mut current_s, ..) = plan_and_simulate("tensile", g, cost, changed, budget)?
        .ok_or("the plan made with the unchanged times is infeasible")?;
    let within = |t: f64| t <= target_s * (1.0 + WITHIN);
    let mut run = EwmaRun {
        reached_at: within(current_s).then_some(0),
        sum_within_at: None,
        replans: 0,
        infeasible_replans: 0,
        first_ratio: current_s / target_s,
        last_ratio: current_s / target_s,
    };
    let changed_sum_s: f64 = measured.iter().flatten().sum();
    // Runs until the tracked sum has settled (and the plan reached the
    // target), so the replans the trigger makes on the way are all counted.
    for iter in 1..=MAX_ITERS {
        if run.reached_at.is_some() && run.sum_within_at.is_some() {
            break;
        }
        tracker.update(&measured).map_err(err)?;
        if run.sum_within_at.is_none()
            && (tracker.sum_s() - changed_sum_s).abs() <= WITHIN * changed_sum_s
        {
            run.sum_within_at = Some(iter);
        }
        if trigger.fires(tracker.sum_s(), tracker.planned_sum_s()) {
            let model = tracker.cost_model(g, cost.device().clone()).map_err(err)?;
            run.replans += 1;
            // An infeasible replan keeps the plan in use and the sum it was
            // made at, so the trigger fires again with the next estimates.
            match plan_and_simulate("tensile", g, &model, changed, budget)? {
                Some((t, ..)) => {
                    current_s = t;
                    tracker.mark_planned();
                }
                None => run.infeasible_replans += 1,
            }
        }
        if run.reached_at.is_none() && within(current_s) {
            run.reached_at = Some(iter);
        }
    }
    run.last_ratio = current_s / target_s;
    Ok(run)
}

fn section_ewma(cost: &RooflineModel, sweep: bool) -> Res<()> {
    eprintln!("\n### EWMA after every op of the job changes speed, `{DEVICE}`, batch {BATCH}\n");
    eprintln!(
        "| model | op times x | budget / VMP | alpha | threshold | old plan's time / new warm plan's | iterations until the plan in use is within 1% of the new warm plan | iterations until the EWMA latency sum is within 1% | replans until both (infeasible) | plan in use / new warm plan at the end |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|");
    let settings: &[(f64, f64)] = if sweep {
        &[
            (0.5, 0.05),
            (0.25, 0.05),
            (0.8, 0.05),
            (0.5, 0.02),
            (0.5, 0.10),
        ]
    } else {
        &[(0.5, 0.05)]
    };
    for (label, name, _, fraction, ..) in TARGETS {
        let g = build(name, BATCH, &BTreeMap::new())?;
        let (_, vmp) = vanilla(&g, cost)?;
        for factor in [2.0, 0.5] {
            let changed = ScaledOps {
                inner: cost,
                factor,
            };
            // The budget must admit both the old plan (made with the unchanged
            // times, feasible from `fraction` up) and a new one made with the
            // changed times.
            let new_fraction = smallest_fraction(&g, &changed, &changed, vmp)?;
            let budget_fraction = fraction.max(new_fraction);
            let budget = (budget_fraction * vmp as f64) as u64;
            let Some((target_s, ..)) =
                plan_and_simulate("tensile", &g, &changed, &changed, budget)?
            else {
                eprintln!(
                    "| {label} | {factor} | {budget_fraction:.4} | | | the plan made with the changed times is infeasible | | | | |"
                );
                continue;
            };
            if plan_and_simulate("tensile", &g, cost, &changed, budget)?.is_none() {
                eprintln!(
                    "| {label} | {factor} | {budget_fraction:.4} | | | the plan made with the unchanged times is infeasible | | | | |"
                );
                continue;
            }
            for &(alpha, threshold) in settings {
                let r = ewma_run(&g, cost, &changed, budget, target_s, alpha, threshold)?;
                let iters = |k: Option<usize>| {
                    k.map_or(format!("not within {MAX_ITERS}"), |k| k.to_string())
                };
                eprintln!(
                    "| {label} | {factor} | {budget_fraction:.4} | {alpha} | {threshold} | {:.4} | {} | {} | {} ({}) | {:.4} |",
                    r.first_ratio,
                    iters(r.reached_at),
                    iters(r.sum_within_at),
                    r.replans,
                    r.infeasible_replans,
                    r.last_ratio,
                );
            }
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    if want("cpu") {
        section_cpu()?;
    }
    let cost = roofline()?;
    if want("roofline") || want("coldstart") {
        let pool = roofline_pool(&cost)?;
        let mut predictors = BTreeMap::new();
        for (_, name, family, ..) in TARGETS {
            let train = train_set(&pool, family);
            predictors.insert(
                name,
                MlpPredictor::fit(&train, &MlpConfig::default()).map_err(err)?,
            );
        }
        if want("roofline") {
            section_roofline(&cost, &pool, &predictors)?;
        }
        if want("coldstart") {
            section_coldstart(&cost, &predictors)?;
        }
    }
    if want("ewma") {
        section_ewma(&cost, want("sweep"))?;
    }
    Ok(())
}
