//! Cold start by predicted latencies and EWMA correction (TENSILE, paper 004,
//! Sec. IV-A and IV-E).
//!
//! - [`features`]: an op's features from the graph IR alone (kind, class,
//!   phase, FLOPs, bytes read / written, element counts, window attributes).
//! - [`LatencyPredictor`]: predicts `ln(time_s)` of an op from its features.
//!   Two models: [`MlpPredictor`] (TENSILE's 4-layer MLP, [`mlp`]) and
//!   [`PerKindLeastSquares`] (a log-log least-squares baseline, [`linear`]).
//! - [`Dataset`]: training and test rows from measured latency tables
//!   (`outcore-latency-table/1`, matched to their graph by op id and name) or
//!   from a cost model's times; [`ErrorReport`]: median and p90 relative error
//!   per op and the error of each graph's summed iteration latency.
//! - [`PredictedModel`]: a [`crate::CostModel`] pricing every op by a
//!   predictor (a plan made before anything has run); [`OpTimesModel`]: one
//!   pricing ops by a vector of per-op times (the EWMA estimates).
//! - [`ewma`]: [`EwmaTracker`], per-op latencies that start from predictions
//!   and follow measurements, and [`ReplanTrigger`], TENSILE's "average latency
//!   rate of change" `|s' - s| / s` against a threshold.
//!
//! # Which predictor
//!
//! Measured with `cargo run --release -p outcore-planners --example
//! tensile_coldstart -- cpu roofline` (2-core VM, 2026-11-23; RESULTS.md,
//! "TENSILE: cold start and EWMA replanning"), relative error per op
//! (median / p90) and of the summed latency per graph (mean over graphs):
//!
//! | held out | MLP | per-kind least squares |
//! |---|---|---|
//! | CPU tables, batches 16 and 64 | 0.20 / 0.59, sum 0.11 | 0.28 / 0.94, sum 0.14 |
//! | CPU tables, largest width of each model | 0.29 / 0.92, sum 0.18 | 0.25 / 0.93, sum 0.15 |
//! | CPU tables, whole model `mlp` | 0.42 / 3.39, sum 0.30 | 0.41 / 1.00, sum 0.24 |
//! | CPU tables, whole model `tiny-cnn` | 0.45 / 1.17, sum 0.63 | 0.67 / 0.97, sum 0.90 |
//! | CPU tables, whole model `tiny-transformer` | 0.52 / 0.95, sum 0.43 | 0.81 / 1.7e9, sum 3.4e6 |
//! | roofline `a6000-48gb`, held-out family (5 models) | 0.015-0.033 / 0.05-0.21, sum 0.000-0.168 | 0.13-0.36 / 0.47-0.90, sum 0.12-0.79 |
//!
//! The MLP is the default ([`default_predictor`]): on the roofline times the
//! simulated experiments use it is about ten times more accurate per op and
//! its summed latency is within 1% on four of five held-out models; on the
//! measured tables it wins on held-out batches and on two of the three
//! held-out models, and loses on held-out widths (slightly) and on the
//! held-out `mlp` model's tail (p90 3.4 vs 1.0). The baseline's failure mode
//! is worse: on `tiny-transformer` some predictions reach the clamp
//! [`MAX_TIME_S`] (p90 error 1.7e9).

pub mod ewma;
pub mod features;
pub mod linear;
pub mod mlp;
mod model;

pub use ewma::{EwmaTracker, ReplanTrigger};
pub use features::{FEATURE_NAMES, N_FEATURES, OpFeatures, op_features};
pub use linear::PerKindLeastSquares;
pub use mlp::{Mlp, MlpConfig};
pub use model::{OpTimesModel, PredictedModel};

use crate::measured::MeasuredTable;
use crate::model::CostModel;
use outcore_graph::{Graph, OpId};
use std::collections::BTreeMap;

/// Shortest time a row may claim: `ln` of a measured 0 s would be `-inf`.
pub const MIN_TIME_S: f64 = 1e-9;

/// Longest time a prediction may give, so a wild extrapolation stays finite.
pub const MAX_TIME_S: f64 = 1e4;

/// Errors of building data sets, training predictors and tracking latencies.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PredictError {
    #[error(
        "{origin}: the latency table has no entries; record one with `outcore run --profile-out`"
    )]
    EmptyTable { origin: String },
    #[error(
        "{origin}: entry for op {op} (`{name}`) {detail}; was the table recorded on another graph or batch?"
    )]
    UnknownOp {
        origin: String,
        op: u32,
        name: String,
        detail: String,
    },
    #[error(
        "{origin}: op {op} (`{name}`) has time_s = {value}; times must be finite and non-negative seconds"
    )]
    BadTime {
        origin: String,
        op: u32,
        name: String,
        value: f64,
    },
    #[error("cannot train: {detail}")]
    EmptyTrainingSet { detail: String },
    #[error("`{field}` = {value} is out of range; use {range}")]
    BadConfig {
        field: &'static str,
        value: String,
        range: &'static str,
    },
    #[error("{what}: expected {expected} per-op times (one per op of the graph), got {got}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// Predicts an op's time from its features.
pub trait LatencyPredictor: std::fmt::Debug + Send + Sync {
    /// `ln(time_s)`, the scale the models are fitted on.
    fn predict_ln_time_s(&self, features: &OpFeatures) -> f64;

    /// Seconds, clamped to `[MIN_TIME_S, MAX_TIME_S]` (NaN gives `MIN_TIME_S`).
    fn predict_time_s(&self, features: &OpFeatures) -> f64 {
        let t = self.predict_ln_time_s(features).exp();
        if t.is_nan() {
            MIN_TIME_S
        } else {
            t.clamp(MIN_TIME_S, MAX_TIME_S)
        }
    }

    /// A short label for reports.
    fn name(&self) -> String;
}

impl<T: LatencyPredictor + ?Sized> LatencyPredictor for &T {
    fn predict_ln_time_s(&self, features: &OpFeatures) -> f64 {
        (**self).predict_ln_time_s(features)
    }
    fn name(&self) -> String {
        (**self).name()
    }
}

impl<T: LatencyPredictor + ?Sized> LatencyPredictor for Box<T> {
    fn predict_ln_time_s(&self, features: &OpFeatures) -> f64 {
        (**self).predict_ln_time_s(features)
    }
    fn name(&self) -> String {
        (**self).name()
    }
}

impl<T: LatencyPredictor + ?Sized> LatencyPredictor for std::sync::Arc<T> {
    fn predict_ln_time_s(&self, features: &OpFeatures) -> f64 {
        (**self).predict_ln_time_s(features)
    }
    fn name(&self) -> String {
        (**self).name()
    }
}

/// One training or test row: an op's features and its time.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub features: OpFeatures,
    pub time_s: f64,
    /// The graph (table) the row came from; errors of summed latency are per source.
    pub source: String,
}

impl Sample {
    /// `ln(max(time_s, MIN_TIME_S))`.
    pub fn ln_time_s(&self) -> f64 {
        self.time_s.max(MIN_TIME_S).ln()
    }
}

/// Rows from one or more graphs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    pub samples: Vec<Sample>,
}

impl Dataset {
    /// The rows of a measured table of `graph`. Every entry must name an op of
    /// the graph by id and name, with a finite, non-negative time; a table
    /// with no entries is an error. `origin` names the table in errors.
    pub fn from_table(
        graph: &Graph,
        table: &MeasuredTable,
        origin: &str,
    ) -> Result<Dataset, PredictError> {
        if table.entries.is_empty() {
            return Err(PredictError::EmptyTable {
                origin: origin.to_string(),
            });
        }
        let mut samples = Vec::with_capacity(table.entries.len());
        for e in &table.entries {
            let unknown = |detail: String| PredictError::UnknownOp {
                origin: origin.to_string(),
                op: e.op,
                name: e.name.clone(),
                detail,
            };
            let Some(op) = graph.ops.get(e.op as usize) else {
                return Err(unknown(format!(
                    "is beyond the graph's {} ops",
                    graph.n_ops()
                )));
            };
            if op.name != e.name {
                return Err(unknown(format!("names `{}` in the graph", op.name)));
            }
            if !(e.time_s.is_finite() && e.time_s >= 0.0) {
                return Err(PredictError::BadTime {
                    origin: origin.to_string(),
                    op: e.op,
                    name: e.name.clone(),
                    value: e.time_s,
                });
            }
            samples.push(Sample {
                features: op_features(graph, OpId(e.op)),
                time_s: e.time_s,
                source: origin.to_string(),
            });
        }
        Ok(Dataset { samples })
    }

    /// The rows of every op of `graph` priced by `cost` (e.g. the roofline
    /// model as the simulated experiments' truth).
    pub fn from_cost_model(graph: &Graph, cost: &dyn CostModel, source: &str) -> Dataset {
        let samples = graph
            .ops
            .iter()
            .map(|op| Sample {
                features: op_features(graph, op.id),
                time_s: cost.op_time_s(graph, op.id),
                source: source.to_string(),
            })
            .collect();
        Dataset { samples }
    }

    /// Appends another data set's rows.
    pub fn extend(&mut self, other: Dataset) {
        self.samples.extend(other.samples);
    }

    /// Rows with identical kind and features merged into one (geometric mean
    /// of their times): repeated blocks of a model would otherwise weigh on
    /// the fit as many times as they repeat, and training takes longer.
    pub fn deduplicated(&self) -> Dataset {
        let mut groups: BTreeMap<(String, Vec<u64>), (Sample, f64, usize)> = BTreeMap::new();
        for s in &self.samples {
            let key = (
                s.features.kind.clone(),
                s.features.values.iter().map(|v| v.to_bits()).collect(),
            );
            let entry = groups.entry(key).or_insert_with(|| (s.clone(), 0.0, 0));
            entry.1 += s.ln_time_s();
            entry.2 += 1;
        }
        let samples = groups
            .into_values()
            .map(|(mut s, ln_sum, n)| {
                s.time_s = (ln_sum / n as f64).exp();
                s
            })
            .collect();
        Dataset { samples }
    }
}

/// Trains the MLP on `data` (deduplicated first).
#[derive(Debug, Clone, PartialEq)]
pub struct MlpPredictor {
    pub mlp: Mlp,
}

impl MlpPredictor {
    pub fn fit(data: &Dataset, config: &MlpConfig) -> Result<MlpPredictor, PredictError> {
        let data = data.deduplicated();
        let xs: Vec<Vec<f64>> = data
            .samples
            .iter()
            .map(|s| s.features.values.to_vec())
            .collect();
        let ys: Vec<f64> = data.samples.iter().map(Sample::ln_time_s).collect();
        Ok(MlpPredictor {
            mlp: Mlp::fit(&xs, &ys, config)?,
        })
    }
}

impl LatencyPredictor for MlpPredictor {
    fn predict_ln_time_s(&self, features: &OpFeatures) -> f64 {
        self.mlp.predict(&features.values)
    }
    fn name(&self) -> String {
        "mlp".into()
    }
}

/// The predictor the cold-start experiments use (see the module docs for why):
/// [`MlpPredictor`] with the default configuration.
pub fn default_predictor(data: &Dataset) -> Result<MlpPredictor, PredictError> {
    MlpPredictor::fit(data, &MlpConfig::default())
}

/// How well a predictor does on a data set.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReport {
    /// Rows scored.
    pub n: usize,
    /// Median over rows of `|predicted - true| / true`.
    pub median_rel_error: f64,
    /// 90th percentile of the same.
    pub p90_rel_error: f64,
    /// Per source: `|sum(predicted) - sum(true)| / sum(true)`, i.e. the error of
    /// the summed iteration latency (one value per graph / table).
    pub sum_rel_error_by_source: BTreeMap<String, f64>,
}

impl ErrorReport {
    /// Largest summed-latency error over the sources.
    pub fn max_sum_rel_error(&self) -> f64 {
        self.sum_rel_error_by_source
            .values()
            .copied()
            .fold(0.0, f64::max)
    }

    /// Mean summed-latency error over the sources.
    pub fn mean_sum_rel_error(&self) -> f64 {
        let n = self.sum_rel_error_by_source.len().max(1) as f64;
        self.sum_rel_error_by_source.values().sum::<f64>() / n
    }
}

/// The `q`-quantile (nearest rank) of `values`, which must be sorted.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl ErrorReport {
    /// The report over `(predicted_s, true_s, source)` rows: a true time below
    /// [`MIN_TIME_S`] is compared against `MIN_TIME_S`, per row and per
    /// source's sum. For predictions that do not come from a
    /// [`LatencyPredictor`] (a cost model's times, say).
    pub fn from_rows<'a>(rows: impl IntoIterator<Item = (f64, f64, &'a str)>) -> ErrorReport {
        let mut errors = Vec::new();
        let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (predicted, true_s, source) in rows {
            let truth = true_s.max(MIN_TIME_S);
            errors.push((predicted - truth).abs() / truth);
            let e = sums.entry(source.to_string()).or_default();
            e.0 += predicted;
            e.1 += true_s;
        }
        errors.sort_by(f64::total_cmp);
        ErrorReport {
            n: errors.len(),
            median_rel_error: quantile(&errors, 0.5),
            p90_rel_error: quantile(&errors, 0.9),
            sum_rel_error_by_source: sums
                .into_iter()
                .map(|(k, (p, t))| (k, (p - t).abs() / t.max(MIN_TIME_S)))
                .collect(),
        }
    }
}

/// Scores `predictor` on every row of `data` (rows with true time below
/// [`MIN_TIME_S`] are compared against `MIN_TIME_S`).
pub fn evaluate(predictor: &dyn LatencyPredictor, data: &Dataset) -> ErrorReport {
    ErrorReport::from_rows(data.samples.iter().map(|s| {
        (
            predictor.predict_time_s(&s.features),
            s.time_s,
            s.source.as_str(),
        )
    }))
}

#[cfg(test)]
mod tests;
