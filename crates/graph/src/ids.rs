//! Dense index types for the arena IR: tensors and ops are addressed by position.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Index of a tensor in [`crate::Graph::tensors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TensorId(pub u32);

/// Index of an op in [`crate::Graph::ops`]; also its position in the graph's own order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OpId(pub u32);

impl TensorId {
    /// The index as `usize`, for slice access.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl OpId {
    /// The index as `usize`, for slice access.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}
