//! One test per verify() violation kind, each on a deliberately broken plan, and
//! clean verification of in-order plans on real graphs.

use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, OpId, TensorId, TensorKind, footprint};
use outcore_plan::{
    Instr, Plan, PlannerInfo, Residency, StepRef, Stream, ViolationKind, lower_in_order, verify,
};

/// x[2,4] -> linear(3) -> relu -> linear(2) -> cross-entropy, SGD with momentum.
fn small_graph() -> Graph {
    let mut b = GraphBuilder::new("small", 2, DType::Float32);
    let x = b.input("x", &[2, 4]);
    let y = b.label("y", &[2]);
    let h = b.linear("fc", x, 3, true);
    let h = b.relu(h);
    let logits = b.linear("head", h, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    b.finish(loss, Optimizer::sgd_momentum())
        .expect("small graph is valid")
}

fn info() -> PlannerInfo {
    PlannerInfo {
        name: "test".into(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

fn in_order(g: &Graph) -> Plan {
    lower_in_order(g, info(), footprint(g).0)
}

fn kinds(plan: &Plan, g: &Graph) -> Vec<ViolationKind> {
    verify(plan, g).into_iter().map(|v| v.kind).collect()
}

fn compute_index(plan: &Plan, op: OpId) -> usize {
    plan.stream(Stream::Compute)
        .iter()
        .position(|s| s.instr == Instr::Compute(op))
        .expect("op is computed")
}

fn tensor_named(g: &Graph, prefix: &str) -> TensorId {
    g.tensors
        .iter()
        .find(|t| t.name.starts_with(prefix))
        .expect("tensor exists")
        .id
}

fn relu_out(g: &Graph) -> TensorId {
    g.ops
        .iter()
        .find(|o| o.name == "relu")
        .expect("relu op")
        .outputs[0]
}

#[test]
fn in_order_plans_verify_at_exactly_the_footprint() {
    let g = small_graph();
    assert_eq!(kinds(&in_order(&g), &g), vec![]);
    for name in ["resnet18", "mlp", "tiny-cnn"] {
        let g = outcore_graph::zoo::build(name, Some(2), &Default::default(), None).expect("zoo");
        let plan = in_order(&g);
        assert_eq!(kinds(&plan, &g), vec![], "{name}");
    }
}

#[test]
fn over_budget_by_one_byte() {
    let g = small_graph();
    let mut plan = in_order(&g);
    plan.budget_bytes -= 1;
    let k = kinds(&plan, &g);
    assert!(
        matches!(k.as_slice(), [ViolationKind::OverBudget { .. }]),
        "{k:?}"
    );
}

#[test]
fn missing_compute() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let last_update = g.ops.len() - 1;
    let i = compute_index(&plan, OpId(last_update as u32));
    plan.streams[0].remove(i);
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::MissingCompute {
            op: OpId(last_update as u32)
        }),
        "{k:?}"
    );
}

#[test]
fn duplicate_compute() {
    let g = small_graph();
    let mut plan = in_order(&g);
    plan.push(Stream::Compute, Instr::Compute(OpId(0)), vec![]);
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::DuplicateCompute { op: OpId(0) }),
        "{k:?}"
    );
}

#[test]
fn recompute_of_a_backward_op() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let bwd = g
        .ops
        .iter()
        .find(|o| o.phase == outcore_graph::Phase::Backward)
        .expect("backward");
    let at = compute_index(&plan, bwd.id) + 1;
    plan.streams[0].insert(
        at,
        outcore_plan::Step {
            instr: Instr::Recompute {
                op: bwd.id,
                outputs: vec![],
            },
            waits: vec![],
        },
    );
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::NotRecomputable { op: bwd.id }),
        "{k:?}"
    );
}

#[test]
fn read_after_free() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let r = relu_out(&g);
    // Free the relu output right after it is produced, before `head` reads it.
    let free_at = plan.streams[0]
        .iter()
        .position(|s| s.instr == Instr::Free(r))
        .expect("free");
    let step = plan.streams[0].remove(free_at);
    let relu_op = g.tensor(r).producer.expect("producer");
    plan.streams[0].insert(compute_index(&plan, relu_op) + 1, step);
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::ReadNotResident { tensor: r }),
        "{k:?}"
    );
}

#[test]
fn recompute_with_missing_input() {
    let g = small_graph();
    let mut plan = in_order(&g);
    // The loss's log-probabilities come from `loss`, whose input (the logits) is
    // freed once the loss is computed; recomputing the loss then lacks it.
    let loss_op = g.ops.iter().find(|o| o.name == "loss").expect("loss op");
    let logits = loss_op.inputs[0];
    let at = plan.streams[0]
        .iter()
        .position(|s| s.instr == Instr::Free(logits))
        .expect("free");
    let extra = loss_op.outputs[1];
    plan.streams[0].insert(
        at + 1,
        outcore_plan::Step {
            instr: Instr::Free(extra),
            waits: vec![],
        },
    );
    plan.streams[0].insert(
        at + 2,
        outcore_plan::Step {
            instr: Instr::Recompute {
                op: loss_op.id,
                outputs: vec![extra],
            },
            waits: vec![],
        },
    );
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::RecomputeInputMissing { tensor: logits }),
        "{k:?}"
    );
}

#[test]
fn recompute_after_the_optimizer_sees_a_stale_parameter() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let fc = g.ops.iter().find(|o| o.name == "fc").expect("fc");
    let out = fc.outputs[0];
    let w = tensor_named(&g, "fc.weight");
    // Keep x alive (drop its free), then recompute fc at the very end.
    let x = fc.inputs[0];
    plan.streams[0].retain(|s| s.instr != Instr::Free(x));
    plan.push(
        Stream::Compute,
        Instr::Recompute {
            op: fc.id,
            outputs: vec![out],
        },
        vec![],
    );
    plan.push(Stream::Compute, Instr::Free(out), vec![]);
    plan.push(Stream::Compute, Instr::Free(x), vec![]);
    plan.budget_bytes = u64::MAX;
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::StaleVersion {
            tensor: w,
            expected: 0,
            found: 1
        }),
        "{k:?}"
    );
}

#[test]
fn free_racing_a_swap_out() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let r = relu_out(&g);
    let relu_op = g.tensor(r).producer.expect("producer");
    let produced = StepRef {
        stream: Stream::Compute,
        index: compute_index(&plan, relu_op) as u32,
    };
    plan.push(Stream::D2h, Instr::SwapOut(r), vec![produced]);
    plan.budget_bytes = u64::MAX;
    // The compute stream's free of r does not wait for the copy-out.
    let k = kinds(&plan, &g);
    assert!(
        k.iter()
            .any(|k| matches!(k, ViolationKind::Unordered { tensor, .. } if *tensor == r)),
        "{k:?}"
    );
}

#[test]
fn swap_in_while_resident() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let r = relu_out(&g);
    let relu_op = g.tensor(r).producer.expect("producer");
    let produced = StepRef {
        stream: Stream::Compute,
        index: compute_index(&plan, relu_op) as u32,
    };
    let out = plan.push(Stream::D2h, Instr::SwapOut(r), vec![produced]);
    let swap_in = plan.push(Stream::H2d, Instr::SwapIn(r), vec![out]);
    // Make the compute stream's free follow the swap-in so that only residency is wrong.
    let free_at = plan.streams[0]
        .iter()
        .position(|s| s.instr == Instr::Free(r))
        .expect("free");
    plan.streams[0][free_at].waits.push(swap_in);
    plan.budget_bytes = u64::MAX;
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::AlreadyResident { tensor: r }),
        "{k:?}"
    );
}

#[test]
fn double_free() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let r = relu_out(&g);
    plan.push(Stream::Compute, Instr::Free(r), vec![]);
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::NotResident { tensor: r }),
        "{k:?}"
    );
}

#[test]
fn freeing_a_parameter_without_a_host_copy() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let w = tensor_named(&g, "head.weight");
    plan.push(Stream::Compute, Instr::Free(w), vec![]);
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::FreedWithoutHostCopy { tensor: w }),
        "{k:?}"
    );
}

#[test]
fn swap_in_without_host_copy() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let r = relu_out(&g);
    let relu_op = g.tensor(r).producer.expect("producer");
    let consumer = g
        .ops
        .iter()
        .find(|o| o.inputs.contains(&r))
        .expect("consumer")
        .id;
    // Free r after relu and swap it in before its consumer, never copying it out.
    let produced = compute_index(&plan, relu_op);
    let free_at = plan.streams[0]
        .iter()
        .position(|s| s.instr == Instr::Free(r))
        .expect("free");
    let free = plan.streams[0].remove(free_at);
    plan.streams[0].insert(produced + 1, free);
    let freed = StepRef {
        stream: Stream::Compute,
        index: produced as u32 + 1,
    };
    let sin = plan.push(Stream::H2d, Instr::SwapIn(r), vec![freed]);
    let ci = compute_index(&plan, consumer);
    plan.streams[0][ci].waits.push(sin);
    // The swapped-in copy must be freed again after its last use.
    let last_use = g
        .ops
        .iter()
        .rposition(|o| o.inputs.contains(&r))
        .expect("last use");
    let li = compute_index(&plan, OpId(last_use as u32));
    plan.streams[0].insert(
        li + 1,
        outcore_plan::Step {
            instr: Instr::Free(r),
            waits: vec![],
        },
    );
    plan.budget_bytes = u64::MAX;
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::SwapInWithoutHostCopy { tensor: r }),
        "{k:?}"
    );
}

#[test]
fn leaking_the_loss_breaks_repetition() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let loss = g
        .tensors
        .iter()
        .find(|t| t.kind == TensorKind::Loss)
        .expect("loss")
        .id;
    plan.streams[0].retain(|s| s.instr != Instr::Free(loss));
    let k = kinds(&plan, &g);
    assert!(
        k.iter()
            .any(|k| matches!(k, ViolationKind::EndResidency { tensor, .. } if *tensor == loss)),
        "{k:?}"
    );
}

#[test]
fn parameter_left_on_host_is_never_read_correctly() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let w = tensor_named(&g, "fc.weight");
    for entry in plan.initial_residency.iter_mut() {
        if entry.0 == w {
            entry.1 = Residency::Host;
        }
    }
    let k = kinds(&plan, &g);
    assert!(
        k.contains(&ViolationKind::ReadNotResident { tensor: w }),
        "{k:?}"
    );
    assert!(
        k.iter()
            .any(|k| matches!(k, ViolationKind::EndResidency { tensor, .. } if *tensor == w)),
        "{k:?}"
    );
}

#[test]
fn wait_cycle_deadlocks() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let r = relu_out(&g);
    let sout = plan.push(
        Stream::D2h,
        Instr::SwapOut(r),
        vec![StepRef {
            stream: Stream::Compute,
            index: 5,
        }],
    );
    plan.streams[0][2].waits.push(sout);
    let k = kinds(&plan, &g);
    assert!(
        k.iter()
            .any(|k| matches!(k, ViolationKind::Deadlock { .. })),
        "{k:?}"
    );
}

#[test]
fn wait_on_a_missing_step() {
    let g = small_graph();
    let mut plan = in_order(&g);
    let target = StepRef {
        stream: Stream::D2h,
        index: 99,
    };
    plan.streams[0][0].waits.push(target);
    let k = kinds(&plan, &g);
    assert!(k.contains(&ViolationKind::BadWait { target }), "{k:?}");
}

#[test]
fn malformed_instructions() {
    let g = small_graph();
    let mut plan = in_order(&g);
    plan.push(Stream::Compute, Instr::SwapIn(TensorId(0)), vec![]);
    let view = g
        .tensors
        .iter()
        .find(|t| t.inplace_update_of.is_some())
        .expect("an update")
        .id;
    plan.push(Stream::D2h, Instr::SwapOut(view), vec![]);
    plan.push(Stream::D2h, Instr::Free(TensorId(9999)), vec![]);
    let k = kinds(&plan, &g);
    let n = k
        .iter()
        .filter(|k| matches!(k, ViolationKind::Malformed { .. }))
        .count();
    assert_eq!(n, 3, "{k:?}");
}
