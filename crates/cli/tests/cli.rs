//! The `outcore` binary end to end: the documented commands, and bad input of every
//! kind giving a one-line error and a non-zero exit, never a panic.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn outcore<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .output()
        .expect("outcore runs")
}

fn json_of(args: &[&str]) -> Value {
    let out = outcore(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// Asserts a clean failure: non-zero exit, one `error:` line naming `needle`.
fn fails_with<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S], needle: &str) {
    let out = outcore(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {stderr}"
    );
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected `{needle}` in: {stderr}"
    );
}

/// A PyTorch-exported example graph kept in the repository (`crates/graph/tests/data`),
/// so that the tests pass on a clone with nothing beside it.
fn example_graph(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../graph/tests/data")
        .join(name);
    assert!(
        path.is_file(),
        "example graph {} is missing from the repository",
        path.display()
    );
    path.display().to_string()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outcore-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[test]
fn zoo_lists_every_model_the_issue_names() {
    let v = json_of(&["zoo", "--json"]);
    let names: Vec<&str> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|m| m["name"].as_str().unwrap_or(""))
        .collect();
    for required in [
        "resnet18",
        "resnet34",
        "resnet50",
        "resnet101",
        "resnet152",
        "wide-resnet",
        "inception_v3",
        "inception_v4",
        "densenet121",
        "vgg16",
        "vgg19",
        "mobilenet_v2",
        "squeezenet1_1",
        "nasnet",
        "unet",
        "lstm",
        "brnn",
        "bert-base",
        "bert-large",
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "vit_b_16",
        "mlp",
        "tiny-cnn",
        "tiny-transformer",
    ] {
        assert!(
            names.contains(&required),
            "{required} missing from {names:?}"
        );
    }
    for m in v.as_array().expect("array") {
        assert!(m["description"].as_str().is_some_and(|d| !d.is_empty()));
        assert!(m["knobs"].is_array());
    }
}

#[test]
fn stats_resnet50_has_its_published_parameter_count() {
    let v = json_of(&["stats", "--model", "resnet50", "--batch", "32", "--json"]);
    let params = v["param_count"].as_u64().expect("param_count");
    let rel = (params as f64 - 25_557_032.0).abs() / 25_557_032.0;
    assert!(rel < 0.005, "{params}");
    for key in [
        "model",
        "batch",
        "n_ops",
        "n_ops_by_phase",
        "n_tensors",
        "n_distinct_sizes",
        "param_count",
        "param_bytes",
        "optimizer_state_bytes",
        "footprint_bytes",
        "saved_for_backward_bytes",
        "flops_by_phase",
    ] {
        assert!(!v[key].is_null(), "missing {key}");
    }
    assert_eq!(v["batch"], 32);
}

#[test]
fn stats_of_pytorch_graphs_match_their_summaries() {
    for name in ["vgg16_b32.json", "mobilenet_v2_b64.json"] {
        let path = example_graph(name);
        let v = json_of(&["stats", "--graph", &path, "--json"]);
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        let expected = doc["summary"]["peak_live_bytes"].as_f64().expect("peak");
        let got = v["footprint_bytes"].as_f64().expect("footprint");
        assert!(
            (got - expected).abs() / expected < 0.001,
            "{name}: {got} vs {expected}"
        );
    }
}

#[test]
fn stats_count_non_recomputable_ops_by_reason() {
    let path = example_graph("mobilenet_v2_b64.json");
    let v = json_of(&["stats", "--graph", &path, "--json"]);
    let reasons = &v["not_recomputable_by_reason"];
    // One dropout mask draw; 52 split-off batch-norm statistics updates and 52
    // `num_batches_tracked` increments; every backward and optimizer op.
    assert_eq!(reasons["random"], 1, "{reasons}");
    assert_eq!(reasons["updates_persistent_state"], 104, "{reasons}");
    assert_eq!(reasons["writes_in_place"], 0, "{reasons}");
    assert_eq!(
        reasons["not_forward"].as_u64().expect("count") as usize,
        v["n_ops_by_phase"]["backward"].as_u64().expect("n") as usize
            + v["n_ops_by_phase"]["optimizer"].as_u64().expect("n") as usize
    );
}

#[test]
fn knob_flags_reach_the_model() {
    let a = json_of(&["stats", "--model", "wide-resnet", "--batch", "1", "--json"]);
    let b = json_of(&[
        "stats",
        "--model",
        "wide-resnet",
        "--batch",
        "1",
        "--depth",
        "101",
        "--json",
    ]);
    let c = json_of(&[
        "stats",
        "--model",
        "wide-resnet",
        "--batch",
        "1",
        "--knob",
        "depth=101",
        "--json",
    ]);
    assert!(b["param_count"].as_u64() > a["param_count"].as_u64());
    assert_eq!(b["param_count"], c["param_count"]);
}

#[test]
fn compare_ideal_and_none_on_resnet50_at_16_gib() {
    let v = json_of(&[
        "compare",
        "--model",
        "resnet50",
        "--batch",
        "256",
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "16GiB",
        "--planners",
        "ideal,none",
        "--json",
    ]);
    for key in [
        "model",
        "batch",
        "device",
        "budget_bytes",
        "footprint_bytes",
        "ideal_time_s",
        "results",
    ] {
        assert!(!v[key].is_null(), "missing {key}");
    }
    let results = v["results"].as_array().expect("results");
    let ideal = &results[0];
    assert_eq!(ideal["planner"], "ideal");
    assert_eq!(ideal["feasible"], true);
    assert_eq!(ideal["verified"], true);
    assert_eq!(ideal["throughput_vs_ideal"].as_f64(), Some(1.0));
    assert!(ideal["reason"].is_null());
    let none = &results[1];
    assert_eq!(none["feasible"], false);
    let reason = none["reason"].as_str().expect("a reason");
    assert!(reason.contains("over"), "{reason}");
    for key in [
        "planner",
        "feasible",
        "verified",
        "reason",
        "iter_time_s",
        "throughput_vs_ideal",
        "peak_bytes",
        "swap_in_bytes",
        "swap_out_bytes",
        "recompute_time_s",
        "stall_time_s",
        "planner_time_s",
        "simulate_time_s",
    ] {
        assert!(ideal.get(key).is_some(), "result lacks {key}");
    }
}

#[test]
fn plan_then_simulate_with_traces_and_replay() {
    let plan = temp("plan.json");
    let trace = temp("trace.json");
    let alloc = temp("alloc.json");
    let p = plan.to_str().expect("utf8");
    let out = outcore(&[
        "plan",
        "--model",
        "tiny-cnn",
        "--device",
        "a100-40gb",
        "--budget",
        "100%",
        "--planner",
        "none",
        "-o",
        p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&[
        "simulate",
        p,
        "--trace",
        trace.to_str().expect("utf8"),
        "--alloc-trace",
        alloc.to_str().expect("utf8"),
        "--json",
    ]);
    assert_eq!(v["verified"], true);
    assert!(
        v["throughput_vs_ideal"]
            .as_f64()
            .is_some_and(|t| (t - 1.0).abs() < 1e-9)
    );
    let t: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("json");
    assert!(t["traceEvents"].as_array().is_some_and(|e| e.len() > 10));
    for allocator in ["best-fit", "best-fit-paged", "virtual-chunks", "size-class"] {
        let r = json_of(&[
            "alloc-replay",
            alloc.to_str().expect("utf8"),
            "--allocator",
            allocator,
            "--json",
        ]);
        for key in [
            "allocator",
            "peak_live_bytes",
            "peak_reserved_bytes",
            "fragmentation",
            "failures",
        ] {
            assert!(r.get(key).is_some(), "{allocator}: missing {key}");
        }
        assert_eq!(r["failures"], 0, "{allocator}");
        // Named as asked; `algorithm` is what it is a configuration of.
        assert_eq!(r["allocator"], allocator);
        let algorithm = if allocator == "best-fit-paged" {
            "best-fit"
        } else {
            allocator
        };
        assert_eq!(r["algorithm"], algorithm);
    }
}

#[test]
fn export_round_trips_through_stats() {
    let out = temp("resnet18.outcore.json");
    let o = out.to_str().expect("utf8");
    let run = outcore(&["export", "--model", "resnet18", "--batch", "4", "-o", o]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let from_zoo = json_of(&["stats", "--model", "resnet18", "--batch", "4", "--json"]);
    let from_file = json_of(&["stats", "--graph", o, "--json"]);
    assert_eq!(from_zoo, from_file);
}

#[test]
fn bad_input_is_a_one_line_error() {
    fails_with(
        &["stats", "--model", "resnet51"],
        "unknown model `resnet51`",
    );
    fails_with(
        &["stats", "--graph", "/nonexistent/graph.json"],
        "cannot read",
    );
    let garbage = temp("garbage.json");
    std::fs::write(&garbage, "{ not json").expect("write");
    fails_with(
        &["stats", "--graph", garbage.to_str().expect("utf8")],
        "not valid JSON",
    );
    let wrong = temp("wrong.json");
    std::fs::write(&wrong, r#"{"format": "something/9"}"#).expect("write");
    fails_with(
        &["stats", "--graph", wrong.to_str().expect("utf8")],
        "unsupported format",
    );
    // A dnn-train-graph whose op reads a tensor that does not exist.
    let text = std::fs::read_to_string(example_graph("vgg16_b32.json")).expect("read");
    let mut doc: Value = serde_json::from_str(&text).expect("json");
    doc["ops"][0]["inputs"][0] = Value::from(999_999);
    let invalid = temp("invalid.json");
    std::fs::write(&invalid, doc.to_string()).expect("write");
    fails_with(
        &["stats", "--graph", invalid.to_str().expect("utf8")],
        "invalid graph",
    );
    fails_with(
        &["stats", "--model", "wide-resnet", "--depth", "51"],
        "depth 51",
    );
    let target = [
        "--model",
        "resnet50",
        "--batch",
        "256",
        "--planner",
        "ideal",
        "-o",
        "/tmp/x.json",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = vec!["plan".into()];
        v.extend(target.iter().map(|s| s.to_string()));
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let args = with(&["--device", "v100-16gb-pcie3", "--budget", "40GiB"]);
    fails_with(&args, "larger than");
    let args = with(&["--device", "tpu-v9", "--budget", "4GiB"]);
    fails_with(&args, "tpu-v9");
    let args = with(&["--device", "v100-16gb-pcie3", "--budget", "lots"]);
    fails_with(&args, "budget `lots`");
    fails_with(
        &[
            "plan",
            "--model",
            "mlp",
            "--device",
            "a100-40gb",
            "--budget",
            "50%",
            "--planner",
            "magic",
            "-o",
            "/tmp/x.json",
        ],
        "unknown planner `magic`",
    );
    // A move count bounds `outcore`'s own search only, and not beyond its range.
    let mlp = |extra: &[&str]| -> Vec<String> {
        [
            "plan",
            "--model",
            "mlp",
            "--device",
            "a100-40gb",
            "--budget",
            "50%",
            "-o",
            "/tmp/x.json",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let args = mlp(&["--planner", "home", "--moves", "10"]);
    fails_with(&args, "`home` has no move count");
    let args = mlp(&["--moves", "10000000000"]);
    fails_with(
        &args,
        "moves `10000000000`: out of range; accepted: 0 to 1000000000",
    );
    let args = mlp(&["--moves", "-3"]);
    fails_with(&args, "moves `-3`: out of range");
    // An unknown planner is named before the move count is judged.
    let args = mlp(&["--planner", "nosuch", "--moves", "10"]);
    fails_with(&args, "unknown planner `nosuch`");
    // A comparison whose planners count no moves rejects the count rather
    // than ignore it.
    fails_with(
        &[
            "compare",
            "--model",
            "mlp",
            "--device",
            "a100-40gb",
            "--budget",
            "50%",
            "--planners",
            "home,dtr",
            "--moves",
            "10",
        ],
        "`home`, `dtr` have no move count",
    );
    fails_with(&["simulate", "/nonexistent/plan.json"], "cannot read");
    fails_with(
        &["simulate", garbage.to_str().expect("utf8")],
        "not a valid outcore plan",
    );
    // A graph file given where a plan is asked for is named as one.
    let graph = temp("a_graph_not_a_plan.json");
    let graph = graph.to_str().expect("utf8");
    let out = outcore(&["export", "--model", "mlp", "-o", graph]);
    assert!(out.status.success(), "{out:?}");
    fails_with(&["verify", graph], "but a graph file (`outcore-graph/1`)");
}

#[test]
fn a_tampered_plan_is_refused() {
    let plan = temp("tampered.json");
    let p = plan.to_str().expect("utf8");
    let out = outcore(&[
        "plan",
        "--model",
        "mlp",
        "--device",
        "a100-40gb",
        "--budget",
        "100%",
        "--planner",
        "none",
        "-o",
        p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).expect("read")).expect("json");
    // Drop the first compute step: an op is never computed.
    doc["streams"][0]
        .as_array_mut()
        .expect("compute stream")
        .remove(0);
    std::fs::write(&plan, doc.to_string()).expect("write");
    fails_with(&["simulate", p], "fails verification");
    // A plan for another graph is refused by fingerprint.
    doc["graph"]["batch"] = Value::from(3);
    std::fs::write(&plan, doc.to_string()).expect("write");
    fails_with(&["simulate", p], "another graph");
}

/// Writes a plan of the mlp at 100% on an A100 and returns its path and JSON.
fn mlp_plan(name: &str) -> (PathBuf, Value) {
    let plan = temp(name);
    let out = outcore(&[
        "plan",
        "--model",
        "mlp",
        "--device",
        "a100-40gb",
        "--budget",
        "100%",
        "--planner",
        "none",
        "-o",
        plan.to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = serde_json::from_str(&std::fs::read_to_string(&plan).expect("read")).expect("json");
    (plan, doc)
}

#[test]
fn a_plans_device_is_validated_on_load() {
    let (plan, doc) = mlp_plan("device.json");
    let p = plan.to_str().expect("utf8");
    assert_eq!(doc["device"]["name"], "a100-40gb");
    let edited = |field: &str, value: Value| {
        let mut d = doc.clone();
        d["device"][field] = value;
        std::fs::write(&plan, d.to_string()).expect("write");
    };
    edited("h2d_bytes_per_s", Value::from(-1e9));
    fails_with(
        &["simulate", p],
        "`h2d_bytes_per_s` must be a positive rate",
    );
    edited("kernel_launch_s", Value::from(1e308));
    fails_with(
        &["simulate", p],
        "`kernel_launch_s` must be a time in [0, 1] seconds",
    );
    edited("memory_bytes", Value::from(1024));
    fails_with(&["simulate", p], "larger than the memory of its device");
    fails_with(
        &["run", "--plan", p, "--iters", "1"],
        "larger than the memory",
    );
}

#[test]
fn seconds_must_be_a_positive_finite_number() {
    for seconds in ["0", "-1", "NaN", "inf"] {
        fails_with(
            &[
                "compare",
                "--model",
                "mlp",
                "--device",
                "a100-40gb",
                "--budget",
                "100%",
                "--planners",
                "none",
                &format!("--seconds={seconds}"),
            ],
            "planner time limit (seconds)",
        );
    }
}

#[test]
fn simulate_exits_non_zero_exactly_when_the_plan_is_not_runnable() {
    // resnet18's window plan at 60% under the perfect allocator, then moved onto
    // best-fit by hand: simulate must say whether it still runs, by its exit code.
    let plan = temp("moved.json");
    let p = plan.to_str().expect("utf8");
    let out = outcore(&[
        "plan",
        "--model",
        "resnet18",
        "--batch",
        "16",
        "--device",
        "a100-40gb",
        "--budget",
        "60%",
        "--planner",
        "window",
        "--seconds",
        "2",
        "-o",
        p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).expect("read")).expect("json");
    doc["allocator"] = serde_json::json!({"kind": "best-fit"});
    std::fs::write(&plan, doc.to_string()).expect("write");
    let out = outcore(&["simulate", p, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(v["allocator"], "best-fit");
    let runnable = v["feasible"].as_bool().expect("feasible");
    assert_eq!(out.status.success(), runnable, "{v}");
    if !runnable {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("best-fit allocator"), "{stderr}");
        assert!(stderr.contains("largest free block"), "{stderr}");
    }
    // `plan` never writes a plan that its allocator cannot run.
    let out = outcore(&[
        "plan",
        "--model",
        "resnet18",
        "--batch",
        "16",
        "--device",
        "a100-40gb",
        "--budget",
        "60%",
        "--planner",
        "window",
        "--allocator",
        "best-fit",
        "--seconds",
        "2",
        "-o",
        p,
    ]);
    if out.status.success() {
        json_of(&["simulate", p, "--json"]);
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("best-fit allocator"), "{stderr}");
    }
}

#[test]
fn a_latency_table_from_run_feeds_plan_compare_and_simulate() {
    let table = temp("latency.json");
    let t = table.to_str().expect("utf8");
    let tiny = [
        "--model", "tiny-cnn", "--batch", "16", "--depth", "8", "--width", "8",
    ];
    let mut run = vec!["run"];
    run.extend(tiny);
    run.extend([
        "--budget",
        "40%",
        "--planner",
        "window",
        "--iters",
        "2",
        "--link-gbps",
        "1",
        "--profile-out",
        t,
        "--json",
    ]);
    let ran = json_of(&run);
    assert_eq!(ran["iters"], 2);
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&table).expect("table")).expect("json");
    assert_eq!(written["format"], "outcore-latency-table/1");
    assert!(
        written["copies"]["h2d_bytes_per_s"].is_number(),
        "{written}"
    );

    let plan = temp("measured-plan.json");
    let p = plan.to_str().expect("utf8");
    let target = [
        "--device",
        "a100-40gb",
        "--budget",
        "40%",
        "--latency-table",
        t,
    ];
    let mut args = vec!["plan"];
    args.extend(tiny);
    args.extend(target);
    args.extend(["--planner", "window", "-o", p]);
    let out = outcore(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args = vec!["compare"];
    args.extend(tiny);
    args.extend(target);
    args.extend(["--planners", "none,window", "--json"]);
    let c = json_of(&args);
    assert_eq!(c["results"].as_array().map(Vec::len), Some(2));
    let measured = json_of(&["simulate", p, "--latency-table", t, "--json"]);
    let roofline = json_of(&["simulate", p, "--json"]);
    // The measured CPU times are not the A100's roofline times.
    assert_ne!(measured["iter_time_s"], roofline["iter_time_s"]);
}

/// `bench-suite --allocator offsets`: plans are made for it (some feasible),
/// the result names the allocator, and an unknown allocator is refused.
#[test]
fn bench_suite_takes_an_allocator() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let run = |allocator: &str| {
        Command::new(env!("CARGO_BIN_EXE_outcore"))
            .args([
                "bench-suite",
                "--only",
                "mobilenet_v2",
                "--planners",
                "checkpoint-sqrt",
                "--allocator",
                allocator,
                "--json",
            ])
            .current_dir(&root)
            .output()
            .expect("outcore runs")
    };
    let out = run("offsets");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["allocator"], "offsets");
    let rows = v["rows"].as_array().expect("rows");
    // 2 graphs (zoo and PyTorch export) x 2 devices x 4 budgets x 1 planner.
    assert_eq!(rows.len(), 16);
    assert!(
        rows.iter().any(|r| r["status"] == "feasible"),
        "no feasible row: {v}"
    );
    let out = run("first-fit");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("first-fit") && err.contains("offsets"),
        "{err}"
    );
}

/// `bench-suite --retry-gap` and `--retry-seconds` come together, with a gap
/// above zero and a second search longer than the first; each refusal names
/// the value and what is accepted, before any case is planned.
#[test]
fn bench_suite_retry_flags_are_checked() {
    // clap's own message (several lines, with the usage) for a flag alone.
    let out = outcore(&["bench-suite", "--retry-gap", "0.1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--retry-seconds <RETRY_SECONDS>"));
    fails_with(
        &["bench-suite", "--retry-gap=0", "--retry-seconds", "50"],
        "--retry-gap 0: a fraction above the lower bound must be a finite number above 0",
    );
    fails_with(
        &["bench-suite", "--retry-gap", "NaN", "--retry-seconds", "50"],
        "--retry-gap NaN",
    );
    fails_with(
        &[
            "bench-suite",
            "--seconds",
            "5",
            "--retry-gap",
            "0.1",
            "--retry-seconds",
            "5",
        ],
        "--retry-seconds 5: the second search must be longer than the first (--seconds 5)",
    );
    fails_with(
        &[
            "bench-suite",
            "--retry-gap",
            "0.1",
            "--retry-seconds",
            "inf",
        ],
        "--retry-seconds",
    );
    // A retry's move count: only with a retry, and in range.
    let out = outcore(&["bench-suite", "--retry-moves", "5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--retry-gap <RETRY_GAP>"));
    fails_with(
        &[
            "bench-suite",
            "--retry-gap",
            "0.1",
            "--retry-seconds",
            "50",
            "--retry-moves",
            "-5",
        ],
        "--retry-moves: moves `-5`: out of range",
    );
    // The first searches' move count: in range, and not with a retry.
    fails_with(
        &["bench-suite", "--moves", "-5"],
        "--moves: moves `-5`: out of range",
    );
    fails_with(
        &["bench-suite", "--planners", "window,dtr", "--moves", "100"],
        "`window`, `dtr` have no move count",
    );
    let out = outcore(&[
        "bench-suite",
        "--moves",
        "5",
        "--retry-gap",
        "0.1",
        "--retry-seconds",
        "50",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--moves <N>") && err.contains("cannot be used with"),
        "{err}"
    );
}

/// `bench-suite` runs from the repository's root: for VGG-16 (the zoo model
/// and the PyTorch export) at four budgets on two devices it gives one row per
/// planner and case, and no feasible plan beats the case's lower bound.
#[test]
fn bench_suite_rows_respect_the_lower_bound() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args([
            "bench-suite",
            "--only",
            "vgg16",
            "--planners",
            "none,checkpoint-sqrt,vdnn-all",
            "--seconds",
            "1",
            "--json",
        ])
        .current_dir(&root)
        .output()
        .expect("outcore runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["skipped"].as_array().map(Vec::len), Some(0), "{v}");
    let rows = v["rows"].as_array().expect("rows");
    // 2 graphs x 2 devices x 4 budgets x 3 planners.
    assert_eq!(rows.len(), 48);
    let mut feasible = 0;
    for r in rows {
        if r["status"] == "feasible" {
            feasible += 1;
            let gap = r["gap_to_bound"]
                .as_f64()
                .expect("a feasible row has a gap");
            assert!(gap >= 0.0, "a plan below the lower bound: {r}");
        }
    }
    assert!(feasible > 0, "no feasible row: {v}");
}

/// With `--moves`, `outcore`'s search ends by its move count and does not
/// read `--seconds`: a millisecond and an hour give the same plan file, byte
/// for byte, and the plan records what bounded it. (On the clock, a
/// millisecond ends every seed of this case before any finds a plan.)
#[test]
fn a_search_bounded_by_moves_gives_the_same_plan_whatever_the_clock() {
    let plan = |seconds: &str| -> String {
        let path = temp(&format!("moves_{seconds}.json"));
        let p = path.to_str().expect("utf8");
        let out = outcore(&[
            "plan",
            "--model",
            "tiny-cnn",
            "--device",
            "v100-16gb-pcie3",
            "--budget",
            "60%",
            "--moves",
            "500",
            "--seconds",
            seconds,
            "-o",
            p,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(&path).expect("read")
    };
    let (short, long) = (plan("0.001"), plan("3600"));
    assert_eq!(short, long);
    let doc: Value = serde_json::from_str(&short).expect("json");
    assert_eq!(doc["planner"]["name"], "outcore");
    assert_eq!(
        doc["planner"]["settings"]["bounded_by"]["moves_per_start"],
        500
    );
}

#[test]
fn compare_with_no_plan_names_a_budget_under_which_one_exists() {
    // tiny-cnn at 20% of its footprint: `none` and `capuchin` have no plan;
    // the JSON's hint names a larger budget, and `plan` with the planner it
    // names writes a plan under it.
    let c = json_of(&[
        "compare",
        "--model",
        "tiny-cnn",
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "20%",
        "--planners",
        "none,capuchin",
        "--seconds",
        "1",
        "--json",
    ]);
    let budget = c["budget_bytes"].as_u64().unwrap();
    let hint = &c["budget_hint"];
    let hinted = hint["budget_bytes"].as_u64().expect("a hint");
    assert!(hinted > budget && hinted <= 4 * budget + 1, "{hint}");
    let planner = hint["planner"].as_str().unwrap();
    let path = temp("hinted.json");
    let out = outcore(&[
        "plan",
        "--model",
        "tiny-cnn",
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        &hinted.to_string(),
        "--planner",
        planner,
        "--seconds",
        "1",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Where a listed planner plans, no hint is computed.
    let c = json_of(&[
        "compare",
        "--model",
        "tiny-cnn",
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "100%",
        "--planners",
        "none",
        "--json",
    ]);
    assert!(c["budget_hint"].is_null(), "{}", c["budget_hint"]);
    // Nor for `ideal` alone (the bound's own list), whose plan ignores the budget.
    let c = json_of(&[
        "compare",
        "--model",
        "tiny-cnn",
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "20%",
        "--planners",
        "ideal",
        "--json",
    ]);
    assert!(c["budget_hint"].is_null(), "{}", c["budget_hint"]);
}
