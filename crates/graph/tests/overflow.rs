//! Issue 15, rows "silent wrong: integer overflow" and "huge memory": sizes and
//! FLOPs that do not fit in 64 bits are an error from the builder, never a
//! wrapped number (nor a debug-build panic), and every knob has a bound that
//! keeps a zoo graph small.

use outcore_graph::builder::{GraphBuilder, Optimizer};
use outcore_graph::zoo::{self, MAX_BATCH, knob_max};
use outcore_graph::{DType, GraphErrorKind, stats};
use std::collections::BTreeMap;

#[test]
fn row_silent_wrong_builder_overflow_is_an_error_not_a_wrap() {
    // 2^40 x 2^30 elements: the tensor size alone overflows.
    let mut b = GraphBuilder::new("huge", 1 << 40, DType::Float32);
    let x = b.input("x", &[1 << 40, 1 << 30]);
    let y = b.linear("fc", x, 8, true);
    let labels = b.label("labels", &[1 << 40]);
    let loss = b.softmax_cross_entropy(y, labels);
    let err = b.finish(loss, Optimizer::None).expect_err("overflows");
    assert!(matches!(err.kind, GraphErrorKind::Overflow { .. }), "{err}");
    assert!(err.to_string().contains("overflows 64 bits"), "{err}");

    // Within the batch bound, FLOPs of a wide layer overflow: an error.
    let knobs = BTreeMap::from([("hidden".to_string(), knob_max("hidden"))]);
    let err = zoo::build("mlp", Some(MAX_BATCH), &knobs, None).expect_err("overflows");
    assert!(err.to_string().contains("FLOPs overflows 64 bits"), "{err}");
}

#[test]
fn row_silent_wrong_flops_grow_with_the_batch_up_to_its_bound() {
    let forward = |batch: u64| {
        let g = zoo::build("resnet50", Some(batch), &BTreeMap::new(), None).expect("builds");
        stats(&g).flops_by_phase["forward"]
    };
    let (a, b) = (forward(MAX_BATCH / 2), forward(MAX_BATCH));
    // Linear in the batch up to the few per-channel ops that do not depend on
    // it (running-stat updates): no wrap, no saturation.
    assert!(b <= 2 * a && b as f64 > 1.999 * a as f64, "{a} -> {b}");
    let err = zoo::build("resnet50", Some(MAX_BATCH + 1), &BTreeMap::new(), None)
        .expect_err("over the bound");
    assert!(err.to_string().contains("accepted: 1 to 16777216"), "{err}");
}

#[test]
fn row_huge_memory_knobs_are_bounded() {
    for (model, knob) in [
        ("gpt2", "layers"),
        ("bert-base", "layers"),
        ("tiny-cnn", "depth"),
    ] {
        let too_many = BTreeMap::from([(knob.to_string(), knob_max(knob) + 1)]);
        let err = zoo::build(model, Some(1), &too_many, None).expect_err("over the bound");
        assert!(err.to_string().contains("out of range"), "{model}: {err}");
    }
    // At the bound, GPT-2 stays a graph of a few hundred thousand ops.
    let at_bound = BTreeMap::from([("layers".to_string(), knob_max("layers"))]);
    let g = zoo::build("gpt2", Some(1), &at_bound, None).expect("builds at the bound");
    assert!(g.ops.len() < 500_000, "{} ops", g.ops.len());
    // Every model's defaults are inside the bounds.
    for info in zoo::models() {
        for k in info.knobs {
            assert!(k.default <= knob_max(k.name), "{} {}", info.name, k.name);
        }
        assert!(info.default_batch <= MAX_BATCH, "{}", info.name);
    }
}

/// Found by the fuzz harness (crates/outcore/tests/fuzz.rs): a graph file's
/// shapes, sizes and FLOPs are checked without overflow, and totals the
/// analyses take are bounded, so validation refuses what would wrap.
#[test]
fn row_silent_wrong_validation_refuses_what_would_wrap() {
    let good = zoo::build("tiny-cnn", Some(2), &BTreeMap::new(), None).expect("builds");
    let mut g = good.clone();
    g.tensors[0].shape = vec![u64::MAX, 3];
    let err = outcore_graph::validate(&g).expect_err("a shape product overflows");
    assert!(err.to_string().contains("bytes"), "{err}");
    let mut g = good.clone();
    g.tensors[0].size_bytes = u64::MAX;
    let err = outcore_graph::validate(&g).expect_err("over 2^60 bytes");
    // The total over the graph is refused first (the per-tensor bound is
    // reported when the total fits).
    assert!(err.to_string().contains("size_bytes"), "{err}");
    assert!(err.to_string().contains("out of range"), "{err}");
    let mut g = good;
    for op in &mut g.ops {
        op.flops = u64::MAX / 2;
    }
    let err = outcore_graph::validate(&g).expect_err("total FLOPs overflow");
    assert!(err.to_string().contains("sum of all ops' flops"), "{err}");
}
