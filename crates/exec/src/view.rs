//! Views: how a view's logical contents derive from its storage owner's bytes
//! (slices, permutations, broadcasts, reshapes), so kernels read what the graph means.
//!
//! A view allocates nothing; the graph records it as the output of a view op
//! (`View`, `Split`, `Unbind`, `Permute`, `Expand`, `Crop2d`, or the backward of a
//! concat or permute). The executor passes the owner's bytes plus the steps below,
//! and the backend materialises the view before a kernel reads it. Views produced
//! by ops known only by name (imported graphs) are taken as reshapes: such graphs
//! run synthetic kernels, whose numbers carry no meaning.

use outcore_graph::{Graph, OpKind, TensorId};

/// One step from a source layout to a view of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewStep {
    /// Same elements in the same order.
    Reshape,
    /// Elements `start .. start + len` of `axis` of a `src_shape` tensor.
    Slice {
        axis: usize,
        start: u64,
        len: u64,
        src_shape: Vec<u64>,
    },
    /// Axes reordered: output axis `i` is source axis `dims[i]`.
    Permute {
        dims: Vec<usize>,
        src_shape: Vec<u64>,
    },
    /// Broadcast of `src_shape` (right-aligned, size-1 axes repeated) to `dst_shape`.
    Expand {
        src_shape: Vec<u64>,
        dst_shape: Vec<u64>,
    },
}

/// How to derive a view from its owner's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewMap {
    /// Bytes of the storage owner to read.
    pub owner_size_bytes: u64,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Steps from the owner to the view, in order.
    pub steps: Vec<ViewStep>,
}

/// The map of `t`, or `None` when `t` owns its storage (or is an in-place update,
/// which shares its target's storage element for element).
pub fn view_map(graph: &Graph, t: TensorId) -> Option<ViewMap> {
    graph.tensor(t).view_of?;
    let mut steps = Vec::new();
    let mut cur = t;
    // Walk producers back to a tensor that owns storage; a well-formed graph's
    // chains are short, the bound only guards malformed ones.
    for _ in 0..graph.tensors.len() {
        let tensor = graph.tensor(cur);
        if tensor.view_of.is_none() {
            break;
        }
        let Some(op) = tensor.producer.map(|p| graph.op(p)) else {
            break;
        };
        let Some(&parent) = op.inputs.first() else {
            break;
        };
        let src_shape = graph.tensor(parent).shape.clone();
        let k = op.outputs.iter().position(|&o| o == cur).unwrap_or(0);
        let prior_len = |axis: usize| -> u64 {
            op.outputs[..k]
                .iter()
                .map(|&o| graph.tensor(o).shape.get(axis).copied().unwrap_or(0))
                .sum()
        };
        match &op.kind {
            OpKind::Split { axis } => {
                let axis = *axis as usize;
                let len = tensor.shape.get(axis).copied().unwrap_or(1);
                steps.push(ViewStep::Slice {
                    axis,
                    start: prior_len(axis),
                    len,
                    src_shape,
                });
            }
            OpKind::Unbind { axis } => {
                let axis = *axis as usize;
                steps.push(ViewStep::Slice {
                    axis,
                    start: k as u64,
                    len: 1,
                    src_shape,
                });
            }
            OpKind::Permute { dims } => {
                let dims = dims.iter().map(|&d| d as usize).collect();
                steps.push(ViewStep::Permute { dims, src_shape });
            }
            OpKind::Expand => steps.push(ViewStep::Expand {
                src_shape,
                dst_shape: tensor.shape.clone(),
            }),
            OpKind::Crop2d { top, left } => {
                let mut mid = src_shape.clone();
                let (h, w) = (tensor.shape[2], tensor.shape[3]);
                mid[2] = h;
                steps.push(ViewStep::Slice {
                    axis: 3,
                    start: *left as u64,
                    len: w,
                    src_shape: mid,
                });
                steps.push(ViewStep::Slice {
                    axis: 2,
                    start: *top as u64,
                    len: h,
                    src_shape,
                });
            }
            OpKind::Backward { forward, grads_for } => match forward.as_ref() {
                // Each input's gradient is its slice of the output gradient.
                OpKind::Concat { axis } if grads_for.iter().all(|&g| g) => {
                    let axis = *axis as usize;
                    let len = tensor.shape.get(axis).copied().unwrap_or(1);
                    steps.push(ViewStep::Slice {
                        axis,
                        start: prior_len(axis),
                        len,
                        src_shape,
                    });
                }
                OpKind::Permute { dims } => {
                    let mut inverse = vec![0usize; dims.len()];
                    for (i, &d) in dims.iter().enumerate() {
                        inverse[d as usize] = i;
                    }
                    steps.push(ViewStep::Permute {
                        dims: inverse,
                        src_shape,
                    });
                }
                _ => steps.push(ViewStep::Reshape),
            },
            _ => steps.push(ViewStep::Reshape),
        }
        cur = parent;
    }
    steps.reverse();
    let owner = graph.storage_owner(t);
    Some(ViewMap {
        owner_size_bytes: graph.tensor(owner).size_bytes,
        elem_bytes: graph.tensor(t).dtype.size_bytes() as usize,
        steps,
    })
}

/// The view's bytes, from its owner's bytes.
pub fn materialise(owner: &[u8], map: &ViewMap) -> Vec<u8> {
    let e = map.elem_bytes.max(1);
    let mut data = owner.to_vec();
    for step in &map.steps {
        data = match step {
            ViewStep::Reshape => data,
            ViewStep::Slice {
                axis,
                start,
                len,
                src_shape,
            } => {
                let outer: u64 = src_shape[..*axis].iter().product();
                let inner: u64 = src_shape[axis + 1..].iter().product::<u64>() * e as u64;
                let src_len = src_shape.get(*axis).copied().unwrap_or(1);
                let mut out = Vec::with_capacity((outer * len * inner) as usize);
                for o in 0..outer {
                    let from = ((o * src_len + start) * inner) as usize;
                    let to = from + (len * inner) as usize;
                    out.extend_from_slice(data.get(from..to).unwrap_or(&[]));
                }
                out
            }
            ViewStep::Permute { dims, src_shape } => {
                let rank = src_shape.len();
                let strides = row_major_strides(src_shape);
                let out_shape: Vec<u64> = dims.iter().map(|&d| src_shape[d]).collect();
                let n: u64 = out_shape.iter().product();
                let mut out = Vec::with_capacity(n as usize * e);
                let mut idx = vec![0u64; rank];
                for _ in 0..n {
                    let src: u64 = (0..rank).map(|i| idx[i] * strides[dims[i]]).sum();
                    let from = src as usize * e;
                    out.extend_from_slice(data.get(from..from + e).unwrap_or(&[]));
                    increment(&mut idx, &out_shape);
                }
                out
            }
            ViewStep::Expand {
                src_shape,
                dst_shape,
            } => {
                let rank = dst_shape.len();
                let pad = rank.saturating_sub(src_shape.len());
                let src_full: Vec<u64> = std::iter::repeat_n(1, pad)
                    .chain(src_shape.iter().copied())
                    .collect();
                let strides = row_major_strides(&src_full);
                let n: u64 = dst_shape.iter().product();
                let mut out = Vec::with_capacity(n as usize * e);
                let mut idx = vec![0u64; rank];
                for _ in 0..n {
                    let src: u64 = (0..rank)
                        .map(|i| {
                            if src_full[i] == 1 {
                                0
                            } else {
                                idx[i] * strides[i]
                            }
                        })
                        .sum();
                    let from = src as usize * e;
                    out.extend_from_slice(data.get(from..from + e).unwrap_or(&[]));
                    increment(&mut idx, dst_shape);
                }
                out
            }
        };
    }
    data
}

fn row_major_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

fn increment(idx: &mut [u64], shape: &[u64]) {
    for i in (0..idx.len()).rev() {
        idx[i] += 1;
        if idx[i] < shape[i] {
            return;
        }
        idx[i] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[u8]) -> Vec<u8> {
        v.to_vec()
    }

    #[test]
    fn slice_permute_and_expand_of_one_byte_elements() {
        // A 2x3 tensor [[0,1,2],[3,4,5]].
        let owner = bytes(&[0, 1, 2, 3, 4, 5]);
        let slice = ViewMap {
            owner_size_bytes: 6,
            elem_bytes: 1,
            steps: vec![ViewStep::Slice {
                axis: 1,
                start: 1,
                len: 2,
                src_shape: vec![2, 3],
            }],
        };
        assert_eq!(materialise(&owner, &slice), vec![1, 2, 4, 5]);
        let transpose = ViewMap {
            owner_size_bytes: 6,
            elem_bytes: 1,
            steps: vec![ViewStep::Permute {
                dims: vec![1, 0],
                src_shape: vec![2, 3],
            }],
        };
        assert_eq!(materialise(&owner, &transpose), vec![0, 3, 1, 4, 2, 5]);
        let expand = ViewMap {
            owner_size_bytes: 3,
            elem_bytes: 1,
            steps: vec![ViewStep::Expand {
                src_shape: vec![3],
                dst_shape: vec![2, 3],
            }],
        };
        assert_eq!(materialise(&[7, 8, 9], &expand), vec![7, 8, 9, 7, 8, 9]);
    }

    #[test]
    fn steps_compose_in_order() {
        // Slice the second row of a 2x3, then view it as 3x1 and transpose to 1x3.
        let owner = bytes(&[0, 1, 2, 3, 4, 5]);
        let map = ViewMap {
            owner_size_bytes: 6,
            elem_bytes: 1,
            steps: vec![
                ViewStep::Slice {
                    axis: 0,
                    start: 1,
                    len: 1,
                    src_shape: vec![2, 3],
                },
                ViewStep::Reshape,
                ViewStep::Permute {
                    dims: vec![1, 0],
                    src_shape: vec![3, 1],
                },
            ],
        };
        assert_eq!(materialise(&owner, &map), vec![3, 4, 5]);
    }

    #[test]
    fn split_views_of_a_graph_read_their_own_part() {
        use outcore_graph::DType;
        use outcore_graph::builder::{GraphBuilder, Optimizer};
        let mut b = GraphBuilder::new("split", 1, DType::Float32);
        let x = b.input("x", &[1, 2, 6]);
        let y = b.label("y", &[2]);
        let h = b.linear("fc", x, 6, true);
        let parts = b.split("qkv", h, 2, &[2, 2, 2]);
        let s = b.add(&[parts[0], parts[2]]);
        let flat = b.reshape(s, &[2, 2]);
        let loss = b.softmax_cross_entropy(flat, y);
        let g = b.finish(loss, Optimizer::None).expect("valid");
        let map = view_map(&g, parts[2]).expect("a view");
        // Owner rows [0..6) and [6..12): the third part is columns 4 and 5 of each row.
        let owner: Vec<u8> = (0..12).collect();
        let four_byte = ViewMap {
            elem_bytes: 1,
            ..map
        };
        assert_eq!(materialise(&owner, &four_byte), vec![4, 5, 10, 11]);
    }
}
