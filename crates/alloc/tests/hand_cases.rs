//! Hand-built cases from the papers: SwapAdvisor Figure 1's coarse and fine
//! pools, and a best-fit trace that fragments where virtual-chunks does not.

use outcore_alloc::{
    AllocErrorKind, AllocId, Allocator, AllocatorConfig, AllocatorKind, BestFitCaching,
    SizeClassEncoding, SizeClassPool, SizeClassSpec, Trace, VirtualChunks, replay,
    replay_with_config,
};

const MB: u64 = 1 << 20;

// SwapAdvisor Figure 1 (Sec. 3), reconstructed from the text:
// a branching forward graph whose tensors are A0..A5 (activations) and
// W1..W4 (parameters), all 1 MB except A2 and A5 which are 2 MB, 12 MB in
// total, on a GPU with 10 MB. Two pools of 10 MB each:
//  * coarse (Fig. 1(b)(c)): five 2 MB objects, every tensor maps to 2 MB;
//    encoding TS = [1MB, 2MB], CLS = [0, 0], CNT = [5];
//  * fine (Fig. 1(d)(e)): eight 1 MB objects and one 2 MB object;
//    CLS = [0, 1], CNT = [8, 1].
// At t4 of the right-first schedule the GPU holds A3, W4, A4 (inputs/outputs
// of Conv4), A0 (input of the next operator Conv1) and A2 (being swapped
// out). In the coarse pool that is all five objects, so W1 cannot be
// swapped in (Fig. 1(c) idles at t5); the fine pool still has four 1 MB
// objects free, so W1 is swapped in at t4 (Fig. 1(d)).
// In Fig. 1(e) (left-first, fine pool), Concat must wait for A2 to leave
// the single 2 MB object before its 2 MB output A5 can be allocated, even
// though 1 MB objects are free.

const A0: AllocId = AllocId(0);
const A2: AllocId = AllocId(2);
const A3: AllocId = AllocId(3);
const A4: AllocId = AllocId(4);
const A5: AllocId = AllocId(5);
const W1: AllocId = AllocId(11);
const W4: AllocId = AllocId(14);

fn resident_at_t4(pool: &mut dyn Allocator) {
    for (id, size) in [(A3, MB), (W4, MB), (A4, MB), (A0, MB), (A2, 2 * MB)] {
        pool.allocate(id, size)
            .expect("resident tensors fit both pools");
    }
}

fn coarse_pool() -> SizeClassPool {
    let enc = SizeClassEncoding::new(vec![MB, 2 * MB], vec![0, 0], vec![5]).expect("coarse");
    SizeClassPool::from_encoding(&enc, 10 * MB).expect("coarse pool")
}

fn fine_pool() -> SizeClassPool {
    let enc = SizeClassEncoding::new(vec![MB, 2 * MB], vec![0, 1], vec![8, 1]).expect("fine");
    SizeClassPool::from_encoding(&enc, 10 * MB).expect("fine pool")
}

#[test]
fn figure1_coarse_pool_cannot_swap_in_w1_at_t4() {
    let mut coarse = coarse_pool();
    assert_eq!(coarse.stats().reserved_bytes, 10 * MB);
    resident_at_t4(&mut coarse);
    // Only 6 MB of data are resident, but all five 2 MB objects are taken.
    assert_eq!(coarse.stats().live_bytes, 6 * MB);
    let err = coarse.allocate(W1, MB).expect_err("coarse pool is full");
    match *err.kind() {
        AllocErrorKind::OutOfMemory {
            free_bytes,
            largest_free_block_bytes,
            ..
        } => assert_eq!((free_bytes, largest_free_block_bytes), (0, 0)),
        ref other => panic!("unexpected {other:?}"),
    }
    // Once A2's swap-out completes (t5), W1 gets A2's object.
    coarse.free(A2).expect("A2 swapped out");
    coarse.allocate(W1, MB).expect("W1 after A2 leaves");
}

#[test]
fn figure1_fine_pool_swaps_in_w1_at_t4() {
    let mut fine = fine_pool();
    assert_eq!(fine.stats().reserved_bytes, 10 * MB);
    resident_at_t4(&mut fine);
    fine.allocate(W1, MB).expect("a 1 MB object is still free");
    assert_eq!(
        fine.free_objects(),
        vec![
            SizeClassSpec {
                size_bytes: MB,
                count: 3
            },
            SizeClassSpec {
                size_bytes: 2 * MB,
                count: 0
            }
        ]
    );
}

#[test]
fn figure1_fine_pool_left_first_a5_waits_for_a2() {
    let mut fine = fine_pool();
    fine.allocate(A2, 2 * MB).expect("A2");
    fine.allocate(A0, MB).expect("A0");
    // 7 MB of objects are free, but none in the 2 MB class: no fallback.
    let err = fine.allocate(A5, 2 * MB).expect_err("2 MB class exhausted");
    match *err.kind() {
        AllocErrorKind::OutOfMemory {
            free_bytes,
            largest_free_block_bytes,
            ..
        } => assert_eq!((free_bytes, largest_free_block_bytes), (7 * MB, MB)),
        ref other => panic!("unexpected {other:?}"),
    }
    fine.free(A2).expect("A2 swapped out");
    fine.allocate(A5, 2 * MB).expect("A5 after A2 leaves");
}

#[test]
fn figure1_explicit_class_lists_match_the_encodings() {
    let coarse = SizeClassPool::new(
        &[SizeClassSpec {
            size_bytes: 2 * MB,
            count: 5,
        }],
        10 * MB,
    )
    .expect("coarse");
    assert_eq!(coarse.classes(), coarse_pool().classes());
    let fine = SizeClassPool::new(
        &[
            SizeClassSpec {
                size_bytes: MB,
                count: 8,
            },
            SizeClassSpec {
                size_bytes: 2 * MB,
                count: 1,
            },
        ],
        10 * MB,
    )
    .expect("fine");
    assert_eq!(fine.classes(), fine_pool().classes());
}

/// Six 6 MiB tensors fill two 20 MiB best-fit segments (each with a 2 MiB
/// tail split off), then every other one is freed: 28 MiB are free in total
/// but split into holes of 6 and 8 MiB, no segment is entirely free, and the
/// device has no room for a new 12 MiB segment. A 12 MiB request fails under
/// best-fit and succeeds under virtual-chunks, which maps it onto any six
/// free 2 MiB chunks.
fn fragmenting_trace() -> Trace {
    let mut trace = Trace::new(Some(40 * MB));
    for i in 0..6 {
        trace.push_alloc(AllocId(i), 6 * MB);
    }
    for i in [0, 2, 3, 5] {
        trace.push_free(AllocId(i));
    }
    trace.push_alloc(AllocId(10), 12 * MB);
    trace.push_free(AllocId(10));
    trace
}

#[test]
fn best_fit_fails_with_enough_free_bytes() {
    let trace = fragmenting_trace();
    let mut best_fit = BestFitCaching::with_defaults(40 * MB);
    let report = replay(&trace, &mut best_fit);
    assert_eq!(report.allocator, AllocatorKind::BestFit);
    assert_eq!(report.failures, 1);
    assert_eq!(report.skipped_frees, 1);
    let failure = report.first_failure.expect("failure details");
    assert_eq!(failure.event_index, 10);
    assert_eq!(failure.requested_bytes, 12 * MB);
    assert_eq!(failure.free_bytes, Some(28 * MB));
    assert_eq!(failure.largest_free_block_bytes, Some(8 * MB));
    assert!(failure.free_bytes.unwrap_or(0) > failure.requested_bytes);
    assert_eq!(report.peak_reserved_bytes, 40 * MB);
}

#[test]
fn virtual_chunks_serves_the_same_trace() {
    let trace = fragmenting_trace();
    let mut virtual_chunks = VirtualChunks::with_defaults(40 * MB);
    let report = replay(&trace, &mut virtual_chunks);
    assert_eq!(report.failures, 0, "{report:?}");
    assert_eq!(report.n_allocs, 7);
    assert_eq!(report.n_frees, 5);
    // 6 x 3 chunks, then 6 chunks for the 12 MiB tensor.
    assert_eq!(report.map_ops, 24);
    assert_eq!(report.unmap_ops, 4 * 3 + 6);
    assert_eq!(report.peak_reserved_bytes, 36 * MB);
    assert_eq!(report.fragmentation, Some(1.0));

    let via_config = replay_with_config(
        &trace,
        &AllocatorConfig::default_for(AllocatorKind::VirtualChunks),
    )
    .expect("build");
    assert_eq!(via_config, report);
}
