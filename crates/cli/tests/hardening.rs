//! Issue 15 ("Hardening"), end to end: one test per row of the issue's table and
//! per "also found" item, named after it. Each gives the input a tester gave and
//! asserts a clean, non-zero refusal naming the flag or field, the value and the
//! accepted range (or, where the input is fine, the corrected behaviour).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn outcore_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("outcore runs")
}

fn outcore(args: &[&str]) -> Output {
    outcore_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A clean refusal: non-zero exit, no panic or abort, an `error:` line with
/// every needle in it.
fn refused(args: &[&str], needles: &[&str]) {
    let out = outcore(args);
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    // 1 is ours, 2 is clap's usage error; an abort is 134, a signal has none.
    assert!(
        matches!(out.status.code(), Some(1 | 2)),
        "{args:?}: exit {:?}: {stderr}",
        out.status.code()
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: expected `{needle}` in: {stderr}"
        );
    }
}

fn json_of(args: &[&str]) -> Value {
    let out = outcore(args);
    assert!(out.status.success(), "{args:?} failed: {}", stderr_of(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// A fresh directory for one test's files.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outcore-hardening-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn example_graph(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../graph/tests/data")
        .join(name);
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

const TINY: [&str; 8] = [
    "--model", "tiny-cnn", "--batch", "16", "--depth", "8", "--width", "8",
];

fn tiny_run(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run"].iter().map(|s| s.to_string()).collect();
    args.extend(TINY.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn refused_owned(args: &[String], needles: &[&str]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(&args, needles);
}

/// A tiny-cnn plan for v100-16gb-pcie3 at 40%, written into `dir`.
fn v100_plan(dir: &Path) -> PathBuf {
    let path = dir.join("tp.json");
    let p = path.to_str().expect("utf8");
    let mut args = vec!["plan"];
    args.extend(TINY);
    args.extend([
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "40%",
        "--planner",
        "window",
        "-o",
        p,
    ]);
    let out = outcore(&args);
    assert!(out.status.success(), "plan: {}", stderr_of(&out));
    path
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    edit(&mut doc);
    std::fs::write(path, doc.to_string()).expect("write");
}

// ----- the table's rows -----

#[test]
fn row_abort_run_budget_over_memory() {
    // More than any test machine has: an error, not "memory allocation failed".
    refused_owned(
        &tiny_run(&["--planner", "window", "--budget", "100TiB", "--iters", "2"]),
        &["host memory", "--budget"],
    );
}

#[test]
fn row_silent_wrong_stats_batch_overflow() {
    refused(
        &[
            "stats",
            "--model",
            "resnet50",
            "--batch",
            "18446744073709551615",
        ],
        &["batch 18446744073709551615", "1 to 16777216"],
    );
    refused(
        &["stats", "--model", "resnet50", "--batch", "300000000000"],
        &["batch 300000000000", "out of range"],
    );
    // Within the batch bound, a product that would wrap is an error too.
    refused(
        &[
            "stats", "--model", "mlp", "--hidden", "1048576", "--batch", "16777216",
        ],
        &["overflows 64 bits", "lower --batch"],
    );
    // FLOPs grow with the batch up to the bound, never wrap back down.
    let flops = |batch: &str| {
        let v = json_of(&["stats", "--model", "resnet50", "--batch", batch, "--json"]);
        v["flops_by_phase"]["forward"]
            .as_u64()
            .expect("forward flops")
    };
    let (small, large) = (flops("1024"), flops("16777216"));
    assert!(large > small * 16000, "{small} vs {large}");
}

#[test]
fn row_unclear_mlp_hidden_wraps_to_zero() {
    refused(
        &["stats", "--model", "mlp", "--hidden", "4294967296"],
        &["knob `hidden` = 4294967296", "1 to 1048576"],
    );
}

#[test]
fn row_silent_wrong_plan_device_negative_rate() {
    let dir = temp_dir("negative-rate");
    let plan = v100_plan(&dir);
    edit_json(&plan, |d| {
        d["device"]["h2d_bytes_per_s"] = Value::from(-1e9)
    });
    refused(
        &["simulate", plan.to_str().expect("utf8")],
        &["h2d_bytes_per_s", "-1000000000"],
    );
}

#[test]
fn row_unclear_zero_bandwidth_or_huge_launch_time() {
    let dir = temp_dir("zero-bandwidth");
    let plan = v100_plan(&dir);
    let p = plan.to_str().expect("utf8");
    edit_json(&plan, |d| d["device"]["h2d_bytes_per_s"] = Value::from(0.0));
    refused(&["simulate", p], &["h2d_bytes_per_s"]);
    let out = outcore(&["simulate", p]);
    assert!(!stderr_of(&out).contains("deadlock"), "{}", stderr_of(&out));
    let plan = v100_plan(&dir);
    edit_json(&plan, |d| {
        d["device"]["kernel_launch_s"] = Value::from(1e308)
    });
    refused(&["simulate", p], &["kernel_launch_s", "[0, 1] seconds"]);
}

#[test]
fn row_silent_wrong_synthetic_flops_not_positive() {
    for flops in ["-1e9", "0"] {
        refused_owned(
            &tiny_run(&[
                "--planner",
                "window",
                "--budget",
                "40%",
                "--iters",
                "2",
                "--synthetic",
                &format!("--synthetic-flops={flops}"),
            ]),
            &["synthetic kernel speed", "(0, 1e18]"],
        );
    }
}

#[test]
fn row_silent_accept_graph_with_zero_ops() {
    let dir = temp_dir("zero-ops");
    let graph = dir.join("empty.json");
    std::fs::write(
        &graph,
        r#"{"format":"outcore-graph/1","meta":{"model":"empty","batch":1,"optimizer":"none","source":"test"},"tensors":[],"ops":[]}"#,
    )
    .expect("write");
    let g = graph.to_str().expect("utf8");
    refused(&["stats", "--graph", g], &["has no ops"]);
    refused(
        &[
            "compare",
            "--graph",
            g,
            "--device",
            "a100-40gb",
            "--budget",
            "1GiB",
            "--planners",
            "ideal",
        ],
        &["has no ops"],
    );
    refused(
        &[
            "run",
            "--graph",
            g,
            "--budget",
            "1MiB",
            "--planner",
            "none",
            "--iters",
            "1",
        ],
        &["has no ops"],
    );
}

#[test]
fn row_workflow_run_plan_made_for_another_device() {
    let dir = temp_dir("other-device");
    let plan = v100_plan(&dir);
    refused(
        &[
            "run",
            "--plan",
            plan.to_str().expect("utf8"),
            "--iters",
            "2",
        ],
        &["v100-16gb-pcie3", "cpu backend", "--device cpu-reference"],
    );
}

/// The other half of the workflow row: a command now writes a plan the cpu
/// backend runs (`plan --device cpu-reference`), under every allocator, and
/// `run --plan` runs it.
#[test]
fn row_workflow_plan_for_the_cpu_backend_runs() {
    let dir = temp_dir("cpu-plan");
    for allocator in ["perfect", "size-class", "best-fit"] {
        let path = dir.join(format!("cpu-{allocator}.json"));
        let p = path.to_str().expect("utf8");
        let mut args = vec!["plan"];
        args.extend(TINY);
        args.extend([
            "--device",
            "cpu-reference",
            "--budget",
            "40%",
            "--planner",
            "window",
            "--allocator",
            allocator,
            "-o",
            p,
        ]);
        let out = outcore(&args);
        assert!(out.status.success(), "plan: {}", stderr_of(&out));
        let ran = json_of(&["run", "--plan", p, "--iters", "2", "--json"]);
        // A `perfect` plan runs laid out at exact offsets (`outcore::run`).
        let expected = if allocator == "perfect" {
            "offsets"
        } else {
            allocator
        };
        assert_eq!(ran["allocator"], expected);
        assert_eq!(ran["iters"], 2);
        assert_eq!(ran["predicted_device"], "cpu-reference");
    }
}

/// Also found: `run --allocator size-class` at 40% planned a pool the
/// executor then ran out of (it issued compute steps ahead of the frees the
/// simulator had sized the pool with). The executor now issues in the
/// simulator's start order, so the pool fits.
#[test]
fn also_found_run_size_class_at_40_percent_runs() {
    let ran = json_of(
        &tiny_run(&[
            "--planner",
            "window",
            "--budget",
            "40%",
            "--allocator",
            "size-class",
            "--iters",
            "2",
            "--check",
            "--json",
        ])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert_eq!(ran["allocator"], "size-class");
    assert_eq!(ran["checks_passed"], true);
    assert!(ran["swap_in_bytes"].as_u64().expect("bytes") > 0, "{ran}");
}

/// Long runs can be interrupted cleanly: SIGINT (Ctrl-C) stops `run` between
/// iterations with exit code 130, an error line saying how far it got, and no
/// output written.
#[test]
fn also_found_ctrl_c_stops_a_long_run_cleanly() {
    let dir = temp_dir("ctrl-c");
    let table = dir.join("latencies.json");
    let mut args = tiny_run(&["--planner", "window", "--budget", "40%", "--iters", "10000"]);
    args.extend(["--profile-out".to_string(), table.display().to_string()]);
    let child = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("outcore starts");
    // Let it get past planning into the iterations (a tiny-cnn iteration takes
    // about a second on the cpu backend; nothing depends on the exact moment).
    std::thread::sleep(std::time::Duration::from_secs(3));
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = child.wait_with_output().expect("outcore ends");
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted after"), "{stderr}");
    assert!(stderr.contains("of 10000 iterations"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed: {:?}", out.stdout);
    assert!(!table.exists(), "no latency table written");
}

#[test]
fn row_ignored_flags_are_errors() {
    let vgg = example_graph("vgg16_b32.json");
    let g = vgg.to_str().expect("utf8");
    refused(
        &["stats", "--graph", g, "--batch", "64"],
        &["--batch", "--graph"],
    );
    refused(
        &["stats", "--graph", g, "--depth", "5"],
        &["--depth 5", "--graph"],
    );
    refused(
        &["stats", "--graph", g, "--optimizer", "adam"],
        &["--optimizer", "--graph"],
    );
    let dir = temp_dir("ignored-flags");
    let plan = v100_plan(&dir);
    let p = plan.to_str().expect("utf8");
    refused(&["run", "--plan", p, "--budget", "10%"], &["--budget"]);
    refused(&["run", "--plan", p, "--planner", "lms"], &["--planner"]);
    refused_owned(
        &tiny_run(&["--planner", "window", "--budget", "40%", "--chunk-kib", "0"]),
        &["--chunk-kib 0", "virtual-chunks"],
    );
    refused_owned(
        &tiny_run(&[
            "--planner",
            "window",
            "--budget",
            "40%",
            "--allocator",
            "best-fit",
            "--chunk-kib",
            "64",
        ]),
        &["--chunk-kib 64", "does not apply to --allocator best-fit"],
    );
    refused(
        &["simulate", p, "--iterations", "0"],
        &["--iterations", "`0`", "[1, 1000]"],
    );
}

#[test]
fn row_unclear_budget_inf_nan_and_negative_batch() {
    for budget in ["1e400%", "inf%", "NaN%", "-5%"] {
        refused_owned(
            &tiny_run(&["--planner", "window", "--budget", budget, "--iters", "2"]),
            &[
                &format!("budget `{budget}`"),
                "out of range",
                "(0, 100000]%",
            ],
        );
    }
    refused(
        &["stats", "--model", "resnet50", "--batch", "-1"],
        &["'-1'", "--batch"],
    );
}

#[test]
fn row_hang_refused_with_the_prediction() {
    // Each is refused with the bound it breaks, before anything runs (the
    // messages name the prediction or the flag's range, not a run's outcome).
    refused_owned(
        &tiny_run(&[
            "--planner",
            "window",
            "--budget",
            "40%",
            "--iters",
            "2",
            "--link-gbps",
            "1e-9",
        ]),
        &["predicted", "--link-gbps", "3600 s"],
    );
    refused_owned(
        &tiny_run(&[
            "--planner",
            "window",
            "--budget",
            "40%",
            "--iters",
            "1000000",
        ]),
        &["--iters", "1000000", "[1, 100000]"],
    );
    let dir = temp_dir("hang");
    let plan = v100_plan(&dir);
    refused(
        &[
            "simulate",
            plan.to_str().expect("utf8"),
            "--iterations",
            "100000000",
        ],
        &["--iterations", "100000000", "[1, 1000]"],
    );
}

#[test]
fn row_huge_memory_knob_bounds_and_format_first() {
    refused(
        &["stats", "--model", "gpt2", "--layers", "100000"],
        &["knob `layers` = 100000", "1 to 1000"],
    );
    refused(
        &[
            "stats", "--model", "lstm", "--layers", "1000", "--seq", "65536",
        ],
        &["unrolled cells", "at most 100000"],
    );
    // A large document without a format is refused by its format, read without
    // building the arrays.
    let dir = temp_dir("format-first");
    let path = dir.join("arrays.json");
    let zeros = vec!["0"; 2_000_000].join(",");
    std::fs::write(&path, format!(r#"{{"tensors":[{zeros}],"ops":[{zeros}]}}"#)).expect("write");
    refused(
        &["stats", "--graph", path.to_str().expect("utf8")],
        &["unsupported format `<missing>`"],
    );
}

#[test]
fn row_unclear_chunk_larger_than_the_arena() {
    refused_owned(
        &tiny_run(&[
            "--planner",
            "window",
            "--budget",
            "40%",
            "--allocator",
            "virtual-chunks",
            "--chunk-kib",
            "18014398509481983",
        ]),
        &["--chunk-kib", "18014398509481983", "larger than the"],
    );
}

#[test]
fn row_surprising_export_to_stdout() {
    let dir = temp_dir("export-dash");
    let out = outcore_in(&dir, &["export", "--model", "tiny-cnn", "-o", "-"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is the graph JSON");
    assert_eq!(doc["format"], "outcore-graph/1");
    assert!(!dir.join("-").exists(), "a file named `-` was written");
}

#[test]
fn row_minor_simulate_refuses_budget_over_device() {
    let dir = temp_dir("budget-over-device");
    let plan = v100_plan(&dir);
    edit_json(&plan, |d| {
        let memory = d["device"]["memory_bytes"].as_u64().expect("memory");
        d["budget_bytes"] = Value::from(memory * 100);
    });
    refused(
        &["simulate", plan.to_str().expect("utf8")],
        &["larger than the memory of its device"],
    );
}

#[test]
fn row_minor_alias_of_named_and_bom_accepted() {
    let dir = temp_dir("alias-bom");
    let text = std::fs::read_to_string(example_graph("vgg16_b32.json")).expect("read");
    let mut doc: Value = serde_json::from_str(&text).expect("json");
    let tensors = doc["tensors"].as_array_mut().expect("tensors");
    let view = tensors
        .iter_mut()
        .find(|t| !t["alias_of"].is_null())
        .expect("the example graph has a view");
    view["alias_of"] = Value::from(999_999);
    let bad = dir.join("bad-alias.json");
    std::fs::write(&bad, doc.to_string()).expect("write");
    let out = outcore(&["stats", "--graph", bad.to_str().expect("utf8")]);
    let stderr = stderr_of(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("`alias_of` refers to 999999"), "{stderr}");
    assert!(!stderr.contains("view_of"), "{stderr}");

    // A UTF-8 byte order mark before a graph and before a plan.
    let bom_graph = dir.join("bom-graph.json");
    std::fs::write(&bom_graph, format!("\u{feff}{text}")).expect("write");
    let v = json_of(&[
        "stats",
        "--graph",
        bom_graph.to_str().expect("utf8"),
        "--json",
    ]);
    // The file's 237 ops and the two dropout mask draws the importer splits off.
    assert_eq!(v["n_ops"], 239);
    let plan = v100_plan(&dir);
    let plan_text = std::fs::read_to_string(&plan).expect("read");
    std::fs::write(&plan, format!("\u{feff}{plan_text}")).expect("write");
    let v = json_of(&["simulate", plan.to_str().expect("utf8"), "--json"]);
    assert_eq!(v["feasible"], true);
}

// ----- "also found" -----

#[test]
fn also_found_example_graphs_are_in_the_repository() {
    for name in ["vgg16_b32.json", "mobilenet_v2_b64.json"] {
        let v = json_of(&[
            "stats",
            "--graph",
            example_graph(name).to_str().expect("utf8"),
            "--json",
        ]);
        assert!(v["n_ops"].as_u64().is_some_and(|n| n > 0), "{name}");
    }
}

#[test]
fn also_found_verify_command() {
    let dir = temp_dir("verify");
    let plan = v100_plan(&dir);
    let p = plan.to_str().expect("utf8");
    let v = json_of(&["verify", p, "--json"]);
    assert_eq!(v["passed"], true);
    assert_eq!(v["violation_count"], 0);
    // Drop every free and swap of the plan: what it reads later is then stale or
    // its memory exceeds the budget.
    edit_json(&plan, |d| {
        let streams = d["streams"].as_array_mut().expect("streams");
        for stream in streams.iter_mut().skip(1) {
            stream.as_array_mut().expect("steps").clear();
        }
    });
    let out = outcore(&["verify", p]);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("fails verification"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("FAILED"),
        "violations are listed"
    );
}

#[test]
fn also_found_one_allocator_vocabulary() {
    // alloc-replay names why `perfect` does not apply to it.
    let dir = temp_dir("vocabulary");
    let plan = v100_plan(&dir);
    let trace = dir.join("alloc.json");
    let out = outcore(&[
        "simulate",
        plan.to_str().expect("utf8"),
        "--alloc-trace",
        trace.to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let t = trace.to_str().expect("utf8");
    refused(
        &["alloc-replay", t, "--allocator", "perfect"],
        &[
            "does not apply to alloc-replay",
            "best-fit, best-fit-paged, size-class or virtual-chunks",
        ],
    );
    // Nor does `offsets`: a layout is made for one plan's allocations.
    refused(
        &["alloc-replay", t, "--allocator", "offsets"],
        &["does not apply to alloc-replay", "one plan's allocations"],
    );
    for allocator in ["best-fit", "best-fit-paged", "size-class", "virtual-chunks"] {
        json_of(&["alloc-replay", t, "--allocator", allocator, "--json"]);
    }
    // Unknown names list the same six everywhere.
    let names = "perfect, best-fit, best-fit-paged, size-class, virtual-chunks, offsets";
    refused(&["alloc-replay", t, "--allocator", "buddy"], &[names]);
    refused_owned(
        &tiny_run(&[
            "--planner",
            "none",
            "--budget",
            "100%",
            "--allocator",
            "buddy",
        ]),
        &[names],
    );
    let mut plan_args = vec!["plan"];
    plan_args.extend(TINY);
    plan_args.extend([
        "--device",
        "a100-40gb",
        "--budget",
        "100%",
        "--planner",
        "none",
        "--allocator",
        "buddy",
        "-o",
        "unused.json",
    ]);
    refused(&plan_args, &[names]);
    // `run` plans under size-class, sizing its pool, as `plan` does.
    let ran = json_of(
        &tiny_run(&[
            "--planner",
            "none",
            "--budget",
            "200%",
            "--allocator",
            "size-class",
            "--iters",
            "1",
            "--json",
        ])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert_eq!(ran["allocator"], "size-class");
}

#[test]
fn also_found_run_planner_has_help() {
    let out = outcore(&["run", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = help.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("--planner"))
        .expect("--planner is listed");
    // Long help puts the text on the flag's line or the next.
    let text = format!("{} {}", lines[at], lines.get(at + 1).unwrap_or(&""));
    assert!(text.contains("Planner name"), "{text}");
}

#[test]
fn also_found_simulate_has_no_planner_time() {
    let dir = temp_dir("planner-time");
    let plan = v100_plan(&dir);
    let v = json_of(&["simulate", plan.to_str().expect("utf8"), "--json"]);
    assert!(v["planner_time_s"].is_null(), "{v}");
    assert!(
        v["simulate_time_s"].as_f64().is_some_and(|t| t > 0.0),
        "{v}"
    );
}

#[test]
fn also_found_run_names_its_device_and_both_peaks() {
    let args = tiny_run(&[
        "--planner",
        "window",
        "--budget",
        "60%",
        "--iters",
        "1",
        "--json",
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = json_of(&args);
    assert_eq!(v["predicted_device"], "cpu-reference");
    let budget = v["budget_bytes"].as_u64().expect("budget");
    let peak = v["predicted_peak_bytes"].as_u64().expect("plan's peak");
    let high_water = v["arena_high_water_bytes"].as_u64().expect("high water");
    assert!(peak > 0 && peak <= budget, "{peak} of {budget}");
    assert!(
        high_water > 0 && high_water <= budget,
        "{high_water} of {budget}"
    );
    let mut text_args = args.clone();
    text_args.pop();
    let out = outcore(&text_args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("device profile `cpu-reference`"), "{text}");
    assert!(text.contains("arena high-water mark"), "{text}");
}

#[test]
fn row_minor_bom_accepted_in_every_json_input() {
    let dir = temp_dir("bom-everywhere");
    let with_bom = |path: &Path| {
        let text = std::fs::read_to_string(path).expect("read");
        std::fs::write(path, format!("\u{feff}{text}")).expect("write");
    };
    // An allocation trace.
    let plan = v100_plan(&dir);
    let trace = dir.join("alloc.json");
    let out = outcore(&[
        "simulate",
        plan.to_str().expect("utf8"),
        "--alloc-trace",
        trace.to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    with_bom(&trace);
    json_of(&[
        "alloc-replay",
        trace.to_str().expect("utf8"),
        "--allocator",
        "best-fit",
        "--json",
    ]);
    // A device profile, then a latency table.
    let device = dir.join("device.json");
    let plan_doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).expect("read")).expect("json");
    std::fs::write(&device, plan_doc["device"].to_string()).expect("write");
    with_bom(&device);
    let table = dir.join("table.json");
    let mut run = tiny_run(&["--planner", "none", "--budget", "200%", "--iters", "1"]);
    run.extend(["--profile-out".to_string(), table.display().to_string()]);
    let args: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = outcore(&args);
    assert!(out.status.success(), "{}", stderr_of(&out));
    with_bom(&table);
    let mut args = vec!["plan"];
    args.extend(TINY);
    let out_plan = dir.join("bom-plan.json");
    args.extend([
        "--device",
        device.to_str().expect("utf8"),
        "--budget",
        "40%",
        "--planner",
        "window",
        "--latency-table",
        table.to_str().expect("utf8"),
        "-o",
        out_plan.to_str().expect("utf8"),
    ]);
    let out = outcore(&args);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// A negative number given to a numeric flag is a value: it reaches the
/// range check that names the flag, the value and what is accepted, where
/// clap refused it as an "unexpected argument '-1'".
#[test]
fn also_found_negative_numbers_reach_the_range_check() {
    // Refused before planning, so nothing is written; a regression writes
    // into the test's own directory, not the repository.
    let out_path = temp_dir("negative-numbers").join("x.json");
    let mut args = vec!["plan"];
    args.extend(TINY);
    args.extend([
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "50%",
        "-o",
        out_path.to_str().expect("utf8"),
    ]);
    let mut seconds = args.clone();
    seconds.extend(["--seconds", "-1"]);
    refused(
        &seconds,
        &["planner time limit (seconds)", "`-1`", "positive, finite"],
    );
    let mut moves = args.clone();
    moves.extend(["--planner", "outcore", "--moves", "-4"]);
    refused(&moves, &["moves", "`-4`", "0 to 1000000000"]);
    let mut run = tiny_run(&["--planner", "dtr", "--budget", "50%", "--iters", "1"]);
    run.extend(["--link-gbps".to_string(), "-2".to_string()]);
    refused_owned(&run, &["link rate", "out of range"]);
}
