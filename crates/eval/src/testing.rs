//! Schedule generators for property tests and benchmarks: random training
//! DAGs, random topological orders, and schedules with swap and recompute gaps
//! that are valid by construction in any order. Public so that every crate's
//! tests and benchmarks draw from the same generators.

use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, OpId, TensorId, TensorKind};
/// Valid orders other than the graph's own (re-exported from `outcore_plan`).
pub use outcore_plan::random_topological_order;
use outcore_plan::{Gap, Restore, Schedule, use_positions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A random DAG of linear / relu / add / gelu layers over `[4, width]` tensors,
/// one layer per byte of `choices` (which also picks each layer's inputs),
/// trained with SGD and momentum.
pub fn random_graph(choices: &[u8], width: u64) -> Result<Graph, outcore_graph::GraphError> {
    random_graph_batch(choices, width, 4)
}

/// [`random_graph`] over `[batch, width]` tensors: a large batch makes the
/// activations, not the weights, dominate the footprint (what recomputation
/// planners need to have something to drop).
pub fn random_graph_batch(
    choices: &[u8],
    width: u64,
    batch: u64,
) -> Result<Graph, outcore_graph::GraphError> {
    let mut b = GraphBuilder::new("random", batch, DType::Float32);
    let x = b.input("x", &[batch, width]);
    let y = b.label("y", &[batch]);
    let mut pool = vec![b.linear("in", x, width, true)];
    for (i, &c) in choices.iter().enumerate() {
        let pick = |k: u8| pool[(k as usize) % pool.len()];
        let t = match c % 4 {
            0 => b.linear(&format!("fc{i}"), pick(c / 4), width, c % 8 == 0),
            1 => b.relu(pick(c / 4)),
            2 => {
                let (a, z) = (pick(c / 4), pick(c / 16 + 1));
                if a == z { b.relu(a) } else { b.add(&[a, z]) }
            }
            _ => b.gelu(pick(c / 4)),
        };
        pool.push(t);
    }
    let last = *pool.last().unwrap_or(&x);
    let logits = b.linear("head", last, 10, true);
    let loss = b.softmax_cross_entropy(logits, y);
    b.finish(loss, Optimizer::sgd_momentum())
}

/// Swap and recompute gaps over `order`, chosen by `decisions` (cycled): every
/// activation whose consecutive uses are at least two positions apart is kept,
/// swapped (with a prefetch trigger and reclaim point drawn from the decision)
/// or recomputed, the last only where the producer may be re-run and its
/// non-persistent inputs stay resident (those inputs are then never gapped).
pub fn mixed_schedule(graph: &Graph, order: Vec<OpId>, decisions: &[u8]) -> Schedule {
    let mut s = Schedule {
        order,
        ..Schedule::default()
    };
    if decisions.is_empty() {
        return s;
    }
    let uses = use_positions(graph, &s.order);
    // Positions that update each storage owner in place.
    let mut writes: Vec<Vec<usize>> = vec![Vec::new(); graph.tensors.len()];
    for (pos, &op) in s.order.iter().enumerate() {
        for &o in &graph.op(op).outputs {
            if let Some(target) = graph.tensor(o).inplace_update_of {
                writes[graph.storage_owner(target).index()].push(pos);
            }
        }
    }
    let mut pinned = vec![false; graph.tensors.len()];
    let mut gapped = vec![false; graph.tensors.len()];
    let mut k = 0;
    let mut activations: Vec<(usize, TensorId)> = graph
        .tensors
        .iter()
        .filter(|t| t.allocates() && t.kind == TensorKind::Activation)
        .filter_map(|t| uses[t.id.index()].first().map(|&p| (p, t.id)))
        .collect();
    // Latest first, so that a recomputation can pin its (earlier) inputs.
    activations.sort_unstable_by(|a, b| b.cmp(a));
    for &(_, t) in &activations {
        if pinned[t.index()] {
            continue;
        }
        let u = &uses[t.index()];
        for w in u.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b - a < 2 {
                continue;
            }
            let d = decisions[k % decisions.len()];
            k += 1;
            match d % 3 {
                0 => {}
                1 => {
                    s.gaps.push(Gap {
                        tensor: t,
                        after: Some(a),
                        before: Some(b),
                        how: Restore::Swap,
                        prefetch_after: Some(a + (b - a - 1) * (d as usize % 4) / 4),
                        reclaim_before: if d.is_multiple_of(2) { Some(b) } else { None },
                        copy_out_after: None,
                    });
                    gapped[t.index()] = true;
                }
                _ => {
                    let Some(op) = graph.tensor(t).producer.map(|p| graph.op(p)) else {
                        continue;
                    };
                    // A re-run must see the inputs' versions of the first run: no
                    // in-place update of an input (an optimizer step on a weight,
                    // which a reordered schedule may run early) up to `b`.
                    let updated_by_then = op.inputs.iter().any(|&i| {
                        let o = graph.storage_owner(i);
                        writes[o.index()].iter().any(|&w| w <= b)
                    });
                    let inputs: Vec<TensorId> = op
                        .inputs
                        .iter()
                        .map(|&i| graph.storage_owner(i))
                        .filter(|i| !graph.tensor(*i).is_persistent())
                        .collect();
                    let ok = op.recomputable
                        && !updated_by_then
                        && inputs.iter().all(|i| {
                            !gapped[i.index()] && uses[i.index()].last().is_some_and(|&l| l >= b)
                        });
                    if ok {
                        for i in inputs {
                            pinned[i.index()] = true;
                        }
                        s.gaps.push(Gap {
                            tensor: t,
                            after: Some(a),
                            before: Some(b),
                            how: Restore::Recompute,
                            prefetch_after: None,
                            reclaim_before: None,
                            copy_out_after: None,
                        });
                        gapped[t.index()] = true;
                    }
                }
            }
        }
    }
    s
}

/// `count` seeded random decision bytes, for [`mixed_schedule`].
pub fn random_decisions(count: usize, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count).map(|_| rng.random::<u8>()).collect()
}
