//! Benchmark: simulating one iteration of a graph of about 10,000 ops with about
//! 10,000 copies (every activation swapped between distant uses).

use criterion::{Criterion, criterion_group, criterion_main};
use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::{TensorKind, zoo};
use outcore_plan::{Gap, PlannerInfo, Restore, Schedule, lower_schedule, use_positions};
use outcore_sim::{SimOptions, simulate};
use std::collections::BTreeMap;

fn bench(c: &mut Criterion) {
    // LSTM with 8 layers over 180 steps: about 10,000 ops.
    let knobs: BTreeMap<String, u64> = [
        ("layers".to_string(), 8),
        ("seq".to_string(), 180),
        ("hidden".to_string(), 256),
    ]
    .into();
    let g = zoo::build("lstm", Some(16), &knobs, None).expect("zoo lstm builds");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    for t in g
        .tensors
        .iter()
        .filter(|t| t.allocates() && t.kind == TensorKind::Activation)
    {
        for w in uses[t.id.index()].windows(2) {
            if w[1] - w[0] > 8 {
                s.gaps.push(Gap {
                    tensor: t.id,
                    after: Some(w[0]),
                    before: Some(w[1]),
                    how: Restore::Swap,
                    prefetch_after: Some(w[1] - 4),
                    reclaim_before: Some(w[0] + 2),
                    copy_out_after: None,
                });
            }
        }
    }
    let info = PlannerInfo {
        name: "bench".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let plan = lower_schedule(&g, &s, info, u64::MAX).expect("lowers");
    let copies = plan.streams[1].len()
        + plan.streams[2]
            .iter()
            .filter(|s| matches!(s.instr, outcore_plan::Instr::SwapOut(_)))
            .count();
    eprintln!(
        "graph: {} ops; plan: {} steps, {} copies",
        g.ops.len(),
        plan.n_steps(),
        copies
    );
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin"));
    let options = SimOptions {
        iterations: 1,
        ..SimOptions::default()
    };
    c.bench_function("simulate_one_iteration_10k_ops_10k_copies", |b| {
        b.iter(|| simulate(&g, &plan, &cost, &options).expect("simulates"))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
