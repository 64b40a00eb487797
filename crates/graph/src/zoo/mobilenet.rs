//! MobileNetV2 (inverted residuals with linear bottlenecks), after torchvision's `mobilenetv2.py`.

use super::{ModelInfo, ModelRequest};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{Conv2dAttrs, DType, Graph, GraphError, TensorId};

const SOURCE: &str = "torchvision.models.mobilenet_v2 (Sandler et al. 2018)";

pub(super) fn models() -> Vec<ModelInfo> {
    vec![ModelInfo {
        name: "mobilenet_v2",
        description: "MobileNetV2 width 1.0: 17 inverted residual blocks, ReLU6, batch norm, \
            dropout 0.2 classifier, 224x224 ImageNet",
        source: SOURCE,
        knobs: &[],
        default_batch: 64,
        reference_param_count: Some(3_504_872),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_mobilenet_v2,
    }]
}

/// `(expand ratio t, output channels c, repeats n, first stride s)` per stage.
const SETTINGS: [(u64, u64, u64, u32); 7] = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
];

fn build_mobilenet_v2(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 224, 224]);
    let labels = b.label("labels", &[n]);
    b.push_scope("features");
    let mut h = b.scoped("0", |b| conv_bn_relu6(b, x, 32, 3, 2, 1));
    let mut in_ch = 32;
    let mut index = 1;
    for (t, c, reps, s) in SETTINGS {
        for rep in 0..reps {
            let stride = if rep == 0 { s } else { 1 };
            h = b.scoped(index.to_string(), |b| {
                inverted_residual(b, h, in_ch, c, stride, t)
            });
            in_ch = c;
            index += 1;
        }
    }
    h = b.scoped(index.to_string(), |b| conv_bn_relu6(b, h, 1280, 1, 1, 1));
    b.pop_scope();
    // torchvision calls `adaptive_avg_pool2d(x, (1, 1))`, which PyTorch lowers to
    // `mean`, saving nothing; the builder's pool keeps its input (the last ReLU6
    // output, batch x 1280 x 7 x 7) until its backward, early in the backward pass.
    let pooled = b.global_avg_pool(h);
    let logits = b.scoped("classifier", |b| {
        let d = b.dropout(pooled, 0.2);
        b.linear("1", d, 1000, true)
    });
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

/// `Conv2dNormActivation`: conv (no bias), batch norm, ReLU6, numbered 0, 1, 2.
fn conv_bn_relu6(
    b: &mut GraphBuilder,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    stride: u32,
    groups: u32,
) -> TensorId {
    let h = conv_bn(b, x, out_ch, kernel, stride, groups);
    b.relu6(h)
}

/// `Conv2dNormActivation` before its activation: a same-padded conv (no
/// bias) and batch norm, numbered 0 and 1 (EfficientNet's blocks use it too).
pub(super) fn conv_bn(
    b: &mut GraphBuilder,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    stride: u32,
    groups: u32,
) -> TensorId {
    let attrs = Conv2dAttrs {
        kernel: [kernel, kernel],
        stride: [stride, stride],
        padding: [(kernel - 1) / 2; 2],
        dilation: [1, 1],
        groups,
        bias: false,
    };
    let h = b.conv2d_full("0", x, out_ch, attrs);
    b.batch_norm("1", h)
}

fn inverted_residual(
    b: &mut GraphBuilder,
    x: TensorId,
    in_ch: u64,
    out_ch: u64,
    stride: u32,
    expand: u64,
) -> TensorId {
    let hidden = in_ch * expand;
    let use_residual = stride == 1 && in_ch == out_ch;
    b.scoped("conv", |b| {
        let mut h = x;
        let mut index = 0;
        if expand != 1 {
            h = b.scoped("0", |b| conv_bn_relu6(b, h, hidden, 1, 1, 1));
            index += 1;
        }
        h = b.scoped(index.to_string(), |b| {
            conv_bn_relu6(b, h, hidden, 3, stride, hidden as u32)
        });
        h = b.conv2d(&(index + 1).to_string(), h, out_ch, 1, 1, 0);
        h = b.batch_norm(&(index + 2).to_string(), h);
        if use_residual { b.add(&[x, h]) } else { h }
    })
}
