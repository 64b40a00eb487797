//! U-Net for segmentation (padded double convs with batch norm, transposed-conv upsampling), after milesial/Pytorch-UNet.

use super::{Knob, ModelInfo, ModelRequest, bad_knob};
use crate::builder::{GraphBuilder, Optimizer};
use crate::{DType, Graph, GraphError, TensorId};

const SOURCE: &str = "milesial/Pytorch-UNet UNet(n_channels=3, n_classes=2, bilinear=False) \
    (Ronneberger et al. 2015)";

/// Classes of the per-pixel classifier (the reference's `n_classes=2`).
const CLASSES: u64 = 2;
/// Smallest input side: four 2x2 max pools must leave at least one pixel.
const MIN_SIZE_PX: u64 = 16;
/// Largest input side accepted (activations grow with its square).
const MAX_SIZE_PX: u64 = 8192;

pub(super) fn models() -> Vec<ModelInfo> {
    vec![ModelInfo {
        name: "unet",
        description: "U-Net, 3-channel `size`x`size` images (default 256, a multiple of 16 so \
            no skip needs padding), 2 classes, per-pixel cross-entropy",
        source: SOURCE,
        knobs: &[Knob {
            name: "size",
            default: 256,
            help: "input height and width in pixels (at least 16)",
        }],
        default_batch: 8,
        reference_param_count: Some(31_037_698),
        default_optimizer: Optimizer::sgd_momentum,
        build: build_unet,
    }]
}

/// `DoubleConv`: (3x3 conv without bias, batch norm, ReLU) twice, numbered as the
/// reference's `double_conv` Sequential.
fn double_conv(b: &mut GraphBuilder, x: TensorId, out_ch: u64) -> TensorId {
    b.scoped("double_conv", |b| {
        let h = b.conv2d("0", x, out_ch, 3, 1, 1);
        let h = b.batch_norm("1", h);
        let h = b.relu(h);
        let h = b.conv2d("3", h, out_ch, 3, 1, 1);
        let h = b.batch_norm("4", h);
        b.relu(h)
    })
}

/// `Up`: 2x2 stride-2 transposed conv halving the channels, zero padding to the
/// skip's size, concat `[skip, upsampled]`, double conv.
fn up(b: &mut GraphBuilder, x: TensorId, skip: TensorId, out_ch: u64) -> TensorId {
    let in_ch = b.shape(x)[1];
    let u = b.conv_transpose2d("up", x, in_ch / 2, 2, 2, true);
    let (sh, sw) = (b.shape(skip)[2], b.shape(skip)[3]);
    let (uh, uw) = (b.shape(u)[2], b.shape(u)[3]);
    let (dy, dx) = (sh.saturating_sub(uh) as u32, sw.saturating_sub(uw) as u32);
    // The reference always calls `F.pad`; with zero padding PyTorch's
    // `constant_pad_nd` still returns a copy, which the pad op allocates too.
    let u = b.zero_pad2d(u, [dx / 2, dx - dx / 2, dy / 2, dy - dy / 2]);
    let cat = b.concat(&[skip, u], 1);
    b.scoped("conv", |b| double_conv(b, cat, out_ch))
}

fn build_unet(name: &'static str, req: &ModelRequest) -> Result<Graph, GraphError> {
    let size = req.knob("size");
    if !(MIN_SIZE_PX..=MAX_SIZE_PX).contains(&size) {
        return Err(bad_knob(
            name,
            format!("size {size} px is not between {MIN_SIZE_PX} and {MAX_SIZE_PX}"),
        ));
    }
    let n = req.batch;
    let mut b = GraphBuilder::new(name, n, DType::Float32);
    b.set_source(SOURCE);
    let x = b.input("images", &[n, 3, size, size]);
    let labels = b.label("masks", &[n * size * size]);
    let x1 = b.scoped("inc", |b| double_conv(b, x, 64));
    let mut skips = vec![x1];
    let mut h = x1;
    for (i, width) in [128, 256, 512, 1024].into_iter().enumerate() {
        h = b.scoped(format!("down{}", i + 1), |b| {
            b.scoped("maxpool_conv", |b| {
                let p = b.max_pool2d(h, 2, 2, 0, false);
                b.scoped("1", |b| double_conv(b, p, width))
            })
        });
        skips.push(h);
    }
    skips.pop();
    for (i, width) in [512, 256, 128, 64].into_iter().enumerate() {
        let skip = skips.pop().unwrap_or(x1);
        h = b.scoped(format!("up{}", i + 1), |b| up(b, h, skip, width));
    }
    let logits = b.scoped("outc", |b| {
        let attrs = crate::Conv2dAttrs {
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: true,
        };
        b.conv2d_full("conv", h, CLASSES, attrs)
    });
    // Per-pixel cross-entropy over `[n*h*w, classes]`: moving the class axis last
    // (`permute(0, 2, 3, 1).reshape(-1, classes)`) is a copy.
    let flat = b.copy("to_pixels", logits, &[n * size * size, CLASSES]);
    let loss = b.softmax_cross_entropy(flat, labels);
    b.finish(loss, req.optimizer)
}
