//! The executor's error type: one struct wrapping a `#[non_exhaustive]` kind, with
//! lower-case messages that name the fix.

use std::fmt;

/// An error from a backend or the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecError {
    pub kind: ExecErrorKind,
}

impl ExecError {
    pub fn new(kind: ExecErrorKind) -> Self {
        ExecError { kind }
    }

    /// A shorthand for [`ExecErrorKind::InvalidArgument`].
    pub fn invalid(detail: impl Into<String>) -> Self {
        ExecError::new(ExecErrorKind::InvalidArgument {
            detail: detail.into(),
        })
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl std::error::Error for ExecError {}

impl From<ExecErrorKind> for ExecError {
    fn from(kind: ExecErrorKind) -> Self {
        ExecError::new(kind)
    }
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecErrorKind {
    /// A tensor's device allocation did not fit, even after draining every
    /// in-flight free.
    #[error(
        "out of device memory allocating {bytes} bytes for tensor `{tensor}` ({free_bytes} bytes free, largest free block {largest_free_block} bytes); where the free bytes would hold it, the arena is fragmented: run the plan laid out at exact offsets (`outcore run --allocator offsets`); otherwise raise the plan's budget or re-plan with more swapping"
    )]
    OutOfDeviceMemory {
        tensor: String,
        bytes: u64,
        free_bytes: u64,
        largest_free_block: u64,
    },
    /// A kernel reported a failure; the run stopped.
    #[error("kernel for op `{op}` failed: {detail}; the run was stopped")]
    KernelFailed { op: String, detail: String },
    /// A copy or kernel addressed memory outside the device region or a host buffer.
    #[error("{what} is out of range: {detail}; check the offsets and sizes passed to the backend")]
    OutOfRange { what: String, detail: String },
    /// A handle (stream, event, host buffer, checksum) that the backend does not know.
    #[error("unknown {what} handle {id}; use handles returned by this backend")]
    UnknownHandle { what: String, id: u64 },
    /// A `--check` checksum mismatch: data changed between two points where it must not.
    #[error(
        "check failed for tensor `{tensor}` at {stage}: checksum {found:016x}, expected {expected:016x}; the host copy or a recomputation is corrupt"
    )]
    CheckFailed {
        tensor: String,
        stage: String,
        expected: u64,
        found: u64,
    },
    /// The plan cannot be executed as written.
    #[error("the plan cannot be executed: {detail}; run `outcore_plan::verify` on it")]
    BadPlan { detail: String },
    /// The backend does not support an optional feature.
    #[error("the backend does not support {feature}; use a backend that does or avoid it")]
    Unsupported { feature: String },
    /// A caller passed an invalid argument.
    #[error("invalid argument: {detail}")]
    InvalidArgument { detail: String },
    /// The allocator configuration in the plan could not be used.
    #[error(
        "bad allocator configuration: {detail}; use {{\"kind\":\"perfect\"}} or an outcore-alloc config"
    )]
    Allocator { detail: String },
    /// The caller asked the run to stop (a Ctrl-C) after `done` of `asked`
    /// iterations; every stream had finished its work.
    #[error(
        "interrupted after {done} of {asked} iterations; nothing was written: run again to get the full result"
    )]
    Interrupted { done: u32, asked: u32 },
    /// A backend worker died.
    #[error("backend failure: {detail}; recreate the backend")]
    Backend { detail: String },
}
