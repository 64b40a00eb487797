//! Inception-v3 (torchvision, with its auxiliary classifier) and Inception-v4 (Cadene's `pretrainedmodels`), with SwapAdvisor's channel scale.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{Conv2dAttrs, DType, Graph, GraphError, TensorId};

const SOURCE_V3: &str =
    "torchvision.models.inception_v3 with aux_logits=True (Szegedy et al. 2016)";
const SOURCE_V4: &str = "Cadene pretrainedmodels inceptionv4 (Szegedy et al. 2017, Inception-v4)";

pub(super) fn models() -> Vec<ModelInfo> {
    vec![
        ModelInfo {
            name: "inception_v3",
            description: "Inception-v3 on 299x299 ImageNet, auxiliary classifier included (its \
                loss is added to the main loss)",
            source: SOURCE_V3,
            knobs: &[],
            default_batch: 32,
            reference_param_count: Some(27_161_264),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_inception_v3,
        },
        ModelInfo {
            name: "inception_v4",
            description: "Inception-v4 on 299x299 ImageNet (4 A, 7 B, 3 C blocks); `scale` \
                multiplies every conv's channels, SwapAdvisor's Inception-X",
            source: SOURCE_V4,
            knobs: &[Knob {
                name: "scale",
                default: 1,
                help: "multiplier of every convolution's output channels (reference count at 1)",
            }],
            default_batch: 32,
            reference_param_count: Some(42_679_816),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_inception_v4,
        },
    ]
}

/// `BasicConv2d`: conv (no bias), batch norm, ReLU, named `name.conv` / `name.bn`.
/// Both references use batch-norm eps 1e-3; the builder records 1e-5, which
/// changes no shape, saved tensor or cost.
fn basic_conv(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    kernel: [u32; 2],
    stride: u32,
    padding: [u32; 2],
) -> TensorId {
    b.scoped(name, |b| {
        let attrs = Conv2dAttrs {
            kernel,
            stride: [stride, stride],
            padding,
            dilation: [1, 1],
            groups: 1,
            bias: false,
        };
        let h = b.conv2d_full("conv", x, out_ch, attrs);
        let h = b.batch_norm("bn", h);
        b.relu(h)
    })
}

/// Square-kernel [`basic_conv`].
fn bc(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    stride: u32,
    padding: u32,
) -> TensorId {
    basic_conv(b, name, x, out_ch, [kernel; 2], stride, [padding; 2])
}

/// 1x7 conv (padding 0, 3).
fn c1x7(b: &mut GraphBuilder, name: &str, x: TensorId, out_ch: u64) -> TensorId {
    basic_conv(b, name, x, out_ch, [1, 7], 1, [0, 3])
}

/// 7x1 conv (padding 3, 0).
fn c7x1(b: &mut GraphBuilder, name: &str, x: TensorId, out_ch: u64) -> TensorId {
    basic_conv(b, name, x, out_ch, [7, 1], 1, [3, 0])
}

/// 1x3 conv (padding 0, 1).
fn c1x3(b: &mut GraphBuilder, name: &str, x: TensorId, out_ch: u64) -> TensorId {
    basic_conv(b, name, x, out_ch, [1, 3], 1, [0, 1])
}

/// 3x1 conv (padding 1, 0).
fn c3x1(b: &mut GraphBuilder, name: &str, x: TensorId, out_ch: u64) -> TensorId {
    basic_conv(b, name, x, out_ch, [3, 1], 1, [1, 0])
}

// ----- Inception-v3 (torchvision) -----

fn build_inception_v3(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE_V3);
    let x = b.input("images", &[n, 3, 299, 299]);
    let labels = b.label("labels", &[n]);
    let mut h = bc(&mut b, "Conv2d_1a_3x3", x, 32, 3, 2, 0);
    h = bc(&mut b, "Conv2d_2a_3x3", h, 32, 3, 1, 0);
    h = bc(&mut b, "Conv2d_2b_3x3", h, 64, 3, 1, 1);
    h = b.max_pool2d(h, 3, 2, 0, false);
    h = bc(&mut b, "Conv2d_3b_1x1", h, 80, 1, 1, 0);
    h = bc(&mut b, "Conv2d_4a_3x3", h, 192, 3, 1, 0);
    h = b.max_pool2d(h, 3, 2, 0, false);
    for (block, pool_features) in [("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)] {
        h = b.scoped(block, |b| inception_a(b, h, pool_features));
    }
    h = b.scoped("Mixed_6a", |b| inception_b(b, h));
    for (block, c7) in [
        ("Mixed_6b", 128),
        ("Mixed_6c", 160),
        ("Mixed_6d", 160),
        ("Mixed_6e", 192),
    ] {
        h = b.scoped(block, |b| inception_c(b, h, c7));
    }
    // The auxiliary classifier runs in training mode on Mixed_6e's output.
    let aux_logits = b.scoped("AuxLogits", |b| {
        let a = b.avg_pool2d(h, 5, 3, 0, false);
        let a = bc(b, "conv0", a, 128, 1, 1, 0);
        let a = bc(b, "conv1", a, 768, 5, 1, 0);
        let a = b.global_avg_pool(a);
        b.linear("fc", a, 1000, true)
    });
    h = b.scoped("Mixed_7a", |b| inception_d(b, h));
    h = b.scoped("Mixed_7b", |b| inception_e(b, h));
    h = b.scoped("Mixed_7c", |b| inception_e(b, h));
    let pooled = b.global_avg_pool(h);
    let dropped = b.dropout(pooled, 0.5);
    let logits = b.linear("fc", dropped, 1000, true);
    let main_loss = b.softmax_cross_entropy(logits, labels);
    let aux_loss = b.scoped("AuxLogits", |b| b.softmax_cross_entropy(aux_logits, labels));
    // torchvision's recipe is `loss + 0.4 * aux_loss`; the 0.4 is a scalar factor
    // that changes no tensor's size or lifetime, so the losses are simply summed.
    let loss = b.add(&[main_loss, aux_loss]);
    b.finish(loss, req.optimizer)
}

fn inception_a(b: &mut GraphBuilder, x: TensorId, pool_features: u64) -> TensorId {
    let b1 = bc(b, "branch1x1", x, 64, 1, 1, 0);
    let b5 = bc(b, "branch5x5_1", x, 48, 1, 1, 0);
    let b5 = bc(b, "branch5x5_2", b5, 64, 5, 1, 2);
    let b3 = bc(b, "branch3x3dbl_1", x, 64, 1, 1, 0);
    let b3 = bc(b, "branch3x3dbl_2", b3, 96, 3, 1, 1);
    let b3 = bc(b, "branch3x3dbl_3", b3, 96, 3, 1, 1);
    let bp = b.avg_pool2d(x, 3, 1, 1, false);
    let bp = bc(b, "branch_pool", bp, pool_features, 1, 1, 0);
    b.concat(&[b1, b5, b3, bp], 1)
}

fn inception_b(b: &mut GraphBuilder, x: TensorId) -> TensorId {
    let b3 = bc(b, "branch3x3", x, 384, 3, 2, 0);
    let bd = bc(b, "branch3x3dbl_1", x, 64, 1, 1, 0);
    let bd = bc(b, "branch3x3dbl_2", bd, 96, 3, 1, 1);
    let bd = bc(b, "branch3x3dbl_3", bd, 96, 3, 2, 0);
    let bp = b.max_pool2d(x, 3, 2, 0, false);
    b.concat(&[b3, bd, bp], 1)
}

fn inception_c(b: &mut GraphBuilder, x: TensorId, c7: u64) -> TensorId {
    let b1 = bc(b, "branch1x1", x, 192, 1, 1, 0);
    let b7 = bc(b, "branch7x7_1", x, c7, 1, 1, 0);
    let b7 = c1x7(b, "branch7x7_2", b7, c7);
    let b7 = c7x1(b, "branch7x7_3", b7, 192);
    let bd = bc(b, "branch7x7dbl_1", x, c7, 1, 1, 0);
    let bd = c7x1(b, "branch7x7dbl_2", bd, c7);
    let bd = c1x7(b, "branch7x7dbl_3", bd, c7);
    let bd = c7x1(b, "branch7x7dbl_4", bd, c7);
    let bd = c1x7(b, "branch7x7dbl_5", bd, 192);
    let bp = b.avg_pool2d(x, 3, 1, 1, false);
    let bp = bc(b, "branch_pool", bp, 192, 1, 1, 0);
    b.concat(&[b1, b7, bd, bp], 1)
}

fn inception_d(b: &mut GraphBuilder, x: TensorId) -> TensorId {
    let b3 = bc(b, "branch3x3_1", x, 192, 1, 1, 0);
    let b3 = bc(b, "branch3x3_2", b3, 320, 3, 2, 0);
    let b7 = bc(b, "branch7x7x3_1", x, 192, 1, 1, 0);
    let b7 = c1x7(b, "branch7x7x3_2", b7, 192);
    let b7 = c7x1(b, "branch7x7x3_3", b7, 192);
    let b7 = bc(b, "branch7x7x3_4", b7, 192, 3, 2, 0);
    let bp = b.max_pool2d(x, 3, 2, 0, false);
    b.concat(&[b3, b7, bp], 1)
}

fn inception_e(b: &mut GraphBuilder, x: TensorId) -> TensorId {
    let b1 = bc(b, "branch1x1", x, 320, 1, 1, 0);
    let b3 = bc(b, "branch3x3_1", x, 384, 1, 1, 0);
    let b3a = c1x3(b, "branch3x3_2a", b3, 384);
    let b3b = c3x1(b, "branch3x3_2b", b3, 384);
    let b3 = b.concat(&[b3a, b3b], 1);
    let bd = bc(b, "branch3x3dbl_1", x, 448, 1, 1, 0);
    let bd = bc(b, "branch3x3dbl_2", bd, 384, 3, 1, 1);
    let bda = c1x3(b, "branch3x3dbl_3a", bd, 384);
    let bdb = c3x1(b, "branch3x3dbl_3b", bd, 384);
    let bd = b.concat(&[bda, bdb], 1);
    let bp = b.avg_pool2d(x, 3, 1, 1, false);
    let bp = bc(b, "branch_pool", bp, 192, 1, 1, 0);
    b.concat(&[b1, b3, bd, bp], 1)
}

// ----- Inception-v4 (Cadene) -----

/// Largest channel scale accepted: Inception-v4 at scale 64 already has ~170
/// billion parameters, far beyond any device.
const MAX_SCALE: u64 = 64;

fn build_inception_v4(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let s = req.knob("scale");
    if !(1..=MAX_SCALE).contains(&s) {
        return Err(bad_knob(
            name,
            format!("scale {s} is not between 1 and {MAX_SCALE}"),
        ));
    }
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE_V4);
    let x = b.input("images", &[n, 3, 299, 299]);
    let labels = b.label("labels", &[n]);
    b.push_scope("features");
    let mut h = bc(&mut b, "0", x, 32 * s, 3, 2, 0);
    h = bc(&mut b, "1", h, 32 * s, 3, 1, 0);
    h = bc(&mut b, "2", h, 64 * s, 3, 1, 1);
    h = b.scoped("3", |b| {
        let p = b.max_pool2d(h, 3, 2, 0, false);
        let c = bc(b, "conv", h, 96 * s, 3, 2, 0);
        b.concat(&[p, c], 1)
    });
    h = b.scoped("4", |b| mixed_4a(b, h, s));
    h = b.scoped("5", |b| {
        let c = bc(b, "conv", h, 192 * s, 3, 2, 0);
        let p = b.max_pool2d(h, 3, 2, 0, false);
        b.concat(&[c, p], 1)
    });
    let mut index = 6;
    for _ in 0..4 {
        h = b.scoped(index.to_string(), |b| v4_block_a(b, h, s));
        index += 1;
    }
    h = b.scoped(index.to_string(), |b| v4_reduction_a(b, h, s));
    index += 1;
    for _ in 0..7 {
        h = b.scoped(index.to_string(), |b| v4_block_b(b, h, s));
        index += 1;
    }
    h = b.scoped(index.to_string(), |b| v4_reduction_b(b, h, s));
    index += 1;
    for _ in 0..3 {
        h = b.scoped(index.to_string(), |b| v4_block_c(b, h, s));
        index += 1;
    }
    b.pop_scope();
    // `F.avg_pool2d(features, kernel_size=8)` over the 8x8 map: a global average.
    let kernel = b.shape(h)[2] as u32;
    let pooled = b.avg_pool2d(h, kernel, kernel, 0, false);
    let flat = b.flatten(pooled);
    let logits = b.linear("last_linear", flat, 1000, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

fn mixed_4a(b: &mut GraphBuilder, x: TensorId, s: u64) -> TensorId {
    let b0 = b.scoped("branch0", |b| {
        let h = bc(b, "0", x, 64 * s, 1, 1, 0);
        bc(b, "1", h, 96 * s, 3, 1, 0)
    });
    let b1 = b.scoped("branch1", |b| {
        let h = bc(b, "0", x, 64 * s, 1, 1, 0);
        let h = c1x7(b, "1", h, 64 * s);
        let h = c7x1(b, "2", h, 64 * s);
        bc(b, "3", h, 96 * s, 3, 1, 0)
    });
    b.concat(&[b0, b1], 1)
}

/// Cadene's pool branch: `AvgPool2d(3, stride=1, padding=1, count_include_pad=False)`.
fn pool_branch(b: &mut GraphBuilder, x: TensorId, out_ch: u64) -> TensorId {
    b.scoped("branch3", |b| {
        let p = b.avg_pool2d_exclude_pad(x, 3, 1, 1, false);
        bc(b, "1", p, out_ch, 1, 1, 0)
    })
}

fn v4_block_a(b: &mut GraphBuilder, x: TensorId, s: u64) -> TensorId {
    let b0 = bc(b, "branch0", x, 96 * s, 1, 1, 0);
    let b1 = b.scoped("branch1", |b| {
        let h = bc(b, "0", x, 64 * s, 1, 1, 0);
        bc(b, "1", h, 96 * s, 3, 1, 1)
    });
    let b2 = b.scoped("branch2", |b| {
        let h = bc(b, "0", x, 64 * s, 1, 1, 0);
        let h = bc(b, "1", h, 96 * s, 3, 1, 1);
        bc(b, "2", h, 96 * s, 3, 1, 1)
    });
    let b3 = pool_branch(b, x, 96 * s);
    b.concat(&[b0, b1, b2, b3], 1)
}

fn v4_reduction_a(b: &mut GraphBuilder, x: TensorId, s: u64) -> TensorId {
    let b0 = bc(b, "branch0", x, 384 * s, 3, 2, 0);
    let b1 = b.scoped("branch1", |b| {
        let h = bc(b, "0", x, 192 * s, 1, 1, 0);
        let h = bc(b, "1", h, 224 * s, 3, 1, 1);
        bc(b, "2", h, 256 * s, 3, 2, 0)
    });
    let b2 = b.max_pool2d(x, 3, 2, 0, false);
    b.concat(&[b0, b1, b2], 1)
}

fn v4_block_b(b: &mut GraphBuilder, x: TensorId, s: u64) -> TensorId {
    let b0 = bc(b, "branch0", x, 384 * s, 1, 1, 0);
    let b1 = b.scoped("branch1", |b| {
        let h = bc(b, "0", x, 192 * s, 1, 1, 0);
        let h = c1x7(b, "1", h, 224 * s);
        c7x1(b, "2", h, 256 * s)
    });
    let b2 = b.scoped("branch2", |b| {
        let h = bc(b, "0", x, 192 * s, 1, 1, 0);
        let h = c7x1(b, "1", h, 192 * s);
        let h = c1x7(b, "2", h, 224 * s);
        let h = c7x1(b, "3", h, 224 * s);
        c1x7(b, "4", h, 256 * s)
    });
    let b3 = pool_branch(b, x, 128 * s);
    b.concat(&[b0, b1, b2, b3], 1)
}

fn v4_reduction_b(b: &mut GraphBuilder, x: TensorId, s: u64) -> TensorId {
    let b0 = b.scoped("branch0", |b| {
        let h = bc(b, "0", x, 192 * s, 1, 1, 0);
        bc(b, "1", h, 192 * s, 3, 2, 0)
    });
    let b1 = b.scoped("branch1", |b| {
        let h = bc(b, "0", x, 256 * s, 1, 1, 0);
        let h = c1x7(b, "1", h, 256 * s);
        let h = c7x1(b, "2", h, 320 * s);
        bc(b, "3", h, 320 * s, 3, 2, 0)
    });
    let b2 = b.max_pool2d(x, 3, 2, 0, false);
    b.concat(&[b0, b1, b2], 1)
}

fn v4_block_c(b: &mut GraphBuilder, x: TensorId, s: u64) -> TensorId {
    let b0 = bc(b, "branch0", x, 256 * s, 1, 1, 0);
    // Cadene concatenates each split pair as it goes (two extra copies), then all four.
    let x1 = bc(b, "branch1_0", x, 384 * s, 1, 1, 0);
    let x1a = c1x3(b, "branch1_1a", x1, 256 * s);
    let x1b = c3x1(b, "branch1_1b", x1, 256 * s);
    let b1 = b.concat(&[x1a, x1b], 1);
    let x2 = bc(b, "branch2_0", x, 384 * s, 1, 1, 0);
    let x2 = c3x1(b, "branch2_1", x2, 448 * s);
    let x2 = c1x3(b, "branch2_2", x2, 512 * s);
    let x2a = c1x3(b, "branch2_3a", x2, 256 * s);
    let x2b = c3x1(b, "branch2_3b", x2, 256 * s);
    let b2 = b.concat(&[x2a, x2b], 1);
    let b3 = pool_branch(b, x, 256 * s);
    b.concat(&[b0, b1, b2, b3], 1)
}
