//! outcore-exec: runs a Plan on a device backend with real buffers. The
//! [`Backend`] trait maps onto CUDA concepts; [`CpuBackend`] implements it with an
//! arena, worker-thread streams, real events and real f32 kernels.
//! [`execute_jobs`] runs several jobs at once on disjoint windows of one shared
//! CPU arena, each taking new plans between iterations ([`execute_swapping`]).

mod arena;
pub mod backend;
pub mod conformance;
pub mod cpu;
mod error;
mod executor;
pub mod multi;
pub mod test_plans;
pub mod view;

pub use backend::{
    Backend, ChecksumHandle, DeviceSegment, EventHandle, HostBuffer, KernelCall, Operand,
    StreamHandle, StreamKind, fnv1a, fnv1a_update,
};
pub use cpu::{CpuBackend, CpuBackendOptions, CpuDevice, CpuFaults};
pub use error::{ExecError, ExecErrorKind};
pub use executor::{
    ExecOptions, IterationHook, PlanSwap, RunReport, SharedUsage, execute, execute_swapping,
};
pub use multi::{Job, JobOutcome, MultiRunReport, execute_jobs};
