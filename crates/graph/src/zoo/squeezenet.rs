//! SqueezeNet 1.1 (fire modules), after torchvision's `squeezenet.py`.

use super::{ModelInfo, ModelRequest};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{Conv2dAttrs, DType, Graph, GraphError, TensorId};

const SOURCE: &str = "torchvision.models.squeezenet1_1 (Iandola et al. 2016)";

pub(super) fn models() -> Vec<ModelInfo> {
    vec![ModelInfo {
        name: "squeezenet1_1",
        description: "SqueezeNet 1.1: 8 fire modules, ceil-mode max pools, conv classifier \
            with global average pool, 224x224 ImageNet",
        source: SOURCE,
        knobs: &[],
        default_batch: 64,
        reference_param_count: Some(1_235_496),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_squeezenet,
    }]
}

/// A convolution with bias (every SqueezeNet conv has one), square kernel.
fn conv_bias(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    out_ch: u64,
    kernel: u32,
    stride: u32,
    padding: u32,
) -> TensorId {
    let attrs = Conv2dAttrs {
        kernel: [kernel, kernel],
        stride: [stride, stride],
        padding: [padding, padding],
        dilation: [1, 1],
        groups: 1,
        bias: true,
    };
    b.conv2d_full(name, x, out_ch, attrs)
}

/// Fire module: 1x1 squeeze, then 1x1 and 3x3 expands concatenated; all ReLU.
fn fire(b: &mut GraphBuilder, x: TensorId, squeeze: u64, expand: u64) -> TensorId {
    let s = conv_bias(b, "squeeze", x, squeeze, 1, 1, 0);
    let s = b.relu(s);
    let e1 = conv_bias(b, "expand1x1", s, expand, 1, 1, 0);
    let e1 = b.relu(e1);
    let e3 = conv_bias(b, "expand3x3", s, expand, 3, 1, 1);
    let e3 = b.relu(e3);
    b.concat(&[e1, e3], 1)
}

fn build_squeezenet(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 224, 224]);
    let labels = b.label("labels", &[n]);
    let imagenet = Stem {
        stride: 2,
        padding: 0,
        classes: 1000,
    };
    squeezenet_on(b, x, labels, imagenet, req)
}

/// What varies between SqueezeNet 1.1 on ImageNet and its CIFAR-10 form:
/// the first 3x3 conv's stride and padding, and the class count.
pub(super) struct Stem {
    pub stride: u32,
    pub padding: u32,
    pub classes: u64,
}

/// SqueezeNet 1.1 on images `x` (in `b`): the stem conv, the fire modules
/// with their ceil-mode pools, the conv classifier, the loss and optimizer.
pub(super) fn squeezenet_on(
    mut b: GraphBuilder,
    x: TensorId,
    labels: TensorId,
    stem: Stem,
    req: &ModelRequest,
) -> Result<Graph, GraphError> {
    b.push_scope("features");
    let mut h = conv_bias(&mut b, "0", x, 64, 3, stem.stride, stem.padding);
    h = b.relu(h);
    h = b.max_pool2d(h, 3, 2, 0, true);
    // `features` indices of the fire modules, with (squeeze, expand) widths; a
    // ceil-mode 3x3/2 max pool follows indices 4 and 7.
    let fires: [(u32, u64, u64); 8] = [
        (3, 16, 64),
        (4, 16, 64),
        (6, 32, 128),
        (7, 32, 128),
        (9, 48, 192),
        (10, 48, 192),
        (11, 64, 256),
        (12, 64, 256),
    ];
    for (index, squeeze, expand) in fires {
        h = b.scoped(index.to_string(), |b| fire(b, h, squeeze, expand));
        if index == 4 || index == 7 {
            h = b.max_pool2d(h, 3, 2, 0, true);
        }
    }
    b.pop_scope();
    let logits = b.scoped("classifier", |b| {
        let d = b.dropout(h, 0.5);
        let c = conv_bias(b, "1", d, stem.classes, 1, 1, 0);
        let c = b.relu(c);
        // `AdaptiveAvgPool2d((1, 1))` then `flatten(x, 1)`.
        b.global_avg_pool(c)
    });
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}
