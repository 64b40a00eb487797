//! Liveness in the graph's own order, footprint, and the summary statistics.

use crate::{Graph, Phase, TensorId, TensorKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The live interval of one storage-owning tensor, in op positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveInterval {
    pub tensor: TensorId,
    /// First op position at which it is resident (its producer); `None` for
    /// tensors resident from the start (graph inputs).
    pub first_op: Option<usize>,
    /// Last op position that touches it or any view of it; `None` means to the end
    /// of the iteration (persistent tensors and step outputs).
    pub last_op: Option<usize>,
    pub size_bytes: u64,
}

/// Live intervals of every tensor that owns storage, in tensor order.
///
/// Semantics follow `dnn-train-graph/1`: a tensor lives from its producer to the
/// last op that reads it or a view of it (or writes it, for unread outputs);
/// persistent tensors live always; step outputs (`is_output`, or owners of a view
/// that is one) until the end.
pub fn live_intervals(graph: &Graph) -> Vec<LiveInterval> {
    let mut last_use: Vec<Option<usize>> = vec![None; graph.tensors.len()];
    for (pos, op) in graph.ops.iter().enumerate() {
        for &t in op.inputs.iter().chain(&op.outputs) {
            let owner = graph.storage_owner(t);
            let slot = &mut last_use[owner.index()];
            *slot = Some(slot.map_or(pos, |p: usize| p.max(pos)));
        }
    }
    let output_storage = graph.output_storage();
    graph
        .tensors
        .iter()
        .filter(|t| t.allocates())
        .map(|t| {
            let to_end = t.is_persistent() || output_storage[t.id.index()];
            LiveInterval {
                tensor: t.id,
                first_op: t.producer.map(|p| p.index()),
                last_op: if to_end {
                    None
                } else {
                    Some(last_use[t.id.index()].unwrap_or(t.producer.map_or(0, |p| p.index())))
                },
                size_bytes: t.size_bytes,
            }
        })
        .collect()
}

/// Live bytes at each op position (including that op's inputs, outputs and
/// workspace), with a perfect allocator, persistent tensors always live and views free.
pub fn live_bytes_per_op(graph: &Graph) -> Vec<u64> {
    let n = graph.ops.len();
    // Difference array over positions 0..=n.
    let mut delta = vec![0i128; n + 1];
    let mut base: i128 = 0;
    for iv in live_intervals(graph) {
        let size = iv.size_bytes as i128;
        match iv.first_op {
            // Resident from the start of the iteration.
            None => base += size,
            Some(s) => delta[s] += size,
        }
        delta[iv.last_op.map_or(n, |e| e + 1)] -= size;
    }
    let mut out = Vec::with_capacity(n);
    let mut cur = base;
    for (d, op) in delta.iter().zip(&graph.ops) {
        cur += d;
        // Scratch memory exists only while its op runs.
        out.push(cur.max(0) as u64 + op.workspace_bytes);
    }
    out
}

/// Peak live bytes in the graph's own order (the footprint), and the op at the peak.
pub fn footprint(graph: &Graph) -> (u64, Option<usize>) {
    let live = live_bytes_per_op(graph);
    let mut best = (graph.persistent_tensors().map(|t| t.size_bytes).sum(), None);
    for (i, &b) in live.iter().enumerate() {
        if b > best.0 {
            best = (b, Some(i));
        }
    }
    best
}

/// Summary statistics of a graph (the `outcore stats --json` object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphStats {
    pub model: String,
    pub batch: u64,
    pub n_ops: usize,
    pub n_ops_by_phase: BTreeMap<String, usize>,
    pub n_tensors: usize,
    /// Distinct `size_bytes` among storage-owning tensors.
    pub n_distinct_sizes: usize,
    pub param_count: u64,
    pub param_bytes: u64,
    pub buffer_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// Peak live bytes in the graph's own order with a perfect allocator.
    pub footprint_bytes: u64,
    /// Name of the op at the footprint peak.
    pub peak_op: Option<String>,
    /// Non-persistent bytes still live when the forward phase ends: what backward
    /// keeps from forward.
    pub saved_for_backward_bytes: u64,
    pub flops_by_phase: BTreeMap<String, u64>,
    /// Ops that may not be recomputed, by reason (see
    /// [`crate::recompute::NotRecomputable`]; every reason listed).
    #[serde(default)]
    pub not_recomputable_by_reason: BTreeMap<String, usize>,
}

/// Computes [`GraphStats`].
pub fn stats(graph: &Graph) -> GraphStats {
    let mut n_ops_by_phase = BTreeMap::new();
    let mut flops_by_phase = BTreeMap::new();
    for phase in Phase::ALL {
        n_ops_by_phase.insert(phase.as_str().to_string(), 0);
        flops_by_phase.insert(phase.as_str().to_string(), 0);
    }
    for op in &graph.ops {
        *n_ops_by_phase
            .entry(op.phase.as_str().to_string())
            .or_insert(0) += 1;
        *flops_by_phase
            .entry(op.phase.as_str().to_string())
            .or_insert(0) += op.flops;
    }
    let sum_kind = |kind: TensorKind| -> u64 {
        graph
            .persistent_tensors()
            .filter(|t| t.kind == kind)
            .map(|t| t.size_bytes)
            .sum()
    };
    let distinct: BTreeSet<u64> = graph
        .tensors
        .iter()
        .filter(|t| t.allocates())
        .map(|t| t.size_bytes)
        .collect();
    let (footprint_bytes, peak_pos) = footprint(graph);
    GraphStats {
        model: graph.meta.model.clone(),
        batch: graph.meta.batch,
        n_ops: graph.ops.len(),
        n_ops_by_phase,
        n_tensors: graph.tensors.len(),
        n_distinct_sizes: distinct.len(),
        param_count: graph.parameters().map(|t| t.numel()).sum(),
        param_bytes: sum_kind(TensorKind::Parameter),
        buffer_bytes: sum_kind(TensorKind::Buffer),
        optimizer_state_bytes: sum_kind(TensorKind::OptimizerState),
        footprint_bytes,
        peak_op: peak_pos.map(|p| graph.ops[p].name.clone()),
        saved_for_backward_bytes: saved_for_backward_bytes(graph),
        flops_by_phase,
        not_recomputable_by_reason: crate::recompute::not_recomputable_counts(graph),
    }
}

/// Non-persistent bytes live at the end of the forward phase, excluding tensors
/// whose last use is the last forward op itself.
pub fn saved_for_backward_bytes(graph: &Graph) -> u64 {
    let Some(last_fwd) = graph.ops.iter().rposition(|o| o.phase == Phase::Forward) else {
        return 0;
    };
    live_intervals(graph)
        .iter()
        .filter(|iv| !graph.tensor(iv.tensor).is_persistent())
        .filter(|iv| iv.first_op.is_none_or(|s| s <= last_fwd))
        .filter(|iv| iv.last_op.is_none_or(|e| e > last_fwd))
        .map(|iv| iv.size_bytes)
        .sum()
}
