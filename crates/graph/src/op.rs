//! Operators: kind with execution attributes, phase, operands, and cost inputs.

use crate::{OpId, TensorId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which part of a training step an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
}

impl Phase {
    pub const ALL: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// 2-D convolution attributes (NCHW, weight OIHW).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Conv2dAttrs {
    pub kernel: [u32; 2],
    pub stride: [u32; 2],
    pub padding: [u32; 2],
    pub dilation: [u32; 2],
    pub groups: u32,
    pub bias: bool,
}

/// 2-D pooling attributes (NCHW).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pool2dAttrs {
    pub kernel: [u32; 2],
    pub stride: [u32; 2],
    pub padding: [u32; 2],
    pub ceil_mode: bool,
}

/// What an op computes, with the attributes needed to execute it.
///
/// Forward kinds are listed first. A backward op is `Backward(forward kind)`: its
/// inputs are the output gradients followed by the tensors the forward op saved,
/// its outputs the input gradients (see the builder for each kind's layout).
/// Imported graphs keep the framework's operator name in `Named`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `y = conv(x, w) [+ b]`; inputs `[x, w, (b)]`.
    Conv2d(Conv2dAttrs),
    /// `y = x w^T [+ b]` over the last axis; inputs `[x, w, (b)]`, `w` is `[out, in]`.
    Linear {
        bias: bool,
    },
    /// Batched `a @ b` (or `a @ b^T`) over the last two axes, times `scale`.
    MatMul {
        transpose_b: bool,
        scale: f32,
    },
    Relu,
    /// `min(max(x, 0), 6)` (MobileNet).
    Relu6,
    /// GELU in its exact form, `x Φ(x)` (`Φ` the standard normal CDF), as
    /// PyTorch's `nn.GELU()` computes it by default (BERT, ViT). The tanh
    /// approximation is not this kind: `GraphBuilder::gelu_tanh_eager`
    /// spells it out op by op, as GPT-2's `gelu_new` runs in eager PyTorch.
    Gelu,
    Tanh,
    Sigmoid,
    /// SiLU (swish), `x * sigmoid(x)` (EfficientNet); backward keeps the input.
    Silu,
    /// Element-wise sum of all inputs (same shape).
    Add,
    /// Element-wise product of two inputs: the same shape, or one whose
    /// shape is the other's with trailing dimensions of 1, broadcast over
    /// them (`[n, c, h, w] * [n, c, 1, 1]`, squeeze-and-excitation's scale).
    Mul,
    /// `factor * x` (multiplication by a Python scalar; backward keeps nothing).
    Scale {
        factor: f32,
    },
    /// `x + value` (addition of a Python scalar; the gradient passes through).
    AddScalar {
        value: f32,
    },
    /// `x ^ exponent`; backward keeps the input.
    PowScalar {
        exponent: f32,
    },
    MaxPool2d(Pool2dAttrs),
    AvgPool2d(Pool2dAttrs),
    /// Adaptive average pooling to 1x1: `[n, c, h, w] -> [n, c, 1, 1]`.
    GlobalAvgPool,
    /// Adaptive average pooling to `output` (height, width): `[n, c, h, w] ->
    /// [n, c, oh, ow]` (`_adaptive_avg_pool2d`, e.g. VGG's 7x7 pool).
    AdaptiveAvgPool2d {
        output: [u32; 2],
    },
    /// Average pooling whose divisor counts only in-bounds elements
    /// (`count_include_pad=False`, as in Inception-v4 and NASNet).
    AvgPool2dExcludePad(Pool2dAttrs),
    /// Transposed 2-D convolution (NCHW, weight `[in, out / groups, kh, kw]`);
    /// inputs `[x, w, (b)]`. `padding` is the transposed conv's (cropping) padding.
    ConvTranspose2d(Conv2dAttrs),
    /// Zero padding of the last two axes by `[left, right, top, bottom]` elements
    /// (`constant_pad_nd` / `nn.ZeroPad2d`).
    ZeroPad2d {
        pads: [u32; 4],
    },
    /// Window `[top.., left..]` of the last two axes, of the output tensor's height
    /// and width (`x[:, :, top:, left:]`); the output is a view of the input.
    Crop2d {
        top: u32,
        left: u32,
    },
    /// Training-mode batch norm; inputs `[x, gamma, beta]`, outputs `[y, mean, invstd]`.
    BatchNorm {
        eps: f32,
    },
    /// Running-statistics update of a batch norm; inputs `[running_mean, running_var,
    /// mean, invstd]`, outputs the two updated buffers (in place). Split from
    /// `BatchNorm` so the normalisation stays pure and may be recomputed.
    BatchNormStats {
        momentum: f32,
        count: u64,
    },
    /// Layer norm over the last axis; inputs `[x, gamma, beta]`, outputs `[y, mean, rstd]`.
    LayerNorm {
        eps: f32,
    },
    /// Softmax over the last axis.
    Softmax,
    /// Inverted dropout with a counter-based RNG keyed by `seed`, so that a
    /// re-execution reproduces the same mask; outputs `[y, mask]`.
    Dropout {
        p: f32,
        seed: u64,
    },
    /// Concatenation of the inputs along `axis`.
    Concat {
        axis: u32,
    },
    /// Row lookup; inputs `[indices (int64), table]`.
    Embedding,
    /// Mean softmax cross-entropy over the batch; inputs `[logits, labels]`,
    /// outputs `[loss, log_probs]`.
    SoftmaxCrossEntropy,
    /// One LSTM time step; inputs `[x, h, c, w_ih, w_hh, b_ih, b_hh]`, outputs
    /// `[h', c', gates]` (`gates` are the four activated gates, kept for backward).
    LstmCell,
    /// Copies into a new layout (contiguous, head split / merge, transpose); the
    /// output has the shape recorded on the output tensor.
    Copy,
    /// A reshape that allocates nothing; the output is a view of the input.
    View,
    /// Splits the input along `axis` into consecutive parts (`torch.split`); the
    /// outputs are views with the shapes recorded on them. Backward concatenates
    /// the parts' gradients into a fresh gradient of the input.
    Split {
        axis: u32,
    },
    /// Unbinds the input along `axis` into slices with that axis removed
    /// (`torch.unbind`); the outputs are views. Backward stacks the slices'
    /// gradients into a fresh gradient of the input.
    Unbind {
        axis: u32,
    },
    /// Broadcasts the input to the output's shape without copying (`expand`); the
    /// output is a view. Backward sums the gradient back to the input's shape.
    Expand,
    /// Permutes axes without copying: output axis `i` is input axis `dims[i]`; the
    /// output is a strided view.
    Permute {
        dims: Vec<u32>,
    },
    /// A tensor filled with `value`, no inputs: seeds backward with ones, stands in
    /// for a missing output gradient with zeros, or creates an RNN's initial state.
    Fill {
        value: f32,
    },
    /// Sums gradient contributions of a tensor used more than once.
    GradAccumulate,
    /// The gradient op of a forward kind. Inputs: the gradients of the forward
    /// outputs that backward reads, then the saved tensors; outputs: one gradient
    /// per forward input whose `grads_for` entry is true, in input order.
    Backward {
        forward: Box<OpKind>,
        grads_for: Vec<bool>,
    },
    /// SGD with momentum and weight decay; inputs `[param, grad, momentum_buf]`,
    /// outputs `[param', momentum_buf']` (both in place).
    SgdUpdate {
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    },
    /// Adam / AdamW; inputs `[param, grad, m, v]`, outputs `[param', m', v']` (in place).
    AdamUpdate {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
    },
    /// An op known only by its framework name (imported graphs).
    Named {
        name: String,
    },
}

/// Coarse class of an op, used by cost models to pick an efficiency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    Convolution,
    MatMul,
    Elementwise,
    Normalization,
    Pooling,
    Reduction,
    DataMovement,
    View,
    Optimizer,
    Other,
}

impl OpKind {
    /// The op's class for cost modelling; backward ops share their forward class.
    pub fn class(&self) -> OpClass {
        match self {
            OpKind::Conv2d(_) | OpKind::ConvTranspose2d(_) => OpClass::Convolution,
            OpKind::Linear { .. } | OpKind::MatMul { .. } | OpKind::LstmCell => OpClass::MatMul,
            OpKind::Relu
            | OpKind::Relu6
            | OpKind::Gelu
            | OpKind::Tanh
            | OpKind::Sigmoid
            | OpKind::Silu
            | OpKind::Add
            | OpKind::Mul
            | OpKind::Scale { .. }
            | OpKind::AddScalar { .. }
            | OpKind::PowScalar { .. }
            | OpKind::Dropout { .. }
            | OpKind::Fill { .. }
            | OpKind::GradAccumulate => OpClass::Elementwise,
            OpKind::BatchNorm { .. }
            | OpKind::BatchNormStats { .. }
            | OpKind::LayerNorm { .. }
            | OpKind::Softmax
            | OpKind::SoftmaxCrossEntropy => OpClass::Normalization,
            OpKind::MaxPool2d(_)
            | OpKind::AvgPool2d(_)
            | OpKind::GlobalAvgPool
            | OpKind::AdaptiveAvgPool2d { .. }
            | OpKind::AvgPool2dExcludePad(_) => OpClass::Pooling,
            OpKind::Concat { .. } | OpKind::Copy | OpKind::Embedding | OpKind::ZeroPad2d { .. } => {
                OpClass::DataMovement
            }
            OpKind::View
            | OpKind::Crop2d { .. }
            | OpKind::Split { .. }
            | OpKind::Unbind { .. }
            | OpKind::Expand
            | OpKind::Permute { .. } => OpClass::View,
            // The backward of a split, unbind or crop writes a gathered (padded)
            // gradient and that of an expand a reduced one, unlike the free views
            // they undo.
            OpKind::Backward { forward, .. } => match **forward {
                OpKind::Split { .. } | OpKind::Unbind { .. } | OpKind::Crop2d { .. } => {
                    OpClass::DataMovement
                }
                OpKind::Expand => OpClass::Reduction,
                _ => forward.class(),
            },
            OpKind::SgdUpdate { .. } | OpKind::AdamUpdate { .. } => OpClass::Optimizer,
            OpKind::Named { name } => class_of_framework_name(name),
        }
    }

    /// A short lower-case label, e.g. `conv2d` or `conv2d_backward`.
    pub fn label(&self) -> String {
        match self {
            OpKind::Backward { forward, .. } => format!("{}_backward", forward.label()),
            OpKind::Named { name } => name.clone(),
            other => {
                let debug = format!("{other:?}");
                let head = debug
                    .split(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap_or_default()
                    .to_string();
                to_snake(&head)
            }
        }
    }
}

fn to_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Classifies a framework operator name (ATen, e.g. `aten.convolution.default`).
fn class_of_framework_name(name: &str) -> OpClass {
    let base = name
        .strip_prefix("aten.")
        .unwrap_or(name)
        .split('.')
        .next()
        .unwrap_or(name);
    let has = |s: &str| base.contains(s);
    if has("convolution") || has("conv") {
        OpClass::Convolution
    } else if has("mm") || has("matmul") || has("linear") || has("bmm") || has("addmm") {
        OpClass::MatMul
    } else if has("norm") || has("softmax") || has("nll_loss") || has("cross_entropy") {
        OpClass::Normalization
    } else if has("pool") {
        OpClass::Pooling
    } else if base == "view"
        || base == "t"
        || base == "expand"
        || base == "_unsafe_view"
        || base == "reshape"
        || base == "transpose"
        || base == "permute"
        || base == "slice"
        || base == "select"
        || base == "unsqueeze"
        || base == "squeeze"
        || base == "alias"
        || base == "detach"
    {
        OpClass::View
    } else if has("sum") || has("mean") || has("amax") || has("max") || has("min") {
        OpClass::Reduction
    } else if has("cat") || has("clone") || has("copy") || has("embedding") || has("index") {
        OpClass::DataMovement
    } else {
        OpClass::Elementwise
    }
}

/// One operator of the training graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub id: OpId,
    pub name: String,
    pub kind: OpKind,
    pub phase: Phase,
    /// Tensor operands in argument order; may repeat.
    pub inputs: Vec<TensorId>,
    /// Every tensor the op returns.
    pub outputs: Vec<TensorId>,
    /// Floating-point operations (2 per multiply-add).
    pub flops: u64,
    /// Bytes the op reads from device memory (distinct inputs).
    pub bytes_read: u64,
    /// Bytes the op writes to device memory (outputs that own storage or update in place).
    pub bytes_written: u64,
    /// Scratch device memory needed only while the op runs.
    #[serde(default)]
    pub workspace_bytes: u64,
    /// Whether the op may be re-executed to recompute its outputs: pure forward
    /// ops, and random ones only if their seed or mask is kept.
    pub recomputable: bool,
    /// The model module that issued it (forward ops), for readable reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}
