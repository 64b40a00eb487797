//! Compute orders other than the graph's own: which orders are valid (every
//! operand produced before it is read, and in-place updates kept in place
//! relative to every other access of the storage they write), a check, a
//! seeded random valid order for tests and searches, and the eager-update
//! order that planners try beside the graph's.

use crate::lower::uses_by_owner;
use crate::schedule::ScheduleError;
use outcore_graph::{Graph, OpId};

/// For every op, the ops that must run before it: the producers of its inputs
/// (through views, the view ops themselves), and for storage written in place,
/// every access between two writes stays between them (an access before a
/// write in graph order stays before it, one after stays after).
pub fn order_predecessors(graph: &Graph) -> Vec<Vec<OpId>> {
    let mut preds: Vec<Vec<OpId>> = vec![Vec::new(); graph.ops.len()];
    for op in &graph.ops {
        for &t in &op.inputs {
            if let Some(p) = graph.tensor(t).producer
                && p != op.id
                && !preds[op.id.index()].contains(&p)
            {
                preds[op.id.index()].push(p);
            }
        }
    }
    let mut writes_owner: Vec<Vec<OpId>> = vec![Vec::new(); graph.tensors.len()];
    for op in &graph.ops {
        for &o in &op.outputs {
            if let Some(target) = graph.tensor(o).inplace_update_of {
                writes_owner[graph.storage_owner(target).index()].push(op.id);
            }
        }
    }
    let uses = uses_by_owner(graph);
    for (owner, writers) in writes_owner.iter().enumerate() {
        if writers.is_empty() {
            continue;
        }
        // Accesses in graph order; each write orders the accesses since the
        // previous write before it and those up to the next write after it.
        let mut since_write: Vec<OpId> = Vec::new();
        let mut last_write: Option<OpId> = None;
        for &u in &uses[owner] {
            if writers.contains(&u) {
                for &a in since_write.iter().chain(last_write.iter()) {
                    if a != u && !preds[u.index()].contains(&a) {
                        preds[u.index()].push(a);
                    }
                }
                since_write.clear();
                last_write = Some(u);
            } else {
                if let Some(w) = last_write
                    && !preds[u.index()].contains(&w)
                {
                    preds[u.index()].push(w);
                }
                since_write.push(u);
            }
        }
    }
    preds
}

/// The inverse of [`order_predecessors`]: for every op, the ops that wait
/// for it (what Kahn's algorithm releases when it runs).
fn successors(preds: &[Vec<OpId>]) -> Vec<Vec<OpId>> {
    let mut succs: Vec<Vec<OpId>> = vec![Vec::new(); preds.len()];
    for (op, ps) in preds.iter().enumerate() {
        for &p in ps {
            succs[p.index()].push(OpId(op as u32));
        }
    }
    succs
}

/// Checks that `order` lists every op of `graph` once and respects
/// [`order_predecessors`]; the error names the first offending op.
pub fn check_order(graph: &Graph, order: &[OpId]) -> Result<(), ScheduleError> {
    let n = graph.ops.len();
    if order.len() != n {
        return Err(ScheduleError {
            reason: format!("the order has {} ops but the graph {n}", order.len()),
        });
    }
    let mut position: Vec<Option<usize>> = vec![None; n];
    for (pos, &op) in order.iter().enumerate() {
        match position.get_mut(op.index()) {
            Some(slot @ None) => *slot = Some(pos),
            _ => {
                return Err(ScheduleError {
                    reason: format!("{op} is missing from the graph or listed twice in the order"),
                });
            }
        }
    }
    let preds = order_predecessors(graph);
    for (pos, &op) in order.iter().enumerate() {
        for &p in &preds[op.index()] {
            if position[p.index()].is_none_or(|q| q > pos) {
                return Err(ScheduleError {
                    reason: format!(
                        "op `{}` ({op}) is at position {pos}, before `{}` ({p}), which it depends on",
                        graph.op(op).name,
                        graph.op(p).name
                    ),
                });
            }
        }
    }
    Ok(())
}

/// A valid order drawn at random (Kahn's algorithm picking uniformly among the
/// ready ops with a SplitMix64 stream): the same seed gives the same order.
pub fn random_topological_order(graph: &Graph, seed: u64) -> Vec<OpId> {
    let preds = order_predecessors(graph);
    let n = graph.ops.len();
    let mut missing: Vec<usize> = preds.iter().map(Vec::len).collect();
    let succs = successors(&preds);
    let mut ready: Vec<OpId> = (0..n)
        .filter(|&i| missing[i] == 0)
        .map(|i| OpId(i as u32))
        .collect();
    let mut state = seed;
    let mut order = Vec::with_capacity(n);
    while !ready.is_empty() {
        let pick = (splitmix64(&mut state) % ready.len() as u64) as usize;
        let op = ready.swap_remove(pick);
        order.push(op);
        for &s in &succs[op.index()] {
            missing[s.index()] -= 1;
            if missing[s.index()] == 0 {
                ready.push(s);
            }
        }
    }
    order
}

/// The order a dataflow framework runs the graph in when it indexes it by a
/// post-order depth-first visit from its outputs: nnvm's `IndexedGraph`,
/// and so MXNet's executor, the "default schedule" of SwapAdvisor (paper
/// 000, Sec. 6.2 and 6.4). The outputs are the ops nothing waits for, in
/// the graph's order; each op's predecessors are visited in the order
/// [`order_predecessors`] lists them (its inputs' producers in input
/// order, then the ordering of in-place writes), each emitted after all of
/// its own.
///
/// Why it matters: where a loss reads every time step of an unrolled RNN,
/// the visit from the loss reaches the first time step of every layer
/// before the second time step of any, so the order interleaves the layers
/// and every layer's weights are wanted at every step, which the paper
/// names as the reason its ablation without a schedule search reaches 7%
/// of the full search on RNN-8-8K.
pub fn framework_default_order(graph: &Graph) -> Vec<OpId> {
    let preds = order_predecessors(graph);
    let n = preds.len();
    let mut waited_for = vec![false; n];
    for p in preds.iter().flatten() {
        waited_for[p.index()] = true;
    }
    let mut visited = vec![false; n];
    let mut order = Vec::with_capacity(n);
    // (op, index of the next predecessor to visit)
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in (0..n).filter(|&i| !waited_for[i]) {
        visited[root] = true;
        stack.push((root, 0));
        while let Some((op, next)) = stack.last_mut() {
            match preds[*op].get(*next) {
                Some(p) => {
                    *next += 1;
                    if !visited[p.index()] {
                        visited[p.index()] = true;
                        stack.push((p.index(), 0));
                    }
                }
                None => {
                    order.push(OpId(*op as u32));
                    stack.pop();
                }
            }
        }
    }
    order
}

/// One step of SplitMix64 (Steele et al. 2014): enough randomness for orders,
/// with no dependency.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1330_11EB);
    z ^ (z >> 31)
}

/// The graph's order with every optimizer op that depends on the backward
/// pass moved as early as its dependencies allow: Kahn's algorithm that takes
/// a ready optimizer op first and otherwise the ready op earliest in the
/// graph's order (ties between optimizer ops: the earliest in the graph's
/// order). An optimizer op that depends on no backward op, directly or
/// through others (SGD's `momentum_buffer * momentum`, Adam's
/// `exp_avg.mul_(beta1)` in an exported graph), then moves to just before
/// the first op that must follow it (`defer_gradient_free`).
///
/// Why: a graph lists the optimizer step after the whole backward pass, so
/// every parameter's gradient is live at once at its end (as many bytes as the
/// parameters). Updating each parameter as soon as its gradient is complete
/// (as PyTorch's `register_post_accumulate_grad_hook` optimizers do) frees
/// the gradient at once, and the optimizer state is touched while the
/// backward pass is still running, so a planner can swap it behind compute
/// instead of after it. The values computed are the same: the update reads
/// the same versions ([`order_predecessors`] keeps every access of an
/// updated storage on its side of the update).
pub fn eager_update_order(graph: &Graph) -> Vec<OpId> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let preds = order_predecessors(graph);
    let n = graph.ops.len();
    let mut missing: Vec<usize> = preds.iter().map(Vec::len).collect();
    let succs = successors(&preds);
    let key = |i: usize| {
        let optimizer = graph.ops[i].phase == outcore_graph::Phase::Optimizer;
        Reverse((!optimizer, i))
    };
    let mut ready: BinaryHeap<Reverse<(bool, usize)>> =
        (0..n).filter(|&i| missing[i] == 0).map(key).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse((_, i))) = ready.pop() {
        order.push(OpId(i as u32));
        for &s in &succs[i] {
            missing[s.index()] -= 1;
            if missing[s.index()] == 0 {
                ready.push(key(s.index()));
            }
        }
    }
    defer_gradient_free(graph, &preds, &succs, order)
}

/// `order` (a valid order) with each optimizer op that depends on no backward
/// op moved to just before its earliest successor (or left where it is if it
/// has none).
///
/// Why: taken "as early as possible", such an op runs at the very start of
/// the iteration, before the forward pass, and holds its optimizer state (and
/// any new tensor it makes) on the device from there to the update that
/// reads it. On the PyTorch VGG-16 b32 export (out-of-place SGD momentum)
/// `classifier.0.weight.momentum_buffer * 0.9` made a 392 MiB tensor at
/// position 26 that lived to position 126, which DTR may not evict; a
/// streamed seed could then not keep that buffer on the host.
///
/// Moving an op later keeps every predecessor before it; placing it before
/// its earliest successor keeps every successor after it. The ops are moved
/// last first, so a chain of such ops keeps its order.
fn defer_gradient_free(
    graph: &Graph,
    preds: &[Vec<OpId>],
    succs: &[Vec<OpId>],
    order: Vec<OpId>,
) -> Vec<OpId> {
    use outcore_graph::Phase;
    let n = order.len();
    // After the backward pass begins, in dependence: `order` is topological.
    let mut after_backward = vec![false; n];
    for &op in &order {
        let i = op.index();
        after_backward[i] = graph.ops[i].phase == Phase::Backward
            || preds[i].iter().any(|p| after_backward[p.index()]);
    }
    let deferred: Vec<OpId> = order
        .iter()
        .copied()
        .filter(|op| {
            let i = op.index();
            graph.ops[i].phase == Phase::Optimizer && !after_backward[i] && !succs[i].is_empty()
        })
        .collect();
    move_before_successors(order, &deferred, succs)
}

/// `order` (a valid order of `graph`) with each op of `deferred` moved to
/// just before its earliest successor (to the end if it has none), keeping
/// the order valid: moving an op later keeps every predecessor before it,
/// and placing it before its earliest successor keeps every successor after
/// it. `outcore`'s start from the bound's program runs the ops the program
/// places after its cut this way.
pub fn defer_ops(graph: &Graph, order: &[OpId], deferred: &[OpId]) -> Vec<OpId> {
    let succs = successors(&order_predecessors(graph));
    let mut position = vec![usize::MAX; graph.ops.len()];
    for (i, op) in order.iter().enumerate() {
        position[op.index()] = i;
    }
    let mut deferred: Vec<OpId> = deferred
        .iter()
        .copied()
        .filter(|op| position.get(op.index()).is_some_and(|&p| p != usize::MAX))
        .collect();
    deferred.sort_unstable_by_key(|op| position[op.index()]);
    deferred.dedup();
    move_before_successors(order.to_vec(), &deferred, &succs)
}

/// The ops of `deferred` (in `order`'s order) moved as [`defer_ops`] says:
/// the others keep their order; each deferred op, last first, is put in
/// front of its earliest successor (successors that are themselves deferred
/// are already placed), so a chain of them keeps its order.
fn move_before_successors(order: Vec<OpId>, deferred: &[OpId], succs: &[Vec<OpId>]) -> Vec<OpId> {
    if deferred.is_empty() {
        return order;
    }
    let mut is_deferred = vec![false; succs.len()];
    for op in deferred {
        is_deferred[op.index()] = true;
    }
    let mut placed: Vec<OpId> = order
        .iter()
        .copied()
        .filter(|op| !is_deferred[op.index()])
        .collect();
    for &op in deferred.iter().rev() {
        let at = placed
            .iter()
            .position(|q| succs[op.index()].contains(q))
            .unwrap_or(placed.len());
        placed.insert(at, op);
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> Graph {
        use outcore_graph::builder::{GraphBuilder, Optimizer};
        let mut b = GraphBuilder::new("order", 4, outcore_graph::DType::Float32);
        let x = b.input("x", &[4, 16]);
        let a = b.linear("a", x, 16, true);
        let c = b.linear("c", x, 16, true);
        let s = b.add(&[a, c]);
        let labels = b.label("labels", &[4]);
        let loss = b.softmax_cross_entropy(s, labels);
        b.finish(
            loss,
            Optimizer::Sgd {
                lr: 0.1,
                momentum: 0.9,
                weight_decay: 0.0,
            },
        )
        .expect("valid graph")
    }

    fn lstm(layers: u64, seq: u64) -> Graph {
        let knobs = [("layers", layers), ("hidden", 16), ("seq", seq)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        outcore_graph::zoo::build("lstm", Some(2), &knobs, None).expect("zoo model")
    }

    fn position(g: &Graph, order: &[OpId], name: &str) -> usize {
        order
            .iter()
            .position(|&op| g.op(op).name == name)
            .unwrap_or_else(|| panic!("no op `{name}`"))
    }

    /// Every op once, each after its predecessors, on the test graph, a
    /// CNN and an unrolled LSTM; the same order each time.
    #[test]
    fn the_framework_order_is_a_valid_order() {
        let cnn = outcore_graph::zoo::build("resnet18", Some(2), &Default::default(), None)
            .expect("zoo model");
        for g in [graph(), cnn, lstm(3, 4)] {
            let order = framework_default_order(&g);
            assert_eq!(order.len(), g.ops.len());
            assert_eq!(check_order(&g, &order), Ok(()));
            assert_eq!(order, framework_default_order(&g));
        }
    }

    /// The zoo LSTM is built layer by layer, and its loss reads the top
    /// layer's output at every step (concatenated, step 0 first). The visit
    /// from the loss reaches step 0 of the top layer first, whose input is
    /// step 0 of the layer below, down to layer 0: so step 0 of every layer
    /// is emitted before step 1 of any (the interleaving SwapAdvisor's Sec.
    /// 6.2 describes for MXNet's default schedule); the graph's own order
    /// runs all of layer 0's steps before layer 1's.
    #[test]
    fn the_framework_order_interleaves_an_unrolled_rnns_layers() {
        let g = lstm(2, 3);
        let graph_order: Vec<OpId> = g.ops.iter().map(|o| o.id).collect();
        let order = framework_default_order(&g);
        for (t0, t1) in [("rnn.l1.t0", "rnn.l0.t1"), ("rnn.l1.t1", "rnn.l0.t2")] {
            assert!(
                position(&g, &order, t0) < position(&g, &order, t1),
                "{t0} after {t1}"
            );
            assert!(position(&g, &graph_order, t0) > position(&g, &graph_order, t1));
        }
    }

    #[test]
    fn random_orders_are_valid_and_some_differ_from_the_graph_order() {
        let g = graph();
        let graph_order: Vec<OpId> = g.ops.iter().map(|o| o.id).collect();
        assert_eq!(check_order(&g, &graph_order), Ok(()));
        let mut differs = false;
        for seed in 0..20 {
            let order = random_topological_order(&g, seed);
            assert_eq!(check_order(&g, &order), Ok(()), "seed {seed}");
            assert_eq!(order, random_topological_order(&g, seed));
            differs |= order != graph_order;
        }
        assert!(differs, "twenty seeds all gave the graph order");
    }

    #[test]
    fn a_reversed_order_is_rejected_with_the_op_named() {
        let g = graph();
        let reversed: Vec<OpId> = g.ops.iter().rev().map(|o| o.id).collect();
        let e = check_order(&g, &reversed).expect_err("reversed is invalid");
        assert!(e.reason.contains("depends on"), "{}", e.reason);
        let short: Vec<OpId> = g.ops.iter().skip(1).map(|o| o.id).collect();
        assert!(check_order(&g, &short).is_err());
    }

    #[test]
    fn eager_updates_follow_their_last_dependency_and_the_rest_keeps_its_order() {
        let g = graph();
        let order = eager_update_order(&g);
        assert_eq!(check_order(&g, &order), Ok(()));
        let preds = order_predecessors(&g);
        let mut position = vec![0; g.ops.len()];
        for (p, op) in order.iter().enumerate() {
            position[op.index()] = p;
        }
        let mut moved = false;
        for op in &g.ops {
            if op.phase != outcore_graph::Phase::Optimizer {
                continue;
            }
            // Right after its latest dependency, or after other optimizer ops
            // that became ready with it.
            let latest = preds[op.id.index()]
                .iter()
                .map(|p| position[p.index()])
                .max()
                .expect("an update depends on its gradient");
            for between in &order[latest + 1..position[op.id.index()]] {
                assert_eq!(
                    g.op(*between).phase,
                    outcore_graph::Phase::Optimizer,
                    "`{}` waits behind `{}`",
                    op.name,
                    g.op(*between).name
                );
            }
            moved |= position[op.id.index()] < op.id.index();
        }
        assert!(moved, "no update moved earlier: {order:?}");
        // The other ops keep the graph's relative order.
        let others: Vec<OpId> = order
            .iter()
            .copied()
            .filter(|&o| g.op(o).phase != outcore_graph::Phase::Optimizer)
            .collect();
        let mut sorted = others.clone();
        sorted.sort();
        assert_eq!(others, sorted);
    }

    /// In the PyTorch VGG-16 export (SGD with momentum, out of place),
    /// `momentum_buffer * 0.9` depends on no backward op: it runs right
    /// before the update op that reads its product, not at the start.
    #[test]
    fn gradient_free_updates_run_just_before_their_readers() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../graph/tests/data/vgg16_b32.json"
        );
        let g = outcore_graph::format::load_graph_file(std::path::Path::new(path))
            .expect("the repository's VGG-16 export");
        let order = eager_update_order(&g);
        assert_eq!(check_order(&g, &order), Ok(()));
        let mut position = vec![0usize; g.ops.len()];
        for (i, op) in order.iter().enumerate() {
            position[op.index()] = i;
        }
        let first_backward = g
            .ops
            .iter()
            .filter(|o| o.phase == outcore_graph::Phase::Backward)
            .map(|o| position[o.id.index()])
            .min()
            .expect("a backward pass");
        let succs = successors(&order_predecessors(&g));
        let mut checked = 0;
        for op in g.ops.iter().filter(|o| {
            o.phase == outcore_graph::Phase::Optimizer
                && o.inputs
                    .iter()
                    .all(|&t| g.tensor(t).name.ends_with("momentum_buffer"))
        }) {
            let p = position[op.id.index()];
            assert!(p > first_backward, "`{}` at {p}", op.name);
            let next = order[p + 1];
            assert!(succs[op.id.index()].contains(&next), "`{}`", op.name);
            checked += 1;
        }
        assert_eq!(checked, 32, "one momentum product per parameter");
    }
}
