//! TENSILE's scheduler over several jobs sharing one device (paper 004,
//! Sec. IV-C and Algorithm 3): each job's peak analysis (Algorithm 1), their
//! footprints merged into one memory peak MP, swap scheduling of the biggest
//! peak tensor among all jobs (Algorithm 2) within each job's max swapping
//! rate, then MSPS recomputation (Sec. IV-D) while MP exceeds the budget, and
//! the stopping rule of Algorithm 3 on MP. The single-job pieces (access
//! sequences, peak analysis, swap placement, recomputation candidates) are the
//! `tensile` planner's own; this module is the loop over jobs.
//!
//! Choices where the paper is vague:
//! - **Merged footprint.** Algorithm 3 line 7 merges the jobs' footprints
//!   into MP without saying how jobs' timelines line up. Jobs run
//!   asynchronously with different iteration times, so over a long run every
//!   job's peak meets every other's: MP here is the sum of the jobs' peaks,
//!   the merged peak in the worst alignment, which is what one budget for all
//!   jobs must hold at any alignment. Lowering any job's peak lowers MP.
//! - **Max swapping rate** (Alg. 2 line 28, "SON ≤ MSR"): the paper defines
//!   the limit as the share of the system's swapped tensors that are the
//!   job's. A job may take another swap while the tensors it has swapped are at
//!   most `max_swap_rate` of all swapped so far (always when none is); at the
//!   paper's setting, 100%, no job is limited.
//! - **Link.** The paper leaves the order of different jobs' copies to their
//!   asynchronous execution (that is what the rate limit is for); each job's
//!   swaps are placed in free slots of that job's own link timeline, as in
//!   the single-job planner. Contention between jobs' copies is what the
//!   multi-job simulator (`outcore-colocate`) then measures.
//! - **Proof.** Every job's schedule is lowered, scored by the evaluator and
//!   proved by `verify()` at its own bound (the most memory it can hold at any
//!   timing); the set fits when the bounds sum to at most the budget. When they
//!   do not, the loop runs again with the budget lowered by the excess (more
//!   recomputation), at most [`MARGIN_ROUNDS`] times, as the single-job
//!   planner tightens its margin.

use super::access::AccessSequence;
use super::peak::{Peak, analyse, peak_only};
use super::recompute::{self, Candidate};
use super::scheduler::{
    MIN_ITERATIONS_BEFORE_STALL_CHECK, STALL_FRACTION, STALL_WINDOW, lowers_and_hides,
};
use super::swap::{SwapState, schedule_peak};
use crate::framework::Ctx;
use outcore_cost::CostModel;
use outcore_eval::{Evaluator, Scratch};
use outcore_graph::{Graph, TensorId};
use outcore_plan::{
    AllocatorSpec, Gap, Plan, PlannerError, PlannerErrorKind, PlannerInfo, fmt_bytes, verify,
};

/// The name this scheduler writes into its plans and errors.
pub const NAME: &str = "tensile-multi";

fn error(kind: PlannerErrorKind, message: String) -> PlannerError {
    PlannerError::new(NAME, kind, message)
}

/// How many times the loop is rerun with a budget lowered by the excess of
/// the proven bounds over the budget.
pub const MARGIN_ROUNDS: usize = 4;

/// One job of the set.
#[derive(Debug, Clone, Copy)]
pub struct JobInput<'g> {
    pub graph: &'g Graph,
    /// TENSILE's max swapping rate: the largest share of the system's swapped
    /// tensors this job may hold, in (0, 1] (1: no limit, the paper's setting).
    pub max_swap_rate: f64,
}

/// One job's plan and what the loop did for it.
#[derive(Debug, Clone)]
pub struct JobPlan {
    /// The plan, its budget set to `bound_bytes` and proved by `verify()`.
    pub plan: Plan,
    /// The most memory the plan may hold at any timing (verify's bound).
    pub bound_bytes: u64,
    /// The job's modelled peak (Algorithm 1) at the end.
    pub modelled_peak_bytes: u64,
    pub swapped_tensors: usize,
    pub swap_gaps: usize,
    pub cross_iteration_swaps: usize,
    pub recomputations: usize,
}

/// What the loop did for the whole set.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MultiSummary {
    /// Algorithm 3 iterations of the last round.
    pub iterations: usize,
    pub stopped_by_stall_rule: bool,
    /// MP (the sum of the jobs' modelled peaks) before anything is moved.
    pub first_peak_bytes: u64,
    /// MP at the end.
    pub final_peak_bytes: u64,
    /// The jobs' proven bounds, summed.
    pub bound_bytes: u64,
    /// The budget the last round planned for (the budget, or lower).
    pub planning_budget_bytes: u64,
}

/// The set's plans, or why they do not fit.
#[derive(Debug, Clone)]
pub enum MultiOutcome {
    Feasible {
        jobs: Vec<JobPlan>,
        summary: MultiSummary,
    },
    Infeasible {
        summary: MultiSummary,
        message: String,
    },
}

/// Plans every job of `jobs` together for one `budget_bytes` (see the
/// module docs). Bad input (no job, a rate outside (0, 1]) and a plan that
/// fails its own lowering or proof are errors; not fitting is a value.
pub fn plan_jobs(
    jobs: &[JobInput<'_>],
    cost: &dyn CostModel,
    budget_bytes: u64,
) -> Result<MultiOutcome, PlannerError> {
    check_jobs(jobs)?;
    let ctxs: Vec<Ctx<'_>> = jobs
        .iter()
        .map(|j| Ctx::in_graph_order(j.graph, cost))
        .collect();
    let mut planning_budget_bytes = budget_bytes;
    let mut last = None;
    for _ in 0..MARGIN_ROUNDS {
        let (mut summary, states) = schedule(&ctxs, jobs, cost, planning_budget_bytes);
        summary.planning_budget_bytes = planning_budget_bytes;
        let plans = prove(&ctxs, &states, cost, budget_bytes, &summary)?;
        summary.bound_bytes = plans
            .iter()
            .map(|p| p.bound_bytes)
            .fold(0u64, u64::saturating_add);
        if summary.bound_bytes <= budget_bytes {
            return Ok(MultiOutcome::Feasible {
                jobs: plans,
                summary,
            });
        }
        let excess = summary.bound_bytes - budget_bytes;
        last = Some(summary);
        if excess >= planning_budget_bytes {
            break;
        }
        planning_budget_bytes -= excess;
    }
    let summary = last.unwrap_or_default();
    let message = format!(
        "after hidden swaps and MSPS recomputation over all {} jobs, their proven bounds sum to {} (modelled peak {}), over the {} budget",
        jobs.len(),
        fmt_bytes(summary.bound_bytes),
        fmt_bytes(summary.final_peak_bytes),
        fmt_bytes(budget_bytes)
    );
    Ok(MultiOutcome::Infeasible { summary, message })
}

fn check_jobs(jobs: &[JobInput<'_>]) -> Result<(), PlannerError> {
    if jobs.is_empty() {
        return Err(error(
            PlannerErrorKind::InvalidRequest,
            "TENSILE's multi-job scheduler needs at least one job; give one or more".into(),
        ));
    }
    for (i, j) in jobs.iter().enumerate() {
        let r = j.max_swap_rate;
        if !(r.is_finite() && r > 0.0 && r <= 1.0) {
            return Err(error(
                PlannerErrorKind::InvalidRequest,
                format!(
                    "job {i}'s max swapping rate is {r}; it must be in (0, 1] (1: no limit, the paper's setting)"
                ),
            ));
        }
    }
    Ok(())
}

/// The loop's state for one job.
struct JobState {
    state: SwapState,
    released: Vec<bool>,
    gaps: Vec<Gap>,
    peak: Peak,
    swapped_tensors: usize,
    swap_gaps: usize,
    cross_iteration_swaps: usize,
    recomputations: usize,
}

/// Algorithm 3 over all jobs for `budget_bytes` (see the module docs).
fn schedule(
    ctxs: &[Ctx<'_>],
    jobs: &[JobInput<'_>],
    cost: &dyn CostModel,
    budget_bytes: u64,
) -> (MultiSummary, Vec<JobState>) {
    let mut states: Vec<JobState> = ctxs
        .iter()
        .map(|ctx| JobState {
            state: SwapState::new(ctx.graph.tensors.len()),
            released: vec![false; ctx.graph.tensors.len()],
            gaps: Vec::new(),
            peak: analyse(ctx, &[]),
            swapped_tensors: 0,
            swap_gaps: 0,
            cross_iteration_swaps: 0,
            recomputations: 0,
        })
        .collect();
    let merged = |states: &[JobState]| {
        states
            .iter()
            .map(|s| s.peak.peak_bytes)
            .fold(0u64, u64::saturating_add)
    };
    let mut summary = MultiSummary {
        first_peak_bytes: merged(&states),
        ..MultiSummary::default()
    };
    let (mut swap_ok, mut recompute_ok) = (true, true);
    // Per iteration: the relative fall of the changed job's peak MP_j.
    let mut falls: Vec<f64> = Vec::new();
    while swap_ok || recompute_ok {
        let mp = merged(&states);
        if stalled_jobs(&falls, summary.iterations) {
            summary.stopped_by_stall_rule = true;
            if !swap_ok {
                break;
            }
            swap_ok = false;
            falls.clear();
        }
        let changed = if swap_ok {
            let taken = swap_biggest(ctxs, jobs, cost, &mut states);
            swap_ok = taken.is_some();
            taken
        } else if mp > budget_bytes {
            let taken = recompute_best(ctxs, &mut states);
            recompute_ok = taken.is_some();
            taken
        } else {
            break;
        };
        if let Some(j) = changed {
            let before = states[j].peak.peak_bytes;
            states[j].peak = analyse(&ctxs[j], &states[j].gaps);
            let after = states[j].peak.peak_bytes;
            falls.push((before as f64 - after as f64) / before.max(1) as f64);
        }
        summary.iterations += 1;
    }
    summary.final_peak_bytes = merged(&states);
    (summary, states)
}

/// Algorithm 3 line 4 over jobs: "the average MP_j of the jobs corresponding
/// to the selected tensors in the past 3 iterations reduces less than 0.05%
/// and iter > 100". `falls` holds, per iteration, the relative fall of the
/// peak of the job whose tensor was taken; the rule reads each job's own
/// peak, not the merged one, so that adding jobs does not make every swap
/// look smaller. (With one job this is the single-job rule.)
fn stalled_jobs(falls: &[f64], iterations: usize) -> bool {
    if iterations <= MIN_ITERATIONS_BEFORE_STALL_CHECK || falls.len() < STALL_WINDOW {
        return false;
    }
    let window = &falls[falls.len() - STALL_WINDOW..];
    window.iter().sum::<f64>() / (STALL_WINDOW as f64) < STALL_FRACTION
}

/// Whether job `j` may take another swap under its max swapping rate.
fn within_rate(jobs: &[JobInput<'_>], states: &[JobState], j: usize) -> bool {
    let total: usize = states.iter().map(|s| s.swapped_tensors).sum();
    total == 0 || states[j].swapped_tensors as f64 <= jobs[j].max_swap_rate * total as f64
}

/// Algorithm 2 on the merged peak: the peak tensors of every job allowed to
/// swap, biggest first (ties: job, then tensor id), tried until one swaps
/// without a stall and lowers its job's peak. Returns the job that changed.
fn swap_biggest(
    ctxs: &[Ctx<'_>],
    jobs: &[JobInput<'_>],
    cost: &dyn CostModel,
    states: &mut [JobState],
) -> Option<usize> {
    let mut candidates: Vec<(u64, usize, TensorId)> = Vec::new();
    for (j, st) in states.iter().enumerate() {
        if within_rate(jobs, states, j) {
            candidates.extend(st.peak.tensors.iter().map(|&t| (ctxs[j].size(t), j, t)));
        }
    }
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (_, j, t) in candidates {
        let ctx = &ctxs[j];
        let JobState {
            state, gaps, peak, ..
        } = &mut states[j];
        let tas = AccessSequence::new(ctx);
        let lowers = |new: &[Gap]| lowers_and_hides(&tas, cost, gaps, new, peak);
        let new = schedule_peak(&tas, cost, state, peak.position, &[t], lowers);
        if new.is_empty() {
            continue;
        }
        let st = &mut states[j];
        st.swapped_tensors += 1;
        st.swap_gaps += new.len();
        st.cross_iteration_swaps += new.iter().filter(|g| g.before.is_none()).count();
        for g in &new {
            st.released[g.tensor.index()] = true;
        }
        st.gaps.extend(new);
        return Some(j);
    }
    None
}

/// Sec. IV-D on the merged peak: every job's recomputation candidates at its
/// peak, largest MSPS first (ties: job, then tensor id), the first whose
/// recomputation lowers its job's peak taken. (The recomputation's own
/// scratch counts at its position, so not every candidate lowers the peak;
/// the single-job loop takes the best regardless, this one keeps the greedy
/// premise that each scheduled tensor lowers MP.) Returns the job.
fn recompute_best(ctxs: &[Ctx<'_>], states: &mut [JobState]) -> Option<usize> {
    let mut all: Vec<(usize, Candidate)> = Vec::new();
    for (j, st) in states.iter().enumerate() {
        let tas = AccessSequence::new(&ctxs[j]);
        all.extend(
            recompute::candidates(
                &tas,
                &st.state,
                &st.released,
                st.peak.position,
                &st.peak.tensors,
            )
            .into_iter()
            .map(|c| (j, c)),
        );
    }
    all.sort_by(|(ja, a), (jb, b)| {
        b.msps
            .total_cmp(&a.msps)
            .then(ja.cmp(jb))
            .then(a.tensor.cmp(&b.tensor))
    });
    for (j, c) in all {
        let ctx = &ctxs[j];
        let st = &mut states[j];
        let mut trial = st.gaps.clone();
        trial.push(recompute::gap(&c));
        if peak_only(ctx, &trial).0 >= st.peak.peak_bytes {
            continue;
        }
        let gap = recompute::take(&AccessSequence::new(ctx), &mut st.state, &c);
        st.released[gap.tensor.index()] = true;
        st.recomputations += 1;
        st.gaps.push(gap);
        return Some(j);
    }
    None
}

/// Lowers, scores and proves each job's schedule (see the module docs); a
/// lowering or proof failure is a bug in this planner, reported as an error.
fn prove(
    ctxs: &[Ctx<'_>],
    states: &[JobState],
    cost: &dyn CostModel,
    budget_bytes: u64,
    summary: &MultiSummary,
) -> Result<Vec<JobPlan>, PlannerError> {
    let mut scratch = Scratch::default();
    let mut out = Vec::with_capacity(states.len());
    for (j, (ctx, st)) in ctxs.iter().zip(states).enumerate() {
        let schedule = ctx.schedule(st.gaps.clone());
        let evaluator = Evaluator::new(ctx.graph, cost, budget_bytes, AllocatorSpec::Perfect);
        let e = evaluator.evaluate(&schedule, &mut scratch);
        if e.is_broken() {
            let (kind, why) = match (&e.schedule_error, &e.first_violation) {
                (Some(x), _) => (PlannerErrorKind::Lowering, x.to_string()),
                (None, Some(v)) if !e.only_over_budget => {
                    (PlannerErrorKind::Verification, v.to_string())
                }
                _ => (PlannerErrorKind::Simulation, "the simulation failed".into()),
            };
            return Err(error(kind, format!("job {j}: {why}")));
        }
        let info = PlannerInfo {
            name: NAME.into(),
            seed: None,
            settings: serde_json::json!({
                "job": j,
                "jobs": states.len(),
                "algorithm3_iterations": summary.iterations,
                "planning_budget_bytes": summary.planning_budget_bytes,
                "swapped_tensors": st.swapped_tensors,
                "swap_gaps": st.swap_gaps,
                "cross_iteration_swaps": st.cross_iteration_swaps,
                "recomputations": st.recomputations,
                "modelled_peak_bytes": st.peak.peak_bytes,
            }),
        };
        let mut plan = evaluator
            .lower_plan(&schedule, info)
            .map_err(|err| error(PlannerErrorKind::Lowering, format!("job {j}: {err}")))?;
        let bound_bytes = e.bound.peak_bytes;
        plan.budget_bytes = bound_bytes;
        if let Some(v) = verify(&plan, ctx.graph).first() {
            return Err(error(
                PlannerErrorKind::Verification,
                format!("job {j}'s plan fails verify at its own bound: {v}"),
            ));
        }
        out.push(JobPlan {
            plan,
            bound_bytes,
            modelled_peak_bytes: st.peak.peak_bytes,
            swapped_tensors: st.swapped_tensors,
            swap_gaps: st.swap_gaps,
            cross_iteration_swaps: st.cross_iteration_swaps,
            recomputations: st.recomputations,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! The loop over jobs on hand-built MLP chains: the set is planned within
    //! one budget, every plan is proved at its bound, the rate limit holds,
    //! and bad input is an error while not fitting is a value.

    use super::*;
    use crate::framework::testing::v100;
    use crate::tensile::peak::analyse;
    use outcore_graph::footprint;

    /// ResNet-18: forward activations can leave behind the convolutions that
    /// follow them (in a plain MLP chain no hidden swap lowers the peak; see
    /// the single-job tests).
    fn resnet18(batch: u64) -> Graph {
        outcore_graph::zoo::build("resnet18", Some(batch), &Default::default(), None)
            .expect("zoo resnet18")
    }

    fn feasible(outcome: MultiOutcome) -> (Vec<JobPlan>, MultiSummary) {
        match outcome {
            MultiOutcome::Feasible { jobs, summary } => (jobs, summary),
            MultiOutcome::Infeasible { message, .. } => panic!("infeasible: {message}"),
        }
    }

    #[test]
    fn two_jobs_fit_one_budget_below_their_summed_peaks() {
        let cost = v100();
        let (a, b) = (resnet18(16), resnet18(8));
        let peak = |g: &Graph| analyse(&Ctx::in_graph_order(g, &cost), &[]).peak_bytes;
        let merged = peak(&a) + peak(&b);
        let jobs = [
            JobInput {
                graph: &a,
                max_swap_rate: 1.0,
            },
            JobInput {
                graph: &b,
                max_swap_rate: 1.0,
            },
        ];
        // Hidden swaps and recomputation bring ResNet-18 about 6% below its
        // own peak (measured: 700 of 747 MiB proven for this pair).
        let budget = merged * 95 / 100;
        let (plans, summary) = feasible(plan_jobs(&jobs, &cost, budget).expect("plans"));
        // MP before anything moves is the sum of the jobs' own peaks.
        assert_eq!(summary.first_peak_bytes, merged);
        assert!(summary.final_peak_bytes < merged);
        assert!(summary.bound_bytes <= budget, "{summary:?}");
        assert_eq!(
            summary.bound_bytes,
            plans.iter().map(|p| p.bound_bytes).sum::<u64>()
        );
        for (p, g) in plans.iter().zip([&a, &b]) {
            // Proved at its own bound (plan_jobs verified it; check again).
            assert_eq!(p.plan.budget_bytes, p.bound_bytes);
            assert!(verify(&p.plan, g).is_empty());
            assert!(p.bound_bytes <= footprint(g).0);
        }
        // Swapping does not need the budget (the paper's active scheduler):
        // something was swapped even though recomputation alone might do.
        assert!(plans.iter().map(|p| p.swapped_tensors).sum::<usize>() > 0);
    }

    #[test]
    fn a_rate_limited_job_holds_at_most_its_share_of_the_swaps() {
        let cost = v100();
        let (a, b) = (resnet18(16), resnet18(16));
        let rate = 0.25;
        let jobs = [
            JobInput {
                graph: &a,
                max_swap_rate: rate,
            },
            JobInput {
                graph: &b,
                max_swap_rate: 1.0,
            },
        ];
        let budget = footprint(&a).0 + footprint(&b).0;
        let (plans, _) = feasible(plan_jobs(&jobs, &cost, budget).expect("plans"));
        let (limited, free) = (plans[0].swapped_tensors, plans[1].swapped_tensors);
        let total = limited + free;
        assert!(free > 0, "the unlimited twin swaps");
        // A swap is taken while the job's share is within the rate, so after
        // its last one the share exceeds the rate by at most that one swap.
        assert!(
            limited as f64 <= rate * total as f64 + 1.0,
            "{limited} of {total} swapped tensors at rate {rate}"
        );
        // The identical twin without a limit takes more of them.
        assert!(free > limited, "{free} vs {limited}");
    }

    #[test]
    fn bad_input_is_an_error_and_a_tiny_budget_is_infeasible() {
        let cost = v100();
        let g = resnet18(2);
        let err = plan_jobs(&[], &cost, 1 << 30).expect_err("no jobs");
        assert_eq!(err.kind, PlannerErrorKind::InvalidRequest);
        assert!(err.message.contains("at least one job"), "{err}");
        for rate in [0.0, 1.5, f64::NAN, -1.0] {
            let jobs = [JobInput {
                graph: &g,
                max_swap_rate: rate,
            }];
            let err = plan_jobs(&jobs, &cost, 1 << 30).expect_err("bad rate");
            assert!(err.message.contains("(0, 1]"), "{rate}: {err}");
        }
        let jobs = [JobInput {
            graph: &g,
            max_swap_rate: 1.0,
        }];
        match plan_jobs(&jobs, &cost, 1024).expect("a value, not an error") {
            MultiOutcome::Infeasible { summary, message } => {
                assert!(summary.bound_bytes > 1024);
                assert!(message.contains("over the 1.00 KiB budget"), "{message}");
            }
            MultiOutcome::Feasible { .. } => panic!("1 KiB cannot hold a training step"),
        }
    }
}
