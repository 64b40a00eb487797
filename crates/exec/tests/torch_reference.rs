//! The CPU executor's real kernels against PyTorch: every case of
//! `tests/data/torch_kernel_refs.json` (written by
//! `tools/torch_kernel_refs.py`, which computed it with PyTorch from the same
//! stored inputs) is run through [`run_kernel`], forward and, where the case
//! has one, backward with the saved tensors the graph builder keeps; every
//! output must equal PyTorch's to f32 rounding.
//!
//! Why: `kernels.rs` checks each backward against finite differences of its
//! own forward, which a kernel computing the wrong function consistently
//! passes (a tanh GELU where `nn.GELU()` is the erf one, a biased running
//! variance). `python/tests/test_kernel_refs.py` recomputes the file with the
//! installed PyTorch, so the two checks together tie the kernels to PyTorch
//! without `cargo test` needing it.

use outcore_exec::cpu::run_kernel;
use outcore_exec::{DeviceSegment, KernelCall, Operand};
use outcore_graph::{Conv2dAttrs, DType, OpId, OpKind, Pool2dAttrs, TensorId};
use serde::Deserialize;

const REFS: &str = include_str!("data/torch_kernel_refs.json");

/// Largest accepted difference from PyTorch: `ABS_TOL + REL_TOL * |torch|`.
/// Sums here run over at most a few hundred terms in another order than
/// PyTorch's, a few f32 ulps apart; the errors this is for are far larger
/// (the tanh GELU is 2e-4 off the erf one near |x| = 2).
const ABS_TOL: f64 = 1e-5;
const REL_TOL: f64 = 1e-5;

#[derive(Deserialize)]
struct Refs {
    format: String,
    torch: String,
    cases: Vec<Case>,
}

#[derive(Deserialize, Clone)]
struct Tensor {
    shape: Vec<u64>,
    dtype: String,
    data: Vec<f64>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    kind: String,
    attrs: serde_json::Value,
    step: u64,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    grad_output: Option<Tensor>,
    /// One per forward input: PyTorch's gradient, or `None` where the case
    /// asks for none.
    grads: Option<Vec<Option<Tensor>>>,
}

impl Tensor {
    fn dtype(&self) -> DType {
        match self.dtype.as_str() {
            "int64" => DType::Int64,
            _ => DType::Float32,
        }
    }

    fn operand(&self) -> Operand {
        let n: u64 = self.shape.iter().product();
        let size_bytes = n * self.dtype().size_bytes();
        Operand {
            tensor: TensorId(0),
            segments: vec![DeviceSegment::new(0, size_bytes)],
            shape: self.shape.clone(),
            dtype: self.dtype(),
            size_bytes,
            write: true,
            view: None,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self.dtype() {
            DType::Int64 => self
                .data
                .iter()
                .flat_map(|v| (*v as i64).to_le_bytes())
                .collect(),
            _ => self
                .data
                .iter()
                .flat_map(|v| (*v as f32).to_le_bytes())
                .collect(),
        }
    }

    /// This tensor's shape and dtype holding `bytes` (a kernel's output).
    fn with_bytes(&self, bytes: &[u8]) -> Tensor {
        let data = match self.dtype() {
            DType::Int64 => bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64)
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64)
                .collect(),
        };
        Tensor {
            data,
            ..self.clone()
        }
    }
}

fn f32_attr(case: &Case, key: &str) -> f32 {
    case.attrs[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{}: attr {key}", case.name)) as f32
}

fn pair(case: &Case, key: &str) -> [u32; 2] {
    let v = &case.attrs[key];
    let at = |k: usize| v[k].as_u64().expect("a pair of integers") as u32;
    [at(0), at(1)]
}

/// The op kind a case names, with its attributes.
fn op_kind(case: &Case) -> OpKind {
    let flag = |key: &str| case.attrs[key].as_bool().expect("a bool attr");
    match case.kind.as_str() {
        "linear" => OpKind::Linear { bias: flag("bias") },
        "matmul" => OpKind::MatMul {
            transpose_b: flag("transpose_b"),
            scale: f32_attr(case, "scale"),
        },
        "embedding" => OpKind::Embedding,
        "conv2d" => OpKind::Conv2d(Conv2dAttrs {
            kernel: pair(case, "kernel"),
            stride: pair(case, "stride"),
            padding: pair(case, "padding"),
            dilation: pair(case, "dilation"),
            groups: case.attrs["groups"].as_u64().expect("groups") as u32,
            bias: flag("bias"),
        }),
        "max_pool2d" | "avg_pool2d" => {
            let attrs = Pool2dAttrs {
                kernel: pair(case, "kernel"),
                stride: pair(case, "stride"),
                padding: pair(case, "padding"),
                ceil_mode: false,
            };
            if case.kind == "max_pool2d" {
                OpKind::MaxPool2d(attrs)
            } else {
                OpKind::AvgPool2d(attrs)
            }
        }
        "global_avg_pool" => OpKind::GlobalAvgPool,
        "relu" => OpKind::Relu,
        "relu6" => OpKind::Relu6,
        "tanh" => OpKind::Tanh,
        "sigmoid" => OpKind::Sigmoid,
        "gelu" => OpKind::Gelu,
        "silu" => OpKind::Silu,
        "softmax" => OpKind::Softmax,
        "scale" => OpKind::Scale {
            factor: f32_attr(case, "factor"),
        },
        "add_scalar" => OpKind::AddScalar {
            value: f32_attr(case, "value"),
        },
        "pow_scalar" => OpKind::PowScalar {
            exponent: f32_attr(case, "exponent"),
        },
        "add" => OpKind::Add,
        "mul" => OpKind::Mul,
        "concat" => OpKind::Concat {
            axis: case.attrs["axis"].as_u64().expect("axis") as u32,
        },
        "batch_norm" => OpKind::BatchNorm {
            eps: f32_attr(case, "eps"),
        },
        "batch_norm_stats" => OpKind::BatchNormStats {
            momentum: f32_attr(case, "momentum"),
            count: case.attrs["count"].as_u64().expect("count"),
        },
        "layer_norm" => OpKind::LayerNorm {
            eps: f32_attr(case, "eps"),
        },
        "softmax_cross_entropy" => OpKind::SoftmaxCrossEntropy,
        "sgd" => OpKind::SgdUpdate {
            lr: f32_attr(case, "lr"),
            momentum: f32_attr(case, "momentum"),
            weight_decay: f32_attr(case, "weight_decay"),
        },
        "adam" => OpKind::AdamUpdate {
            lr: f32_attr(case, "lr"),
            beta1: f32_attr(case, "beta1"),
            beta2: f32_attr(case, "beta2"),
            eps: f32_attr(case, "eps"),
            weight_decay: f32_attr(case, "weight_decay"),
            decoupled: flag("decoupled"),
        },
        other => panic!(
            "{}: unknown kind `{other}` in the reference file",
            case.name
        ),
    }
}

/// What the backward kernel of `case` reads after the output's gradient, as
/// the graph builder saves it: forward inputs (`In`) and outputs (`Out`).
enum Saved {
    In(usize),
    Out(usize),
}

fn saved(case: &Case) -> Vec<Saved> {
    use Saved::{In, Out};
    match case.kind.as_str() {
        "linear" | "matmul" | "conv2d" | "mul" => vec![In(0), In(1)],
        "embedding" => vec![In(0)],
        "max_pool2d" => vec![In(0), Out(1)],
        "avg_pool2d" | "global_avg_pool" | "relu6" | "gelu" | "silu" | "pow_scalar" => {
            vec![In(0)]
        }
        "relu" | "tanh" | "sigmoid" | "softmax" => vec![Out(0)],
        "scale" => vec![],
        "batch_norm" => vec![In(0), In(1), Out(1), Out(2)],
        "layer_norm" => vec![In(0), In(1), In(2), Out(1), Out(2)],
        "softmax_cross_entropy" => vec![Out(1), In(1)],
        other => panic!("{}: no backward layout for `{other}`", case.name),
    }
}

fn call(case: &Case, kind: OpKind, inputs: &[&Tensor], outputs: &[&Tensor]) -> KernelCall {
    KernelCall {
        op: OpId(0),
        op_name: case.name.clone(),
        kind,
        inputs: inputs.iter().map(|t| t.operand()).collect(),
        outputs: outputs.iter().map(|t| t.operand()).collect(),
        step: case.step,
        synthetic_time_s: 0.0,
    }
}

/// Runs `call` and returns its outputs shaped like `like`.
fn run(case: &Case, call: &KernelCall, inputs: &[&Tensor], like: &[&Tensor]) -> Vec<Tensor> {
    let raw: Vec<Vec<u8>> = inputs.iter().map(|t| t.bytes()).collect();
    let (outs, synthetic) =
        run_kernel(call, &raw).unwrap_or_else(|e| panic!("{}: kernel failed: {e}", case.name));
    assert!(!synthetic, "{}: ran the synthetic stand-in", case.name);
    outs.iter()
        .zip(like)
        .map(|(bytes, t)| t.with_bytes(bytes))
        .collect()
}

/// The largest scaled difference of `got` from PyTorch's `want`, in units of
/// the tolerance (at most 1 passes), and where it is.
fn worst(got: &Tensor, want: &Tensor) -> (f64, usize) {
    assert_eq!(got.data.len(), want.data.len(), "lengths");
    got.data
        .iter()
        .zip(&want.data)
        .enumerate()
        .map(|(k, (g, w))| ((g - w).abs() / (ABS_TOL + REL_TOL * w.abs()), k))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Every mismatch of `got` against `want` as a line (empty when they agree).
fn compare(case: &Case, what: &str, got: &[Tensor], want: &[&Tensor]) -> Vec<String> {
    let mut bad = Vec::new();
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let (ratio, at) = worst(g, w);
        if ratio > 1.0 {
            bad.push(format!(
                "{}: {what} {k} element {at}: outcore {} PyTorch {} ({ratio:.1}x the tolerance)",
                case.name, g.data[at], w.data[at]
            ));
        }
    }
    bad
}

/// Forward (and backward, where the case has gradients) of one case; the
/// mismatches, one line each.
fn check(case: &Case) -> Vec<String> {
    let kind = op_kind(case);
    let ins: Vec<&Tensor> = case.inputs.iter().collect();
    let want_out: Vec<&Tensor> = case.outputs.iter().collect();
    let fwd = call(case, kind.clone(), &ins, &want_out);
    let outs = run(case, &fwd, &ins, &want_out);
    let mut bad = compare(case, "output", &outs, &want_out);
    let (Some(g), Some(grads)) = (&case.grad_output, &case.grads) else {
        return bad;
    };
    let mut bwd_in: Vec<&Tensor> = vec![g];
    for s in saved(case) {
        bwd_in.push(match s {
            Saved::In(k) => &case.inputs[k],
            Saved::Out(k) => &outs[k],
        });
    }
    let want_grads: Vec<&Tensor> = grads.iter().flatten().collect();
    let bwd_kind = OpKind::Backward {
        forward: Box::new(kind),
        grads_for: grads.iter().map(Option::is_some).collect(),
    };
    let bwd = call(case, bwd_kind, &bwd_in, &want_grads);
    let got = run(case, &bwd, &bwd_in, &want_grads);
    bad.extend(compare(case, "gradient", &got, &want_grads));
    bad
}

fn refs() -> Refs {
    let refs: Refs = serde_json::from_str(REFS).expect("the reference file parses");
    assert_eq!(refs.format, "outcore-torch-kernel-refs/1");
    refs
}

#[test]
fn every_real_kernel_matches_pytorch() {
    let refs = refs();
    let bad: Vec<String> = refs.cases.iter().flat_map(check).collect();
    assert!(
        bad.is_empty(),
        "{} mismatches against PyTorch {}:\n{}",
        bad.len(),
        refs.torch,
        bad.join("\n")
    );
}

/// The file covers what it says: each kind the CPU backend runs for real,
/// the backward of each differentiable one, and three optimizer steps.
#[test]
fn the_reference_file_covers_every_real_kernel() {
    let refs = refs();
    let kinds: std::collections::BTreeSet<&str> =
        refs.cases.iter().map(|c| c.kind.as_str()).collect();
    for kind in [
        "linear",
        "matmul",
        "embedding",
        "conv2d",
        "max_pool2d",
        "avg_pool2d",
        "global_avg_pool",
        "relu",
        "relu6",
        "tanh",
        "sigmoid",
        "gelu",
        "silu",
        "softmax",
        "scale",
        "add_scalar",
        "pow_scalar",
        "add",
        "mul",
        "concat",
        "batch_norm",
        "batch_norm_stats",
        "layer_norm",
        "softmax_cross_entropy",
        "sgd",
        "adam",
    ] {
        assert!(kinds.contains(kind), "no case of `{kind}`");
    }
    let with_grads = refs.cases.iter().filter(|c| c.grads.is_some()).count();
    assert!(with_grads >= 20, "{with_grads} cases with gradients");
    let steps: Vec<u64> = refs
        .cases
        .iter()
        .filter(|c| c.kind == "adam")
        .map(|c| c.step)
        .collect();
    assert!(steps.contains(&3), "Adam's third step: {steps:?}");
}
