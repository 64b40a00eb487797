//! `outcore max-batch` end to end on tiny-cnn (fast): each planner's answer is
//! cross-checked with `outcore compare` at the answer and one batch above it,
//! and bad input gives a one-line error and a non-zero exit.

use serde_json::Value;
use std::process::{Command, Output};

fn outcore(args: &[&str]) -> Output {
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

const BUDGET: &str = "4MB";

/// Whether `planner` plans tiny-cnn at `batch` under the budget, per `compare`.
fn compare_feasible(planner: &str, batch: u64) -> bool {
    let batch = batch.to_string();
    let c = json_of(&[
        "compare",
        "--model",
        "tiny-cnn",
        "--batch",
        &batch,
        "--device",
        "rtx2080ti-11gb",
        "--budget",
        BUDGET,
        "--planners",
        planner,
        "--json",
    ]);
    c["results"][0]["feasible"]
        .as_bool()
        .expect("feasible is a bool")
}

#[test]
fn max_batch_agrees_with_compare_at_the_answer_and_one_above() {
    let r = json_of(&[
        "max-batch",
        "--model",
        "tiny-cnn",
        "--device",
        "rtx2080ti-11gb",
        "--budget",
        BUDGET,
        "--planners",
        "none,capuchin",
        "--seconds",
        "5",
        "--json",
    ]);
    assert_eq!(r["budget_bytes"], 4_000_000);
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    for row in rows {
        let planner = row["planner"].as_str().expect("planner");
        let max = row["max_batch"].as_u64().expect("some batch plans");
        let above = row["first_infeasible_batch"]
            .as_u64()
            .expect("4 MB runs out well below the limit");
        // Bisection ends on adjacent batches.
        assert_eq!(above, max + 1, "{planner}: {row}");
        assert!(compare_feasible(planner, max), "{planner} at {max}");
        assert!(!compare_feasible(planner, above), "{planner} at {above}");
        let time_s = row["iter_time_s"].as_f64().expect("time");
        let throughput = row["throughput_samples_per_s"].as_f64().expect("tput");
        assert!((throughput - max as f64 / time_s).abs() <= 1e-9 * throughput);
    }
}

#[test]
fn max_batch_bad_input_is_a_one_line_error() {
    let base = [
        "max-batch",
        "--model",
        "tiny-cnn",
        "--device",
        "rtx2080ti-11gb",
    ];
    let cases: [(&[&str], &str); 6] = [
        (&["--budget", "0"], "must be positive"),
        (&["--budget", "50%"], "does not apply to max-batch"),
        (&["--budget", "20GB"], "larger than rtx2080ti-11gb's memory"),
        (&["--planners", "nope"], "unknown planner `nope`"),
        (&["--limit", "0"], "batch limit (--limit) `0`"),
        (&["--knob", "depth=0"], "depth"),
    ];
    for (extra, needle) in cases {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = outcore(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: no `{needle}`: {stderr}");
    }
}

/// A budget under which no planner listed plans batch 1 is too small for the
/// model: the table (here JSON) is still written, the exit is non-zero, the
/// error names a budget under which batch 1 plans, and `max-batch` with the
/// planner it names under that budget finds a batch.
#[test]
fn max_batch_where_batch_one_does_not_plan_fails_naming_a_budget() {
    let args = [
        "max-batch",
        "--model",
        "tiny-cnn",
        "--device",
        "rtx2080ti-11gb",
        "--budget",
        "200KB",
        "--planners",
        "none,capuchin",
        "--json",
    ];
    let out = outcore(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(
        stderr.contains("no planner listed plans even batch 1 of tiny-cnn"),
        "{stderr}"
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    for row in r["rows"].as_array().expect("rows") {
        assert!(row["max_batch"].is_null(), "{row}");
    }
    let hint = &r["budget_hint"];
    let hinted = hint["budget_bytes"].as_u64().expect("a hint");
    assert!(hinted > 200_000 && hinted <= 800_000, "{hint}");
    assert!(stderr.contains(&format!("({hinted} bytes")), "{stderr}");
    let planner = hint["planner"].as_str().expect("planner");
    let hinted = hinted.to_string();
    let again = json_of(&[
        "max-batch",
        "--model",
        "tiny-cnn",
        "--device",
        "rtx2080ti-11gb",
        "--budget",
        &hinted,
        "--planners",
        planner,
        "--json",
    ]);
    assert!(
        again["rows"][0]["max_batch"]
            .as_u64()
            .is_some_and(|b| b >= 1),
        "{again}"
    );
    assert!(again["budget_hint"].is_null(), "{again}");
}
