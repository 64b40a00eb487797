//! outcore-alloc: pure GPU-memory allocator algorithms over a `u64` address space.
//!
//! Nothing here talks to a device. Each allocator manages an abstract address
//! space of `capacity_bytes` and answers "where would this tensor live, and does
//! it fit?" so that planners and the simulator can account for fragmentation,
//! not just for the sum of live bytes.
//!
//! Four allocators sit behind the [`Allocator`] trait (CLI / plan names in
//! brackets):
//!
//! * [`SizeClassPool`] (`size-class`): SwapAdvisor's fixed memory pool of size
//!   classes with a fixed object count each (SwapAdvisor Sec. 4.1 / 5.3).
//! * [`BestFitCaching`] (`best-fit`): a model of PyTorch's
//!   `CUDACachingAllocator` (and NNabla's default caching allocator).
//! * [`VirtualChunks`] (`virtual-chunks`): virtual addressing onto fixed-size
//!   physical chunks (schedule-window paper Sec. 4).
//! * [`FixedOffsets`] (`offsets`): an exact offset per allocation, computed
//!   ahead of time by the planner (`outcore_plan::layout`).
//!
//! # Alignment
//!
//! Every address handed out by every allocator is a multiple of
//! [`ALIGNMENT_BYTES`] (512 B, PyTorch's `kMinBlockSize`). Requests are rounded
//! up to a multiple of 512 B internally (a zero-byte request still occupies
//! 512 B, as in PyTorch), but [`Allocation::size_bytes`] and the live-byte
//! statistics always carry the size the caller asked for.
//!
//! # Traces
//!
//! [`trace`] defines a JSON allocation-trace format and [`replay`] runs one
//! through any allocator, producing a [`ReplayReport`].

pub mod best_fit;
mod blocks;
mod error;
mod extent;
mod hash;
pub mod offsets;
pub mod size_class;
mod stats;
pub mod trace;
pub mod virtual_chunks;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use best_fit::{BestFitCaching, BestFitConfig};
pub use error::{AllocError, AllocErrorKind};
pub use offsets::{FixedOffsets, OffsetsConfig, OwnerOffsets};
pub use size_class::{SizeClassConfig, SizeClassEncoding, SizeClassPool, SizeClassSpec};
pub use stats::{AllocStats, FailureRecord, MAX_RECORDED_FAILURES};
pub use trace::{
    ReplayFailure, ReplayReport, TRACE_FORMAT, Trace, TraceError, TraceErrorKind, TraceEvent,
    read_trace, replay, replay_with_config, synthetic_trace, write_trace,
};
pub use virtual_chunks::{ChunkMapping, VirtualChunks, VirtualChunksConfig};

/// Alignment of every address returned by every allocator, in bytes.
pub const ALIGNMENT_BYTES: u64 = 512;

/// Capacity used when a trace or caller asks for "no limit": large enough to
/// never be the constraint, small enough that sums of a few capacities cannot
/// overflow a `u64`.
pub const UNLIMITED_CAPACITY_BYTES: u64 = 1 << 60;

/// Caller-chosen identifier of one allocation (the simulator passes tensor ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AllocId(pub u64);

impl fmt::Display for AllocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One live allocation: `[addr, addr + size_bytes)` belongs to `id`.
///
/// `size_bytes` is the requested size; the allocator may hold more internally
/// (rounding, unsplit remainders, whole chunks or objects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Allocation {
    pub id: AllocId,
    pub addr: u64,
    pub size_bytes: u64,
}

impl Allocation {
    /// One past the last byte of the requested range.
    pub fn end_addr(&self) -> u64 {
        self.addr.saturating_add(self.size_bytes)
    }
}

/// Which allocator algorithm; serialised with the CLI / plan names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocatorKind {
    /// `size-class`: SwapAdvisor's fixed-object memory pool.
    SizeClass,
    /// `best-fit`: PyTorch-style best-fit caching allocator.
    BestFit,
    /// `virtual-chunks`: virtual addresses mapped onto physical chunks.
    VirtualChunks,
    /// `offsets`: every allocation at an offset the planner fixed.
    Offsets,
}

impl AllocatorKind {
    /// All kinds, in a stable order.
    pub const ALL: [AllocatorKind; 4] = [
        AllocatorKind::SizeClass,
        AllocatorKind::BestFit,
        AllocatorKind::VirtualChunks,
        AllocatorKind::Offsets,
    ];

    /// The CLI / plan name.
    pub fn as_str(self) -> &'static str {
        match self {
            AllocatorKind::SizeClass => "size-class",
            AllocatorKind::BestFit => "best-fit",
            AllocatorKind::VirtualChunks => "virtual-chunks",
            AllocatorKind::Offsets => "offsets",
        }
    }
}

impl fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AllocatorKind {
    type Err = AllocError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| {
                AllocError::new(AllocErrorKind::UnknownAllocatorName {
                    name: s.to_string(),
                })
            })
    }
}

/// An allocator together with its parameters, as stored in plans and given on
/// the command line.
///
/// JSON examples:
/// `{"kind":"best-fit"}`, `{"kind":"virtual-chunks","chunk_bytes":2097152}`,
/// `{"kind":"size-class","classes":[{"size_bytes":1048576,"count":8}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AllocatorConfig {
    SizeClass(SizeClassConfig),
    BestFit(BestFitConfig),
    VirtualChunks(VirtualChunksConfig),
    Offsets(OffsetsConfig),
}

impl AllocatorConfig {
    /// Which algorithm this configures.
    pub fn kind(&self) -> AllocatorKind {
        match self {
            AllocatorConfig::SizeClass(_) => AllocatorKind::SizeClass,
            AllocatorConfig::BestFit(_) => AllocatorKind::BestFit,
            AllocatorConfig::VirtualChunks(_) => AllocatorKind::VirtualChunks,
            AllocatorConfig::Offsets(_) => AllocatorKind::Offsets,
        }
    }

    /// Default parameters for `kind`. The size-class pool and the offsets
    /// layout have no meaningful default (classes and offsets come from the
    /// graph and the plan), so their default configs are empty and [`build`]
    /// rejects them until they are filled in.
    pub fn default_for(kind: AllocatorKind) -> Self {
        match kind {
            AllocatorKind::SizeClass => AllocatorConfig::SizeClass(SizeClassConfig::default()),
            AllocatorKind::BestFit => AllocatorConfig::BestFit(BestFitConfig::default()),
            AllocatorKind::VirtualChunks => {
                AllocatorConfig::VirtualChunks(VirtualChunksConfig::default())
            }
            AllocatorKind::Offsets => AllocatorConfig::Offsets(OffsetsConfig::default()),
        }
    }
}

/// Builds the allocator described by `config` over `capacity_bytes` of
/// address space (physical memory for `virtual-chunks`).
pub fn build(
    config: &AllocatorConfig,
    capacity_bytes: u64,
) -> Result<Box<dyn Allocator>, AllocError> {
    Ok(match config {
        AllocatorConfig::SizeClass(cfg) => {
            Box::new(SizeClassPool::from_config(cfg, capacity_bytes)?)
        }
        AllocatorConfig::BestFit(cfg) => {
            Box::new(BestFitCaching::new(cfg.clone(), capacity_bytes)?)
        }
        AllocatorConfig::VirtualChunks(cfg) => {
            Box::new(VirtualChunks::new(cfg.clone(), capacity_bytes)?)
        }
        AllocatorConfig::Offsets(cfg) => Box::new(FixedOffsets::from_config(cfg, capacity_bytes)?),
    })
}

/// The common interface of all allocators.
pub trait Allocator: fmt::Debug + Send {
    /// Which algorithm this is.
    fn name(&self) -> AllocatorKind;

    /// Size of the managed address space (physical memory for
    /// `virtual-chunks`), in bytes.
    fn capacity_bytes(&self) -> u64;

    /// Allocates `size_bytes` for `id` and returns where it lives. On failure
    /// nothing changes except the failure statistics.
    fn allocate(&mut self, id: AllocId, size_bytes: u64) -> Result<Allocation, AllocError>;

    /// Frees the allocation of `id`.
    fn free(&mut self, id: AllocId) -> Result<(), AllocError>;

    /// Running statistics.
    fn stats(&self) -> &AllocStats;

    /// The physical byte ranges `(offset, length)` backing live allocation `id`,
    /// in address order, when they differ from `[addr, addr + size)`: only
    /// virtual-address allocators (`virtual-chunks`) return `Some`; for the others
    /// the address is the physical offset. `None` also for an unknown id.
    fn physical_segments(&self, id: AllocId) -> Option<Vec<(u64, u64)>> {
        let _ = id;
        None
    }

    /// All live allocations, sorted by address. Meant for checks; may be slow.
    fn live_allocations(&self) -> Vec<Allocation>;
}

/// Rounds `size_bytes` up to the allocation granule (a multiple of
/// [`ALIGNMENT_BYTES`], at least one granule). `None` on overflow.
pub(crate) fn round_request(size_bytes: u64) -> Option<u64> {
    round_up(size_bytes.max(1), ALIGNMENT_BYTES)
}

/// Rounds `value` up to a multiple of `multiple` (> 0). `None` on overflow.
pub(crate) fn round_up(value: u64, multiple: u64) -> Option<u64> {
    let rem = value % multiple;
    if rem == 0 {
        Some(value)
    } else {
        value.checked_add(multiple - rem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for kind in AllocatorKind::ALL {
            assert_eq!(kind.as_str().parse::<AllocatorKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).expect("serialise kind");
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
        let err = "first-fit"
            .parse::<AllocatorKind>()
            .expect_err("unknown name");
        assert!(err.to_string().contains("size-class"), "{err}");
    }

    #[test]
    fn config_json_shapes() {
        let cfg: AllocatorConfig =
            serde_json::from_str(r#"{"kind":"best-fit"}"#).expect("best-fit config");
        assert_eq!(cfg, AllocatorConfig::default_for(AllocatorKind::BestFit));
        let cfg: AllocatorConfig =
            serde_json::from_str(r#"{"kind":"virtual-chunks","chunk_bytes":4194304}"#)
                .expect("virtual-chunks config");
        assert_eq!(cfg.kind(), AllocatorKind::VirtualChunks);
        let cfg: AllocatorConfig = serde_json::from_str(
            r#"{"kind":"size-class","classes":[{"size_bytes":1024,"count":2}]}"#,
        )
        .expect("size-class config");
        let alloc = build(&cfg, 1 << 20).expect("build size-class");
        assert_eq!(alloc.name(), AllocatorKind::SizeClass);
        assert!(
            build(
                &AllocatorConfig::default_for(AllocatorKind::SizeClass),
                1 << 20
            )
            .is_err()
        );
    }

    #[test]
    fn rounding() {
        assert_eq!(round_request(0), Some(512));
        assert_eq!(round_request(512), Some(512));
        assert_eq!(round_request(513), Some(1024));
        assert_eq!(round_request(u64::MAX), None);
    }
}
