//! outcore-colocate: several training jobs sharing one device (TENSILE's
//! multi-job setting, Sec. III-A of the TENSILE paper): a [`Job`] is a graph
//! with its verified plan, an iteration count, an arrival time and a priority;
//! a [`JobSet`] shares one memory budget, one host link in each direction and
//! one compute stream. [`simulate_jobs`] runs a job set through a multi-job
//! event loop that starts every step through `outcore_sim::step_work`, so one
//! job alone simulates exactly as `outcore_sim::simulate`. [`SetMetrics`] are
//! the paper's MSR / EOR / CBR (Sec. V-A) against the same jobs run without
//! memory limits.
//!
//! Not here (yet): TENSILE's multi-job scheduler, the latency predictor and the
//! executor parts of issue 13; real allocators in the multi-job simulator (the
//! perfect allocator only).

mod engine;
mod job;
mod metrics;
mod trace;

pub use engine::{
    ColocateOptions, ColocateOutput, ColocateReport, JobReport, simulate_jobs, simulate_jobs_with,
};
pub use job::{ColocateError, ColocateErrorKind, Job, JobSet, MAX_ITERATIONS};
pub use metrics::{Metrics, SetMetrics};
