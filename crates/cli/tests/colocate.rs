//! `outcore colocate` end to end: a job list with a zoo model and a
//! PyTorch-exported graph file, its JSON result, and bad input as one-line
//! errors with a non-zero exit.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn outcore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .output()
        .expect("outcore runs")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outcore-colocate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Writes a job list with `jobs` and returns its path.
fn job_list(name: &str, jobs: &str) -> String {
    let path = temp(name);
    let text = format!("{{\"format\": \"outcore-jobs/1\", \"jobs\": [{jobs}]}}");
    std::fs::write(&path, text).expect("write job list");
    path.display().to_string()
}

fn example_graph(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../graph/tests/data")
        .join(name);
    assert!(path.is_file(), "{} is missing", path.display());
    path.display().to_string()
}

/// Asserts a clean failure: non-zero exit, one `error:` line naming `needle`.
fn fails_with(args: &[&str], needle: &str) {
    let out = outcore(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected `{needle}` in: {stderr}"
    );
}

#[test]
fn a_zoo_model_and_a_graph_file_share_a_device() {
    let graph = example_graph("mobilenet_v2_w025_b8_s64.json");
    let jobs = job_list(
        "two.json",
        &format!(
            "{{\"name\": \"cnn\", \"model\": \"tiny-cnn\", \"batch\": 16, \"planner\": \"checkpoint-sqrt\", \"budget\": \"70%\", \"iterations\": 20}},
             {{\"name\": \"mbv2\", \"graph\": {graph:?}, \"planner\": \"none\", \"iterations\": 2, \"arrival_s\": 0.0002}}"
        ),
    );
    let trace = temp("trace.json");
    let trace_arg = trace.display().to_string();
    let out = outcore(&[
        "colocate",
        &jobs,
        "--device",
        "v100-16gb-pcie3",
        "--trace",
        &trace_arg,
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let jobs = v["report"]["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        jobs[0]["per_iteration_time_s"].as_array().map(Vec::len),
        Some(20)
    );
    assert_eq!(jobs[1]["start_s"], 0.0002);
    let peak = v["report"]["peak_live_bytes"].as_u64().expect("peak");
    let own: u64 = jobs
        .iter()
        .map(|j| j["peak_live_bytes"].as_u64().unwrap_or(0))
        .sum();
    // Together at most the sum of each job's own peak, and at least the larger.
    assert!(peak <= own, "{peak} > {own}");
    assert!(
        jobs.iter()
            .all(|j| j["peak_live_bytes"].as_u64() <= Some(peak))
    );
    assert!(v["metrics"]["global"]["msr"].is_number());
    // Planned at 70% of its footprint, the tiny CNN saves memory.
    assert!(v["jobs"][0]["msr"].as_f64() > Some(0.0), "{}", v["jobs"][0]);

    // The trace: a track group per job, named after it.
    let text = std::fs::read_to_string(&trace).expect("trace written");
    let doc: Value = serde_json::from_str(&text).expect("trace is JSON");
    let groups: Vec<&str> = doc["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert_eq!(groups, ["device", "job cnn", "job mbv2"]);

    // They overlap: together they hold more than either alone.
    let largest = jobs
        .iter()
        .filter_map(|j| j["peak_live_bytes"].as_u64())
        .max();
    assert!(Some(peak) > largest, "{peak} vs {largest:?}");

    // Room for each job's plan but not for both at once: reported, and a
    // non-zero exit.
    let budget = v["jobs"][1]["plan_budget_bytes"]
        .as_u64()
        .expect("budget")
        .to_string();
    let path = jobs_path("two.json");
    let out = outcore(&[
        "colocate",
        &path,
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        &budget,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stdout.contains("OVER BUDGET"), "{stdout}");
    assert!(stderr.contains("they share"), "{stderr}");
}

fn jobs_path(name: &str) -> String {
    temp(name).display().to_string()
}

#[test]
fn bad_job_lists_are_one_line_errors() {
    let ok = "{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 1}";
    let missing = jobs_path("missing.json");
    fails_with(
        &["colocate", &missing, "--device", "v100-16gb-pcie3"],
        "cannot read",
    );
    let two = job_list("dup.json", &format!("{ok}, {ok}"));
    fails_with(
        &["colocate", &two, "--device", "v100-16gb-pcie3"],
        "two jobs are named `a`",
    );
    let late = job_list(
        "late.json",
        "{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 1, \"arrival_s\": -1}",
    );
    fails_with(
        &["colocate", &late, "--device", "v100-16gb-pcie3"],
        "at least 0 s",
    );
    let never = job_list(
        "never.json",
        "{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 1, \"arrival_s\": 1e20}",
    );
    fails_with(
        &["colocate", &never, "--device", "v100-16gb-pcie3"],
        "job `a` arrives at 100000000000000000000 s; an arrival time must be at least 0 s and at most 1e6 s",
    );
    // A graph file fixes its optimizer: one named beside it is refused, not
    // ignored.
    let graph = example_graph("mobilenet_v2_w025_b8_s64.json");
    let with_optimizer = job_list(
        "graph-optimizer.json",
        &format!(
            "{{\"name\": \"g\", \"graph\": {graph:?}, \"optimizer\": \"adam\", \"planner\": \"none\", \"iterations\": 1}}"
        ),
    );
    fails_with(
        &["colocate", &with_optimizer, "--device", "v100-16gb-pcie3"],
        "none of those beside it",
    );
    let one = job_list("one.json", ok);
    fails_with(
        &["colocate", &one, "--device", "no-such-gpu"],
        "no-such-gpu",
    );
    fails_with(
        &[
            "colocate",
            &one,
            "--device",
            "v100-16gb-pcie3",
            "--budget",
            "-3",
        ],
        "-3",
    );
}

#[test]
fn tensile_over_all_jobs_beside_per_job_baselines() {
    let jobs = job_list(
        "tensile.json",
        "{\"name\": \"a\", \"model\": \"resnet18\", \"batch\": 8, \"planner\": \"none\", \"iterations\": 2},
         {\"name\": \"b\", \"model\": \"resnet18\", \"batch\": 8, \"planner\": \"none\", \"iterations\": 2, \"arrival_s\": 0.01}",
    );
    let out = outcore(&[
        "colocate",
        &jobs,
        "--device",
        "v100-16gb-pcie3",
        "--tensile",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    for (group, planner) in [
        ("tensile", "tensile-multi"),
        ("capuchin", "capuchin"),
        ("vdnn_conv", "vdnn-conv"),
    ] {
        let rows = v[group]["jobs"].as_array().expect("rows");
        assert_eq!(rows.len(), 2, "{group}");
        assert_eq!(rows[0]["planner"], planner);
        // Every baseline plans each job at the bound TENSILE's plan proves.
        assert_eq!(
            rows[1]["plan_budget_bytes"],
            v["tensile"]["jobs"][1]["plan_budget_bytes"]
        );
        let eor = v[group]["metrics"]["global"]["eor"].as_f64().expect("eor");
        assert!(eor.is_finite() && eor > 0.0, "{group}: {eor}");
    }
    // A max swapping rate of 0 is refused, naming the job and the range.
    let zero = job_list(
        "zero.json",
        "{\"name\": \"z\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 1, \"priority\": 0}",
    );
    fails_with(
        &[
            "colocate",
            &zero,
            "--device",
            "v100-16gb-pcie3",
            "--tensile",
        ],
        "priority of job `z`",
    );
}
