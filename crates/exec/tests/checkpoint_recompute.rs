//! Chen et al.'s checkpointing planners on a tiny CNN with batch norm and
//! dropout, executed on the CPU backend with real kernels for 10 iterations:
//! the plans recompute batch norms and the dropout (each op at most once per
//! iteration) and training is bit-identical to an unconstrained run, running
//! statistics included (a batch norm re-run never updates them twice; a
//! dropout re-run draws the same mask). The same for a MobileNet-v2 step
//! exported from PyTorch, whose batch norms are recomputable once imported.

use outcore_cost::RooflineModel;
use outcore_exec::{
    CpuBackend, CpuBackendOptions, ExecErrorKind, ExecOptions, RunReport, execute, test_plans,
};
use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, OpId, OpKind, TensorKind, footprint};
use outcore_plan::{
    Instr, Plan, PlanOutcome, PlanRequest, PlannerInfo, Stream, lower_in_order, verify,
};
use std::collections::BTreeMap;

const ITERS: u32 = 10;

/// Six conv - batch norm - ReLU layers on 8x8 images with dropout after the
/// second, and a classifier.
fn bn_dropout_cnn() -> Graph {
    let n = 8;
    let mut b = GraphBuilder::new("bn-dropout-cnn", n, DType::Float32);
    let mut x = b.input("images", &[n, 3, 8, 8]);
    let labels = b.label("labels", &[n]);
    for i in 0..6 {
        let c = b.conv2d(&format!("conv{i}"), x, 8, 3, 1, 1);
        let bn = b.batch_norm(&format!("bn{i}"), c);
        x = b.relu(bn);
        if i == 1 {
            x = b.dropout(x, 0.25);
        }
    }
    let pooled = b.global_avg_pool(x);
    let flat = b.flatten(pooled);
    let logits = b.linear("fc", flat, 10, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, Optimizer::sgd_momentum())
        .expect("valid graph")
}

/// The running statistics after training (part of `final_state`, named here
/// so that a failure says which state differs).
fn buffers(g: &Graph) -> Vec<usize> {
    g.tensors
        .iter()
        .filter(|t| t.kind == TensorKind::Buffer && t.is_persistent())
        .map(|t| t.id.index())
        .collect()
}

/// Executes `plan` in an arena of its verified peak plus some slack (the
/// arena allocator fragments where the plan's perfect allocator does not).
fn run_with_slack(g: &Graph, mut plan: Plan, options: &ExecOptions, name: &str) -> RunReport {
    for slack in [0.05, 0.15, 0.3, 0.5, 0.8] {
        test_plans::fit_budget(&mut plan, g, slack).expect("the plan verifies");
        match execute(
            g,
            &plan,
            &CpuBackend::new(CpuBackendOptions::default()),
            options,
        ) {
            Ok(report) => return report,
            Err(e) if matches!(e.kind, ExecErrorKind::OutOfDeviceMemory { .. }) => continue,
            Err(e) => panic!("{name} failed: {e}"),
        }
    }
    panic!("{name} does not run even at 1.8x its verified peak")
}

#[test]
fn checkpoint_plans_recompute_batch_norm_and_dropout_bit_identically() {
    let g = bn_dropout_cnn();
    assert!(!buffers(&g).is_empty(), "the model has running statistics");
    let (fp, _) = footprint(&g);
    let options = ExecOptions {
        iters: ITERS,
        check: true,
        trace: false,
        ..ExecOptions::default()
    };
    let info = PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let reference = execute(
        &g,
        &lower_in_order(&g, info, fp * 2),
        &CpuBackend::new(CpuBackendOptions::default()),
        &options,
    )
    .expect("the unconstrained run succeeds");
    assert!(reference.losses[ITERS as usize - 1] < reference.losses[0]);
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for name in ["checkpoint-sqrt", "checkpoint-greedy", "checkpoint-all"] {
        // The tightest of a few budgets at which the planner finds a plan
        // that recomputes both kinds.
        let mut ran = false;
        for percent in [50u64, 60, 70, 80] {
            let budget = fp * percent / 100;
            let cost = RooflineModel::new(outcore_exec::cpu::device_profile(budget, None, 1e10));
            let planner = outcore_planners::by_name(name).expect("registered");
            let request = PlanRequest {
                graph: &g,
                cost: &cost,
                budget_bytes: budget,
                seed: 0,
                time_limit_s: 10.0,
                allocator: &outcore_plan::AllocatorSpec::Perfect,
                order: None,
                fingerprint: None,
            };
            let plan = match planner.plan(&request).expect("no planner error") {
                PlanOutcome::Feasible(p) => *p,
                PlanOutcome::Infeasible(_) => continue,
            };
            let mut per_op: BTreeMap<OpId, usize> = BTreeMap::new();
            for step in &plan.streams[Stream::Compute.index()] {
                if let Instr::Recompute { op, .. } = &step.instr {
                    *per_op.entry(*op).or_insert(0) += 1;
                }
            }
            let kind_recomputed =
                |pick: fn(&OpKind) -> bool| per_op.keys().any(|&op| pick(&g.op(op).kind));
            if !kind_recomputed(|k| matches!(k, OpKind::BatchNorm { .. }))
                || !kind_recomputed(|k| matches!(k, OpKind::Dropout { .. }))
            {
                continue;
            }
            assert!(
                per_op.values().all(|&n| n == 1),
                "{name} at {percent}%: an op is recomputed twice: {per_op:?}"
            );
            let v = verify(&plan, &g);
            assert!(v.is_empty(), "{name}: {}", v[0]);
            let report = run_with_slack(&g, plan, &options, name);
            assert_eq!(report.checks_passed, Some(true), "{name}");
            assert!(report.recomputes > 0, "{name}");
            assert_eq!(
                bits(&report.losses),
                bits(&reference.losses),
                "{name}: losses differ"
            );
            assert!(
                report.final_state() == reference.final_state(),
                "{name} at {percent}%: final parameters or running statistics differ"
            );
            eprintln!(
                "{name} at {percent}% of {fp} B: {} recomputations per iteration, bit-identical",
                report.recomputes
            );
            ran = true;
            break;
        }
        assert!(
            ran,
            "{name} found no plan recomputing batch norm and dropout at 50-80%"
        );
    }
}

/// A MobileNet-v2 training step exported from PyTorch 2.11
/// (`tools/export_train_graph.py --model "torchvision:mobilenet_v2?width_mult=0.25"
/// --batch 8 --image-size 64`): its ops run on synthetic kernels that hash
/// their inputs, so a recomputation that read anything but what the original
/// op read (an overwritten input, a re-applied statistics update) changes the
/// bits `check` compares.
#[test]
fn an_imported_pytorch_graph_recomputes_batch_norm_bit_identically() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../graph/tests/data/mobilenet_v2_w025_b8_s64.json");
    let g = outcore_graph::format::load_graph_file(&path).expect("the example imports");
    let (fp, _) = footprint(&g);
    let options = ExecOptions {
        iters: 3,
        check: true,
        trace: false,
        synthetic_flops_per_s: 1e15,
        ..ExecOptions::default()
    };
    let info = PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let reference = execute(
        &g,
        &lower_in_order(&g, info, fp * 2),
        &CpuBackend::new(CpuBackendOptions::default()),
        &options,
    )
    .expect("the unconstrained run succeeds");
    let budget = fp * 85 / 100;
    let cost = RooflineModel::new(outcore_exec::cpu::device_profile(budget, None, 1e15));
    let planner = outcore_planners::by_name("checkpoint-sqrt").expect("registered");
    let request = PlanRequest {
        graph: &g,
        cost: &cost,
        budget_bytes: budget,
        seed: 0,
        time_limit_s: 10.0,
        allocator: &outcore_plan::AllocatorSpec::Perfect,
        order: None,
        fingerprint: None,
    };
    let PlanOutcome::Feasible(plan) = planner.plan(&request).expect("no planner error") else {
        panic!("checkpoint-sqrt finds no plan at 85%");
    };
    let recomputed: Vec<&str> = plan.streams[Stream::Compute.index()]
        .iter()
        .filter_map(|s| match &s.instr {
            Instr::Recompute { op, .. } => Some(g.op(*op).name.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        recomputed.iter().any(|n| n.contains("native_batch_norm")),
        "no batch norm recomputed: {recomputed:?}"
    );
    let report = run_with_slack(&g, *plan, &options, "checkpoint-sqrt");
    assert_eq!(report.checks_passed, Some(true));
    assert!(report.recomputes > 0);
    assert_eq!(
        report
            .losses
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>(),
        reference
            .losses
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>()
    );
    assert!(
        report.final_state() == reference.final_state(),
        "final parameters or running statistics differ"
    );
}
