//! Device-arena allocation for the executor: a best-fit free list for plans made
//! with the `perfect` allocator, the plan's own layout for `offsets`, or any
//! other `outcore-alloc` allocator named by the plan.
//!
//! An allocation is a list of [`DeviceSegment`]s of the region: one for the
//! contiguous allocators, the mapped physical chunks for `virtual-chunks`
//! (whose addresses are virtual and exceed the region; the region is its
//! physical memory).

use crate::backend::DeviceSegment;
use crate::{ExecError, ExecErrorKind};
use outcore_alloc::{ALIGNMENT_BYTES, AllocErrorKind, AllocId};
use outcore_plan::AllocatorSpec;
use std::collections::{BTreeMap, HashMap};

/// Where a failed allocation stood.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoFit {
    pub free_bytes: u64,
    pub largest_free_block: u64,
}

/// The arena allocator of one run.
#[derive(Debug)]
pub(crate) enum ArenaAllocator {
    Perfect(BestFitList),
    /// An `offsets` layout: each allocation where the plan's layout puts its
    /// owner's next allocation.
    Laid(outcore_alloc::FixedOffsets),
    Library(Box<dyn outcore_alloc::Allocator>),
}

impl ArenaAllocator {
    /// Builds the allocator a plan names over `capacity_bytes`.
    pub fn from_spec(spec: &AllocatorSpec, capacity_bytes: u64) -> Result<Self, ExecError> {
        let Some(config) = spec.config() else {
            return Ok(ArenaAllocator::Perfect(BestFitList::new(capacity_bytes)));
        };
        if let outcore_alloc::AllocatorConfig::Offsets(layout) = &config {
            let laid =
                outcore_alloc::FixedOffsets::from_config(layout, capacity_bytes).map_err(|e| {
                    ExecError::new(ExecErrorKind::Allocator {
                        detail: e.to_string(),
                    })
                })?;
            return Ok(ArenaAllocator::Laid(laid));
        }
        let alloc = outcore_alloc::build(&config, capacity_bytes).map_err(|e| {
            ExecError::new(ExecErrorKind::Allocator {
                detail: e.to_string(),
            })
        })?;
        Ok(ArenaAllocator::Library(alloc))
    }

    /// Whether allocations follow a plan's `offsets` layout (then a step's
    /// scratch is one slot, see the executor's `scratch`).
    pub fn is_laid_out(&self) -> bool {
        matches!(self, ArenaAllocator::Laid(_))
    }

    /// Allocates `size_bytes` under `key`; returns the device segments holding
    /// it (they total `size_bytes`), or where the arena stood. `owner` names
    /// the allocation in an `offsets` layout (the tensor, or a step's scratch
    /// slot). `long_lived` asks the built-in list to place the block at the top
    /// of the arena (library allocators place by their own policy).
    pub fn allocate(
        &mut self,
        key: u64,
        owner: u64,
        size_bytes: u64,
        long_lived: bool,
    ) -> Result<Vec<DeviceSegment>, NoFit> {
        let offset_bytes = match self {
            ArenaAllocator::Perfect(list) if long_lived => list.allocate_high(key, size_bytes)?,
            ArenaAllocator::Perfect(list) => list.allocate(key, size_bytes)?,
            // A refusal is most often the previous occupant's free still in
            // flight: the executor drains those and asks again.
            ArenaAllocator::Laid(a) => match a.allocate_for(AllocId(key), owner, size_bytes) {
                Ok(al) => al.addr,
                Err(_) => return Err(library_no_fit(a)),
            },
            ArenaAllocator::Library(a) => match a.allocate(AllocId(key), size_bytes) {
                Ok(al) => {
                    // A virtual-address allocator says where the bytes physically
                    // are; for the others the address is the region offset.
                    if let Some(segments) = a.physical_segments(AllocId(key)) {
                        return Ok(segments
                            .into_iter()
                            .map(|(off, len)| DeviceSegment::new(off, len))
                            .collect());
                    }
                    al.addr
                }
                Err(e) => {
                    return Err(match *e.kind() {
                        AllocErrorKind::OutOfMemory {
                            free_bytes,
                            largest_free_block_bytes,
                            ..
                        } => NoFit {
                            free_bytes,
                            largest_free_block: largest_free_block_bytes,
                        },
                        _ => library_no_fit(&**a),
                    });
                }
            },
        };
        Ok(vec![DeviceSegment::new(offset_bytes, size_bytes)])
    }

    pub fn free(&mut self, key: u64) -> Result<(), ExecError> {
        match self {
            ArenaAllocator::Perfect(list) => list.free(key),
            ArenaAllocator::Laid(a) => {
                outcore_alloc::Allocator::free(a, AllocId(key)).map_err(|e| {
                    ExecError::new(ExecErrorKind::Allocator {
                        detail: e.to_string(),
                    })
                })
            }
            ArenaAllocator::Library(a) => a.free(AllocId(key)).map_err(|e| {
                ExecError::new(ExecErrorKind::Allocator {
                    detail: e.to_string(),
                })
            }),
        }
    }
}

fn library_no_fit(a: &dyn outcore_alloc::Allocator) -> NoFit {
    let mut live = a.live_allocations();
    live.sort_by_key(|x| x.addr);
    let capacity = a.capacity_bytes();
    let mut cursor = 0u64;
    let mut largest = 0u64;
    let mut used = 0u64;
    for x in &live {
        largest = largest.max(x.addr.saturating_sub(cursor));
        cursor = cursor.max(x.end_addr());
        used += x.size_bytes;
    }
    largest = largest.max(capacity.saturating_sub(cursor));
    NoFit {
        free_bytes: capacity.saturating_sub(used),
        largest_free_block: largest,
    }
}

/// Best-fit over free extents with coalescing; 512-byte granules like every
/// outcore allocator.
#[derive(Debug)]
pub(crate) struct BestFitList {
    /// Free extents: start -> length.
    free: BTreeMap<u64, u64>,
    /// Live allocations: key -> (start, rounded length).
    live: HashMap<u64, (u64, u64)>,
}

impl BestFitList {
    pub fn new(capacity_bytes: u64) -> Self {
        let usable = capacity_bytes / ALIGNMENT_BYTES * ALIGNMENT_BYTES;
        let mut free = BTreeMap::new();
        if usable > 0 {
            free.insert(0, usable);
        }
        BestFitList {
            free,
            live: HashMap::new(),
        }
    }

    fn no_fit(&self) -> NoFit {
        NoFit {
            free_bytes: self.free.values().sum(),
            largest_free_block: self.free.values().copied().max().unwrap_or(0),
        }
    }

    pub fn allocate(&mut self, key: u64, size_bytes: u64) -> Result<u64, NoFit> {
        let need = size_bytes.max(1).div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES;
        // Smallest block that fits; lowest address among equals (deterministic).
        let best = self
            .free
            .iter()
            .filter(|(_, len)| **len >= need)
            .min_by_key(|(start, len)| (**len, **start))
            .map(|(s, l)| (*s, *l));
        let Some((start, len)) = best else {
            return Err(self.no_fit());
        };
        self.free.remove(&start);
        if len > need {
            self.free.insert(start + need, len - need);
        }
        self.live.insert(key, (start, need));
        Ok(start)
    }

    /// Places a long-lived block at the top of the highest free extent that fits,
    /// so that persistent tensors gather at one end and transient ones (best-fit
    /// from the bottom) do not get split around them.
    pub fn allocate_high(&mut self, key: u64, size_bytes: u64) -> Result<u64, NoFit> {
        let need = size_bytes.max(1).div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES;
        let best = self
            .free
            .iter()
            .rev()
            .find(|(_, len)| **len >= need)
            .map(|(s, l)| (*s, *l));
        let Some((start, len)) = best else {
            return Err(self.no_fit());
        };
        self.free.remove(&start);
        if len > need {
            self.free.insert(start, len - need);
        }
        let at = start + len - need;
        self.live.insert(key, (at, need));
        Ok(at)
    }

    pub fn free(&mut self, key: u64) -> Result<(), ExecError> {
        let (mut start, mut len) = self.live.remove(&key).ok_or_else(|| {
            ExecError::new(ExecErrorKind::Allocator {
                detail: format!("free of unknown allocation {key}"),
            })
        })?;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back()
            && ps + pl == start
        {
            self.free.remove(&ps);
            start = ps;
            len += pl;
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_coalesces() {
        let mut a = BestFitList::new(4096);
        let x = a.allocate(1, 1000).expect("x");
        let y = a.allocate(2, 512).expect("y");
        let z = a.allocate(3, 2048).expect("z");
        assert_eq!((x, y, z), (0, 1024, 1536));
        assert!(a.allocate(4, 1024).is_err());
        a.free(1).expect("free x");
        a.free(2).expect("free y");
        assert_eq!(a.allocate(5, 1536).expect("reuse"), 0);
        let e = a.allocate(6, 600).expect_err("full");
        assert_eq!(e.free_bytes, 512);
    }
}
