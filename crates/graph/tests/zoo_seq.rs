//! Sequence-model zoo specifics: knob validation for transformers, weight sharing
//! across the unrolled LSTM steps, and SwapAdvisor's RNN-8-8K parameterisation.

use outcore_graph::{OpKind, stats, zoo};
use std::collections::BTreeMap;

fn knobs(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

#[test]
fn transformer_knobs_are_checked() {
    let err = zoo::build(
        "tiny-transformer",
        Some(2),
        &knobs(&[("hidden", 65), ("heads", 2)]),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a multiple of heads"), "{err}");
    let err = zoo::build("gpt2", Some(2), &knobs(&[("seq", 2048)]), None).unwrap_err();
    assert!(err.to_string().contains("1024 learned positions"), "{err}");
    // A one-token sequence has no positions after the first; still builds.
    zoo::build(
        "bert-base",
        Some(2),
        &knobs(&[("seq", 1), ("layers", 1)]),
        None,
    )
    .unwrap();
}

#[test]
fn lstm_weights_are_shared_across_steps() {
    let seq = 8;
    let g = zoo::build(
        "lstm",
        Some(2),
        &knobs(&[("seq", seq), ("layers", 1)]),
        None,
    )
    .unwrap();
    let cells = g
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::LstmCell)
        .count();
    assert_eq!(cells as u64, seq);
    // One gradient contribution per step, summed seq - 1 times.
    let sums = g
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::GradAccumulate && op.name.starts_with("rnn.weight_ih_l0."))
        .count();
    assert_eq!(sums as u64, seq - 1);
}

#[test]
fn rnn_8_8k_has_nn_lstm_parameter_count() {
    let (h, v, layers) = (8192u64, 10_000u64, 8u64);
    let g = zoo::build(
        "lstm",
        Some(2),
        &knobs(&[("layers", layers), ("hidden", h), ("seq", 2)]),
        None,
    )
    .unwrap();
    let per_layer = 4 * h * (h + h) + 8 * h;
    assert_eq!(
        stats(&g).param_count,
        v * h + layers * per_layer + h * v + v
    );
}
