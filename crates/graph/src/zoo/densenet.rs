//! DenseNet-121 (dense blocks of BN-ReLU-conv layers, concatenated features), after torchvision's `densenet.py`.

use super::{ModelInfo, ModelRequest};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError, TensorId};

const SOURCE: &str = "torchvision.models.densenet121 (Huang et al. 2017)";

pub(super) fn models() -> Vec<ModelInfo> {
    vec![ModelInfo {
        name: "densenet121",
        description: "DenseNet-121: growth 32, blocks [6,12,24,16], bottleneck width 4x growth, \
            transitions halving channels with 2x2 average pools, 224x224 ImageNet",
        source: SOURCE,
        knobs: &[],
        default_batch: 32,
        reference_param_count: Some(7_978_856),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_densenet121,
    }]
}

const GROWTH: u64 = 32;
const BN_SIZE: u64 = 4;
const BLOCKS: [u64; 4] = [6, 12, 24, 16];
const INIT_FEATURES: u64 = 64;

fn build_densenet121(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 224, 224]);
    let labels = b.label("labels", &[n]);
    b.push_scope("features");
    let mut h = b.conv2d("conv0", x, INIT_FEATURES, 7, 2, 3);
    h = b.batch_norm("norm0", h);
    h = b.relu(h);
    h = b.max_pool2d(h, 3, 2, 1, false);
    let mut channels = INIT_FEATURES;
    for (i, &layers) in BLOCKS.iter().enumerate() {
        h = b.scoped(format!("denseblock{}", i + 1), |b| {
            dense_block(b, h, layers)
        });
        channels += layers * GROWTH;
        if i + 1 < BLOCKS.len() {
            channels /= 2;
            h = b.scoped(format!("transition{}", i + 1), |b| {
                let t = b.batch_norm("norm", h);
                let t = b.relu(t);
                let t = b.conv2d("conv", t, channels, 1, 1, 0);
                b.avg_pool2d(t, 2, 2, 0, false)
            });
        }
    }
    h = b.batch_norm("norm5", h);
    b.pop_scope();
    // `F.relu(features, inplace=True)`, then `adaptive_avg_pool2d(out, (1, 1))`,
    // which PyTorch lowers to `mean` (saving nothing); the builder's pool keeps its
    // input, the ReLU output that ReLU's backward keeps anyway.
    h = b.relu(h);
    let pooled = b.global_avg_pool(h);
    let logits = b.linear("classifier", pooled, 1000, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

/// One dense block in torchvision's default memory-inefficient form: every layer
/// concatenates all earlier features afresh (`torch.cat(inputs, 1)`, a copy even
/// for the first layer's single input), and the block returns one more concat of
/// all of them.
fn dense_block(b: &mut GraphBuilder, x: TensorId, layers: u64) -> TensorId {
    let mut features = vec![x];
    for j in 0..layers {
        let new = b.scoped(format!("denselayer{}", j + 1), |b| {
            let cat = b.concat(&features, 1);
            let mut h = b.batch_norm("norm1", cat);
            // `ReLU(inplace=True)` keeps its result for backward, as here; batch
            // norm keeps the concat, its input, not its overwritten output.
            h = b.relu(h);
            h = b.conv2d("conv1", h, BN_SIZE * GROWTH, 1, 1, 0);
            h = b.batch_norm("norm2", h);
            h = b.relu(h);
            b.conv2d("conv2", h, GROWTH, 3, 1, 1)
        });
        features.push(new);
    }
    b.concat(&features, 1)
}
