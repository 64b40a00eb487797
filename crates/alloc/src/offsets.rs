//! `offsets`: an exact offset assignment computed ahead of time. Every
//! allocation of a plan's iteration has its address fixed by the planner
//! (`outcore_plan::layout`), so nothing is searched at run time and there is
//! no fragmentation beyond what the layout itself leaves.
//!
//! An allocation is named by its owner id (the simulator's and the layout's
//! [`AllocId`]: a tensor id, or a step's scratch id) and by how many times
//! that owner was allocated before. The `k`-th allocation of an owner takes
//! [`OwnerOffsets::initial_offset_bytes`] when it is set and `k == 0` (a
//! persistent tensor resident from the start, allocated once before the first
//! iteration), else `offsets_bytes[k' % len]` with `k'` counting the
//! allocations inside iterations. So the layout of one iteration repeats in
//! every iteration.
//!
//! The allocator trusts the layout only as far as it can check it cheaply:
//! an allocation whose range overlaps a live one, an owner or occurrence the
//! layout does not list, a size larger than the one laid out, or an end past
//! the capacity is refused with an error naming it (never a silent overlap,
//! which would corrupt another tensor's bytes on a real device).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::invalid_config;
use crate::{
    ALIGNMENT_BYTES, AllocError, AllocErrorKind, AllocId, AllocStats, Allocation, Allocator,
    AllocatorKind, round_request,
};

/// Where one owner's allocations go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerOffsets {
    /// The owner's allocation id (a tensor id, or a step's scratch id).
    pub id: u64,
    /// Bytes each allocation may take at most (the layout reserved this much,
    /// rounded up to [`ALIGNMENT_BYTES`]).
    pub size_bytes: u64,
    /// The offset of the allocation made once before the first iteration (a
    /// persistent tensor resident from the start), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_offset_bytes: Option<u64>,
    /// The offsets of its allocations inside one iteration, in order.
    #[serde(default)]
    pub offsets_bytes: Vec<u64>,
}

/// The layout of one plan: every owner's offsets and the bytes the layout
/// spans (the highest end of any allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetsConfig {
    /// The highest end of any laid-out allocation: the arena the layout needs.
    pub height_bytes: u64,
    pub owners: Vec<OwnerOffsets>,
}

/// The `offsets` allocator (module docs).
#[derive(Debug, Clone)]
pub struct FixedOffsets {
    capacity_bytes: u64,
    /// Per owner: its offsets, and how many times it was allocated.
    owners: HashMap<u64, (OwnerOffsets, u64)>,
    /// Live allocations by address: start -> (end, id, requested bytes).
    live_by_addr: BTreeMap<u64, (u64, AllocId, u64)>,
    /// Live allocations by id: their start address.
    live_by_id: HashMap<AllocId, u64>,
    stats: AllocStats,
}

impl FixedOffsets {
    /// The allocator for `config` over `capacity_bytes`; the layout must be
    /// aligned, fit the capacity, and name each owner once.
    pub fn from_config(config: &OffsetsConfig, capacity_bytes: u64) -> Result<Self, AllocError> {
        if config.owners.is_empty() {
            return Err(invalid_config(
                "an `offsets` allocator needs a layout, and this one lists no allocation; \
                 plan with `--allocator offsets` so that the planner computes it",
            ));
        }
        if config.height_bytes > capacity_bytes {
            return Err(invalid_config(format!(
                "the layout spans {} bytes, more than the {capacity_bytes} bytes of capacity; \
                 plan again for this capacity",
                config.height_bytes
            )));
        }
        let mut owners = HashMap::with_capacity(config.owners.len());
        for o in &config.owners {
            let offsets = o.initial_offset_bytes.iter().chain(&o.offsets_bytes);
            for &offset in offsets {
                if offset % ALIGNMENT_BYTES != 0 {
                    return Err(invalid_config(format!(
                        "owner {} has offset {offset}, not a multiple of {ALIGNMENT_BYTES} bytes",
                        o.id
                    )));
                }
                let end = offset.checked_add(o.size_bytes);
                if end.is_none_or(|end| end > config.height_bytes) {
                    return Err(invalid_config(format!(
                        "owner {} at offset {offset} with {} bytes ends past the layout's {} bytes",
                        o.id, o.size_bytes, config.height_bytes
                    )));
                }
            }
            if owners.insert(o.id, (o.clone(), 0)).is_some() {
                return Err(invalid_config(format!(
                    "owner {} is listed twice in the layout",
                    o.id
                )));
            }
        }
        Ok(FixedOffsets {
            capacity_bytes,
            owners,
            live_by_addr: BTreeMap::new(),
            live_by_id: HashMap::new(),
            stats: AllocStats::default(),
        })
    }

    /// The bytes the layout reserves for each allocation of `owner`.
    pub fn slot_bytes(&self, owner: u64) -> Option<u64> {
        self.owners.get(&owner).map(|(o, _)| o.size_bytes)
    }

    /// Allocates the next laid-out place of `owner` under the key `id` (the
    /// simulator uses the owner id itself, [`Allocator::allocate`]; the
    /// executor a fresh key per allocation, since it frees lazily and may
    /// allocate an owner again before the key of its previous allocation is
    /// freed).
    pub fn allocate_for(
        &mut self,
        id: AllocId,
        owner: u64,
        size_bytes: u64,
    ) -> Result<Allocation, AllocError> {
        if self.live_by_id.contains_key(&id) {
            self.stats.record_failure(None);
            return Err(AllocError::new(AllocErrorKind::DoubleAllocate { id }));
        }
        let offset = match self.next_offset(owner, size_bytes) {
            Ok(offset) => offset,
            Err(reason) => return Err(self.refuse(id, reason)),
        };
        let Some(rounded) = round_request(size_bytes) else {
            let reason = format!("allocation {owner} of {size_bytes} bytes overflows");
            return Err(self.refuse(id, reason));
        };
        let end = offset.saturating_add(rounded);
        if end > self.capacity_bytes {
            let reason = format!(
                "allocation {owner} ends at byte {end}, past the {} bytes of capacity",
                self.capacity_bytes
            );
            return Err(self.refuse(id, reason));
        }
        if let Some(other) = self.overlapping(offset, end) {
            let reason = format!(
                "allocation {owner} at [{offset}, {end}) overlaps live allocation {other}: \
                 the layout does not hold for this order of events"
            );
            return Err(self.refuse(id, reason));
        }
        if let Some((_, count)) = self.owners.get_mut(&owner) {
            *count += 1;
        }
        self.live_by_addr.insert(offset, (end, id, size_bytes));
        self.live_by_id.insert(id, offset);
        self.stats.record_alloc(size_bytes);
        let reserved = self.stats.reserved_bytes.max(end);
        self.stats.set_reserved(reserved);
        Ok(Allocation {
            id,
            addr: offset,
            size_bytes,
        })
    }

    /// The offset of the next allocation of `owner`, or why there is none.
    fn next_offset(&self, owner_id: u64, size_bytes: u64) -> Result<u64, String> {
        let id = owner_id;
        let Some((owner, count)) = self.owners.get(&owner_id) else {
            return Err(format!("allocation {id} is not in the layout"));
        };
        if size_bytes > owner.size_bytes {
            return Err(format!(
                "allocation {id} asks for {size_bytes} bytes; the layout reserved {}",
                owner.size_bytes
            ));
        }
        let inner = match owner.initial_offset_bytes {
            Some(offset) if *count == 0 => return Ok(offset),
            Some(_) => count - 1,
            None => *count,
        };
        let n = owner.offsets_bytes.len() as u64;
        if n == 0 {
            return Err(format!(
                "allocation {id} is made again, but the layout has it once, before the first iteration"
            ));
        }
        Ok(owner.offsets_bytes[(inner % n) as usize])
    }

    /// The live allocation overlapping `[start, end)`, if any.
    fn overlapping(&self, start: u64, end: u64) -> Option<AllocId> {
        // The live range starting last at or before `end - 1`, and the one
        // starting inside the range, are the only candidates: ranges of live
        // allocations do not overlap each other.
        self.live_by_addr
            .range(..end)
            .next_back()
            .filter(|(_, (e, _, _))| *e > start)
            .map(|(_, (_, id, _))| *id)
    }

    fn refuse(&mut self, id: AllocId, reason: String) -> AllocError {
        self.stats.record_failure(None);
        AllocError::new(AllocErrorKind::LayoutViolation { id, reason })
    }
}

impl Allocator for FixedOffsets {
    fn name(&self) -> AllocatorKind {
        AllocatorKind::Offsets
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn allocate(&mut self, id: AllocId, size_bytes: u64) -> Result<Allocation, AllocError> {
        self.allocate_for(id, id.0, size_bytes)
    }

    fn free(&mut self, id: AllocId) -> Result<(), AllocError> {
        let Some(offset) = self.live_by_id.remove(&id) else {
            return Err(AllocError::new(AllocErrorKind::UnknownId { id }));
        };
        if let Some((_, _, size_bytes)) = self.live_by_addr.remove(&offset) {
            self.stats.record_free(size_bytes);
        }
        Ok(())
    }

    fn stats(&self) -> &AllocStats {
        &self.stats
    }

    fn live_allocations(&self) -> Vec<Allocation> {
        self.live_by_addr
            .iter()
            .map(|(&addr, &(_, id, size_bytes))| Allocation {
                id,
                addr,
                size_bytes,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(id: u64, size_bytes: u64, initial: Option<u64>, offsets: &[u64]) -> OwnerOffsets {
        OwnerOffsets {
            id,
            size_bytes,
            initial_offset_bytes: initial,
            offsets_bytes: offsets.to_vec(),
        }
    }

    /// Owner 1 is resident from the start at 0, freed and made again at 0
    /// each iteration; owner 2 alternates 1024 and 0 (when 1 is away);
    /// owner 3 stays at 2048.
    fn config() -> OffsetsConfig {
        OffsetsConfig {
            height_bytes: 4096,
            owners: vec![
                owner(1, 1024, Some(0), &[0]),
                owner(2, 1000, None, &[1024, 0]),
                owner(3, 512, None, &[2048]),
            ],
        }
    }

    #[test]
    fn allocations_take_the_laid_out_offsets_every_iteration() {
        let mut a = FixedOffsets::from_config(&config(), 4096).expect("valid layout");
        assert_eq!(a.allocate(AllocId(1), 1024).unwrap().addr, 0);
        for _iteration in 0..3 {
            assert_eq!(a.allocate(AllocId(2), 1000).unwrap().addr, 1024);
            a.free(AllocId(2)).unwrap();
            a.free(AllocId(1)).unwrap();
            assert_eq!(a.allocate(AllocId(2), 1000).unwrap().addr, 0);
            assert_eq!(a.allocate(AllocId(3), 10).unwrap().addr, 2048);
            a.free(AllocId(2)).unwrap();
            a.free(AllocId(3)).unwrap();
            assert_eq!(a.allocate(AllocId(1), 1024).unwrap().addr, 0);
        }
        // 1024 + 1000 live at once at most; the highest end is 2048 + 512.
        assert_eq!(a.stats().peak_live_bytes, 2024);
        assert_eq!(a.stats().peak_reserved_bytes, 2560);
    }

    #[test]
    fn an_overlap_with_a_live_allocation_is_refused_not_made() {
        let mut a = FixedOffsets::from_config(&config(), 4096).unwrap();
        a.allocate(AllocId(1), 1024).unwrap();
        a.allocate(AllocId(2), 1000).unwrap();
        a.free(AllocId(2)).unwrap();
        // Owner 2's second slot is 0, where owner 1 still lives.
        let err = a.allocate(AllocId(2), 1000).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("overlaps live allocation 1"), "{msg}");
        assert_eq!(a.live_allocations().len(), 1);
        assert_eq!(a.stats().n_failures, 1);
    }

    #[test]
    fn unknown_owners_and_oversized_requests_name_the_allocation() {
        let mut a = FixedOffsets::from_config(&config(), 4096).unwrap();
        let unknown = a.allocate(AllocId(9), 8).unwrap_err().to_string();
        assert!(
            unknown.contains("allocation 9 is not in the layout"),
            "{unknown}"
        );
        let big = a.allocate(AllocId(3), 513).unwrap_err().to_string();
        assert!(big.contains("the layout reserved 512"), "{big}");
        a.allocate(AllocId(1), 1024).unwrap();
        a.free(AllocId(1)).unwrap();
        a.allocate(AllocId(1), 1024).unwrap();
        a.free(AllocId(1)).unwrap();
        assert_eq!(a.allocate(AllocId(1), 1024).unwrap().addr, 0);
    }

    #[test]
    fn fresh_keys_per_allocation_count_by_owner() {
        // The executor's way: a new key each time, the owner names the slot.
        let mut a = FixedOffsets::from_config(&config(), 4096).unwrap();
        assert_eq!(a.allocate_for(AllocId(100), 2, 1000).unwrap().addr, 1024);
        assert_eq!(a.slot_bytes(2), Some(1000));
        // Owner 2's second place is 0, free while owner 1 is not resident.
        assert_eq!(a.allocate_for(AllocId(101), 2, 1000).unwrap().addr, 0);
        assert!(
            a.allocate_for(AllocId(101), 3, 8).is_err(),
            "key 101 is live"
        );
        a.free(AllocId(100)).unwrap();
        a.free(AllocId(101)).unwrap();
        assert_eq!(a.allocate_for(AllocId(102), 2, 1000).unwrap().addr, 1024);
    }

    #[test]
    fn bad_layouts_are_rejected_with_the_fix() {
        let empty = FixedOffsets::from_config(&OffsetsConfig::default(), 1 << 20).unwrap_err();
        assert!(
            empty
                .to_string()
                .contains("plan with `--allocator offsets`")
        );
        let too_tall = FixedOffsets::from_config(&config(), 2048).unwrap_err();
        assert!(
            too_tall.to_string().contains("more than the 2048 bytes"),
            "{too_tall}"
        );
        let mut unaligned = config();
        unaligned.owners[2].offsets_bytes = vec![2049];
        let err = FixedOffsets::from_config(&unaligned, 4096).unwrap_err();
        assert!(err.to_string().contains("not a multiple of 512"), "{err}");
        let mut past = config();
        past.owners[2].offsets_bytes = vec![3584 + 512];
        let err = FixedOffsets::from_config(&past, 8192).unwrap_err();
        assert!(err.to_string().contains("ends past the layout"), "{err}");
        let mut twice = config();
        twice.owners.push(owner(3, 512, None, &[0]));
        let err = FixedOffsets::from_config(&twice, 4096).unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
    }

    #[test]
    fn config_round_trips_through_json() {
        let c = config();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"initial_offset_bytes\":0"), "{json}");
        let back: OffsetsConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
    }
}
