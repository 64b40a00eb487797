//! A PyTorch-style block pool: segments split into blocks that are linked to
//! their address neighbours, best-fit search over cached free blocks keyed by
//! `(size, addr)`, splitting on allocation and coalescing on free. Shared by
//! `best-fit` (both its pools) and the small-block pool of `virtual-chunks`.

use std::collections::BTreeSet;

use crate::hash::FastMap;

#[derive(Debug, Clone, Copy)]
struct Block {
    size_bytes: u64,
    /// Address of the preceding block in the same segment.
    prev: Option<u64>,
    /// Address of the following block in the same segment.
    next: Option<u64>,
    allocated: bool,
}

/// A free block produced by [`BlockPool::free`] after coalescing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreedBlock {
    pub(crate) addr: u64,
    pub(crate) size_bytes: u64,
    /// The block spans its whole segment (the segment is entirely free).
    pub(crate) whole_segment: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct BlockPool {
    blocks: FastMap<u64, Block>,
    free: BTreeSet<(u64, u64)>,
    free_bytes: u64,
    segment_bytes: u64,
}

impl BlockPool {
    /// Cached free bytes inside this pool's segments.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Sum of segment sizes in this pool.
    pub(crate) fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    pub(crate) fn largest_free_bytes(&self) -> u64 {
        self.free.last().map_or(0, |&(size, _)| size)
    }

    /// Adds a new segment `[addr, addr + size_bytes)` as one free block.
    pub(crate) fn add_segment(&mut self, addr: u64, size_bytes: u64) {
        self.blocks.insert(
            addr,
            Block {
                size_bytes,
                prev: None,
                next: None,
                allocated: false,
            },
        );
        self.free.insert((size_bytes, addr));
        self.free_bytes += size_bytes;
        self.segment_bytes += size_bytes;
    }

    /// Best-fit: the smallest cached free block of at least `size_bytes`
    /// (lowest address among equals), allocated and split when
    /// `should_split(remainder_bytes)` says so. Returns `(addr, block_bytes)`,
    /// where `block_bytes >= size_bytes` is what the allocation holds.
    pub(crate) fn allocate(
        &mut self,
        size_bytes: u64,
        should_split: impl Fn(u64) -> bool,
    ) -> Option<(u64, u64)> {
        let &(block_bytes, addr) = self.free.range((size_bytes, 0)..).next()?;
        self.free.remove(&(block_bytes, addr));
        let remainder = block_bytes - size_bytes;
        let held_bytes = if remainder > 0 && should_split(remainder) {
            let rest_addr = addr + size_bytes;
            let old_next = self.blocks.get(&addr).and_then(|b| b.next);
            self.blocks.insert(
                rest_addr,
                Block {
                    size_bytes: remainder,
                    prev: Some(addr),
                    next: old_next,
                    allocated: false,
                },
            );
            if let Some(next_addr) = old_next
                && let Some(next) = self.blocks.get_mut(&next_addr)
            {
                next.prev = Some(rest_addr);
            }
            self.free.insert((remainder, rest_addr));
            if let Some(block) = self.blocks.get_mut(&addr) {
                block.size_bytes = size_bytes;
                block.next = Some(rest_addr);
            }
            size_bytes
        } else {
            block_bytes
        };
        if let Some(block) = self.blocks.get_mut(&addr) {
            block.allocated = true;
        }
        self.free_bytes -= held_bytes;
        Some((addr, held_bytes))
    }

    /// Frees the allocated block at `addr` and merges it with free neighbours
    /// of the same segment. `None` if no allocated block starts at `addr`.
    pub(crate) fn free(&mut self, addr: u64) -> Option<FreedBlock> {
        let block = *self.blocks.get(&addr).filter(|b| b.allocated)?;
        self.free_bytes += block.size_bytes;
        let mut start = addr;
        let mut size_bytes = block.size_bytes;
        let mut prev = block.prev;
        let mut next = block.next;
        if let Some(prev_addr) = prev
            && let Some(p) = self
                .blocks
                .get(&prev_addr)
                .copied()
                .filter(|b| !b.allocated)
        {
            self.free.remove(&(p.size_bytes, prev_addr));
            self.blocks.remove(&addr);
            start = prev_addr;
            size_bytes += p.size_bytes;
            prev = p.prev;
        }
        if let Some(next_addr) = next
            && let Some(n) = self
                .blocks
                .get(&next_addr)
                .copied()
                .filter(|b| !b.allocated)
        {
            self.free.remove(&(n.size_bytes, next_addr));
            self.blocks.remove(&next_addr);
            size_bytes += n.size_bytes;
            next = n.next;
        }
        self.blocks.insert(
            start,
            Block {
                size_bytes,
                prev,
                next,
                allocated: false,
            },
        );
        if let Some(next_addr) = next
            && let Some(n) = self.blocks.get_mut(&next_addr)
        {
            n.prev = Some(start);
        }
        self.free.insert((size_bytes, start));
        Some(FreedBlock {
            addr: start,
            size_bytes,
            whole_segment: prev.is_none() && next.is_none(),
        })
    }

    /// Removes every entirely free segment from the pool and returns them as
    /// `(addr, size_bytes)`. Linear in the number of free blocks; only used on
    /// the out-of-memory path.
    pub(crate) fn take_free_segments(&mut self) -> Vec<(u64, u64)> {
        let segments: Vec<(u64, u64)> = self
            .free
            .iter()
            .filter(|&&(_, addr)| {
                self.blocks
                    .get(&addr)
                    .is_some_and(|b| b.prev.is_none() && b.next.is_none())
            })
            .map(|&(size, addr)| (addr, size))
            .collect();
        for &(addr, size_bytes) in &segments {
            self.free.remove(&(size_bytes, addr));
            self.blocks.remove(&addr);
            self.free_bytes -= size_bytes;
            self.segment_bytes -= size_bytes;
        }
        segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_coalesce_restore_the_segment() {
        let mut pool = BlockPool::default();
        pool.add_segment(0, 4096);
        let (a, a_bytes) = pool.allocate(1024, |r| r >= 512).expect("a");
        let (b, _) = pool.allocate(1024, |r| r >= 512).expect("b");
        let (c, c_bytes) = pool.allocate(2048, |r| r >= 512).expect("c");
        assert_eq!((a, a_bytes, b, c, c_bytes), (0, 1024, 1024, 2048, 2048));
        assert_eq!(pool.free_bytes(), 0);
        assert!(pool.allocate(512, |_| true).is_none());
        assert!(!pool.free(a).expect("free a").whole_segment);
        assert!(!pool.free(c).expect("free c").whole_segment);
        assert_eq!(pool.largest_free_bytes(), 2048);
        let merged = pool.free(b).expect("free b");
        assert_eq!(
            merged,
            FreedBlock {
                addr: 0,
                size_bytes: 4096,
                whole_segment: true
            }
        );
        assert!(pool.free(b).is_none(), "double free is rejected");
        assert_eq!(pool.take_free_segments(), vec![(0, 4096)]);
        assert_eq!(pool.segment_bytes(), 0);
    }

    #[test]
    fn no_split_keeps_the_remainder_in_the_block() {
        let mut pool = BlockPool::default();
        pool.add_segment(0, 4096);
        let (_, held) = pool.allocate(3584, |r| r > 1024).expect("alloc");
        assert_eq!(held, 4096);
        assert_eq!(pool.free_bytes(), 0);
    }

    #[test]
    fn segments_never_merge() {
        let mut pool = BlockPool::default();
        pool.add_segment(0, 1024);
        pool.add_segment(1024, 1024);
        let (a, _) = pool.allocate(1024, |_| true).expect("a");
        let freed = pool.free(a).expect("free");
        assert_eq!(freed.size_bytes, 1024);
        assert!(freed.whole_segment);
        assert_eq!(pool.take_free_segments(), vec![(0, 1024), (1024, 1024)]);
        assert_eq!(pool.segment_bytes(), 0);
    }
}
