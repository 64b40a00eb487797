//! CIFAR-10 models (32x32x3 inputs, 10 classes): HOME's workloads (paper 002,
//! Sec. 4.1: VGG16, Plain20, MobileNet, ResNet, SqueezeNet on CIFAR10 with
//! PyTorch 1.5.1).
//!
//! The paper names the models but not their code. The common PyTorch CIFAR-10
//! versions are followed (kuangliu/pytorch-cifar, whose parameter counts these
//! builders match), and where that has no model, He et al.'s CIFAR nets:
//! - `vgg16-cifar`: VGG-16's 13 convs (with bias) each followed by batch norm
//!   and ReLU, five 2x2 max pools, one 512 -> 10 linear layer.
//! - `resnet18-cifar`: ResNet-18 (basic blocks [2,2,2,2], 64..512 wide) with a
//!   3x3 stride-1 stem and no max pool, 4x4 average pool, 512 -> 10. The
//!   paper says only "ResNet"; depth 18 is chosen because PyTorch's maximum
//!   batch in Table 2 (1255 on 11 GB) is of ResNet-18's size on CIFAR-10 (a
//!   ResNet-20 of He et al. would fit about ten times more).
//! - `plain20`: He et al. 2016, Sec. 4.2 without shortcuts ("plain"): a 3x3
//!   conv of 16, then 3 stages of 2n 3x3 convs with 16, 32, 64 filters on
//!   32x32, 16x16, 8x8 maps (the first conv of stages 2 and 3 has stride 2),
//!   batch norm and ReLU after every conv, global average pool, 64 -> 10:
//!   6n + 2 = 20 weighted layers at n = 3 (knob `depth`).
//! - `mobilenet-cifar`: MobileNet v1 (depthwise 3x3 + pointwise 1x1 blocks, 32
//!   to 1024 channels) with a stride-1 stem, 2x2 average pool, 1024 -> 10.
//! - `squeezenet-cifar`: SqueezeNet 1.1's fire modules (torchvision's) with a
//!   3x3 stride-1 padded stem so that 32x32 inputs keep their resolution into
//!   the first pool, and a 10-class conv classifier (kuangliu has no
//!   SqueezeNet; this is our adaptation).
//!
//! InceptionV3 has no CIFAR form here: torchvision's needs at least 75x75
//! inputs, and Table 2's PyTorch maximum batch (125) is that of 299x299
//! inputs, so HOME's InceptionV3 is the zoo's `inception_v3`.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{Conv2dAttrs, DType, Graph, GraphError, TensorId};

const KUANGLIU: &str = "kuangliu/pytorch-cifar (CIFAR-10 versions), as HOME's CIFAR10 workloads";
const HE: &str = "He et al. 2016, Sec. 4.2 (CIFAR-10 plain net, no shortcuts)";
const SQUEEZE: &str = "torchvision.models.squeezenet1_1 fire modules, stride-1 stem for 32x32";

const CLASSES: u64 = 10;
const DEFAULT_BATCH: u64 = 128;

pub(super) fn models() -> Vec<ModelInfo> {
    let model = |name, description, source, params, build| ModelInfo {
        name,
        description,
        source,
        knobs: &[],
        default_batch: DEFAULT_BATCH,
        reference_param_count: params,
        default_optimizer: Optimizer::sgd_momentum,
        build,
    };
    vec![
        model(
            "vgg16-cifar",
            "VGG-16 for CIFAR-10: 13 conv-bn-relu, 5 max pools, 512->10 linear, 32x32 (HOME's VGG16)",
            KUANGLIU,
            Some(14_728_266),
            build_vgg16,
        ),
        model(
            "resnet18-cifar",
            "ResNet-18 for CIFAR-10: 3x3 stride-1 stem, no max pool, basic blocks [2,2,2,2], 32x32 (HOME's ResNet)",
            KUANGLIU,
            Some(11_173_962),
            build_resnet18,
        ),
        ModelInfo {
            knobs: &[Knob {
                name: "depth",
                default: 20,
                help: "6n+2 weighted layers: 20, 32, 44, 56, 110, ...",
            }],
            ..model(
                "plain20",
                "plain net for CIFAR-10 (He et al. 2016, no shortcuts): conv 16, 3 stages of 2n convs with 16/32/64 filters, bn+relu, 32x32 (HOME's Plain20)",
                HE,
                None,
                build_plain,
            )
        },
        model(
            "mobilenet-cifar",
            "MobileNet v1 for CIFAR-10: stride-1 stem, 13 depthwise-separable blocks, 32x32 (HOME's MobileNet)",
            KUANGLIU,
            Some(3_217_226),
            build_mobilenet,
        ),
        model(
            "squeezenet-cifar",
            "SqueezeNet 1.1 fire modules for CIFAR-10: 3x3 stride-1 stem, 10-class conv classifier, 32x32 (HOME's SqueezeNet)",
            SQUEEZE,
            None,
            build_squeezenet,
        ),
    ]
}

/// A new CIFAR-10 graph: the builder, images and labels.
fn start(name: &str, source: &str, n: u64) -> (GraphBuilder, TensorId, TensorId) {
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(source);
    let x = b.input("images", &[n, 3, 32, 32]);
    let labels = b.label("labels", &[n]);
    (b, x, labels)
}

/// A square convolution; `groups` > 1 for depthwise.
fn conv(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    (kernel, stride, groups): (u32, u32, u32),
    bias: bool,
) -> TensorId {
    let attrs = Conv2dAttrs {
        kernel: [kernel, kernel],
        stride: [stride, stride],
        padding: [(kernel - 1) / 2; 2],
        dilation: [1, 1],
        groups,
        bias,
    };
    b.conv2d_full(name, x, out_ch, attrs)
}

/// Convolution, batch norm, ReLU.
fn conv_bn_relu(
    b: &mut GraphBuilder,
    scope: &str,
    x: TensorId,
    out_ch: u64,
    shape: (u32, u32, u32),
    bias: bool,
) -> TensorId {
    b.scoped(scope, |b| {
        let h = conv(b, "conv", x, out_ch, shape, bias);
        let h = b.batch_norm("bn", h);
        b.relu(h)
    })
}

fn build_vgg16(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let (mut b, x, labels) = start(name, KUANGLIU, req.batch);
    let stages: [&[u64]; 5] = [
        &[64, 64],
        &[128, 128],
        &[256, 256, 256],
        &[512, 512, 512],
        &[512, 512, 512],
    ];
    let mut h = x;
    let mut index = 0;
    for widths in stages {
        for &width in widths {
            h = conv_bn_relu(
                &mut b,
                &format!("features.{index}"),
                h,
                width,
                (3, 1, 1),
                true,
            );
            index += 1;
        }
        h = b.max_pool2d(h, 2, 2, 0, false);
    }
    // 512x1x1 after five pools: kuangliu's AvgPool2d(1, 1) is the identity.
    let flat = b.flatten(h);
    let logits = b.linear("classifier", flat, CLASSES, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

fn build_resnet18(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let (mut b, x, labels) = start(name, KUANGLIU, req.batch);
    let mut h = conv_bn_relu(&mut b, "stem", x, 64, (3, 1, 1), false);
    let mut in_ch = 64;
    for stage in 0..4u32 {
        let planes = 64u64 << stage;
        for block in 0..2 {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let scope = format!("layer{}.{block}", stage + 1);
            h = b.scoped(scope, |b| basic_block(b, h, in_ch, planes, stride));
            in_ch = planes;
        }
    }
    // 512x4x4: kuangliu's avg_pool2d(out, 4) is a global average pool.
    let pooled = b.global_avg_pool(h);
    let logits = b.linear("linear", pooled, CLASSES, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

/// kuangliu's BasicBlock: two 3x3 conv-bn, a 1x1 conv-bn shortcut when the
/// shape changes, ReLU after the sum.
fn basic_block(
    b: &mut GraphBuilder,
    x: TensorId,
    in_ch: u64,
    planes: u64,
    stride: u32,
) -> TensorId {
    let h = conv_bn_relu(b, "a", x, planes, (3, stride, 1), false);
    let h = conv(b, "conv2", h, planes, (3, 1, 1), false);
    let h = b.batch_norm("bn2", h);
    let shortcut = if stride != 1 || in_ch != planes {
        b.scoped("shortcut", |b| {
            let s = conv(b, "0", x, planes, (1, stride, 1), false);
            b.batch_norm("1", s)
        })
    } else {
        x
    };
    let sum = b.add(&[h, shortcut]);
    b.relu(sum)
}

fn build_plain(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let depth = req.knob("depth");
    if depth < 8 || !(depth - 2).is_multiple_of(6) {
        return Err(bad_knob(
            name,
            format!("depth {depth} is not 6n+2 with n >= 1 (20, 32, 44, 56, 110, ...)"),
        ));
    }
    let per_stage = (depth - 2) / 3;
    let (mut b, x, labels) = start(name, HE, req.batch);
    let mut h = conv_bn_relu(&mut b, "stem", x, 16, (3, 1, 1), false);
    for stage in 0..3u32 {
        let width = 16u64 << stage;
        for layer in 0..per_stage {
            let stride = if stage > 0 && layer == 0 { 2 } else { 1 };
            let scope = format!("stage{}.{layer}", stage + 1);
            h = conv_bn_relu(&mut b, &scope, h, width, (3, stride, 1), false);
        }
    }
    let pooled = b.global_avg_pool(h);
    let logits = b.linear("fc", pooled, CLASSES, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

fn build_mobilenet(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    // (out channels, stride) of each depthwise-separable block (kuangliu's cfg).
    let blocks: [(u64, u32); 13] = [
        (64, 1),
        (128, 2),
        (128, 1),
        (256, 2),
        (256, 1),
        (512, 2),
        (512, 1),
        (512, 1),
        (512, 1),
        (512, 1),
        (512, 1),
        (1024, 2),
        (1024, 1),
    ];
    let (mut b, x, labels) = start(name, KUANGLIU, req.batch);
    let mut h = conv_bn_relu(&mut b, "stem", x, 32, (3, 1, 1), false);
    let mut in_ch = 32u64;
    for (i, (out_ch, stride)) in blocks.into_iter().enumerate() {
        let groups = u32::try_from(in_ch).unwrap_or(u32::MAX);
        h = b.scoped(format!("layers.{i}"), |b| {
            let d = conv_bn_relu(b, "depthwise", h, in_ch, (3, stride, groups), false);
            conv_bn_relu(b, "pointwise", d, out_ch, (1, 1, 1), false)
        });
        in_ch = out_ch;
    }
    // 1024x2x2: kuangliu's avg_pool2d(out, 2) is a global average pool.
    let pooled = b.global_avg_pool(h);
    let logits = b.linear("linear", pooled, CLASSES, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

/// SqueezeNet 1.1 (the zoo's, `super::squeezenet`) on 32x32 images: a
/// stride-1, padding-1 stem and 10 classes.
fn build_squeezenet(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let (b, x, labels) = start(name, SQUEEZE, req.batch);
    let cifar = super::squeezenet::Stem {
        stride: 1,
        padding: 1,
        classes: CLASSES,
    };
    super::squeezenet::squeezenet_on(b, x, labels, cifar, req)
}
