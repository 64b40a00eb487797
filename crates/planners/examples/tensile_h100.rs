//! TENSILE's latency predictor and cold start on latencies measured on a real
//! GPU (issue 13 item 4): the tables `tools/gpu_latency_tables.py` recorded on
//! an H100 (`docs/data/predict/h100-2026-11-24.tar.xz`, unpacked into DIR).
//! Two sections, each a markdown table on stderr:
//!
//! 1. `predict`: the MLP and the per-kind least squares trained on the
//!    measured tables of every family but one, scored on the held-out
//!    family's tables (all batches), and on held-out batches; beside them the
//!    roofline model of `h100-80gb`, which needs no training (what the
//!    simulated H100 experiments of this repository price ops with).
//! 2. `coldstart`: `tensile` in the paper's active mode (one byte below VMP)
//!    planned with the measured times (warm), with the MLP's predictions (cold,
//!    its family not trained on) and with the roofline's times; every plan
//!    simulated with the measured times. With `--write OUT`, the predicted
//!    times of each model are written as `outcore-latency-table/1` files
//!    (`<stem>.pred.lat.json`), so the same plans can be made and run on the
//!    GPU by `tools/gpu_tensile.py`.
//!
//! `cargo run --release -p outcore-planners --example tensile_h100 -- DIR [predict] [coldstart] [--write OUT]`

mod common;

use outcore_cost::predict::{
    Dataset, ErrorReport, LatencyPredictor, MlpConfig, MlpPredictor, PredictedModel, evaluate,
};
use outcore_cost::{CostModel, DeviceProfile, MeasuredModel, MeasuredTable, RooflineModel};
use outcore_graph::format::load_graph_file;
use outcore_graph::{Graph, OpId};
use std::path::{Path, PathBuf};

const DEVICE: &str = "h100-80gb";

/// Families of the measured models: a held-out family's models are all left
/// out of training (GoogLeNet is Inception v1, so it goes with Inception v3).
const FAMILIES: [(&str, &str); 13] = [
    ("resnet18", "resnet"),
    ("resnet50", "resnet"),
    ("resnet101", "resnet"),
    ("vgg16", "vgg"),
    ("vgg19", "vgg"),
    ("inception_v3", "inception"),
    ("googlenet", "inception"),
    ("densenet121", "densenet"),
    ("mobilenet_v2", "mobilenet"),
    ("efficientnet_b0", "efficientnet"),
    ("squeezenet1_1", "squeezenet"),
    ("vit_b_16", "vit"),
    ("gpt2-small-seq256", "gpt"),
];

/// The cold-start models: Table II's four that torchvision has (Inception v4
/// is not in torchvision), plus ViT-B/16, at batch 64, where the H100 is busy
/// with kernels rather than waiting for their launches (see RESULTS.md).
const COLD_MODELS: [(&str, &str); 5] = [
    ("VGG-16", "vgg16__b64"),
    ("Inception v3", "inception_v3__b64"),
    ("ResNet-50", "resnet50__b64"),
    ("DenseNet-121", "densenet121__b64"),
    ("ViT-B/16", "vit_b_16__b64"),
];

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One measured configuration: its graph and table.
struct Config {
    stem: String,
    family: &'static str,
    batch: u64,
    graph: Graph,
    table: MeasuredTable,
    data: Dataset,
}

fn family_of(model: &str) -> Res<&'static str> {
    FAMILIES
        .iter()
        .find(|(m, _)| *m == model)
        .map(|(_, f)| *f)
        .ok_or_else(|| format!("model `{model}` has no family in FAMILIES; add it"))
}

/// Every `<model>__b<batch>.graph.json` with its `.lat.json` in `dir`.
fn load(dir: &Path) -> Res<Vec<Config>> {
    let mut stems: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".graph.json"))
                .map(str::to_string)
        })
        .collect();
    stems.sort();
    if stems.is_empty() {
        return Err(format!(
            "{}: no `<model>__b<batch>.graph.json`; unpack docs/data/predict/h100-2026-11-24.tar.xz there",
            dir.display()
        ));
    }
    let mut out = Vec::new();
    for stem in stems {
        let (model, batch) = stem
            .split_once("__b")
            .and_then(|(m, b)| Some((m.to_string(), b.parse::<u64>().ok()?)))
            .ok_or_else(|| format!("`{stem}` is not <model>__b<batch>"))?;
        let graph = load_graph_file(&dir.join(format!("{stem}.graph.json"))).map_err(err)?;
        let table =
            MeasuredTable::from_json_file(&dir.join(format!("{stem}.lat.json"))).map_err(err)?;
        let data = Dataset::from_table(&graph, &table, &stem).map_err(err)?;
        out.push(Config {
            family: family_of(&model)?,
            stem,
            batch,
            graph,
            table,
            data,
        });
    }
    Ok(out)
}

fn roofline() -> Res<RooflineModel> {
    Ok(RooflineModel::new(
        DeviceProfile::builtin(DEVICE).map_err(err)?,
    ))
}

fn row(label: &str, name: &str, r: &ErrorReport) {
    eprintln!(
        "| {label} | {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
        r.n,
        r.median_rel_error,
        r.p90_rel_error,
        r.mean_sum_rel_error(),
        r.max_sum_rel_error()
    );
}

/// Trains on the configurations `held_out` rejects, scores on the others.
fn split(label: &str, configs: &[Config], held_out: impl Fn(&Config) -> bool) -> Res<()> {
    let (train, test) = common::split(configs, &held_out, |c| &c.data);
    let (mlp, lsq) = common::fit_both(&train)?;
    for p in [&mlp as &dyn LatencyPredictor, &lsq] {
        row(label, &p.name(), &evaluate(p, &test));
    }
    let cost = roofline()?;
    let roof = ErrorReport::from_rows(configs.iter().filter(|c| held_out(c)).flat_map(|c| {
        c.table.entries.iter().map(|e| {
            (
                cost.op_time_s(&c.graph, OpId(e.op)),
                e.time_s,
                c.stem.as_str(),
            )
        })
    }));
    row(label, "roofline (untrained)", &roof);
    Ok(())
}

fn section_predict(configs: &[Config]) -> Res<()> {
    eprintln!(
        "\n### Predictors on H100 measurements ({} tables, {} ops)\n",
        configs.len(),
        configs.iter().map(|c| c.data.samples.len()).sum::<usize>()
    );
    eprintln!(
        "| held out | predictor | test ops | median rel. error / op | p90 | summed-latency error, mean over tables | max |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    let mut families: Vec<&str> = FAMILIES.iter().map(|(_, f)| *f).collect();
    families.dedup();
    for family in families {
        split(&format!("family {family}"), configs, |c| c.family == family)?;
    }
    split("batches 32 and 128", configs, |c| {
        c.batch == 32 || c.batch == 128
    })?;
    Ok(())
}

/// `planner` at `budget_bytes` planning with `plan_cost`, simulated with
/// `true_cost`: (iteration time, peak), or `None` if infeasible.
fn plan_and_simulate(
    planner: &str,
    g: &Graph,
    plan_cost: &dyn CostModel,
    true_cost: &dyn CostModel,
    budget_bytes: u64,
) -> Res<Option<(f64, u64)>> {
    Ok(
        common::plan_and_simulate(planner, g, plan_cost, true_cost, budget_bytes)?
            .map(|(t, peak, _)| (t, peak)),
    )
}

/// `MSR / EOR / CBR` against the vanilla (time, peak), or `inf.`.
fn fmt_group(x: Option<(f64, u64)>, vtc: f64, vmp: u64) -> String {
    x.map_or("inf.".into(), |(t, peak)| {
        let msr = 1.0 - peak as f64 / vmp as f64;
        let eor = t / vtc;
        format!("{msr:.4} / {eor:.4} / {:.4}", msr / eor)
    })
}

fn section_coldstart(configs: &[Config], write: Option<&Path>) -> Res<()> {
    let roof = roofline()?;
    eprintln!(
        "\n### Cold start on H100-measured times: `tensile` active (VMP - 1 byte), simulated with the measured times\n"
    );
    eprintln!(
        "| model | ops | predicted iteration latency sum / measured | roofline sum / measured | warm (measured times): MSR / EOR / CBR | cold (MLP, family held out) | roofline times | `capuchin` at warm's peak |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|");
    for (label, stem) in COLD_MODELS {
        let c = configs
            .iter()
            .find(|c| c.stem == stem)
            .ok_or_else(|| format!("no table `{stem}` in the directory"))?;
        let train =
            configs
                .iter()
                .filter(|o| o.family != c.family)
                .fold(Dataset::default(), |mut d, o| {
                    d.extend(o.data.clone());
                    d
                });
        let mlp = MlpPredictor::fit(&train, &MlpConfig::default()).map_err(err)?;
        let measured = MeasuredModel::new(c.table.clone(), roofline()?);
        let predicted = PredictedModel::new(&mlp, roof.device().clone());
        let g = &c.graph;
        let sum = |m: &dyn CostModel| -> f64 {
            (0..g.n_ops()).map(|i| m.op_time_s(g, OpId(i as u32))).sum()
        };
        let truth_sum = sum(&measured);
        let (vtc, vmp) = plan_and_simulate(
            "none",
            g,
            &measured,
            &measured,
            outcore_graph::footprint(g).0,
        )?
        .ok_or("the vanilla plan is infeasible")?;
        let budget = vmp - 1;
        let warm = plan_and_simulate("tensile", g, &measured, &measured, budget)?;
        let cold = plan_and_simulate("tensile", g, &predicted, &measured, budget)?;
        let analytic = plan_and_simulate("tensile", g, &roof, &measured, budget)?;
        let capuchin = match warm {
            Some((_, peak)) => plan_and_simulate("capuchin", g, &measured, &measured, peak)?,
            None => None,
        };
        eprintln!(
            "| {label} | {} | {:.3} | {:.3} | {} | {} | {} | {} |",
            g.n_ops(),
            sum(&predicted) / truth_sum,
            sum(&roof) / truth_sum,
            fmt_group(warm, vtc, vmp),
            fmt_group(cold, vtc, vmp),
            fmt_group(analytic, vtc, vmp),
            fmt_group(capuchin, vtc, vmp),
        );
        if let Some(out) = write {
            let mut table = MeasuredTable::new(
                &format!("predicted for {DEVICE} by {}", mlp.name()),
                &c.table.graph_model,
            );
            for op in &g.ops {
                table.push(op.id, &op.name, predicted.op_time_s(g, op.id), 1);
            }
            let path: PathBuf = out.join(format!("{stem}.pred.lat.json"));
            table.write_json_file(&path).map_err(err)?;
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut write = None;
    if let Some(i) = args.iter().position(|a| a == "--write") {
        let dir = args
            .get(i + 1)
            .ok_or("--write needs a directory")?
            .to_string();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{dir}: {e}"))?;
        write = Some(PathBuf::from(dir));
        args.drain(i..=i + 1);
    }
    let dir = args.first().ok_or(
        "usage: tensile_h100 DIR [predict] [coldstart] [--write OUT] (DIR: the unpacked tables)",
    )?;
    let configs = load(Path::new(dir))?;
    let want = |s: &str| args.len() == 1 || args[1..].iter().any(|a| a == s);
    if want("predict") {
        section_predict(&configs)?;
    }
    if want("coldstart") {
        section_coldstart(&configs, write.as_deref())?;
    }
    Ok(())
}
