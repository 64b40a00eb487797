//! Two jobs on a unit-cost device (1 FLOP/s, 1 byte/s each way, also while
//! both directions copy, no copy latency), with every expected number derived
//! in the comments; plus the job and job-set checks and the metrics.

use std::sync::Arc;

use outcore_colocate::{
    ColocateError, ColocateErrorKind, ColocateOptions, Job, JobSet, Metrics, SetMetrics,
    simulate_jobs, simulate_jobs_with,
};
use outcore_cost::UnitCostModel;
use outcore_graph::{
    DType, Graph, GraphMeta, Op, OpId, OpKind, Phase, Tensor, TensorId, TensorKind,
};
use outcore_plan::{Instr, Plan, PlannerInfo, StepRef, Stream};
use outcore_sim::{SimOptions, simulate};

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

/// t0 (input, 4 B) -A(10 s)-> t1 (100 B) -B(20 s)-> t2 (4 B); C(30 s) reads t2
/// and t1 -> t3 (4 B).
fn chain() -> Arc<Graph> {
    Arc::new(Graph {
        meta: GraphMeta {
            model: "chain".into(),
            batch: 1,
            seq: None,
            optimizer: "none".into(),
            source: "test".into(),
        },
        tensors: vec![
            tensor(0, 4, TensorKind::Input, None),
            tensor(1, 100, TensorKind::Activation, Some(0)),
            tensor(2, 4, TensorKind::Activation, Some(1)),
            tensor(3, 4, TensorKind::Activation, Some(2)),
        ],
        ops: vec![
            op(0, &[0], &[1], 10),
            op(1, &[1], &[2], 20),
            op(2, &[2, 1], &[3], 30),
        ],
    })
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

const PLAN_BUDGET_BYTES: u64 = 150;

/// Compute: c0 A, c1 free t0, c2 B, c3 C (waits for the swap-in), c4-c6 free
/// t1-t3. D2h: swap t1 out after A, free it after B. H2d: swap it back in
/// after the free. Alone: A 0-10, B 10-30, swap-out 10-110, free 110,
/// swap-in 110-210, C 210-240: 240 s with compute busy 60 s (link-bound).
/// Peak 108 B (t1, t2 and t3 during C).
fn swap_t1(g: &Graph) -> Arc<Plan> {
    let mut p = Plan::new(g, info(), PLAN_BUDGET_BYTES);
    p.push(Stream::Compute, Instr::Compute(OpId(0)), vec![]);
    p.push(Stream::Compute, Instr::Free(TensorId(0)), vec![]);
    p.push(Stream::D2h, Instr::SwapOut(TensorId(1)), vec![c(0)]);
    let freed = p.push(Stream::D2h, Instr::Free(TensorId(1)), vec![c(2)]);
    p.push(Stream::Compute, Instr::Compute(OpId(1)), vec![]);
    let sin = p.push(Stream::H2d, Instr::SwapIn(TensorId(1)), vec![freed]);
    p.push(Stream::Compute, Instr::Compute(OpId(2)), vec![sin]);
    for t in [1, 2, 3] {
        p.push(Stream::Compute, Instr::Free(TensorId(t)), vec![]);
    }
    Arc::new(p)
}

/// A, B, C in order, each tensor freed after its last use: 60 s, peak 108 B.
fn in_order(g: &Graph) -> Arc<Plan> {
    Arc::new(outcore_plan::lower_in_order(g, info(), PLAN_BUDGET_BYTES))
}

fn pair(plan: &Arc<Plan>, iterations: usize, budget_bytes: u64) -> JobSet {
    let g = chain();
    let job =
        |name: &str| Job::new(name, g.clone(), plan.clone(), iterations, 0.0, 1.0).expect("job");
    JobSet::new(budget_bytes, vec![job("j0"), job("j1")]).expect("set")
}

#[test]
fn the_toy_alone_is_link_bound() {
    let g = chain();
    let r = simulate(&g, &swap_t1(&g), &UnitCostModel, &SimOptions::default())
        .expect("simulates")
        .report;
    assert_eq!(r.iter_time_s, 240.0);
    assert_eq!(r.busy.compute_s, 60.0);
    assert_eq!(r.peak_live_bytes, 108);
}

#[test]
fn two_link_bound_jobs_overlap() {
    // One iteration each, both arriving at 0 (ready: since when a step's
    // waits and its job's previous step on the stream are done):
    //  0: A0 0-10 (tie with A1 at ready 0: job 0 first).
    // 10: j0 frees t0 (frees go first and take no stream time); compute
    //     takes A1 (ready 0) before B0 (ready 10): 10-20; swap-out0 10-110.
    // 20: B0 (ready 10) 20-40. 40: B1 (ready 20) 40-60. Then C0 and C1 wait
    //     for their swap-ins; the compute stream idles.
    // 110: swap-out0 ends; d2h takes swap-out1 (ready 20) 110-210, j0 frees
    //     t1 and swap-in0 runs 110-210 (both directions at 1 B/s).
    // 210: C0 210-240; j1 frees t1; swap-in1 210-310. 310: C1 310-340.
    // So j0 takes 240 s (as alone) and j1 340 s: the pair ends at 340 s, later
    // than one job (240 s) but sooner than two in a row (480 s).
    // Memory: both inputs 8 B; A0 108; j0 frees t0: 104, A1 204; j1 frees
    // t0: 200, B0 204; B1 208; at 110 j0 frees t1 (108) and swaps it in
    // (208); at 210 C0 allocates t3 (212: compute is swept before d2h, as in
    // `simulate`), then j1 frees t1 (112) and swaps it in (212). Global peak
    // 212 B; each job's own peak is 108 B, as alone.
    let r = simulate_jobs(&pair(&swap_t1(&chain()), 1, 1000), &UnitCostModel).expect("runs");
    assert_eq!(r.jobs[0].per_iteration_time_s, vec![240.0]);
    assert_eq!(r.jobs[1].per_iteration_time_s, vec![340.0]);
    assert_eq!((r.jobs[0].finish_s, r.jobs[1].finish_s), (240.0, 340.0));
    assert_eq!(r.makespan_s, 340.0);
    assert_eq!(r.peak_live_bytes, 212);
    assert_eq!(
        (r.jobs[0].peak_live_bytes, r.jobs[1].peak_live_bytes),
        (108, 108)
    );
    assert!(r.fits_budget);
    // The compute stream ran 120 s of kernels, each link 200 s of copies.
    assert_eq!(r.busy.compute_s, 120.0);
    assert_eq!((r.busy.h2d_s, r.busy.d2h_s), (200.0, 200.0));
    assert_eq!(r.jobs[1].busy.compute_s, 60.0);
    assert_eq!(
        (r.jobs[1].swap_in_bytes, r.jobs[1].swap_out_bytes),
        (100, 100)
    );
}

#[test]
fn two_jobs_pipeline_their_iterations() {
    // Two iterations each. j0's second iteration starts at 240 while j1 waits
    // for its swap-in: A0 240-250, B0 250-270, swap-out0 250-350. 310: C1
    // 310-340, j1's first iteration ends (340 s) and its second starts: A1
    // 340-350. 350: A1 and swap-out0 end; on d2h j0's free of t1 and j1's
    // swap-out were both ready at 350: job 0 first, and a free takes no time;
    // swap-in0 350-450, swap-out1 350-450, B1 350-370. 450: C0 450-480 (j0's
    // second iteration: 240 s, done at 480); j1 frees t1, swap-in1 450-550;
    // C1 550-580 (240 s, done at 580). Steady state: 240 s an iteration for
    // each job, as alone, where two jobs in a row would take 480 s a pair.
    // The global peak stays 212 B (C0 at 450 beside j1's t1 and t2 and then
    // j1's swap-in, as in the first iteration).
    let r = simulate_jobs(&pair(&swap_t1(&chain()), 2, 1000), &UnitCostModel).expect("runs");
    assert_eq!(r.jobs[0].per_iteration_time_s, vec![240.0, 240.0]);
    assert_eq!(r.jobs[1].per_iteration_time_s, vec![340.0, 240.0]);
    assert_eq!(r.makespan_s, 580.0);
    assert_eq!(r.peak_live_bytes, 212);
}

#[test]
fn a_global_peak_over_the_budget_is_reported_not_an_error() {
    // Each plan fits its own 150 B; together they peak at 212 B > 200 B.
    let r = simulate_jobs(&pair(&swap_t1(&chain()), 1, 200), &UnitCostModel).expect("runs");
    assert_eq!(r.peak_live_bytes, 212);
    assert!(!r.fits_budget);
}

#[test]
fn a_late_job_starts_at_its_arrival() {
    // j1 arrives at 500 s, after j0 (240 s) has left: each runs as alone.
    let g = chain();
    let p = swap_t1(&g);
    let j0 = Job::new("j0", g.clone(), p.clone(), 1, 0.0, 1.0).expect("job");
    let j1 = Job::new("j1", g, p, 1, 500.0, 1.0).expect("job");
    let r = simulate_jobs(
        &JobSet::new(1000, vec![j0, j1]).expect("set"),
        &UnitCostModel,
    )
    .expect("runs");
    assert_eq!((r.jobs[1].start_s, r.jobs[1].finish_s), (500.0, 740.0));
    assert_eq!(r.jobs[1].per_iteration_time_s, vec![240.0]);
    assert_eq!(r.makespan_s, 740.0);
    // Never both on the device at once: the global peak is one job's.
    assert_eq!(r.peak_live_bytes, 108);
}

#[test]
fn metrics_against_the_same_jobs_unscheduled() {
    // Vanilla: both jobs in order, compute-bound. A0 0-10, A1 10-20 (ready 0,
    // before B0 ready 10), B0 20-40, B1 40-60 (ready 20, before C0 ready 40),
    // C0 60-90, C1 90-120: makespan 120 s; j0 90 s, j1 120 s. Peak: at 60 C0
    // allocates t3 beside j0's t1, t2 and j1's t1, t2: 212 B. (At 90 j0's
    // frees go before C1, which had been ready since 60: frees go first, or
    // C1's t3 would meet all of j0's tensors, 216 B.)
    let g = chain();
    let vanilla = simulate_jobs(&pair(&in_order(&g), 1, 1000), &UnitCostModel).expect("runs");
    assert_eq!(vanilla.makespan_s, 120.0);
    assert_eq!(vanilla.peak_live_bytes, 212);
    let swapped = simulate_jobs(&pair(&swap_t1(&g), 1, 1000), &UnitCostModel).expect("runs");
    let m = SetMetrics::new(&vanilla, &swapped).expect("same jobs");
    // This swap saves nothing at the peak (MSR 0) and takes 340 / 120 of the
    // time: EOR 17 / 6, CBR 0.
    assert_eq!(m.global.msr, 0.0);
    assert_eq!(m.global.eor, 340.0 / 120.0);
    assert_eq!(m.global.cbr, 0.0);
    // Per job: j1 took 340 s against 120 s.
    assert_eq!(m.jobs[1].0, "j1");
    assert_eq!(m.jobs[1].1.eor, 340.0 / 120.0);
    // The definitions on hand numbers: peak 100 -> 60 B (MSR 0.4) at 1.6x the
    // time (EOR 1.6): CBR 0.25.
    let m = Metrics::new(100, 10.0, 60, 16.0).expect("valid");
    assert_eq!((m.msr, m.eor, m.cbr), (0.4, 1.6, 0.25));
    let e = Metrics::new(0, 10.0, 60, 16.0).unwrap_err();
    assert!(
        matches!(e.kind, ColocateErrorKind::DegenerateVanilla { .. }),
        "{e}"
    );
    // Different job lists cannot be compared.
    let one = JobSet::new(
        1000,
        vec![Job::new("j0", g.clone(), in_order(&g), 1, 0.0, 1.0).expect("job")],
    )
    .expect("set");
    let one = simulate_jobs(&one, &UnitCostModel).expect("runs");
    let e = SetMetrics::new(&one, &swapped).unwrap_err();
    assert!(
        matches!(e.kind, ColocateErrorKind::MismatchedReports { .. }),
        "{e}"
    );
}

#[test]
fn bad_jobs_and_sets_are_clear_errors() {
    let g = chain();
    let p = swap_t1(&g);
    let job = |iterations, arrival_s, priority| {
        Job::new("j", g.clone(), p.clone(), iterations, arrival_s, priority)
    };
    let kind = |r: Result<Job, ColocateError>| r.expect_err("rejected").kind;
    for iterations in [0, outcore_colocate::MAX_ITERATIONS + 1] {
        let e = job(iterations, 0.0, 1.0).expect_err("rejected");
        assert!(
            matches!(e.kind, ColocateErrorKind::BadIterations { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("1 to 10000"), "{e}");
    }
    for arrival_s in [-1.0, f64::NAN, f64::INFINITY] {
        let e = job(1, arrival_s, 1.0).expect_err("rejected");
        assert!(
            matches!(e.kind, ColocateErrorKind::BadArrival { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("at least 0 s"), "{e}");
    }
    for priority in [-0.1, 1.5, f64::NAN] {
        assert!(matches!(
            kind(job(1, 0.0, priority)),
            ColocateErrorKind::BadPriority { .. }
        ));
    }
    // A plan made for another graph.
    let mut other = (*g).clone();
    other.ops[0].flops = 11;
    let e = Job::new("j", Arc::new(other), p.clone(), 1, 0.0, 1.0).expect_err("rejected");
    assert!(
        matches!(e.kind, ColocateErrorKind::PlanForAnotherGraph { .. }),
        "{e}"
    );
    // A plan that does not verify: C no longer waits for the swap-in.
    let mut bad = (*p).clone();
    bad.streams[Stream::Compute.index()][3].waits.clear();
    let e = Job::new("j", g.clone(), Arc::new(bad), 1, 0.0, 1.0).expect_err("rejected");
    assert!(
        matches!(e.kind, ColocateErrorKind::PlanDoesNotVerify { .. }),
        "{e}"
    );

    let ok = || job(1, 0.0, 1.0).expect("valid");
    let set = |budget_bytes, jobs| JobSet::new(budget_bytes, jobs).expect_err("rejected").kind;
    assert!(matches!(set(1000, vec![]), ColocateErrorKind::EmptySet));
    assert!(matches!(set(0, vec![ok()]), ColocateErrorKind::ZeroBudget));
    assert!(matches!(
        set(1000, vec![ok(), ok()]),
        ColocateErrorKind::DuplicateName { .. }
    ));
    assert!(matches!(
        set(PLAN_BUDGET_BYTES - 1, vec![ok()]),
        ColocateErrorKind::PlanOverSetBudget { .. }
    ));
}

#[test]
fn the_trace_has_a_track_group_per_job() {
    // The one-iteration pair: 3 kernels and 2 copies a job, as derived in
    // `two_link_bound_jobs_overlap`; j1's A runs 10-20 s and its swap-in
    // 210-310 s; the memory counter peaks at 212 B.
    let options = ColocateOptions { record_trace: true };
    let out = simulate_jobs_with(&pair(&swap_t1(&chain()), 1, 1000), &UnitCostModel, &options)
        .expect("runs");
    let trace = out.trace.expect("asked for");
    let events = trace["traceEvents"].as_array().expect("events");
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert_eq!(names, ["device", "job j0", "job j1"]);
    let spans = |pid: u64| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .map(|e| {
                (
                    e["name"].as_str().unwrap_or(""),
                    e["tid"].as_u64(),
                    e["ts"].as_f64(),
                    e["dur"].as_f64(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(spans(1).len(), 5);
    let j1 = spans(2);
    assert_eq!(j1.len(), 5);
    assert!(
        j1.contains(&("op0", Some(0), Some(10e6), Some(10e6))),
        "{j1:?}"
    );
    assert!(
        j1.contains(&("swap-in t1", Some(1), Some(210e6), Some(100e6))),
        "{j1:?}"
    );
    let peak = events
        .iter()
        .filter_map(|e| e["args"]["live_bytes"].as_u64())
        .max();
    assert_eq!(peak, Some(out.report.peak_live_bytes));
    assert_eq!(peak, Some(212));
}
