//! The model zoo: builders for the models the papers evaluate and common
//! references, each citing the implementation whose parameter count it matches.

mod cifar;
mod densenet;
mod efficientnet;
mod inception;
mod mobilenet;
mod nasnet;
mod resnet;
mod rnn;
mod squeezenet;
mod tiny;
mod transformer;
mod unet;
mod vgg;

use crate::builder::Optimizer;
use crate::{Graph, GraphError, GraphErrorKind};
use std::collections::BTreeMap;

/// A model's tunable knob (depth, width, sequence length, ...).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Knob {
    pub name: &'static str,
    pub default: u64,
    pub help: &'static str,
}

/// The request a builder serves: batch size, knob values (defaults filled in),
/// and the optimizer whose updates end the step.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub batch: u64,
    pub knobs: BTreeMap<String, u64>,
    pub optimizer: Optimizer,
}

impl ModelRequest {
    /// The value of a knob (every knob has a default, filled in by [`build`]).
    pub fn knob(&self, name: &str) -> u64 {
        self.knobs.get(name).copied().unwrap_or(0)
    }
}

/// A model the zoo can build.
#[derive(Debug, Clone, Copy)]
pub struct ModelInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// The reference implementation the builder follows.
    pub source: &'static str,
    pub knobs: &'static [Knob],
    pub default_batch: u64,
    /// Parameter count of the reference at default knobs, if published.
    pub reference_param_count: Option<u64>,
    /// Default optimizer: SGD + momentum for vision models, AdamW for transformers.
    pub default_optimizer: fn() -> Optimizer,
    /// Builds the graph; receives the model's registered name so one function can
    /// serve a family.
    pub build: fn(&'static str, &ModelRequest) -> Result<Graph, GraphError>,
}

/// Every model in the zoo, in listing order.
pub fn models() -> Vec<ModelInfo> {
    let mut all = Vec::new();
    all.extend(resnet::models());
    all.extend(vgg::models());
    all.extend(inception::models());
    all.extend(densenet::models());
    all.extend(mobilenet::models());
    all.extend(efficientnet::models());
    all.extend(squeezenet::models());
    all.extend(nasnet::models());
    all.extend(unet::models());
    all.extend(rnn::models());
    all.extend(transformer::models());
    all.extend(cifar::models());
    all.extend(tiny::models());
    all
}

/// Looks a model up by name.
pub fn find(name: &str) -> Result<ModelInfo, GraphError> {
    models()
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| {
            GraphErrorKind::UnknownModel {
                name: name.to_string(),
            }
            .into()
        })
}

/// Builds `name` at `batch` (default batch if `None`) with knob overrides and an
/// optional optimizer override; unknown knobs and zero values are errors.
pub fn build(
    name: &str,
    batch: Option<u64>,
    knob_overrides: &BTreeMap<String, u64>,
    optimizer: Option<Optimizer>,
) -> Result<Graph, GraphError> {
    let info = find(name)?;
    let mut knobs: BTreeMap<String, u64> = info
        .knobs
        .iter()
        .map(|k| (k.name.to_string(), k.default))
        .collect();
    for (k, &v) in knob_overrides {
        if !knobs.contains_key(k) {
            let known: Vec<&str> = info.knobs.iter().map(|k| k.name).collect();
            return Err(bad_knob(
                name,
                format!(
                    "unknown knob `{k}`; its knobs are: {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        let max = knob_max(k);
        if !(1..=max).contains(&v) {
            return Err(bad_knob(
                name,
                format!("knob `{k}` = {v} is out of range; accepted: 1 to {max}"),
            ));
        }
        knobs.insert(k.clone(), v);
    }
    let batch = batch.unwrap_or(info.default_batch);
    if batch == 0 {
        return Err(bad_knob(name, "batch must be at least 1".into()));
    }
    if batch > MAX_BATCH {
        return Err(bad_knob(
            name,
            format!("batch {batch} is out of range; accepted: 1 to {MAX_BATCH}"),
        ));
    }
    let request = ModelRequest {
        batch,
        knobs,
        optimizer: optimizer.unwrap_or_else(info.default_optimizer),
    };
    (info.build)(info.name, &request)
}

/// The largest batch accepted: 2^24. Sizes and FLOPs beyond it are checked
/// anyway (an overflow is an error), but no planning question needs more.
pub const MAX_BATCH: u64 = 1 << 24;

/// The largest value accepted for a knob. Knobs that repeat layers or unroll
/// steps (`depth`, `layers`) bound the graph's op count, and so the
/// memory a graph takes (GPT-2 at 1000 layers is about 150,000 ops, well under
/// 1 GB); the others bound tensor shapes, whose products are overflow-checked by
/// the builder. Every default is far inside its bound.
pub fn knob_max(name: &str) -> u64 {
    match name {
        "depth" | "layers" => 1000,
        "width" | "heads" => 4096,
        // `repeats`, `scale`, `filters` and `size` have tighter, model-specific
        // checks in their builders.
        "seq" | "filters" | "size" => 1 << 16,
        "hidden" => 1 << 20,
        "vocab" => 1 << 24,
        // A knob added without a bound of its own still gets one.
        _ => 1 << 16,
    }
}

/// A knob error for `model`.
pub(crate) fn bad_knob(model: &str, detail: String) -> GraphError {
    GraphErrorKind::BadKnob {
        model: model.to_string(),
        detail,
    }
    .into()
}
