//! The `offsets` layout: laid-out plans verify, and every kind of corrupted
//! layout is rejected by `verify()` with a `Layout` violation.

mod common;

use common::{info, swap_everything};
use outcore_graph::{Graph, TensorKind, footprint, zoo};
use outcore_plan::{
    AllocatorSpec, Gap, Plan, Restore, Schedule, ViolationKind, lay_out, lower_in_order,
    lower_schedule, use_positions, verify,
};

/// Swaps every activation whose uses are more than `min_distance` positions
/// apart: tensors leave and come back, so owners are allocated several times
/// per iteration.
fn swapping_plan(g: &Graph, min_distance: usize) -> Plan {
    lower_schedule(g, &swap_everything(g, min_distance), info(), footprint(g).0).expect("lowers")
}

fn laid_out(mut plan: Plan, g: &Graph) -> Plan {
    let layout = lay_out(&plan, g).expect("the plan verifies");
    assert!(
        layout.config.height_bytes <= plan.budget_bytes,
        "{}: layout {} over budget {}",
        g.meta.model,
        layout.config.height_bytes,
        plan.budget_bytes
    );
    plan.allocator = AllocatorSpec::Offsets(layout.config);
    plan
}

fn layout_violation(plan: &Plan, g: &Graph) -> String {
    let v = verify(plan, g);
    match v.first().map(|v| &v.kind) {
        Some(ViolationKind::Layout { reason }) => reason.clone(),
        other => panic!(
            "{}: expected a layout violation, got {other:?}",
            g.meta.model
        ),
    }
}

fn offsets_mut(plan: &mut Plan) -> &mut outcore_alloc::OffsetsConfig {
    match &mut plan.allocator {
        AllocatorSpec::Offsets(c) => c,
        _ => unreachable!("laid out above"),
    }
}

#[test]
fn laid_out_plans_verify_and_share_bytes() {
    for name in ["resnet18", "mobilenet_v2", "tiny-cnn", "lstm"] {
        let g = zoo::build(name, Some(2), &Default::default(), None).expect("zoo");
        let plan = laid_out(swapping_plan(&g, 3), &g);
        let v = verify(&plan, &g);
        assert!(v.is_empty(), "{name}: {}", v[0]);
        let c = match &plan.allocator {
            AllocatorSpec::Offsets(c) => c,
            _ => unreachable!(),
        };
        // Some owner is allocated more than once per iteration (it was
        // swapped), and the layout reuses bytes: its height is below the sum
        // of every allocation's slot.
        assert!(
            c.owners.iter().any(|o| o.offsets_bytes.len() >= 2),
            "{name}"
        );
        let summed: u64 = c
            .owners
            .iter()
            .map(|o| o.size_bytes * (o.offsets_bytes.len() as u64).max(1))
            .sum();
        assert!(
            c.height_bytes < summed,
            "{name}: {} vs {summed}",
            c.height_bytes
        );
    }
}

#[test]
fn every_allocation_at_offset_zero_is_rejected() {
    let g = zoo::build("tiny-cnn", Some(2), &Default::default(), None).expect("zoo");
    let mut plan = laid_out(swapping_plan(&g, 3), &g);
    for o in &mut offsets_mut(&mut plan).owners {
        o.initial_offset_bytes = o.initial_offset_bytes.map(|_| 0);
        o.offsets_bytes.iter_mut().for_each(|x| *x = 0);
    }
    let reason = layout_violation(&plan, &g);
    assert!(
        reason.contains("may be resident at once at overlapping addresses"),
        "{reason}"
    );
}

#[test]
fn a_missing_owner_a_short_slot_and_a_wrong_count_are_rejected() {
    let g = zoo::build("tiny-cnn", Some(2), &Default::default(), None).expect("zoo");
    let plan = laid_out(swapping_plan(&g, 3), &g);

    let mut missing = plan.clone();
    let gone = offsets_mut(&mut missing).owners.remove(0).id;
    let reason = layout_violation(&missing, &g);
    assert!(
        reason.contains(&format!("allocation {gone} is not in the layout")),
        "{reason}"
    );

    let mut short = plan.clone();
    let o = offsets_mut(&mut short)
        .owners
        .iter_mut()
        .find(|o| o.size_bytes > 512)
        .expect("a tensor above 512 bytes");
    o.size_bytes -= 512;
    let reason = layout_violation(&short, &g);
    assert!(reason.contains("the layout reserves"), "{reason}");

    let mut count = plan.clone();
    let o = offsets_mut(&mut count)
        .owners
        .iter_mut()
        .find(|o| o.offsets_bytes.len() >= 2)
        .expect("a swapped tensor");
    o.offsets_bytes.pop();
    let reason = layout_violation(&count, &g);
    assert!(reason.contains("time(s) per iteration"), "{reason}");
}

#[test]
fn a_layout_past_the_budget_is_rejected() {
    let g = zoo::build("tiny-cnn", Some(2), &Default::default(), None).expect("zoo");
    let mut plan = laid_out(swapping_plan(&g, 3), &g);
    let height = offsets_mut(&mut plan).height_bytes;
    plan.budget_bytes = height - 1;
    let v = verify(&plan, &g);
    // Either the plan's own bound or the layout is over the smaller budget.
    assert!(
        v.iter().any(|v| matches!(
            &v.kind,
            ViolationKind::OverBudget { .. } | ViolationKind::Layout { .. }
        )),
        "{v:?}"
    );
}

#[test]
fn a_parameter_that_leaves_and_returns_ends_where_it_started() {
    // Offload the largest parameter between its uses (it starts and ends the
    // iteration on the device): its first and last buffers are one slot.
    let g = zoo::build("mlp", Some(4), &Default::default(), None).expect("zoo");
    let mut s = Schedule::in_graph_order(&g);
    let uses = use_positions(&g, &s.order);
    let p = g
        .tensors
        .iter()
        .filter(|t| t.kind == TensorKind::Parameter && t.allocates())
        .filter(|t| {
            uses[t.id.index()].len() >= 2 && uses[t.id.index()][1] > uses[t.id.index()][0] + 1
        })
        .max_by_key(|t| t.size_bytes)
        .expect("a parameter used twice, apart");
    let u = &uses[p.id.index()];
    let (a, b) = (u[0], u[1]);
    s.gaps.push(Gap {
        tensor: p.id,
        after: Some(a),
        before: Some(b),
        how: Restore::Swap,
        prefetch_after: Some(b - 1),
        reclaim_before: Some(a + 1),
        copy_out_after: None,
    });
    // 1% above the footprint: the layout rounds each of mlp's few buffers
    // up to 512 bytes.
    let plan = lower_schedule(&g, &s, info(), footprint(&g).0 * 101 / 100).expect("lowers");
    let v = verify(&plan, &g);
    assert!(v.is_empty(), "{}", v[0]);
    let mut plan = laid_out(plan, &g);
    assert!(verify(&plan, &g).is_empty());
    let o = offsets_mut(&mut plan)
        .owners
        .iter_mut()
        .find(|o| o.id == p.id.0 as u64)
        .expect("the parameter is laid out");
    assert_eq!(o.initial_offset_bytes, o.offsets_bytes.last().copied());
    // Move its last place elsewhere: the next iteration would not find it.
    *o.offsets_bytes.last_mut().expect("returns") += 512;
    let reason = layout_violation(&plan, &g);
    assert!(
        reason.contains("ends the iteration at another offset"),
        "{reason}"
    );
}

#[test]
fn the_plan_with_nothing_moved_is_laid_out_at_about_its_bound() {
    let g = zoo::build("resnet18", Some(2), &Default::default(), None).expect("zoo");
    let plan = lower_in_order(&g, info(), footprint(&g).0);
    let layout = lay_out(&plan, &g).expect("verifies");
    // Greedy by size on a plan that frees in order: within 10% of the bound
    // (the bound itself can over-count buffers of different streams).
    let ratio = layout.overhead();
    assert!((0.9..=1.1).contains(&ratio), "{ratio}");
}
