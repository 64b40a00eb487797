//! TENSILE's metrics (Sec. V-A, "Metrics"): MSR = (VMP - EMP) / VMP,
//! EOR = ETC / VTC, CBR = MSR / EOR, where VMP and EMP are the memory
//! footprint peaks of the vanilla group (no scheduling) and the experimental
//! group, and VTC and ETC their time costs.
//!
//! The paper measures "the whole computing process" without saying more. Here
//! the vanilla group is the same job set (same jobs, arrivals and iterations)
//! with plans that schedule nothing (`none` at an unlimited budget), both run
//! through [`crate::simulate_jobs`]. For the set, the peak is the global peak
//! (all jobs together, what TENSILE minimises) and the time cost the makespan
//! (first arrival to last finish); for each job, its own peak and its own time
//! cost, finish minus start. Note that EOR is a ratio of times, not an excess
//! (1.0: no extra time), as in the paper's Tables III and IV.

use serde::Serialize;

use crate::engine::ColocateReport;
use crate::job::{ColocateError, ColocateErrorKind};

/// MSR, EOR and CBR of one experiment against its vanilla run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metrics {
    /// Memory saving rate: the share of the vanilla peak saved.
    pub msr: f64,
    /// Extra overhead rate: experimental over vanilla time cost.
    pub eor: f64,
    /// Cost-benefit rate: MSR / EOR.
    pub cbr: f64,
}

impl Metrics {
    /// The metrics of peaks and time costs; the vanilla peak and time must be
    /// positive (they divide), the experimental time too.
    pub fn new(
        vanilla_peak_bytes: u64,
        vanilla_time_s: f64,
        peak_bytes: u64,
        time_s: f64,
    ) -> Result<Metrics, ColocateError> {
        let degenerate = |what, value| {
            Err(ColocateError {
                kind: ColocateErrorKind::DegenerateVanilla { what, value },
            })
        };
        if vanilla_peak_bytes == 0 {
            return degenerate("peak", 0.0);
        }
        if !(vanilla_time_s.is_finite() && vanilla_time_s > 0.0) {
            return degenerate("time cost", vanilla_time_s);
        }
        if !(time_s.is_finite() && time_s > 0.0) {
            return Err(ColocateError {
                kind: ColocateErrorKind::MismatchedReports {
                    detail: format!("the experimental time cost is {time_s} s, not positive"),
                },
            });
        }
        let vmp = vanilla_peak_bytes as f64;
        let msr = (vmp - peak_bytes as f64) / vmp;
        let eor = time_s / vanilla_time_s;
        Ok(Metrics {
            msr,
            eor,
            cbr: msr / eor,
        })
    }
}

/// The metrics of a job set and of each job (in the set's order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetMetrics {
    pub global: Metrics,
    pub jobs: Vec<(String, Metrics)>,
}

impl SetMetrics {
    /// Compares `experiment` with `vanilla`, the same jobs run without memory
    /// limits; the jobs must match by name and order.
    pub fn new(
        vanilla: &ColocateReport,
        experiment: &ColocateReport,
    ) -> Result<SetMetrics, ColocateError> {
        let names = |r: &ColocateReport| r.jobs.iter().map(|j| j.name.clone()).collect::<Vec<_>>();
        if names(vanilla) != names(experiment) {
            return Err(ColocateError {
                kind: ColocateErrorKind::MismatchedReports {
                    detail: format!(
                        "the vanilla jobs are {:?}, the experiment's {:?}",
                        names(vanilla),
                        names(experiment)
                    ),
                },
            });
        }
        let global = Metrics::new(
            vanilla.peak_live_bytes,
            vanilla.makespan_s,
            experiment.peak_live_bytes,
            experiment.makespan_s,
        )?;
        let jobs = vanilla
            .jobs
            .iter()
            .zip(&experiment.jobs)
            .map(|(v, e)| {
                let m = Metrics::new(
                    v.peak_live_bytes,
                    v.finish_s - v.start_s,
                    e.peak_live_bytes,
                    e.finish_s - e.start_s,
                )?;
                Ok((e.name.clone(), m))
            })
            .collect::<Result<_, ColocateError>>()?;
        Ok(SetMetrics { global, jobs })
    }
}
