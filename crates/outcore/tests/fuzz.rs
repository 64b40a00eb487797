//! Fuzz-style property tests (issue 15): real graph, plan, allocation-trace,
//! device-profile and latency-table files, mutated (JSON values swapped for
//! hostile ones, nodes dropped or duplicated, bytes flipped, inserted or cut),
//! fed to every parser and validator the CLI reaches, and on to what the CLI
//! does next with what they accept (stats, verify, simulate, replay). Every
//! call runs under `catch_unwind`: an error is fine, a panic is a failure.
//!
//! Cases per format: `OUTCORE_FUZZ_CASES` (default 10,000, as issue 15 asks of CI;
//! about half a minute in all in the test profile, as CI runs it). A longer run:
//! `OUTCORE_FUZZ_CASES=20000 cargo test --release -p outcore --test fuzz`.
//!
//! Memory: the test binary's global allocator is capped at
//! [`HEAP_LIMIT_BYTES`] (2 GiB) of live heap, so a mutated input that makes a
//! parser or validator allocate more fails the run (an infallible allocation
//! over the cap aborts the binary) instead of passing unnoticed.

use outcore::{GraphSource, LoadedGraph, PlanOptions, SimulateOptions, Target};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Issue 15: "no allocation above 2 GB" while fuzzing.
const HEAP_LIMIT_BYTES: usize = 2 << 30;

#[global_allocator]
static HEAP: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, HEAP_LIMIT_BYTES);

/// The cap is installed and enforced: a 3 GiB reservation is refused, and the
/// harness's own allocations are counted.
#[test]
fn heap_is_capped_at_2_gib() {
    assert_eq!(HEAP.limit(), HEAP_LIMIT_BYTES);
    let mut v: Vec<u8> = Vec::new();
    assert!(v.try_reserve_exact(3 << 30).is_err(), "3 GiB got through");
    // Bytes ever allocated only grow: the fuzz tests running beside this one
    // free memory too, so the live count could fall below `before` meanwhile.
    let before = HEAP.total_allocated();
    let held = vec![1u8; 1 << 20];
    assert!(
        HEAP.total_allocated() >= before + (1 << 20),
        "allocations not counted"
    );
    assert!(HEAP.allocated() >= held.len(), "live bytes not counted");
    drop(held);
}

fn cases() -> u32 {
    std::env::var("OUTCORE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// The unmutated inputs, made once from the facade itself (and the example
/// graph in the repository).
struct Seeds {
    native_graph: String,
    pytorch_graph: String,
    plan: String,
    trace: String,
    device: String,
    latency_table: String,
    comparison: String,
}

fn tiny() -> LoadedGraph {
    let source = GraphSource::Zoo {
        model: "tiny-cnn".into(),
        batch: Some(2),
        knobs: BTreeMap::from([("depth".to_string(), 2), ("width".to_string(), 4)]),
        optimizer: None,
    };
    outcore::load_graph(&source).expect("tiny-cnn loads")
}

fn seeds() -> &'static Seeds {
    static SEEDS: OnceLock<Seeds> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let graph = tiny();
        let target = Target::parse(&graph, "a100-40gb", "70%", "perfect").expect("target");
        let made = outcore::plan(&graph, "window", &target, &PlanOptions::default())
            .expect("window plans tiny-cnn at 70%");
        let plan = made.plan.to_json();
        let simulated = outcore::simulate_plan(
            &made.plan,
            &SimulateOptions {
                iterations: 1,
                record_alloc_trace: true,
                ..SimulateOptions::default()
            },
        )
        .expect("simulates");
        let trace = simulated
            .alloc_trace
            .expect("trace recorded")
            .to_json_string();
        let device =
            serde_json::to_string(&outcore::load_device("a100-40gb").expect("builtin device"))
                .expect("device serialises");
        let budget = outcore::parse_budget("200%", graph.footprint_bytes()).expect("budget");
        let run_options = outcore::RunOptions {
            iters: 1,
            ..outcore::RunOptions::default()
        };
        let cpu = outcore::cpu_target(&graph, budget, Default::default(), &run_options)
            .expect("cpu target");
        let cpu_plan = outcore::plan(&graph, "none", &cpu, &PlanOptions::default()).expect("plans");
        let ran = outcore::run(&graph.graph, cpu_plan.plan, &run_options).expect("runs");
        let pytorch_graph = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../graph/tests/data/vgg16_b32.json"),
        )
        .expect("the example graph is in the repository");
        let comparison = outcore::compare(
            &graph,
            &["window".to_string(), "lms".to_string()],
            &target,
            &PlanOptions::default(),
        )
        .expect("compares");
        Seeds {
            comparison: serde_json::to_string(&comparison).expect("serialises"),
            native_graph: outcore_graph::format::native::to_string(&graph.graph),
            pytorch_graph,
            plan,
            trace,
            device,
            latency_table: ran.latency_table.to_json_string(),
        }
    })
}

// ----- mutations -----

/// Values that have broken parsers before: zeros, negatives, huge and tiny
/// numbers, wrong types.
fn hostile() -> Vec<Value> {
    serde_json::from_str(
        r#"[0, -1, 1, 2, 4294967296, 9007199254740993, 18446744073709551615,
            -9223372036854775808, 1e308, -1e308, 5e-324, 0.5, -0.0,
            "", "x", "perfect", "virtual-chunks", "dnn-train-graph/1",
            "outcore-graph/1", "outcore-plan/1", null, true, [], {}, [0], {"kind": "x"}]"#,
    )
    .expect("hostile values parse")
}

/// Text spliced in where JSON values cannot express it.
const HOSTILE_TEXT: &[&str] = &[
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "\u{feff}",
    "\"\\ud800\"",
    "{",
    "]",
    ",",
    "\0",
];

/// One mutation, chosen by proptest from plain numbers.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the n-th node (in document order) with a hostile value.
    Replace { node: usize, value: usize },
    /// Remove the n-th node from its parent object or array.
    Remove { node: usize },
    /// Append a copy of the n-th node to its parent array.
    Duplicate { node: usize },
    /// Text: splice hostile text in at a position.
    Splice { at: usize, text: usize },
    /// Text: flip a byte.
    Flip { at: usize, bits: u8 },
    /// Text: cut the document short.
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<usize>()).prop_map(|(node, value)| Mutation::Replace { node, value }),
        2 => any::<usize>().prop_map(|node| Mutation::Remove { node }),
        1 => any::<usize>().prop_map(|node| Mutation::Duplicate { node }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(at, text)| Mutation::Splice { at, text }),
        1 => (any::<usize>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

/// JSON pointers of every node below the root, in document order.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        _ => {}
    }
}

fn parent_and_key(pointer: &str) -> (&str, String) {
    let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    (parent, key.replace("~1", "/").replace("~0", "~"))
}

fn apply(seed: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut doc: Value = serde_json::from_str(seed).expect("seed is JSON");
    let hostile = hostile();
    let mut text_edits = Vec::new();
    for m in mutations {
        let mut all = Vec::new();
        pointers(&doc, String::new(), &mut all);
        if all.is_empty() {
            continue;
        }
        match *m {
            Mutation::Replace { node, value } => {
                if let Some(slot) = doc.pointer_mut(&all[node % all.len()]) {
                    *slot = hostile[value % hostile.len()].clone();
                }
            }
            Mutation::Remove { node } | Mutation::Duplicate { node } => {
                let (parent, key) = parent_and_key(&all[node % all.len()]);
                let duplicate = matches!(m, Mutation::Duplicate { .. });
                match doc.pointer_mut(parent) {
                    Some(Value::Object(map)) if !duplicate => {
                        map.remove(&key);
                    }
                    Some(Value::Array(items)) => {
                        if let Ok(i) = key.parse::<usize>()
                            && i < items.len()
                        {
                            if duplicate {
                                let copy = items[i].clone();
                                items.push(copy);
                            } else {
                                items.remove(i);
                            }
                        }
                    }
                    _ => {}
                }
            }
            _ => text_edits.push(m.clone()),
        }
    }
    let mut bytes = doc.to_string().into_bytes();
    for m in text_edits {
        let len = bytes.len().max(1);
        match m {
            Mutation::Splice { at, text } => {
                let at = at % len;
                let t = HOSTILE_TEXT[text % HOSTILE_TEXT.len()].as_bytes();
                bytes.splice(at..at, t.iter().copied());
            }
            Mutation::Flip { at, bits } => {
                if let Some(b) = bytes.get_mut(at % len) {
                    *b ^= bits;
                }
            }
            Mutation::Truncate { at } => bytes.truncate(at % len),
            _ => {}
        }
    }
    bytes
}

/// Runs `cases()` mutated versions of `seed` through `feed` (given the path of
/// the mutated file); fails on the first panic with the input that caused it.
fn fuzz(format: &str, seed: &str, n_cases: u32, feed: impl Fn(&Path)) {
    let dir = std::env::temp_dir().join(format!("outcore-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path: PathBuf = dir.join(format!("{format}.json"));
    let mut runner = TestRunner::new(Config {
        cases: n_cases.max(1),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(mutation(), 1..4);
    let result = runner.run(&strategy, |mutations| {
        let bytes = apply(seed, &mutations);
        std::fs::write(&path, &bytes).expect("write the mutated file");
        let outcome = catch_unwind(AssertUnwindSafe(|| feed(&path)));
        prop_assert!(
            outcome.is_ok(),
            "{format}: a panic on {mutations:?}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(2000)])
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ----- the formats, each fed as the CLI feeds it -----

/// `stats --graph` and `export --graph`: load (both formats), then the analyses.
fn feed_graph(path: &Path) {
    let source = GraphSource::File {
        path: path.to_path_buf(),
    };
    if let Ok(loaded) = outcore::load_graph(&source) {
        let _ = outcore_graph::stats(&loaded.graph);
        let _ = outcore_graph::format::native::to_string(&loaded.graph);
    }
}

#[test]
fn fuzz_native_graph_files() {
    fuzz("native-graph", &seeds().native_graph, cases(), feed_graph);
}

#[test]
fn fuzz_pytorch_graph_files() {
    // A tenth of the cases: the file is 100 KB, and the validator behind the
    // importer is also covered through the native format.
    fuzz(
        "pytorch-graph",
        &seeds().pytorch_graph,
        cases() / 10,
        feed_graph,
    );
}

/// `verify` and `simulate`: load, rebuild the graph, verify, simulate.
fn feed_plan(path: &Path) {
    if let Ok(plan) = outcore::load_plan(path)
        && let Ok(graph) = outcore::graph_of_plan(&plan)
    {
        let _ = outcore::verify_plan(&plan, &graph);
        let _ = outcore::simulate_plan(
            &plan,
            &SimulateOptions {
                iterations: 1,
                ..SimulateOptions::default()
            },
        );
        // `report --plan`: the figures' data and drawing.
        if let Ok(report) = outcore::plan_report(&plan, None) {
            let _ = report.to_html();
        }
    }
}

#[test]
fn fuzz_plan_files() {
    fuzz("plan", &seeds().plan, cases(), feed_plan);
}

/// `alloc-replay` with every allocator.
fn feed_trace(path: &Path) {
    if let Ok(trace) = outcore_alloc::read_trace(path) {
        for allocator in ["best-fit", "size-class", "virtual-chunks", "perfect"] {
            let _ = outcore::alloc_replay(trace.clone(), allocator, None);
        }
    }
}

#[test]
fn fuzz_alloc_trace_files() {
    fuzz("trace", &seeds().trace, cases(), feed_trace);
}

/// `--device FILE`: load, then a target on it.
fn feed_device(path: &Path) {
    let graph = tiny_cached();
    if let Some(p) = path.to_str()
        && let Ok(device) = outcore::load_device(p)
    {
        let _ = Target::new(graph, device, 1 << 20, Default::default());
    }
}

fn tiny_cached() -> &'static LoadedGraph {
    static TINY: OnceLock<LoadedGraph> = OnceLock::new();
    TINY.get_or_init(tiny)
}

#[test]
fn fuzz_device_profile_files() {
    fuzz("device", &seeds().device, cases(), feed_device);
}

/// `--latency-table FILE`: load, then the plan simulated with it.
fn feed_latency_table(path: &Path) {
    static PLAN: OnceLock<outcore::Plan> = OnceLock::new();
    let plan = PLAN.get_or_init(|| {
        outcore::Plan::from_json(&seeds().plan, "seed").expect("the seed plan loads")
    });
    if let Ok(table) = outcore::load_latency_table(path) {
        let _ = outcore::simulate_plan(
            plan,
            &SimulateOptions {
                iterations: 1,
                latency_table: Some(table),
                ..SimulateOptions::default()
            },
        );
    }
}

#[test]
fn fuzz_latency_table_files() {
    fuzz(
        "latency-table",
        &seeds().latency_table,
        cases(),
        feed_latency_table,
    );
}

/// `report --compare`: parse, then draw.
fn feed_comparison(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if let Ok(runs) = outcore::parse_compare(&text, "fuzz.json")
        && let Ok(report) = outcore::compare_report(&runs)
    {
        let _ = report.to_html();
    }
}

#[test]
fn fuzz_compare_output_files() {
    // The unmutated seed (the facade's own serialisation) must be accepted,
    // or the mutations would only ever exercise the error paths.
    let runs = outcore::parse_compare(&seeds().comparison, "seed").expect("the seed parses");
    assert_eq!(runs[0].rows.len(), 2);
    assert!(runs[0].rows.iter().any(|r| r.throughput_vs_ideal.is_some()));
    fuzz("comparison", &seeds().comparison, cases(), feed_comparison);
}

/// Budgets and sizes as typed on the command line.
#[test]
fn fuzz_budget_and_size_text() {
    let mut runner = TestRunner::new(Config {
        cases: cases() * 4,
        failure_persistence: None,
        ..Config::default()
    });
    let text = prop_oneof![
        "[-+0-9.eE]{0,12}(%|B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?",
        ".{0,16}",
        Just("1e400%".to_string()),
        Just("NaN%".to_string()),
    ];
    let result = runner.run(&(text, any::<u64>()), |(t, footprint)| {
        let outcome = catch_unwind(|| {
            let _ = outcore::parse_budget(&t, footprint);
            let _ = outcore::parse_size(&t);
        });
        prop_assert!(
            outcome.is_ok(),
            "a panic on {t:?} with footprint {footprint}"
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `colocate`: a job list (`outcore-jobs/1`), parsed, planned and simulated.
fn feed_job_list(path: &Path) {
    if let Ok(list) = outcore::load_job_list(path) {
        let _ = outcore::colocate(&list, "a100-40gb", None, false);
    }
}

#[test]
fn fuzz_job_list_files() {
    let seed = r#"{"format": "outcore-jobs/1", "jobs": [
        {"name": "a", "model": "tiny-cnn", "batch": 4, "planner": "none", "iterations": 2},
        {"name": "b", "model": "tiny-cnn", "planner": "checkpoint-sqrt", "budget": "80%",
         "iterations": 1, "arrival_s": 0.0001, "priority": 0.5}]}"#;
    // The unmutated seed must run, or the mutations would only ever exercise
    // the error paths.
    let list = outcore::parse_job_list(seed, "seed").expect("the seed parses");
    outcore::colocate(&list, "a100-40gb", None, false).expect("the seed runs");
    // A tenth of the cases: each one plans and simulates two jobs twice.
    fuzz("job-list", seed, cases() / 10, feed_job_list);
}
