//! `outcore colocate --run` end to end: two tiny models planned by `tensile`,
//! trained at once on the CPU executor in one shared arena, each with its
//! checks passed, its own latency table and the same final parameters as
//! training it alone.

use serde_json::Value;
use std::process::Command;

#[test]
fn two_tensile_jobs_train_together_on_the_cpu_executor() {
    let dir = std::env::temp_dir().join(format!("outcore-colocate-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let jobs = dir.join("jobs.json");
    std::fs::write(
        &jobs,
        r#"{"format": "outcore-jobs/1", "jobs": [
            {"name": "cnn", "model": "tiny-cnn", "batch": 4, "knobs": {"depth": 4, "width": 8},
             "planner": "tensile", "budget": "85%", "iterations": 2},
            {"name": "transformer", "model": "tiny-transformer", "batch": 4, "knobs": {"layers": 2},
             "planner": "tensile", "budget": "80%", "iterations": 2}
        ]}"#,
    )
    .expect("write job list");
    // tiny-cnn at 85%: `tensile` takes no swap that would make compute wait,
    // and at 80% of this tiny graph (copies of 10 us latency beside ops of a
    // few us) hidden swaps stop 5 KB short of the budget.
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(["colocate", &jobs.display().to_string()])
        .args(["--device", "a6000-48gb", "--run", "--json"])
        .output()
        .expect("outcore runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let run = &v["cpu_run"];
    let rows = run["jobs"].as_array().expect("jobs");
    assert_eq!(rows.len(), 2);
    let mut window_total = 0;
    for row in rows {
        let name = row["name"].as_str().expect("name");
        assert!(row["error"].is_null(), "{name}: {}", row["error"]);
        assert_eq!(row["checks_passed"], Value::Bool(true), "{name}");
        assert_eq!(row["matches_reference"], Value::Bool(true), "{name}");
        assert_eq!(row["iter_times_s"].as_array().map(Vec::len), Some(2));
        assert!(
            row["swap_in_bytes"].as_u64() > Some(0),
            "{name} swaps nothing"
        );
        assert_eq!(row["latency_table"]["format"], "outcore-latency-table/1");
        assert!(
            !row["latency_table"]["entries"]
                .as_array()
                .expect("entries")
                .is_empty(),
            "{name}: no op timed"
        );
        window_total += row["window_bytes"].as_u64().expect("window");
    }
    assert_eq!(run["capacity_bytes"].as_u64(), Some(window_total));
    let peak = run["peak_device_bytes"].as_u64().expect("global peak");
    let job_peaks: Vec<u64> = rows
        .iter()
        .map(|r| r["peak_device_bytes"].as_u64().expect("job peak"))
        .collect();
    assert!(peak >= job_peaks.iter().copied().max().unwrap_or(0));
    assert!(peak <= job_peaks.iter().sum::<u64>().min(window_total));
}
