//! The features of one op, read off the graph IR alone (TENSILE Sec. IV-A: an
//! op's latency "depends on its inputs' shape, the parameters such as strides
//! of convolution operator, and the current GPU usage").
//!
//! Every count enters as `ln(1 + x)`: op times span six decades, and the
//! predictors fit `ln(time_s)`, so a power law in FLOPs or bytes is a line.
//! The device load TENSILE also feeds in is absent: neither the simulator nor
//! the CPU executor reports one, so a constant feature would teach nothing.

use outcore_graph::{Graph, OpClass, OpId, OpKind, Phase};

/// The op classes in the order of their one-hot slots.
const CLASSES: [OpClass; 10] = [
    OpClass::Convolution,
    OpClass::MatMul,
    OpClass::Elementwise,
    OpClass::Normalization,
    OpClass::Pooling,
    OpClass::Reduction,
    OpClass::DataMovement,
    OpClass::View,
    OpClass::Optimizer,
    OpClass::Other,
];

/// Names of the numeric features, in the order of [`OpFeatures::values`].
pub const FEATURE_NAMES: [&str; 26] = [
    "ln1p_flops",
    "ln1p_bytes_read",
    "ln1p_bytes_written",
    "ln1p_bytes_moved",
    "ln1p_workspace_bytes",
    "ln1p_input_elements",
    "ln1p_output_elements",
    "ln1p_first_input_dim0",
    "ln1p_largest_input_elements",
    "n_inputs",
    "n_outputs",
    "ln1p_kernel_area",
    "ln1p_stride",
    "ln1p_groups",
    "phase_forward",
    "phase_backward",
    "phase_optimizer",
    "class_convolution",
    "class_matmul",
    "class_elementwise",
    "class_normalization",
    "class_pooling",
    "class_reduction",
    "class_data_movement",
    "class_view",
    "class_optimizer_or_other",
];

/// Number of numeric features.
pub const N_FEATURES: usize = FEATURE_NAMES.len();

/// One op's features: its kind label (`conv2d_backward`), class and numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct OpFeatures {
    /// [`OpKind::label`], the key of per-kind models.
    pub kind: String,
    /// The op's cost class, the fallback key of per-kind models.
    pub class: OpClass,
    /// ln(1 + FLOPs).
    pub ln_flops: f64,
    /// ln(1 + bytes read + bytes written).
    pub ln_bytes_moved: f64,
    /// The numeric features named by [`FEATURE_NAMES`].
    pub values: [f64; N_FEATURES],
}

fn ln1p(x: u64) -> f64 {
    (x as f64).ln_1p()
}

/// The convolution or pooling attributes of a kind (looking through backward).
fn window(kind: &OpKind) -> Option<([u32; 2], [u32; 2], u32)> {
    match kind {
        OpKind::Conv2d(a) | OpKind::ConvTranspose2d(a) => Some((a.kernel, a.stride, a.groups)),
        OpKind::MaxPool2d(a) | OpKind::AvgPool2d(a) | OpKind::AvgPool2dExcludePad(a) => {
            Some((a.kernel, a.stride, 1))
        }
        OpKind::Backward { forward, .. } => window(forward),
        _ => None,
    }
}

/// The features of `op` in `graph`. `op` must be one of the graph's ops (ids
/// outside it are the caller's error; [`super::Dataset`] checks them first).
pub fn op_features(graph: &Graph, op: OpId) -> OpFeatures {
    let o = graph.op(op);
    let elements = |ids: &[outcore_graph::TensorId]| -> Vec<u64> {
        ids.iter()
            .map(|&t| graph.tensor(t).shape.iter().product::<u64>())
            .collect()
    };
    let ins = elements(&o.inputs);
    let outs = elements(&o.outputs);
    let dim0 = o
        .inputs
        .first()
        .and_then(|&t| graph.tensor(t).shape.first().copied())
        .unwrap_or(0);
    let (kernel, stride, groups) = window(&o.kind).unwrap_or(([0, 0], [0, 0], 0));
    let moved = o.bytes_read.saturating_add(o.bytes_written);
    let class = o.kind.class();
    let mut values = [0.0; N_FEATURES];
    let head = [
        ln1p(o.flops),
        ln1p(o.bytes_read),
        ln1p(o.bytes_written),
        ln1p(moved),
        ln1p(o.workspace_bytes),
        ln1p(ins.iter().fold(0u64, |a, &b| a.saturating_add(b))),
        ln1p(outs.iter().fold(0u64, |a, &b| a.saturating_add(b))),
        ln1p(dim0),
        ln1p(ins.iter().copied().max().unwrap_or(0)),
        o.inputs.len() as f64,
        o.outputs.len() as f64,
        ln1p(u64::from(kernel[0]) * u64::from(kernel[1])),
        ln1p(u64::from(stride[0].max(stride[1]))),
        ln1p(u64::from(groups)),
    ];
    values[..head.len()].copy_from_slice(&head);
    let phase_slot = match o.phase {
        Phase::Forward => 0,
        Phase::Backward => 1,
        Phase::Optimizer => 2,
    };
    values[head.len() + phase_slot] = 1.0;
    // Optimizer and Other share the last slot: both are rare.
    let class_slot = CLASSES
        .iter()
        .position(|&c| c == class)
        .unwrap_or(CLASSES.len() - 1)
        .min(8);
    values[head.len() + 3 + class_slot] = 1.0;
    OpFeatures {
        kind: o.kind.label(),
        class,
        ln_flops: ln1p(o.flops),
        ln_bytes_moved: ln1p(moved),
        values,
    }
}
