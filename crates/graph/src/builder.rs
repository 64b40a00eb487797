//! Layer-level builder: records forward layers on a tape, then emits the backward
//! ops an autograd engine runs and the optimizer's in-place updates.
//!
//! Backward follows PyTorch's eager autograd: ops run in reverse creation order
//! (a valid topological order), and each backward op keeps exactly the tensors its
//! PyTorch counterpart saves, e.g. ReLU keeps its output, convolution its input and
//! weight, batch norm its input, weight and batch statistics, max pooling its input
//! and indices. A tensor used by several ops receives its gradient contributions
//! summed by [`OpKind::GradAccumulate`] as they arrive. Addition passes its output
//! gradient through without an op, like `AddBackward`.
//!
//! Choices where PyTorch differs in detail: the optimizer is one fused op per
//! parameter (PyTorch's for-loop implementation allocates one parameter-sized
//! temporary at a time, which never decides the peak); batch-norm's running
//! statistics update is a separate small op, so the normalisation stays pure and
//! recomputable; `num_batches_tracked` is not modelled (8 bytes).

use std::cell::RefCell;

use crate::{
    Conv2dAttrs, DType, Graph, GraphError, GraphMeta, Op, OpId, OpKind, Phase, Pool2dAttrs, Tensor,
    TensorId, TensorKind,
};

/// The optimizer whose update ops [`GraphBuilder::finish`] appends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// No optimizer step (forward and backward only).
    None,
    /// SGD; a momentum buffer per parameter when `momentum > 0`.
    Sgd {
        lr: f32,
        momentum: f32,
        weight_decay: f32,
    },
    /// Adam (`decoupled: false`) or AdamW (`decoupled: true`); two moments per parameter.
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
    },
}

impl Optimizer {
    /// SGD with momentum 0.9 and weight decay 1e-4, the torchvision recipe (and the
    /// optimizer of the example graphs).
    pub fn sgd_momentum() -> Self {
        Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 1e-4,
        }
    }

    /// AdamW with the Hugging Face defaults.
    pub fn adamw() -> Self {
        Optimizer::Adam {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled: true,
        }
    }

    /// The name recorded in [`GraphMeta::optimizer`].
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::None => "none",
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::Adam {
                decoupled: false, ..
            } => "adam",
            Optimizer::Adam {
                decoupled: true, ..
            } => "adamw",
        }
    }
}

/// How the backward of one forward op is formed.
#[derive(Debug, Clone)]
enum BackwardRule {
    /// One backward op reading the gradients of `grad_of` (forward outputs) and
    /// the `saved` tensors, producing gradients of the inputs that require them.
    Op {
        grad_of: Vec<TensorId>,
        saved: Vec<TensorId>,
        flops: u64,
    },
    /// Gradient flows unchanged to every input (addition).
    PassThrough,
    /// Gradient is a view of the output gradient (reshape, concat slices).
    Views,
    /// No gradient flows (nothing requires it).
    None,
}

#[derive(Debug, Clone)]
struct TapeEntry {
    op: OpId,
    rule: BackwardRule,
}

/// Builds a training graph layer by layer. See the module docs.
#[derive(Debug)]
pub struct GraphBuilder {
    meta: GraphMeta,
    dtype: DType,
    tensors: Vec<Tensor>,
    ops: Vec<Op>,
    requires_grad: Vec<bool>,
    tape: Vec<TapeEntry>,
    scope: Vec<String>,
    /// Parameters with their optional-state slot, in creation order.
    params: Vec<TensorId>,
    next_seed: u64,
    /// The first size or FLOP count that did not fit in 64 bits (what and where).
    /// Layers keep building on saturated values so that their signatures stay
    /// infallible; [`Self::finish`] returns the overflow as an error, so no
    /// wrapped or saturated number ever reaches a graph.
    overflow: RefCell<Option<String>>,
}

/// The largest tensor the builder makes: 2^60 bytes (1 EiB), far beyond any
/// device, and small enough that a tensor's element count times the small
/// per-element FLOP factors of the layers (at most 12) still fits in 64 bits.
pub const MAX_TENSOR_BYTES: u64 = 1 << 60;

impl GraphBuilder {
    /// Starts a graph for `model` at `batch`, with `dtype` activations and parameters.
    pub fn new(model: &str, batch: u64, dtype: DType) -> Self {
        GraphBuilder {
            meta: GraphMeta {
                model: model.to_string(),
                batch,
                seq: None,
                optimizer: "none".into(),
                source: "zoo".into(),
            },
            dtype,
            tensors: Vec::new(),
            ops: Vec::new(),
            requires_grad: Vec::new(),
            tape: Vec::new(),
            scope: Vec::new(),
            params: Vec::new(),
            next_seed: 0x5eed,
            overflow: RefCell::new(None),
        }
    }

    /// Records where the architecture comes from (cited in `outcore zoo`).
    pub fn set_source(&mut self, source: &str) {
        self.meta.source = source.to_string();
    }

    /// Records the sequence length of a sequence model.
    pub fn set_seq(&mut self, seq: u64) {
        self.meta.seq = Some(seq);
    }

    /// The activation dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Enters a module scope; names created inside are prefixed `scope.`.
    pub fn push_scope(&mut self, name: impl Into<String>) {
        self.scope.push(name.into());
    }

    /// Leaves the innermost module scope.
    pub fn pop_scope(&mut self) {
        self.scope.pop();
    }

    /// Runs `f` inside module scope `name`.
    pub fn scoped<R>(&mut self, name: impl Into<String>, f: impl FnOnce(&mut Self) -> R) -> R {
        self.push_scope(name);
        let r = f(self);
        self.pop_scope();
        r
    }

    fn qualified(&self, name: &str) -> String {
        if self.scope.is_empty() {
            name.to_string()
        } else if name.is_empty() {
            self.scope.join(".")
        } else {
            format!("{}.{}", self.scope.join("."), name)
        }
    }

    /// Shape of a tensor.
    pub fn shape(&self, t: TensorId) -> &[u64] {
        &self.tensors[t.index()].shape
    }

    /// Number of elements of a tensor.
    pub fn numel(&self, t: TensorId) -> u64 {
        self.product("element count", &self.tensors[t.index()].shape)
    }

    /// The product of `factors` (a size or a FLOP count), checked: on overflow
    /// the first one is recorded with `what` and the current scope, and the
    /// result saturates (see [`Self::finish`], which turns it into an error).
    pub fn product(&self, what: &str, factors: &[u64]) -> u64 {
        factors
            .iter()
            .try_fold(1u64, |acc, &f| acc.checked_mul(f))
            .unwrap_or_else(|| {
                self.note_overflow(what);
                u64::MAX
            })
    }

    /// The sum of `terms`, checked like [`Self::product`].
    fn sum(&self, what: &str, terms: &[u64]) -> u64 {
        terms
            .iter()
            .try_fold(0u64, |acc, &t| acc.checked_add(t))
            .unwrap_or_else(|| {
                self.note_overflow(what);
                u64::MAX
            })
    }

    /// The first overflow recorded, as an error.
    fn check_overflow(&self) -> Result<(), GraphError> {
        match self.overflow.borrow().as_ref() {
            None => Ok(()),
            Some(what) => Err(crate::GraphErrorKind::Overflow {
                model: self.meta.model.clone(),
                batch: self.meta.batch,
                what: what.clone(),
            }
            .into()),
        }
    }

    fn note_overflow(&self, what: &str) {
        let mut first = self.overflow.borrow_mut();
        if first.is_none() {
            let at = self.qualified("");
            *first = Some(if at.is_empty() {
                what.to_string()
            } else {
                format!("{what} at {at}")
            });
        }
    }

    /// Number of parameters created so far (elements).
    pub fn param_count(&self) -> u64 {
        self.params.iter().map(|&p| self.numel(p)).sum()
    }

    fn new_tensor(
        &mut self,
        name: String,
        shape: &[u64],
        dtype: DType,
        kind: TensorKind,
        requires_grad: bool,
    ) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        let mut size_bytes = self.product(
            "tensor size",
            &[self.product("element count", shape), dtype.size_bytes()],
        );
        if size_bytes > MAX_TENSOR_BYTES {
            self.note_overflow("tensor size over 2^60 bytes");
            size_bytes = MAX_TENSOR_BYTES;
        }
        self.tensors.push(Tensor {
            id,
            name,
            shape: shape.to_vec(),
            dtype,
            size_bytes,
            kind,
            producer: None,
            view_of: None,
            inplace_update_of: None,
            is_output: false,
        });
        self.requires_grad.push(requires_grad);
        id
    }

    /// A graph input in the activation dtype (the batch).
    pub fn input(&mut self, name: &str, shape: &[u64]) -> TensorId {
        let name = self.qualified(name);
        self.new_tensor(name, shape, self.dtype, TensorKind::Input, false)
    }

    /// A graph input of `int64` indices (token ids).
    pub fn input_indices(&mut self, name: &str, shape: &[u64]) -> TensorId {
        let name = self.qualified(name);
        self.new_tensor(name, shape, DType::Int64, TensorKind::Input, false)
    }

    /// Integer class labels.
    pub fn label(&mut self, name: &str, shape: &[u64]) -> TensorId {
        let name = self.qualified(name);
        self.new_tensor(name, shape, DType::Int64, TensorKind::Label, false)
    }

    /// A trainable parameter named `scope.name`.
    pub fn parameter(&mut self, name: &str, shape: &[u64]) -> TensorId {
        let name = self.qualified(name);
        let id = self.new_tensor(name, shape, self.dtype, TensorKind::Parameter, true);
        self.params.push(id);
        id
    }

    fn buffer(&mut self, name: &str, shape: &[u64]) -> TensorId {
        let name = self.qualified(name);
        self.new_tensor(name, shape, self.dtype, TensorKind::Buffer, false)
    }

    /// Appends a forward op producing fresh outputs of the given shapes and dtypes.
    fn forward_op(
        &mut self,
        kind: OpKind,
        label: &str,
        inputs: Vec<TensorId>,
        outputs: &[(&str, Vec<u64>, DType)],
        flops: u64,
    ) -> (OpId, Vec<TensorId>) {
        let op_id = OpId(self.ops.len() as u32);
        let requires = inputs.iter().any(|t| self.requires_grad[t.index()]);
        let module = self.qualified("");
        let mut out_ids = Vec::with_capacity(outputs.len());
        for (suffix, shape, dtype) in outputs {
            let name = if suffix.is_empty() {
                format!("{}:{}", self.qualified(label), op_id.0)
            } else {
                format!("{}:{}.{}", self.qualified(label), op_id.0, suffix)
            };
            let grad = requires && dtype.is_float();
            let t = self.new_tensor(name, shape, *dtype, TensorKind::Activation, grad);
            self.tensors[t.index()].producer = Some(op_id);
            out_ids.push(t);
        }
        let name = self.qualified(label);
        self.push_op(Op {
            id: op_id,
            name,
            kind,
            phase: Phase::Forward,
            inputs,
            outputs: out_ids.clone(),
            flops,
            bytes_read: 0,
            bytes_written: 0,
            workspace_bytes: 0,
            recomputable: true,
            module: if module.is_empty() {
                None
            } else {
                Some(module)
            },
        });
        (op_id, out_ids)
    }

    /// Pushes an op, filling its byte counts from its operands.
    fn push_op(&mut self, mut op: Op) {
        let mut seen: Vec<TensorId> = Vec::with_capacity(op.inputs.len());
        for &t in &op.inputs {
            if !seen.contains(&t) {
                seen.push(t);
            }
        }
        let read: Vec<u64> = seen
            .iter()
            .map(|t| self.tensors[t.index()].size_bytes)
            .collect();
        op.bytes_read = self.sum("bytes read", &read);
        let written: Vec<u64> = op
            .outputs
            .iter()
            .filter(|t| self.tensors[t.index()].view_of.is_none())
            .map(|t| self.tensors[t.index()].size_bytes)
            .collect();
        op.bytes_written = self.sum("bytes written", &written);
        self.ops.push(op);
    }

    fn record(&mut self, op: OpId, rule: BackwardRule) {
        let any_grad = self.ops[op.index()]
            .inputs
            .iter()
            .any(|t| self.requires_grad[t.index()]);
        let rule = if any_grad { rule } else { BackwardRule::None };
        self.tape.push(TapeEntry { op, rule });
    }

    fn act_out(&self, shape: Vec<u64>) -> [(&'static str, Vec<u64>, DType); 1] {
        [("", shape, self.dtype)]
    }

    // ----- layers -----

    /// 2-D convolution with square kernel, stride and padding, no bias (the common
    /// CNN case); see [`Self::conv2d_full`].
    pub fn conv2d(
        &mut self,
        name: &str,
        x: TensorId,
        out_channels: u64,
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
            bias: false,
        };
        self.conv2d_full(name, x, out_channels, attrs)
    }

    /// 2-D convolution with all attributes; creates `name.weight` (and `name.bias`).
    pub fn conv2d_full(
        &mut self,
        name: &str,
        x: TensorId,
        out_channels: u64,
        attrs: Conv2dAttrs,
    ) -> TensorId {
        let xs = self.shape(x).to_vec();
        let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
        let g = attrs.groups as u64;
        let (kh, kw) = (attrs.kernel[0] as u64, attrs.kernel[1] as u64);
        let ho = conv_out(
            h,
            attrs.kernel[0],
            attrs.stride[0],
            attrs.padding[0],
            attrs.dilation[0],
        );
        let wo = conv_out(
            w,
            attrs.kernel[1],
            attrs.stride[1],
            attrs.padding[1],
            attrs.dilation[1],
        );
        self.push_scope(name);
        let weight = self.parameter("weight", &[out_channels, c / g, kh, kw]);
        let mut inputs = vec![x, weight];
        if attrs.bias {
            let b = self.parameter("bias", &[out_channels]);
            inputs.push(b);
        }
        self.pop_scope();
        let flops = self.product("FLOPs", &[2, n, out_channels, ho, wo, c / g, kh, kw]);
        let out = self.act_out(vec![n, out_channels, ho, wo]);
        let (op, outs) = self.forward_op(OpKind::Conv2d(attrs), name, inputs, &out, flops);
        let bwd_flops = if self.requires_grad[x.index()] {
            self.product("FLOPs", &[2, flops])
        } else {
            flops
        };
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x, weight],
                flops: bwd_flops,
            },
        );
        outs[0]
    }

    /// Fully connected layer over the last axis; creates `name.weight` `[out, in]`
    /// and, with `bias`, `name.bias`.
    pub fn linear(&mut self, name: &str, x: TensorId, out_features: u64, bias: bool) -> TensorId {
        let in_features = *self.shape(x).last().unwrap_or(&1);
        self.push_scope(name);
        let w = self.parameter("weight", &[out_features, in_features]);
        let b = bias.then(|| self.parameter("bias", &[out_features]));
        self.pop_scope();
        self.linear_with(name, x, w, b)
    }

    /// Fully connected layer with given (possibly shared) weight and bias.
    pub fn linear_with(
        &mut self,
        name: &str,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
    ) -> TensorId {
        let xs = self.shape(x).to_vec();
        let in_features = *xs.last().unwrap_or(&1);
        let out_features = self.shape(w)[0];
        let rows = self.product("element count", &xs) / in_features.max(1);
        let mut out_shape = xs.clone();
        if let Some(last) = out_shape.last_mut() {
            *last = out_features;
        }
        let mut inputs = vec![x, w];
        inputs.extend(b);
        let flops = self.product("FLOPs", &[2, rows, in_features, out_features]);
        let out = self.act_out(out_shape);
        let (op, outs) = self.forward_op(
            OpKind::Linear { bias: b.is_some() },
            name,
            inputs,
            &out,
            flops,
        );
        let bwd_flops = if self.requires_grad[x.index()] {
            self.product("FLOPs", &[2, flops])
        } else {
            flops
        };
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x, w],
                flops: bwd_flops,
            },
        );
        outs[0]
    }

    /// Batched matrix product of the last two axes: `a [.., m, k] @ b [.., k, n]`, or
    /// with `transpose_b`, `a @ b^T` for `b [.., n, k]`; times `scale`.
    pub fn matmul(
        &mut self,
        name: &str,
        a: TensorId,
        b: TensorId,
        transpose_b: bool,
        scale: f32,
    ) -> TensorId {
        let as_ = self.shape(a).to_vec();
        let bs = self.shape(b).to_vec();
        let r = as_.len();
        let (m, k) = (as_[r - 2], as_[r - 1]);
        let n = if transpose_b {
            bs[bs.len() - 2]
        } else {
            bs[bs.len() - 1]
        };
        let batch = self.product("element count", &as_[..r - 2]);
        let mut out_shape = as_[..r - 2].to_vec();
        out_shape.extend([m, n]);
        let flops = self.product("FLOPs", &[2, batch, m, k, n]);
        let out = self.act_out(out_shape);
        let (op, outs) = self.forward_op(
            OpKind::MatMul { transpose_b, scale },
            name,
            vec![a, b],
            &out,
            flops,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![a, b],
                flops: self.product("FLOPs", &[2, flops]),
            },
        );
        outs[0]
    }

    fn unary(&mut self, kind: OpKind, label: &str, x: TensorId, save_output: bool) -> TensorId {
        let shape = self.shape(x).to_vec();
        let numel = self.numel(x);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(kind, label, vec![x], &out, numel);
        let saved = if save_output { outs[0] } else { x };
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![saved],
                flops: numel,
            },
        );
        outs[0]
    }

    /// ReLU; backward keeps the output (`threshold_backward(grad, result)`).
    pub fn relu(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Relu, "relu", x, true)
    }

    /// ReLU6 (`hardtanh(0, 6)`); backward keeps the input.
    pub fn relu6(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Relu6, "relu6", x, false)
    }

    /// GELU; backward keeps the input.
    pub fn gelu(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Gelu, "gelu", x, false)
    }

    /// tanh; backward keeps the output.
    pub fn tanh(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Tanh, "tanh", x, true)
    }

    /// Sigmoid; backward keeps the output.
    pub fn sigmoid(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Sigmoid, "sigmoid", x, true)
    }

    /// SiLU (`x * sigmoid(x)`, out of place); backward keeps the input
    /// (`silu_backward(grad, self)`).
    pub fn silu(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Silu, "silu", x, false)
    }

    /// Softmax over the last axis; backward keeps the output.
    pub fn softmax(&mut self, x: TensorId) -> TensorId {
        self.unary(OpKind::Softmax, "softmax", x, true)
    }

    /// Element-wise sum of same-shaped tensors; the gradient passes through.
    pub fn add(&mut self, terms: &[TensorId]) -> TensorId {
        let shape = self.shape(terms[0]).to_vec();
        let numel = self.numel(terms[0]);
        let out = self.act_out(shape);
        let flops = numel * (terms.len() as u64).saturating_sub(1).max(1);
        let (op, outs) = self.forward_op(OpKind::Add, "add", terms.to_vec(), &out, flops);
        self.record(op, BackwardRule::PassThrough);
        outs[0]
    }

    /// Multiplication by a scalar; backward keeps nothing (`mul(x, 0.5)` in eager PyTorch).
    pub fn scale(&mut self, x: TensorId, factor: f32) -> TensorId {
        let shape = self.shape(x).to_vec();
        let numel = self.numel(x);
        let out = self.act_out(shape);
        let (op, outs) =
            self.forward_op(OpKind::Scale { factor }, "mul_scalar", vec![x], &out, numel);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![],
                flops: numel,
            },
        );
        outs[0]
    }

    /// Addition of a scalar; the gradient passes through unchanged.
    pub fn add_scalar(&mut self, x: TensorId, value: f32) -> TensorId {
        let shape = self.shape(x).to_vec();
        let numel = self.numel(x);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(
            OpKind::AddScalar { value },
            "add_scalar",
            vec![x],
            &out,
            numel,
        );
        self.record(op, BackwardRule::PassThrough);
        outs[0]
    }

    /// `x ^ exponent`; backward keeps the input.
    pub fn pow_scalar(&mut self, x: TensorId, exponent: f32) -> TensorId {
        self.unary(OpKind::PowScalar { exponent }, "pow", x, false)
    }

    /// The tanh approximation of GELU as Hugging Face's `gelu_new` runs it in eager
    /// PyTorch: eight element-wise ops, keeping `x`, `0.5 x`, the tanh output and
    /// `1 + tanh` for backward (four tensors where a fused GELU keeps one).
    pub fn gelu_tanh_eager(&mut self, x: TensorId) -> TensorId {
        let half = self.scale(x, 0.5);
        let cube = self.pow_scalar(x, 3.0);
        let c = self.scale(cube, 0.044715);
        let inner = self.add(&[x, c]);
        let inner = self.scale(inner, (2.0 / std::f32::consts::PI).sqrt());
        let t = self.tanh(inner);
        let one_plus = self.add_scalar(t, 1.0);
        self.mul(half, one_plus)
    }

    /// Element-wise product; backward keeps both factors.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> TensorId {
        let shape = self.shape(a).to_vec();
        let numel = self.numel(a);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(OpKind::Mul, "mul", vec![a, b], &out, numel);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![a, b],
                flops: 2 * numel,
            },
        );
        outs[0]
    }

    /// Square pooling attributes, the output shape `[n, c, ho, wo]` of pooling `x`
    /// with them, and its element count.
    fn pool_geometry(
        &self,
        x: TensorId,
        kernel: u32,
        stride: u32,
        padding: u32,
        ceil_mode: bool,
    ) -> (Pool2dAttrs, Vec<u64>, u64) {
        let attrs = Pool2dAttrs {
            kernel: [kernel; 2],
            stride: [stride; 2],
            padding: [padding; 2],
            ceil_mode,
        };
        let xs = self.shape(x);
        let ho = pool_out(xs[2], kernel, stride, padding, ceil_mode);
        let wo = pool_out(xs[3], kernel, stride, padding, ceil_mode);
        let shape = vec![xs[0], xs[1], ho, wo];
        let numel_out = self.product("element count", &shape);
        (attrs, shape, numel_out)
    }

    /// Max pooling; outputs the pooled tensor and `int64` indices, which backward
    /// keeps with the input (`max_pool2d_with_indices_backward`).
    pub fn max_pool2d(
        &mut self,
        x: TensorId,
        kernel: u32,
        stride: u32,
        padding: u32,
        ceil_mode: bool,
    ) -> TensorId {
        let (attrs, shape, numel_out) = self.pool_geometry(x, kernel, stride, padding, ceil_mode);
        let outs_spec = [
            ("", shape.clone(), self.dtype),
            ("indices", shape, DType::Int64),
        ];
        let flops = numel_out * (kernel as u64) * (kernel as u64);
        let (op, outs) = self.forward_op(
            OpKind::MaxPool2d(attrs),
            "max_pool",
            vec![x],
            &outs_spec,
            flops,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x, outs[1]],
                flops: numel_out,
            },
        );
        outs[0]
    }

    /// Average pooling; backward keeps the input (`avg_pool2d_backward(grad, self)`).
    pub fn avg_pool2d(
        &mut self,
        x: TensorId,
        kernel: u32,
        stride: u32,
        padding: u32,
        ceil_mode: bool,
    ) -> TensorId {
        let (attrs, shape, numel_out) = self.pool_geometry(x, kernel, stride, padding, ceil_mode);
        let flops = numel_out * (kernel as u64) * (kernel as u64);
        let out = self.act_out(shape);
        let (op, outs) =
            self.forward_op(OpKind::AvgPool2d(attrs), "avg_pool", vec![x], &out, flops);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x],
                flops: self.numel(x),
            },
        );
        outs[0]
    }

    /// Adaptive average pooling to 1x1 followed by a flatten to `[n, c]`; backward
    /// keeps the input, as `_adaptive_avg_pool2d_backward` does.
    pub fn global_avg_pool(&mut self, x: TensorId) -> TensorId {
        let xs = self.shape(x).to_vec();
        let numel = self.numel(x);
        let out = self.act_out(vec![xs[0], xs[1], 1, 1]);
        let (op, outs) = self.forward_op(OpKind::GlobalAvgPool, "avgpool", vec![x], &out, numel);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x],
                flops: numel,
            },
        );
        self.reshape(outs[0], &[xs[0], xs[1]])
    }

    /// Adaptive average pooling to `out_h x out_w` (`_adaptive_avg_pool2d`, which
    /// PyTorch calls for every output size but 1x1, even when the output has the
    /// input's shape); backward keeps the input, as `_adaptive_avg_pool2d_backward`
    /// does.
    pub fn adaptive_avg_pool2d(&mut self, x: TensorId, out_h: u32, out_w: u32) -> TensorId {
        let xs = self.shape(x).to_vec();
        let numel = self.numel(x);
        let out = self.act_out(vec![xs[0], xs[1], out_h as u64, out_w as u64]);
        let (op, outs) = self.forward_op(
            OpKind::AdaptiveAvgPool2d {
                output: [out_h, out_w],
            },
            "avgpool",
            vec![x],
            &out,
            numel,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x],
                flops: numel,
            },
        );
        outs[0]
    }

    /// Average pooling with `count_include_pad=False`; backward keeps the input
    /// (`avg_pool2d_backward(grad, self, ...)`), like [`Self::avg_pool2d`].
    pub fn avg_pool2d_exclude_pad(
        &mut self,
        x: TensorId,
        kernel: u32,
        stride: u32,
        padding: u32,
        ceil_mode: bool,
    ) -> TensorId {
        let (attrs, shape, numel_out) = self.pool_geometry(x, kernel, stride, padding, ceil_mode);
        let flops = numel_out * (kernel as u64) * (kernel as u64);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(
            OpKind::AvgPool2dExcludePad(attrs),
            "avg_pool",
            vec![x],
            &out,
            flops,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x],
                flops: self.numel(x),
            },
        );
        outs[0]
    }

    /// Transposed 2-D convolution with square kernel and stride, no padding, one
    /// group; creates `name.weight` `[in, out, k, k]` (and `name.bias`). Backward
    /// keeps the input and weight, as `convolution_backward` does.
    pub fn conv_transpose2d(
        &mut self,
        name: &str,
        x: TensorId,
        out_channels: u64,
        kernel: u32,
        stride: u32,
        bias: bool,
    ) -> TensorId {
        let attrs = Conv2dAttrs {
            kernel: [kernel, kernel],
            stride: [stride, stride],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias,
        };
        let xs = self.shape(x).to_vec();
        let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
        let (k, s) = (kernel as u64, stride as u64);
        // PyTorch: (len - 1) * stride - 2 * padding + dilation * (k - 1) + 1.
        let ho = self.sum(
            "height",
            &[self.product("height", &[h.saturating_sub(1), s]), k],
        );
        let wo = self.sum(
            "width",
            &[self.product("width", &[w.saturating_sub(1), s]), k],
        );
        self.push_scope(name);
        let weight = self.parameter("weight", &[c, out_channels, k, k]);
        let mut inputs = vec![x, weight];
        if bias {
            let b = self.parameter("bias", &[out_channels]);
            inputs.push(b);
        }
        self.pop_scope();
        let flops = self.product("FLOPs", &[2, n, c, h, w, out_channels, k, k]);
        let out = self.act_out(vec![n, out_channels, ho, wo]);
        let (op, outs) = self.forward_op(OpKind::ConvTranspose2d(attrs), name, inputs, &out, flops);
        let bwd_flops = if self.requires_grad[x.index()] {
            self.product("FLOPs", &[2, flops])
        } else {
            flops
        };
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x, weight],
                flops: bwd_flops,
            },
        );
        outs[0]
    }

    /// Zero padding of height and width by `[left, right, top, bottom]`
    /// (`nn.ZeroPad2d`, `F.pad`). Backward saves nothing: `constant_pad_nd`'s
    /// gradient is a (copied) slice of the output gradient.
    pub fn zero_pad2d(&mut self, x: TensorId, pads: [u32; 4]) -> TensorId {
        let mut shape = self.shape(x).to_vec();
        let r = shape.len();
        shape[r - 1] += (pads[0] + pads[1]) as u64;
        shape[r - 2] += (pads[2] + pads[3]) as u64;
        let numel = self.product("element count", &shape);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(OpKind::ZeroPad2d { pads }, "pad", vec![x], &out, numel);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![],
                flops: numel,
            },
        );
        outs[0]
    }

    /// `x[:, :, top:, left:]`: a view of `x` that drops the first `top` rows and
    /// `left` columns. Backward saves nothing but allocates an input-sized gradient
    /// (`slice_backward` zero-fills and copies), so it is an op, not a view.
    pub fn crop2d(&mut self, x: TensorId, top: u32, left: u32) -> TensorId {
        let mut shape = self.shape(x).to_vec();
        let r = shape.len();
        shape[r - 1] = shape[r - 1].saturating_sub(left as u64);
        shape[r - 2] = shape[r - 2].saturating_sub(top as u64);
        let in_numel = self.numel(x);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(OpKind::Crop2d { top, left }, "crop", vec![x], &out, 0);
        let owner = self.tensors[x.index()].view_of.unwrap_or(x);
        self.tensors[outs[0].index()].view_of = Some(owner);
        self.ops[op.index()].bytes_written = 0;
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![],
                flops: in_numel,
            },
        );
        outs[0]
    }

    /// Training-mode batch norm over axis 1 (`[n, c, ...]`), with `name.weight`,
    /// `name.bias` and running-statistics buffers updated in place.
    pub fn batch_norm(&mut self, name: &str, x: TensorId) -> TensorId {
        let xs = self.shape(x).to_vec();
        let c = xs[1];
        let numel = self.numel(x);
        self.push_scope(name);
        let gamma = self.parameter("weight", &[c]);
        let beta = self.parameter("bias", &[c]);
        let running_mean = self.buffer("running_mean", &[c]);
        let running_var = self.buffer("running_var", &[c]);
        self.pop_scope();
        let outs_spec = [
            ("", xs.clone(), self.dtype),
            ("mean", vec![c], self.dtype),
            ("invstd", vec![c], self.dtype),
        ];
        let (op, outs) = self.forward_op(
            OpKind::BatchNorm { eps: 1e-5 },
            name,
            vec![x, gamma, beta],
            &outs_spec,
            4 * numel,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x, gamma, outs[1], outs[2]],
                flops: 6 * numel,
            },
        );
        // Running statistics: a separate, non-recomputable in-place update.
        let count = numel / c.max(1);
        let stats_op = OpId(self.ops.len() as u32);
        let mut updated = Vec::new();
        for (buf, suffix) in [
            (running_mean, "running_mean'"),
            (running_var, "running_var'"),
        ] {
            let tname = self.qualified(&format!("{name}.{suffix}"));
            let t = self.new_tensor(tname, &[c], self.dtype, TensorKind::Buffer, false);
            let tensor = &mut self.tensors[t.index()];
            tensor.producer = Some(stats_op);
            tensor.inplace_update_of = Some(buf);
            tensor.is_output = true;
            updated.push(t);
        }
        let op_name = self.qualified(&format!("{name}.stats"));
        let module = self.qualified(name);
        self.push_op(Op {
            id: stats_op,
            name: op_name,
            kind: OpKind::BatchNormStats {
                momentum: 0.1,
                count,
            },
            phase: Phase::Forward,
            inputs: vec![running_mean, running_var, outs[1], outs[2]],
            outputs: updated,
            flops: 4 * c,
            bytes_read: 0,
            bytes_written: 0,
            workspace_bytes: 0,
            recomputable: false,
            module: Some(module),
        });
        self.tape.push(TapeEntry {
            op: stats_op,
            rule: BackwardRule::None,
        });
        outs[0]
    }

    /// Layer norm over the last axis with `name.weight` and `name.bias`.
    pub fn layer_norm(&mut self, name: &str, x: TensorId) -> TensorId {
        let xs = self.shape(x).to_vec();
        let d = *xs.last().unwrap_or(&1);
        let rows = self.numel(x) / d.max(1);
        let numel = self.numel(x);
        self.push_scope(name);
        let gamma = self.parameter("weight", &[d]);
        let beta = self.parameter("bias", &[d]);
        self.pop_scope();
        let mut stat_shape = xs.clone();
        if let Some(last) = stat_shape.last_mut() {
            *last = 1;
        }
        debug_assert_eq!(stat_shape.iter().product::<u64>(), rows);
        let outs_spec = [
            ("", xs, self.dtype),
            ("mean", stat_shape.clone(), self.dtype),
            ("rstd", stat_shape, self.dtype),
        ];
        let (op, outs) = self.forward_op(
            OpKind::LayerNorm { eps: 1e-5 },
            name,
            vec![x, gamma, beta],
            &outs_spec,
            5 * numel,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![x, gamma, beta, outs[1], outs[2]],
                flops: 8 * numel,
            },
        );
        outs[0]
    }

    /// Inverted dropout; outputs the result and a `bool` mask that backward keeps.
    /// The op carries its seed, so recomputation reproduces the mask.
    pub fn dropout(&mut self, x: TensorId, p: f32) -> TensorId {
        let shape = self.shape(x).to_vec();
        let numel = self.numel(x);
        self.next_seed = self
            .next_seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let seed = self.next_seed;
        let outs_spec = [
            ("", shape.clone(), self.dtype),
            ("mask", shape, DType::Bool),
        ];
        let (op, outs) = self.forward_op(
            OpKind::Dropout { p, seed },
            "dropout",
            vec![x],
            &outs_spec,
            2 * numel,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![outs[1]],
                flops: numel,
            },
        );
        outs[0]
    }

    /// Concatenation along `axis`; backward hands each input a slice (view) of the
    /// output gradient.
    pub fn concat(&mut self, parts: &[TensorId], axis: usize) -> TensorId {
        let mut shape = self.shape(parts[0]).to_vec();
        let lengths: Vec<u64> = parts.iter().map(|&p| self.shape(p)[axis]).collect();
        shape[axis] = self.sum("concatenated length", &lengths);
        let numel = self.product("element count", &shape);
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(
            OpKind::Concat { axis: axis as u32 },
            "cat",
            parts.to_vec(),
            &out,
            numel,
        );
        self.record(op, BackwardRule::Views);
        outs[0]
    }

    /// A reshape that allocates nothing: the result is a view of `x`.
    pub fn reshape(&mut self, x: TensorId, shape: &[u64]) -> TensorId {
        let out = self.act_out(shape.to_vec());
        let (op, outs) = self.forward_op(OpKind::View, "view", vec![x], &out, 0);
        let owner = self.tensors[x.index()].view_of.unwrap_or(x);
        self.tensors[outs[0].index()].view_of = Some(owner);
        self.ops[op.index()].bytes_written = 0;
        self.record(op, BackwardRule::Views);
        outs[0]
    }

    /// Flattens all axes after the first into one (a view).
    pub fn flatten(&mut self, x: TensorId) -> TensorId {
        let xs = self.shape(x).to_vec();
        let rest = self.product("element count", &xs[1..]);
        self.reshape(x, &[xs[0], rest])
    }

    /// A copy into a new layout with `shape` (transpose + contiguous, head split).
    pub fn copy(&mut self, label: &str, x: TensorId, shape: &[u64]) -> TensorId {
        let numel = self.numel(x);
        let out = self.act_out(shape.to_vec());
        let (op, outs) = self.forward_op(OpKind::Copy, label, vec![x], &out, numel);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![],
                flops: numel,
            },
        );
        outs[0]
    }

    /// Token embedding: `name.weight` `[num, dim]` looked up by `indices`.
    pub fn embedding(&mut self, name: &str, indices: TensorId, num: u64, dim: u64) -> TensorId {
        let table = self.scoped(name, |b| b.parameter("weight", &[num, dim]));
        self.embedding_with(name, indices, table)
    }

    /// Embedding lookup in a given (possibly shared) table.
    pub fn embedding_with(&mut self, name: &str, indices: TensorId, table: TensorId) -> TensorId {
        let mut shape = self.shape(indices).to_vec();
        let dim = self.shape(table)[1];
        shape.push(dim);
        let numel = self.product("element count", &shape);
        let out = self.act_out(shape);
        let (op, outs) =
            self.forward_op(OpKind::Embedding, name, vec![indices, table], &out, numel);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![indices],
                flops: numel,
            },
        );
        outs[0]
    }

    /// A forward tensor filled with zeros (e.g. an RNN's initial state).
    pub fn zeros(&mut self, name: &str, shape: &[u64]) -> TensorId {
        self.full(name, shape, 0.0)
    }

    /// A constant tensor filled with `value` (no gradient flows into it).
    pub fn full(&mut self, name: &str, shape: &[u64], value: f32) -> TensorId {
        let out = [("", shape.to_vec(), self.dtype)];
        let numel = self.product("element count", shape);
        let (op, outs) = self.forward_op(OpKind::Fill { value }, name, vec![], &out, numel);
        self.tape.push(TapeEntry {
            op,
            rule: BackwardRule::None,
        });
        outs[0]
    }

    /// One LSTM step with given (shared) weights; returns `(h', c')`. Backward keeps
    /// the step's input, previous state, gates and new cell state.
    #[allow(clippy::too_many_arguments)]
    pub fn lstm_cell(
        &mut self,
        name: &str,
        x: TensorId,
        h: TensorId,
        c: TensorId,
        w_ih: TensorId,
        w_hh: TensorId,
        b_ih: TensorId,
        b_hh: TensorId,
    ) -> (TensorId, TensorId) {
        let batch = self.shape(x)[0];
        let input = self.shape(x)[1];
        let hidden = self.shape(h)[1];
        let flops = self.sum(
            "FLOPs",
            &[
                self.product(
                    "FLOPs",
                    &[2, batch, 4, hidden, self.sum("width", &[input, hidden])],
                ),
                self.product("FLOPs", &[10, batch, hidden]),
            ],
        );
        let outs_spec = [
            ("h", vec![batch, hidden], self.dtype),
            ("c", vec![batch, hidden], self.dtype),
            (
                "gates",
                vec![batch, self.product("width", &[4, hidden])],
                self.dtype,
            ),
        ];
        let (op, outs) = self.forward_op(
            OpKind::LstmCell,
            name,
            vec![x, h, c, w_ih, w_hh, b_ih, b_hh],
            &outs_spec,
            flops,
        );
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0], outs[1]],
                saved: vec![x, h, c, w_ih, w_hh, outs[1], outs[2]],
                flops: self.product("FLOPs", &[2, flops]),
            },
        );
        (outs[0], outs[1])
    }

    /// Marks the outputs of forward op `op` as views of `x`'s storage and clears the
    /// op's write count (view ops allocate nothing).
    fn make_views(&mut self, op: OpId, x: TensorId, outs: &[TensorId]) {
        let owner = self.tensors[x.index()].view_of.unwrap_or(x);
        for &o in outs {
            self.tensors[o.index()].view_of = Some(owner);
        }
        self.ops[op.index()].bytes_written = 0;
    }

    /// Splits `x` along `axis` into consecutive parts of `sizes` (`torch.split`);
    /// the parts are views. Backward is PyTorch's `split_with_sizes_backward`: one
    /// op that concatenates the parts' gradients (zeros for unused parts) into a
    /// fresh gradient of `x`; it saves nothing. Sizes of zero are skipped.
    pub fn split(&mut self, label: &str, x: TensorId, axis: usize, sizes: &[u64]) -> Vec<TensorId> {
        let xs = self.shape(x).to_vec();
        let shapes: Vec<Vec<u64>> = sizes
            .iter()
            .filter(|&&s| s > 0)
            .map(|&s| {
                let mut shape = xs.clone();
                shape[axis] = s;
                shape
            })
            .collect();
        self.view_parts(OpKind::Split { axis: axis as u32 }, label, x, shapes)
    }

    /// Unbinds `x` along `axis` into its slices with that axis removed
    /// (`torch.unbind`, e.g. the time steps of a sequence); the slices are views.
    /// Backward is `unbind_backward`: one op stacking the slices' gradients (zeros
    /// for unused ones) into a fresh gradient of `x`; it saves nothing.
    pub fn unbind(&mut self, label: &str, x: TensorId, axis: usize) -> Vec<TensorId> {
        let xs = self.shape(x).to_vec();
        let mut slice = xs.clone();
        slice.remove(axis);
        let shapes = vec![slice; xs[axis] as usize];
        self.view_parts(OpKind::Unbind { axis: axis as u32 }, label, x, shapes)
    }

    /// One forward op producing view parts of `x` whose backward gathers their
    /// gradients into one fresh gradient of `x` (split, unbind).
    fn view_parts(
        &mut self,
        kind: OpKind,
        label: &str,
        x: TensorId,
        shapes: Vec<Vec<u64>>,
    ) -> Vec<TensorId> {
        let names: Vec<String> = (0..shapes.len()).map(|k| k.to_string()).collect();
        let specs: Vec<(&str, Vec<u64>, DType)> = names
            .iter()
            .zip(shapes)
            .map(|(n, s)| (n.as_str(), s, self.dtype))
            .collect();
        let numel = self.numel(x);
        let (op, outs) = self.forward_op(kind, label, vec![x], &specs, 0);
        self.make_views(op, x, &outs);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: outs.clone(),
                saved: vec![],
                flops: numel,
            },
        );
        outs
    }

    /// Broadcasts `x` to `shape` without copying (`Tensor.expand`): the result is a
    /// view. Backward is `sum_to_size`, a reduction into a fresh gradient shaped
    /// like `x`; it saves nothing.
    pub fn expand(&mut self, x: TensorId, shape: &[u64]) -> TensorId {
        let out = self.act_out(shape.to_vec());
        let numel = self.product("element count", shape);
        let (op, outs) = self.forward_op(OpKind::Expand, "expand", vec![x], &out, 0);
        self.make_views(op, x, &outs);
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![],
                flops: numel,
            },
        );
        outs[0]
    }

    /// Permutes the axes of `x` without copying (`Tensor.permute`): output axis `i`
    /// is input axis `dims[i]`; the result is a (strided) view and its gradient a
    /// permuted view of the output gradient.
    pub fn permute(&mut self, x: TensorId, dims: &[u32]) -> TensorId {
        let xs = self.shape(x).to_vec();
        let shape: Vec<u64> = dims.iter().map(|&d| xs[d as usize]).collect();
        let out = self.act_out(shape);
        let (op, outs) = self.forward_op(
            OpKind::Permute {
                dims: dims.to_vec(),
            },
            "permute",
            vec![x],
            &out,
            0,
        );
        self.make_views(op, x, &outs);
        self.record(op, BackwardRule::Views);
        outs[0]
    }

    /// [`Self::layer_norm`] with an explicit epsilon (BERT uses 1e-12, torchvision's
    /// ViT 1e-6); the saved tensors are the same.
    pub fn layer_norm_eps(&mut self, name: &str, x: TensorId, eps: f32) -> TensorId {
        let y = self.layer_norm(name, x);
        if let Some(op) = self.tensors[y.index()].producer {
            self.ops[op.index()].kind = OpKind::LayerNorm { eps };
        }
        y
    }

    /// Mean softmax cross-entropy of `logits [.., classes]` against `labels`;
    /// returns the scalar loss. Backward keeps the log-probabilities and labels.
    pub fn softmax_cross_entropy(&mut self, logits: TensorId, labels: TensorId) -> TensorId {
        let ls = self.shape(logits).to_vec();
        let numel = self.numel(logits);
        let outs_spec = [("", vec![], self.dtype), ("log_probs", ls, self.dtype)];
        let (op, outs) = self.forward_op(
            OpKind::SoftmaxCrossEntropy,
            "loss",
            vec![logits, labels],
            &outs_spec,
            4 * numel,
        );
        self.tensors[outs[0].index()].kind = TensorKind::Loss;
        self.tensors[outs[0].index()].is_output = true;
        self.record(
            op,
            BackwardRule::Op {
                grad_of: vec![outs[0]],
                saved: vec![outs[1], labels],
                flops: 2 * numel,
            },
        );
        outs[0]
    }

    // ----- backward and optimizer -----

    /// Emits backward from `loss` and the optimizer's updates, then validates.
    pub fn finish(mut self, loss: TensorId, optimizer: Optimizer) -> Result<Graph, GraphError> {
        // Before the backward pass: it would only repeat saturated numbers.
        self.check_overflow()?;
        let grad = self.emit_backward(loss);
        self.emit_optimizer(&grad, optimizer);
        self.meta.optimizer = optimizer.name().to_string();
        self.sum_totals();
        self.check_overflow()?;
        let graph = Graph {
            meta: self.meta,
            tensors: self.tensors,
            ops: self.ops,
        };
        crate::validate(&graph)?;
        Ok(graph)
    }

    /// Emits the backward pass from `loss`, the tape in reverse; returns each
    /// tensor's gradient (`None` where none flows).
    fn emit_backward(&mut self, loss: TensorId) -> Vec<Option<TensorId>> {
        let mut grad: Vec<Option<TensorId>> = vec![None; self.tensors.len()];
        // Seed: d loss / d loss = 1.
        let seed = self.backward_op(
            OpKind::Fill { value: 1.0 },
            "loss.grad_seed",
            vec![],
            &[(loss, TensorKind::Gradient)],
            1,
        );
        grad[loss.index()] = Some(seed[0]);
        let tape = std::mem::take(&mut self.tape);
        for entry in tape.iter().rev() {
            let fwd = self.ops[entry.op.index()].clone();
            match &entry.rule {
                BackwardRule::None => {}
                BackwardRule::PassThrough => self.pass_gradient_through(&fwd, &mut grad),
                BackwardRule::Views => self.emit_view_backward(&fwd, &mut grad),
                BackwardRule::Op {
                    grad_of,
                    saved,
                    flops,
                } => self.emit_op_backward(&fwd, grad_of, saved, *flops, &mut grad),
            }
        }
        grad
    }

    /// An op whose inputs' gradients are its output's (no op emitted).
    fn pass_gradient_through(&mut self, fwd: &Op, grad: &mut Vec<Option<TensorId>>) {
        let Some(g) = grad.get(fwd.outputs[0].index()).copied().flatten() else {
            return;
        };
        for &x in &fwd.inputs {
            if self.requires_grad[x.index()] {
                self.accumulate(grad, x, g);
            }
        }
    }

    /// A view op's backward: views of its output's gradient, one per input
    /// that needs one, writing nothing.
    fn emit_view_backward(&mut self, fwd: &Op, grad: &mut Vec<Option<TensorId>>) {
        let Some(g) = grad.get(fwd.outputs[0].index()).copied().flatten() else {
            return;
        };
        let targets: Vec<TensorId> = fwd
            .inputs
            .iter()
            .copied()
            .filter(|x| self.requires_grad[x.index()])
            .collect();
        if targets.is_empty() {
            return;
        }
        let g_owner = self.tensors[g.index()].view_of.unwrap_or(g);
        let outs: Vec<(TensorId, TensorKind)> =
            targets.iter().map(|&x| (x, TensorKind::Gradient)).collect();
        let kind = OpKind::Backward {
            forward: Box::new(fwd.kind.clone()),
            grads_for: fwd
                .inputs
                .iter()
                .map(|x| self.requires_grad[x.index()])
                .collect(),
        };
        let views = self.backward_op(kind, &format!("{}.backward", fwd.name), vec![g], &outs, 0);
        for (&x, &v) in targets.iter().zip(&views) {
            self.tensors[v.index()].view_of = Some(g_owner);
            self.accumulate(grad, x, v);
        }
        if let Some(last) = self.ops.last_mut() {
            last.bytes_written = 0;
        }
    }

    /// An op's backward op: inputs its outputs' gradients (zeros where none
    /// flows, as autograd materialises them) and the tensors it saved;
    /// outputs the gradients of the inputs that need one.
    fn emit_op_backward(
        &mut self,
        fwd: &Op,
        grad_of: &[TensorId],
        saved: &[TensorId],
        flops: u64,
        grad: &mut Vec<Option<TensorId>>,
    ) {
        let present: Vec<Option<TensorId>> = grad_of
            .iter()
            .map(|t| grad.get(t.index()).copied().flatten())
            .collect();
        if present.iter().all(Option::is_none) {
            return;
        }
        let mut inputs = Vec::new();
        for (k, g) in present.iter().enumerate() {
            let g = match g {
                Some(g) => *g,
                None => {
                    let like = grad_of[k];
                    self.backward_op(
                        OpKind::Fill { value: 0.0 },
                        &format!("{}.zero_grad", fwd.name),
                        vec![],
                        &[(like, TensorKind::Gradient)],
                        self.numel(like),
                    )[0]
                }
            };
            inputs.push(g);
        }
        inputs.extend(saved.iter().copied());
        let needs: Vec<bool> = fwd
            .inputs
            .iter()
            .map(|x| self.requires_grad[x.index()])
            .collect();
        let targets: Vec<(TensorId, TensorKind)> = fwd
            .inputs
            .iter()
            .zip(&needs)
            .filter(|(_, n)| **n)
            .map(|(&x, _)| {
                let kind = if self.tensors[x.index()].kind == TensorKind::Parameter {
                    TensorKind::ParameterGradient
                } else {
                    TensorKind::Gradient
                };
                (x, kind)
            })
            .collect();
        let kind = OpKind::Backward {
            forward: Box::new(fwd.kind.clone()),
            grads_for: needs,
        };
        let outs = self.backward_op(
            kind,
            &format!("{}.backward", fwd.name),
            inputs,
            &targets,
            flops,
        );
        if fwd.kind == OpKind::SoftmaxCrossEntropy {
            // Eager PyTorch runs nll_loss_backward, then
            // _log_softmax_backward_data: the logits-sized gradient of the
            // log-probabilities exists while the second runs. The fused op
            // holds it as workspace.
            let logits_bytes = self.tensors[fwd.inputs[0].index()].size_bytes;
            if let Some(last) = self.ops.last_mut() {
                last.workspace_bytes = logits_bytes;
            }
        }
        for ((x, _), g) in targets.iter().zip(outs) {
            self.accumulate(grad, *x, g);
        }
    }

    /// Every total an analysis takes (footprint, bytes and FLOPs by phase) is
    /// at most the sum over all tensors or all ops: if these fit, none wraps.
    fn sum_totals(&mut self) {
        let sizes: Vec<u64> = self.tensors.iter().map(|t| t.size_bytes).collect();
        self.sum("total tensor bytes", &sizes);
        let flops: Vec<u64> = self.ops.iter().map(|o| o.flops).collect();
        self.sum("total FLOPs", &flops);
        let moved: Vec<u64> = self
            .ops
            .iter()
            .map(|o| o.bytes_read.saturating_add(o.bytes_written))
            .collect();
        self.sum("total bytes moved", &moved);
    }

    /// Adds a backward-phase op whose outputs are gradients shaped like `like`.
    fn backward_op(
        &mut self,
        kind: OpKind,
        name: &str,
        inputs: Vec<TensorId>,
        like: &[(TensorId, TensorKind)],
        flops: u64,
    ) -> Vec<TensorId> {
        let op_id = OpId(self.ops.len() as u32);
        let mut outs = Vec::with_capacity(like.len());
        for &(t, kind) in like {
            let shape = self.tensors[t.index()].shape.clone();
            let dtype = self.tensors[t.index()].dtype;
            let gname = format!("grad[{}]:{}", self.tensors[t.index()].name, op_id.0);
            let g = self.new_tensor(gname, &shape, dtype, kind, false);
            self.tensors[g.index()].producer = Some(op_id);
            outs.push(g);
        }
        self.push_op(Op {
            id: op_id,
            name: name.to_string(),
            kind,
            phase: Phase::Backward,
            inputs,
            outputs: outs.clone(),
            flops,
            bytes_read: 0,
            bytes_written: 0,
            workspace_bytes: 0,
            recomputable: false,
            module: None,
        });
        outs
    }

    /// Records gradient `g` for `x`, summing with an earlier contribution if any.
    fn accumulate(&mut self, grad: &mut Vec<Option<TensorId>>, x: TensorId, g: TensorId) {
        if grad.len() < self.tensors.len() {
            grad.resize(self.tensors.len(), None);
        }
        match grad[x.index()] {
            None => grad[x.index()] = Some(g),
            Some(prev) => {
                let kind = self.tensors[prev.index()].kind;
                let name = format!("{}.grad_accumulate", self.tensors[x.index()].name);
                let numel = self.numel(x);
                let sum = self.backward_op(
                    OpKind::GradAccumulate,
                    &name,
                    vec![prev, g],
                    &[(x, kind)],
                    numel,
                );
                grad[x.index()] = Some(sum[0]);
            }
        }
    }

    fn emit_optimizer(&mut self, grad: &[Option<TensorId>], optimizer: Optimizer) {
        let n_state = match optimizer {
            Optimizer::None => return,
            Optimizer::Sgd { momentum, .. } if momentum > 0.0 => 1,
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adam { .. } => 2,
        };
        let kind = match optimizer {
            Optimizer::Sgd {
                lr,
                momentum,
                weight_decay,
            } => OpKind::SgdUpdate {
                lr,
                momentum,
                weight_decay,
            },
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
            } => OpKind::AdamUpdate {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
            },
            Optimizer::None => return,
        };
        let params = self.params.clone();
        for p in params {
            let Some(g) = grad.get(p.index()).copied().flatten() else {
                continue;
            };
            let pname = self.tensors[p.index()].name.clone();
            let shape = self.tensors[p.index()].shape.clone();
            let numel = self.numel(p);
            let states: Vec<TensorId> = (0..n_state)
                .map(|k| {
                    let sname = match (n_state, k) {
                        (1, _) => format!("{pname}.momentum_buffer"),
                        (_, 0) => format!("{pname}.exp_avg"),
                        _ => format!("{pname}.exp_avg_sq"),
                    };
                    self.new_tensor(sname, &shape, self.dtype, TensorKind::OptimizerState, false)
                })
                .collect();
            let op_id = OpId(self.ops.len() as u32);
            let mut outputs = Vec::new();
            for &target in std::iter::once(&p).chain(&states) {
                let t = &self.tensors[target.index()];
                let (name, kind, dtype) = (format!("{}'", t.name), t.kind, t.dtype);
                let u = self.new_tensor(name, &shape, dtype, kind, false);
                let tensor = &mut self.tensors[u.index()];
                tensor.producer = Some(op_id);
                tensor.inplace_update_of = Some(target);
                tensor.is_output = true;
                outputs.push(u);
            }
            let mut inputs = vec![p, g];
            inputs.extend(&states);
            self.push_op(Op {
                id: op_id,
                name: format!("{pname}.update"),
                kind: kind.clone(),
                phase: Phase::Optimizer,
                inputs,
                outputs,
                flops: numel * if n_state == 2 { 12 } else { 4 },
                bytes_read: 0,
                bytes_written: 0,
                workspace_bytes: 0,
                recomputable: false,
                module: None,
            });
        }
    }
}

/// Output length of a convolution along one axis.
pub fn conv_out(len: u64, kernel: u32, stride: u32, padding: u32, dilation: u32) -> u64 {
    let span = dilation as u64 * (kernel as u64 - 1) + 1;
    (len + 2 * padding as u64).saturating_sub(span) / stride as u64 + 1
}

/// Output length of a pooling window along one axis, with PyTorch's `ceil_mode` rule
/// (the last window must start inside the input or its left padding).
pub fn pool_out(len: u64, kernel: u32, stride: u32, padding: u32, ceil_mode: bool) -> u64 {
    let (k, s, p) = (kernel as u64, stride as u64, padding as u64);
    let span = (len + 2 * p).saturating_sub(k);
    let mut out = if ceil_mode {
        span.div_ceil(s) + 1
    } else {
        span / s + 1
    };
    if ceil_mode && (out - 1) * s >= len + p {
        out -= 1;
    }
    out
}
