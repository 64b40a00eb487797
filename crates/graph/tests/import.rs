//! The `dnn-train-graph/1` importer on the two example graphs in tests/data
//! (exported from PyTorch; kept in the repository so that the test is self-contained).

use outcore_graph::format::{load_graph_file, native};
use outcore_graph::{Phase, stats};
use serde_json::Value;
use std::path::PathBuf;

fn example_graph(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    // A missing file is a failure, never a skip.
    assert!(
        path.is_file(),
        "example graph {} is missing from the repository",
        path.display()
    );
    path
}

/// Loads the file's own `summary` object to compare against.
fn summary(name: &str) -> Value {
    let text = std::fs::read_to_string(example_graph(name)).expect("example graph is readable");
    let doc: Value = serde_json::from_str(&text).expect("example graph is JSON");
    doc["summary"].clone()
}

fn check_against_summary(name: &str) {
    let graph = load_graph_file(&example_graph(name)).expect("example graph imports and validates");
    let s = stats(&graph);
    let summ = summary(name);
    let u = |k: &str| summ[k].as_u64().expect("summary field is an integer");
    assert_eq!(s.n_ops as u64, u("num_ops"));
    assert_eq!(s.n_tensors as u64, u("num_tensors"));
    assert_eq!(s.param_bytes, u("param_bytes"));
    assert_eq!(s.optimizer_state_bytes, u("opt_state_bytes"));
    assert_eq!(s.buffer_bytes, u("buffer_bytes"));
    // The importer keeps the exporter's liveness semantics exactly, so the peak matches
    // to the byte (the issue asks for 0.1%).
    assert_eq!(s.footprint_bytes, u("peak_live_bytes"));
    assert_eq!(s.saved_for_backward_bytes, u("saved_for_backward_bytes"));
    assert_eq!(s.n_distinct_sizes as u64, u("num_distinct_tensor_bytes"));
    for phase in Phase::ALL {
        assert_eq!(
            s.n_ops_by_phase[phase.as_str()] as u64,
            summ["num_ops_by_phase"][phase.as_str()]
                .as_u64()
                .unwrap_or(0)
        );
        assert_eq!(
            s.flops_by_phase[phase.as_str()],
            summ["flops_by_phase"][phase.as_str()].as_u64().unwrap_or(0)
        );
    }
    // Lossless round trip through the native format.
    let text = native::to_string(&graph);
    let back = native::from_str(&text, "<memory>").expect("round trip parses");
    assert_eq!(back, graph);
}

#[test]
fn vgg16_b32_matches_its_summary() {
    check_against_summary("vgg16_b32.json");
}

#[test]
fn mobilenet_v2_b64_matches_its_summary() {
    check_against_summary("mobilenet_v2_b64.json");
}
