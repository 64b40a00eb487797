//! Zoo footprints against training steps captured from PyTorch by
//! `tools/export_train_graph.py` (files in tools/examples), and the importer on them.

use outcore_graph::builder::Optimizer;
use outcore_graph::format::load_graph_file;
use outcore_graph::{stats, zoo};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/examples")
        .join(name)
}

fn summary_peak(name: &str) -> u64 {
    let text = std::fs::read_to_string(example(name)).expect("example is readable");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("example is JSON");
    doc["summary"]["peak_live_bytes"]
        .as_u64()
        .expect("summary peak")
}

/// Relative difference of the zoo's footprint from PyTorch's peak.
fn check(
    file: &str,
    zoo_model: &str,
    batch: u64,
    knobs: &[(&str, u64)],
    optimizer: Optimizer,
) -> f64 {
    let imported = load_graph_file(&example(file)).expect("exported graph imports");
    let pytorch_peak = summary_peak(file);
    // The importer reproduces the exporter's own liveness peak exactly.
    assert_eq!(stats(&imported).footprint_bytes, pytorch_peak, "{file}");
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let g = zoo::build(zoo_model, Some(batch), &knobs, Some(optimizer)).expect("zoo builds");
    let zoo_peak = stats(&g).footprint_bytes;
    let rel = (zoo_peak as f64 - pytorch_peak as f64) / pytorch_peak as f64;
    assert!(
        rel.abs() < 0.10,
        "{zoo_model}: zoo {zoo_peak} vs PyTorch {pytorch_peak} ({:.2}%)",
        rel * 100.0
    );
    rel
}

#[test]
fn resnet50_b32_matches_pytorch() {
    // Measured 2026-11-21: 2,987,609,316 vs 2,987,609,740 bytes.
    let rel = check(
        "resnet50_b32.json",
        "resnet50",
        32,
        &[],
        Optimizer::sgd_momentum(),
    );
    assert!(rel.abs() < 0.001, "{rel}");
}

#[test]
fn vgg16_b32_matches_pytorch() {
    check(
        "vgg16_b32.json",
        "vgg16",
        32,
        &[],
        Optimizer::sgd_momentum(),
    );
}

#[test]
fn gpt2_b4_s256_matches_pytorch() {
    // Measured 2026-11-21: 3,533,714,440 vs 3,533,706,244 bytes, once `gelu_new` is
    // the eager decomposition and the loss backward's intermediate is counted.
    let rel = check(
        "gpt2_b4_s256_adamw.json",
        "gpt2",
        4,
        &[("seq", 256)],
        Optimizer::adamw(),
    );
    assert!(rel.abs() < 0.01, "{rel}");
}
