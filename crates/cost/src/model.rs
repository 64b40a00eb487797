//! The cost-model trait the planners and the simulator price ops and copies with,
//! and the unit model tests use.

use crate::device::DeviceProfile;
use outcore_graph::{Graph, OpId};
use std::sync::{Arc, OnceLock};

/// Prices ops on the compute stream and copies on the host link.
pub trait CostModel: std::fmt::Debug + Send + Sync {
    /// The device whose rates the model uses (memory size, duplex rates).
    fn device(&self) -> &DeviceProfile;

    /// Seconds the op takes on the compute stream.
    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64;

    /// How host<->device copies are priced: a fixed latency, then bytes at a
    /// per-direction rate that drops to the duplex rate while the other direction
    /// is copying too. The simulator prices every copy through this (rates can
    /// change mid-copy, so it needs the rates, not one duration). Default: the
    /// device profile's rates.
    fn copy_rates(&self) -> CopyRates {
        CopyRates::of_device(self.device())
    }

    /// Seconds to copy `size_bytes` host->device when the other direction is idle:
    /// `latency_s + size_bytes / h2d_bytes_per_s` of [`CostModel::copy_rates`].
    fn h2d_time_s(&self, size_bytes: u64) -> f64 {
        let r = self.copy_rates();
        r.latency_s + size_bytes as f64 / r.one_way_bytes_per_s[0]
    }

    /// Seconds to copy `size_bytes` device->host when the other direction is idle:
    /// `latency_s + size_bytes / d2h_bytes_per_s` of [`CostModel::copy_rates`].
    fn d2h_time_s(&self, size_bytes: u64) -> f64 {
        let r = self.copy_rates();
        r.latency_s + size_bytes as f64 / r.one_way_bytes_per_s[1]
    }

    /// A short label for reports, e.g. `roofline(a100-40gb)`.
    fn name(&self) -> String;
}

/// Copy pricing (see [`CostModel::copy_rates`]). Index 0 is host-to-device,
/// index 1 device-to-host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyRates {
    /// Fixed seconds before a copy's bytes start to move.
    pub latency_s: f64,
    /// Bytes per second while the other direction is idle.
    pub one_way_bytes_per_s: [f64; 2],
    /// Bytes per second while the other direction is copying too.
    pub duplex_bytes_per_s: [f64; 2],
}

impl CopyRates {
    /// The rates a device profile states.
    pub fn of_device(d: &DeviceProfile) -> CopyRates {
        CopyRates {
            latency_s: d.copy_latency_s,
            one_way_bytes_per_s: [d.h2d_bytes_per_s, d.d2h_bytes_per_s],
            duplex_bytes_per_s: [d.h2d_duplex_bytes_per_s(), d.d2h_duplex_bytes_per_s()],
        }
    }
}

// Forwarding impls so a model can be held as `Box<dyn CostModel>` or shared as
// `Arc<dyn CostModel>` and still be passed where `impl CostModel` is expected.
// Each forwards all methods, so a model's own copy pricing is kept.
impl<T: CostModel + ?Sized> CostModel for Box<T> {
    fn device(&self) -> &DeviceProfile {
        (**self).device()
    }
    fn copy_rates(&self) -> CopyRates {
        (**self).copy_rates()
    }
    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        (**self).op_time_s(graph, op)
    }
    fn h2d_time_s(&self, size_bytes: u64) -> f64 {
        (**self).h2d_time_s(size_bytes)
    }
    fn d2h_time_s(&self, size_bytes: u64) -> f64 {
        (**self).d2h_time_s(size_bytes)
    }
    fn name(&self) -> String {
        (**self).name()
    }
}

impl<T: CostModel + ?Sized> CostModel for Arc<T> {
    fn device(&self) -> &DeviceProfile {
        (**self).device()
    }
    fn copy_rates(&self) -> CopyRates {
        (**self).copy_rates()
    }
    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        (**self).op_time_s(graph, op)
    }
    fn h2d_time_s(&self, size_bytes: u64) -> f64 {
        (**self).h2d_time_s(size_bytes)
    }
    fn d2h_time_s(&self, size_bytes: u64) -> f64 {
        (**self).d2h_time_s(size_bytes)
    }
    fn name(&self) -> String {
        (**self).name()
    }
}

/// Another model with every op `factor` times as slow and the copies
/// unchanged: a device whose kernels slowed down or sped up while the link
/// did not (TENSILE's drift experiments, Sec. IV-E).
#[derive(Debug, Clone, Copy)]
pub struct ScaledOps<'a> {
    pub inner: &'a dyn CostModel,
    /// Multiplies every op time; finite and positive to make sense.
    pub factor: f64,
}

impl CostModel for ScaledOps<'_> {
    fn device(&self) -> &DeviceProfile {
        self.inner.device()
    }
    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        self.inner.op_time_s(graph, op) * self.factor
    }
    fn copy_rates(&self) -> CopyRates {
        self.inner.copy_rates()
    }
    fn h2d_time_s(&self, size_bytes: u64) -> f64 {
        self.inner.h2d_time_s(size_bytes)
    }
    fn d2h_time_s(&self, size_bytes: u64) -> f64 {
        self.inner.d2h_time_s(size_bytes)
    }
    fn name(&self) -> String {
        format!("{}x ops of {}", self.factor, self.inner.name())
    }
}

/// A model for tests with numbers that can be checked by hand: 1 FLOP/s compute,
/// 1 byte/s copies each way alone, 2 bytes/s total when both directions are busy
/// (so 1 byte/s each), zero copy latency and launch overhead, unbounded memory.
///
/// `op_time_s = flops`, `h2d_time_s = d2h_time_s = size_bytes` (as `f64`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitCostModel;

impl UnitCostModel {
    /// The profile behind the model (also what [`CostModel::device`] returns).
    pub fn profile() -> DeviceProfile {
        DeviceProfile {
            name: "unit".into(),
            description: "test device: 1 FLOP/s, 1 byte/s, no latency, unbounded memory".into(),
            memory_bytes: u64::MAX,
            peak_flops_f32: 1.0,
            peak_flops_tf32: 1.0,
            peak_flops_f16: 1.0,
            memory_bandwidth_bytes_per_s: 1.0,
            h2d_bytes_per_s: 1.0,
            d2h_bytes_per_s: 1.0,
            duplex_bytes_per_s: 2.0,
            copy_latency_s: 0.0,
            kernel_launch_s: 0.0,
            tf32: crate::device::Tf32::Off,
        }
    }
}

/// `device()` returns a reference, and a unit struct has nowhere to keep the
/// profile, so it lives in a lazily built static.
static UNIT_DEVICE: OnceLock<DeviceProfile> = OnceLock::new();

impl CostModel for UnitCostModel {
    fn device(&self) -> &DeviceProfile {
        UNIT_DEVICE.get_or_init(UnitCostModel::profile)
    }

    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        graph.op(op).flops as f64
    }

    fn name(&self) -> String {
        "unit".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};

    #[test]
    fn unit_model_numbers() {
        let m = UnitCostModel;
        assert_eq!(m.h2d_time_s(1000), 1000.0);
        assert_eq!(m.d2h_time_s(7), 7.0);
        assert_eq!(m.device().memory_bytes, u64::MAX);
        assert_eq!(m.device().h2d_duplex_bytes_per_s(), 1.0);
        assert_eq!(m.device().d2h_duplex_bytes_per_s(), 1.0);
        assert_eq!(m.device().kernel_launch_s, 0.0);
        assert_eq!(m.name(), "unit");
        m.device().validate().unwrap();
    }

    /// One linear layer and a loss, no optimizer.
    fn linear_graph() -> Graph {
        let mut b = GraphBuilder::new("t", 4, DType::Float32);
        let x = b.input("x", &[4, 8]);
        let y = b.label("y", &[4]);
        let h = b.linear("fc", x, 3, true);
        let loss = b.softmax_cross_entropy(h, y);
        b.finish(loss, Optimizer::None).unwrap()
    }

    #[test]
    fn unit_model_op_time_is_flops() {
        let g = linear_graph();
        for op in &g.ops {
            assert_eq!(UnitCostModel.op_time_s(&g, op.id), op.flops as f64);
        }
    }

    #[test]
    fn scaled_ops_scale_ops_and_leave_copies() {
        let g = linear_graph();
        let m = ScaledOps {
            inner: &UnitCostModel,
            factor: 2.5,
        };
        for op in &g.ops {
            assert_eq!(m.op_time_s(&g, op.id), 2.5 * op.flops as f64);
        }
        assert_eq!(m.h2d_time_s(10), 10.0);
        assert_eq!(m.d2h_time_s(4), 4.0);
        assert_eq!(m.copy_rates(), UnitCostModel.copy_rates());
        assert_eq!(m.device().name, "unit");
        assert_eq!(m.name(), "2.5x ops of unit");
    }

    #[test]
    fn boxed_and_shared_models_forward() {
        let boxed: Box<dyn CostModel> = Box::new(UnitCostModel);
        assert_eq!(boxed.h2d_time_s(5), 5.0);
        assert_eq!(boxed.name(), "unit");
        let shared: Arc<dyn CostModel> = Arc::new(UnitCostModel);
        assert_eq!(shared.d2h_time_s(9), 9.0);
        assert_eq!(shared.device().name, "unit");
    }
}
