//! Early copy-outs (`Gap::copy_out_after`): a swap's copy-out started before
//! its gap, while the tensor is still read. The lowering puts the copy on the
//! d2h stream after the op it names and the free on the compute stream,
//! waiting for the copy, where the gap's reclaim point says; the verifier
//! accepts that and refuses the same plan with the free's wait removed; and a
//! copy-out that could not hold the tensor's value at its gap is a schedule
//! error. Delayed copy-outs (`Gap::copy_out_after` past the gap's start): the
//! copy and the free on the d2h stream after the op named, behind the copies
//! that start there; refused where the free would come after the reclaim
//! point, the gap's end or the swap-in's trigger.

use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, TensorId, TensorKind};
use outcore_plan::{
    Gap, Instr, Plan, PlannerInfo, Restore, Schedule, StepRef, Stream, lower_schedule,
    use_positions, verify,
};

fn info() -> PlannerInfo {
    PlannerInfo {
        name: "test".into(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

/// Two linear layers with a ReLU between, SGD with momentum: `r`, the ReLU's
/// output, is read by the head in the forward pass and again in the backward
/// pass.
fn two_layers() -> (Graph, TensorId) {
    let mut b = GraphBuilder::new("early-copy", 2, DType::Float32);
    let x = b.input("x", &[2, 8]);
    let y = b.label("y", &[2]);
    let fc = b.linear("fc", x, 8, true);
    let r = b.relu(fc);
    let logits = b.linear("head", r, 2, true);
    let loss = b.softmax_cross_entropy(logits, y);
    let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
    let r = g.storage_owner(r);
    (g, r)
}

/// A swap of `t` over `(after, before)` copied out after `copy`.
fn early(t: TensorId, after: usize, before: usize, copy: usize, reclaim: Option<usize>) -> Gap {
    Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(before - 1),
        reclaim_before: reclaim,
        copy_out_after: Some(copy),
    }
}

/// The compute step that runs op position `p` of `s` in `plan`.
fn compute_step(plan: &Plan, s: &Schedule, p: usize) -> StepRef {
    let index = plan.streams[Stream::Compute.index()]
        .iter()
        .position(|st| st.instr == Instr::Compute(s.order[p]))
        .expect("every op runs");
    StepRef {
        stream: Stream::Compute,
        index: index as u32,
    }
}

/// The steps of `stream` whose instruction is `instr`.
fn steps(plan: &Plan, stream: Stream, instr: &Instr) -> Vec<StepRef> {
    plan.streams[stream.index()]
        .iter()
        .enumerate()
        .filter(|(_, st)| st.instr == *instr)
        .map(|(index, _)| StepRef {
            stream,
            index: index as u32,
        })
        .collect()
}

#[test]
fn an_activation_copied_out_where_it_is_made_leaves_after_its_last_forward_read() {
    let (g, r) = two_layers();
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let u = &uses[r.index()];
    // Made at u[0], read by the head at u[1], next read in the backward pass.
    let (made, read, back) = (u[0], u[1], u[2]);
    assert!(made < read && read + 1 < back, "{u:?}");
    s.gaps.push(early(r, read, back, made, Some(read + 1)));
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);

    // The copy waits for the op that made the tensor, not for its last read.
    let [copy] = steps(&plan, Stream::D2h, &Instr::SwapOut(r))[..] else {
        panic!("one copy-out of r");
    };
    let copy_step = &plan.streams[Stream::D2h.index()][copy.index as usize];
    assert_eq!(copy_step.waits, vec![compute_step(&plan, &s, made)]);
    // No free on the d2h stream: the compute stream frees it once the copy is
    // done, after the op before the reclaim point (here the head's read).
    assert!(steps(&plan, Stream::D2h, &Instr::Free(r)).is_empty());
    // The first free of r is the gap's (the last, after its last use).
    let free = steps(&plan, Stream::Compute, &Instr::Free(r))[0];
    assert_eq!(plan.streams[0][free.index as usize].waits, vec![copy]);
    assert!(free.index > compute_step(&plan, &s, read).index);
    assert!(free.index < compute_step(&plan, &s, read + 1).index);

    // Freed without waiting for the copy, the memory could be reused while
    // the copy reads it: verify refuses it.
    let mut racing = plan.clone();
    racing.streams[0][free.index as usize].waits.clear();
    assert!(!verify(&racing, &g).is_empty(), "a racing free passes");
}

#[test]
fn a_later_reclaim_point_frees_later_and_a_resident_parameter_copies_from_the_start() {
    let (g, r) = two_layers();
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let u = &uses[r.index()];
    let (made, read, back) = (u[0], u[1], u[2]);
    // Reclaimed two ops after the read: the free runs after the op before.
    s.gaps.push(early(r, read, back, made, Some(read + 2)));
    // The head's weight: on the device at the start, its host copy stale
    // (updated by the iteration before), read in the forward pass and again
    // in the backward pass; copied out from the first op.
    let w = g
        .tensors
        .iter()
        .find(|t| t.kind == TensorKind::Parameter && t.name.contains("head") && t.shape.len() == 2)
        .expect("head weight")
        .id;
    let uw = &uses[w.index()];
    assert!(uw[0] > 0 && uw[0] + 1 < uw[1], "{uw:?}");
    s.gaps.push(early(w, uw[0], uw[1], 0, None));
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    // The first free of r is the gap's (the last, after its last use).
    let free = steps(&plan, Stream::Compute, &Instr::Free(r))[0];
    assert!(free.index > compute_step(&plan, &s, read + 1).index);
    assert!(free.index < compute_step(&plan, &s, read + 2).index);
    let [copy] = steps(&plan, Stream::D2h, &Instr::SwapOut(w))[..] else {
        panic!("one copy-out of the weight");
    };
    assert_eq!(
        plan.streams[Stream::D2h.index()][copy.index as usize].waits,
        vec![compute_step(&plan, &s, 0)]
    );
    // No reclaim point: freed right after its read.
    let free = steps(&plan, Stream::Compute, &Instr::Free(w))[0];
    assert!(free.index > compute_step(&plan, &s, uw[0]).index);
    assert!(free.index < compute_step(&plan, &s, uw[0] + 1).index);
}

#[test]
fn a_copy_out_that_would_miss_the_tensors_value_is_a_schedule_error() {
    let (g, r) = two_layers();
    let s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let u = &uses[r.index()];
    let (made, read, back) = (u[0], u[1], u[2]);
    let refused = |gap: Gap, what: &str| {
        let mut bad = s.clone();
        bad.gaps.push(gap);
        let e = lower_schedule(&g, &bad, info(), u64::MAX).expect_err(what);
        e.to_string()
    };
    // Not before the gap.
    let e = refused(early(r, read, back, read, None), "at the gap's start");
    assert!(
        e.contains("is its own: leave `copy_out_after` unset"),
        "{e}"
    );
    // Not for a recomputation.
    let mut recompute = early(r, read, back, made, None);
    recompute.how = Restore::Recompute;
    recompute.prefetch_after = None;
    let e = refused(recompute, "a recomputation");
    assert!(e.contains("needs a swap gap"), "{e}");
    // Not before the tensor is made.
    let e = refused(early(r, read, back, made - 1, None), "before it is made");
    assert!(e.contains("where it is not resident"), "{e}");
    // Not across a write: a weight copied out before its update and off the
    // device from the update to the iteration's end would be saved stale.
    let w = g
        .tensors
        .iter()
        .find(|t| t.kind == TensorKind::Parameter && t.name.contains("head") && t.shape.len() == 2)
        .expect("head weight")
        .id;
    let update = *uses[w.index()].last().expect("used");
    let e = refused(
        Gap {
            tensor: w,
            after: Some(update),
            before: None,
            how: Restore::Swap,
            prefetch_after: None,
            reclaim_before: None,
            copy_out_after: Some(0),
        },
        "across the update",
    );
    assert!(e.contains(&format!("written at position {update}")), "{e}");
}

/// A swap of `t` over `(after, before)` whose copy-out is delayed to after
/// `copy`, with no reclaim point, swapped in after `trigger`.
fn delayed(t: TensorId, after: usize, before: usize, copy: usize, trigger: usize) -> Gap {
    Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(trigger),
        reclaim_before: None,
        copy_out_after: Some(copy),
    }
}

/// `r` leaves after its forward read at `read` and comes back for the
/// backward pass at `back`; its copy-out is delayed to after `read + 1`.
#[test]
fn a_delayed_copy_out_leaves_after_the_op_it_names_behind_the_copies_there() {
    let (g, r) = two_layers();
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let u = &uses[r.index()];
    let (read, back) = (u[1], u[2]);
    assert!(read + 2 < back, "{u:?}");
    s.gaps.push(delayed(r, read, back, read + 1, read + 1));
    let plan = lower_schedule(&g, &s, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let d2h = &plan.streams[Stream::D2h.index()];
    let [copy] = steps(&plan, Stream::D2h, &Instr::SwapOut(r))[..] else {
        panic!("one copy-out of r");
    };
    // The copy waits for the op it names, not for r's last read, and the
    // free follows it on the d2h stream.
    assert_eq!(
        d2h[copy.index as usize].waits,
        vec![compute_step(&plan, &s, read + 1)]
    );
    assert_eq!(d2h[copy.index as usize + 1].instr, Instr::Free(r));
    // The compute stream frees r only at its final free, after its backward use.
    let at_back = compute_step(&plan, &s, back).index;
    assert!(
        steps(&plan, Stream::Compute, &Instr::Free(r))
            .iter()
            .all(|f| f.index > at_back)
    );
    // The swap-in, triggered at the same op, waits for that free.
    let [back_in] = steps(&plan, Stream::H2d, &Instr::SwapIn(r))[..] else {
        panic!("one swap-in of r");
    };
    let free = StepRef {
        stream: Stream::D2h,
        index: copy.index + 1,
    };
    assert!(
        plan.streams[Stream::H2d.index()][back_in.index as usize]
            .waits
            .contains(&free)
    );

    // Another tensor's gap that starts where r's delayed copy is issued
    // copies out first (a gap's own start goes before the delayed copies
    // there): any activation or gradient used at some `p` after r's read
    // with its next use more than one op later, while r is still in its gap.
    let (x, p, next) = g
        .tensors
        .iter()
        .map(|t| t.id)
        .filter(|&t| t != r && g.storage_owner(t) == t)
        // Made on the device, so its copy-out is not skipped as redundant.
        .filter(|&t| {
            matches!(
                g.tensors[t.index()].kind,
                TensorKind::Activation | TensorKind::Gradient
            )
        })
        .find_map(|t| {
            let ut = &uses[t.index()];
            ut.windows(2)
                .find(|w| w[0] > read && w[0] + 1 < w[1] && w[0] + 1 < back)
                .map(|w| (t, w[0], w[1]))
        })
        .expect("an owner with a gap inside r's");
    let mut both = Schedule::in_graph_order(&g);
    both.gaps.push(delayed(r, read, back, p, p));
    both.gaps.push(Gap {
        tensor: x,
        after: Some(p),
        before: Some(next),
        how: Restore::Swap,
        prefetch_after: None,
        reclaim_before: None,
        copy_out_after: None,
    });
    let plan = lower_schedule(&g, &both, info(), u64::MAX).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let outs: Vec<Instr> = plan.streams[Stream::D2h.index()]
        .iter()
        .map(|st| st.instr.clone())
        .filter(|i| matches!(i, Instr::SwapOut(_)))
        .collect();
    assert_eq!(outs, vec![Instr::SwapOut(x), Instr::SwapOut(r)]);
}

#[test]
fn a_delayed_copy_out_past_its_reclaim_point_end_or_trigger_is_a_schedule_error() {
    let (g, r) = two_layers();
    let s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let u = &uses[r.index()];
    let (read, back) = (u[1], u[2]);
    let refused = |gap: Gap, what: &str| {
        let mut bad = s.clone();
        bad.gaps.push(gap);
        let e = lower_schedule(&g, &bad, info(), u64::MAX).expect_err(what);
        e.to_string()
    };
    // At or past the reclaim point: the op there would wait for a free
    // issued after it.
    let mut gap = delayed(r, read, back, read + 2, read + 2);
    gap.reclaim_before = Some(read + 2);
    let e = refused(gap, "at the reclaim point");
    assert!(e.contains(&format!("positions up to {}", read + 1)), "{e}");
    // At the gap's end.
    let e = refused(delayed(r, read, back, back, back - 1), "at the end");
    assert!(e.contains("before the gap's end"), "{e}");
    // After the swap-in's trigger, or with none given (the swap-in would be
    // triggered at the gap's start, before the free).
    let e = refused(
        delayed(r, read, back, read + 2, read + 1),
        "after the trigger",
    );
    assert!(
        e.contains(&format!("trigger the swap-in at or after {}", read + 2)),
        "{e}"
    );
    let mut untriggered = delayed(r, read, back, read + 1, read + 1);
    untriggered.prefetch_after = None;
    let e = refused(untriggered, "no trigger");
    assert!(e.contains("comes after its swap-in's trigger"), "{e}");
    // Not for a recomputation.
    let mut recompute = delayed(r, read, back, read + 1, read + 1);
    recompute.how = Restore::Recompute;
    recompute.prefetch_after = None;
    let e = refused(recompute, "a recomputation");
    assert!(e.contains("needs a swap gap"), "{e}");
}
