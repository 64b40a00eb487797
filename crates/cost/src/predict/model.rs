//! Cost models over predicted or tracked latencies, so planners can plan with
//! them exactly as with the roofline or a measured table.
//!
//! Copies are priced by the device profile's rates in both: TENSILE predicts
//! operator latencies only (Sec. IV-A), and a link's rate is one number that a
//! profile (or a measured table's fitted rates) already states.

use super::{LatencyPredictor, PredictError, op_features};
use crate::device::DeviceProfile;
use crate::model::CostModel;
use outcore_graph::{Graph, OpId};

/// Prices every op by a predictor's time (the cold start: a plan made before
/// any op has run).
#[derive(Debug, Clone)]
pub struct PredictedModel<P: LatencyPredictor> {
    predictor: P,
    device: DeviceProfile,
}

impl<P: LatencyPredictor> PredictedModel<P> {
    pub fn new(predictor: P, device: DeviceProfile) -> Self {
        PredictedModel { predictor, device }
    }

    pub fn predictor(&self) -> &P {
        &self.predictor
    }
}

impl<P: LatencyPredictor> CostModel for PredictedModel<P> {
    fn device(&self) -> &DeviceProfile {
        &self.device
    }

    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        self.predictor.predict_time_s(&op_features(graph, op))
    }

    fn name(&self) -> String {
        format!("predicted({}, {})", self.predictor.name(), self.device.name)
    }
}

/// Prices the ops of one graph by a vector of per-op times (e.g. an
/// [`super::EwmaTracker`]'s estimates), matched by op id and name.
///
/// A graph whose op of that id has another name (the model was built for
/// another graph) gets `NaN` for it: a visibly broken time (NaN iteration
/// times, a stuck simulation) rather than a plausible wrong one. Build one
/// model per graph with [`OpTimesModel::new`], which checks the length.
#[derive(Debug, Clone)]
pub struct OpTimesModel {
    names: Vec<String>,
    times_s: Vec<f64>,
    device: DeviceProfile,
    label: String,
}

impl OpTimesModel {
    /// One time per op of `graph`, in op order; finite and non-negative.
    pub fn new(
        graph: &Graph,
        times_s: Vec<f64>,
        device: DeviceProfile,
        label: &str,
    ) -> Result<OpTimesModel, PredictError> {
        if times_s.len() != graph.n_ops() {
            return Err(PredictError::LengthMismatch {
                what: "per-op times",
                expected: graph.n_ops(),
                got: times_s.len(),
            });
        }
        if let Some(i) = times_s.iter().position(|t| !(t.is_finite() && *t >= 0.0)) {
            return Err(PredictError::BadConfig {
                field: "times_s",
                value: format!("op {i} (`{}`): {}", graph.ops[i].name, times_s[i]),
                range: "finite, non-negative seconds",
            });
        }
        Ok(OpTimesModel {
            names: graph.ops.iter().map(|o| o.name.clone()).collect(),
            times_s,
            device,
            label: label.to_string(),
        })
    }

    pub fn times_s(&self) -> &[f64] {
        &self.times_s
    }
}

impl CostModel for OpTimesModel {
    fn device(&self) -> &DeviceProfile {
        &self.device
    }

    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        match (graph.ops.get(op.index()), self.names.get(op.index())) {
            (Some(o), Some(name)) if o.name == *name => self.times_s[op.index()],
            _ => f64::NAN,
        }
    }

    fn name(&self) -> String {
        format!("{}({})", self.label, self.device.name)
    }
}
