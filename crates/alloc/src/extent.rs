//! Free-extent map of an address range: first-fit or best-fit placement of
//! variable-size ranges with coalescing on release. Used for segment placement
//! in the device address space (`best-fit`) and for virtual ranges
//! (`virtual-chunks`).

use std::collections::{BTreeMap, BTreeSet};

/// Free extents of `[base, base + size)`, indexed by address (for first-fit
/// and coalescing) and by `(size, addr)` (for best-fit and the largest extent).
#[derive(Debug, Clone)]
pub(crate) struct ExtentMap {
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl ExtentMap {
    pub(crate) fn new(base_addr: u64, size_bytes: u64) -> Self {
        let mut map = ExtentMap {
            by_addr: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
        };
        if size_bytes > 0 {
            map.insert(base_addr, size_bytes);
        }
        map
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub(crate) fn largest_bytes(&self) -> u64 {
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    /// Lowest-address extent that fits. Linear in the number of extents, which
    /// is fine for segment placement (segments are few and placed rarely).
    pub(crate) fn allocate_first_fit(&mut self, size_bytes: u64) -> Option<u64> {
        let (&addr, &extent) = self
            .by_addr
            .iter()
            .find(|&(_, &extent)| extent >= size_bytes)?;
        self.take_front(addr, extent, size_bytes);
        Some(addr)
    }

    /// Smallest extent that fits (lowest address among equals); logarithmic.
    pub(crate) fn allocate_best_fit(&mut self, size_bytes: u64) -> Option<u64> {
        let &(extent, addr) = self.by_size.range((size_bytes, 0)..).next()?;
        self.take_front(addr, extent, size_bytes);
        Some(addr)
    }

    /// Returns `[addr, addr + size_bytes)` to the map, merging with free
    /// neighbours. The caller guarantees the range is currently allocated.
    pub(crate) fn release(&mut self, mut addr: u64, mut size_bytes: u64) {
        if let Some((&prev_addr, &prev_size)) = self.by_addr.range(..addr).next_back()
            && prev_addr + prev_size == addr
        {
            self.remove(prev_addr, prev_size);
            addr = prev_addr;
            size_bytes += prev_size;
        }
        if let Some(&next_size) = self.by_addr.get(&(addr + size_bytes)) {
            self.remove(addr + size_bytes, next_size);
            size_bytes += next_size;
        }
        self.insert(addr, size_bytes);
    }

    fn take_front(&mut self, addr: u64, extent: u64, size_bytes: u64) {
        self.remove(addr, extent);
        if extent > size_bytes {
            self.insert(addr + size_bytes, extent - size_bytes);
        }
    }

    fn insert(&mut self, addr: u64, size_bytes: u64) {
        self.by_addr.insert(addr, size_bytes);
        self.by_size.insert((size_bytes, addr));
        self.free_bytes += size_bytes;
    }

    fn remove(&mut self, addr: u64, size_bytes: u64) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(size_bytes, addr));
        self.free_bytes -= size_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_takes_lowest_and_release_coalesces() {
        let mut m = ExtentMap::new(0, 100);
        assert_eq!(m.allocate_first_fit(10), Some(0));
        assert_eq!(m.allocate_first_fit(20), Some(10));
        assert_eq!(m.allocate_first_fit(30), Some(30));
        m.release(0, 10);
        assert_eq!(m.allocate_first_fit(5), Some(0));
        assert_eq!(m.allocate_first_fit(50), None);
        assert_eq!(m.largest_bytes(), 40);
        m.release(0, 5);
        m.release(10, 20);
        m.release(30, 30);
        assert_eq!(m.free_bytes(), 100);
        assert_eq!(m.largest_bytes(), 100);
    }

    #[test]
    fn best_fit_picks_smallest_hole() {
        let mut m = ExtentMap::new(0, 100);
        let a = m.allocate_best_fit(10).expect("a");
        let _b = m.allocate_best_fit(10).expect("b");
        let c = m.allocate_best_fit(5).expect("c");
        let _d = m.allocate_best_fit(10).expect("d");
        m.release(a, 10);
        m.release(c, 5);
        // Holes: 10 @ 0, 5 @ 20, 65 @ 35. A 4-byte request goes into the 5 hole.
        assert_eq!(m.allocate_best_fit(4), Some(20));
        assert_eq!(m.allocate_best_fit(66), None);
    }
}
