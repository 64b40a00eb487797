//! The roofline cost model: an op takes a launch overhead plus the longer of its
//! compute time at a derated peak and its memory time at a derated bandwidth.
//!
//! `op_time_s = kernel_launch_s + max(flops / (peak(dtype, class) * compute_eff[class]),
//!                                   (bytes_read + bytes_written) / (memory_bandwidth * memory_eff[class]))`
//!
//! View ops launch no kernel and cost 0. The peak depends on the op's dtype (that
//! of its first floating-point output, else its first floating-point input) and
//! class: convolution and matmul in float16/bfloat16 run on tensor cores
//! (`peak_flops_f16`); in float32 they use TF32 tensor cores where the
//! profile's `tf32` mode names their class and the device has them
//! (`peak_flops_tf32 > 0`); everything else runs on the
//! CUDA cores at `peak_flops_f32`. Float64 is priced at half the FP32 peak, the
//! data-centre parts' ratio (consumer parts are far slower, but training does
//! not use float64).

use crate::device::{DeviceProfile, Tf32};
use crate::error::{CostError, CostErrorKind};
use crate::model::CostModel;
use outcore_graph::{DType, Graph, Op, OpClass, OpId};
use serde::{Deserialize, Serialize};

/// Fractions of the device's peak FLOP/s and memory bandwidth that one class of
/// op reaches, each in `(0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClassEfficiency {
    /// Fraction of the peak FLOP/s for the op's dtype.
    pub compute: f64,
    /// Fraction of the memory bandwidth.
    pub memory: f64,
}

impl ClassEfficiency {
    pub const fn new(compute: f64, memory: f64) -> Self {
        ClassEfficiency { compute, memory }
    }
}

/// Per-[`OpClass`] compute and memory efficiencies of the roofline model.
///
/// The defaults are typical fractions of peak reached by the cuDNN / cuBLAS /
/// PyTorch kernels on ResNet- and transformer-sized layers; each field's doc says
/// why. They are deliberately round: a measured latency table
/// ([`crate::MeasuredModel`]) replaces them where precision matters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Efficiencies {
    /// 0.65 / 0.70: cuDNN's implicit-GEMM and Winograd kernels reach about 60-70%
    /// of peak on ResNet-sized layers (less on the first layer and on thin 1x1
    /// convs, more on wide 3x3 ones). Bandwidth-bound convs (depthwise) re-read
    /// input tiles, so 70% of bandwidth.
    pub convolution: ClassEfficiency,
    /// 0.75 / 0.70: cuBLAS GEMMs with all dimensions of 1024 or more reach 70-85%
    /// of peak; skinny and small ones less.
    pub matmul: ClassEfficiency,
    /// 0.50 / 0.80: element-wise kernels are bandwidth-bound and stream at about
    /// 80% of HBM bandwidth for large tensors; compute matters only for
    /// transcendental-heavy ones (GELU, tanh), which run on the slower special
    /// function units, hence half of peak.
    pub elementwise: ClassEfficiency,
    /// 0.40 / 0.50: training-mode batch norm, layer norm and softmax make two
    /// passes over their input (statistics, then normalisation) while
    /// `bytes_read` counts it once, which halves the effective bandwidth.
    pub normalization: ClassEfficiency,
    /// 0.40 / 0.70: overlapping windows re-read inputs through the cache and
    /// access them with strides.
    pub pooling: ClassEfficiency,
    /// 0.40 / 0.70: tree reductions stream the input at about 70% of bandwidth
    /// and end in a poorly parallel tail.
    pub reduction: ClassEfficiency,
    /// 0.50 / 0.60: transposes, concatenations and embedding gathers access memory
    /// with strides or through indices, about 60% of bandwidth.
    pub data_movement: ClassEfficiency,
    /// 1.0 / 1.0: unused, views launch no kernel and cost 0.
    pub view: ClassEfficiency,
    /// 0.50 / 0.70: PyTorch's foreach (multi-tensor-apply) SGD and Adam are
    /// bandwidth-bound and reach about 70% of bandwidth over many small tensors.
    pub optimizer: ClassEfficiency,
    /// 0.30 / 0.50: unknown kernels are priced conservatively.
    pub other: ClassEfficiency,
}

impl Default for Efficiencies {
    fn default() -> Self {
        Efficiencies {
            convolution: ClassEfficiency::new(0.65, 0.70),
            matmul: ClassEfficiency::new(0.75, 0.70),
            elementwise: ClassEfficiency::new(0.50, 0.80),
            normalization: ClassEfficiency::new(0.40, 0.50),
            pooling: ClassEfficiency::new(0.40, 0.70),
            reduction: ClassEfficiency::new(0.40, 0.70),
            data_movement: ClassEfficiency::new(0.50, 0.60),
            view: ClassEfficiency::new(1.0, 1.0),
            optimizer: ClassEfficiency::new(0.50, 0.70),
            other: ClassEfficiency::new(0.30, 0.50),
        }
    }
}

impl Efficiencies {
    /// The same efficiency for every class (for tests and what-if studies).
    pub fn uniform(compute: f64, memory: f64) -> Self {
        let e = ClassEfficiency::new(compute, memory);
        Efficiencies {
            convolution: e,
            matmul: e,
            elementwise: e,
            normalization: e,
            pooling: e,
            reduction: e,
            data_movement: e,
            view: e,
            optimizer: e,
            other: e,
        }
    }

    /// The efficiency of one class.
    pub fn for_class(&self, class: OpClass) -> ClassEfficiency {
        match class {
            OpClass::Convolution => self.convolution,
            OpClass::MatMul => self.matmul,
            OpClass::Elementwise => self.elementwise,
            OpClass::Normalization => self.normalization,
            OpClass::Pooling => self.pooling,
            OpClass::Reduction => self.reduction,
            OpClass::DataMovement => self.data_movement,
            OpClass::View => self.view,
            OpClass::Optimizer => self.optimizer,
            OpClass::Other => self.other,
        }
    }

    /// Checks that every efficiency lies in `(0, 1]`.
    pub fn validate(&self) -> Result<(), CostError> {
        let classes = [
            ("convolution", self.convolution),
            ("matmul", self.matmul),
            ("elementwise", self.elementwise),
            ("normalization", self.normalization),
            ("pooling", self.pooling),
            ("reduction", self.reduction),
            ("data_movement", self.data_movement),
            ("view", self.view),
            ("optimizer", self.optimizer),
            ("other", self.other),
        ];
        for (class, e) in classes {
            for (which, value) in [("compute", e.compute), ("memory", e.memory)] {
                if !(value > 0.0 && value <= 1.0) {
                    return Err(CostError::new(CostErrorKind::InvalidEfficiency {
                        class,
                        which,
                        value,
                    }));
                }
            }
        }
        Ok(())
    }
}

/// The fraction of the TF32 tensor-core peak that float32 convolutions reach
/// through cuDNN, in place of the convolution class's compute efficiency
/// (0.65, a figure for FP16 and FP32 kernels).
///
/// Fitted on an H100 (latency tables of 2026-11-24, docs/data/predict): the
/// summed time of every convolution op (forward and backward) of eleven
/// torchvision CNNs at batches 64 and 128, priced `launch + max(flops /
/// (495e12 * e), bytes / (3.35e12 * 0.70))`, matches the measured sum within
/// 2.4% at `e = 0.25` (0.20: 20% over, 0.30: 17% under). Per graph the
/// convolutions' effective rate spreads from 0.04 (SqueezeNet) through 0.21
/// (ResNet-50) to 0.34 (VGG-19) of the peak, so one graph's convolutions can
/// still be off by a third. TF32 matmuls (`Tf32::All`) keep the matmul class's
/// efficiency: no measurement here has them (PyTorch leaves them off).
pub const TF32_CONVOLUTION_COMPUTE_EFFICIENCY: f64 = 0.25;

/// The roofline model over a device profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RooflineModel {
    /// The device; its [`DeviceProfile::tf32`] says which float32
    /// convolutions and matmuls run at the TF32 tensor-core peak.
    pub device: DeviceProfile,
    pub efficiency: Efficiencies,
}

impl RooflineModel {
    /// The model with default efficiencies, TF32 as the profile says.
    pub fn new(device: DeviceProfile) -> Self {
        RooflineModel {
            device,
            efficiency: Efficiencies::default(),
        }
    }

    /// Sets the device's [`Tf32`] mode.
    pub fn with_tf32(mut self, tf32: Tf32) -> Self {
        self.device.tf32 = tf32;
        self
    }

    /// Replaces the efficiencies.
    pub fn with_efficiency(mut self, efficiency: Efficiencies) -> Self {
        self.efficiency = efficiency;
        self
    }

    /// The peak FLOP/s an op of `dtype` and `class` runs at (before efficiency).
    pub fn peak_flops(&self, dtype: DType, class: OpClass) -> f64 {
        let d = &self.device;
        let tensor_cores = matches!(class, OpClass::Convolution | OpClass::MatMul);
        match dtype {
            DType::Float16 | DType::Bfloat16 if tensor_cores => d.peak_flops_f16,
            DType::Float32 if self.uses_tf32(dtype, class) => d.peak_flops_tf32,
            DType::Float64 => d.peak_flops_f32 / 2.0,
            // Non-tensor-core math, and integer ops, run on the CUDA cores.
            _ => d.peak_flops_f32,
        }
    }

    /// Whether an op of `dtype` and `class` runs on the TF32 tensor cores: a
    /// float32 op of a class the profile's mode names, on a device that has them.
    fn uses_tf32(&self, dtype: DType, class: OpClass) -> bool {
        dtype == DType::Float32
            && self.device.tf32.covers(class)
            && self.device.peak_flops_tf32 > 0.0
    }

    /// The op's compute time, memory time and launch overhead, in seconds, before
    /// taking the maximum (for reports that say which bound an op hits).
    pub fn op_bounds_s(&self, graph: &Graph, op: OpId) -> OpBounds {
        let op = graph.op(op);
        let class = op.kind.class();
        if class == OpClass::View {
            return OpBounds::default();
        }
        let dtype = op_dtype(graph, op);
        let peak_flops = self.peak_flops(dtype, class);
        let compute_eff = if class == OpClass::Convolution && self.uses_tf32(dtype, class) {
            TF32_CONVOLUTION_COMPUTE_EFFICIENCY
        } else {
            self.efficiency.for_class(class).compute
        };
        let eff = self.efficiency.for_class(class);
        let bytes = op.bytes_read.saturating_add(op.bytes_written);
        OpBounds {
            launch_s: self.device.kernel_launch_s,
            compute_s: op.flops as f64 / (peak_flops * compute_eff),
            memory_s: bytes as f64 / (self.device.memory_bandwidth_bytes_per_s * eff.memory),
        }
    }
}

/// The parts of a roofline op time, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpBounds {
    pub launch_s: f64,
    pub compute_s: f64,
    pub memory_s: f64,
}

impl OpBounds {
    /// `launch + max(compute, memory)`.
    pub fn total_s(&self) -> f64 {
        self.launch_s + self.compute_s.max(self.memory_s)
    }

    /// Whether compute, not memory, bounds the op.
    pub fn compute_bound(&self) -> bool {
        self.compute_s >= self.memory_s
    }
}

/// The dtype an op computes in: that of its first floating-point output, else its
/// first floating-point input, else its first output (integer ops), else float32.
pub fn op_dtype(graph: &Graph, op: &Op) -> DType {
    let dtype_of = |t: &outcore_graph::TensorId| graph.tensor(*t).dtype;
    op.outputs
        .iter()
        .map(dtype_of)
        .find(|d| d.is_float())
        .or_else(|| op.inputs.iter().map(dtype_of).find(|d| d.is_float()))
        .or_else(|| op.outputs.first().map(dtype_of))
        .unwrap_or(DType::Float32)
}

impl CostModel for RooflineModel {
    fn device(&self) -> &DeviceProfile {
        &self.device
    }

    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        self.op_bounds_s(graph, op).total_s()
    }

    fn name(&self) -> String {
        match self.device.tf32 {
            Tf32::Off => format!("roofline({})", self.device.name),
            Tf32::Convolutions => format!("roofline({}, tf32 convolutions)", self.device.name),
            Tf32::Matmuls => format!("roofline({}, tf32 matmuls)", self.device.name),
            Tf32::All => format!("roofline({}, tf32)", self.device.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_graph::{GraphMeta, OpKind, Phase, Tensor, TensorId, TensorKind};

    /// A graph holding one op of `kind` from one input to one output of `dtype`.
    fn one_op(
        kind: OpKind,
        dtype: DType,
        flops: u64,
        bytes_read: u64,
        bytes_written: u64,
    ) -> Graph {
        let tensor = |id: u32, kind: TensorKind, producer: Option<OpId>| Tensor {
            id: TensorId(id),
            name: format!("t{id}"),
            shape: vec![1],
            dtype,
            size_bytes: dtype.size_bytes(),
            kind,
            producer,
            view_of: None,
            inplace_update_of: None,
            is_output: false,
        };
        Graph {
            meta: GraphMeta {
                model: "t".into(),
                batch: 1,
                seq: None,
                optimizer: "none".into(),
                source: "test".into(),
            },
            tensors: vec![
                tensor(0, TensorKind::Input, None),
                tensor(1, TensorKind::Activation, Some(OpId(0))),
            ],
            ops: vec![Op {
                id: OpId(0),
                name: "op".into(),
                kind,
                phase: Phase::Forward,
                inputs: vec![TensorId(0)],
                outputs: vec![TensorId(1)],
                flops,
                bytes_read,
                bytes_written,
                workspace_bytes: 0,
                recomputable: true,
                module: None,
            }],
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
    }

    #[test]
    fn peak_depends_on_dtype_class_and_tf32() {
        let a100 = DeviceProfile::builtin("a100-40gb").unwrap();
        let m = RooflineModel::new(a100);
        assert_eq!(m.peak_flops(DType::Float16, OpClass::MatMul), 312e12);
        assert_eq!(m.peak_flops(DType::Bfloat16, OpClass::Convolution), 312e12);
        // Half-precision element-wise ops do not use tensor cores.
        assert_eq!(m.peak_flops(DType::Float16, OpClass::Elementwise), 19.5e12);
        assert_eq!(m.peak_flops(DType::Float32, OpClass::MatMul), 19.5e12);
        assert_eq!(m.peak_flops(DType::Float64, OpClass::MatMul), 19.5e12 / 2.0);
        let m = m.with_tf32(Tf32::All);
        assert_eq!(m.peak_flops(DType::Float32, OpClass::MatMul), 156e12);
        assert_eq!(m.peak_flops(DType::Float32, OpClass::Pooling), 19.5e12);
        // A device without TF32 keeps the FP32 peak even when TF32 is allowed.
        let v100 = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        assert_eq!(
            v100.with_tf32(Tf32::All)
                .peak_flops(DType::Float32, OpClass::MatMul),
            15.7e12
        );
    }

    #[test]
    fn compute_bound_matmul() {
        // 1024x1024 @ 1024x1024 in float32 on the V100 (PCIe): 2*1024^3 =
        // 2_147_483_648 FLOP at 15.7e12 * 0.75 = 11.775e12 FLOP/s is 182.4 us;
        // reading two 4 MiB operands and writing one (12_582_912 B) at
        // 900e9 * 0.70 = 630e9 B/s is 20.0 us. Compute bound: 5 us + 182.4 us.
        let g = one_op(
            OpKind::MatMul {
                transpose_b: false,
                scale: 1.0,
            },
            DType::Float32,
            2 * 1024 * 1024 * 1024,
            2 * 4 * 1024 * 1024,
            4 * 1024 * 1024,
        );
        let m = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        let b = m.op_bounds_s(&g, OpId(0));
        assert!(b.compute_bound());
        assert!(close(b.compute_s, 2_147_483_648.0 / 11.775e12));
        assert!(close(b.memory_s, 12_582_912.0 / 630e9));
        assert!(close(
            m.op_time_s(&g, OpId(0)),
            5e-6 + 2_147_483_648.0 / 11.775e12
        ));
    }

    #[test]
    fn bandwidth_bound_elementwise() {
        // ReLU over 2^24 float32 elements: 2^24 FLOP at 15.7e12 * 0.5 is 2.1 us;
        // 64 MiB read + 64 MiB written = 134_217_728 B at 900e9 * 0.8 = 720e9 B/s
        // is 186.4 us. Bandwidth bound: 5 us + 186.4 us.
        let n = 1u64 << 24;
        let g = one_op(OpKind::Relu, DType::Float32, n, 4 * n, 4 * n);
        let m = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        let b = m.op_bounds_s(&g, OpId(0));
        assert!(!b.compute_bound());
        assert!(close(
            m.op_time_s(&g, OpId(0)),
            5e-6 + 134_217_728.0 / 720e9
        ));
    }

    #[test]
    fn view_costs_nothing() {
        let g = one_op(OpKind::View, DType::Float32, 0, 1 << 20, 0);
        let m = RooflineModel::new(DeviceProfile::builtin("h100-80gb").unwrap());
        assert_eq!(m.op_time_s(&g, OpId(0)), 0.0);
        let g = one_op(
            OpKind::Named {
                name: "aten.view.default".into(),
            },
            DType::Float32,
            0,
            1 << 20,
            0,
        );
        assert_eq!(m.op_time_s(&g, OpId(0)), 0.0);
    }

    #[test]
    fn empty_kernel_costs_a_launch() {
        let g = one_op(OpKind::Relu, DType::Float32, 0, 0, 0);
        let m = RooflineModel::new(DeviceProfile::builtin("h100-80gb").unwrap());
        assert_eq!(m.op_time_s(&g, OpId(0)), 5e-6);
    }

    #[test]
    fn dtype_is_first_float_output_else_input() {
        let mut g = one_op(OpKind::Relu, DType::Float16, 0, 0, 0);
        assert_eq!(op_dtype(&g, &g.ops[0]), DType::Float16);
        // An integer output (an argmax-like op) takes the float input's dtype.
        g.tensors[1].dtype = DType::Int64;
        assert_eq!(op_dtype(&g, &g.ops[0]), DType::Float16);
        g.tensors[0].dtype = DType::Int32;
        assert_eq!(op_dtype(&g, &g.ops[0]), DType::Int64);
    }

    #[test]
    fn default_efficiencies_are_fractions() {
        Efficiencies::default().validate().unwrap();
        let mut e = Efficiencies::default();
        e.pooling.memory = 1.5;
        let msg = e.validate().unwrap_err().to_string();
        assert!(msg.contains("pooling.memory"), "{msg}");
        assert_eq!(
            Efficiencies::uniform(0.5, 0.25).for_class(OpClass::Other),
            ClassEfficiency::new(0.5, 0.25)
        );
    }
}
