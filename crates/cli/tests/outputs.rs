//! Bad input found by a review of 2026-12-05, end to end: a command that
//! fails never writes one of its output files first (an existing one keeps
//! its bytes), and flags or values it would have ignored or clamped are
//! refused by name.

use std::path::PathBuf;
use std::process::{Command, Output};

fn outcore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .output()
        .expect("outcore runs")
}

/// A clean refusal naming every needle.
fn refused(args: &[&str], needles: &[&str]) {
    let out = outcore(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: no `{needle}` in {stderr}"
        );
    }
}

/// `run` of tiny-cnn with nothing moved, under its whole footprint.
const TINY_RUN: [&str; 7] = [
    "run",
    "--model",
    "tiny-cnn",
    "--planner",
    "none",
    "--budget",
    "100%",
];

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outcore-outputs-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// An existing file with bytes of its own, and its path as text.
fn kept_file(dir: &std::path::Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    std::fs::write(&path, b"the user's own bytes").expect("write");
    let text = path.display().to_string();
    (path, text)
}

fn plan_file(dir: &std::path::Path) -> String {
    let path = dir.join("plan.json").display().to_string();
    let out = outcore(&[
        "plan",
        "--model",
        "tiny-cnn",
        "--device",
        "v100-16gb-pcie3",
        "--budget",
        "100%",
        "--planner",
        "none",
        "-o",
        &path,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

#[test]
fn report_with_a_file_as_its_svg_directory_writes_nothing() {
    let dir = temp_dir("svg");
    let plan = plan_file(&dir);
    let (html, html_text) = kept_file(&dir, "r.html");
    let (_, not_a_dir) = kept_file(&dir, "keep.json");
    refused(
        &[
            "report",
            "--plan",
            &plan,
            "-o",
            &html_text,
            "--svg-dir",
            &not_a_dir,
        ],
        &["--svg-dir", "cannot create the directory"],
    );
    assert_eq!(std::fs::read(&html).unwrap(), b"the user's own bytes");
}

#[test]
fn report_of_compare_output_refuses_a_latency_table() {
    let dir = temp_dir("report-lt");
    let out = dir.join("x.html").display().to_string();
    refused(
        &[
            "report",
            "--compare",
            "c.json",
            "-o",
            &out,
            "--latency-table",
            "/nonexistent",
        ],
        &[
            "--latency-table /nonexistent",
            "applies to a plan's report only",
        ],
    );
}

#[test]
fn run_with_a_directory_as_an_output_fails_before_writing_its_other_output() {
    let dir = temp_dir("run");
    let (trace, trace_text) = kept_file(&dir, "t.json");
    let profile = dir.display().to_string();
    let args = [
        &TINY_RUN[..],
        &[
            "--iters",
            "1",
            "--trace",
            &trace_text,
            "--profile-out",
            &profile,
        ],
    ]
    .concat();
    refused(&args, &["--profile-out", "is a directory"]);
    assert_eq!(std::fs::read(&trace).unwrap(), b"the user's own bytes");
    let missing = dir.join("no-such-dir").join("t.json").display().to_string();
    let args = [&TINY_RUN[..], &["--iters", "1", "--trace", &missing]].concat();
    refused(&args, &["--trace", "does not exist"]);
}

#[test]
fn simulate_with_a_directory_as_its_allocation_trace_writes_no_trace() {
    let dir = temp_dir("simulate");
    let plan = plan_file(&dir);
    let (trace, trace_text) = kept_file(&dir, "t.json");
    let alloc = dir.display().to_string();
    refused(
        &[
            "simulate",
            &plan,
            "--trace",
            &trace_text,
            "--alloc-trace",
            &alloc,
        ],
        &["--alloc-trace", "is a directory"],
    );
    assert_eq!(std::fs::read(&trace).unwrap(), b"the user's own bytes");
}

#[test]
fn a_knob_given_twice_is_refused() {
    refused(
        &[
            "stats", "--model", "tiny-cnn", "--depth", "4", "--depth", "3",
        ],
        &["knob `depth`", "given twice"],
    );
    refused(
        &[
            "stats", "--model", "tiny-cnn", "--knob", "depth=4", "--knob", "depth=4",
        ],
        &["knob `depth`", "given twice"],
    );
}

/// A negative or oversized value of a whole-number flag names the flag's
/// accepted range, where clap said "invalid digit found in string".
#[test]
fn whole_number_flags_name_their_range_for_a_negative_value() {
    let run = TINY_RUN;
    let cases: [(Vec<&str>, &str); 5] = [
        ([&run[..], &["--iters", "-1"]].concat(), "1 to 100000"),
        (
            [&run[..], &["--iters", "99999999999"]].concat(),
            "1 to 100000",
        ),
        (
            vec![
                "plan", "--model", "tiny-cnn", "--budget", "50%", "--seed", "-1",
            ],
            "0 to 18446744073709551615",
        ),
        (
            vec![
                "max-batch",
                "--model",
                "tiny-cnn",
                "--device",
                "v100-16gb-pcie3",
                "--limit",
                "-1",
            ],
            "1 to 16777216",
        ),
        (
            vec!["simulate", "p.json", "--iterations", "-1"],
            "1 to 1000",
        ),
    ];
    for (args, range) in cases {
        let flag = args[args.len() - 2];
        let value = args[args.len() - 1];
        refused(&args, &[flag, &format!("`{value}`"), range]);
    }
}

/// A latency table measured on one graph given with another is refused
/// naming both (its entries were ignored in silence, leaving the roofline
/// model the user asked to replace); on its own graph it prices the plan.
#[test]
fn a_latency_table_of_another_graph_is_refused() {
    let dir = temp_dir("latency-table");
    let table = dir.join("t.json").display().to_string();
    let run = outcore(&[
        "run",
        "--model",
        "tiny-cnn",
        "--planner",
        "none",
        "--budget",
        "200%",
        "--iters",
        "1",
        "--profile-out",
        &table,
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let plan = dir.join("p.json").display().to_string();
    let with = |model: &str| {
        outcore(&[
            "plan",
            "--model",
            model,
            "--device",
            "v100-16gb-pcie3",
            "--budget",
            "100%",
            "--planner",
            "none",
            "--latency-table",
            &table,
            "-o",
            &plan,
        ])
    };
    assert!(with("tiny-cnn").status.success());
    for args in [
        vec![
            "plan",
            "--model",
            "resnet18",
            "--device",
            "v100-16gb-pcie3",
            "--budget",
            "100%",
            "--planner",
            "none",
            "--latency-table",
            &table,
            "-o",
            &plan,
        ],
        vec![
            "compare",
            "--model",
            "tiny-cnn",
            "--depth",
            "2",
            "--device",
            "v100-16gb-pcie3",
            "--budget",
            "100%",
            "--planners",
            "none",
            "--latency-table",
            &table,
        ],
    ] {
        refused(
            &args,
            &["latency table of `tiny-cnn`", "was taken on another graph"],
        );
    }
}

/// A plan given to `report --compare` is named as a plan, with the flag
/// that reports it.
#[test]
fn report_of_compare_output_names_a_plan_given_instead() {
    let dir = temp_dir("report-plan");
    let plan = plan_file(&dir);
    let out = dir.join("x.html").display().to_string();
    refused(
        &["report", "--compare", &plan, "-o", &out],
        &[
            "a `outcore-plan/1` file, not compare's output",
            "--plan FILE",
        ],
    );
}
