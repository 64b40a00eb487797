//! The training graph: an arena of tensors and ops plus metadata, and cheap queries.

use crate::{Op, OpId, Phase, Tensor, TensorId, TensorKind};
use serde::{Deserialize, Serialize};

/// Where a graph came from and what it trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphMeta {
    /// Model name, e.g. `resnet50`.
    pub model: String,
    /// Batch size.
    pub batch: u64,
    /// Sequence length for sequence models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Optimizer: `sgd`, `adam`, `adamw` or `none`.
    pub optimizer: String,
    /// Provenance, e.g. `zoo: torchvision resnet.py` or `dnn-train-graph/1 from torch 2.5`.
    pub source: String,
}

/// A training dataflow graph: forward, backward and optimizer ops in an order that
/// is a valid execution order (`ops[i].id == i`, `tensors[i].id == i`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub meta: GraphMeta,
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
}

impl Graph {
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.index()]
    }

    pub fn n_ops(&self) -> usize {
        self.ops.len()
    }

    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// The tensor that owns `id`'s storage: itself, or the end of its view chain.
    /// An in-place update's storage is that of the tensor it updates.
    ///
    /// Assumes a validated graph (no view cycles); stops after `n_tensors` steps otherwise.
    pub fn storage_owner(&self, id: TensorId) -> TensorId {
        let mut cur = id;
        for _ in 0..=self.tensors.len() {
            let t = &self.tensors[cur.index()];
            match (t.view_of, t.inplace_update_of) {
                (Some(next), _) | (None, Some(next)) => cur = next,
                (None, None) => return cur,
            }
        }
        cur
    }

    /// For every tensor, whether it owns storage that must survive to the end of the
    /// iteration because it, or a view of it, is a step output.
    pub fn output_storage(&self) -> Vec<bool> {
        let mut out = vec![false; self.tensors.len()];
        for t in self.tensors.iter().filter(|t| t.is_output) {
            out[self.storage_owner(t.id).index()] = true;
        }
        out
    }

    /// Tensors that are persistent graph inputs (parameters, buffers, optimizer state).
    pub fn persistent_tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.tensors.iter().filter(|t| t.is_persistent())
    }

    /// Trainable parameters (not their updated values).
    pub fn parameters(&self) -> impl Iterator<Item = &Tensor> {
        self.tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Parameter && t.allocates())
    }

    /// Ops of one phase, in order.
    pub fn ops_in_phase(&self, phase: Phase) -> impl Iterator<Item = &Op> {
        self.ops.iter().filter(move |o| o.phase == phase)
    }

    /// For every tensor, the ops that read it directly (not through views), in order.
    pub fn consumers(&self) -> Vec<Vec<OpId>> {
        let mut consumers = vec![Vec::new(); self.tensors.len()];
        for op in &self.ops {
            for &t in &op.inputs {
                let list: &mut Vec<OpId> = &mut consumers[t.index()];
                if list.last() != Some(&op.id) {
                    list.push(op.id);
                }
            }
        }
        consumers
    }
}
