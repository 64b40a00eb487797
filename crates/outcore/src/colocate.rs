//! `outcore colocate`: a job list (`outcore-jobs/1`), each job planned alone by
//! its own planner at its own budget, then all jobs run together on one device
//! by `outcore_colocate::simulate_jobs`, beside the same jobs unscheduled (each
//! graph in order, every tensor kept: TENSILE's vanilla group) for MSR, EOR and
//! CBR. [`colocate_tensile`] plans all jobs together with TENSILE's multi-job
//! scheduler instead (`outcore_planners::tensile::multi`) and compares per-job
//! `capuchin` and `vdnn-conv` plans made at the bounds its plans prove.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use outcore_colocate::{
    ColocateOptions, ColocateReport, Job, JobSet, SetMetrics, simulate_jobs, simulate_jobs_with,
};
use outcore_cost::DeviceProfile;
use outcore_graph::Graph;
use outcore_plan::{AllocatorSpec, Plan, PlannerErrorKind, PlannerInfo, lower_in_order};
use outcore_planners::tensile::multi::{
    JobInput, MultiOutcome, MultiSummary, NAME as MULTI_NAME, plan_jobs,
};
use serde::{Deserialize, Serialize};

use crate::input::{
    GraphSource, LoadedGraph, cost_model, load_device, load_graph, parse_budget, parse_size,
};
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
        (None, Some(path))
            if spec.batch.is_none() && spec.knobs.is_empty() && spec.optimizer.is_none() =>
        {
            Ok(GraphSource::File { path: path.clone() })
        }
        _ => Err(Error::invalid(
            "job",
            &spec.name,
            "must name exactly one of `model` (with optional `batch`, `knobs`, `optimizer`) and `graph` (a graph file fixes its batch, knobs and optimizer, so none of those beside it)",
            "\"model\": \"resnet50\" or \"graph\": \"path/to/graph.json\"",
        )),
    }
}

/// A job of the list with its graph loaded.
struct LoadedJob<'a> {
    spec: &'a JobSpec,
    loaded: LoadedGraph,
    graph: Arc<Graph>,
    footprint_bytes: u64,
}

/// Loads every job's graph.
fn load_jobs(list: &JobList) -> Result<Vec<LoadedJob<'_>>> {
    list.jobs
        .iter()
        .map(|spec| {
            let loaded = load_graph(&job_source(spec)?)?;
            let footprint_bytes = loaded.footprint_bytes();
            let graph = Arc::new(loaded.graph.clone());
            Ok(LoadedJob {
                spec,
                loaded,
                graph,
                footprint_bytes,
            })
        })
        .collect()
}

/// `budget` (a size; default: the device's memory) for all jobs together.
fn set_budget(profile: &DeviceProfile, budget: Option<&str>) -> Result<u64> {
    match budget {
        Some(text) => parse_size(text),
        None => Ok(profile.memory_bytes),
    }
}

/// One job's plan in a group: the planner that made it and the budget it
/// was made for.
struct Planned {
    planner: String,
    plan_budget_bytes: u64,
    plan: Plan,
}

/// Runs `planned` (one per job) together, beside the same jobs unscheduled.
fn run_group(
    jobs: &[LoadedJob<'_>],
    planned: Vec<Planned>,
    profile: &DeviceProfile,
    budget_bytes: u64,
    record_trace: bool,
) -> Result<ColocateResult> {
    let vanilla_info = PlannerInfo {
        name: "vanilla".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let mut set = Vec::with_capacity(jobs.len());
    let mut vanilla = Vec::with_capacity(jobs.len());
    let mut rows = Vec::with_capacity(jobs.len());
    let mut vanilla_budget_bytes = 0u64;
    for (j, p) in jobs.iter().zip(planned) {
        let spec = j.spec;
        let unscheduled = lower_in_order(&j.graph, vanilla_info.clone(), j.footprint_bytes);
        vanilla_budget_bytes = vanilla_budget_bytes.saturating_add(j.footprint_bytes);
        let job = |plan| {
            Job::new(
                &spec.name,
                j.graph.clone(),
                Arc::new(plan),
                spec.iterations,
                spec.arrival_s,
                spec.priority,
            )
        };
        set.push(job(p.plan)?);
        vanilla.push(job(unscheduled)?);
        rows.push(ColocateJobRow {
            name: spec.name.clone(),
            planner: p.planner,
            plan_budget_bytes: p.plan_budget_bytes,
            footprint_bytes: j.footprint_bytes,
            msr: f64::NAN,
            eor: f64::NAN,
            cbr: f64::NAN,
        });
    }
    let cost = cost_model(profile.clone(), None);
    let options = ColocateOptions { record_trace };
    let out = simulate_jobs_with(&JobSet::new(budget_bytes, set)?, cost.as_ref(), &options)?;
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
    let budget_bytes = set_budget(&profile, budget)?;
    let jobs = load_jobs(list)?;
    let mut planned = Vec::with_capacity(jobs.len());
    for j in &jobs {
        let plan_budget_bytes = parse_budget(
            j.spec.budget.as_deref().unwrap_or("100%"),
            j.footprint_bytes,
        )?;
        let planner = j.spec.planner.clone();
        let plan = plan_alone(j, &planner, &profile, plan_budget_bytes)?;
        planned.push(Planned {
            planner,
            plan_budget_bytes,
            plan,
        });
    }
    run_group(&jobs, planned, &profile, budget_bytes, record_trace)
}

/// `planner` on job `j` alone at `budget_bytes` (perfect allocator).
fn plan_alone(
    j: &LoadedJob<'_>,
    planner: &str,
    profile: &DeviceProfile,
    budget_bytes: u64,
) -> Result<Plan> {
    let target = Target::new(
        &j.loaded,
        profile.clone(),
        budget_bytes,
        AllocatorSpec::Perfect,
    )?;
    Ok(plan(&j.loaded, planner, &target, &PlanOptions::default())?.plan)
}

/// The result of `outcore colocate --tensile`: TENSILE's scheduler over all
/// jobs, and the same jobs each planned alone by `capuchin` and by
/// `vdnn-conv` at the bound TENSILE's plan for it proves (the paper's
/// setting: "we set Capuchin's GPU memory budget as the same as TENSILE").
#[derive(Debug, Clone, Serialize)]
pub struct TensileComparison {
    /// What TENSILE's loop did over all jobs (iterations, merged peaks).
    pub summary: MultiSummary,
    pub tensile: ColocateResult,
    pub capuchin: ColocateResult,
    pub vdnn_conv: ColocateResult,
}

/// The job list's jobs (graphs, iterations, arrivals, priorities as TENSILE's
/// max swapping rates; the jobs' own `planner` and `budget` are not used)
/// planned by TENSILE over all jobs for `budget` (default: the device's
/// memory), then compared with per-job Capuchin and vDNN-conv (see
/// [`TensileComparison`]); the trace, when asked for, is TENSILE's run.
pub fn colocate_tensile(
    list: &JobList,
    device: &str,
    budget: Option<&str>,
    record_trace: bool,
) -> Result<TensileComparison> {
    let profile = load_device(device)?;
    let budget_bytes = set_budget(&profile, budget)?;
    for spec in &list.jobs {
        // `Job` accepts 0 (the simulator does not use it); the scheduler
        // divides the swaps by it.
        if !(spec.priority > 0.0 && spec.priority <= 1.0) {
            return Err(Error::invalid(
                format!("priority of job `{}`", spec.name),
                spec.priority.to_string(),
                "TENSILE's scheduler reads it as the job's max swapping rate, which must be above 0",
                "a number in (0, 1]; 1 (the default) means no limit",
            ));
        }
    }
    let jobs = load_jobs(list)?;
    let cost = cost_model(profile.clone(), None);
    let inputs: Vec<JobInput<'_>> = jobs
        .iter()
        .map(|j| JobInput {
            graph: &j.graph,
            max_swap_rate: j.spec.priority,
        })
        .collect();
    let outcome = plan_jobs(&inputs, cost.as_ref(), budget_bytes).map_err(|e| {
        if e.kind == PlannerErrorKind::InvalidRequest {
            Error::invalid(
                "job list for TENSILE",
                &e.message,
                "cannot be planned",
                "jobs with priorities (max swapping rates) in (0, 1]",
            )
        } else {
            // A planner bug: say so, with the planner's own words.
            Error::from(ErrorKind::NotRunnable {
                reason: e.to_string(),
            })
        }
    })?;
    let (plans, summary) = match outcome {
        MultiOutcome::Feasible { jobs, summary } => (jobs, summary),
        MultiOutcome::Infeasible { message, .. } => {
            return Err(ErrorKind::Infeasible {
                planner: MULTI_NAME.into(),
                model: format!("{} jobs", jobs.len()),
                budget_bytes,
                reason: message,
            }
            .into());
        }
    };
    let bounds: Vec<u64> = plans.iter().map(|p| p.bound_bytes).collect();
    let tensile: Vec<Planned> = plans
        .into_iter()
        .map(|p| Planned {
            planner: MULTI_NAME.into(),
            plan_budget_bytes: p.bound_bytes,
            plan: p.plan,
        })
        .collect();
    let alone = |planner: &str| -> Result<Vec<Planned>> {
        jobs.iter()
            .zip(&bounds)
            .map(|(j, &bound)| {
                Ok(Planned {
                    planner: planner.into(),
                    plan_budget_bytes: bound,
                    plan: plan_alone(j, planner, &profile, bound)?,
                })
            })
            .collect()
    };
    Ok(TensileComparison {
        summary,
        tensile: run_group(&jobs, tensile, &profile, budget_bytes, record_trace)?,
        capuchin: run_group(&jobs, alone("capuchin")?, &profile, budget_bytes, false)?,
        vdnn_conv: run_group(&jobs, alone("vdnn-conv")?, &profile, budget_bytes, false)?,
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

    #[test]
    fn tensile_plans_the_set_and_baselines_get_its_bounds() {
        // Two ResNet-18 b8 jobs, the second arriving later: TENSILE plans
        // both for the device; capuchin and vdnn-conv plan each alone at the
        // bound TENSILE's plan for that job proves.
        let text = list(concat!(
            "{\"name\": \"a\", \"model\": \"resnet18\", \"batch\": 8, \"planner\": \"none\", \"iterations\": 2},",
            "{\"name\": \"b\", \"model\": \"resnet18\", \"batch\": 8, \"planner\": \"none\", \"iterations\": 2, \"arrival_s\": 0.01}"
        ));
        let parsed = parse_job_list(&text, "jobs.json").expect("parses");
        let r = colocate_tensile(&parsed, "v100-16gb-pcie3", None, false).expect("runs");
        for (row, job) in r.tensile.jobs.iter().zip(&r.tensile.report.jobs) {
            assert_eq!(row.planner, MULTI_NAME);
            // The plan is proved at its bound, so the job never holds more.
            assert!(job.peak_live_bytes <= row.plan_budget_bytes, "{row:?}");
            assert!(row.plan_budget_bytes < row.footprint_bytes, "{row:?}");
        }
        for group in [&r.capuchin, &r.vdnn_conv] {
            for (row, t) in group.jobs.iter().zip(&r.tensile.jobs) {
                assert_eq!(row.plan_budget_bytes, t.plan_budget_bytes);
            }
            assert_eq!(
                group.vanilla.peak_live_bytes,
                r.tensile.vanilla.peak_live_bytes
            );
        }
        assert_eq!(r.capuchin.jobs[0].planner, "capuchin");
        assert_eq!(r.vdnn_conv.jobs[1].planner, "vdnn-conv");
        assert!(r.tensile.report.fits_budget);
        // A max swapping rate of 0 cannot be planned: a clear error.
        let zero = list(
            "{\"name\": \"a\", \"model\": \"mlp\", \"planner\": \"none\", \"iterations\": 1, \"priority\": 0}",
        );
        let e = colocate_tensile(
            &parse_job_list(&zero, "jobs.json").expect("parses"),
            "v100-16gb-pcie3",
            None,
            false,
        )
        .expect_err("rate 0");
        assert!(e.to_string().contains("(0, 1]"), "{e}");
    }
}
