//! outcore-graph: the training-graph IR (an index arena of tensors and ops), its
//! validation and analyses, the layer builder that emits backward and optimizer
//! ops, the model zoo, and the graph file formats.

mod analysis;
pub mod builder;
mod dtype;
mod error;
pub mod format;
mod graph;
mod ids;
mod op;
pub mod recompute;
mod tensor;
mod validate;
pub mod zoo;

pub use analysis::{
    GraphStats, LiveInterval, footprint, live_bytes_per_op, live_intervals,
    saved_for_backward_bytes, stats,
};
pub use dtype::DType;
pub use error::{GraphError, GraphErrorKind, Location, ValidationErrors, Violation, ViolationKind};
pub use graph::{Graph, GraphMeta};
pub use ids::{OpId, TensorId};
pub use op::{Conv2dAttrs, Op, OpClass, OpKind, Phase, Pool2dAttrs};
pub use recompute::{NotRecomputable, not_recomputable_counts, not_recomputable_reason};
pub use tensor::{Tensor, TensorKind};
pub use validate::validate;
