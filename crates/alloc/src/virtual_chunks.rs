//! `virtual-chunks`: virtual addressing onto fixed-size physical chunks, the
//! allocator of the schedule-window paper (Sec. 4), as done with the CUDA
//! driver's `cuMemCreate` / `cuMemMap` API.
//!
//! # Model
//!
//! * Physical memory (`capacity_bytes`, the budget) is cut into chunks of
//!   `chunk_bytes` (default 2 MiB, the smallest CUDA granularity; the paper
//!   settled on 40 MiB to cut mapping overhead). Only whole chunks count:
//!   `capacity_bytes / chunk_bytes` of them.
//! * A request of `m_r` bytes gets a contiguous *virtual* range of
//!   `m_a = ceil(m_r / m_c) * m_c` bytes, each chunk-sized piece mapped onto
//!   *any* free physical chunk. Physical memory therefore never fragments
//!   externally; the waste per allocation is `m_a - m_r < m_c` (the paper's
//!   Eq. 1).
//! * The virtual space is 2^63 bytes, managed best-fit with coalescing, so it
//!   is never the limit; reported addresses are virtual addresses.
//! * Freeing unmaps the chunks and keeps them cached for future requests.
//!   Physical chunks are created lazily, only when no cached chunk is free,
//!   and never released, so reserved bytes = chunks created * `chunk_bytes`
//!   = the peak number of simultaneously mapped chunks.
//! * Map / unmap operations are counted per chunk in [`AllocStats`].
//!
//! # Small allocations: packed into a small-block pool
//!
//! Requests up to `small_alloc_max_bytes` (default 1 MiB; 0 disables this)
//! are *not* given a chunk of their own. They are packed, best-fit with 512 B
//! splitting and coalescing exactly like PyTorch's small pool, into chunks
//! mapped for that purpose (one chunk per small segment). Reason: DNN graphs
//! hold hundreds of tiny tensors (biases, norm parameters, scalars); with
//! one 2 MiB chunk each the paper's bound `IF_max < N_max * m_c` becomes
//! hundreds of MiB, and with the paper's 40 MiB chunks gigabytes. Packing
//! bounds that waste to the small pool's own fragmentation. Fully free small
//! segments stay mapped (no map/unmap churn for the many short-lived small
//! tensors) and are unmapped and returned to the physical chunk cache only
//! when a large request would otherwise run out of chunks.

use serde::{Deserialize, Serialize};

use crate::blocks::BlockPool;
use crate::error::invalid_config;
use crate::extent::ExtentMap;
use crate::hash::FastMap;
use crate::stats::{AllocStats, FailureRecord};
use crate::{
    ALIGNMENT_BYTES, AllocError, AllocErrorKind, AllocId, Allocation, Allocator, AllocatorKind,
    round_request,
};
use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;

/// Size of the virtual address space, in bytes.
pub const VIRTUAL_SPACE_BYTES: u64 = 1 << 63;

/// Parameters of `virtual-chunks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VirtualChunksConfig {
    /// Physical chunk size `m_c`; a positive multiple of 512.
    pub chunk_bytes: u64,
    /// Requests up to this size are packed into the small-block pool;
    /// 0 gives every request its own chunks. At most `chunk_bytes`.
    pub small_alloc_max_bytes: u64,
}

impl Default for VirtualChunksConfig {
    fn default() -> Self {
        VirtualChunksConfig {
            chunk_bytes: 2 * MIB,
            small_alloc_max_bytes: MIB,
        }
    }
}

/// One mapped chunk: the chunk-sized virtual page at `virtual_addr` is backed
/// by physical chunk number `physical_chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkMapping {
    pub virtual_addr: u64,
    pub physical_chunk: u64,
}

#[derive(Debug, Clone)]
enum Backing {
    /// Own virtual range, one physical chunk per chunk-sized page.
    Chunks(Box<[u64]>),
    /// A block in the small pool.
    Small,
}

#[derive(Debug, Clone)]
struct Live {
    addr: u64,
    size_bytes: u64,
    backing: Backing,
}

/// The most physical chunks the model tracks: 2^26 (128 TiB at 2 MiB chunks).
/// Every chunk is a `u64` in a list, so an unlimited capacity (replaying a
/// trace to measure what it needs) with a huge request would otherwise take
/// tens of GB of host memory; beyond this, allocations fail as out of memory.
pub const MAX_CHUNKS: u64 = 1 << 26;

/// Virtual-address chunk-mapping allocator (see the module docs).
#[derive(Debug, Clone)]
pub struct VirtualChunks {
    config: VirtualChunksConfig,
    capacity_bytes: u64,
    capacity_chunks: u64,
    /// Physical chunks `0..created_chunks` exist; the rest are not created yet.
    created_chunks: u64,
    /// Created chunks that are not mapped.
    cached_chunks: Vec<u64>,
    virtual_space: ExtentMap,
    small: BlockPool,
    /// Small-pool segment (virtual address) -> its physical chunk. Ordered, so
    /// that the segment holding a small block is found by a range query.
    small_segments: BTreeMap<u64, u64>,
    live: FastMap<AllocId, Live>,
    stats: AllocStats,
}

impl VirtualChunks {
    pub fn new(config: VirtualChunksConfig, capacity_bytes: u64) -> Result<Self, AllocError> {
        if config.chunk_bytes == 0 || !config.chunk_bytes.is_multiple_of(ALIGNMENT_BYTES) {
            return Err(invalid_config(format!(
                "virtual-chunks chunk_bytes is {}; it must be a positive multiple of 512 (CUDA needs 2 MiB multiples)",
                config.chunk_bytes
            )));
        }
        if config.small_alloc_max_bytes > config.chunk_bytes {
            return Err(invalid_config(format!(
                "virtual-chunks small_alloc_max_bytes ({}) exceeds chunk_bytes ({}); small allocations must fit in one chunk",
                config.small_alloc_max_bytes, config.chunk_bytes
            )));
        }
        Ok(VirtualChunks {
            capacity_chunks: (capacity_bytes / config.chunk_bytes).min(MAX_CHUNKS),
            config,
            capacity_bytes,
            created_chunks: 0,
            cached_chunks: Vec::new(),
            virtual_space: ExtentMap::new(0, VIRTUAL_SPACE_BYTES),
            small: BlockPool::default(),
            small_segments: BTreeMap::new(),
            live: FastMap::default(),
            stats: AllocStats::default(),
        })
    }

    /// With 2 MiB chunks and the small pool for requests up to 1 MiB.
    pub fn with_defaults(capacity_bytes: u64) -> Self {
        let config = VirtualChunksConfig::default();
        VirtualChunks {
            capacity_chunks: (capacity_bytes / config.chunk_bytes).min(MAX_CHUNKS),
            config,
            capacity_bytes,
            created_chunks: 0,
            cached_chunks: Vec::new(),
            virtual_space: ExtentMap::new(0, VIRTUAL_SPACE_BYTES),
            small: BlockPool::default(),
            small_segments: BTreeMap::new(),
            live: FastMap::default(),
            stats: AllocStats::default(),
        }
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.config.chunk_bytes
    }

    /// Every mapped chunk, sorted by virtual address. Each physical chunk must
    /// appear at most once (checked by the tests).
    pub fn chunk_mappings(&self) -> Vec<ChunkMapping> {
        let chunk = self.config.chunk_bytes;
        let mut out: Vec<ChunkMapping> = self
            .small_segments
            .iter()
            .map(|(&virtual_addr, &physical_chunk)| ChunkMapping {
                virtual_addr,
                physical_chunk,
            })
            .collect();
        for live in self.live.values() {
            if let Backing::Chunks(chunks) = &live.backing {
                out.extend(
                    chunks
                        .iter()
                        .enumerate()
                        .map(|(i, &physical_chunk)| ChunkMapping {
                            virtual_addr: live.addr + i as u64 * chunk,
                            physical_chunk,
                        }),
                );
            }
        }
        out.sort_unstable_by_key(|m| m.virtual_addr);
        out
    }

    /// The physical byte ranges backing live allocation `id`, in virtual-address
    /// order: `(physical offset, length)` with physical offset = chunk index *
    /// `chunk_bytes` + offset within the chunk. They cover exactly the requested
    /// size (none for a zero-byte request); physically adjacent chunks are merged
    /// into one segment. A small (packed) allocation is one segment inside its
    /// chunk. `None` for an unknown id.
    pub fn physical_segments(&self, id: AllocId) -> Option<Vec<(u64, u64)>> {
        let live = self.live.get(&id)?;
        let chunk_bytes = self.config.chunk_bytes;
        match &live.backing {
            Backing::Small => {
                // Small blocks never straddle segments, and a segment with a live
                // block stays mapped, so the segment below the address holds it.
                let (&segment_addr, &chunk) =
                    self.small_segments.range(..=live.addr).next_back()?;
                let within = live.addr - segment_addr;
                let len = live.size_bytes;
                Some(if len == 0 {
                    Vec::new()
                } else {
                    vec![(chunk * chunk_bytes + within, len)]
                })
            }
            Backing::Chunks(chunks) => {
                let mut out: Vec<(u64, u64)> = Vec::with_capacity(chunks.len());
                let mut remaining = live.size_bytes;
                for &chunk in chunks.iter() {
                    if remaining == 0 {
                        break;
                    }
                    let len = remaining.min(chunk_bytes);
                    let start = chunk * chunk_bytes;
                    match out.last_mut() {
                        // Physically contiguous with the previous chunk: one segment.
                        Some((prev_start, prev_len)) if *prev_start + *prev_len == start => {
                            *prev_len += len;
                        }
                        _ => out.push((start, len)),
                    }
                    remaining -= len;
                }
                Some(out)
            }
        }
    }

    /// Physical chunks that can still be mapped (cached or not yet created).
    fn available_chunks(&self) -> u64 {
        self.cached_chunks.len() as u64 + (self.capacity_chunks - self.created_chunks)
    }

    fn take_chunk(&mut self) -> Option<u64> {
        if let Some(chunk) = self.cached_chunks.pop() {
            return Some(chunk);
        }
        if self.created_chunks < self.capacity_chunks {
            self.created_chunks += 1;
            self.stats
                .set_reserved(self.created_chunks * self.config.chunk_bytes);
            return Some(self.created_chunks - 1);
        }
        None
    }

    /// Unmaps every entirely free small segment; returns how many.
    fn release_free_small_segments(&mut self) -> u64 {
        let segments = self.small.take_free_segments();
        let n = segments.len() as u64;
        for (addr, size_bytes) in segments {
            if let Some(chunk) = self.small_segments.remove(&addr) {
                self.cached_chunks.push(chunk);
            }
            self.virtual_space.release(addr, size_bytes);
        }
        self.stats.unmap_ops += n;
        n
    }

    fn out_of_memory(&mut self, id: AllocId, requested_bytes: u64) -> AllocError {
        let unmapped_bytes = self.available_chunks() * self.config.chunk_bytes;
        let free_bytes = unmapped_bytes + self.small.free_bytes();
        // Unmapped chunks combine in any order, so they form one block.
        let largest_free_block_bytes = unmapped_bytes.max(self.small.largest_free_bytes());
        self.stats.record_failure(Some(FailureRecord {
            id,
            requested_bytes,
            free_bytes,
            largest_free_block_bytes,
        }));
        AllocError::new(AllocErrorKind::OutOfMemory {
            id,
            requested_bytes,
            free_bytes,
            largest_free_block_bytes,
            reserved_bytes: self.stats.reserved_bytes,
            capacity_bytes: self.capacity_bytes,
            segment_bytes: None,
        })
    }

    fn allocate_small(&mut self, rounded_bytes: u64) -> Option<u64> {
        let split = |remainder: u64| remainder >= ALIGNMENT_BYTES;
        if let Some((addr, _)) = self.small.allocate(rounded_bytes, split) {
            return Some(addr);
        }
        // No cached block fits, so no small segment is entirely free: map a
        // fresh chunk as a new small segment.
        let chunk_bytes = self.config.chunk_bytes;
        let chunk = self.take_chunk()?;
        let Some(vaddr) = self.virtual_space.allocate_best_fit(chunk_bytes) else {
            self.cached_chunks.push(chunk);
            return None;
        };
        self.stats.map_ops += 1;
        self.small.add_segment(vaddr, chunk_bytes);
        self.small_segments.insert(vaddr, chunk);
        self.small
            .allocate(rounded_bytes, split)
            .map(|(addr, _)| addr)
    }

    fn allocate_chunks(&mut self, size_bytes: u64) -> Option<(u64, Box<[u64]>)> {
        let chunk_bytes = self.config.chunk_bytes;
        let n_chunks = size_bytes.div_ceil(chunk_bytes).max(1);
        let range_bytes = n_chunks.checked_mul(chunk_bytes)?;
        if self.available_chunks() < n_chunks {
            self.release_free_small_segments();
            if self.available_chunks() < n_chunks {
                return None;
            }
        }
        let vaddr = self.virtual_space.allocate_best_fit(range_bytes)?;
        let chunks: Box<[u64]> = (0..n_chunks).filter_map(|_| self.take_chunk()).collect();
        self.stats.map_ops += n_chunks;
        Some((vaddr, chunks))
    }
}

impl Allocator for VirtualChunks {
    fn name(&self) -> AllocatorKind {
        AllocatorKind::VirtualChunks
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn allocate(&mut self, id: AllocId, size_bytes: u64) -> Result<Allocation, AllocError> {
        if self.live.contains_key(&id) {
            self.stats.record_failure(None);
            return Err(AllocErrorKind::DoubleAllocate { id }.into());
        }
        let Some(rounded) = round_request(size_bytes) else {
            return Err(self.out_of_memory(id, size_bytes));
        };
        let placed = if rounded <= self.config.small_alloc_max_bytes {
            self.allocate_small(rounded)
                .map(|addr| (addr, Backing::Small))
        } else {
            self.allocate_chunks(rounded)
                .map(|(addr, chunks)| (addr, Backing::Chunks(chunks)))
        };
        let Some((addr, backing)) = placed else {
            return Err(self.out_of_memory(id, size_bytes));
        };
        self.live.insert(
            id,
            Live {
                addr,
                size_bytes,
                backing,
            },
        );
        self.stats.record_alloc(size_bytes);
        Ok(Allocation {
            id,
            addr,
            size_bytes,
        })
    }

    fn free(&mut self, id: AllocId) -> Result<(), AllocError> {
        let live = self
            .live
            .remove(&id)
            .ok_or(AllocErrorKind::UnknownId { id })?;
        match live.backing {
            Backing::Small => {
                // Stays mapped; see the module docs.
                let _ = self.small.free(live.addr);
            }
            Backing::Chunks(chunks) => {
                let n = chunks.len() as u64;
                self.stats.unmap_ops += n;
                self.cached_chunks.extend(chunks.iter().copied());
                self.virtual_space
                    .release(live.addr, n * self.config.chunk_bytes);
            }
        }
        self.stats.record_free(live.size_bytes);
        Ok(())
    }

    fn stats(&self) -> &AllocStats {
        &self.stats
    }

    fn physical_segments(&self, id: AllocId) -> Option<Vec<(u64, u64)>> {
        VirtualChunks::physical_segments(self, id)
    }

    fn live_allocations(&self) -> Vec<Allocation> {
        let mut out: Vec<Allocation> = self
            .live
            .iter()
            .map(|(&id, l)| Allocation {
                id,
                addr: l.addr,
                size_bytes: l.size_bytes,
            })
            .collect();
        out.sort_unstable_by_key(|a| a.addr);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_allocation_maps_ceil_chunks() {
        let mut a = VirtualChunks::with_defaults(12 * MIB);
        let x = a.allocate(AllocId(0), 3 * MIB).expect("3 MiB");
        assert_eq!(x.addr % (2 * MIB), 0);
        assert_eq!(a.stats().map_ops, 2);
        assert_eq!(a.stats().reserved_bytes, 4 * MIB);
        a.allocate(AllocId(1), 6 * MIB).expect("6 MiB = 3 chunks");
        let err = a
            .allocate(AllocId(2), 2 * MIB + 1)
            .expect_err("only 1 chunk left");
        match *err.kind() {
            AllocErrorKind::OutOfMemory {
                free_bytes,
                largest_free_block_bytes,
                ..
            } => assert_eq!((free_bytes, largest_free_block_bytes), (2 * MIB, 2 * MIB)),
            ref other => panic!("unexpected {other:?}"),
        }
        a.free(AllocId(0)).expect("free");
        assert_eq!(a.stats().unmap_ops, 2);
        // Any three free chunks serve a 3-chunk request, wherever they are.
        a.allocate(AllocId(3), 5 * MIB)
            .expect("fits in scattered chunks");
        assert_eq!(a.stats().peak_reserved_bytes, 12 * MIB);
    }

    #[test]
    fn small_allocations_share_a_chunk() {
        let mut a = VirtualChunks::with_defaults(4 * MIB);
        for i in 0..4 {
            a.allocate(AllocId(i), 512 * 1024).expect("small");
        }
        assert_eq!(a.stats().map_ops, 1);
        assert_eq!(a.stats().reserved_bytes, 2 * MIB);
        for i in 0..4 {
            a.free(AllocId(i)).expect("free");
        }
        // The free small segment is unmapped to make room for a large request.
        a.allocate(AllocId(9), 4 * MIB).expect("needs both chunks");
        assert_eq!(a.stats().unmap_ops, 1);
        let mappings = a.chunk_mappings();
        assert_eq!(mappings.len(), 2);
        assert_ne!(mappings[0].physical_chunk, mappings[1].physical_chunk);
    }

    #[test]
    fn small_pool_can_be_disabled() {
        let cfg = VirtualChunksConfig {
            small_alloc_max_bytes: 0,
            ..VirtualChunksConfig::default()
        };
        let mut a = VirtualChunks::new(cfg, 4 * MIB).expect("config");
        a.allocate(AllocId(0), 1).expect("one chunk");
        a.allocate(AllocId(1), 1).expect("another chunk");
        assert!(a.allocate(AllocId(2), 1).is_err());
    }

    /// Checks that the live allocations' physical segments cover exactly their
    /// sizes, lie within the physical capacity and never overlap.
    fn check_segments(a: &VirtualChunks, live: &[(AllocId, u64)]) {
        let mut all: Vec<(u64, u64)> = Vec::new();
        for &(id, size) in live {
            let segs = a.physical_segments(id).expect("live id has segments");
            assert_eq!(segs.iter().map(|s| s.1).sum::<u64>(), size, "{id}");
            for &(start, len) in &segs {
                assert!(len > 0);
                assert!(start + len <= a.capacity_bytes(), "{id} beyond capacity");
            }
            all.extend(segs);
        }
        all.sort_unstable();
        for w in all.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:?} {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn physical_segments_cover_sizes_without_overlap() {
        let cfg = VirtualChunksConfig {
            chunk_bytes: 64 * 1024,
            small_alloc_max_bytes: 16 * 1024,
        };
        let capacity = 64 * 64 * 1024 + 1000;
        let mut a = VirtualChunks::new(cfg, capacity).expect("config");
        assert_eq!(a.physical_segments(AllocId(1)), None);
        let mut live: Vec<(AllocId, u64)> = Vec::new();
        let mut rng: u64 = 0x1234_5678;
        let mut next = 0u64;
        for _ in 0..3000 {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = rng >> 33;
            if r.is_multiple_of(3) && !live.is_empty() {
                let (id, _) = live.swap_remove((r as usize / 3) % live.len());
                a.free(id).expect("free");
                assert_eq!(a.physical_segments(id), None);
            } else {
                let size = match r % 4 {
                    0 => r % 3000,
                    1 => r % (16 * 1024),
                    _ => r % (300 * 1024),
                };
                let id = AllocId(next);
                next += 1;
                if a.allocate(id, size).is_ok() {
                    live.push((id, size));
                }
            }
            check_segments(&a, &live);
        }
        // Scattered chunks give a large allocation several segments.
        assert!(
            live.iter()
                .any(|&(id, _)| a.physical_segments(id).is_some_and(|s| s.len() > 1))
        );
    }

    #[test]
    fn config_validation() {
        for cfg in [
            VirtualChunksConfig {
                chunk_bytes: 0,
                ..VirtualChunksConfig::default()
            },
            VirtualChunksConfig {
                chunk_bytes: MIB,
                small_alloc_max_bytes: 2 * MIB,
            },
        ] {
            assert!(VirtualChunks::new(cfg, MIB).is_err());
        }
    }
}
