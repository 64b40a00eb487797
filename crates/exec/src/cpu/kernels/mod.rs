//! Real f32 kernels for the ops the tiny models use, and a deterministic synthetic
//! stand-in for every other op kind. Every reduction sums in a fixed order, so
//! results are bit-identical whatever the plan.
//!
//! One module per family of ops, each with its forward kernels and their
//! gradients side by side: [`dense`] (linear, matmul, embedding lookup),
//! [`spatial`] (convolution and pooling), [`pointwise`] (activations,
//! elementwise arithmetic, softmax, dropout, reshaping), [`norm`] (batch and
//! layer norm), [`loss`] (softmax cross-entropy), [`optim`] (SGD and Adam
//! updates) and [`synthetic`] (the stand-in). This module checks a call's
//! dtypes, dispatches on its kind and checks what the kernel returns.

mod dense;
mod loss;
mod norm;
mod optim;
mod pointwise;
mod spatial;
mod synthetic;

pub use synthetic::SYNTHETIC_SAMPLE_BYTES;

use crate::backend::{KernelCall, Operand};
use outcore_graph::{DType, OpKind};

/// Runs a kernel on its input bytes; returns one byte vector per output and whether
/// the synthetic stand-in ran (so the caller can sleep its cost).
pub fn run_kernel(call: &KernelCall, inputs: &[Vec<u8>]) -> Result<(Vec<Vec<u8>>, bool), String> {
    if inputs.len() != call.inputs.len() {
        return Err(format!(
            "{} input buffers for {} operands",
            inputs.len(),
            call.inputs.len()
        ));
    }
    match real(call, inputs) {
        Some(result) => {
            let outs = result?;
            if outs.len() != call.outputs.len() {
                return Err(format!(
                    "kernel produced {} outputs, the op has {}",
                    outs.len(),
                    call.outputs.len()
                ));
            }
            let mut bytes = Vec::with_capacity(outs.len());
            for (o, v) in call.outputs.iter().zip(outs) {
                let b = v.into_bytes();
                if (b.len() as u64) != o.size_bytes {
                    return Err(format!(
                        "output {} has {} bytes, expected {}",
                        o.tensor,
                        b.len(),
                        o.size_bytes
                    ));
                }
                bytes.push(b);
            }
            Ok((bytes, false))
        }
        None => Ok((synthetic::outputs(call, inputs), true)),
    }
}

/// Typed tensor data.
#[derive(Debug, Clone)]
enum Buf {
    F32(Vec<f32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

impl Buf {
    fn into_bytes(self) -> Vec<u8> {
        match self {
            Buf::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buf::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buf::U8(v) => v,
        }
    }
}

/// What a kernel returns: its outputs in the op's order, or why it cannot run.
type Outputs = Result<Vec<Buf>, String>;

/// One call's operands and input bytes, decoded as a kernel asks for them.
/// An input past the call's operands reads as empty ([`run_kernel`] has
/// checked there is one buffer per operand).
struct Args<'a> {
    call: &'a KernelCall,
    raw: &'a [Vec<u8>],
}

impl Args<'_> {
    /// Input `k` as little-endian f32s.
    fn f32s(&self, k: usize) -> Vec<f32> {
        self.raw.get(k).map(|b| f32s(b)).unwrap_or_default()
    }

    /// Input `k` as little-endian i64s (indices, labels).
    fn i64s(&self, k: usize) -> Vec<i64> {
        self.raw.get(k).map(|b| i64s(b)).unwrap_or_default()
    }

    /// Input `k`'s bytes as they are (masks, reshapes).
    fn bytes(&self, k: usize) -> Vec<u8> {
        self.raw.get(k).cloned().unwrap_or_default()
    }

    /// Input `k`'s shape.
    fn in_shape(&self, k: usize) -> Vec<usize> {
        self.call.inputs.get(k).map(shape).unwrap_or_default()
    }

    /// The innermost dimension of input `k` (1 for a scalar).
    fn in_last_dim(&self, k: usize) -> usize {
        *self.in_shape(k).last().unwrap_or(&1)
    }

    /// Output `k`'s shape as the graph gives it (empty when absent).
    fn out_shape(&self, k: usize) -> &[u64] {
        self.call.outputs.get(k).map_or(&[], |o| &o.shape)
    }
}

/// Which forward inputs a backward kernel returns gradients for.
struct Wanted<'a>(&'a [bool]);

impl Wanted<'_> {
    /// Whether the gradient of forward input `k` is an output.
    fn at(&self, k: usize) -> bool {
        self.0.get(k).copied().unwrap_or(false)
    }

    /// Keeps the gradients the op outputs, in forward-input order; an error
    /// names a wanted gradient the kernel did not compute.
    fn select(&self, all: Vec<Option<Vec<f32>>>) -> Outputs {
        let mut out = Vec::new();
        for (k, wanted) in self.0.iter().enumerate() {
            if *wanted {
                match all.get(k).cloned().flatten() {
                    Some(v) => out.push(Buf::F32(v)),
                    None => return Err(format!("no gradient for forward input {k}")),
                }
            }
        }
        Ok(out)
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

fn shape(o: &Operand) -> Vec<usize> {
    o.shape.iter().map(|&d| d as usize).collect()
}

fn numel(o: &Operand) -> usize {
    o.shape.iter().product::<u64>() as usize
}

/// The real kernel, or `None` when the kind (or its dtypes) has none.
fn real(call: &KernelCall, raw: &[Vec<u8>]) -> Option<Outputs> {
    // Real kernels handle f32 data with int64 indices and bool masks.
    let typed_ok = call.inputs.iter().chain(&call.outputs).all(|o| {
        matches!(
            o.dtype,
            DType::Float32 | DType::Int64 | DType::Bool | DType::Uint8
        )
    });
    if !typed_ok {
        return None;
    }
    let args = Args { call, raw };
    match &call.kind {
        OpKind::Backward { forward, grads_for } => backward(&args, forward, &Wanted(grads_for)),
        kind => forward(&args, kind),
    }
}

/// Forward kernels (and the optimizer updates); `None` for kinds without one.
fn forward(a: &Args<'_>, kind: &OpKind) -> Option<Outputs> {
    use pointwise::map;
    Some(match kind {
        OpKind::Linear { bias } => dense::linear(a, *bias),
        OpKind::MatMul { transpose_b, scale } => dense::matmul(a, *transpose_b, *scale),
        OpKind::Embedding => dense::embedding(a),
        OpKind::Conv2d(attrs) => spatial::conv2d(a, attrs),
        OpKind::MaxPool2d(attrs) => spatial::maxpool(a, attrs),
        OpKind::AvgPool2d(attrs) => spatial::avgpool(a, attrs),
        OpKind::GlobalAvgPool => spatial::global_avgpool(a),
        OpKind::Relu => map(a, |x| if x > 0.0 { x } else { 0.0 }),
        OpKind::Relu6 => map(a, |x| x.clamp(0.0, 6.0)),
        OpKind::Tanh => map(a, |x| x.tanh()),
        OpKind::Sigmoid => map(a, |x| 1.0 / (1.0 + (-x).exp())),
        OpKind::Gelu => map(a, |x| pointwise::gelu(x).0),
        OpKind::Silu => map(a, |x| pointwise::silu(x).0),
        OpKind::Scale { factor } => map(a, |x| x * factor),
        OpKind::AddScalar { value } => map(a, |x| x + value),
        OpKind::PowScalar { exponent } => map(a, |x| x.powf(*exponent)),
        OpKind::Add | OpKind::GradAccumulate => pointwise::sum(a),
        OpKind::Mul => pointwise::mul(a),
        OpKind::Fill { value } => pointwise::fill(a, *value),
        OpKind::View | OpKind::Copy => pointwise::reshape(a),
        OpKind::Concat { axis } => pointwise::concat(a, *axis as usize),
        OpKind::Softmax => pointwise::softmax(a),
        OpKind::Dropout { p, seed } => pointwise::dropout(a, *p, *seed),
        OpKind::BatchNorm { eps } => norm::batchnorm(a, *eps),
        OpKind::BatchNormStats { momentum, count } => norm::batchnorm_stats(a, *momentum, *count),
        OpKind::LayerNorm { eps } => norm::layernorm(a, *eps),
        OpKind::SoftmaxCrossEntropy => loss::softmax_cross_entropy(a),
        OpKind::SgdUpdate {
            lr,
            momentum,
            weight_decay,
        } => optim::sgd(a, *lr, *momentum, *weight_decay),
        OpKind::AdamUpdate {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        } => optim::adam(
            a,
            &optim::Adam {
                lr: *lr,
                beta1: *beta1,
                beta2: *beta2,
                eps: *eps,
                weight_decay: *weight_decay,
                decoupled: *decoupled,
            },
        ),
        _ => return None,
    })
}

/// Backward kernels. Inputs: output gradients, then saved tensors (see the builder);
/// outputs: one gradient per forward input whose `grads_for` is true.
fn backward(a: &Args<'_>, forward: &OpKind, want: &Wanted<'_>) -> Option<Outputs> {
    use pointwise::map_grad;
    Some(match forward {
        OpKind::Linear { bias } => dense::linear_backward(a, *bias, want),
        OpKind::MatMul { transpose_b, scale } => {
            dense::matmul_backward(a, *transpose_b, *scale, want)
        }
        OpKind::Embedding => dense::embedding_backward(a, want),
        OpKind::Conv2d(attrs) => spatial::conv2d_backward(a, attrs, want),
        OpKind::MaxPool2d(_) => spatial::maxpool_backward(a, want),
        OpKind::AvgPool2d(attrs) => spatial::avgpool_backward(a, attrs, want),
        OpKind::GlobalAvgPool => spatial::global_avgpool_backward(a, want),
        OpKind::Relu => map_grad(a, want, |g, y| if y > 0.0 { g } else { 0.0 }),
        OpKind::Relu6 => map_grad(a, want, |g, x| if x > 0.0 && x < 6.0 { g } else { 0.0 }),
        OpKind::Tanh => map_grad(a, want, |g, y| g * (1.0 - y * y)),
        OpKind::Sigmoid => map_grad(a, want, |g, y| g * y * (1.0 - y)),
        OpKind::Gelu => map_grad(a, want, |g, x| g * pointwise::gelu(x).1),
        OpKind::Silu => map_grad(a, want, |g, x| g * pointwise::silu(x).1),
        OpKind::Scale { factor } => {
            want.select(vec![Some(a.f32s(0).iter().map(|g| g * factor).collect())])
        }
        OpKind::PowScalar { exponent } => {
            map_grad(a, want, |g, x| g * exponent * x.powf(exponent - 1.0))
        }
        OpKind::Mul => pointwise::mul_backward(a, want),
        OpKind::Softmax => pointwise::softmax_backward(a, want),
        OpKind::Dropout { p, .. } => pointwise::dropout_backward(a, *p, want),
        OpKind::View | OpKind::Copy | OpKind::Concat { .. } => pointwise::reshape(a),
        OpKind::BatchNorm { .. } => norm::batchnorm_backward(a, want),
        OpKind::LayerNorm { .. } => norm::layernorm_backward(a, want),
        OpKind::SoftmaxCrossEntropy => loss::softmax_cross_entropy_backward(a, want),
        _ => return None,
    })
}
