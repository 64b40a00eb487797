//! Tiny models small enough to execute on a CPU in about a second: mlp, tiny-cnn.

use super::{Knob, ModelInfo, ModelRequest};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError};

const SOURCE: &str = "outcore (test model)";

pub(super) fn models() -> Vec<ModelInfo> {
    vec![
        ModelInfo {
            name: "mlp",
            description: "multi-layer perceptron on 784-dim inputs (MNIST-sized), ReLU, 10 classes",
            source: SOURCE,
            knobs: &[
                Knob {
                    name: "hidden",
                    default: 256,
                    help: "hidden width",
                },
                Knob {
                    name: "layers",
                    default: 3,
                    help: "number of hidden layers",
                },
            ],
            default_batch: 64,
            // 784*256+256 + 2*(256*256+256) + 256*10+10 at default knobs.
            reference_param_count: Some(784 * 256 + 256 + 2 * (256 * 256 + 256) + 256 * 10 + 10),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_mlp,
        },
        ModelInfo {
            name: "tiny-cnn",
            description: "three conv-bn-relu blocks with max pooling on 32x32x3 images, 10 classes",
            source: SOURCE,
            knobs: &[
                Knob {
                    name: "width",
                    default: 16,
                    help: "channels of the first block",
                },
                Knob {
                    name: "depth",
                    default: 1,
                    help: "conv-bn-relu layers per block (deeper: activations dominate memory)",
                },
            ],
            default_batch: 32,
            // convs 3->16, 16->32, 32->64 (3x3, no bias), bn 2*(16+32+64), fc 64*4*4*10+10.
            reference_param_count: Some(
                (3 * 16 + 16 * 32 + 32 * 64) * 9 + 2 * (16 + 32 + 64) + 64 * 16 * 10 + 10,
            ),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_tiny_cnn,
        },
    ]
}

fn build_mlp(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let hidden = req.knob("hidden");
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("inputs", &[n, 784]);
    let labels = b.label("labels", &[n]);
    let mut h = x;
    for layer in 0..req.knob("layers") {
        h = b.linear(&format!("fc{layer}"), h, hidden, true);
        h = b.relu(h);
    }
    let logits = b.linear("head", h, 10, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

fn build_tiny_cnn(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let w = req.knob("width");
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 32, 32]);
    let labels = b.label("labels", &[n]);
    let mut h = x;
    let depth = req.knob("depth");
    for (i, ch) in [w, 2 * w, 4 * w].into_iter().enumerate() {
        h = b.scoped(format!("block{i}"), |b| {
            let mut c = h;
            for layer in 0..depth {
                // The first layer keeps the historical names (`conv`, `bn`).
                let suffix = if layer == 0 {
                    String::new()
                } else {
                    layer.to_string()
                };
                c = b.conv2d(&format!("conv{suffix}"), c, ch, 3, 1, 1);
                c = b.batch_norm(&format!("bn{suffix}"), c);
                c = b.relu(c);
            }
            b.max_pool2d(c, 2, 2, 0, false)
        });
    }
    let flat = b.flatten(h);
    let logits = b.linear("fc", flat, 10, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}
