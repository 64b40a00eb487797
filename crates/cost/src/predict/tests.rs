//! Tests of features, predictors, data sets, EWMA and the replanning trigger.

use super::*;
use crate::measured::{MeasuredEntry, MeasuredTable};
use crate::model::UnitCostModel;
use outcore_graph::DType;
use outcore_graph::builder::{GraphBuilder, Optimizer};

fn graph() -> Graph {
    let mut b = GraphBuilder::new("t", 4, DType::Float32);
    let x = b.input("x", &[4, 8]);
    let y = b.label("y", &[4]);
    let h = b.linear("fc", x, 3, true);
    let loss = b.softmax_cross_entropy(h, y);
    b.finish(loss, Optimizer::None).unwrap()
}

fn table_of(g: &Graph, time_s: impl Fn(usize) -> f64) -> MeasuredTable {
    let mut t = MeasuredTable::new("cpu", "t");
    for (i, op) in g.ops.iter().enumerate() {
        t.push(op.id, &op.name, time_s(i), 1);
    }
    t
}

#[test]
fn features_read_the_graph() {
    let g = graph();
    let fc = g.ops.iter().find(|o| o.name == "fc").unwrap();
    let f = op_features(&g, fc.id);
    assert_eq!(f.kind, "linear");
    assert_eq!(f.class, outcore_graph::OpClass::MatMul);
    // x [4, 8] times w [3, 8]^T: 2 * 4 * 8 * 3 FLOPs as the builder counts them.
    assert_eq!(fc.flops, 2 * 4 * 8 * 3);
    assert_eq!(f.values[0], (fc.flops as f64).ln_1p());
    assert_eq!(f.ln_flops, f.values[0]);
    let moved = (fc.bytes_read + fc.bytes_written) as f64;
    assert_eq!(f.ln_bytes_moved, moved.ln_1p());
    // Input elements: x (32) + w (24) + b (3); first input's dim 0 is the batch.
    assert_eq!(f.values[5], 59f64.ln_1p());
    assert_eq!(f.values[7], 4f64.ln_1p());
    assert_eq!(f.values[9], 3.0, "three inputs");
    // One phase slot and one class slot are set.
    assert_eq!(f.values[14..17].iter().sum::<f64>(), 1.0);
    assert_eq!(f.values[14], 1.0, "forward");
    assert_eq!(f.values[17..].iter().sum::<f64>(), 1.0);
    assert_eq!(f.values[18], 1.0, "matmul class");
    assert_eq!(FEATURE_NAMES.len(), f.values.len());
}

#[test]
fn mlp_learns_a_product_no_linear_model_can_fit() {
    // y = x0 * x1 on a grid over [-1, 1]^2. The product is uncorrelated with
    // x0, x1 and the constant, so the best linear fit is the mean and leaves
    // the target's whole variance as its MSE (1.0 once standardised). A
    // network whose training MSE is below a tenth of that has learned the
    // interaction.
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for i in 0..11 {
        for j in 0..11 {
            let (a, b) = (i as f64 / 5.0 - 1.0, j as f64 / 5.0 - 1.0);
            xs.push(vec![a, b]);
            ys.push(a * b);
        }
    }
    let config = MlpConfig {
        hidden: [16, 16, 8],
        epochs: 300,
        batch_size: 16,
        learning_rate: 1e-2,
        seed: 7,
    };
    let mlp = Mlp::fit(&xs, &ys, &config).unwrap();
    let first = mlp.loss_history[0];
    let last = *mlp.loss_history.last().unwrap();
    assert!(
        last < 0.1,
        "standardised training MSE {last} (started at {first})"
    );
    assert!(last < first);
    // And in raw units at a grid point.
    assert!((mlp.predict(&[0.6, -0.8]) - (-0.48)).abs() < 0.15);
    // Same data and seed, same network.
    assert_eq!(Mlp::fit(&xs, &ys, &config).unwrap(), mlp);
}

#[test]
fn mlp_rejects_bad_configs_and_data() {
    let xs = vec![vec![1.0], vec![2.0]];
    let ys = vec![1.0, 2.0];
    let c = MlpConfig {
        learning_rate: f64::NAN,
        ..MlpConfig::default()
    };
    let msg = Mlp::fit(&xs, &ys, &c).unwrap_err().to_string();
    assert!(
        msg.contains("learning_rate") && msg.contains("(0, 1]"),
        "{msg}"
    );
    let c = MlpConfig {
        hidden: [0, 4, 4],
        ..MlpConfig::default()
    };
    assert!(
        Mlp::fit(&xs, &ys, &c)
            .unwrap_err()
            .to_string()
            .contains("hidden")
    );
    let msg = Mlp::fit(&[], &[], &MlpConfig::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("0 feature rows"), "{msg}");
    let msg = Mlp::fit(&xs, &[1.0, f64::NAN], &MlpConfig::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("row 1"), "{msg}");
}

#[test]
fn least_squares_recovers_a_power_law() {
    // Times exactly 1e-9 * (1 + flops): ln t = ln 1e-9 + ln(1 + flops), so
    // the per-kind fit has slope 1 on ln flops and 0 on bytes for these
    // rows, and predicts an unseen size exactly.
    let mut b = GraphBuilder::new("t", 4, DType::Float32);
    let mut x = b.input("x", &[4, 8]);
    for (i, width) in [16, 32, 64, 128, 256].into_iter().enumerate() {
        x = b.linear(&format!("fc{i}"), x, width, false);
    }
    let y = b.label("y", &[4]);
    let loss = b.softmax_cross_entropy(x, y);
    let g = b.finish(loss, Optimizer::None).unwrap();
    let time = |i: usize| 1e-9 * (1.0 + g.ops[i].flops as f64);
    let data = Dataset::from_table(&g, &table_of(&g, time), "t").unwrap();
    let linear: Vec<Sample> = data
        .samples
        .iter()
        .filter(|s| s.features.kind == "linear")
        .cloned()
        .collect();
    assert_eq!(linear.len(), 5);
    let (train, test) = linear.split_at(4);
    let p = PerKindLeastSquares::fit(train).unwrap();
    let want = test[0].time_s;
    let got = p.predict_time_s(&test[0].features);
    assert!((got - want).abs() / want < 1e-3, "{got} vs {want}");
}

#[test]
fn datasets_reject_bad_tables() {
    let g = graph();
    let msg = Dataset::from_table(&g, &MeasuredTable::new("cpu", "t"), "a.json")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("a.json") && msg.contains("no entries"),
        "{msg}"
    );

    let mut t = table_of(&g, |_| 1e-3);
    t.entries[1].time_s = f64::NAN;
    let msg = Dataset::from_table(&g, &t, "a.json")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("op 1") && msg.contains("NaN") && msg.contains("non-negative"),
        "{msg}"
    );
    t.entries[1].time_s = -2.0;
    let msg = Dataset::from_table(&g, &t, "a.json")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("-2"), "{msg}");

    let mut t = table_of(&g, |_| 1e-3);
    t.entries.push(MeasuredEntry {
        op: 10_000,
        name: "ghost".into(),
        time_s: 1e-3,
        samples: 1,
        kind: None,
    });
    let msg = Dataset::from_table(&g, &t, "a.json")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("op 10000") && msg.contains("beyond the graph's"),
        "{msg}"
    );
    let mut t = table_of(&g, |_| 1e-3);
    t.entries[0].name = "renamed".into();
    let msg = Dataset::from_table(&g, &t, "a.json")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`renamed`") && msg.contains("another graph"),
        "{msg}"
    );

    // A zero time is allowed and scored against MIN_TIME_S.
    let data = Dataset::from_table(&g, &table_of(&g, |_| 0.0), "z").unwrap();
    assert_eq!(data.samples[0].ln_time_s(), MIN_TIME_S.ln());
}

#[test]
fn evaluation_numbers_by_hand() {
    // A predictor that always says 2 s, on rows of 1, 2 and 4 s: relative
    // errors 1, 0, 0.5; median 0.5, p90 (nearest rank 3 of 3) 1; summed
    // 6 s vs 7 s gives 1/7.
    #[derive(Debug)]
    struct Two;
    impl LatencyPredictor for Two {
        fn predict_ln_time_s(&self, _: &OpFeatures) -> f64 {
            2f64.ln()
        }
        fn name(&self) -> String {
            "two".into()
        }
    }
    let g = graph();
    let f = op_features(&g, OpId(0));
    let row = |t: f64| Sample {
        features: f.clone(),
        time_s: t,
        source: "g".into(),
    };
    let data = Dataset {
        samples: vec![row(1.0), row(2.0), row(4.0)],
    };
    let r = evaluate(&Two, &data);
    assert_eq!(r.n, 3);
    assert!((r.median_rel_error - 0.5).abs() < 1e-12);
    assert!((r.p90_rel_error - 1.0).abs() < 1e-12);
    assert!((r.sum_rel_error_by_source["g"] - 1.0 / 7.0).abs() < 1e-12);
    // Deduplication merges the three identical feature rows (geometric mean 2).
    let d = data.deduplicated();
    assert_eq!(d.samples.len(), 1);
    assert!((d.samples[0].time_s - 2.0).abs() < 1e-12);
}

#[test]
fn error_reports_from_rows_by_hand() {
    // Source a: 2 s predicted for 1 s and 3 s for 3 s (errors 1 and 0; sum
    // 5 vs 4, 1/4); source b: 0 s for 2 s (error 1; sum error 1). Sorted
    // errors 0, 1, 1: median 1, p90 1; mean summed error 5/8, max 1.
    let r = ErrorReport::from_rows([(2.0, 1.0, "a"), (3.0, 3.0, "a"), (0.0, 2.0, "b")]);
    assert_eq!(r.n, 3);
    assert_eq!(r.median_rel_error, 1.0);
    assert_eq!(r.p90_rel_error, 1.0);
    assert!((r.sum_rel_error_by_source["a"] - 0.25).abs() < 1e-12);
    assert!((r.mean_sum_rel_error() - 0.625).abs() < 1e-12);
    assert_eq!(r.max_sum_rel_error(), 1.0);
}

#[test]
fn ewma_updates_by_hand() {
    // alpha 0.25: 4 -> 0.25 * 8 + 0.75 * 4 = 5, then 0.25 * 8 + 0.75 * 5 = 5.75;
    // op 1 not measured stays at 2.
    let mut t = EwmaTracker::new(vec![4.0, 2.0], 0.25).unwrap();
    assert_eq!(t.sum_s(), 6.0);
    t.update(&[Some(8.0), None]).unwrap();
    assert_eq!(t.times_s(), &[5.0, 2.0]);
    t.update(&[Some(8.0), None]).unwrap();
    assert_eq!(t.times_s(), &[5.75, 2.0]);
    assert_eq!(t.updates(), 2);
    // Planned at 6: change |7.75 - 6| / 6.
    assert_eq!(t.planned_sum_s(), 6.0);
    assert!((t.relative_change() - 1.75 / 6.0).abs() < 1e-15);
    t.mark_planned();
    assert_eq!(t.relative_change(), 0.0);
    // alpha 1 keeps only the newest measurement.
    let mut t = EwmaTracker::new(vec![4.0], 1.0).unwrap();
    t.update(&[Some(3.0)]).unwrap();
    assert_eq!(t.times_s(), &[3.0]);
}

#[test]
fn ewma_rejects_bad_input() {
    for alpha in [0.0, -0.1, 1.5, f64::NAN] {
        let msg = EwmaTracker::new(vec![1.0], alpha).unwrap_err().to_string();
        assert!(msg.contains("alpha") && msg.contains("(0, 1]"), "{msg}");
    }
    assert!(EwmaTracker::new(vec![], 0.5).is_err());
    let msg = EwmaTracker::new(vec![1.0, -1.0], 0.5)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("op 1: -1"), "{msg}");
    let mut t = EwmaTracker::new(vec![1.0, 1.0], 0.5).unwrap();
    let msg = t.update(&[Some(1.0)]).unwrap_err().to_string();
    assert!(msg.contains("expected 2") && msg.contains("got 1"), "{msg}");
    let msg = t
        .update(&[Some(1.0), Some(f64::INFINITY)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("inf"), "{msg}");
    assert_eq!(
        t.times_s(),
        &[1.0, 1.0],
        "a rejected update changes nothing"
    );
}

#[test]
fn trigger_fires_strictly_above_the_threshold() {
    // 4 -> 5 is a change of exactly 0.25 (all exact in binary).
    let at = ReplanTrigger::new(0.25).unwrap();
    assert_eq!(ReplanTrigger::relative_change(5.0, 4.0), 0.25);
    assert!(!at.fires(5.0, 4.0), "equal to the threshold does not fire");
    assert!(!at.fires(3.0, 4.0), "nor a fall of exactly the threshold");
    let above = 5.0f64.next_up();
    assert!(at.fires(above, 4.0), "the next float above fires");
    assert!(at.fires(2.9, 4.0), "a larger fall fires");
    // Threshold 0 fires on any change, never on none.
    let zero = ReplanTrigger::new(0.0).unwrap();
    assert!(!zero.fires(4.0, 4.0));
    assert!(zero.fires(4.0f64.next_up(), 4.0));
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        let msg = ReplanTrigger::new(bad).unwrap_err().to_string();
        assert!(msg.contains("threshold"), "{msg}");
    }
}

#[test]
fn cost_models_price_ops_by_prediction_and_tracked_times() {
    let g = graph();
    // A least-squares fit on unit-model times (time = FLOPs).
    let data = Dataset::from_cost_model(&g, &UnitCostModel, "g");
    let p = PerKindLeastSquares::fit(&data.samples).unwrap();
    let m = PredictedModel::new(&p, UnitCostModel::profile());
    for op in &g.ops {
        assert_eq!(
            m.op_time_s(&g, op.id),
            p.predict_time_s(&op_features(&g, op.id))
        );
    }
    assert!(m.name().starts_with("predicted(per-kind-least-squares"));
    // The tracker's times as a model, matched by id and name.
    let times: Vec<f64> = (0..g.n_ops()).map(|i| i as f64 + 0.5).collect();
    let t = EwmaTracker::new(times.clone(), 0.5).unwrap();
    let m = t.cost_model(&g, UnitCostModel::profile()).unwrap();
    for (i, op) in g.ops.iter().enumerate() {
        assert_eq!(m.op_time_s(&g, op.id), times[i]);
    }
    assert_eq!(m.h2d_time_s(8), 8.0, "copies priced by the device");
    let other = {
        let mut b = GraphBuilder::new("u", 4, DType::Float32);
        let x = b.input("x", &[4, 8]);
        let y = b.label("y", &[4]);
        let h = b.linear("other", x, 3, true);
        let loss = b.softmax_cross_entropy(h, y);
        b.finish(loss, Optimizer::None).unwrap()
    };
    assert!(m.op_time_s(&other, OpId(0)).is_nan(), "another graph's op");
    let msg = OpTimesModel::new(&g, vec![1.0], UnitCostModel::profile(), "x")
        .unwrap_err()
        .to_string();
    assert!(msg.contains(&format!("expected {}", g.n_ops())), "{msg}");
}

#[test]
fn committed_cpu_tables_match_their_zoo_graphs() {
    // The example trains on these; a zoo change that renames or reorders ops
    // must show up here, not as a confusing error in the example.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/predict/cpu");
    for (model, batch, knob, value) in [
        ("tiny-cnn", 4, "width", 8),
        ("mlp", 8, "hidden", 128),
        ("tiny-transformer", 4, "hidden", 64),
    ] {
        let file = dir.join(format!("{model}__b{batch}__{knob}={value}.json"));
        let table = MeasuredTable::from_json_file(&file).unwrap();
        let knobs = std::collections::BTreeMap::from([(knob.to_string(), value)]);
        let g = outcore_graph::zoo::build(model, Some(batch), &knobs, None).unwrap();
        let data = Dataset::from_table(&g, &table, model).unwrap();
        assert_eq!(data.samples.len(), g.n_ops(), "{model}: every op measured");
        assert!(data.samples.iter().all(|s| s.time_s > 0.0), "{model}");
    }
}
