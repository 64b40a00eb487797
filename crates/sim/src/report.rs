//! What a simulation reports: times, memory, copies, recomputation and stalls.

use outcore_graph::TensorId;
use outcore_plan::StepRef;
use serde::{Deserialize, Serialize};

/// Busy seconds of each stream in the reported iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamBusy {
    pub compute_s: f64,
    pub h2d_s: f64,
    pub d2h_s: f64,
}

/// An allocation the allocator model could not satisfy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimOom {
    /// The step that allocated (`None`: before the iteration, persistent tensors).
    pub at: Option<StepRef>,
    /// The tensor (`None`: scratch memory of a kernel).
    pub tensor: Option<TensorId>,
    pub requested_bytes: u64,
    pub live_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub message: String,
}

/// The report of one simulation; the iteration figures are the last iteration's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub iter_time_s: f64,
    /// Sum of every op's compute time: the iteration time with unlimited memory.
    pub ideal_time_s: f64,
    /// `ideal_time_s / iter_time_s`.
    pub throughput_vs_ideal: f64,
    pub peak_live_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Reserved over live bytes at the reserved peak (1 for the perfect allocator).
    pub fragmentation: Option<f64>,
    pub swap_in_bytes: u64,
    pub swap_out_bytes: u64,
    pub recompute_time_s: f64,
    /// Time the compute stream spends not running kernels within the iteration.
    pub stall_time_s: f64,
    pub busy: StreamBusy,
    pub iterations: usize,
    pub per_iteration_time_s: Vec<f64>,
    /// The first allocation failure, if any: the plan does not run under this allocator.
    pub oom: Option<SimOom>,
}
