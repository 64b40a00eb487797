//! Allocator statistics shared by all allocators: live/reserved bytes and
//! their peaks, fragmentation, operation counts, failures and map/unmap ops.

use serde::{Deserialize, Serialize};

use crate::AllocId;

/// How many failures are kept in [`AllocStats::failures`]; later failures are
/// only counted, so a long replay that fails often does not grow without bound.
pub const MAX_RECORDED_FAILURES: usize = 64;

/// One failed allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub id: AllocId,
    pub requested_bytes: u64,
    /// Bytes not holding live data at the time of the failure.
    pub free_bytes: u64,
    /// Largest request that could have succeeded at the time of the failure.
    pub largest_free_block_bytes: u64,
}

/// Running statistics of one allocator.
///
/// * `live_bytes`: sum of the requested sizes of live allocations.
/// * `reserved_bytes`: bytes the allocator holds from the device: the whole
///   pool for `size-class`, the sum of segments for `best-fit`, the physical
///   chunks created so far for `virtual-chunks`.
/// * Fragmentation (see [`AllocStats::fragmentation`]) is
///   `peak_reserved_bytes / live_bytes_at_peak_reserved`, where
///   `live_bytes_at_peak_reserved` is the largest `live_bytes` seen at any
///   moment when `reserved_bytes == peak_reserved_bytes`. Taking the largest
///   live value at the peak makes the ratio the overhead the allocator really
///   needed on top of the data it served (1.0 = none), rather than an artefact
///   of the exact instant the last segment was reserved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocStats {
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub live_bytes_at_peak_reserved: u64,
    pub n_live_allocations: u64,
    /// Successful allocations.
    pub n_allocs: u64,
    /// Successful frees.
    pub n_frees: u64,
    /// Failed allocations (any error, out-of-memory included).
    pub n_failures: u64,
    /// The first [`MAX_RECORDED_FAILURES`] out-of-memory failures.
    pub failures: Vec<FailureRecord>,
    /// Chunk map operations (`virtual-chunks` only; one per chunk mapped).
    pub map_ops: u64,
    /// Chunk unmap operations (`virtual-chunks` only; one per chunk unmapped).
    pub unmap_ops: u64,
}

impl AllocStats {
    /// `peak_reserved_bytes / live_bytes_at_peak_reserved` (see the type docs);
    /// `None` before anything was reserved while live (the ratio is undefined).
    pub fn fragmentation(&self) -> Option<f64> {
        if self.live_bytes_at_peak_reserved == 0 {
            None
        } else {
            Some(self.peak_reserved_bytes as f64 / self.live_bytes_at_peak_reserved as f64)
        }
    }

    pub(crate) fn record_alloc(&mut self, size_bytes: u64) {
        self.live_bytes += size_bytes;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        self.n_live_allocations += 1;
        self.n_allocs += 1;
        self.track_peak_reserved();
    }

    pub(crate) fn record_free(&mut self, size_bytes: u64) {
        self.live_bytes -= size_bytes;
        self.n_live_allocations -= 1;
        self.n_frees += 1;
    }

    pub(crate) fn set_reserved(&mut self, reserved_bytes: u64) {
        self.reserved_bytes = reserved_bytes;
        self.track_peak_reserved();
    }

    pub(crate) fn record_failure(&mut self, record: Option<FailureRecord>) {
        self.n_failures += 1;
        if let Some(record) = record
            && self.failures.len() < MAX_RECORDED_FAILURES
        {
            self.failures.push(record);
        }
    }

    fn track_peak_reserved(&mut self) {
        if self.reserved_bytes > self.peak_reserved_bytes {
            self.peak_reserved_bytes = self.reserved_bytes;
            self.live_bytes_at_peak_reserved = self.live_bytes;
        } else if self.reserved_bytes == self.peak_reserved_bytes {
            self.live_bytes_at_peak_reserved =
                self.live_bytes_at_peak_reserved.max(self.live_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmentation_uses_max_live_at_peak_reserved() {
        let mut s = AllocStats::default();
        assert_eq!(s.fragmentation(), None);
        s.set_reserved(100);
        s.record_alloc(10);
        s.record_alloc(40);
        assert_eq!(s.live_bytes_at_peak_reserved, 50);
        assert_eq!(s.fragmentation(), Some(2.0));
        s.record_free(40);
        s.set_reserved(60);
        assert_eq!(s.peak_reserved_bytes, 100);
        assert_eq!(s.fragmentation(), Some(2.0));
        assert_eq!(s.peak_live_bytes, 50);
    }

    #[test]
    fn failures_are_capped() {
        let mut s = AllocStats::default();
        for i in 0..(MAX_RECORDED_FAILURES as u64 + 10) {
            s.record_failure(Some(FailureRecord {
                id: AllocId(i),
                requested_bytes: 1,
                free_bytes: 0,
                largest_free_block_bytes: 0,
            }));
        }
        assert_eq!(s.n_failures, MAX_RECORDED_FAILURES as u64 + 10);
        assert_eq!(s.failures.len(), MAX_RECORDED_FAILURES);
    }
}
