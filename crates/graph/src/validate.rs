//! Structural validation of a graph, reporting every located violation.

use crate::builder::MAX_TENSOR_BYTES;
use crate::error::{Location, ValidationErrors, Violation, ViolationKind};
use crate::{Graph, OpId, Tensor, TensorId};

/// The most bytes all tensors and workspaces of a graph may add up to: live
/// bytes are summed as signed 64-bit deltas.
const MAX_TOTAL: u64 = i64::MAX as u64;

/// Checks that `graph` is well formed: dense ids, no dangling references, one
/// producer per tensor, every read after its producer in the given order, no
/// dependence cycle, sane views and in-place updates, and non-zero sizes that
/// agree with shape and dtype.
pub fn validate(graph: &Graph) -> Result<(), ValidationErrors> {
    // Everything after the first check indexes by id, and everything after
    // the second sums sizes: each stops the validation where it fails.
    let mut v = check_dense_ids(graph);
    if v.is_empty() {
        v = check_totals(graph);
    }
    if !v.is_empty() {
        return Err(ValidationErrors { violations: v });
    }
    let actual_producer = producers_as_ops_see_them(graph, &mut v);
    for t in &graph.tensors {
        check_tensor(graph, t, &actual_producer, &mut v);
    }
    check_second_updates(graph, &mut v);
    check_read_order(graph, &actual_producer, &mut v);
    if let Some(cycle) = find_cycle(graph, &actual_producer) {
        v.push(at_graph(ViolationKind::Cycle { ops: cycle }));
    }
    if v.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors { violations: v })
    }
}

/// Tensor and op ids equal to their positions.
fn check_dense_ids(graph: &Graph) -> Vec<Violation> {
    let tensor_ids = graph.tensors.iter().map(|t| t.id.0);
    let op_ids = graph.ops.iter().map(|o| o.id.0);
    let mut v: Vec<Violation> = misplaced_ids(tensor_ids).collect();
    v.extend(misplaced_ids(op_ids));
    v
}

/// A violation for each id in `ids` that is not its position.
fn misplaced_ids(ids: impl Iterator<Item = u32>) -> impl Iterator<Item = Violation> {
    ids.enumerate()
        .filter(|&(i, found)| found as usize != i)
        .map(|(index, found)| at_graph(ViolationKind::IdNotDense { index, found }))
}

/// The analyses sum sizes (signed, for live-byte deltas), FLOPs and bytes
/// moved over the whole graph: if the totals fit, no partial sum wraps.
fn check_totals(graph: &Graph) -> Vec<Violation> {
    fn total(mut values: impl Iterator<Item = u64>) -> Option<u64> {
        values.try_fold(0u64, |sum, x| sum.checked_add(x))
    }
    let mut v = Vec::new();
    let memory = total(
        graph
            .tensors
            .iter()
            .map(|t| t.size_bytes)
            .chain(graph.ops.iter().map(|o| o.workspace_bytes)),
    );
    if memory.is_none_or(|b| b > MAX_TOTAL) {
        v.push(at_graph(ViolationKind::TooLarge {
            what: "the sum of all tensors' size_bytes and ops' workspace_bytes",
            limit: MAX_TOTAL,
        }));
    }
    if total(graph.ops.iter().map(|o| o.flops)).is_none() {
        v.push(at_graph(ViolationKind::TooLarge {
            what: "the sum of all ops' flops",
            limit: u64::MAX,
        }));
    }
    let moved = total(
        graph
            .ops
            .iter()
            .flat_map(|o| [o.bytes_read, o.bytes_written]),
    );
    if moved.is_none() {
        v.push(at_graph(ViolationKind::TooLarge {
            what: "the sum of all ops' bytes_read and bytes_written",
            limit: u64::MAX,
        }));
    }
    v
}

/// Each tensor's producer as the ops' output lists give it, checking the
/// operand references on the way: no dangling tensor, at least one output,
/// no output listed twice, no tensor produced twice.
fn producers_as_ops_see_them(graph: &Graph, v: &mut Vec<Violation>) -> Vec<Option<OpId>> {
    let n_tensors = graph.tensors.len();
    let mut actual_producer: Vec<Option<OpId>> = vec![None; n_tensors];
    for op in &graph.ops {
        for &t in op.inputs.iter().chain(&op.outputs) {
            if t.index() >= n_tensors {
                v.push(Violation {
                    location: Location::Op(op.id),
                    kind: ViolationKind::DanglingTensor { tensor: t.0 },
                });
            }
        }
        if op.outputs.is_empty() {
            v.push(Violation {
                location: Location::Op(op.id),
                kind: ViolationKind::BadOutputs {
                    reason: "the op has no outputs".into(),
                },
            });
        }
        for (k, &t) in op.outputs.iter().enumerate() {
            if op.outputs[..k].contains(&t) {
                v.push(Violation {
                    location: Location::OpOperand {
                        op: op.id,
                        tensor: t,
                    },
                    kind: ViolationKind::BadOutputs {
                        reason: "output listed twice".into(),
                    },
                });
                continue;
            }
            if t.index() >= n_tensors {
                continue;
            }
            match actual_producer[t.index()] {
                Some(first) => v.push(Violation {
                    location: Location::Tensor(t),
                    kind: ViolationKind::TwoProducers {
                        first,
                        second: op.id,
                    },
                }),
                None => actual_producer[t.index()] = Some(op.id),
            }
        }
    }
    actual_producer
}

/// One tensor: its recorded producer exists and is the one the ops give,
/// its size, whether it may lack a producer, and its view and in-place
/// relations.
fn check_tensor(
    graph: &Graph,
    t: &Tensor,
    actual_producer: &[Option<OpId>],
    v: &mut Vec<Violation>,
) {
    let here = Location::Tensor(t.id);
    if let Some(p) = t.producer
        && p.index() >= graph.ops.len()
    {
        v.push(Violation {
            location: here,
            kind: ViolationKind::DanglingReference {
                field: "producer",
                target: p.0,
            },
        });
        return;
    }
    if t.producer != actual_producer[t.id.index()] {
        v.push(Violation {
            location: here,
            kind: ViolationKind::ProducerMismatch {
                recorded: t.producer,
                actual: actual_producer[t.id.index()],
            },
        });
    }
    if let Some(kind) = size_violation(t) {
        v.push(Violation {
            location: here,
            kind,
        });
    }
    match (t.producer, t.kind.is_graph_input()) {
        (None, false) => v.push(Violation {
            location: here,
            kind: ViolationKind::NoProducer,
        }),
        (Some(p), true) if t.inplace_update_of.is_none() && t.view_of.is_none() => {
            v.push(Violation {
                location: here,
                kind: ViolationKind::InputWithProducer { producer: p },
            })
        }
        _ => {}
    }
    check_view(graph, t.id, v);
    check_inplace(graph, t.id, v);
}

/// A size of zero, above [`MAX_TENSOR_BYTES`], or other than the shape and
/// dtype give.
fn size_violation(t: &Tensor) -> Option<ViolationKind> {
    if t.size_bytes == 0 {
        return Some(ViolationKind::ZeroSize);
    }
    if t.size_bytes > MAX_TENSOR_BYTES {
        return Some(ViolationKind::TooLarge {
            what: "size_bytes",
            limit: MAX_TENSOR_BYTES,
        });
    }
    // Checked: the shape of a file can be anything.
    let expected_bytes = t
        .shape
        .iter()
        .try_fold(t.dtype.size_bytes(), |n, &d| n.checked_mul(d))
        .unwrap_or(u64::MAX);
    (expected_bytes != t.size_bytes).then_some(ViolationKind::SizeMismatch { expected_bytes })
}

/// Every read after its producer in the graph's order.
fn check_read_order(graph: &Graph, actual_producer: &[Option<OpId>], v: &mut Vec<Violation>) {
    for op in &graph.ops {
        for &t in &op.inputs {
            if let Some(p) = actual_producer.get(t.index()).copied().flatten()
                && p >= op.id
            {
                v.push(Violation {
                    location: Location::OpOperand {
                        op: op.id,
                        tensor: t,
                    },
                    kind: ViolationKind::ReadBeforeProduced { producer: p },
                });
            }
        }
    }
}

fn at_graph(kind: ViolationKind) -> Violation {
    Violation {
        location: Location::Graph,
        kind,
    }
}

fn check_view(graph: &Graph, id: TensorId, v: &mut Vec<Violation>) {
    let t = graph.tensor(id);
    let Some(owner) = t.view_of else { return };
    let here = Location::Tensor(id);
    let bad = |reason: &str| Violation {
        location: here,
        kind: ViolationKind::BadView {
            reason: reason.to_string(),
        },
    };
    if owner.index() >= graph.tensors.len() {
        v.push(Violation {
            location: here,
            kind: ViolationKind::DanglingReference {
                field: "view_of",
                target: owner.0,
            },
        });
        return;
    }
    if owner == id {
        v.push(bad("a tensor cannot be a view of itself"));
        return;
    }
    if t.inplace_update_of.is_some() {
        v.push(bad("a tensor cannot be both a view and an in-place update"));
    }
    // Walk the chain: it must end within n steps at a tensor that owns storage.
    let mut cur = owner;
    for _ in 0..graph.tensors.len() {
        match graph.tensor(cur).view_of {
            Some(next) if next.index() < graph.tensors.len() => {
                if next == id {
                    v.push(bad("the view chain loops back to this tensor"));
                    return;
                }
                cur = next;
            }
            _ => break,
        }
    }
    // No size check against the owner: broadcasting views (`expand`) are logically
    // larger than the storage they read.
    let root = graph.tensor(cur);
    if root.inplace_update_of.is_some() {
        v.push(bad(&format!(
            "views an in-place update ({}); view the updated tensor instead",
            root.id
        )));
    }
}

fn check_inplace(graph: &Graph, id: TensorId, v: &mut Vec<Violation>) {
    let t = graph.tensor(id);
    let Some(target) = t.inplace_update_of else {
        return;
    };
    let here = Location::Tensor(id);
    if target.index() >= graph.tensors.len() {
        v.push(Violation {
            location: here,
            kind: ViolationKind::DanglingReference {
                field: "inplace_update_of",
                target: target.0,
            },
        });
        return;
    }
    let bad = |reason: String| Violation {
        location: here,
        kind: ViolationKind::BadInplaceUpdate { reason },
    };
    let tgt = graph.tensor(target);
    if !tgt.is_persistent() {
        v.push(bad(format!(
            "target {target} is not a persistent graph input (parameter, buffer or optimizer state)"
        )));
    }
    if tgt.size_bytes != t.size_bytes {
        v.push(bad(format!(
            "{} bytes update a {}-byte target {target}",
            t.size_bytes, tgt.size_bytes
        )));
    }
    if t.producer.is_none() {
        v.push(bad("an update must be produced by an op".into()));
    }
}

fn check_second_updates(graph: &Graph, v: &mut Vec<Violation>) {
    let mut updated_by: Vec<Option<TensorId>> = vec![None; graph.tensors.len()];
    for t in &graph.tensors {
        if let Some(target) = t.inplace_update_of
            && target.index() < graph.tensors.len()
        {
            match updated_by[target.index()] {
                Some(first) => v.push(Violation {
                    location: Location::Tensor(t.id),
                    kind: ViolationKind::BadInplaceUpdate {
                        reason: format!("{target} is already updated by {first}"),
                    },
                }),
                None => updated_by[target.index()] = Some(t.id),
            }
        }
    }
}

/// Finds a cycle in the op dependence relation (op A -> op B when B reads an
/// output of A), independent of the given order. Iterative DFS with colours.
fn find_cycle(graph: &Graph, producer: &[Option<OpId>]) -> Option<Vec<OpId>> {
    let n = graph.ops.len();
    // Predecessors of each op: producers of its inputs.
    let preds: Vec<Vec<OpId>> = graph
        .ops
        .iter()
        .map(|op| {
            op.inputs
                .iter()
                .filter(|t| t.index() < producer.len())
                .filter_map(|t| producer[t.index()])
                .collect()
        })
        .collect();
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    let mut colour = vec![Colour::White; n];
    let mut parent: Vec<Option<OpId>> = vec![None; n];
    for start in 0..n {
        if colour[start] != Colour::White {
            continue;
        }
        let mut stack: Vec<(OpId, usize)> = vec![(OpId(start as u32), 0)];
        colour[start] = Colour::Grey;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&p) = preds[node.index()].get(*next) {
                *next += 1;
                match colour[p.index()] {
                    Colour::White => {
                        colour[p.index()] = Colour::Grey;
                        parent[p.index()] = Some(node);
                        stack.push((p, 0));
                    }
                    Colour::Grey => {
                        // p reaches node through the stack; the cycle is p .. node, p.
                        let mut cycle = vec![p];
                        let mut cur = node;
                        while cur != p {
                            cycle.push(cur);
                            match parent[cur.index()] {
                                Some(up) => cur = up,
                                None => break,
                            }
                        }
                        cycle.push(p);
                        return Some(cycle);
                    }
                    Colour::Black => {}
                }
            } else {
                colour[node.index()] = Colour::Black;
                stack.pop();
            }
        }
    }
    None
}
