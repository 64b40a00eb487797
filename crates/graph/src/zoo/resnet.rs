//! ResNet-18/34/50/101/152 and wide ResNets, after torchvision's `resnet.py`.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError, TensorId};

const SOURCE: &str =
    "torchvision.models.resnet (He et al. 2016; Zagoruyko & Komodakis 2016 for wide)";

pub(super) fn models() -> Vec<ModelInfo> {
    let plain = |name, description, params| ModelInfo {
        name,
        description,
        source: SOURCE,
        knobs: &[],
        default_batch: 32,
        reference_param_count: Some(params),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_named,
    };
    vec![
        plain(
            "resnet18",
            "ResNet-18, basic blocks [2,2,2,2], 224x224 ImageNet",
            11_689_512,
        ),
        plain(
            "resnet34",
            "ResNet-34, basic blocks [3,4,6,3], 224x224 ImageNet",
            21_797_672,
        ),
        plain(
            "resnet50",
            "ResNet-50, bottlenecks [3,4,6,3], 224x224 ImageNet",
            25_557_032,
        ),
        plain(
            "resnet101",
            "ResNet-101, bottlenecks [3,4,23,3], 224x224 ImageNet",
            44_549_160,
        ),
        plain(
            "resnet152",
            "ResNet-152, bottlenecks [3,8,36,3], 224x224 ImageNet",
            60_192_808,
        ),
        ModelInfo {
            name: "wide-resnet",
            description: "wide ResNet (bottleneck width x `width`), 224x224; depth 50 width 2 is \
                torchvision's wide_resnet50_2, depth 152 width 10 SwapAdvisor's WResNet-152-10",
            source: SOURCE,
            knobs: &[
                Knob {
                    name: "depth",
                    default: 50,
                    help: "50, 101 or 152",
                },
                Knob {
                    name: "width",
                    default: 2,
                    help: "wide scale of the bottleneck width",
                },
            ],
            default_batch: 32,
            reference_param_count: Some(68_883_240),
            default_optimizer: Optimizer::sgd_momentum,
            build: build_wide,
        },
    ]
}

fn stages_for(depth: u64) -> Option<(bool, [u64; 4])> {
    Some(match depth {
        18 => (false, [2, 2, 2, 2]),
        34 => (false, [3, 4, 6, 3]),
        50 => (true, [3, 4, 6, 3]),
        101 => (true, [3, 4, 23, 3]),
        152 => (true, [3, 8, 36, 3]),
        _ => return None,
    })
}

fn build_named(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let depth: u64 = name.trim_start_matches("resnet").parse().unwrap_or(0);
    build_resnet(name, req, depth, 1)
}

fn build_wide(_name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let depth = req.knob("depth");
    if !matches!(depth, 50 | 101 | 152) {
        return Err(bad_knob(
            "wide-resnet",
            format!("depth {depth} is not 50, 101 or 152"),
        ));
    }
    build_resnet("wide-resnet", req, depth, req.knob("width"))
}

/// Builds a torchvision ResNet of `depth`; `width` multiplies the bottleneck width
/// (`width_per_group = 64 * width`).
pub(super) fn build_resnet(
    name: &str,
    req: &ModelRequest,
    depth: u64,
    width: u64,
) -> Result<Graph, GraphError> {
    let Some((bottleneck, stages)) = stages_for(depth) else {
        return Err(bad_knob(name, format!("no ResNet of depth {depth}")));
    };
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, 224, 224]);
    let labels = b.label("labels", &[n]);
    let mut h = b.conv2d("conv1", x, 64, 7, 2, 3);
    h = b.batch_norm("bn1", h);
    h = b.relu(h);
    h = b.max_pool2d(h, 3, 2, 1, false);
    let expansion = if bottleneck { 4 } else { 1 };
    let mut in_ch = 64;
    for (stage, &blocks) in stages.iter().enumerate() {
        let planes = 64u64 << stage;
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let scope = format!("layer{}.{}", stage + 1, block);
            h = b.scoped(scope, |b| {
                if bottleneck {
                    bottleneck_block(b, h, in_ch, planes, stride, planes * width)
                } else {
                    basic_block(b, h, in_ch, planes, stride)
                }
            });
            in_ch = planes * expansion;
        }
    }
    let pooled = b.global_avg_pool(h);
    let logits = b.linear("fc", pooled, 1000, true);
    let loss = b.softmax_cross_entropy(logits, labels);
    b.finish(loss, req.optimizer)
}

fn downsample(b: &mut GraphBuilder, x: TensorId, out_ch: u64, stride: u32) -> TensorId {
    b.scoped("downsample", |b| {
        let d = b.conv2d("0", x, out_ch, 1, stride, 0);
        b.batch_norm("1", d)
    })
}

fn basic_block(
    b: &mut GraphBuilder,
    x: TensorId,
    in_ch: u64,
    planes: u64,
    stride: u32,
) -> TensorId {
    let mut h = b.conv2d("conv1", x, planes, 3, stride, 1);
    h = b.batch_norm("bn1", h);
    h = b.relu(h);
    h = b.conv2d("conv2", h, planes, 3, 1, 1);
    h = b.batch_norm("bn2", h);
    let identity = if stride != 1 || in_ch != planes {
        downsample(b, x, planes, stride)
    } else {
        x
    };
    let sum = b.add(&[h, identity]);
    b.relu(sum)
}

fn bottleneck_block(
    b: &mut GraphBuilder,
    x: TensorId,
    in_ch: u64,
    planes: u64,
    stride: u32,
    width: u64,
) -> TensorId {
    let out_ch = planes * 4;
    let mut h = b.conv2d("conv1", x, width, 1, 1, 0);
    h = b.batch_norm("bn1", h);
    h = b.relu(h);
    h = b.conv2d("conv2", h, width, 3, stride, 1);
    h = b.batch_norm("bn2", h);
    h = b.relu(h);
    h = b.conv2d("conv3", h, out_ch, 1, 1, 0);
    h = b.batch_norm("bn3", h);
    let identity = if stride != 1 || in_ch != out_ch {
        downsample(b, x, out_ch, stride)
    } else {
        x
    };
    let sum = b.add(&[h, identity]);
    b.relu(sum)
}
