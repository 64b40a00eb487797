//! Why an op may not be recomputed: one reason per non-recomputable op, and the
//! ATen naming rules the `dnn-train-graph/1` importer decides recomputability by.
//!
//! `Op::recomputable` is the flag every planner and `verify()` obey; this module
//! explains it. [`not_recomputable_reason`] names, for an op whose flag is false,
//! the first of these that holds (the order is the order of the variants), so
//! that `outcore stats --json` can count them ([`not_recomputable_counts`]).
//! The importer sets the flag from the same predicates ([`updates_persistent`],
//! [`writes_activation_in_place`], [`is_random_aten`], [`overwritten_in_place`]),
//! so an explanation never disagrees with the rule that made the decision.

use crate::{Graph, Op, OpId, OpKind, Phase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Why an op may not be re-executed to rematerialise its outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotRecomputable {
    /// A backward or optimizer op: only forward ops are recomputed.
    NotForward,
    /// It writes a parameter, buffer or optimizer state in place (e.g. a batch
    /// norm's running statistics, `num_batches_tracked += 1`): a second run
    /// would apply the update twice.
    UpdatesPersistentState,
    /// It draws random numbers and the graph keeps no generator state (e.g. a
    /// dropout mask, `bernoulli_`): a second run would draw different ones.
    Random,
    /// It overwrites an activation in place (an ATen `op_` whose result is a
    /// view of a tensor it reads) that the importer could not turn into an
    /// out-of-place op: re-running it would see its own output as input.
    WritesInPlace,
    /// A later forward op overwrites one of its outputs in place, so re-running
    /// it alone would bring back an older version than the one backward reads.
    OverwrittenInPlace,
    /// Marked so by the graph's source (an `outcore-graph/1` file or a builder)
    /// for none of the reasons above.
    Marked,
}

impl NotRecomputable {
    pub const ALL: [NotRecomputable; 6] = [
        NotRecomputable::NotForward,
        NotRecomputable::UpdatesPersistentState,
        NotRecomputable::Random,
        NotRecomputable::WritesInPlace,
        NotRecomputable::OverwrittenInPlace,
        NotRecomputable::Marked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotRecomputable::NotForward => "not_forward",
            NotRecomputable::UpdatesPersistentState => "updates_persistent_state",
            NotRecomputable::Random => "random",
            NotRecomputable::WritesInPlace => "writes_in_place",
            NotRecomputable::OverwrittenInPlace => "overwritten_in_place",
            NotRecomputable::Marked => "marked",
        }
    }
}

impl fmt::Display for NotRecomputable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reason `op` may not be recomputed, or `None` when it may.
pub fn not_recomputable_reason(graph: &Graph, op: OpId) -> Option<NotRecomputable> {
    let o = graph.ops.get(op.index())?;
    if o.recomputable {
        return None;
    }
    Some(if o.phase != Phase::Forward {
        NotRecomputable::NotForward
    } else if updates_persistent(graph, o) {
        NotRecomputable::UpdatesPersistentState
    } else if named_base(o).is_some_and(is_random_aten) {
        NotRecomputable::Random
    } else if writes_activation_in_place(graph, o) {
        NotRecomputable::WritesInPlace
    } else if overwritten_in_place(graph, o) {
        NotRecomputable::OverwrittenInPlace
    } else {
        NotRecomputable::Marked
    })
}

/// Non-recomputable ops counted by reason (every reason listed, zeros included).
pub fn not_recomputable_counts(graph: &Graph) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = NotRecomputable::ALL
        .iter()
        .map(|r| (r.as_str().to_string(), 0))
        .collect();
    for op in &graph.ops {
        if let Some(reason) = not_recomputable_reason(graph, op.id) {
            *counts.entry(reason.as_str().to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// Whether the op writes persistent storage: an output that is an in-place
/// update, or, for an ATen in-place op, a view of a parameter, buffer or
/// optimizer state (an intermediate version; a plain view such as a weight's
/// `t()` writes nothing).
pub fn updates_persistent(graph: &Graph, op: &Op) -> bool {
    op.outputs
        .iter()
        .any(|&t| writes_persistent_output(graph, op, t))
}

/// Whether output `t` of `op` is a write of persistent storage (see
/// [`updates_persistent`]).
pub fn writes_persistent_output(graph: &Graph, op: &Op, t: crate::TensorId) -> bool {
    let inplace_op = matches!(&op.kind, OpKind::Named { name } if is_inplace_aten(name));
    graph.tensors.get(t.index()).is_some_and(|tensor| {
        tensor.inplace_update_of.is_some()
            || (inplace_op
                && tensor.view_of.is_some()
                && graph
                    .tensors
                    .get(graph.storage_owner(t).index())
                    .is_some_and(|o| o.kind.is_persistent()))
    })
}

/// Whether the op is an ATen in-place op (see [`is_inplace_aten`]) with an
/// output that is a view of non-persistent storage one of its inputs lives in:
/// it overwrites an activation.
pub fn writes_activation_in_place(graph: &Graph, op: &Op) -> bool {
    let OpKind::Named { name } = &op.kind else {
        return false;
    };
    if !is_inplace_aten(name) {
        return false;
    }
    op.outputs.iter().any(|&v| {
        let Some(tensor) = graph.tensors.get(v.index()) else {
            return false;
        };
        if tensor.view_of.is_none() {
            return false;
        }
        let owner = graph.storage_owner(v);
        let persistent = graph
            .tensors
            .get(owner.index())
            .is_some_and(|o| o.kind.is_persistent());
        !persistent && op.inputs.iter().any(|&i| graph.storage_owner(i) == owner)
    })
}

/// Whether a later forward op overwrites the storage of one of `op`'s outputs in
/// place ([`writes_activation_in_place`]).
pub fn overwritten_in_place(graph: &Graph, op: &Op) -> bool {
    let owners: Vec<_> = op
        .outputs
        .iter()
        .filter(|&&t| graph.tensors.get(t.index()).is_some_and(|x| x.allocates()))
        .copied()
        .collect();
    if owners.is_empty() {
        return false;
    }
    graph.ops.iter().skip(op.id.index() + 1).any(|later| {
        later.phase == Phase::Forward
            && writes_activation_in_place(graph, later)
            && later.outputs.iter().any(|&v| {
                graph
                    .tensors
                    .get(v.index())
                    .is_some_and(|t| t.view_of.is_some())
                    && owners.contains(&graph.storage_owner(v))
            })
    })
}

/// The ATen operator of a `Named` op, without namespace and overload
/// (`aten.relu_.default` -> `relu_`); `None` for other kinds.
pub fn named_base(op: &Op) -> Option<&str> {
    match &op.kind {
        OpKind::Named { name } => Some(aten_base(name)),
        _ => None,
    }
}

/// `aten.relu_.default` -> `relu_`; a name without the `aten.` prefix is taken
/// up to its first dot.
pub fn aten_base(name: &str) -> &str {
    let rest = name.strip_prefix("aten.").unwrap_or(name);
    rest.split('.').next().unwrap_or(rest)
}

/// The overload of an ATen name (`aten.add.out` -> `out`), if it has one.
fn aten_overload(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("aten.")?;
    rest.split('.').nth(1)
}

/// ATen ops that change only a tensor's metadata in place (no data written),
/// although their names end in `_`.
const METADATA_INPLACE: [&str; 12] = [
    "as_strided_",
    "resize_",
    "resize_as_",
    "set_",
    "detach_",
    "squeeze_",
    "unsqueeze_",
    "transpose_",
    "t_",
    "swapdims_",
    "swapaxes_",
    "requires_grad_",
];

/// Whether an ATen op name is an in-place data write: `op_` (by ATen's naming
/// convention, e.g. `relu_`, `add_`, `bernoulli_`) other than the metadata-only
/// ones, or an `out=` overload (`aten.add.out`).
pub fn is_inplace_aten(name: &str) -> bool {
    let base = aten_base(name);
    let trailing =
        base.ends_with('_') && !base.ends_with("__") && !METADATA_INPLACE.contains(&base);
    trailing || aten_overload(name) == Some("out")
}

/// ATen ops that draw from the random generator.
const RANDOM_ATEN: [&str; 32] = [
    "bernoulli",
    "bernoulli_",
    "binomial",
    "cauchy_",
    "dropout",
    "dropout_",
    "exponential_",
    "feature_dropout",
    "feature_dropout_",
    "alpha_dropout",
    "alpha_dropout_",
    "feature_alpha_dropout",
    "geometric_",
    "log_normal_",
    "multinomial",
    "native_dropout",
    "normal",
    "normal_",
    "poisson",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "random_",
    "randperm",
    "rrelu_with_noise",
    "rrelu_with_noise_",
    "uniform_",
    "_fused_dropout",
    "_standard_gamma",
];

/// Whether an ATen operator (its base name, see [`aten_base`]) draws random numbers.
pub fn is_random_aten(base: &str) -> bool {
    RANDOM_ATEN.contains(&base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aten_names_are_classified() {
        assert_eq!(aten_base("aten.relu_.default"), "relu_");
        assert_eq!(aten_base("relu"), "relu");
        assert!(is_inplace_aten("aten.relu_.default"));
        assert!(is_inplace_aten("aten.add.out"));
        assert!(!is_inplace_aten("aten.add.Tensor"));
        assert!(!is_inplace_aten("aten.unsqueeze_.default"));
        assert!(!is_inplace_aten("aten.__and__.Tensor"));
        assert!(is_random_aten(aten_base("aten.native_dropout.default")));
        assert!(is_random_aten(aten_base("aten.bernoulli_.float")));
        assert!(!is_random_aten(aten_base(
            "aten.native_dropout_backward.default"
        )));
    }
}
