//! Lowering schedules with swap and recompute gaps yields plans that verify, and
//! corrupting those plans makes verify reject them.

mod common;

use common::{info, swap_everything};
use outcore_graph::{footprint, zoo};
use outcore_plan::{
    Gap, Instr, Restore, Schedule, Stream, ViolationKind, lower_schedule, use_positions, verify,
};

#[test]
fn swap_schedules_verify_and_use_less_memory() {
    for name in ["resnet18", "mobilenet_v2", "tiny-cnn", "lstm"] {
        let g = zoo::build(name, Some(2), &Default::default(), None).expect("zoo");
        let s = swap_everything(&g, 3);
        assert!(!s.gaps.is_empty(), "{name}");
        let plan = lower_schedule(&g, &s, info(), footprint(&g).0).expect("lowers");
        let v = verify(&plan, &g);
        assert!(v.is_empty(), "{name}: {}", v[0]);
        // Corruption: drop every wait of the compute stream; the swap-ins race.
        let mut broken = plan.clone();
        for step in &mut broken.streams[Stream::Compute.index()] {
            step.waits.clear();
        }
        assert!(
            !verify(&broken, &g).is_empty(),
            "{name}: corrupted plan passes"
        );
        // Corruption: drop one swap-in.
        let mut broken = plan.clone();
        broken.streams[Stream::H2d.index()].pop();
        assert!(
            !verify(&broken, &g).is_empty(),
            "{name}: missing swap-in passes"
        );
    }
}

#[test]
fn recompute_gaps_of_relu_outputs_verify() {
    let g = zoo::build("tiny-cnn", Some(2), &Default::default(), None).expect("zoo");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let mut n = 0;
    for op in g.ops.iter().filter(|o| o.name == "relu") {
        let t = op.outputs[0];
        let input = g.storage_owner(op.inputs[0]);
        let u = &uses[t.index()];
        let ui = &uses[input.index()];
        // Recompute needs the relu input resident at the next use: only when the
        // input itself is used at or after that point.
        for w in u.windows(2) {
            if w[1] - w[0] > 1 && ui.iter().any(|&p| p >= w[1]) {
                s.gaps.push(Gap {
                    tensor: t,
                    after: Some(w[0]),
                    before: Some(w[1]),
                    how: Restore::Recompute,
                    prefetch_after: None,
                    reclaim_before: None,
                    copy_out_after: None,
                });
                n += 1;
            }
        }
    }
    let plan = lower_schedule(&g, &s, info(), footprint(&g).0).expect("lowers");
    let recomputes = plan.streams[0]
        .iter()
        .filter(|st| matches!(st.instr, Instr::Recompute { .. }))
        .count();
    assert_eq!(recomputes, n);
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
}

#[test]
fn bad_gaps_are_errors_not_panics() {
    let g = zoo::build("mlp", Some(2), &Default::default(), None).expect("zoo");
    let mut s = Schedule::in_graph_order(&g);
    let t = g.ops[0].outputs[0];
    s.gaps.push(Gap {
        tensor: t,
        after: Some(5),
        before: Some(2),
        how: Restore::Swap,
        prefetch_after: None,
        reclaim_before: None,
        copy_out_after: None,
    });
    let e = lower_schedule(&g, &s, info(), u64::MAX).expect_err("empty gap");
    assert!(e.to_string().contains("empty or out of range"), "{e}");
    let mut s = Schedule::in_graph_order(&g);
    s.order.pop();
    assert!(lower_schedule(&g, &s, info(), u64::MAX).is_err());
}

#[test]
fn swapping_the_whole_forward_lowers_the_verified_peak() {
    let g = zoo::build("resnet18", Some(32), &Default::default(), None).expect("zoo");
    let (fp, _) = footprint(&g);
    let s = swap_everything(&g, 3);
    // Find a budget under the footprint that still verifies.
    let plan = lower_schedule(&g, &s, info(), fp).expect("lowers");
    let mut lo = 0u64;
    let mut hi = fp;
    while hi - lo > fp / 1000 {
        let mid = (lo + hi) / 2;
        let mut p = plan.clone();
        p.budget_bytes = mid;
        if verify(&p, &g)
            .iter()
            .any(|v| matches!(v.kind, ViolationKind::OverBudget { .. }))
        {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert!(
        hi < fp * 8 / 10,
        "swapping saves less than 20%: {hi} of {fp}"
    );
}

#[test]
fn a_recomputation_chain_through_a_dead_tensor_verifies() {
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    // x -> fc -> relu r1 -> relu r2 -> relu r3 -> head -> loss. fc's output is dead
    // after r1 (ReLU keeps its output), so recomputing r1 and r2 before r2's backward
    // needs fc's output recomputed first and freed right after the chain.
    let mut b = GraphBuilder::new("chain", 2, DType::Float32);
    let x = b.input("x", &[2, 8]);
    let y = b.label("y", &[2]);
    let fc = b.linear("fc", x, 8, true);
    let r1 = b.relu(fc);
    let r2 = b.relu(r1);
    let r3 = b.relu(r2);
    let logits = b.linear("head", r3, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    // The backward of relu r2 is the first backward op that reads r2.
    let p = uses[r2.index()]
        .iter()
        .copied()
        .find(|&q| g.op(s.order[q]).phase == outcore_graph::Phase::Backward)
        .expect("r2 is read in backward");
    let last_forward_use = |t: outcore_graph::TensorId| {
        uses[t.index()]
            .iter()
            .copied()
            .filter(|&q| q < p)
            .max()
            .expect("used in forward")
    };
    for t in [fc, r1, r2] {
        s.gaps.push(Gap {
            tensor: t,
            after: Some(last_forward_use(t)),
            before: Some(p),
            how: Restore::Recompute,
            prefetch_after: None,
            reclaim_before: None,
            copy_out_after: None,
        });
    }
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let recomputes: Vec<&Instr> = plan.streams[0]
        .iter()
        .map(|st| &st.instr)
        .filter(|i| matches!(i, Instr::Recompute { .. }))
        .collect();
    assert_eq!(recomputes.len(), 3);
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    // fc's output is freed after the chain, before the op at p.
    let free_fc = plan.streams[0]
        .iter()
        .rposition(|st| st.instr == Instr::Free(fc))
        .expect("freed");
    let op_p = plan.streams[0]
        .iter()
        .position(|st| st.instr == Instr::Compute(s.order[p]))
        .expect("op p");
    assert!(free_fc < op_p);
    // And right after its only reader, r1's recomputation, before r2's: a
    // chain holds only the links still to be read.
    let recompute_of = |t: outcore_graph::TensorId| {
        plan.streams[0]
            .iter()
            .position(
                |st| matches!(&st.instr, Instr::Recompute { outputs, .. } if outputs == &vec![t]),
            )
            .expect("recomputed")
    };
    assert_eq!(free_fc, recompute_of(r1) + 1);
    assert!(free_fc < recompute_of(r2));
}

#[test]
fn a_live_link_brought_back_only_for_a_chain_leaves_right_after_its_reader() {
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    // x -> fc -> r1 -> r2 -> r3 -> head. r1 is recomputed before r2's backward
    // only to feed r2's recomputation; a second gap takes it off again from
    // there to its own backward, so it is freed right after r2's recomputation.
    let mut b = GraphBuilder::new("chain", 2, DType::Float32);
    let x = b.input("x", &[2, 8]);
    let y = b.label("y", &[2]);
    let fc = b.linear("fc", x, 8, true);
    let r1 = b.relu(fc);
    let r2 = b.relu(r1);
    let r3 = b.relu(r2);
    let logits = b.linear("head", r3, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let backward_use = |t: outcore_graph::TensorId| {
        uses[t.index()]
            .iter()
            .copied()
            .find(|&q| g.op(s.order[q]).phase == outcore_graph::Phase::Backward)
            .expect("read in backward")
    };
    let (p, q) = (backward_use(r2), backward_use(r1));
    assert!(p < q, "r2's backward runs before r1's");
    let last_forward_use = |t: outcore_graph::TensorId| {
        uses[t.index()]
            .iter()
            .copied()
            .filter(|&u| u < p)
            .max()
            .expect("used in forward")
    };
    let gap = |t, after, before| Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Recompute,
        prefetch_after: None,
        reclaim_before: None,
        copy_out_after: None,
    };
    // fc's output is dead after r1's forward: it comes back for each
    // recomputation of r1.
    s.gaps.push(gap(fc, last_forward_use(fc), p));
    s.gaps.push(gap(fc, p, q));
    s.gaps.push(gap(r1, last_forward_use(r1), p));
    s.gaps.push(gap(r1, p, q));
    s.gaps.push(gap(r2, last_forward_use(r2), p));
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let steps: Vec<&Instr> = plan.streams[0].iter().map(|st| &st.instr).collect();
    let recompute_of = |t: outcore_graph::TensorId| {
        steps
            .iter()
            .position(|i| matches!(i, Instr::Recompute { outputs, .. } if outputs == &vec![t]))
            .expect("recomputed")
    };
    let first_free_after = |t, from: usize| {
        steps[from..]
            .iter()
            .position(|i| **i == Instr::Free(t))
            .map(|d| d + from)
            .expect("freed")
    };
    let r2_at = recompute_of(r2);
    assert_eq!(first_free_after(r1, recompute_of(r1)), r2_at + 1);
    assert!(
        steps[r2_at + 1..]
            .iter()
            .any(|i| matches!(i, Instr::Recompute { outputs, .. } if outputs == &vec![r1]))
    );
}

#[test]
fn a_resident_tensor_leaves_right_after_the_recomputation_that_reads_it() {
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    // x -> fc -> r1 -> r2 -> r3 -> head. r2 is recomputed before its backward
    // from r1, which stays resident until then; a gap on r1 that starts there
    // (where a recomputation reads it) frees r1 right after that recomputation.
    let mut b = GraphBuilder::new("chain", 2, DType::Float32);
    let x = b.input("x", &[2, 8]);
    let y = b.label("y", &[2]);
    let fc = b.linear("fc", x, 8, true);
    let r1 = b.relu(fc);
    let r2 = b.relu(r1);
    let r3 = b.relu(r2);
    let logits = b.linear("head", r3, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let backward_use = |t: outcore_graph::TensorId| {
        uses[t.index()]
            .iter()
            .copied()
            .find(|&q| g.op(s.order[q]).phase == outcore_graph::Phase::Backward)
            .expect("read in backward")
    };
    let (p, q) = (backward_use(r2), backward_use(r1));
    let last_use_before = |t: outcore_graph::TensorId, before: usize| {
        uses[t.index()]
            .iter()
            .copied()
            .filter(|&u| u < before)
            .max()
            .expect("used before")
    };
    let gap = |t, after, before| Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Recompute,
        prefetch_after: None,
        reclaim_before: None,
        copy_out_after: None,
    };
    s.gaps.push(gap(r2, last_use_before(r2, p), p));
    s.gaps.push(gap(r1, p, q));
    s.gaps.push(gap(fc, last_use_before(fc, q), q));
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let steps: Vec<&Instr> = plan.streams[0].iter().map(|st| &st.instr).collect();
    let r2_at = steps
        .iter()
        .position(|i| matches!(i, Instr::Recompute { outputs, .. } if outputs == &vec![r2]))
        .expect("r2 recomputed");
    assert_eq!(steps[r2_at + 1], &Instr::Free(r1));
    // Such a gap may not start where nothing reads the tensor.
    let mut bad = s.clone();
    bad.gaps.retain(|g| g.tensor != r2);
    assert!(lower_schedule(&g, &bad, info(), u64::MAX).is_err());
}

#[test]
fn a_dead_input_of_a_recomputation_is_held_until_it() {
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    // x -> fc -> r1 -> r2 -> head. ReLU's backward reads its output, so fc's
    // output is dead after r1's forward. Recomputing r1 before its backward
    // reads fc's output there: with no gap on it, the lowering holds it from
    // its last use to that recomputation and frees it right after.
    let mut b = GraphBuilder::new("hold", 2, DType::Float32);
    let x = b.input("x", &[2, 8]);
    let y = b.label("y", &[2]);
    let fc = b.linear("fc", x, 8, true);
    let r1 = b.relu(fc);
    let r2 = b.relu(r1);
    let logits = b.linear("head", r2, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let q = uses[r1.index()]
        .iter()
        .copied()
        .find(|&u| g.op(s.order[u]).phase == outcore_graph::Phase::Backward)
        .expect("r1 is read in backward");
    let last_fc = *uses[fc.index()].last().expect("fc is used");
    assert!(last_fc < q, "fc's output is dead before r1's backward");
    let last_forward_r1 = uses[r1.index()]
        .iter()
        .copied()
        .filter(|&u| u < q)
        .max()
        .expect("r1 is used in forward");
    s.gaps.push(Gap {
        tensor: r1,
        after: Some(last_forward_r1),
        before: Some(q),
        how: Restore::Recompute,
        prefetch_after: None,
        reclaim_before: None,
        copy_out_after: None,
    });
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let steps: Vec<&Instr> = plan.streams[0].iter().map(|st| &st.instr).collect();
    let frees: Vec<usize> = (0..steps.len())
        .filter(|&i| *steps[i] == Instr::Free(fc))
        .collect();
    let r1_at = steps
        .iter()
        .position(|i| matches!(i, Instr::Recompute { outputs, .. } if outputs == &vec![r1]))
        .expect("r1 recomputed");
    assert_eq!(
        frees,
        vec![r1_at + 1],
        "fc is freed once, after r1's recomputation"
    );
}

/// An optimizer state that the previous iteration left on the device is
/// copied out early in the iteration, before its first use, and back for its
/// update: the plan verifies (residency at the end equal to the start's, the
/// state off the device in between), and its only copy-out is early.
#[test]
fn a_state_copied_out_before_its_first_use_verifies() {
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    let mut b = GraphBuilder::new("early-out", 2, DType::Float32);
    let x = b.input("x", &[2, 8]);
    let y = b.label("y", &[2]);
    let fc = b.linear("fc", x, 8, true);
    let r = b.relu(fc);
    let logits = b.linear("head", r, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let state = g
        .tensors
        .iter()
        .find(|t| t.kind == outcore_graph::TensorKind::OptimizerState && t.allocates())
        .expect("momentum")
        .id;
    let first = uses[state.index()][0];
    assert!(first > 2, "the momentum is first used by its update, late");
    s.gaps.push(Gap {
        tensor: state,
        after: Some(0),
        before: Some(first),
        how: Restore::Swap,
        prefetch_after: Some(first - 1),
        reclaim_before: Some(1),
        copy_out_after: None,
    });
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let d2h: Vec<&Instr> = plan.streams[Stream::D2h.index()]
        .iter()
        .map(|st| &st.instr)
        .collect();
    assert_eq!(d2h, vec![&Instr::SwapOut(state), &Instr::Free(state)]);
    // Waiting for nothing before the copy-out's free, the compute stream
    // would reclaim memory the copy still reads: verify refuses it.
    let mut broken = plan.clone();
    for step in &mut broken.streams[Stream::Compute.index()] {
        step.waits.clear();
    }
    assert!(!verify(&broken, &g).is_empty(), "racing plan passes");
    // Only a persistent tensor's first gap may start before its first use.
    let mut bad = s.clone();
    bad.gaps[0].tensor = r;
    assert!(lower_schedule(&g, &bad, info(), u64::MAX).is_err());
    // A state that begins on the host has nothing to copy out.
    let mut bad = s.clone();
    bad.initial_residency = vec![(state, outcore_plan::Residency::Host)];
    let refused =
        lower_schedule(&g, &bad, info(), u64::MAX).map_or(true, |p| !verify(&p, &g).is_empty());
    assert!(refused, "a copy-out of a state on the host passes");
}
