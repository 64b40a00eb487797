//! One conformance suite, written once against `&mut dyn Allocator`, run over
//! all three allocators: scripted checks plus proptest random traces.

use std::collections::{HashMap, HashSet};

use outcore_alloc::{
    ALIGNMENT_BYTES, AllocError, AllocErrorKind, AllocId, Allocator, AllocatorConfig,
    AllocatorKind, BestFitCaching, SizeClassPool, SizeClassSpec, VirtualChunks, build,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const CAPACITY_BYTES: u64 = 128 * MIB;

/// Size classes of 512 B .. 32 MiB in powers of two, few objects each
/// (~99 MiB in all), so random traces hit exhausted classes often.
fn power_of_two_classes() -> Vec<SizeClassSpec> {
    (9..=25)
        .map(|shift| SizeClassSpec {
            size_bytes: 1 << shift,
            count: match shift {
                ..20 => 4,
                25 => 2,
                _ => 1,
            },
        })
        .collect()
}

fn all_allocators(capacity_bytes: u64) -> Vec<Box<dyn Allocator>> {
    let size_class = SizeClassPool::new(&power_of_two_classes(), capacity_bytes)
        .expect("size-class pool fits the capacity");
    vec![
        Box::new(size_class),
        Box::new(BestFitCaching::with_defaults(capacity_bytes)),
        Box::new(VirtualChunks::with_defaults(capacity_bytes)),
    ]
}

/// Everything that must hold after any sequence of operations.
fn check_invariants(alloc: &dyn Allocator, expected: &HashMap<AllocId, u64>) {
    let name = alloc.name();
    let live = alloc.live_allocations();
    // Virtual addresses (virtual-chunks, best-fit-paged) may lie beyond the
    // capacity; their physical ranges are checked by `check_physical`.
    let virtual_addrs = name == AllocatorKind::VirtualChunks
        || live
            .first()
            .is_some_and(|a| alloc.physical_segments(a.id).is_some());
    assert_eq!(live.len(), expected.len(), "{name}: live count");
    for a in &live {
        assert_eq!(
            expected.get(&a.id),
            Some(&a.size_bytes),
            "{name}: live {a:?}"
        );
        assert_eq!(a.addr % ALIGNMENT_BYTES, 0, "{name}: alignment of {a:?}");
        if !virtual_addrs {
            assert!(
                a.end_addr() <= alloc.capacity_bytes(),
                "{name}: {a:?} beyond capacity"
            );
        }
    }
    for pair in live.windows(2) {
        // Sorted by address; distinct addresses even for 0-byte requests.
        assert!(pair[0].addr < pair[1].addr, "{name}: same address {pair:?}");
        assert!(
            pair[0].end_addr() <= pair[1].addr,
            "{name}: overlap {pair:?}"
        );
    }
    let stats = alloc.stats();
    let live_bytes: u64 = expected.values().sum();
    assert_eq!(stats.live_bytes, live_bytes, "{name}: live bytes");
    assert_eq!(stats.n_live_allocations, expected.len() as u64, "{name}");
    assert_eq!(
        stats.n_allocs - stats.n_frees,
        expected.len() as u64,
        "{name}"
    );
    assert!(
        stats.reserved_bytes >= stats.live_bytes,
        "{name}: reserved < live"
    );
    assert!(
        stats.reserved_bytes <= alloc.capacity_bytes(),
        "{name}: reserved > capacity"
    );
    assert!(stats.peak_live_bytes >= stats.live_bytes, "{name}");
    assert!(stats.peak_reserved_bytes >= stats.reserved_bytes, "{name}");
    assert!(
        stats.peak_reserved_bytes >= stats.live_bytes_at_peak_reserved,
        "{name}"
    );
    if let Some(fragmentation) = stats.fragmentation() {
        assert!(
            fragmentation >= 1.0,
            "{name}: fragmentation {fragmentation}"
        );
    }
    assert!(stats.map_ops >= stats.unmap_ops, "{name}");
    if name != AllocatorKind::VirtualChunks {
        assert_eq!((stats.map_ops, stats.unmap_ops), (0, 0), "{name}");
    }
}

/// An allocator with virtual addresses: every live allocation's physical
/// ranges cover its size, lie inside the capacity, and overlap no other's.
fn check_physical(alloc: &dyn Allocator) {
    let mut ranges: Vec<(u64, u64, AllocId)> = Vec::new();
    for a in alloc.live_allocations() {
        let segments = alloc
            .physical_segments(a.id)
            .expect("a live allocation has physical ranges");
        let covered: u64 = segments.iter().map(|&(_, len)| len).sum();
        assert_eq!(covered, a.size_bytes.max(1), "{a:?}: {segments:?}");
        for (off, len) in segments {
            assert!(off + len <= alloc.capacity_bytes(), "{a:?} beyond capacity");
            ranges.push((off, off + len, a.id));
        }
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "physical overlap {pair:?}");
    }
}

/// Virtual-chunks only: no physical chunk is mapped twice, and mapped chunks
/// fit the physical capacity.
fn check_chunk_mappings(alloc: &VirtualChunks) {
    let mappings = alloc.chunk_mappings();
    let mut seen = HashSet::new();
    for m in &mappings {
        assert!(
            seen.insert(m.physical_chunk),
            "chunk {} mapped twice",
            m.physical_chunk
        );
        assert_eq!(m.virtual_addr % alloc.chunk_bytes(), 0);
    }
    for pair in mappings.windows(2) {
        assert!(
            pair[0].virtual_addr < pair[1].virtual_addr,
            "virtual page mapped twice"
        );
    }
    assert!(mappings.len() as u64 * alloc.chunk_bytes() <= alloc.capacity_bytes());
    let stats = alloc.stats();
    assert_eq!(stats.map_ops - stats.unmap_ops, mappings.len() as u64);
}

fn check_oom(alloc: &dyn Allocator, err: &AllocError, id: AllocId, requested: u64) {
    let name = alloc.name();
    match *err.kind() {
        AllocErrorKind::OutOfMemory {
            id: err_id,
            requested_bytes,
            free_bytes,
            largest_free_block_bytes,
            reserved_bytes,
            capacity_bytes,
            ..
        } => {
            assert_eq!((err_id, requested_bytes), (id, requested), "{name}");
            assert!(largest_free_block_bytes <= free_bytes, "{name}: {err}");
            assert!(
                free_bytes + alloc.stats().live_bytes <= capacity_bytes,
                "{name}: {err}"
            );
            assert_eq!(reserved_bytes, alloc.stats().reserved_bytes, "{name}");
            assert_eq!(capacity_bytes, alloc.capacity_bytes(), "{name}");
            let last = alloc.stats().failures.last().expect("failure recorded");
            assert_eq!(
                (
                    last.id,
                    last.requested_bytes,
                    last.free_bytes,
                    last.largest_free_block_bytes
                ),
                (id, requested, free_bytes, largest_free_block_bytes),
                "{name}"
            );
            assert!(err.to_string().starts_with("out of memory"), "{err}");
        }
        ref other => panic!("{name}: expected out of memory, got {other:?}"),
    }
}

/// The scripted conformance suite, written once for any allocator.
fn conformance(alloc: &mut dyn Allocator) {
    let name = alloc.name();
    let mut expected: HashMap<AllocId, u64> = HashMap::new();
    check_invariants(alloc, &expected);

    // Assorted sizes, including 0 and unaligned ones.
    let sizes = [
        0,
        1,
        511,
        512,
        513,
        4096,
        100_000,
        MIB,
        MIB + 1,
        3 * MIB,
        12 * MIB,
    ];
    for (i, &size) in sizes.iter().enumerate() {
        let a = alloc
            .allocate(AllocId(i as u64), size)
            .expect("small set fits");
        assert_eq!((a.id, a.size_bytes), (AllocId(i as u64), size));
        expected.insert(a.id, size);
        check_invariants(alloc, &expected);
    }

    // Bad input errors, never panics, and changes nothing.
    let before = alloc.live_allocations();
    let err = alloc.free(AllocId(999)).expect_err("unknown id");
    assert_eq!(
        *err.kind(),
        AllocErrorKind::UnknownId { id: AllocId(999) },
        "{name}"
    );
    let err = alloc.allocate(AllocId(3), 64).expect_err("double allocate");
    assert_eq!(
        *err.kind(),
        AllocErrorKind::DoubleAllocate { id: AllocId(3) },
        "{name}"
    );
    let err = alloc
        .allocate(AllocId(500), u64::MAX)
        .expect_err("absurd size");
    assert!(
        matches!(
            err.kind(),
            AllocErrorKind::OutOfMemory { .. } | AllocErrorKind::SizeTooLargeForPool { .. }
        ),
        "{name}: {err}"
    );
    assert_eq!(
        alloc.live_allocations(),
        before,
        "{name}: failed ops changed state"
    );
    check_invariants(alloc, &expected);

    // Free and double free.
    alloc.free(AllocId(3)).expect("free");
    expected.remove(&AllocId(3));
    let err = alloc.free(AllocId(3)).expect_err("double free");
    assert!(
        matches!(err.kind(), AllocErrorKind::UnknownId { .. }),
        "{name}"
    );
    check_invariants(alloc, &expected);

    // Fill with 1 MiB requests until out of memory; the error must describe
    // the state, and the allocator must keep working afterwards.
    let mut next = 100u64;
    let oom = loop {
        match alloc.allocate(AllocId(next), MIB) {
            Ok(a) => {
                expected.insert(a.id, MIB);
                next += 1;
                assert!(next < 10_000, "{name}: never ran out of memory");
            }
            Err(err) => break err,
        }
    };
    check_oom(alloc, &oom, AllocId(next), MIB);
    check_invariants(alloc, &expected);
    let peak_live = alloc.stats().peak_live_bytes;
    assert!(
        peak_live >= expected.values().sum::<u64>(),
        "{name}: peak below live"
    );

    // Free everything; the same fill then succeeds again.
    let ids: Vec<AllocId> = expected.keys().copied().collect();
    for id in ids {
        alloc.free(id).expect("free live id");
        expected.remove(&id);
    }
    check_invariants(alloc, &expected);
    assert_eq!(alloc.stats().live_bytes, 0);
    assert_eq!(alloc.stats().peak_live_bytes, peak_live);
    for id in 100..next {
        let a = alloc.allocate(AllocId(id), MIB).expect("refill after free");
        expected.insert(a.id, MIB);
    }
    check_invariants(alloc, &expected);
    assert!(alloc.stats().n_failures >= 3, "{name}: failures counted");
}

#[test]
fn conformance_all_allocators() {
    for mut alloc in all_allocators(CAPACITY_BYTES) {
        conformance(alloc.as_mut());
    }
}

#[test]
fn conformance_through_build() {
    let configs = [
        AllocatorConfig::SizeClass(outcore_alloc::SizeClassConfig {
            classes: power_of_two_classes(),
            encoding: None,
        }),
        AllocatorConfig::default_for(AllocatorKind::BestFit),
        AllocatorConfig::default_for(AllocatorKind::VirtualChunks),
    ];
    for config in &configs {
        let mut alloc = build(config, CAPACITY_BYTES).expect("build");
        assert_eq!(alloc.name(), config.kind());
        conformance(alloc.as_mut());
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    /// Frees the live allocation at this index (mod live count).
    Free(usize),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        3 => 0u64..=4096,
        3 => 4096u64..=2 * MIB,
        2 => 2 * MIB..=24 * MIB,
        1 => 24 * MIB..=70 * MIB,
    ];
    prop_oneof![
        3 => size.prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

/// Runs `ops` against `alloc`, checking every invariant after every step.
fn run_ops(alloc: &mut dyn Allocator, ops: &[Op], mut extra: impl FnMut(&dyn Allocator)) {
    let mut expected: HashMap<AllocId, u64> = HashMap::new();
    let mut order: Vec<AllocId> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc(size) => {
                let id = AllocId(i as u64);
                match alloc.allocate(id, size) {
                    Ok(a) => {
                        assert_eq!(a.size_bytes, size);
                        expected.insert(id, size);
                        order.push(id);
                    }
                    Err(err) => {
                        if err.is_out_of_memory() {
                            check_oom(alloc, &err, id, size);
                        } else {
                            let is_pool_limit =
                                matches!(err.kind(), AllocErrorKind::SizeTooLargeForPool { .. });
                            assert!(is_pool_limit, "{}: unexpected {err}", alloc.name());
                        }
                    }
                }
            }
            Op::Free(pick) => {
                if !order.is_empty() {
                    let id = order.swap_remove(pick % order.len());
                    alloc.free(id).expect("free live id");
                    expected.remove(&id);
                }
            }
        }
        check_invariants(alloc, &expected);
        extra(alloc);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_traces_size_class(ops in proptest::collection::vec(op_strategy(), 1..160)) {
        let mut alloc = SizeClassPool::new(&power_of_two_classes(), CAPACITY_BYTES)
            .expect("pool");
        run_ops(&mut alloc, &ops, |_| {});
    }

    #[test]
    fn random_traces_best_fit(ops in proptest::collection::vec(op_strategy(), 1..160)) {
        let mut alloc = BestFitCaching::with_defaults(CAPACITY_BYTES);
        run_ops(&mut alloc, &ops, |_| {});
    }

    #[test]
    fn random_traces_best_fit_paged(ops in proptest::collection::vec(op_strategy(), 1..160)) {
        let config = outcore_alloc::BestFitConfig { paged_segments: true, ..Default::default() };
        let mut alloc = BestFitCaching::new(config, CAPACITY_BYTES).expect("config");
        run_ops(&mut alloc, &ops, |a| check_physical(a));
    }

    #[test]
    fn random_traces_virtual_chunks(ops in proptest::collection::vec(op_strategy(), 1..160)) {
        let mut alloc = VirtualChunks::with_defaults(CAPACITY_BYTES);
        let mut ops_seen = 0;
        run_ops(&mut alloc, &ops, |_| ops_seen += 1);
        check_chunk_mappings(&alloc);
        prop_assert_eq!(ops_seen, ops.len());
    }

    /// Virtual-chunks never fails while the chunks it needs are free
    /// (no external fragmentation), with the small pool disabled so that
    /// the chunk arithmetic is exact.
    #[test]
    fn virtual_chunks_fails_only_without_free_chunks(
        ops in proptest::collection::vec(op_strategy(), 1..160)
    ) {
        let config = outcore_alloc::VirtualChunksConfig {
            small_alloc_max_bytes: 0,
            ..Default::default()
        };
        let mut alloc = VirtualChunks::new(config, CAPACITY_BYTES).expect("config");
        let chunk = alloc.chunk_bytes();
        let mut live: Vec<(AllocId, u64)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc(size) => {
                    let need = size.div_ceil(chunk).max(1);
                    let used: u64 = live.iter().map(|&(_, s)| s.div_ceil(chunk).max(1)).sum();
                    let free_chunks = CAPACITY_BYTES / chunk - used;
                    let result = alloc.allocate(AllocId(i as u64), size);
                    prop_assert_eq!(result.is_ok(), need <= free_chunks);
                    if result.is_ok() {
                        live.push((AllocId(i as u64), size));
                    }
                }
                Op::Free(pick) => {
                    if !live.is_empty() {
                        let (id, _) = live.swap_remove(pick % live.len());
                        alloc.free(id).expect("free");
                    }
                }
            }
            check_chunk_mappings(&alloc);
        }
    }
}
