//! Simulator tests on a unit cost model (1 FLOP/s, 1 byte/s each way), with the
//! expected times derived in comments.

use outcore_cost::{CostModel, DeviceProfile, UnitCostModel};
use outcore_graph::{
    DType, Graph, GraphMeta, Op, OpId, OpKind, Phase, Tensor, TensorId, TensorKind,
};
use outcore_plan::{Instr, Plan, PlannerInfo, Residency, StepRef, Stream, verify};
use outcore_sim::{SimOptions, simulate};

/// A unit model with a different both-ways rate and copy latency.
#[derive(Debug)]
struct Custom(DeviceProfile);

impl CostModel for Custom {
    fn device(&self) -> &DeviceProfile {
        &self.0
    }
    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        graph.op(op).flops as f64
    }
    fn name(&self) -> String {
        "custom".into()
    }
}

fn tensor(id: u32, n: u64, kind: TensorKind, producer: Option<u32>) -> Tensor {
    Tensor {
        id: TensorId(id),
        name: format!("t{id}"),
        shape: vec![n],
        dtype: DType::Uint8,
        size_bytes: n,
        kind,
        producer: producer.map(OpId),
        view_of: None,
        inplace_update_of: None,
        is_output: false,
    }
}

fn op(id: u32, inputs: &[u32], outputs: &[u32], flops: u64) -> Op {
    Op {
        id: OpId(id),
        name: format!("op{id}"),
        kind: OpKind::Named { name: "k".into() },
        phase: Phase::Forward,
        inputs: inputs.iter().map(|&t| TensorId(t)).collect(),
        outputs: outputs.iter().map(|&t| TensorId(t)).collect(),
        flops,
        bytes_read: 0,
        bytes_written: 0,
        workspace_bytes: 0,
        recomputable: true,
        module: None,
    }
}

/// t0 (input, 4 B) -A(10)-> t1 (`t1_bytes`) -B(20)-> t2 (4 B); C(30) reads t2 and t1 -> t3 (4 B).
fn chain(t1_bytes: u64) -> Graph {
    Graph {
        meta: GraphMeta {
            model: "chain".into(),
            batch: 1,
            seq: None,
            optimizer: "none".into(),
            source: "test".into(),
        },
        tensors: vec![
            tensor(0, 4, TensorKind::Input, None),
            tensor(1, t1_bytes, TensorKind::Activation, Some(0)),
            tensor(2, 4, TensorKind::Activation, Some(1)),
            tensor(3, 4, TensorKind::Activation, Some(2)),
        ],
        ops: vec![
            op(0, &[0], &[1], 10),
            op(1, &[1], &[2], 20),
            op(2, &[2, 1], &[3], 30),
        ],
    }
}

fn info() -> PlannerInfo {
    PlannerInfo {
        name: "hand".into(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

fn c(i: u32) -> StepRef {
    StepRef {
        stream: Stream::Compute,
        index: i,
    }
}

/// A, B, C in order with frees after last uses.
fn in_order(g: &Graph) -> Plan {
    outcore_plan::lower_in_order(g, info(), u64::MAX)
}

/// Swap t1 out after A and back before C; the swap-in is triggered after A.
fn swap_t1(g: &Graph) -> Plan {
    let mut p = Plan::new(g, info(), u64::MAX);
    p.push(Stream::Compute, Instr::Compute(OpId(0)), vec![]); // c0
    p.push(Stream::Compute, Instr::Free(TensorId(0)), vec![]); // c1
    let out = p.push(Stream::D2h, Instr::SwapOut(TensorId(1)), vec![c(0)]);
    let _ = out;
    let freed = p.push(Stream::D2h, Instr::Free(TensorId(1)), vec![]);
    // B reads t1: it must run before the free. Make the d2h free wait for B.
    p.streams[Stream::D2h.index()][1].waits.push(c(2));
    p.push(Stream::Compute, Instr::Compute(OpId(1)), vec![]); // c2
    let sin = p.push(Stream::H2d, Instr::SwapIn(TensorId(1)), vec![freed]);
    p.push(Stream::Compute, Instr::Compute(OpId(2)), vec![sin]); // c3
    for t in [1, 2, 3] {
        p.push(Stream::Compute, Instr::Free(TensorId(t)), vec![]);
    }
    p
}

fn run(g: &Graph, p: &Plan, cost: &dyn CostModel) -> outcore_sim::SimReport {
    let v = verify(p, g);
    assert!(v.is_empty(), "hand plan must verify: {}", v[0]);
    simulate(g, p, cost, &SimOptions::default())
        .expect("simulates")
        .report
}

#[test]
fn in_order_time_is_the_sum_of_op_times() {
    // 10 + 20 + 30 = 60 s; nothing else runs.
    let g = chain(8);
    let r = run(&g, &in_order(&g), &UnitCostModel);
    assert_eq!(r.iter_time_s, 60.0);
    assert_eq!(r.ideal_time_s, 60.0);
    assert_eq!(r.throughput_vs_ideal, 1.0);
    assert_eq!(r.stall_time_s, 0.0);
    // Peak: A holds t0 + t1 = 12 B, B t1 + t2 = 12 B, C t1 + t2 + t3 = 16 B.
    assert_eq!(r.peak_live_bytes, 16);
}

#[test]
fn swap_hidden_behind_compute() {
    // t1 = 8 B. A: 0-10. B: 10-30. Swap-out 10-18 (8 B at 1 B/s) overlaps B; the
    // free waits for B (30); swap-in 30-38; C waits for it: 38-68. Iteration 68 s,
    // 8 s of stall, copies 8 B each way.
    let g = chain(8);
    let r = run(&g, &swap_t1(&g), &UnitCostModel);
    assert_eq!(r.iter_time_s, 68.0);
    assert_eq!(r.stall_time_s, 8.0);
    assert_eq!(r.swap_in_bytes, 8);
    assert_eq!(r.swap_out_bytes, 8);
    assert_eq!(r.busy.h2d_s, 8.0);
    assert_eq!(r.busy.d2h_s, 8.0);
    assert!((r.throughput_vs_ideal - 60.0 / 68.0).abs() < 1e-12);
}

#[test]
fn slow_swap_out_stalls_compute() {
    // t1 = 40 B. A: 0-10; swap-out 10-50; B: 10-30; free at 50 (after the copy and
    // B); swap-in 50-90; C: 90-120. Iteration 120 s, compute busy 60 s, stall 60 s.
    let g = chain(40);
    let r = run(&g, &swap_t1(&g), &UnitCostModel);
    assert_eq!(r.iter_time_s, 120.0);
    assert_eq!(r.stall_time_s, 60.0);
    assert_eq!(r.busy.compute_s, 60.0);
}

/// One parameter kept on the host (10 B) swapped in while the batch input (10 B) is
/// swapped out, both at time 0; then op A (flops 5) reads the parameter.
fn duplex_graph() -> (Graph, Plan) {
    let mut g = chain(8);
    g.tensors[0].size_bytes = 10;
    g.tensors[0].shape = vec![10];
    let mut p_tensor = tensor(4, 10, TensorKind::Parameter, None);
    p_tensor.name = "w".into();
    g.tensors.push(p_tensor);
    g.ops[0].inputs.push(TensorId(4));
    g.ops[0].flops = 5;
    let mut p = Plan::new(&g, info(), u64::MAX);
    p.initial_residency = vec![(TensorId(4), Residency::Host)];
    let sin = p.push(Stream::H2d, Instr::SwapIn(TensorId(4)), vec![]);
    let sout = p.push(Stream::D2h, Instr::SwapOut(TensorId(0)), vec![]);
    p.push(Stream::Compute, Instr::Compute(OpId(0)), vec![sin, sout]);
    p.push(Stream::Compute, Instr::Free(TensorId(0)), vec![]);
    p.push(Stream::Compute, Instr::Free(TensorId(4)), vec![]);
    p.push(Stream::Compute, Instr::Compute(OpId(1)), vec![]);
    p.push(Stream::Compute, Instr::Compute(OpId(2)), vec![]);
    for t in [1, 2, 3] {
        p.push(Stream::Compute, Instr::Free(TensorId(t)), vec![]);
    }
    (g, p)
}

#[test]
fn duplex_copies_share_the_link() {
    let (g, p) = duplex_graph();
    // Unit model: 2 B/s both ways, so 1 B/s each: both 10 B copies end at 10 s;
    // A 10-15, B 15-35, C 35-65: 65 s.
    let r = run(&g, &p, &UnitCostModel);
    assert_eq!(r.iter_time_s, 65.0);
    // Both ways limited to 1 B/s in total: 0.5 B/s each, both copies end at 20 s;
    // then 5 + 20 + 30: 75 s.
    let mut profile = UnitCostModel::profile();
    profile.duplex_bytes_per_s = 1.0;
    let r = run(&g, &p, &Custom(profile));
    assert_eq!(r.iter_time_s, 75.0);
}

#[test]
fn duplex_rate_changes_when_one_copy_ends() {
    let (mut g, p) = duplex_graph();
    // Make the swap-in 20 B. Both at 0.5 B/s until the 10 B swap-out ends at 20 s
    // (10 B of the swap-in done); the remaining 10 B at the one-way 1 B/s: 30 s.
    // Then A 30-35, B 35-55, C 55-85.
    g.tensors[4].size_bytes = 20;
    g.tensors[4].shape = vec![20];
    let mut profile = UnitCostModel::profile();
    profile.duplex_bytes_per_s = 1.0;
    let r = run(&g, &p, &Custom(profile));
    assert_eq!(r.iter_time_s, 85.0);
    assert_eq!(r.busy.h2d_s, 30.0);
    assert_eq!(r.busy.d2h_s, 20.0);
}

#[test]
fn copy_latency_is_added_per_copy() {
    // Latency 2 s: the swap-out takes 2 + 8 = 10 s (10-20), hidden by B (10-30);
    // the swap-in 2 + 8 = 10 s (30-40); C 40-70.
    let g = chain(8);
    let mut profile = UnitCostModel::profile();
    profile.copy_latency_s = 2.0;
    let r = run(&g, &swap_t1(&g), &Custom(profile));
    assert_eq!(r.iter_time_s, 70.0);
}

#[test]
fn recomputation_costs_the_producer_again() {
    // Free t1 after B and recompute it (A again, 10 s) before C: 10 + 20 + 10 + 30.
    let g = chain(8);
    let mut p = Plan::new(&g, info(), u64::MAX);
    p.push(Stream::Compute, Instr::Compute(OpId(0)), vec![]);
    p.push(Stream::Compute, Instr::Compute(OpId(1)), vec![]);
    p.push(Stream::Compute, Instr::Free(TensorId(1)), vec![]);
    p.push(
        Stream::Compute,
        Instr::Recompute {
            op: OpId(0),
            outputs: vec![TensorId(1)],
        },
        vec![],
    );
    p.push(Stream::Compute, Instr::Free(TensorId(0)), vec![]);
    p.push(Stream::Compute, Instr::Compute(OpId(2)), vec![]);
    for t in [1, 2, 3] {
        p.push(Stream::Compute, Instr::Free(TensorId(t)), vec![]);
    }
    let r = run(&g, &p, &UnitCostModel);
    assert_eq!(r.iter_time_s, 70.0);
    assert_eq!(r.recompute_time_s, 10.0);
    assert!((r.throughput_vs_ideal - 60.0 / 70.0).abs() < 1e-12);
}

#[test]
fn trace_has_a_track_per_stream_and_a_memory_counter() {
    let g = chain(8);
    let options = SimOptions {
        record_trace: true,
        ..SimOptions::default()
    };
    let out = simulate(&g, &swap_t1(&g), &UnitCostModel, &options).expect("simulates");
    let trace = out.trace.expect("trace requested");
    let events = trace["traceEvents"].as_array().expect("events");
    for tid in 0..3 {
        assert!(
            events.iter().any(|e| e["ph"] == "X" && e["tid"] == tid),
            "no span on track {tid}"
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "C" && e["name"] == "device memory")
    );
}

#[test]
fn real_allocator_reports_fragmentation_oom() {
    // Best-fit over a tiny capacity: the in-order plan's 16 B peak fits in bytes,
    // but PyTorch-style 2 MiB segments do not fit in 2 KiB.
    let g = chain(8);
    let mut p = in_order(&g);
    p.budget_bytes = 2048;
    p.allocator =
        serde_json::from_value(serde_json::json!({"kind": "best-fit"})).expect("allocator JSON");
    let out = simulate(&g, &p, &UnitCostModel, &SimOptions::default()).expect("simulates");
    let oom = out.report.oom.expect("out of memory under best-fit");
    assert!(
        oom.message.contains("out of memory") || oom.requested_bytes > 0,
        "{oom:?}"
    );
    // Virtual chunks of 512 B hold it: at most three tensors (C's t1, t2, t3) are
    // live at once, one chunk each, within four chunks.
    p.allocator = serde_json::from_value(serde_json::json!({"kind": "virtual-chunks", "chunk_bytes": 512, "small_alloc_max_bytes": 0})).expect("allocator JSON");
    let out = simulate(&g, &p, &UnitCostModel, &SimOptions::default()).expect("simulates");
    assert!(out.report.oom.is_none(), "{:?}", out.report.oom);
}

/// Issue 15, row "unclear: plan with zero bandwidth": a copy at 0 bytes/s never
/// ends; the simulator says the time is infinite instead of calling it a deadlock.
#[test]
fn row_unclear_zero_bandwidth_is_an_infinite_time_not_a_deadlock() {
    let g = chain(4);
    let mut device = UnitCostModel.device().clone();
    device.h2d_bytes_per_s = 0.0;
    let p = swap_t1(&g);
    assert!(verify(&p, &g).is_empty(), "the plan itself is sound");
    let err = simulate(&g, &p, &Custom(device), &SimOptions::default())
        .expect_err("a copy at 0 bytes/s never ends");
    let text = err.to_string();
    assert!(text.contains("infinite"), "{text}");
    assert!(!text.contains("deadlock"), "{text}");
}

#[test]
fn step_work_prices_and_allocates_each_step() {
    // swap_t1 on chain(40): compute c0 is A (10 s) allocating t1 (40 B); c1
    // frees t0; d2h 0 copies t1 out (40 B); h2d 0 copies it in, allocating it.
    let g = chain(40);
    let p = swap_t1(&g);
    let prepared = outcore_sim::SimPrepared::new(&g, &UnitCostModel);
    let work = |stream, index| {
        let mut allocated = Vec::new();
        let at = StepRef { stream, index };
        let (work, scratch) =
            outcore_sim::step_work(&prepared, &p, at, |t, size| allocated.push((t, size)))
                .expect("valid step");
        (work, scratch, allocated)
    };
    use outcore_sim::StepWork;
    let kernel = StepWork::Kernel {
        time_s: 10.0,
        recompute: false,
    };
    assert_eq!(
        work(Stream::Compute, 0),
        (kernel, 0, vec![(TensorId(1), 40)])
    );
    assert_eq!(
        work(Stream::Compute, 1),
        (StepWork::Instant(TensorId(0)), 0, vec![])
    );
    let out = StepWork::Copy {
        bytes: 40,
        swap_in: false,
    };
    assert_eq!(work(Stream::D2h, 0), (out, 0, vec![]));
    let back = StepWork::Copy {
        bytes: 40,
        swap_in: true,
    };
    assert_eq!(work(Stream::H2d, 0), (back, 0, vec![(TensorId(1), 40)]));
    // A plan for another graph names a tensor this one lacks: an error.
    let mut bad = p.clone();
    bad.streams[Stream::D2h.index()][0].instr = Instr::SwapOut(TensorId(9));
    let at = StepRef {
        stream: Stream::D2h,
        index: 0,
    };
    let e = outcore_sim::step_work(&prepared, &bad, at, |_, _| {}).expect_err("bad tensor");
    assert!(e.to_string().contains("tensor"), "{e}");
}

#[test]
fn timeline_lists_every_step_in_start_order_with_its_times() {
    // swap_t1 as in `swap_hidden_behind_compute`: A (c0) 0-10; at 10 the free
    // of t0 (c1) and the swap-out (d0) 10-18 start in one sweep over the
    // streams (a stream takes one step per sweep), B (c2) 10-30 in the next;
    // the free of t1 (d1) waits for B: 30; the swap-in
    // (h0) waits for it, taken in the next sweep: 30-38; C (c3) 38-68; the
    // frees c4-c6 at 68.
    let g = chain(8);
    let options = SimOptions {
        record_timeline: true,
        ..SimOptions::default()
    };
    let out = simulate(&g, &swap_t1(&g), &UnitCostModel, &options).expect("simulates");
    let got: Vec<(String, f64, f64)> = out
        .timeline
        .expect("timeline requested")
        .iter()
        .map(|t| (t.at.to_string(), t.start_s, t.end_s))
        .collect();
    let want = [
        ("compute#0", 0.0, 10.0),
        ("compute#1", 10.0, 10.0),
        ("d2h#0", 10.0, 18.0),
        ("compute#2", 10.0, 30.0),
        ("d2h#1", 30.0, 30.0),
        ("h2d#0", 30.0, 38.0),
        ("compute#3", 38.0, 68.0),
        ("compute#4", 68.0, 68.0),
        ("compute#5", 68.0, 68.0),
        ("compute#6", 68.0, 68.0),
    ];
    let want: Vec<(String, f64, f64)> = want
        .iter()
        .map(|&(at, s, e)| (at.to_string(), s, e))
        .collect();
    assert_eq!(got, want);
    // Not recorded unless asked for.
    let plain = simulate(&g, &swap_t1(&g), &UnitCostModel, &SimOptions::default());
    assert!(plain.expect("simulates").timeline.is_none());
}
