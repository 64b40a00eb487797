//! Structural validation of a graph, reporting every located violation.

use crate::builder::MAX_TENSOR_BYTES;
use crate::error::{Location, ValidationErrors, Violation, ViolationKind};
use crate::{Graph, OpId, TensorId};

/// The most bytes all tensors and workspaces of a graph may add up to: live
/// bytes are summed as signed 64-bit deltas.
const MAX_TOTAL: u64 = i64::MAX as u64;

/// Checks that `graph` is well formed: dense ids, no dangling references, one
/// producer per tensor, every read after its producer in the given order, no
/// dependence cycle, sane views and in-place updates, and non-zero sizes that
/// agree with shape and dtype.
pub fn validate(graph: &Graph) -> Result<(), ValidationErrors> {
    let mut v = Vec::new();
    let n_tensors = graph.tensors.len();
    let n_ops = graph.ops.len();

    for (i, t) in graph.tensors.iter().enumerate() {
        if t.id.index() != i {
            v.push(at_graph(ViolationKind::IdNotDense {
                index: i,
                found: t.id.0,
            }));
        }
    }
    for (i, op) in graph.ops.iter().enumerate() {
        if op.id.index() != i {
            v.push(at_graph(ViolationKind::IdNotDense {
                index: i,
                found: op.id.0,
            }));
        }
    }
    if !v.is_empty() {
        // Everything below indexes by id; stop here.
        return Err(ValidationErrors { violations: v });
    }
    // The analyses sum sizes (signed, for live-byte deltas), FLOPs and bytes
    // moved over the whole graph: if the totals fit, no partial sum wraps.
    fn total(mut values: impl Iterator<Item = u64>) -> Option<u64> {
        values.try_fold(0u64, |sum, x| sum.checked_add(x))
    }
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
    if !v.is_empty() {
        return Err(ValidationErrors { violations: v });
    }

    // Operand references and producers as the ops see them.
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

    for t in &graph.tensors {
        let here = Location::Tensor(t.id);
        if let Some(p) = t.producer
            && p.index() >= n_ops
        {
            v.push(Violation {
                location: here,
                kind: ViolationKind::DanglingReference {
                    field: "producer",
                    target: p.0,
                },
            });
            continue;
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
        if t.size_bytes == 0 {
            v.push(Violation {
                location: here,
                kind: ViolationKind::ZeroSize,
            });
        } else if t.size_bytes > MAX_TENSOR_BYTES {
            v.push(Violation {
                location: here,
                kind: ViolationKind::TooLarge {
                    what: "size_bytes",
                    limit: MAX_TENSOR_BYTES,
                },
            });
        } else {
            // Checked: the shape of a file can be anything.
            let expected_bytes = t
                .shape
                .iter()
                .try_fold(t.dtype.size_bytes(), |n, &d| n.checked_mul(d))
                .unwrap_or(u64::MAX);
            if expected_bytes != t.size_bytes {
                v.push(Violation {
                    location: here,
                    kind: ViolationKind::SizeMismatch { expected_bytes },
                });
            }
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
        check_view(graph, t.id, &mut v);
        check_inplace(graph, t.id, &mut v);
    }
    check_second_updates(graph, &mut v);

    // Reads in the given order, and cycles in the dependence relation.
    for op in &graph.ops {
        for &t in &op.inputs {
            if t.index() >= n_tensors {
                continue;
            }
            if let Some(p) = actual_producer[t.index()]
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
    if let Some(cycle) = find_cycle(graph, &actual_producer) {
        v.push(at_graph(ViolationKind::Cycle { ops: cycle }));
    }

    if v.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors { violations: v })
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
