//! Import of `dnn-train-graph/1` files (ATen-level training steps exported from PyTorch).

use super::aten_rewrite;
use crate::{
    DType, Graph, GraphError, GraphErrorKind, GraphMeta, Op, OpId, OpKind, Phase, Tensor, TensorId,
    TensorKind, recompute,
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
/// errors. The result is not yet validated (see [`crate::validate`]); a document
/// that does not validate is returned as the file says (ids as in the file, so
/// that validation errors name the file's ops and tensors) without the rewrites
/// below.
///
/// Choices:
/// - Every op becomes [`OpKind::Named`] with its ATen name (the format has no
///   attributes, so such ops run with synthetic kernels).
/// - In-place ops on activations (`relu_`, `add_`, `silu_`, `div_`, ...) get an
///   output of their own when nothing reads the overwritten contents later
///   ([`aten_rewrite::out_of_place`]): re-running the producer of the input
///   then restores what the in-place op read, whereas as a view of the input's
///   storage re-running the producer alone would restore the version before
///   the write. This costs memory only while the op runs (its input and
///   output are both live, as in the zoo's out-of-place layers).
/// - Side effects are split off into their own ops
///   ([`aten_rewrite::split_side_effects`]), so that the computation is
///   recomputable and re-running it never applies the side effect twice:
///   - an op that updates persistent buffers besides computing activations
///     (batch norm's running statistics: `native_batch_norm`,
///     `_native_batch_norm_legit`, `cudnn_batch_norm`, ...) becomes the
///     computation, which no longer reads the buffers, then
///     `<name>.stats_update`, which reads the buffers and the saved
///     statistics and writes the updated buffers;
///   - a random op that returns its mask (`native_dropout`, `_fused_dropout`)
///     becomes `<name>.mask`, which draws the mask and is not recomputable,
///     then the rest under the original name, which reads the input and the
///     mask and is recomputable, bit for bit. The mask is kept rather than the
///     generator's seed and offset: the exporter runs on the meta device, where
///     no generator state is consumed, and replaying PyTorch's Philox stream
///     would tie every executor to it; the mask is saved for backward anyway
///     (`native_dropout_backward` reads it), so keeping it costs nothing the
///     unsplit graph did not hold.
/// - Op names, for mapping plan ops back to PyTorch nodes: every op keeps the
///   file's name (the ATen overload, e.g. `aten.native_batch_norm.default`);
///   a split-off part is named `<name>.stats_update` (placed right after the op
///   it came from) or `<name>.mask` (right before it). Dropping the ops whose
///   names end in those suffixes leaves the file's ops, in the file's order:
///   file op `i` is the `i`-th remaining op. Tensor ids are the file's (no
///   tensor is added or removed).
/// - Forward ops are recomputable unless [`crate::recompute`] names a reason:
///   they update persistent state (the split-off updates, `num_batches_tracked
///   += 1`), draw random numbers with no kept state (the mask draws,
///   `bernoulli_`, `rand*`), still overwrite an activation in place, or have an
///   output that a later in-place op overwrites; `outcore stats --json`
///   counts them by reason.
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
            bytes_read: 0,
            bytes_written: 0,
            workspace_bytes: 0,
            recomputable: false,
            module: fo.module.clone(),
        });
    }

    let torch = file.torch_version.as_deref().unwrap_or("unknown torch");
    let mut graph = Graph {
        meta: GraphMeta {
            model: file.model,
            batch: file.batch,
            seq: file.seq,
            optimizer: file.optimizer.unwrap_or_else(|| "none".into()),
            source: format!("{FORMAT} exported from PyTorch {torch}"),
        },
        tensors,
        ops,
    };
    // The rewrites assume a well-formed graph; a malformed one is returned as
    // the file has it, for validation to report in the file's terms.
    let deterministic_part = if crate::validate(&graph).is_ok() {
        aten_rewrite::out_of_place(&mut graph);
        aten_rewrite::split_side_effects(&mut graph)
    } else {
        vec![false; graph.ops.len()]
    };
    set_bytes_moved(&mut graph);
    set_recomputable(&mut graph, &deterministic_part);
    Ok(graph)
}

/// Bytes each op reads (distinct inputs) and writes (outputs that own storage
/// or update in place). Saturating: sizes come from the file; validation then
/// refuses the graph for its totals (`TooLarge`) instead of a wrap.
fn set_bytes_moved(graph: &mut Graph) {
    let tensors = &graph.tensors;
    let size_of = |t: TensorId| tensors.get(t.index()).map_or(0, |t| t.size_bytes);
    let allocates_or_updates = |t: TensorId| {
        tensors
            .get(t.index())
            .is_some_and(|t: &Tensor| t.view_of.is_none())
    };
    for op in &mut graph.ops {
        let distinct_inputs: BTreeSet<TensorId> = op.inputs.iter().copied().collect();
        op.bytes_read = distinct_inputs
            .iter()
            .fold(0u64, |sum, &t| sum.saturating_add(size_of(t)));
        op.bytes_written = op
            .outputs
            .iter()
            .filter(|&&t| allocates_or_updates(t))
            .fold(0u64, |sum, &t| sum.saturating_add(size_of(t)));
    }
}

/// Sets `recomputable` by the rules of [`crate::recompute`] (see
/// [`import_str`]). `deterministic_part[i]`: op `i` is the part of a split
/// random op that reads the mask, so its ATen name does not make it random.
fn set_recomputable(graph: &mut Graph, deterministic_part: &[bool]) {
    if graph.tensors.iter().any(|t| {
        t.producer.is_some_and(|p| p.index() >= graph.ops.len())
            || t.view_of.is_some_and(|v| v.index() >= graph.tensors.len())
            || t.inplace_update_of
                .is_some_and(|v| v.index() >= graph.tensors.len())
    }) || graph.ops.iter().any(|o| {
        o.inputs
            .iter()
            .chain(&o.outputs)
            .any(|t| t.index() >= graph.tensors.len())
    }) {
        // Dangling references: validation refuses the graph; nothing to decide.
        return;
    }
    let writers: Vec<bool> = graph
        .ops
        .iter()
        .map(|o| o.phase == Phase::Forward && recompute::writes_activation_in_place(graph, o))
        .collect();
    // Storage owners that a forward op overwrites in place.
    let mut overwritten = vec![false; graph.tensors.len()];
    for (op, _) in graph.ops.iter().zip(&writers).filter(|(_, w)| **w) {
        for &v in &op.outputs {
            if graph.tensor(v).view_of.is_some() {
                overwritten[graph.storage_owner(v).index()] = true;
            }
        }
    }
    let flags: Vec<bool> = graph
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let random = !deterministic_part.get(i).copied().unwrap_or(false)
                && recompute::named_base(op).is_some_and(recompute::is_random_aten);
            let output_overwritten = op
                .outputs
                .iter()
                .any(|&t| graph.tensor(t).allocates() && overwritten[t.index()]);
            op.phase == Phase::Forward
                && !recompute::updates_persistent(graph, op)
                && !random
                && !writers[i]
                && !output_overwritten
        })
        .collect();
    for (op, flag) in graph.ops.iter_mut().zip(flags) {
        op.recomputable = flag;
    }
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
