//! Errors of graph loading and building, and located validation violations.

use crate::{OpId, TensorId};
use std::fmt;

/// An error while reading, parsing, importing or building a graph.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct GraphError {
    pub kind: GraphErrorKind,
}

/// What went wrong; messages are lower-case and name the fix where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphErrorKind {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON for {format}: {detail}")]
    Parse {
        path: String,
        format: &'static str,
        detail: String,
    },
    #[error("{path}: unsupported format `{found}` (expected {expected})")]
    UnsupportedFormat {
        path: String,
        found: String,
        expected: &'static str,
    },
    #[error("{path}: {detail}")]
    Malformed { path: String, detail: String },
    #[error("unknown model `{name}`; run `outcore zoo` to list the models")]
    UnknownModel { name: String },
    #[error("model `{model}`: {detail}")]
    BadKnob { model: String, detail: String },
    /// A size or FLOP count of a model at the requested batch and knobs does not
    /// fit in 64 bits (it would have wrapped).
    #[error(
        "model `{model}`: {what} overflows 64 bits at batch {batch}; lower --batch or the model's knobs (`outcore zoo` lists them)"
    )]
    Overflow {
        model: String,
        batch: u64,
        what: String,
    },
    #[error("{0}")]
    Invalid(#[from] ValidationErrors),
}

impl GraphError {
    pub fn new(kind: GraphErrorKind) -> Self {
        GraphError { kind }
    }
}

impl From<GraphErrorKind> for GraphError {
    fn from(kind: GraphErrorKind) -> Self {
        GraphError { kind }
    }
}

impl From<ValidationErrors> for GraphError {
    fn from(errors: ValidationErrors) -> Self {
        GraphError {
            kind: GraphErrorKind::Invalid(errors),
        }
    }
}

/// Where in the graph a violation sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Op(OpId),
    Tensor(TensorId),
    OpOperand { op: OpId, tensor: TensorId },
    Graph,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Op(op) => write!(f, "{op}"),
            Location::Tensor(t) => write!(f, "{t}"),
            Location::OpOperand { op, tensor } => write!(f, "{op} operand {tensor}"),
            Location::Graph => f.write_str("graph"),
        }
    }
}

/// The kinds of structural error [`crate::validate`] finds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViolationKind {
    /// `tensors[i].id` or `ops[i].id` is not `i`.
    IdNotDense { index: usize, found: u32 },
    /// An op names a tensor id that does not exist.
    DanglingTensor { tensor: u32 },
    /// A tensor names a producer, view owner or update target that does not exist.
    DanglingReference { field: &'static str, target: u32 },
    /// Two ops list the same tensor as output.
    TwoProducers { first: OpId, second: OpId },
    /// `tensor.producer` disagrees with the op that outputs it.
    ProducerMismatch {
        recorded: Option<OpId>,
        actual: Option<OpId>,
    },
    /// An op reads a tensor before the op that produces it (in the graph's order).
    ReadBeforeProduced { producer: OpId },
    /// The dependence relation has a cycle through these ops.
    Cycle { ops: Vec<OpId> },
    /// A non-input tensor has no producer.
    NoProducer,
    /// A graph input kind (parameter, input, ...) has a producer but is not an update.
    InputWithProducer { producer: OpId },
    /// Zero bytes.
    ZeroSize,
    /// A size, FLOP count or total over the graph beyond what 64-bit
    /// arithmetic on it can hold (see [`crate::builder::MAX_TENSOR_BYTES`]).
    TooLarge { what: &'static str, limit: u64 },
    /// `size_bytes` disagrees with shape times dtype size.
    SizeMismatch { expected_bytes: u64 },
    /// A view that points at itself, loops, is larger than its owner, or also updates in place.
    BadView { reason: String },
    /// An in-place update that targets a non-persistent tensor, has another size,
    /// or is the second update of the same tensor.
    BadInplaceUpdate { reason: String },
    /// An op lists the same output twice or has no outputs.
    BadOutputs { reason: String },
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViolationKind::IdNotDense { index, found } => {
                write!(f, "entry {index} has id {found}; ids must equal positions")
            }
            ViolationKind::DanglingTensor { tensor } => {
                write!(f, "refers to tensor {tensor}, which does not exist")
            }
            ViolationKind::DanglingReference { field, target } => {
                write!(f, "`{field}` refers to {target}, which does not exist")
            }
            ViolationKind::TwoProducers { first, second } => {
                write!(f, "produced by both {first} and {second}")
            }
            ViolationKind::ProducerMismatch { recorded, actual } => write!(
                f,
                "records producer {} but is output of {}",
                opt(recorded),
                opt(actual)
            ),
            ViolationKind::ReadBeforeProduced { producer } => {
                write!(f, "read before its producer {producer} runs")
            }
            ViolationKind::Cycle { ops } => {
                let path: Vec<String> = ops.iter().map(|o| o.to_string()).collect();
                write!(f, "dependence cycle {}", path.join(" -> "))
            }
            ViolationKind::NoProducer => f.write_str("has no producer but is not a graph input"),
            ViolationKind::InputWithProducer { producer } => write!(
                f,
                "is a graph input kind but is produced by {producer}; set inplace_update_of if it is an update"
            ),
            ViolationKind::ZeroSize => f.write_str("has zero bytes"),
            ViolationKind::TooLarge { what, limit } => {
                write!(f, "{what} is out of range; accepted: at most {limit}")
            }
            ViolationKind::SizeMismatch { expected_bytes } => write!(
                f,
                "size_bytes disagrees with shape x dtype ({expected_bytes} bytes)"
            ),
            ViolationKind::BadView { reason } => write!(f, "bad view: {reason}"),
            ViolationKind::BadInplaceUpdate { reason } => {
                write!(f, "bad in-place update: {reason}")
            }
            ViolationKind::BadOutputs { reason } => write!(f, "bad outputs: {reason}"),
        }
    }
}

fn opt(op: &Option<OpId>) -> String {
    op.map_or_else(|| "none".to_string(), |o| o.to_string())
}

/// One located violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub location: Location,
    pub kind: ViolationKind,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.kind)
    }
}

/// Every violation found in one graph (never empty when returned as an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors {
    pub violations: Vec<Violation>,
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.violations.len();
        write!(
            f,
            "invalid graph ({n} problem{}): ",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, v) in self.violations.iter().take(5).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        if n > 5 {
            write!(f, "; and {} more", n - 5)?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}
