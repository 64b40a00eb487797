//! Criterion benchmark: replay speed (events per second) of each allocator on
//! a 100k-event synthetic trace with many distinct sizes.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use outcore_alloc::{
    AllocatorConfig, AllocatorKind, SizeClassConfig, SizeClassEncoding, TraceEvent, build, replay,
    synthetic_trace,
};

const N_EVENTS: usize = 100_000;

fn configs(trace: &outcore_alloc::Trace) -> Vec<AllocatorConfig> {
    // One size class per distinct size, with more objects than can ever be
    // live, so the pool never fails and the benchmark measures bookkeeping.
    let sizes = trace.events.iter().filter_map(|e| match *e {
        TraceEvent::Alloc { size_bytes, .. } => Some(size_bytes),
        TraceEvent::Free { .. } => None,
    });
    vec![
        AllocatorConfig::SizeClass(SizeClassConfig {
            classes: Vec::new(),
            encoding: Some(SizeClassEncoding::one_class_per_size(sizes, 1024)),
        }),
        AllocatorConfig::default_for(AllocatorKind::BestFit),
        AllocatorConfig::default_for(AllocatorKind::VirtualChunks),
    ]
}

fn bench_replay(c: &mut Criterion) {
    let trace = synthetic_trace(N_EVENTS, 42);
    let capacity_bytes = trace.capacity_or_unlimited();
    let mut group = c.benchmark_group("replay_100k");
    group.throughput(Throughput::Elements(N_EVENTS as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for config in configs(&trace) {
        group.bench_with_input(
            BenchmarkId::from_parameter(config.kind()),
            &config,
            |b, config| {
                b.iter(|| {
                    let mut allocator = match build(config, capacity_bytes) {
                        Ok(allocator) => allocator,
                        Err(err) => panic!("benchmark config is valid: {err}"),
                    };
                    let report = replay(&trace, allocator.as_mut());
                    assert_eq!(report.failures, 0);
                    report.peak_reserved_bytes
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
