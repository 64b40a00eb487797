//! Import of `dnn-train-graph/1` files (ATen-level training steps exported from PyTorch).

use crate::{
    DType, Graph, GraphError, GraphErrorKind, GraphMeta, Op, OpId, OpKind, Phase, Tensor, TensorId,
    TensorKind,
};
use serde::Deserialize;
use std::collections::BTreeSet;

/// The format tag of the files this module reads.
pub const FORMAT: &str = "dnn-train-graph/1";

#[derive(Deserialize)]
struct File {
    format: String,
    model: String,
    batch: u64,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    optimizer: Option<String>,
    #[serde(default)]
    torch_version: Option<String>,
    ops: Vec<FileOp>,
    tensors: Vec<FileTensor>,
}

#[derive(Deserialize)]
struct FileOp {
    id: u32,
    name: String,
    phase: String,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    #[serde(default)]
    flops: u64,
    #[serde(default)]
    module: Option<String>,
}

#[derive(Deserialize)]
struct FileTensor {
    id: u32,
    name: String,
    shape: Vec<u64>,
    dtype: String,
    bytes: u64,
    role: String,
    producer: Option<u32>,
    alias_of: Option<u32>,
    inplace_of: Option<u32>,
    #[serde(default)]
    is_output: bool,
}

/// Parses and converts a `dnn-train-graph/1` document. `path` names the source in
/// errors. The result is not yet validated (see [`crate::validate`]).
///
/// Choices: every op becomes [`OpKind::Named`] with its ATen name (the format has
/// no attributes, so such ops run with synthetic kernels); forward ops are marked
/// recomputable unless they are random (`dropout`, `bernoulli`, `rand*`: the file
/// keeps no seed) or write an in-place update (batch-norm running statistics, which
/// a re-execution would update twice).
pub fn import_str(text: &str, path: &str) -> Result<Graph, GraphError> {
    let file: File = serde_json::from_str(text).map_err(|e| GraphErrorKind::Parse {
        path: path.to_string(),
        format: FORMAT,
        detail: e.to_string(),
    })?;
    if file.format != FORMAT {
        return Err(GraphErrorKind::UnsupportedFormat {
            path: path.to_string(),
            found: file.format,
            expected: "`dnn-train-graph/1`",
        }
        .into());
    }
    let malformed = |detail: String| -> GraphError {
        GraphErrorKind::Malformed {
            path: path.to_string(),
            detail,
        }
        .into()
    };

    let mut tensors = Vec::with_capacity(file.tensors.len());
    for ft in &file.tensors {
        let dtype: DType = ft
            .dtype
            .parse()
            .map_err(|e| malformed(format!("tensor {} ({}): {e}", ft.id, ft.name)))?;
        let kind = kind_of_role(&ft.role).ok_or_else(|| {
            malformed(format!(
                "tensor {} ({}): unknown role `{}`",
                ft.id, ft.name, ft.role
            ))
        })?;
        tensors.push(Tensor {
            id: TensorId(ft.id),
            name: ft.name.clone(),
            shape: ft.shape.clone(),
            dtype,
            size_bytes: ft.bytes,
            kind,
            producer: ft.producer.map(OpId),
            view_of: ft.alias_of.map(TensorId),
            inplace_update_of: ft.inplace_of.map(TensorId),
            is_output: ft.is_output,
        });
    }
    let size_of = |t: u32| tensors.get(t as usize).map_or(0, |t: &Tensor| t.size_bytes);
    let writes_update = |t: u32| {
        tensors
            .get(t as usize)
            .is_some_and(|t: &Tensor| t.inplace_update_of.is_some())
    };
    let allocates_or_updates = |t: u32| {
        tensors
            .get(t as usize)
            .is_some_and(|t: &Tensor| t.view_of.is_none())
    };

    let mut ops = Vec::with_capacity(file.ops.len());
    for fo in &file.ops {
        let phase = match fo.phase.as_str() {
            "forward" => Phase::Forward,
            "backward" => Phase::Backward,
            "optimizer" => Phase::Optimizer,
            other => {
                return Err(malformed(format!(
                    "op {} ({}): unknown phase `{other}` (expected forward, backward or optimizer)",
                    fo.id, fo.name
                )));
            }
        };
        let distinct_inputs: BTreeSet<u32> = fo.inputs.iter().copied().collect();
        let random = ["dropout", "bernoulli", "rand"]
            .iter()
            .any(|w| fo.name.contains(w));
        let recomputable =
            phase == Phase::Forward && !random && !fo.outputs.iter().any(|&t| writes_update(t));
        ops.push(Op {
            id: OpId(fo.id),
            name: fo.name.clone(),
            kind: OpKind::Named {
                name: fo.name.clone(),
            },
            phase,
            inputs: fo.inputs.iter().map(|&t| TensorId(t)).collect(),
            outputs: fo.outputs.iter().map(|&t| TensorId(t)).collect(),
            flops: fo.flops,
            // Saturating: sizes come from the file; validation then refuses
            // the graph for its totals (`TooLarge`) instead of a wrap.
            bytes_read: distinct_inputs
                .iter()
                .fold(0u64, |sum, &t| sum.saturating_add(size_of(t))),
            bytes_written: fo
                .outputs
                .iter()
                .filter(|&&t| allocates_or_updates(t))
                .fold(0u64, |sum, &t| sum.saturating_add(size_of(t))),
            workspace_bytes: 0,
            recomputable,
            module: fo.module.clone(),
        });
    }

    let torch = file.torch_version.as_deref().unwrap_or("unknown torch");
    Ok(Graph {
        meta: GraphMeta {
            model: file.model,
            batch: file.batch,
            seq: file.seq,
            optimizer: file.optimizer.unwrap_or_else(|| "none".into()),
            source: format!("{FORMAT} exported from PyTorch {torch}"),
        },
        tensors,
        ops,
    })
}

/// Maps the format's fine `role` onto a [`TensorKind`].
fn kind_of_role(role: &str) -> Option<TensorKind> {
    Some(match role {
        "param" | "param_updated" => TensorKind::Parameter,
        "buffer" | "buffer_updated" => TensorKind::Buffer,
        "opt_state" | "opt_state_updated" => TensorKind::OptimizerState,
        "input" => TensorKind::Input,
        "label" => TensorKind::Label,
        "activation" => TensorKind::Activation,
        "loss" => TensorKind::Loss,
        "grad_param" => TensorKind::ParameterGradient,
        "grad" => TensorKind::Gradient,
        "opt_temp" => TensorKind::Temporary,
        _ => return None,
    })
}
