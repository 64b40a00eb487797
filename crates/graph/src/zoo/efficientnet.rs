//! EfficientNet-B0 (mobile inverted bottlenecks with squeeze-and-excitation
//! and SiLU), after torchvision's `efficientnet.py`.
//!
//! Choices, and why:
//! - SiLU is one out-of-place op that keeps its input, as `silu_backward`
//!   does. torchvision calls `SiLU(inplace=True)`; eager autograd then clones
//!   the batch-norm output before the in-place update (the exported graph has
//!   a `clone` before every `silu_`), which holds the same two tensors as the
//!   out-of-place form (input kept, output new) and adds a copy's time.
//! - Stochastic depth (`StochasticDepth(p, "row")` on every residual block,
//!   p growing linearly to 0.2) multiplies the block's output by a per-sample
//!   noise tensor `[n, 1, 1, 1]`. The zoo draws no random numbers here: the
//!   noise is a constant tensor of ones (every sample survives), with the
//!   memory (n floats) and the broadcast product of torchvision's. The
//!   product keeps both factors for backward, as the builder's `mul` does;
//!   PyTorch keeps only the noise (the block's output needs no keeping when
//!   the noise takes no gradient), so the zoo keeps about 1% more than the
//!   exported graph (`tests/zoo_vs_pytorch.rs`).
//! - Squeeze-and-excitation's average pool keeps its input for backward (the
//!   builder's pool does), where PyTorch's `mean` keeps nothing; the same
//!   tensor is kept by the excitation's product anyway, so the footprint is
//!   the same.

use super::{ModelInfo, ModelRequest};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{Conv2dAttrs, DType, Graph, GraphError, TensorId};

const SOURCE: &str = "torchvision.models.efficientnet_b0 (Tan and Le 2019)";

pub(super) fn models() -> Vec<ModelInfo> {
    vec![ModelInfo {
        name: "efficientnet_b0",
        description: "EfficientNet-B0: 16 MBConv blocks with squeeze-and-excitation, SiLU, batch norm, \
            stochastic depth 0.2 (as a constant all-survive noise), dropout 0.2 classifier, 224x224 ImageNet",
        source: SOURCE,
        knobs: &[],
        default_batch: 64,
        reference_param_count: Some(5_288_548),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_efficientnet_b0,
    }]
}

/// One stage: `(expand ratio, kernel, stride, input channels, output channels, blocks)`,
/// torchvision's `MBConvConfig` at width and depth multipliers 1.0.
const STAGES: [(u64, u32, u32, u64, u64, u64); 7] = [
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
];

/// torchvision's `stochastic_depth_prob` for B0.
const STOCHASTIC_DEPTH: f32 = 0.2;

fn build_efficientnet_b0(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 224, 224]);
    let labels = b.label("labels", &[n]);
    b.push_scope("features");
    let mut h = b.scoped("0", |b| conv_bn(b, x, 32, 3, 1, 2, true));
    let total_blocks: u64 = STAGES.iter().map(|s| s.5).sum();
    let mut block_id = 0u64;
    for (stage, &(expand, kernel, stride, in_ch, out_ch, blocks)) in STAGES.iter().enumerate() {
        b.push_scope((stage + 1).to_string());
        for j in 0..blocks {
            let (cin, s) = if j == 0 { (in_ch, stride) } else { (out_ch, 1) };
            let sd_p = STOCHASTIC_DEPTH * block_id as f32 / total_blocks as f32;
            let block = MbConv {
                expand,
                kernel,
                stride: s,
                in_ch: cin,
                out_ch,
                stochastic_depth: sd_p,
            };
            h = b.scoped(j.to_string(), |b| block.build(b, h));
            block_id += 1;
        }
        b.pop_scope();
    }
    h = b.scoped("8", |b| conv_bn(b, h, 1280, 1, 1, 1, true));
    b.pop_scope();
    let pooled = b.global_avg_pool(h);
    let logits = b.scoped("classifier", |b| {
        let d = b.dropout(pooled, 0.2);
        b.linear("1", d, 1000, true)
    });
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

/// `Conv2dNormActivation` with SiLU when `act` (MobileNetV2's conv and batch
/// norm, `super::mobilenet::conv_bn`).
fn conv_bn(
    b: &mut GraphBuilder,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    groups: u64,
    stride: u32,
    act: bool,
) -> TensorId {
    let h = super::mobilenet::conv_bn(b, x, out_ch, kernel, stride, groups as u32);
    if act { b.silu(h) } else { h }
}

/// torchvision's `_make_divisible(v, 8)`: round to the nearest multiple of 8,
/// not below 90% of `v`.
fn make_divisible(v: u64) -> u64 {
    let rounded = ((v + 4) / 8 * 8).max(8);
    if rounded * 10 < v * 9 {
        rounded + 8
    } else {
        rounded
    }
}

/// One `MBConv` block.
struct MbConv {
    expand: u64,
    kernel: u32,
    stride: u32,
    in_ch: u64,
    out_ch: u64,
    stochastic_depth: f32,
}

impl MbConv {
    fn build(&self, b: &mut GraphBuilder, x: TensorId) -> TensorId {
        let expanded = make_divisible(self.in_ch * self.expand);
        let residual = self.stride == 1 && self.in_ch == self.out_ch;
        let out = b.scoped("block", |b| {
            let mut h = x;
            let mut index = 0;
            if expanded != self.in_ch {
                h = b.scoped("0", |b| conv_bn(b, h, expanded, 1, 1, 1, true));
                index += 1;
            }
            h = b.scoped(index.to_string(), |b| {
                conv_bn(b, h, expanded, self.kernel, expanded, self.stride, true)
            });
            let squeeze = (self.in_ch / 4).max(1);
            h = b.scoped((index + 1).to_string(), |b| {
                squeeze_excitation(b, h, expanded, squeeze)
            });
            b.scoped((index + 2).to_string(), |b| {
                conv_bn(b, h, self.out_ch, 1, 1, 1, false)
            })
        });
        if !residual {
            return out;
        }
        let dropped = b.scoped("stochastic_depth", |b| {
            stochastic_depth(b, out, self.stochastic_depth)
        });
        b.add(&[dropped, x])
    }
}

/// `SqueezeExcitation(channels, squeeze, activation=SiLU)`: average pool,
/// `fc1` (1x1 conv with bias), SiLU, `fc2`, sigmoid, scale of the input.
fn squeeze_excitation(b: &mut GraphBuilder, x: TensorId, channels: u64, squeeze: u64) -> TensorId {
    let shape = b.shape(x).to_vec();
    let pooled = b.global_avg_pool(x);
    let pooled = b.reshape(pooled, &[shape[0], channels, 1, 1]);
    let s = b.conv2d_full("fc1", pooled, squeeze, one_by_one_with_bias());
    let s = b.silu(s);
    let s = b.conv2d_full("fc2", s, channels, one_by_one_with_bias());
    let scale = b.sigmoid(s);
    b.mul(x, scale)
}

fn one_by_one_with_bias() -> Conv2dAttrs {
    Conv2dAttrs {
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
        bias: true,
    }
}

/// Row-mode stochastic depth as a constant all-survive noise (module docs):
/// `x * noise` with `noise` of shape `[n, 1, 1, 1]`. `p` is recorded in the
/// noise's name.
fn stochastic_depth(b: &mut GraphBuilder, x: TensorId, p: f32) -> TensorId {
    let n = b.shape(x)[0];
    let noise = b.full(&format!("noise_p{p:.4}"), &[n, 1, 1, 1], 1.0);
    b.mul(x, noise)
}
