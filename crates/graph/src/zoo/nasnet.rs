//! NASNet-A (normal and reduction cells found by architecture search), after Cadene's `pretrainedmodels` `nasnetalarge`, with repeats and width as knobs.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{Conv2dAttrs, DType, Graph, GraphError, TensorId};

const SOURCE: &str = "Cadene pretrainedmodels nasnetalarge (Zoph et al. 2018, NASNet-A Large)";

/// Channels of the stem convolution (fixed in the reference).
const STEM_FILTERS: u64 = 96;
/// Input side in pixels (NASNet-A Large's 331x331).
const IMAGE_PX: u64 = 331;
/// `filters` must be a multiple of this: the first stem cell has `filters / 96`
/// channels (`filters / 24` split four ways).
const FILTERS_QUANTUM: u64 = 96;
/// Largest `filters` accepted (24x the reference's 4032).
const MAX_FILTERS: u64 = 24 * 4032;
/// Largest `repeats` accepted (SwapAdvisor's deepest NASNet has 25).
const MAX_REPEATS: u64 = 100;

pub(super) fn models() -> Vec<ModelInfo> {
    vec![ModelInfo {
        name: "nasnet",
        description: "NASNet-A on 331x331 ImageNet: two stem cells, three stages of `repeats` \
            cells separated by two reduction cells; defaults are NASNet-A Large (6 @ 4032), \
            SwapAdvisor's NasNet-25 is repeats 25",
        source: SOURCE,
        knobs: &[
            Knob {
                name: "repeats",
                default: 6,
                help: "cells per stage (one first cell plus repeats - 1 normal cells)",
            },
            Knob {
                name: "filters",
                default: 4032,
                help: "penultimate filters (channels of the last cell), a multiple of 96",
            },
        ],
        default_batch: 16,
        // NASNet-A Large with a 1000-class head (the `imagenet` setting; Cadene's
        // default 1001-class head with background has 4,033 more).
        reference_param_count: Some(88_753_150),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_nasnet,
    }]
}

/// A bias-free convolution with square `(kernel, stride, padding)` and `groups`.
fn conv(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    (kernel, stride, padding): (u32, u32, u32),
    groups: u32,
) -> TensorId {
    let attrs = Conv2dAttrs {
        kernel: [kernel, kernel],
        stride: [stride, stride],
        padding: [padding, padding],
        dilation: [1, 1],
        groups,
        bias: false,
    };
    b.conv2d_full(name, x, out_ch, attrs)
}

/// `SeparableConv2d`: depthwise `kernel` conv with `stride`, then pointwise 1x1.
fn separable(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    stride: u32,
) -> TensorId {
    let in_ch = b.shape(x)[1];
    b.scoped(name, |b| {
        let pad = kernel / 2;
        let d = conv(
            b,
            "depthwise_conv2d",
            x,
            in_ch,
            (kernel, stride, pad),
            in_ch as u32,
        );
        conv(b, "pointwise_conv2d", d, out_ch, (1, 1, 0), 1)
    })
}

/// How a separable branch treats its first (possibly strided) separable conv.
#[derive(Clone, Copy, PartialEq)]
enum SepKind {
    /// `BranchSeparables`: first separable keeps the input width.
    Plain,
    /// `BranchSeparablesStem`: first separable already maps to `out_ch`.
    Stem,
    /// `BranchSeparablesReduction`: zero-pad left/top by 1 before the first
    /// separable, then drop the first row and column (`.contiguous()`: a copy).
    Reduction,
}

/// ReLU, separable, BN, ReLU, separable (stride 1), BN; every BN has eps 1e-3 in
/// the reference (the builder records 1e-5, changing no size or saved tensor).
fn branch_separables(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    stride: u32,
    kind: SepKind,
) -> TensorId {
    let in_ch = b.shape(x)[1];
    let mid = if kind == SepKind::Stem { out_ch } else { in_ch };
    b.scoped(name, |b| {
        let mut h = b.relu(x);
        if kind == SepKind::Reduction {
            h = b.zero_pad2d(h, [1, 0, 1, 0]);
        }
        h = separable(b, "separable_1", h, mid, kernel, stride);
        if kind == SepKind::Reduction {
            let cropped = b.crop2d(h, 1, 1);
            let shape = b.shape(cropped).to_vec();
            h = b.copy("contiguous", cropped, &shape);
        }
        h = b.batch_norm("bn_sep_1", h);
        h = b.relu(h);
        h = separable(b, "separable_2", h, out_ch, kernel, 1);
        b.batch_norm("bn_sep_2", h)
    })
}

/// `MaxPoolPad` / `AvgPoolPad` (3x3, stride 2, padding 1 after a left/top zero
/// pad, then `x[:, :, 1:, 1:]`, a view), or the plain pool when `padded` is false.
fn pool3_s2(b: &mut GraphBuilder, x: TensorId, max: bool, padded: bool) -> TensorId {
    let h = if padded {
        b.zero_pad2d(x, [1, 0, 1, 0])
    } else {
        x
    };
    let h = if max {
        b.max_pool2d(h, 3, 2, 1, false)
    } else {
        b.avg_pool2d_exclude_pad(h, 3, 2, 1, false)
    };
    if padded { b.crop2d(h, 1, 1) } else { h }
}

/// 3x3 stride-1 average pool without padding in the divisor.
fn avg3(b: &mut GraphBuilder, x: TensorId) -> TensorId {
    b.avg_pool2d_exclude_pad(x, 3, 1, 1, false)
}

/// ReLU, 1x1 conv, BN (`conv_1x1` / `conv_prev_1x1`).
fn relu_conv_bn(b: &mut GraphBuilder, name: &str, x: TensorId, out_ch: u64) -> TensorId {
    b.scoped(name, |b| {
        let h = b.relu(x);
        let h = conv(b, "conv", h, out_ch, (1, 1, 0), 1);
        b.batch_norm("bn", h)
    })
}

/// The factorised reduction of the previous, twice-as-large input used by the
/// second stem cell and each stage's first cell: ReLU, then two half-width paths
/// (1x1 stride-2 pool + 1x1 conv, the second shifted by one pixel via pad and
/// crop), concatenated and batch-normalised.
fn factorized_reduction(b: &mut GraphBuilder, x: TensorId, out_ch: u64) -> TensorId {
    let r = b.relu(x);
    let p1 = b.scoped("path_1", |b| {
        let p = b.avg_pool2d_exclude_pad(r, 1, 2, 0, false);
        conv(b, "conv", p, out_ch / 2, (1, 1, 0), 1)
    });
    let p2 = b.scoped("path_2", |b| {
        let p = b.zero_pad2d(r, [0, 1, 0, 1]);
        let p = b.crop2d(p, 1, 1);
        let p = b.avg_pool2d_exclude_pad(p, 1, 2, 0, false);
        conv(b, "conv", p, out_ch / 2, (1, 1, 0), 1)
    });
    let cat = b.concat(&[p1, p2], 1);
    b.batch_norm("final_path_bn", cat)
}

/// The five-combination body shared by the stem and reduction cells: `left` is
/// the 1x1-projected input that pools read, `right` the other operand (raw input
/// for stem 0). Returns the concat of combinations 1 to 4.
fn reduction_body(
    b: &mut GraphBuilder,
    left: TensorId,
    right: TensorId,
    width: u64,
    right_kind: SepKind,
    left_kind: SepKind,
    padded_pools: bool,
) -> TensorId {
    let c0l = branch_separables(b, "comb_iter_0_left", left, width, 5, 2, left_kind);
    let c0r = branch_separables(b, "comb_iter_0_right", right, width, 7, 2, right_kind);
    let c0 = b.add(&[c0l, c0r]);
    let c1l = pool3_s2(b, left, true, padded_pools);
    let c1r = branch_separables(b, "comb_iter_1_right", right, width, 7, 2, right_kind);
    let c1 = b.add(&[c1l, c1r]);
    let c2l = pool3_s2(b, left, false, padded_pools);
    let c2r = branch_separables(b, "comb_iter_2_right", right, width, 5, 2, right_kind);
    let c2 = b.add(&[c2l, c2r]);
    let c3r = avg3(b, c0);
    let c3 = b.add(&[c3r, c1]);
    let c4l = branch_separables(b, "comb_iter_4_left", c0, width, 3, 1, left_kind);
    let c4r = pool3_s2(b, left, true, padded_pools);
    let c4 = b.add(&[c4l, c4r]);
    b.concat(&[c1, c2, c3, c4], 1)
}

/// The normal-cell body (`FirstCell` and `NormalCell` after their projections):
/// returns `cat[left, c0..c4]`, `width` + 5 x `width` channels when the left
/// operand has `width` channels.
fn normal_body(b: &mut GraphBuilder, left: TensorId, right: TensorId, width: u64) -> TensorId {
    let left_ch = b.shape(left)[1];
    let p = SepKind::Plain;
    let c0l = branch_separables(b, "comb_iter_0_left", right, width, 5, 1, p);
    let c0r = branch_separables(b, "comb_iter_0_right", left, left_ch, 3, 1, p);
    let c0 = b.add(&[c0l, c0r]);
    let c1l = branch_separables(b, "comb_iter_1_left", left, left_ch, 5, 1, p);
    let c1r = branch_separables(b, "comb_iter_1_right", left, left_ch, 3, 1, p);
    let c1 = b.add(&[c1l, c1r]);
    let c2l = avg3(b, right);
    let c2 = b.add(&[c2l, left]);
    let c3l = avg3(b, left);
    let c3r = avg3(b, left);
    let c3 = b.add(&[c3l, c3r]);
    let c4l = branch_separables(b, "comb_iter_4_left", right, width, 3, 1, p);
    let c4 = b.add(&[c4l, right]);
    b.concat(&[left, c0, c1, c2, c3, c4], 1)
}

fn build_nasnet(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let repeats = req.knob("repeats");
    let filters = req.knob("filters");
    if !(1..=MAX_REPEATS).contains(&repeats) {
        return Err(bad_knob(
            name,
            format!("repeats {repeats} is not between 1 and {MAX_REPEATS}"),
        ));
    }
    if !filters.is_multiple_of(FILTERS_QUANTUM)
        || !(FILTERS_QUANTUM..=MAX_FILTERS).contains(&filters)
    {
        return Err(bad_knob(
            name,
            format!(
                "filters {filters} is not a multiple of {FILTERS_QUANTUM} between \
                 {FILTERS_QUANTUM} and {MAX_FILTERS}"
            ),
        ));
    }
    // The reference's `filters = penultimate_filters // 24`: the first stage's cell
    // width; stages double it.
    let f = filters / 24;
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, IMAGE_PX, IMAGE_PX]);
    let labels = b.label("labels", &[n]);

    let conv0 = b.scoped("conv0", |b| {
        let h = conv(b, "conv", x, STEM_FILTERS, (3, 2, 0), 1);
        b.batch_norm("bn", h)
    });
    let stem0 = b.scoped("cell_stem_0", |b| {
        let left = relu_conv_bn(b, "conv_1x1", conv0, f / 4);
        let (stem, plain) = (SepKind::Stem, SepKind::Plain);
        reduction_body(b, left, conv0, f / 4, stem, plain, false)
    });
    let stem1 = b.scoped("cell_stem_1", |b| {
        let left = relu_conv_bn(b, "conv_1x1", stem0, f / 2);
        let right = factorized_reduction(b, conv0, f / 2);
        let plain = SepKind::Plain;
        reduction_body(b, left, right, f / 2, plain, plain, false)
    });

    let (mut prev, mut cur) = (stem0, stem1);
    let mut cell = 0;
    for stage in 0..3u64 {
        let width = f << stage;
        if stage > 0 {
            // Reduction cell 0 pads and crops (as NASNet's TensorFlow "SAME"
            // padding does); reduction cell 1 does not.
            let padded = stage == 1;
            let red = b.scoped(format!("reduction_cell_{}", stage - 1), |b| {
                let left = relu_conv_bn(b, "conv_prev_1x1", prev, width);
                let right = relu_conv_bn(b, "conv_1x1", cur, width);
                let kind = if padded {
                    SepKind::Reduction
                } else {
                    SepKind::Plain
                };
                // In the reduction cells the separable branches read the
                // projected current input (`x_right`) on the left and the
                // projected previous input (`x_left`) on the right.
                reduction_body(b, right, left, width, kind, kind, padded)
            });
            cur = red;
        }
        for r in 0..repeats {
            let out = b.scoped(format!("cell_{cell}"), |b| {
                let left = if r == 0 {
                    // `FirstCell`: the previous input has twice the resolution.
                    factorized_reduction(b, prev, width)
                } else {
                    relu_conv_bn(b, "conv_prev_1x1", prev, width)
                };
                let right = relu_conv_bn(b, "conv_1x1", cur, width);
                normal_body(b, left, right, width)
            });
            prev = cur;
            cur = out;
            cell += 1;
        }
    }
    let h = b.relu(cur);
    let side = b.shape(h)[2] as u32;
    let pooled = b.avg_pool2d(h, side, 1, 0, false);
    let flat = b.flatten(pooled);
    let dropped = b.dropout(flat, 0.5);
    let logits = b.linear("last_linear", dropped, 1000, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}
