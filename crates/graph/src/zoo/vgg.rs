//! VGG-16 and VGG-19 (configurations D and E, no batch norm), after torchvision's `vgg.py`.

use super::{ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError};

const SOURCE: &str = "torchvision.models.vgg (Simonyan & Zisserman 2015)";

pub(super) fn models() -> Vec<ModelInfo> {
    let plain = |name, description, params| ModelInfo {
        name,
        description,
        source: SOURCE,
        knobs: &[],
        default_batch: 32,
        reference_param_count: Some(params),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_vgg,
    };
    vec![
        plain(
            "vgg16",
            "VGG-16 (config D: 13 convs + 3 FC), ReLU, no batch norm, 224x224 ImageNet",
            138_357_544,
        ),
        plain(
            "vgg19",
            "VGG-19 (config E: 16 convs + 3 FC), ReLU, no batch norm, 224x224 ImageNet",
            143_667_240,
        ),
    ]
}

/// Convolution widths per stage; each stage ends with a 2x2 max pool.
fn stages_for(name: &str) -> Option<[&'static [u64]; 5]> {
    Some(match name {
        "vgg16" => [
            &[64, 64],
            &[128, 128],
            &[256, 256, 256],
            &[512, 512, 512],
            &[512, 512, 512],
        ],
        "vgg19" => [
            &[64, 64],
            &[128, 128],
            &[256, 256, 256, 256],
            &[512, 512, 512, 512],
            &[512, 512, 512, 512],
        ],
        _ => return None,
    })
}

fn build_vgg(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let Some(stages) = stages_for(name) else {
        return Err(bad_knob(name, "not a VGG configuration".into()));
    };
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 224, 224]);
    let labels = b.label("labels", &[n]);
    let mut h = x;
    // torchvision numbers `features` children sequentially: conv, relu, ..., pool.
    let mut index = 0;
    b.push_scope("features");
    for widths in stages {
        for &width in widths {
            let attrs = crate::Conv2dAttrs {
                kernel: [3, 3],
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
                bias: true,
            };
            h = b.conv2d_full(&index.to_string(), h, width, attrs);
            // `ReLU(inplace=True)`: autograd keeps the result, which the builder's
            // out-of-place ReLU keeps too; the conv output dies at once instead.
            h = b.relu(h);
            index += 2;
        }
        h = b.max_pool2d(h, 2, 2, 0, false);
        index += 1;
    }
    b.pop_scope();
    // `AdaptiveAvgPool2d((7, 7))` is shape-preserving at 224x224, but torchvision
    // still runs `_adaptive_avg_pool2d`, which allocates its output and keeps its
    // input for backward; modelled as such so the saved set matches PyTorch.
    h = b.adaptive_avg_pool2d(h, 7, 7);
    let flat = b.flatten(h);
    let logits = b.scoped("classifier", |b| {
        let mut c = b.linear("0", flat, 4096, true);
        c = b.relu(c);
        c = b.dropout(c, 0.5);
        c = b.linear("3", c, 4096, true);
        c = b.relu(c);
        c = b.dropout(c, 0.5);
        b.linear("6", c, 1000, true)
    });
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}
