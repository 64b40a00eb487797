//! outcore-cost: device profiles and cost models that price ops on the compute
//! stream and copies on the host link, for the planners and the simulator.
//!
//! - [`DeviceProfile`]: peaks, bandwidths and host-link rates of a device; built-in
//!   profiles for the papers' testbeds and current GPUs, or a user's JSON file.
//! - [`CostModel`]: the trait; [`RooflineModel`] (analytic, per-class
//!   [`Efficiencies`]), [`MeasuredModel`] (a [`MeasuredTable`] of per-op times
//!   over a fallback model) and [`UnitCostModel`] (hand-checkable numbers for tests).
//! - [`predict`]: op latencies predicted from the graph (cold start), EWMA
//!   correction from measurements and TENSILE's replanning trigger.
//!
//! All rates are bytes/s or FLOP/s and all times seconds.

mod device;
mod error;
mod measured;
mod model;
pub mod predict;
mod roofline;

pub use device::{DeviceProfile, MAX_OVERHEAD_S, MAX_RATE_PER_S, Tf32};
pub use error::{CostError, CostErrorKind};
pub use measured::{
    CopyDirection, Coverage, LATENCY_TABLE_FORMAT, MeasuredCopies, MeasuredCopyEntry,
    MeasuredEntry, MeasuredModel, MeasuredTable, NameMismatch,
};
pub use model::{CopyRates, CostModel, ScaledOps, UnitCostModel};
pub use roofline::{
    ClassEfficiency, Efficiencies, OpBounds, RooflineModel, TF32_CONVOLUTION_COMPUTE_EFFICIENCY,
    op_dtype,
};
