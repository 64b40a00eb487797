//! Cost models on builder graphs: roofline, measured tables over a fallback,
//! and the unit model.

use outcore_cost::{
    CostModel, DeviceProfile, MeasuredCopies, MeasuredModel, MeasuredTable, RooflineModel,
    UnitCostModel,
};
use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::{DType, Graph, OpClass, OpId, OpKind, Phase};

/// MLP: linear(512 -> 1024) -> relu -> view -> linear(1024 -> 10) -> loss, batch 256.
fn mlp(dtype: DType) -> Graph {
    let mut b = GraphBuilder::new("mlp", 256, dtype);
    let x = b.input("x", &[256, 512]);
    let y = b.label("y", &[256]);
    let h = b.linear("fc1", x, 1024, true);
    let h = b.relu(h);
    let h = b.reshape(h, &[256, 1024]);
    let logits = b.linear("fc2", h, 10, true);
    let loss = b.softmax_cross_entropy(logits, y);
    b.finish(loss, Optimizer::None).expect("valid graph")
}

fn find(g: &Graph, pred: impl Fn(&outcore_graph::Op) -> bool) -> OpId {
    g.ops.iter().find(|o| pred(o)).expect("op present").id
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[test]
fn roofline_on_builder_ops() {
    let g = mlp(DType::Float32);
    let m = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
    for op in &g.ops {
        let t = m.op_time_s(&g, op.id);
        assert!(t.is_finite() && t >= 0.0);
        if op.kind.class() == OpClass::View {
            assert_eq!(t, 0.0, "{}", op.name);
        } else {
            assert!(t >= 5e-6, "{} costs less than a launch", op.name);
        }
    }
    // fc1 forward: 2 * 256 * 512 * 1024 = 268_435_456 FLOP at 15.7e12 * 0.75 =
    // 11.775e12 FLOP/s is 22.8 us. Its bytes (x 512 KiB, w 2 MiB, b 4 KiB read,
    // y 1 MiB written, ~3.5 MiB) at 630e9 B/s take ~5.8 us: compute bound.
    let fc1 = find(&g, |o| {
        o.phase == Phase::Forward && o.kind == OpKind::Linear { bias: true }
    });
    let op = g.op(fc1);
    assert_eq!(op.flops, 268_435_456);
    let b = m.op_bounds_s(&g, fc1);
    assert!(b.compute_bound());
    assert!(close(
        m.op_time_s(&g, fc1),
        5e-6 + 268_435_456.0 / 11.775e12
    ));
    // relu forward on 256 x 1024 float32: 1 MiB in, 1 MiB out at 720e9 B/s is
    // 2.9 us, 262_144 FLOP at 7.85e12 FLOP/s is 0.03 us: bandwidth bound.
    let relu = find(&g, |o| o.phase == Phase::Forward && o.kind == OpKind::Relu);
    let b = m.op_bounds_s(&g, relu);
    assert!(!b.compute_bound());
    let bytes = (g.op(relu).bytes_read + g.op(relu).bytes_written) as f64;
    assert!(close(m.op_time_s(&g, relu), 5e-6 + bytes / 720e9));
}

#[test]
fn half_precision_matmul_uses_tensor_cores() {
    let g32 = mlp(DType::Float32);
    let g16 = mlp(DType::Float16);
    let m = RooflineModel::new(DeviceProfile::builtin("a100-40gb").unwrap());
    let is_fc1 = |o: &outcore_graph::Op| o.phase == Phase::Forward && o.name.contains("fc1");
    let (a, b) = (find(&g32, is_fc1), find(&g16, is_fc1));
    let (b32, b16) = (m.op_bounds_s(&g32, a), m.op_bounds_s(&g16, b));
    // 312 / 19.5 = 16x faster compute in float16.
    assert!(close(b32.compute_s / b16.compute_s, 312.0 / 19.5));
    // TF32 speeds up float32 matmul by 156 / 19.5 = 8x.
    let tf32 = m.clone().with_tf32(outcore_cost::Tf32::All);
    assert!(close(
        b32.compute_s / tf32.op_bounds_s(&g32, a).compute_s,
        8.0
    ));
}

#[test]
fn measured_table_overrides_listed_ops_only() {
    let g = mlp(DType::Float32);
    let fallback = RooflineModel::new(DeviceProfile::builtin("h100-80gb").unwrap());
    let mut table = MeasuredTable::new("NVIDIA H100 80GB HBM3", "mlp");
    table.push(OpId(0), &g.ops[0].name, 0.25, 9);
    // Same id, other name: the table was taken on another graph; ignored.
    table.push(OpId(1), "not-this-op", 0.5, 9);
    let m = MeasuredModel::new(table, fallback.clone());
    assert_eq!(m.op_time_s(&g, OpId(0)), 0.25);
    assert_eq!(m.op_time_s(&g, OpId(1)), fallback.op_time_s(&g, OpId(1)));
    assert_eq!(m.op_time_s(&g, OpId(2)), fallback.op_time_s(&g, OpId(2)));
    let cov = m.coverage(&g);
    assert_eq!(cov.matched, 1);
    assert_eq!(cov.name_mismatches.len(), 1);
    assert_eq!(cov.unmeasured(), g.n_ops() - 1);
    // No measured copies: the fallback's host link.
    assert_eq!(m.h2d_time_s(1 << 20), fallback.h2d_time_s(1 << 20));
    assert!(m.name().contains("roofline(h100-80gb)"));
}

#[test]
fn measured_model_over_a_boxed_fallback() {
    let g = mlp(DType::Float32);
    let mut table = MeasuredTable::new("gpu", "mlp");
    table.push(OpId(2), &g.ops[2].name, 3.0, 1);
    let m: MeasuredModel = MeasuredModel::new(table, Box::new(UnitCostModel));
    assert_eq!(m.op_time_s(&g, OpId(2)), 3.0);
    assert_eq!(m.op_time_s(&g, OpId(0)), g.ops[0].flops as f64);
}

#[test]
fn table_file_round_trip_and_errors() {
    let g = mlp(DType::Float32);
    let dir = std::env::temp_dir().join(format!("outcore-cost-{}-table", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("latency.json");
    let mut table = MeasuredTable::new("gpu", "mlp");
    for op in &g.ops {
        table.push(op.id, &op.name, 1e-5 * (op.id.0 + 1) as f64, 5);
    }
    table.copies = Some(MeasuredCopies {
        h2d_bytes_per_s: 2.4e10,
        d2h_bytes_per_s: 2.2e10,
        duplex_bytes_per_s: None,
    });
    table.write_json_file(&path).unwrap();
    let back = MeasuredTable::from_json_file(&path).unwrap();
    assert_eq!(back, table);
    assert!(back.coverage(&g).is_complete());
    let m = MeasuredModel::new(back, UnitCostModel);
    assert_eq!(m.h2d_time_s(24_000_000_000), 1.0);

    std::fs::write(
        &path,
        r#"{"format":"outcore-latency-table/1","device":"d"}"#,
    )
    .unwrap();
    let msg = MeasuredTable::from_json_file(&path)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("missing field `graph_model`"), "{msg}");
    let msg = MeasuredTable::from_json_file(&dir.join("absent.json"))
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("cannot read"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unit_model_numbers() {
    let g = mlp(DType::Float32);
    let m = UnitCostModel;
    for op in &g.ops {
        assert_eq!(m.op_time_s(&g, op.id), op.flops as f64);
    }
    assert_eq!(m.h2d_time_s(123), 123.0);
    assert_eq!(m.d2h_time_s(456), 456.0);
    let d = m.device();
    assert_eq!(d.duplex_bytes_per_s, 2.0);
    assert_eq!(d.h2d_duplex_bytes_per_s(), 1.0);
    assert_eq!(d.d2h_duplex_bytes_per_s(), 1.0);
    assert_eq!(d.memory_bytes, u64::MAX);
    assert_eq!((d.copy_latency_s, d.kernel_launch_s), (0.0, 0.0));
}

/// conv(3 -> 64, 3x3) -> relu -> linear -> loss on 32x3x64x64 float32.
fn small_cnn() -> Graph {
    let mut b = GraphBuilder::new("cnn", 32, DType::Float32);
    let x = b.input("x", &[32, 3, 64, 64]);
    let y = b.label("y", &[32]);
    let h = b.conv2d("conv", x, 64, 3, 1, 1);
    let h = b.relu(h);
    let h = b.reshape(h, &[32, 64 * 64 * 64]);
    let logits = b.linear("fc", h, 10, true);
    let loss = b.softmax_cross_entropy(logits, y);
    b.finish(loss, Optimizer::None).expect("valid graph")
}

#[test]
fn tf32_modes_price_their_classes_at_the_tf32_peak() {
    use outcore_cost::{TF32_CONVOLUTION_COMPUTE_EFFICIENCY, Tf32};
    let g = small_cnn();
    let conv = find(&g, |o| {
        o.phase == Phase::Forward && o.kind.class() == OpClass::Convolution
    });
    let fc = find(&g, |o| {
        o.phase == Phase::Forward && o.kind.class() == OpClass::MatMul
    });
    let off = RooflineModel::new(DeviceProfile::builtin("a100-40gb").unwrap());
    let flops = g.op(conv).flops as f64;
    // Off: the CUDA cores at the convolution class's 0.65.
    assert!(close(
        off.op_bounds_s(&g, conv).compute_s,
        flops / (19.5e12 * 0.65)
    ));
    // Convolutions: the TF32 peak at the fitted efficiency; matmuls unchanged.
    let conv_only = off.clone().with_tf32(Tf32::Convolutions);
    assert!(close(
        conv_only.op_bounds_s(&g, conv).compute_s,
        flops / (156e12 * TF32_CONVOLUTION_COMPUTE_EFFICIENCY)
    ));
    assert_eq!(
        conv_only.op_bounds_s(&g, fc),
        off.op_bounds_s(&g, fc),
        "matmul"
    );
    // Matmuls: the reverse; all: both.
    let mm_only = off.clone().with_tf32(Tf32::Matmuls);
    assert_eq!(mm_only.op_bounds_s(&g, conv), off.op_bounds_s(&g, conv));
    let fc_flops = g.op(fc).flops as f64;
    assert!(close(
        mm_only.op_bounds_s(&g, fc).compute_s,
        fc_flops / (156e12 * 0.75)
    ));
    let all = off.clone().with_tf32(Tf32::All);
    assert_eq!(all.op_bounds_s(&g, conv), conv_only.op_bounds_s(&g, conv));
    assert_eq!(all.op_bounds_s(&g, fc), mm_only.op_bounds_s(&g, fc));
    // The mode reaches the model through the profile, and shows in its name.
    let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
    p.tf32 = Tf32::Convolutions;
    let from_profile = RooflineModel::new(p);
    assert_eq!(from_profile, conv_only);
    assert_eq!(
        from_profile.name(),
        "roofline(a100-40gb, tf32 convolutions)"
    );
    // A device without TF32 keeps the FP32 peak and the class efficiency.
    let v100 = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
    assert_eq!(
        v100.clone().with_tf32(Tf32::All).op_bounds_s(&g, conv),
        v100.op_bounds_s(&g, conv)
    );
}
