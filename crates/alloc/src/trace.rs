//! Allocation traces: the JSON trace format, reading / writing with
//! positioned errors, a synthetic trace generator, and `replay` of a trace
//! through any allocator into a [`ReplayReport`].
//!
//! # Format `outcore-alloc-trace/1`
//!
//! ```json
//! {
//!   "format": "outcore-alloc-trace/1",
//!   "capacity_bytes": null,
//!   "events": [
//!     {"op": "alloc", "id": 3, "size_bytes": 1024},
//!     {"op": "free", "id": 3}
//!   ]
//! }
//! ```
//!
//! * `format` must be exactly `"outcore-alloc-trace/1"`.
//! * `capacity_bytes`: the memory budget the trace was recorded under, or
//!   `null` (or absent) for "unlimited" ([`crate::UNLIMITED_CAPACITY_BYTES`]),
//!   which measures what the trace needs.
//! * `events`: in order; `id` is any `u64` chosen by the producer (tensor
//!   ids). An id may be reused after it was freed. A valid trace never frees
//!   an id that is not live and never allocates a live id; reading checks it.
//! * Unknown fields are rejected, so typos do not pass silently.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hash::FastMap;
use crate::{
    AllocError, AllocErrorKind, AllocId, Allocator, AllocatorConfig, AllocatorKind,
    UNLIMITED_CAPACITY_BYTES, build,
};

/// The `format` string of the current trace format.
pub const TRACE_FORMAT: &str = "outcore-alloc-trace/1";

/// One trace event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum TraceEvent {
    Alloc { id: AllocId, size_bytes: u64 },
    Free { id: AllocId },
}

/// An allocation trace (see the module docs for the JSON format).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Budget the trace was recorded under; `None` = unlimited.
    pub capacity_bytes: Option<u64>,
    pub events: Vec<TraceEvent>,
}

/// The on-disk shape; kept private so [`Trace`] need not carry the format tag.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceFile {
    format: String,
    #[serde(default)]
    capacity_bytes: Option<u64>,
    events: Vec<TraceEvent>,
}

/// Used only to find the `format` of a file that failed to parse, so a trace
/// in a newer format is reported as such rather than as a field error.
#[derive(Deserialize)]
struct FormatProbe {
    format: Option<serde_json::Value>,
}

/// Reading, writing or validating a trace failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct TraceError {
    kind: TraceErrorKind,
}

impl TraceError {
    pub fn kind(&self) -> &TraceErrorKind {
        &self.kind
    }
}

impl From<TraceErrorKind> for TraceError {
    fn from(kind: TraceErrorKind) -> Self {
        TraceError { kind }
    }
}

/// Why a trace could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceErrorKind {
    #[error("cannot {action} trace file {path}: {message}; check the path and permissions")]
    Io {
        action: &'static str,
        path: String,
        message: String,
    },
    #[error(
        "malformed trace json at line {line}, column {column}: {message}; \
         expected {{\"format\":\"outcore-alloc-trace/1\",\"capacity_bytes\":null|N,\"events\":[{{\"op\":\"alloc\",\"id\":N,\"size_bytes\":N}},{{\"op\":\"free\",\"id\":N}}]}}"
    )]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "unsupported trace format {found}; this version reads \"outcore-alloc-trace/1\" \
         (convert the trace or upgrade outcore)"
    )]
    UnsupportedFormat { found: String },
    #[error("invalid trace event {index}: {message}")]
    InvalidEvent { index: usize, message: String },
}

impl Trace {
    /// An empty trace.
    pub fn new(capacity_bytes: Option<u64>) -> Self {
        Trace {
            capacity_bytes,
            events: Vec::new(),
        }
    }

    pub fn push_alloc(&mut self, id: AllocId, size_bytes: u64) {
        self.events.push(TraceEvent::Alloc { id, size_bytes });
    }

    pub fn push_free(&mut self, id: AllocId) {
        self.events.push(TraceEvent::Free { id });
    }

    /// The recorded capacity, or [`UNLIMITED_CAPACITY_BYTES`].
    pub fn capacity_or_unlimited(&self) -> u64 {
        self.capacity_bytes.unwrap_or(UNLIMITED_CAPACITY_BYTES)
    }

    /// Checks that every free names a live id and no alloc names a live id.
    pub fn validate(&self) -> Result<(), TraceError> {
        let mut live: HashSet<AllocId> = HashSet::new();
        for (index, event) in self.events.iter().enumerate() {
            match *event {
                TraceEvent::Alloc { id, .. } => {
                    if !live.insert(id) {
                        return Err(TraceErrorKind::InvalidEvent {
                            index,
                            message: format!(
                                "alloc of id {id}, which is already live; free it first or use a fresh id"
                            ),
                        }
                        .into());
                    }
                }
                TraceEvent::Free { id } => {
                    if !live.remove(&id) {
                        return Err(TraceErrorKind::InvalidEvent {
                            index,
                            message: format!(
                                "free of id {id}, which is not live; every free must follow an alloc of the same id"
                            ),
                        }
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// Parses and validates a trace from JSON text.
    pub fn from_json_str(text: &str) -> Result<Self, TraceError> {
        let file: TraceFile = match serde_json::from_str(text) {
            Ok(file) => file,
            Err(err) => {
                if let Ok(FormatProbe {
                    format: Some(format),
                }) = serde_json::from_str::<FormatProbe>(text)
                    && format.as_str() != Some(TRACE_FORMAT)
                {
                    return Err(TraceErrorKind::UnsupportedFormat {
                        found: format.to_string(),
                    }
                    .into());
                }
                return Err(TraceErrorKind::Parse {
                    line: err.line(),
                    column: err.column(),
                    message: err.to_string(),
                }
                .into());
            }
        };
        if file.format != TRACE_FORMAT {
            return Err(TraceErrorKind::UnsupportedFormat {
                found: format!("{:?}", file.format),
            }
            .into());
        }
        let trace = Trace {
            capacity_bytes: file.capacity_bytes,
            events: file.events,
        };
        trace.validate()?;
        Ok(trace)
    }

    /// The trace as JSON text (one line).
    pub fn to_json_string(&self) -> String {
        let file = TraceFile {
            format: TRACE_FORMAT.to_string(),
            capacity_bytes: self.capacity_bytes,
            events: self.events.clone(),
        };
        // Serialising plain structs of integers and strings cannot fail.
        serde_json::to_string(&file).unwrap_or_default()
    }
}

/// Reads and validates a trace file.
pub fn read_trace(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    let path = path.as_ref();
    let text = fs::read_to_string(path).map_err(|err| TraceErrorKind::Io {
        action: "read",
        path: path.display().to_string(),
        message: err.to_string(),
    })?;
    // A UTF-8 byte order mark (some editors write one) is not JSON.
    Trace::from_json_str(text.strip_prefix('\u{feff}').unwrap_or(&text))
}

/// Writes a trace file.
pub fn write_trace(path: impl AsRef<Path>, trace: &Trace) -> Result<(), TraceError> {
    let path = path.as_ref();
    fs::write(path, trace.to_json_string()).map_err(|err| {
        TraceErrorKind::Io {
            action: "write",
            path: path.display().to_string(),
            message: err.to_string(),
        }
        .into()
    })
}

/// The first failed allocation of a replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayFailure {
    pub event_index: usize,
    pub id: AllocId,
    pub requested_bytes: u64,
    /// Present for out-of-memory failures.
    pub free_bytes: Option<u64>,
    /// Present for out-of-memory failures.
    pub largest_free_block_bytes: Option<u64>,
    /// The allocator's error message.
    pub message: String,
}

/// Result of replaying a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub allocator: AllocatorKind,
    pub capacity_bytes: u64,
    /// Events processed (all of them; replay never stops early).
    pub ops: u64,
    pub n_allocs: u64,
    pub n_frees: u64,
    pub peak_live_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// See [`crate::AllocStats::fragmentation`].
    pub fragmentation: Option<f64>,
    /// Failed allocations.
    pub failures: u64,
    /// Frees skipped because the matching allocation had failed.
    pub skipped_frees: u64,
    /// Frees the allocator rejected for another reason (unknown id).
    pub rejected_frees: u64,
    pub map_ops: u64,
    pub unmap_ops: u64,
    pub first_failure: Option<ReplayFailure>,
}

/// Replays `trace` through `allocator` (expected fresh: the report's peaks
/// and counts come from its statistics). A failed allocation is counted and
/// its later free skipped; the replay always runs to the end.
pub fn replay(trace: &Trace, allocator: &mut dyn Allocator) -> ReplayReport {
    let mut failed: FastMap<AllocId, ()> = FastMap::default();
    let mut failures = 0;
    let mut skipped_frees = 0;
    let mut rejected_frees = 0;
    let mut first_failure = None;
    for (event_index, event) in trace.events.iter().enumerate() {
        match *event {
            TraceEvent::Alloc { id, size_bytes } => {
                if let Err(err) = allocator.allocate(id, size_bytes) {
                    failures += 1;
                    // A double allocate leaves the live allocation in place;
                    // only a failed fresh allocation has no matching free.
                    if !matches!(err.kind(), AllocErrorKind::DoubleAllocate { .. }) {
                        failed.insert(id, ());
                    }
                    if first_failure.is_none() {
                        first_failure = Some(failure_of(event_index, id, size_bytes, &err));
                    }
                }
            }
            TraceEvent::Free { id } => {
                if failed.remove(&id).is_some() {
                    skipped_frees += 1;
                } else if allocator.free(id).is_err() {
                    rejected_frees += 1;
                }
            }
        }
    }
    let stats = allocator.stats();
    ReplayReport {
        allocator: allocator.name(),
        capacity_bytes: allocator.capacity_bytes(),
        ops: trace.events.len() as u64,
        n_allocs: stats.n_allocs,
        n_frees: stats.n_frees,
        peak_live_bytes: stats.peak_live_bytes,
        peak_reserved_bytes: stats.peak_reserved_bytes,
        fragmentation: stats.fragmentation(),
        failures,
        skipped_frees,
        rejected_frees,
        map_ops: stats.map_ops,
        unmap_ops: stats.unmap_ops,
        first_failure,
    }
}

/// Builds the allocator of `config` with the trace's capacity (unlimited
/// when the trace has none) and replays the trace through it.
pub fn replay_with_config(
    trace: &Trace,
    config: &AllocatorConfig,
) -> Result<ReplayReport, AllocError> {
    let mut allocator = build(config, trace.capacity_or_unlimited())?;
    Ok(replay(trace, allocator.as_mut()))
}

fn failure_of(
    event_index: usize,
    id: AllocId,
    requested_bytes: u64,
    err: &AllocError,
) -> ReplayFailure {
    let (free_bytes, largest_free_block_bytes) = match *err.kind() {
        AllocErrorKind::OutOfMemory {
            free_bytes,
            largest_free_block_bytes,
            ..
        } => (Some(free_bytes), Some(largest_free_block_bytes)),
        _ => (None, None),
    };
    ReplayFailure {
        event_index,
        id,
        requested_bytes,
        free_bytes,
        largest_free_block_bytes,
        message: err.to_string(),
    }
}

/// A deterministic synthetic trace of `n_events` events for tests and
/// benchmarks: sizes are log-uniform between 256 B and 64 MiB, 70 % drawn
/// from a palette of 96 recurring "tensor sizes" (graphs reuse few shapes),
/// 30 % fresh; about 256 allocations are live at a time and frees pick a
/// random live allocation. Allocations still live at the end are not freed.
pub fn synthetic_trace(n_events: usize, seed: u64) -> Trace {
    let mut rng = SplitMix64(seed);
    let palette: Vec<u64> = (0..96).map(|_| log_uniform_size(&mut rng)).collect();
    let mut trace = Trace::new(None);
    trace.events.reserve(n_events);
    let mut live: Vec<AllocId> = Vec::new();
    let mut next_id = 0u64;
    const TARGET_LIVE: usize = 256;
    for _ in 0..n_events {
        // Allocate with probability falling from 1 to 0 as the live set
        // grows to twice the target, so it hovers around the target.
        let alloc_per_mille = 1000u64.saturating_sub((live.len() * 500 / TARGET_LIVE) as u64);
        if live.is_empty() || rng.next() % 1000 < alloc_per_mille {
            let size_bytes = if rng.next() % 10 < 7 {
                palette[(rng.next() % palette.len() as u64) as usize]
            } else {
                log_uniform_size(&mut rng)
            };
            let id = AllocId(next_id);
            next_id += 1;
            trace.push_alloc(id, size_bytes);
            live.push(id);
        } else {
            let index = (rng.next() % live.len() as u64) as usize;
            trace.push_free(live.swap_remove(index));
        }
    }
    trace
}

fn log_uniform_size(rng: &mut SplitMix64) -> u64 {
    // 2^8 .. 2^26 bytes, with a uniform fractional exponent.
    let exponent = 8.0 + (rng.next() % 18_000) as f64 / 1000.0;
    2f64.powf(exponent) as u64
}

/// splitmix64: tiny, good-quality, dependency-free PRNG.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BestFitCaching;

    #[test]
    fn synthetic_trace_is_valid_and_deterministic() {
        let a = synthetic_trace(5_000, 1);
        assert_eq!(a, synthetic_trace(5_000, 1));
        assert_ne!(a, synthetic_trace(5_000, 2));
        a.validate().expect("valid");
        assert_eq!(a.events.len(), 5_000);
    }

    #[test]
    fn replay_skips_frees_of_failed_allocations() {
        const MIB: u64 = 1 << 20;
        let mut trace = Trace::new(Some(20 * MIB));
        trace.push_alloc(AllocId(1), 8 * MIB);
        trace.push_alloc(AllocId(2), 30 * MIB);
        trace.push_free(AllocId(2));
        trace.push_free(AllocId(1));
        let mut alloc = BestFitCaching::with_defaults(20 * MIB);
        let report = replay(&trace, &mut alloc);
        assert_eq!(report.failures, 1);
        assert_eq!(report.skipped_frees, 1);
        assert_eq!(report.rejected_frees, 0);
        assert_eq!((report.n_allocs, report.n_frees), (1, 1));
        let first = report.first_failure.expect("first failure");
        assert_eq!((first.event_index, first.id), (1, AllocId(2)));
        assert_eq!(first.free_bytes, Some(12 * MIB));
    }
}
