//! Rewrites of an imported ATen training step that make its forward ops
//! recomputable where PyTorch's eager ops mix a recomputable computation with a
//! side effect (see [`super::dnn_train_graph::import_str`] for the contract):
//!
//! 1. [`out_of_place`]: an in-place op on an activation (`relu_`, `add_`,
//!    `silu_`, `bernoulli_`, `div_`, ...) gets an output of its own instead of
//!    a new version of its input's storage, when nothing reads that storage's
//!    older contents afterwards. Re-running the producer of the input then
//!    brings back exactly what the in-place op read, and the in-place op can be
//!    re-run on it; as views, re-running the producer alone would bring back
//!    the version before the write while backward reads the one after it.
//! 2. [`split_side_effects`]: an op that both computes activations and updates
//!    persistent buffers (batch norm's running statistics) becomes the
//!    computation, under its original name, followed by `<name>.stats_update`;
//!    a random op that returns its mask (`native_dropout`) becomes
//!    `<name>.mask`, which draws the mask, followed by the deterministic rest
//!    under its original name, which reads it.
//!
//! Both run on a graph that has passed validation (the importer checks first)
//! and keep it valid: no tensor is added or removed, ops are renumbered in
//! order, and every tensor's producer is set from the op that outputs it.

use crate::recompute::{aten_base, is_inplace_aten, is_random_aten, writes_persistent_output};
use crate::{DType, Graph, Op, OpId, OpKind, Phase, TensorId};

/// Suffix of the op that applies a statistics update split off an op.
pub const STATS_UPDATE_SUFFIX: &str = ".stats_update";
/// Suffix of the op that draws a random mask split off an op.
pub const MASK_SUFFIX: &str = ".mask";

/// Rewrite 1 (module docs). Forward ops only: backward's in-place
/// accumulations are never recomputed. Returns how many ops changed.
pub fn out_of_place(graph: &mut Graph) -> usize {
    let n_t = graph.tensors.len();
    // Per tensor: the position of its producer (graph inputs: none) and its
    // last reader.
    let made_at: Vec<Option<usize>> = graph
        .tensors
        .iter()
        .map(|t| t.producer.map(|p| p.index()))
        .collect();
    let mut last_read: Vec<Option<usize>> = vec![None; n_t];
    for (pos, op) in graph.ops.iter().enumerate() {
        for &t in &op.inputs {
            if let Some(slot) = last_read.get_mut(t.index()) {
                *slot = Some(pos);
            }
        }
    }
    // Per storage owner: the tensors that live in it (kept up to date as
    // outputs become owners).
    let mut members: Vec<Vec<TensorId>> = vec![Vec::new(); n_t];
    for t in &graph.tensors {
        let owner = graph.storage_owner(t.id);
        if owner != t.id {
            members[owner.index()].push(t.id);
        }
    }
    let output_storage = graph.output_storage();
    let mut changed = 0;
    for pos in 0..graph.ops.len() {
        let op = &graph.ops[pos];
        let OpKind::Named { name } = &op.kind else {
            continue;
        };
        if op.phase != Phase::Forward || !is_inplace_aten(name) {
            continue;
        }
        let mut converted = false;
        for v in op.outputs.clone() {
            let Some(old) = writable_owner(graph, pos, v) else {
                continue;
            };
            if output_storage[old.index()] {
                continue;
            }
            // Older contents read after the write: those reads would see the
            // new values, which an out-of-place op would not give them.
            let older_read_later = std::iter::once(old)
                .chain(members[old.index()].iter().copied())
                .filter(|&t| t != v && made_at[t.index()].is_none_or(|m| m < pos))
                .any(|t| last_read[t.index()].is_some_and(|r| r > pos));
            if older_read_later {
                continue;
            }
            // `v` owns its storage from now on; later views of the old storage
            // (made at or after the write) view it instead.
            graph.tensors[v.index()].view_of = None;
            let moved: Vec<TensorId> = members[old.index()]
                .iter()
                .copied()
                .filter(|&t| t != v && made_at[t.index()].is_some_and(|m| m >= pos))
                .collect();
            members[old.index()].retain(|t| *t != v && !moved.contains(t));
            for &t in &moved {
                graph.tensors[t.index()].view_of = Some(v);
            }
            members[v.index()] = moved;
            converted = true;
        }
        changed += usize::from(converted);
    }
    changed
}

/// The non-persistent storage owner that op `pos` overwrites through its view
/// output `v`, if it reads that storage too.
fn writable_owner(graph: &Graph, pos: usize, v: TensorId) -> Option<TensorId> {
    let tensor = graph.tensors.get(v.index())?;
    tensor.view_of?;
    let owner = graph.storage_owner(v);
    let o = graph.tensors.get(owner.index())?;
    if o.kind.is_persistent() || o.inplace_update_of.is_some() {
        return None;
    }
    let op = &graph.ops[pos];
    op.inputs
        .iter()
        .any(|&i| graph.storage_owner(i) == owner)
        .then_some(owner)
}

/// How one op is split.
enum Split {
    /// Computation, then `.stats_update` writing these outputs.
    Stats { updates: Vec<TensorId> },
    /// `.mask` drawing this output, then the rest.
    Mask { mask: TensorId },
}

/// Rewrite 2 (module docs). Returns which ops (new ids) are the deterministic
/// parts of split random ops.
pub fn split_side_effects(graph: &mut Graph) -> Vec<bool> {
    let old_ops = std::mem::take(&mut graph.ops);
    let mut ops: Vec<Op> = Vec::with_capacity(old_ops.len() + old_ops.len() / 4);
    let mut deterministic_part = Vec::with_capacity(ops.capacity());
    for op in old_ops {
        match split_of(graph, &op) {
            None => {
                deterministic_part.push(false);
                push(&mut ops, op);
            }
            Some(Split::Stats { updates }) => {
                let (main, stats) = split_stats(graph, op, &updates);
                deterministic_part.extend([false, false]);
                push(&mut ops, main);
                push(&mut ops, stats);
            }
            Some(Split::Mask { mask }) => {
                let (draw, rest) = split_mask(op, mask);
                deterministic_part.extend([false, true]);
                push(&mut ops, draw);
                push(&mut ops, rest);
            }
        }
    }
    for op in &ops {
        for &t in &op.outputs {
            if let Some(tensor) = graph.tensors.get_mut(t.index()) {
                tensor.producer = Some(op.id);
            }
        }
    }
    graph.ops = ops;
    deterministic_part
}

fn push(ops: &mut Vec<Op>, mut op: Op) {
    op.id = OpId(ops.len() as u32);
    ops.push(op);
}

/// Whether and how a forward op is split.
fn split_of(graph: &Graph, op: &Op) -> Option<Split> {
    if op.phase != Phase::Forward {
        return None;
    }
    let OpKind::Named { name } = &op.kind else {
        return None;
    };
    let updates: Vec<TensorId> = op
        .outputs
        .iter()
        .copied()
        .filter(|&t| writes_persistent_output(graph, op, t))
        .collect();
    if !updates.is_empty() && updates.len() < op.outputs.len() {
        return Some(Split::Stats { updates });
    }
    let base = aten_base(name);
    if updates.is_empty() && is_random_aten(base) && op.outputs.len() == 2 {
        let mask = op.outputs[1];
        let is_mask = graph
            .tensors
            .get(mask.index())
            .is_some_and(|t| matches!(t.dtype, DType::Bool | DType::Uint8) && t.allocates());
        if is_mask && !is_inplace_aten(name) {
            return Some(Split::Mask { mask });
        }
    }
    None
}

/// The computation keeps the original op's name, inputs other than the
/// storage it updates, and other outputs; the update reads the buffers it
/// updates and the statistics the computation returns (its outputs after the
/// first: batch norm's saved mean and inverse standard deviation; the only
/// output when there is one). FLOPs: the update is charged 4 per updated
/// element (a running average: scale, scale, add, plus variance's unbiasing),
/// at most the op's count, the computation the rest, so the total is kept.
fn split_stats(graph: &Graph, op: Op, updates: &[TensorId]) -> (Op, Op) {
    let written: Vec<TensorId> = updates.iter().map(|&t| graph.storage_owner(t)).collect();
    let (read_buffers, inputs): (Vec<TensorId>, Vec<TensorId>) = op
        .inputs
        .iter()
        .partition(|&&t| written.contains(&graph.storage_owner(t)));
    let outputs: Vec<TensorId> = op
        .outputs
        .iter()
        .copied()
        .filter(|t| !updates.contains(t))
        .collect();
    let statistics: Vec<TensorId> = if outputs.len() > 1 {
        outputs[1..].to_vec()
    } else {
        outputs.clone()
    };
    let updated_elements: u64 = updates
        .iter()
        .map(|&t| graph.tensors[t.index()].numel())
        .fold(0u64, u64::saturating_add);
    let stats_flops = updated_elements.saturating_mul(4).min(op.flops);
    let mut stats_inputs = read_buffers;
    stats_inputs.extend(statistics);
    let name = format!("{}{STATS_UPDATE_SUFFIX}", op.name);
    let stats = Op {
        id: op.id,
        name: name.clone(),
        kind: OpKind::Named { name },
        phase: op.phase,
        inputs: stats_inputs,
        outputs: updates.to_vec(),
        flops: stats_flops,
        bytes_read: 0,
        bytes_written: 0,
        workspace_bytes: 0,
        recomputable: false,
        module: op.module.clone(),
    };
    let main = Op {
        inputs,
        outputs,
        flops: op.flops - stats_flops,
        ..op
    };
    (main, stats)
}

/// The mask draw reads nothing (it needs only the mask's shape) and gets half
/// the op's FLOPs; the rest keeps the original name, reads the original inputs
/// and the mask, and returns the other outputs.
fn split_mask(op: Op, mask: TensorId) -> (Op, Op) {
    let name = format!("{}{MASK_SUFFIX}", op.name);
    let draw_flops = op.flops / 2;
    let draw = Op {
        id: op.id,
        name: name.clone(),
        kind: OpKind::Named { name },
        phase: op.phase,
        inputs: Vec::new(),
        outputs: vec![mask],
        flops: draw_flops,
        bytes_read: 0,
        bytes_written: 0,
        workspace_bytes: 0,
        recomputable: false,
        module: op.module.clone(),
    };
    let mut inputs = op.inputs.clone();
    inputs.push(mask);
    let rest = Op {
        inputs,
        outputs: op.outputs.iter().copied().filter(|&t| t != mask).collect(),
        flops: op.flops - draw_flops,
        ..op
    };
    (draw, rest)
}
