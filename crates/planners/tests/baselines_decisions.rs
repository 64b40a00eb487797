//! The characteristic decision of each baseline planner, on small hand graphs:
//! vdnn-conv offloads only convolution inputs, checkpoint-sqrt keeps about
//! sqrt(n) boundaries, SuperNeurons recomputes cheap layers and swaps convolution
//! outputs, LMS swaps nothing whose next use is within its threshold.

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, OpClass, OpId, Phase, TensorId, footprint};
use outcore_plan::{
    Instr, PlanOutcome, PlanRequest, Planner, Restore, Stream, random_topological_order, verify,
};
use outcore_planners::checkpoint::{self, CutChoice, Segmentation};
use outcore_planners::framework::{Ctx, graph_order};
use outcore_planners::{Checkpoint, Lms, LmsKnobs, SuperNeurons, Vdnn, VdnnScope, is_cheap};

fn cost() -> RooflineModel {
    RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"))
}

/// conv -> bn -> relu -> maxpool -> conv -> relu -> pool -> linear -> loss.
fn small_cnn() -> Graph {
    let mut b = GraphBuilder::new("hand-cnn", 8, DType::Float32);
    let x = b.input("x", &[8, 3, 32, 32]);
    let labels = b.label("labels", &[8]);
    let c1 = b.conv2d("conv1", x, 16, 3, 1, 1);
    let n1 = b.batch_norm("bn1", c1);
    let r1 = b.relu(n1);
    let p1 = b.max_pool2d(r1, 2, 2, 0, false);
    let c2 = b.conv2d("conv2", p1, 32, 3, 1, 1);
    let r2 = b.relu(c2);
    let g = b.global_avg_pool(r2);
    let f = b.flatten(g);
    let logits = b.linear("fc", f, 10, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, Optimizer::None).expect("valid graph")
}

fn request<'a>(
    g: &'a Graph,
    cost: &'a RooflineModel,
    budget_bytes: u64,
    order: &'a [OpId],
) -> PlanRequest<'a> {
    PlanRequest {
        order: Some(order),
        ..PlanRequest::new(g, cost, budget_bytes)
    }
}

/// The graph's order and the first seeded random topological order that
/// differs from it (the graph order again when no other exists).
fn orders(g: &Graph) -> Vec<Vec<OpId>> {
    let own = graph_order(g);
    let other = (1..50)
        .map(|seed| random_topological_order(g, seed))
        .find(|o| *o != own)
        .unwrap_or_else(|| own.clone());
    vec![own, other]
}

/// The plan, failing the test on a planner error.
fn plan_of(planner: &dyn Planner, req: &PlanRequest<'_>) -> PlanOutcome {
    planner
        .plan(req)
        .unwrap_or_else(|e| panic!("{}: {e}", planner.name()))
}

/// Storage owners read by a forward convolution.
fn conv_inputs(g: &Graph) -> Vec<TensorId> {
    g.ops_in_phase(Phase::Forward)
        .filter(|o| o.kind.class() == OpClass::Convolution)
        .flat_map(|o| o.inputs.iter().map(|&t| g.storage_owner(t)))
        .collect()
}

#[test]
fn vdnn_conv_never_offloads_a_non_convolution_input() {
    let g = small_cnn();
    let cost = cost();
    for order in orders(&g) {
        vdnn_conv_on(&g, &cost, &order);
    }
}

fn vdnn_conv_on(g: &Graph, cost: &RooflineModel, order: &[OpId]) {
    let an = Ctx::new(g, cost, order.to_vec());
    let conv = Vdnn {
        scope: VdnnScope::Conv,
        overlapped: true,
    };
    let all = Vdnn {
        scope: VdnnScope::All,
        overlapped: true,
    };
    let conv_set = conv.offloaded(&an);
    let all_set = all.offloaded(&an);
    let inputs = conv_inputs(g);
    assert!(!conv_set.is_empty());
    for t in &conv_set {
        assert!(inputs.contains(t), "{t} is not a convolution input");
    }
    // vdnn-all offloads a superset, including non-convolution inputs.
    assert!(conv_set.iter().all(|t| all_set.contains(t)));
    assert!(all_set.iter().any(|t| !inputs.contains(t)));
    // And the lowered plan swaps nothing else, at any budget where it is feasible.
    let (footprint_bytes, _) = footprint(g);
    for budget_bytes in [footprint_bytes - 1, footprint_bytes * 3 / 4] {
        for overlapped in [true, false] {
            let planner = Vdnn {
                scope: VdnnScope::Conv,
                overlapped,
            };
            if let PlanOutcome::Feasible(plan) =
                plan_of(&planner, &request(g, cost, budget_bytes, order))
            {
                assert!(verify(&plan, g).is_empty());
                for step in plan.stream(Stream::H2d) {
                    if let Instr::SwapIn(t) = step.instr {
                        assert!(inputs.contains(&t), "{} swaps in {t}", planner.name());
                    }
                }
            }
        }
    }
}

/// A chain of `n` linear layers: each saves its input, so every other output can
/// be recomputed from the one before it.
fn linear_chain(n: usize) -> Graph {
    let mut b = GraphBuilder::new("chain", 4, DType::Float32);
    let mut x = b.input("x", &[4, 256]);
    let labels = b.label("labels", &[4]);
    for i in 0..n {
        x = b.linear(&format!("fc{i}"), x, 256, false);
    }
    let loss = b.softmax_cross_entropy(x, labels);
    b.finish(loss, Optimizer::None).expect("valid graph")
}

#[test]
fn checkpoint_sqrt_keeps_about_sqrt_n_boundaries() {
    let cost = cost();
    for layers in [9usize, 16, 30] {
        let g = linear_chain(layers);
        for order in orders(&g) {
            checkpoint_sqrt_on(&g, &cost, &order, layers);
        }
    }
}

fn checkpoint_sqrt_on(g: &Graph, cost: &RooflineModel, order: &[OpId], layers: usize) {
    let ctx = Ctx::new(g, cost, order.to_vec());
    let candidates = Checkpoint::candidates(&ctx);
    let n = candidates.len();
    let sqrt_n = (n as f64).sqrt();
    assert!(n >= layers - 1, "{n} candidates for {layers} layers");
    // A chain: every candidate is an articulation point.
    let cuts = checkpoint::cuts(&ctx);
    assert!(cuts.iter().all(|c| c.members.len() == 1));
    let len = (sqrt_n.round() as usize).max(2);
    let seg = Segmentation::sqrt(&ctx, &cuts, &candidates, len, CutChoice::First);
    assert!(
        (seg.boundaries.len() as f64 - sqrt_n).abs() <= 1.5,
        "{} boundaries for n = {n}",
        seg.boundaries.len()
    );
    let all = seg.droppable();
    let m = checkpoint::segment_gaps(&ctx, &seg, &all).expect("no op recomputed twice");
    for t in &seg.kept {
        assert!(m.gaps[t.index()].is_empty(), "boundary {t} was dropped");
    }
    let recomputed: Vec<_> = m.gaps.iter().flatten().collect();
    assert!(!recomputed.is_empty());
    assert!(recomputed.iter().all(|gap| gap.how == Restore::Recompute));
    // Each dropped tensor comes back once, at its segment's recompute position.
    for s in &seg.segments {
        for &t in &s.dropped {
            let gaps = &m.gaps[t.index()];
            assert_eq!(gaps.len(), 1, "{t}");
            assert_eq!(gaps[0].before, s.recompute_at);
        }
    }
    // Recomputing a prefix of the segments drops a subset.
    let some = checkpoint::segment_gaps(&ctx, &seg, &all[..all.len() / 2]).expect("once");
    assert!(some.gaps.iter().flatten().count() <= recomputed.len());
}

/// Cheap layers read the input batch (resident until the first convolution's
/// backward) and feed convolutions; a final convolution's output is saved by a
/// batch norm.
fn superneurons_graph() -> Graph {
    let mut b = GraphBuilder::new("hand-sn", 4, DType::Float32);
    let x = b.input("x", &[4, 8, 16, 16]);
    let labels = b.label("labels", &[4]);
    let c0 = b.conv2d("conv0", x, 8, 3, 1, 1);
    let n = b.batch_norm("bn", x);
    let c1 = b.conv2d("conv1", n, 8, 3, 1, 1);
    let r = b.relu(x);
    let c2 = b.conv2d("conv2", r, 8, 3, 1, 1);
    let p = b.max_pool2d(x, 3, 1, 1, false);
    let c3 = b.conv2d("conv3", p, 8, 3, 1, 1);
    let s = b.add(&[c0, c1, c2, c3]);
    let c4 = b.conv2d("conv4", s, 8, 3, 1, 1);
    let n4 = b.batch_norm("bn4", c4);
    let g = b.global_avg_pool(n4);
    let f = b.flatten(g);
    let logits = b.linear("fc", f, 10, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, Optimizer::None).expect("valid graph")
}

#[test]
fn superneurons_recomputes_cheap_layers_and_swaps_conv_outputs() {
    let g = superneurons_graph();
    let cost = cost();
    for order in orders(&g) {
        superneurons_on(&g, &cost, &order);
    }
}

fn superneurons_on(g: &Graph, cost: &RooflineModel, order: &[OpId]) {
    let an = Ctx::new(g, cost, order.to_vec());
    let d = SuperNeurons.decide(&an, 2);
    let kind_of = |t: TensorId| {
        g.tensor(t)
            .producer
            .map(|p| g.op(p).kind.clone())
            .expect("produced")
    };
    assert!(!d.swapped.is_empty());
    for &t in &d.swapped {
        assert_eq!(kind_of(t).class(), OpClass::Convolution, "{t}");
    }
    let labels: Vec<String> = d.recomputed.iter().map(|&t| kind_of(t).label()).collect();
    for want in ["batch_norm", "relu", "max_pool2d"] {
        assert!(
            labels.iter().any(|l| l == want),
            "no {want} output recomputed: {labels:?}"
        );
    }
    assert!(d.recomputed.iter().all(|&t| is_cheap(&kind_of(t))));
    // The plan at a tight budget verifies or explains itself.
    let (footprint_bytes, _) = footprint(g);
    match plan_of(
        &SuperNeurons,
        &request(g, cost, footprint_bytes * 9 / 10, order),
    ) {
        PlanOutcome::Feasible(plan) => assert!(verify(&plan, g).is_empty()),
        PlanOutcome::Infeasible(why) => {
            assert!(!why.message.is_empty());
            assert!(why.needed_bytes.is_none_or(|b| b > why.budget_bytes));
        }
    }
}

#[test]
fn lms_swaps_nothing_within_the_threshold() {
    let g = small_cnn();
    let cost = cost();
    for order in orders(&g) {
        lms_threshold_on(&g, &cost, &order);
    }
}

fn lms_threshold_on(g: &Graph, cost: &RooflineModel, order: &[OpId]) {
    let an = Ctx::new(g, cost, order.to_vec());
    for swapout_threshold_ops in [1usize, 4, 8, 16] {
        let knobs = LmsKnobs {
            swapout_threshold_ops,
            swapin_ahead_ops: 1,
            reclaim_lag_ops: 1,
        };
        let gaps = Lms.gaps(&an, knobs);
        for gap in gaps.iter().flatten() {
            let (Some(a), Some(b)) = (gap.after, gap.before) else {
                panic!("open gap on {}", gap.tensor);
            };
            assert!(
                b - a > swapout_threshold_ops,
                "{} swapped over {a}..{b}",
                gap.tensor
            );
            assert_eq!(gap.how, Restore::Swap);
        }
        // And every longer interval of an eligible tensor is swapped.
        for t in g
            .tensors
            .iter()
            .filter(|t| t.allocates() && !t.is_persistent() && !t.is_output)
        {
            let long = an.uses[t.id.index()]
                .windows(2)
                .filter(|w| w[1] - w[0] > swapout_threshold_ops)
                .count();
            assert_eq!(gaps[t.id.index()].len(), long, "{}", t.id);
        }
    }
}

#[test]
fn lms_tuning_is_deterministic_and_recorded() {
    let g = small_cnn();
    let cost = cost();
    let (footprint_bytes, _) = footprint(&g);
    for order in orders(&g) {
        let req = request(&g, &cost, footprint_bytes * 9 / 10, &order);
        match (plan_of(&Lms, &req), plan_of(&Lms, &req)) {
            (PlanOutcome::Feasible(a), PlanOutcome::Feasible(b)) => {
                assert_eq!(a, b);
                assert!(verify(&a, &g).is_empty());
                let threshold = a.planner.settings["swapout_threshold_ops"].as_u64();
                assert!(threshold.is_some(), "{}", a.planner.settings);
            }
            (PlanOutcome::Infeasible(a), PlanOutcome::Infeasible(b)) => {
                assert_eq!(a, b);
            }
            _ => panic!("two runs disagree"),
        }
    }
}

#[test]
fn at_full_budget_every_baseline_returns_the_none_plan() {
    let g = small_cnn();
    let cost = cost();
    let (footprint_bytes, _) = footprint(&g);
    let own = graph_order(&g);
    let req = request(&g, &cost, footprint_bytes, &own);
    let none = outcore_planners::by_name("none").expect("none");
    let PlanOutcome::Feasible(reference) = plan_of(none.as_ref(), &req) else {
        panic!("none is infeasible at the footprint");
    };
    for name in [
        "vdnn-all",
        "vdnn-conv",
        "vdnn-all-sync",
        "vdnn-conv-sync",
        "checkpoint-all",
        "checkpoint-sqrt",
        "checkpoint-greedy",
        "superneurons",
        "lms",
    ] {
        let planner = outcore_planners::by_name(name).expect("registered");
        let PlanOutcome::Feasible(plan) = plan_of(planner.as_ref(), &req) else {
            panic!("{name} is infeasible at the footprint");
        };
        assert_eq!(plan.streams, reference.streams, "{name}");
    }
}
