//! `size-class`: SwapAdvisor's memory pool of fixed-size objects in size
//! classes (SwapAdvisor, Sec. 4.1 and 5.3).
//!
//! The whole pool is reserved up front: class `k` holds `count_k` objects of
//! `size_k` bytes laid out contiguously, classes in increasing size from
//! address 0, so reserved bytes are `sum(size_k * count_k)` from the start.
//! A tensor of size `s` takes one object of the class it maps to: the class
//! given by an explicit size mapping if there is one (the CLS list of the
//! paper's encoding), otherwise the smallest class with `size_k >= s`.
//! There is no fallback to a larger class: when the mapped class has no free
//! object the allocation fails even if other classes have free objects. That
//! is the point of SwapAdvisor's Figure 1 (the pool layout decides when a
//! swap is needed), and why SwapAdvisor searches over the layout.
//!
//! Class sizes are rounded up to 512 B ([`crate::ALIGNMENT_BYTES`]) so that
//! every object is aligned; classes that become equal after rounding merge.
//!
//! # The CLS / CNT encoding (Sec. 5.3)
//!
//! `TS` is the sorted list of distinct tensor sizes of the graph. `CLS[i]` is
//! the class of tensors of size `TS[i]`; CLS starts at 0 or 1 (the paper uses
//! both) and each element equals its predecessor or is one greater, so
//! adjacent sizes merge into one class. A class's object size is the largest
//! `TS[i]` mapped to it. `CNT[k]` is the object count of the `k`-th class.
//! Example (Figure 1): `TS = [1MB, 2MB]`; the coarse pool is `CLS = [0, 0]`,
//! `CNT = [5]` (five 2 MB objects); the fine pool is `CLS = [0, 1]`,
//! `CNT = [8, 1]` (eight 1 MB objects and one 2 MB object).

use serde::{Deserialize, Serialize};

use crate::error::invalid_config;
use crate::hash::FastMap;
use crate::stats::{AllocStats, FailureRecord};
use crate::{
    ALIGNMENT_BYTES, AllocError, AllocErrorKind, AllocId, Allocation, Allocator, AllocatorKind,
    round_up,
};

/// One size class: `count` objects of `size_bytes` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeClassSpec {
    pub size_bytes: u64,
    pub count: u64,
}

/// SwapAdvisor's CLS / CNT encoding of a pool (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeClassEncoding {
    /// `TS`: distinct tensor sizes, strictly increasing.
    pub tensor_sizes_bytes: Vec<u64>,
    /// `CLS`: class of each tensor size; starts at 0 or 1, steps of 0 or 1.
    pub cls: Vec<u32>,
    /// `CNT`: object count of each class, in class order.
    pub cnt: Vec<u64>,
}

impl SizeClassEncoding {
    /// Validates and builds an encoding.
    pub fn new(
        tensor_sizes_bytes: Vec<u64>,
        cls: Vec<u32>,
        cnt: Vec<u64>,
    ) -> Result<Self, AllocError> {
        let encoding = SizeClassEncoding {
            tensor_sizes_bytes,
            cls,
            cnt,
        };
        encoding.classes()?;
        Ok(encoding)
    }

    /// `TS`: the sorted distinct sizes of `sizes_bytes`.
    pub fn distinct_sizes(sizes_bytes: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut sizes: Vec<u64> = sizes_bytes.into_iter().collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// The finest encoding (one class per distinct size, `CLS = [0, 1, ..]`)
    /// with `count_per_class` objects in every class.
    pub fn one_class_per_size(
        sizes_bytes: impl IntoIterator<Item = u64>,
        count_per_class: u64,
    ) -> Self {
        let tensor_sizes_bytes = Self::distinct_sizes(sizes_bytes);
        let n = tensor_sizes_bytes.len();
        SizeClassEncoding {
            tensor_sizes_bytes,
            cls: (0..n as u32).collect(),
            cnt: vec![count_per_class; n],
        }
    }

    /// The classes this encoding describes, and for each `TS[i]` its class
    /// index. Errors explain which rule of Sec. 5.3 is broken.
    pub fn classes(&self) -> Result<(Vec<SizeClassSpec>, Vec<usize>), AllocError> {
        let ts = &self.tensor_sizes_bytes;
        if ts.is_empty() {
            return Err(invalid_config(
                "size-class encoding has no tensor sizes; give TS, the sorted distinct tensor sizes",
            ));
        }
        if self.cls.len() != ts.len() {
            return Err(invalid_config(format!(
                "size-class encoding has {} CLS entries for {} tensor sizes; give one class per tensor size",
                self.cls.len(),
                ts.len()
            )));
        }
        if let Some(w) = ts.windows(2).find(|w| w[0] >= w[1]) {
            return Err(invalid_config(format!(
                "size-class encoding tensor sizes must be strictly increasing, but {} is followed by {}; sort and deduplicate them",
                w[0], w[1]
            )));
        }
        if ts[0] == 0 {
            return Err(invalid_config(
                "size-class encoding has a tensor size of 0 bytes; give positive sizes",
            ));
        }
        let first = self.cls[0];
        if first > 1 {
            return Err(invalid_config(format!(
                "size-class encoding CLS starts at {first}; it must start at 0 or 1"
            )));
        }
        if let Some(w) = self
            .cls
            .windows(2)
            .find(|w| w[1] != w[0] && w[1] != w[0] + 1)
        {
            return Err(invalid_config(format!(
                "size-class encoding CLS steps from {} to {}; each entry must equal its predecessor or be one greater",
                w[0], w[1]
            )));
        }
        let mapping: Vec<usize> = self.cls.iter().map(|&c| (c - first) as usize).collect();
        let n_classes = mapping.last().map_or(0, |&k| k + 1);
        if self.cnt.len() != n_classes {
            return Err(invalid_config(format!(
                "size-class encoding has {} CNT entries for {n_classes} classes; give one count per class",
                self.cnt.len()
            )));
        }
        // CLS is monotone, so the last size mapped to a class is its largest.
        let mut classes = vec![
            SizeClassSpec {
                size_bytes: 0,
                count: 0
            };
            n_classes
        ];
        for (i, &k) in mapping.iter().enumerate() {
            classes[k] = SizeClassSpec {
                size_bytes: ts[i],
                count: self.cnt[k],
            };
        }
        Ok((classes, mapping))
    }
}

/// Parameters of a `size-class` pool: exactly one of an explicit class list
/// or a CLS / CNT encoding.
///
/// JSON: `{"classes":[{"size_bytes":1048576,"count":8}]}` or
/// `{"encoding":{"tensor_sizes_bytes":[1048576,2097152],"cls":[0,1],"cnt":[8,1]}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeClassConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<SizeClassSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<SizeClassEncoding>,
}

impl SizeClassConfig {
    /// The pool a plan needs, read off its allocation trace under a perfect
    /// allocator: one class per distinct request size, with as many objects as
    /// were live at once at that size. No class is shared between sizes, so
    /// the pool never fails on this trace; its reserved bytes (the sum over
    /// classes, rounded to the alignment) may exceed the trace's peak.
    pub fn for_trace(trace: &crate::Trace) -> SizeClassConfig {
        // size -> (live now, most live at once)
        let mut live: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        let mut size_of: FastMap<u64, u64> = FastMap::default();
        for e in &trace.events {
            match e {
                crate::TraceEvent::Alloc { id, size_bytes } => {
                    size_of.insert(id.0, *size_bytes);
                    let entry = live.entry(*size_bytes).or_insert((0, 0));
                    entry.0 += 1;
                    entry.1 = entry.1.max(entry.0);
                }
                crate::TraceEvent::Free { id } => {
                    if let Some(size) = size_of.remove(&id.0)
                        && let Some(entry) = live.get_mut(&size)
                    {
                        entry.0 = entry.0.saturating_sub(1);
                    }
                }
            }
        }
        SizeClassConfig {
            classes: live
                .iter()
                .map(|(&size_bytes, &(_, count))| SizeClassSpec { size_bytes, count })
                .collect(),
            encoding: None,
        }
    }

    /// Whether no class and no encoding is given: "size the pool for me".
    pub fn is_unsized(&self) -> bool {
        self.classes.is_empty() && self.encoding.is_none()
    }
}

#[derive(Debug, Clone)]
struct Class {
    size_bytes: u64,
    count: u64,
    base_addr: u64,
    /// Objects `>= next_fresh` have never been used; freed ones are recycled
    /// first (LIFO). Keeping the never-used tail implicit lets a class have
    /// millions of objects without a million-entry free list.
    next_fresh: u64,
    recycled: Vec<u64>,
}

impl Class {
    fn n_free(&self) -> u64 {
        self.count - self.next_fresh + self.recycled.len() as u64
    }
}

#[derive(Debug, Clone, Copy)]
struct LiveObject {
    class: usize,
    slot: u64,
    size_bytes: u64,
}

/// SwapAdvisor's fixed-object memory pool (see the module docs).
#[derive(Debug, Clone)]
pub struct SizeClassPool {
    capacity_bytes: u64,
    /// Sorted by strictly increasing `size_bytes`.
    classes: Vec<Class>,
    /// Explicit tensor size -> class index (from CLS); sizes not in it use the
    /// smallest class that fits.
    size_to_class: FastMap<u64, usize>,
    live: FastMap<AllocId, LiveObject>,
    stats: AllocStats,
}

impl SizeClassPool {
    /// A pool from an explicit class list; `(size, count)` pairs in any order.
    pub fn new(classes: &[SizeClassSpec], capacity_bytes: u64) -> Result<Self, AllocError> {
        Self::with_mapping(classes, &[], capacity_bytes)
    }

    /// A pool from SwapAdvisor's CLS / CNT encoding; each `TS[i]` maps to its
    /// CLS class.
    pub fn from_encoding(
        encoding: &SizeClassEncoding,
        capacity_bytes: u64,
    ) -> Result<Self, AllocError> {
        let (classes, mapping) = encoding.classes()?;
        let explicit: Vec<(u64, u64)> = encoding
            .tensor_sizes_bytes
            .iter()
            .zip(&mapping)
            .map(|(&size, &k)| (size, classes[k].size_bytes))
            .collect();
        Self::with_mapping(&classes, &explicit, capacity_bytes)
    }

    /// A pool from a [`SizeClassConfig`].
    pub fn from_config(config: &SizeClassConfig, capacity_bytes: u64) -> Result<Self, AllocError> {
        match (&config.encoding, config.classes.is_empty()) {
            (Some(encoding), true) => Self::from_encoding(encoding, capacity_bytes),
            (None, false) => Self::new(&config.classes, capacity_bytes),
            (Some(_), false) => Err(invalid_config(
                "size-class config gives both classes and an encoding; give exactly one",
            )),
            (None, true) => Err(invalid_config(
                "size-class config has no classes; give \"classes\" (size_bytes, count pairs) or a CLS/CNT \"encoding\"",
            )),
        }
    }

    /// `explicit` maps tensor sizes to the (unrounded) size of their class.
    fn with_mapping(
        specs: &[SizeClassSpec],
        explicit: &[(u64, u64)],
        capacity_bytes: u64,
    ) -> Result<Self, AllocError> {
        if specs.is_empty() {
            return Err(invalid_config("size-class pool needs at least one class"));
        }
        let mut rounded: Vec<(u64, u64)> = Vec::with_capacity(specs.len());
        for spec in specs {
            if spec.size_bytes == 0 {
                return Err(invalid_config(
                    "size class of 0 bytes; every class needs a positive object size",
                ));
            }
            let size = round_up(spec.size_bytes, ALIGNMENT_BYTES).ok_or_else(|| {
                invalid_config(format!(
                    "size class of {} bytes is too large",
                    spec.size_bytes
                ))
            })?;
            rounded.push((size, spec.count));
        }
        rounded.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(rounded.len());
        for (size, count) in rounded {
            match merged.last_mut() {
                Some(last) if last.0 == size => {
                    last.1 = last
                        .1
                        .checked_add(count)
                        .ok_or_else(|| invalid_config("size-class object counts overflow"))?;
                }
                _ => merged.push((size, count)),
            }
        }
        let mut classes = Vec::with_capacity(merged.len());
        let mut base_addr: u64 = 0;
        for (size_bytes, count) in merged {
            classes.push(Class {
                size_bytes,
                count,
                base_addr,
                next_fresh: 0,
                recycled: Vec::new(),
            });
            base_addr = size_bytes
                .checked_mul(count)
                .and_then(|bytes| base_addr.checked_add(bytes))
                .filter(|&total| total <= capacity_bytes)
                .ok_or_else(|| {
                    invalid_config(format!(
                        "size-class pool needs more than the capacity of {capacity_bytes} bytes \
                         (class sizes are rounded up to 512 B); lower the object counts or raise the capacity"
                    ))
                })?;
        }
        let mut size_to_class = FastMap::default();
        for &(tensor_size, class_size) in explicit {
            let class_size = round_up(class_size, ALIGNMENT_BYTES).unwrap_or(u64::MAX);
            if let Ok(k) = classes.binary_search_by_key(&class_size, |c| c.size_bytes) {
                size_to_class.insert(tensor_size, k);
            }
        }
        let mut stats = AllocStats::default();
        stats.set_reserved(base_addr);
        Ok(SizeClassPool {
            capacity_bytes,
            classes,
            size_to_class,
            live: FastMap::default(),
            stats,
        })
    }

    /// The pool's classes after rounding and merging, smallest first.
    pub fn classes(&self) -> Vec<SizeClassSpec> {
        self.classes
            .iter()
            .map(|c| SizeClassSpec {
                size_bytes: c.size_bytes,
                count: c.count,
            })
            .collect()
    }

    /// Free objects per class, smallest class first.
    pub fn free_objects(&self) -> Vec<SizeClassSpec> {
        self.classes
            .iter()
            .map(|c| SizeClassSpec {
                size_bytes: c.size_bytes,
                count: c.n_free(),
            })
            .collect()
    }

    fn class_for(&self, size_bytes: u64) -> Option<usize> {
        if let Some(&k) = self.size_to_class.get(&size_bytes) {
            return Some(k);
        }
        let k = self.classes.partition_point(|c| c.size_bytes < size_bytes);
        (k < self.classes.len()).then_some(k)
    }

    fn out_of_memory(&self, id: AllocId, requested_bytes: u64) -> AllocError {
        let free_bytes = self.classes.iter().map(|c| c.size_bytes * c.n_free()).sum();
        let largest_free_block_bytes = self
            .classes
            .iter()
            .rev()
            .find(|c| c.n_free() > 0)
            .map_or(0, |c| c.size_bytes);
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

    fn fail(&mut self, err: AllocError) -> Result<Allocation, AllocError> {
        let record = match *err.kind() {
            AllocErrorKind::OutOfMemory {
                id,
                requested_bytes,
                free_bytes,
                largest_free_block_bytes,
                ..
            } => Some(FailureRecord {
                id,
                requested_bytes,
                free_bytes,
                largest_free_block_bytes,
            }),
            _ => None,
        };
        self.stats.record_failure(record);
        Err(err)
    }
}

impl Allocator for SizeClassPool {
    fn name(&self) -> AllocatorKind {
        AllocatorKind::SizeClass
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn allocate(&mut self, id: AllocId, size_bytes: u64) -> Result<Allocation, AllocError> {
        if self.live.contains_key(&id) {
            return self.fail(AllocErrorKind::DoubleAllocate { id }.into());
        }
        let Some(k) = self.class_for(size_bytes) else {
            let largest_class_bytes = self.classes.last().map_or(0, |c| c.size_bytes);
            return self.fail(
                AllocErrorKind::SizeTooLargeForPool {
                    id,
                    requested_bytes: size_bytes,
                    largest_class_bytes,
                }
                .into(),
            );
        };
        let class = &mut self.classes[k];
        let slot = if let Some(slot) = class.recycled.pop() {
            slot
        } else if class.next_fresh < class.count {
            class.next_fresh += 1;
            class.next_fresh - 1
        } else {
            let err = self.out_of_memory(id, size_bytes);
            return self.fail(err);
        };
        let addr = class.base_addr + slot * class.size_bytes;
        self.live.insert(
            id,
            LiveObject {
                class: k,
                slot,
                size_bytes,
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
        let object = self
            .live
            .remove(&id)
            .ok_or(AllocErrorKind::UnknownId { id })?;
        self.classes[object.class].recycled.push(object.slot);
        self.stats.record_free(object.size_bytes);
        Ok(())
    }

    fn stats(&self) -> &AllocStats {
        &self.stats
    }

    fn live_allocations(&self) -> Vec<Allocation> {
        let mut out: Vec<Allocation> = self
            .live
            .iter()
            .map(|(&id, o)| {
                let class = &self.classes[o.class];
                Allocation {
                    id,
                    addr: class.base_addr + o.slot * class.size_bytes,
                    size_bytes: o.size_bytes,
                }
            })
            .collect();
        out.sort_unstable_by_key(|a| a.addr);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn pool_for_a_trace_holds_the_most_live_objects_per_size_and_replays_it() {
        let mut trace = crate::Trace::default();
        // Two 1 MiB live at once, then one 2 MiB after both are freed.
        trace.push_alloc(AllocId(0), MB);
        trace.push_alloc(AllocId(1), MB);
        trace.push_free(AllocId(0));
        trace.push_free(AllocId(1));
        trace.push_alloc(AllocId(2), 2 * MB);
        trace.push_free(AllocId(2));
        let config = SizeClassConfig::for_trace(&trace);
        assert_eq!(
            config.classes,
            vec![
                SizeClassSpec {
                    size_bytes: MB,
                    count: 2
                },
                SizeClassSpec {
                    size_bytes: 2 * MB,
                    count: 1
                },
            ]
        );
        assert!(!config.is_unsized());
        assert!(SizeClassConfig::default().is_unsized());
        let mut pool = SizeClassPool::from_config(&config, 4 * MB).expect("fits");
        assert!(pool.allocate(AllocId(0), MB).is_ok());
        assert!(pool.allocate(AllocId(1), MB).is_ok());
        assert!(pool.allocate(AllocId(2), 2 * MB).is_ok());
    }

    #[test]
    fn smallest_fitting_class_and_no_fallback() {
        let mut pool = SizeClassPool::new(
            &[
                SizeClassSpec {
                    size_bytes: 2 * MB,
                    count: 1,
                },
                SizeClassSpec {
                    size_bytes: MB,
                    count: 2,
                },
            ],
            4 * MB,
        )
        .expect("pool");
        assert_eq!(pool.stats().reserved_bytes, 4 * MB);
        let a = pool.allocate(AllocId(1), 1000).expect("a");
        let b = pool.allocate(AllocId(2), MB).expect("b");
        assert_eq!((a.addr, b.addr), (0, MB));
        // The 1 MB class is full; the 2 MB object is free but not used.
        let err = pool.allocate(AllocId(3), 10).expect_err("class exhausted");
        match err.kind() {
            AllocErrorKind::OutOfMemory {
                free_bytes,
                largest_free_block_bytes,
                ..
            } => assert_eq!((*free_bytes, *largest_free_block_bytes), (2 * MB, 2 * MB)),
            other => panic!("unexpected {other:?}"),
        }
        let c = pool.allocate(AllocId(4), MB + 1).expect("2 MB class");
        assert_eq!(c.addr, 2 * MB);
        let err = pool.allocate(AllocId(5), 3 * MB).expect_err("too large");
        assert!(matches!(
            err.kind(),
            AllocErrorKind::SizeTooLargeForPool { .. }
        ));
        pool.free(AllocId(1)).expect("free");
        assert_eq!(pool.allocate(AllocId(6), 1).expect("reuse").addr, 0);
        assert_eq!(pool.stats().n_failures, 2);
    }

    #[test]
    fn encoding_maps_sizes_to_merged_classes() {
        // Sec. 5.3's CLS2 example: TS = [1, 2, 3, 4] MB, CLS = [1, 2, 2, 2],
        // CNT = [8, 1]: eight 1 MB objects and one 4 MB object.
        let enc = SizeClassEncoding::new(
            vec![MB, 2 * MB, 3 * MB, 4 * MB],
            vec![1, 2, 2, 2],
            vec![8, 1],
        )
        .expect("valid encoding");
        let pool = SizeClassPool::from_encoding(&enc, 12 * MB).expect("pool");
        assert_eq!(
            pool.classes(),
            vec![
                SizeClassSpec {
                    size_bytes: MB,
                    count: 8
                },
                SizeClassSpec {
                    size_bytes: 4 * MB,
                    count: 1
                }
            ]
        );
        assert_eq!(pool.class_for(2 * MB), Some(1));
        assert!(SizeClassPool::from_encoding(&enc, 11 * MB).is_err());
    }

    #[test]
    fn explicit_mapping_overrides_smallest_fit() {
        // Coarse pool of Figure 1: CLS = [0, 0] maps 1 MB tensors to 2 MB.
        let enc = SizeClassEncoding::new(vec![MB, 2 * MB], vec![0, 0], vec![5]).expect("enc");
        let mut pool = SizeClassPool::from_encoding(&enc, 10 * MB).expect("pool");
        let a = pool.allocate(AllocId(0), MB).expect("1 MB tensor");
        let b = pool.allocate(AllocId(1), MB).expect("1 MB tensor");
        assert_eq!(b.addr - a.addr, 2 * MB);
    }

    #[test]
    fn bad_encodings_are_rejected_with_reasons() {
        let cases = [
            (vec![MB, 2 * MB], vec![0, 2], vec![1, 1], "predecessor"),
            (
                vec![2 * MB, MB],
                vec![0, 1],
                vec![1, 1],
                "strictly increasing",
            ),
            (vec![MB], vec![0], vec![1, 1], "CNT"),
            (vec![MB], vec![2], vec![1], "start at 0 or 1"),
            (vec![], vec![], vec![], "no tensor sizes"),
        ];
        for (ts, cls, cnt, needle) in cases {
            let err = SizeClassEncoding::new(ts, cls, cnt).expect_err("invalid");
            assert!(err.to_string().contains(needle), "{err}");
        }
        let err = SizeClassPool::from_config(&SizeClassConfig::default(), MB).expect_err("empty");
        assert!(err.to_string().contains("no classes"), "{err}");
    }

    #[test]
    fn classes_round_to_alignment_and_merge() {
        let pool = SizeClassPool::new(
            &[
                SizeClassSpec {
                    size_bytes: 1000,
                    count: 1,
                },
                SizeClassSpec {
                    size_bytes: 1024,
                    count: 2,
                },
            ],
            MB,
        )
        .expect("pool");
        assert_eq!(
            pool.classes(),
            vec![SizeClassSpec {
                size_bytes: 1024,
                count: 3
            }]
        );
    }
}
