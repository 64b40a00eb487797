//! outcore-sim: a discrete-event simulator that runs a Plan under a CostModel on
//! compute, host-to-device and device-to-host streams, with memory through an
//! allocator model, and reports iteration time, memory and a Chrome trace.

mod engine;
pub mod link;
mod report;
mod trace;

pub use engine::{
    SimError, SimErrorKind, SimOptions, SimOutput, SimPrepared, SimScratch, StepWork, simulate,
    simulate_program, step_work,
};
pub use report::{SimOom, SimReport, StreamBusy};
pub use trace::TraceBuilder;
