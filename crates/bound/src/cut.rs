//! What must be kept, swapped or recomputed across one cut: the storages that
//! every valid order has produced before the cut op ends and still needs after
//! it (step 3 of the crate's derivation).

use outcore_graph::{Graph, OpId, TensorId};
use serde::Serialize;

/// How an activation storage can be restored without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Recompute {
    /// By re-running its producer, which takes this long (shared by every
    /// storage the op produces, so the group is one item).
    Seconds(f64),
    /// Not at all (its producer is not recomputable).
    Never,
}

/// The storages live across a cut, as the relaxation sees them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CutItems {
    /// Compute time of the cut op and its ancestors (before the cut).
    pub before_s: f64,
    /// Compute time of the cut op's descendants (after the cut).
    pub after_s: f64,
    /// Activation groups (the needed outputs of one producer): bytes and how
    /// they can be recomputed.
    pub activations: Vec<(u64, Recompute)>,
    /// Persistent tensors and batch inputs needed after the cut that no op
    /// updates (a swap needs no copy-out), in bytes.
    pub kept_input_bytes: u64,
    /// Persistent tensors needed after the cut that an op updates in place.
    pub updated_bytes: u64,
}

impl CutItems {
    /// Bytes of every storage live across the cut.
    pub fn total_bytes(&self) -> u64 {
        self.activations
            .iter()
            .map(|&(bytes, _)| bytes)
            .fold(self.kept_input_bytes, u64::saturating_add)
            .saturating_add(self.updated_bytes)
    }
}

/// The storages live across the end of op `cut`, with op times `op_time_s`.
/// Ancestry follows producer edges only: fewer edges mean fewer ops known to
/// be before or after the cut, which can only lower the bound.
pub fn cut_items(graph: &Graph, op_time_s: &[f64], cut: OpId) -> CutItems {
    let n = graph.ops.len();
    let before = ancestors_and_self(graph, cut);
    let after = descendants(graph, cut);
    let mut items = CutItems {
        before_s: (0..n).filter(|&i| before[i]).map(|i| op_time_s[i]).sum(),
        after_s: (0..n).filter(|&i| after[i]).map(|i| op_time_s[i]).sum(),
        ..CutItems::default()
    };
    let updated = updated_storage(graph);
    // Storages that an op after the cut reads or writes, each once.
    let mut needed = vec![false; graph.tensors.len()];
    for op in graph.ops.iter().filter(|o| after[o.id.index()]) {
        for &t in op.inputs.iter().chain(&op.outputs) {
            needed[graph.storage_owner(t).index()] = true;
        }
    }
    // Activation bytes per producer that ran before the cut.
    let mut group_bytes = vec![0u64; n];
    for (i, t) in graph.tensors.iter().enumerate().filter(|&(i, _)| needed[i]) {
        match t.producer {
            Some(p) if before[p.index()] => {
                group_bytes[p.index()] = group_bytes[p.index()].saturating_add(t.size_bytes);
            }
            // Produced after the cut: not live across it.
            Some(_) => {}
            None if updated[i] => items.updated_bytes += t.size_bytes,
            None => items.kept_input_bytes += t.size_bytes,
        }
    }
    for (p, &bytes) in group_bytes.iter().enumerate().filter(|&(_, &b)| b > 0) {
        let recompute = if graph.ops[p].recomputable {
            Recompute::Seconds(op_time_s[p])
        } else {
            Recompute::Never
        };
        items.activations.push((bytes, recompute));
    }
    items
}

/// Storages some op writes in place (optimizer updates).
pub(crate) fn updated_storage(graph: &Graph) -> Vec<bool> {
    let mut updated = vec![false; graph.tensors.len()];
    for t in graph
        .tensors
        .iter()
        .filter(|t| t.inplace_update_of.is_some())
    {
        updated[graph.storage_owner(t.id).index()] = true;
    }
    updated
}

/// `cut` and every op it transitively reads from.
pub(crate) fn ancestors_and_self(graph: &Graph, cut: OpId) -> Vec<bool> {
    let mut seen = vec![false; graph.ops.len()];
    let mut stack = vec![cut];
    seen[cut.index()] = true;
    while let Some(o) = stack.pop() {
        for &t in &graph.op(o).inputs {
            if let Some(p) = producer_of(graph, t)
                && !seen[p.index()]
            {
                seen[p.index()] = true;
                stack.push(p);
            }
        }
    }
    seen
}

/// Every op that transitively reads an output of `cut` (not `cut` itself).
pub(crate) fn descendants(graph: &Graph, cut: OpId) -> Vec<bool> {
    let consumers = graph.consumers();
    let mut seen = vec![false; graph.ops.len()];
    let mut stack = vec![cut];
    while let Some(o) = stack.pop() {
        for &t in &graph.op(o).outputs {
            for &c in &consumers[t.index()] {
                if !seen[c.index()] && c != cut {
                    seen[c.index()] = true;
                    stack.push(c);
                }
            }
        }
    }
    seen
}

fn producer_of(graph: &Graph, t: TensorId) -> Option<OpId> {
    graph.tensor(t).producer
}
