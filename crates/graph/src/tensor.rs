//! Tensors: shape, dtype, bytes, kind, producer, and the two aliasing relations.

use crate::{DType, OpId, TensorId};
use serde::{Deserialize, Serialize};

/// What a tensor is for. Decides persistence and how planners may treat it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A trainable weight; persistent across iterations.
    Parameter,
    /// A non-trainable persistent tensor, e.g. batch-norm running statistics.
    Buffer,
    /// Optimizer state (momentum, Adam moments); persistent.
    OptimizerState,
    /// The gradient of a parameter, produced in backward, consumed by the optimizer.
    ParameterGradient,
    /// A forward intermediate.
    Activation,
    /// The gradient of an activation.
    Gradient,
    /// The input batch.
    Input,
    /// The labels / targets.
    Label,
    /// The scalar loss.
    Loss,
    /// A short-lived scratch tensor (e.g. optimizer temporaries).
    Temporary,
}

impl TensorKind {
    /// Graph inputs that live across iterations (their in-place updates included).
    pub fn is_persistent(self) -> bool {
        matches!(
            self,
            TensorKind::Parameter | TensorKind::Buffer | TensorKind::OptimizerState
        )
    }

    /// Kinds that enter the graph from outside and so have no producer.
    pub fn is_graph_input(self) -> bool {
        self.is_persistent() || matches!(self, TensorKind::Input | TensorKind::Label)
    }
}

/// One tensor of the training graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    pub id: TensorId,
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    /// Element count times element size. Views still record their logical size.
    pub size_bytes: u64,
    pub kind: TensorKind,
    /// The op that creates it; `None` for graph inputs.
    pub producer: Option<OpId>,
    /// This tensor is a view of that tensor's storage: it allocates nothing and
    /// keeps its owner alive while it is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_of: Option<TensorId>,
    /// This tensor is the optimizer's (or a buffer update's) new value of that
    /// persistent input: same memory, and what the next iteration reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inplace_update_of: Option<TensorId>,
    /// Returned by the step; lives until the end of the iteration.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_output: bool,
}

impl Tensor {
    /// Whether the tensor owns storage of its own.
    pub fn allocates(&self) -> bool {
        self.view_of.is_none() && self.inplace_update_of.is_none()
    }

    /// Whether the tensor is a persistent graph input (a parameter, buffer or
    /// optimizer state that is resident across iterations, not its update).
    pub fn is_persistent(&self) -> bool {
        self.kind.is_persistent() && self.producer.is_none() && self.allocates()
    }

    /// Number of elements (saturating: a validated graph's shapes never
    /// saturate, and validation reports the overflow of an unvalidated one).
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }
}
