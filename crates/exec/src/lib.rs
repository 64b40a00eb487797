//! outcore-exec: runs a Plan on a device backend with real buffers. The
//! [`Backend`] trait maps onto CUDA concepts; [`CpuBackend`] implements it with an
//! arena, worker-thread streams, real events and real f32 kernels.

mod arena;
pub mod backend;
pub mod conformance;
pub mod cpu;
mod error;
mod executor;
pub mod test_plans;
pub mod view;

pub use backend::{
    Backend, ChecksumHandle, DeviceSegment, EventHandle, HostBuffer, KernelCall, Operand,
    StreamHandle, StreamKind, fnv1a, fnv1a_update,
};
pub use cpu::{CpuBackend, CpuBackendOptions, CpuFaults};
pub use error::{ExecError, ExecErrorKind};
pub use executor::{ExecOptions, IterationHook, RunReport, execute};
