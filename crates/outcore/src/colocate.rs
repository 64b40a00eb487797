//! `outcore colocate`: a job list (`outcore-jobs/1`), each job planned alone by
//! its own planner at its own budget, then all jobs run together on one device
//! by `outcore_colocate::simulate_jobs`, beside the same jobs unscheduled (each
//! graph in order, every tensor kept: TENSILE's vanilla group) for MSR, EOR and
//! CBR. TENSILE's own multi-job scheduler is not implemented yet: each job's
//! plan is a single-job planner's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use outcore_colocate::{
    ColocateOptions, ColocateReport, Job, JobSet, SetMetrics, simulate_jobs, simulate_jobs_with,
};
use outcore_plan::{AllocatorSpec, PlannerInfo, lower_in_order};
use serde::{Deserialize, Serialize};

use crate::input::{GraphSource, cost_model, load_device, load_graph, parse_budget, parse_size};
use crate::planning::{PlanOptions, Target, plan};
use crate::{Error, ErrorKind, Result};

/// The job-list format this module reads.
pub const JOBS_FORMAT: &str = "outcore-jobs/1";

/// A job list: `{"format": "outcore-jobs/1", "jobs": [...]}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobList {
    pub format: String,
    pub jobs: Vec<JobSpec>,
}

/// One job of a list: a zoo model (`model`, with optional `batch`, `knobs`,
/// `optimizer`) or a graph file (`graph`), the planner that plans it alone,
/// its budget (a share of its footprint such as `"50%"`, or a size; default
/// `"100%"`), its iterations, arrival time (default 0 s) and priority
/// (TENSILE's max swapping rate, default 1).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub batch: Option<u64>,
    #[serde(default)]
    pub knobs: BTreeMap<String, u64>,
    #[serde(default)]
    pub optimizer: Option<String>,
    #[serde(default)]
    pub graph: Option<PathBuf>,
    pub planner: String,
    #[serde(default)]
    pub budget: Option<String>,
    pub iterations: usize,
    #[serde(default)]
    pub arrival_s: f64,
    #[serde(default = "full_priority")]
    pub priority: f64,
}

fn full_priority() -> f64 {
    1.0
}

/// Reads and parses a job-list file.
pub fn load_job_list(path: &Path) -> Result<JobList> {
    let text = std::fs::read_to_string(path).map_err(|source| ErrorKind::Io {
        action: "read",
        path: path.display().to_string(),
        source,
    })?;
    parse_job_list(&text, &path.display().to_string())
}

/// Parses a job list; `origin` names it in errors.
pub fn parse_job_list(text: &str, origin: &str) -> Result<JobList> {
    let list: JobList = serde_json::from_str(crate::strip_bom(text)).map_err(|e| {
        Error::invalid(
            "job list",
            origin,
            format!("is not a valid job list: {e}"),
            format!(
                "{{\"format\": \"{JOBS_FORMAT}\", \"jobs\": [{{\"name\", \"model\" or \"graph\", \"planner\", \"iterations\", ...}}]}}"
            ),
        )
    })?;
    if list.format != JOBS_FORMAT {
        return Err(Error::invalid(
            "job list format",
            &list.format,
            format!("{origin} is not a job list this version reads"),
            JOBS_FORMAT,
        ));
    }
    Ok(list)
}

/// One job's row: how it was planned, what it did, its metrics.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateJobRow {
    pub name: String,
    pub planner: String,
    pub plan_budget_bytes: u64,
    pub footprint_bytes: u64,
    pub msr: f64,
    pub eor: f64,
    pub cbr: f64,
}

/// The result of `outcore colocate`.
#[derive(Debug, Clone, Serialize)]
pub struct ColocateResult {
    pub device: String,
    pub budget_bytes: u64,
    pub jobs: Vec<ColocateJobRow>,
    /// The jobs with their plans, together on the device.
    pub report: ColocateReport,
    /// The same jobs unscheduled (in order, nothing swapped or recomputed).
    pub vanilla: ColocateReport,
    pub metrics: SetMetrics,
    /// The run's Chrome trace (a track group per job), when asked for.
    #[serde(skip)]
    pub trace: Option<serde_json::Value>,
}

/// The source of a job's graph: a zoo model or a file, exactly one.
pub(crate) fn job_source(spec: &JobSpec) -> Result<GraphSource> {
    match (&spec.model, &spec.graph) {
        (Some(model), None) => Ok(GraphSource::Zoo {
            model: model.clone(),
            batch: spec.batch,
            knobs: spec.knobs.clone(),
            optimizer: spec.optimizer.clone(),
        }),
        (None, Some(path)) if spec.batch.is_none() && spec.knobs.is_empty() => {
            Ok(GraphSource::File { path: path.clone() })
        }
        _ => Err(Error::invalid(
            "job",
            &spec.name,
            "must name exactly one of `model` (with optional `batch`, `knobs`, `optimizer`) and `graph`",
            "\"model\": \"resnet50\" or \"graph\": \"path/to/graph.json\"",
        )),
    }
}

/// Plans every job alone, then runs them together on `device` with
/// `budget` (a size; default: the device's memory) for all of them; with
/// `record_trace`, the result carries the run's Chrome trace.
pub fn colocate(
    list: &JobList,
    device: &str,
    budget: Option<&str>,
    record_trace: bool,
) -> Result<ColocateResult> {
    let profile = load_device(device)?;
    let budget_bytes = match budget {
        Some(text) => parse_size(text)?,
        None => profile.memory_bytes,
    };
    let mut jobs = Vec::with_capacity(list.jobs.len());
    let mut vanilla = Vec::with_capacity(list.jobs.len());
    let mut rows = Vec::with_capacity(list.jobs.len());
    let vanilla_info = PlannerInfo {
        name: "vanilla".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let mut vanilla_budget_bytes = 0u64;
    for spec in &list.jobs {
        let loaded = load_graph(&job_source(spec)?)?;
        let footprint_bytes = loaded.footprint_bytes();
        let plan_budget_bytes =
            parse_budget(spec.budget.as_deref().unwrap_or("100%"), footprint_bytes)?;
        let target = Target::new(
            &loaded,
            profile.clone(),
            plan_budget_bytes,
            AllocatorSpec::Perfect,
        )?;
        let planned = plan(&loaded, &spec.planner, &target, &PlanOptions::default())?;
        let graph = Arc::new(loaded.graph);
        let unscheduled = lower_in_order(&graph, vanilla_info.clone(), footprint_bytes);
        vanilla_budget_bytes = vanilla_budget_bytes.saturating_add(footprint_bytes);
        let job = |plan| {
            Job::new(
                &spec.name,
                graph.clone(),
                Arc::new(plan),
                spec.iterations,
                spec.arrival_s,
                spec.priority,
            )
        };
        jobs.push(job(planned.plan)?);
        vanilla.push(job(unscheduled)?);
        rows.push(ColocateJobRow {
            name: spec.name.clone(),
            planner: spec.planner.clone(),
            plan_budget_bytes,
            footprint_bytes,
            msr: f64::NAN,
            eor: f64::NAN,
            cbr: f64::NAN,
        });
    }
    let cost = cost_model(profile.clone(), None);
    let options = ColocateOptions { record_trace };
    let out = simulate_jobs_with(&JobSet::new(budget_bytes, jobs)?, cost.as_ref(), &options)?;
    let report = out.report;
    // The vanilla group has no memory limit: its budget is every footprint together.
    let vanilla = simulate_jobs(
        &JobSet::new(vanilla_budget_bytes.max(1), vanilla)?,
        cost.as_ref(),
    )?;
    let metrics = SetMetrics::new(&vanilla, &report)?;
    for (row, (_, m)) in rows.iter_mut().zip(&metrics.jobs) {
        (row.msr, row.eor, row.cbr) = (m.msr, m.eor, m.cbr);
    }
    Ok(ColocateResult {
        device: profile.name.clone(),
        budget_bytes,
        jobs: rows,
        report,
        vanilla,
        metrics,
        trace: out.trace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(jobs: &str) -> String {
        format!("{{\"format\": \"{JOBS_FORMAT}\", \"jobs\": [{jobs}]}}")
    }

    #[test]
    fn bad_job_lists_are_clear_errors() {
        let cases = [
            (
                "{\"format\": \"outcore-jobs/2\", \"jobs\": []}",
                "outcore-jobs/1",
            ),
            ("[1, 2]", "not a valid job list"),
            (
                &list(
                    "{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 1, \"speed\": 2}",
                ),
                "unknown field `speed`",
            ),
            (
                &list("{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\"}"),
                "iterations",
            ),
        ];
        for (text, expected) in cases {
            let e = parse_job_list(text, "jobs.json").expect_err(text);
            assert!(e.to_string().contains(expected), "{text}: {e}");
        }
        // Neither or both graph sources; zero iterations; an empty set.
        let run = |jobs: &str| {
            let list = parse_job_list(&list(jobs), "jobs.json").expect("parses");
            colocate(&list, "v100-16gb-pcie3", None, false)
                .expect_err(jobs)
                .to_string()
        };
        let both = run(
            "{\"name\": \"a\", \"model\": \"mlp\", \"graph\": \"g.json\", \"planner\": \"none\", \"iterations\": 1}",
        );
        assert!(both.contains("exactly one of `model`"), "{both}");
        let zero =
            run("{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 0}");
        assert!(zero.contains("0 iterations"), "{zero}");
        assert!(run("").contains("at least one job"));
    }

    #[test]
    fn one_unscheduled_job_has_no_savings_and_no_overhead() {
        // `none` at 100% schedules nothing: the same peak and time as the
        // vanilla run, so MSR 0, EOR 1, CBR 0.
        let text = list(
            "{\"name\": \"m\", \"model\": \"mlp\", \"batch\": 4, \"planner\": \"none\", \"iterations\": 2, \"arrival_s\": 1.5}",
        );
        let r = colocate(
            &parse_job_list(&text, "jobs.json").expect("parses"),
            "a6000-48gb",
            None,
            false,
        )
        .expect("runs");
        assert_eq!(r.report.peak_live_bytes, r.vanilla.peak_live_bytes);
        assert_eq!(r.jobs[0].footprint_bytes, r.report.peak_live_bytes);
        assert_eq!((r.metrics.global.msr, r.metrics.global.eor), (0.0, 1.0));
        assert_eq!(r.report.jobs[0].start_s, 1.5);
        assert_eq!(r.report.jobs[0].per_iteration_time_s.len(), 2);
        assert!(r.report.fits_budget);
    }
}
