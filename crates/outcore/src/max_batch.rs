//! The largest batch each planner can train under a fixed budget (HOME's
//! Table 2 question, issue 12), and its simulated throughput there.
//!
//! The search doubles the zoo model's batch from 1 until a planner finds no
//! feasible plan (or the limit is reached), then bisects between the last
//! feasible and the first infeasible batch. Feasibility is *assumed* monotone
//! in the batch: a larger batch has larger tensors and the same op order, so a
//! planner that fits batch b usually fits every smaller batch. Search planners
//! (HOME's PSO, the joint search) are not guaranteed to be monotone, so the
//! answer is "a batch that plans, with the next larger one that did not", not
//! a proof that no larger batch plans. Each probe is judged like `compare`:
//! verified, and simulated under the asked allocator without an allocation
//! failure.

use crate::BudgetHint;
use crate::error::{Error, ErrorKind, Result};
use crate::input::{GraphSource, cost_model, load_graph, planner_for};
use crate::planning::{PlanOptions, PlannerOutcome, Runnability, Target, plan_and_check};
use outcore_cost::{CostModel, DeviceProfile};
use outcore_plan::{AllocatorSpec, Planner, fmt_bytes};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// What to search: a zoo model with its settings, and the budget on a device.
#[derive(Debug, Clone)]
pub struct MaxBatchRequest {
    /// Zoo model name (the batch is what is searched, so no graph file).
    pub model: String,
    pub knobs: BTreeMap<String, u64>,
    /// `sgd`, `adam`, `adamw` or `none`; `None`: the model's default.
    pub optimizer: Option<String>,
    pub device: DeviceProfile,
    /// In `[1, device memory]`; a size, not a share of a footprint, since the
    /// footprint grows with the batch.
    pub budget_bytes: u64,
    pub allocator: AllocatorSpec,
    /// The largest batch tried, in `[1, zoo::MAX_BATCH]`.
    pub batch_limit: u64,
}

/// One planner's answer.
#[derive(Debug, Clone, Serialize)]
pub struct MaxBatchRow {
    pub planner: String,
    /// The largest batch found feasible; `None` when batch 1 is not.
    pub max_batch: Option<u64>,
    /// The smallest batch found infeasible (`None`: the limit itself plans,
    /// so the answer is at least the limit).
    pub first_infeasible_batch: Option<u64>,
    /// Simulated seconds per iteration at `max_batch`.
    pub iter_time_s: Option<f64>,
    /// `max_batch / iter_time_s`.
    pub throughput_samples_per_s: Option<f64>,
    /// Why `first_infeasible_batch` does not plan.
    pub reason: Option<String>,
    /// Set when a probe's plan failed verification or simulation (a planner
    /// bug): the search of this planner stopped there.
    pub not_runnable: Option<String>,
    /// Batches planned, and the wall time they took.
    pub probes: u32,
    pub search_time_s: f64,
}

/// Every planner's answer for one model, device and budget.
#[derive(Debug, Clone, Serialize)]
pub struct MaxBatchResult {
    pub model: String,
    pub knobs: BTreeMap<String, u64>,
    pub device: String,
    pub budget_bytes: u64,
    pub allocator: String,
    pub batch_limit: u64,
    /// How the batch was searched, in words (the monotonicity assumption).
    pub method: String,
    pub rows: Vec<MaxBatchRow>,
    /// Where no planner listed plans batch 1 (and none failed verification):
    /// a budget under which batch 1 has a plan ([`crate::budget_hint`] at
    /// batch 1; `None` also when none plans up to four times the budget).
    pub budget_hint: Option<BudgetHint>,
}

impl MaxBatchResult {
    /// Whether no planner listed plans even batch 1 (the budget is too small
    /// for the model, not a planner's bug: none failed verification).
    pub fn none_trains(&self) -> bool {
        self.rows
            .iter()
            .all(|r| r.max_batch.is_none() && r.not_runnable.is_none())
    }
}

/// What one batch gave: the iteration time when feasible, else why not.
enum Probe {
    Feasible(f64),
    Infeasible(String),
    NotRunnable(String),
}

/// The largest batch each of `planners` plans under `request`'s budget, by
/// doubling then bisection (see the module doc), with its throughput.
/// `options.on_progress` is told after each planner (planners done, asked for).
pub fn max_batch(
    request: &MaxBatchRequest,
    planners: &[String],
    options: &PlanOptions,
) -> Result<MaxBatchResult> {
    check_request(request)?;
    crate::input::check_time_limit_s(options.time_limit_s)?;
    let chosen = planners
        .iter()
        .map(|name| planner_for(name, options))
        .collect::<Result<Vec<_>>>()?;
    crate::input::check_moves_counted(planners, options)?;
    // Fail on a bad model or knob, or a latency table of another graph,
    // before any planning.
    let first = load_at(request, 1)?;
    crate::input::check_latency_table(options.latency_table.as_ref(), &first.graph)?;
    let cost = cost_model(request.device.clone(), options.latency_table.as_ref());
    let total = u32::try_from(chosen.len()).unwrap_or(u32::MAX);
    let mut rows = Vec::with_capacity(chosen.len());
    for planner in &chosen {
        rows.push(search_one(
            planner.as_ref(),
            request,
            cost.as_ref(),
            options,
        )?);
        let done = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        crate::planning::tell_progress(options, "planners", done, total)?;
    }
    let mut result = MaxBatchResult {
        model: request.model.clone(),
        knobs: request.knobs.clone(),
        device: request.device.name.clone(),
        budget_bytes: request.budget_bytes,
        allocator: request.allocator.name().to_string(),
        batch_limit: request.batch_limit,
        method: "doubling from batch 1, then bisection; feasibility assumed monotone in the batch"
            .into(),
        rows,
        budget_hint: None,
    };
    if result.none_trains() {
        result.budget_hint = hint_at_batch_one(request, options)?;
    }
    Ok(result)
}

/// The budget hint for the model at batch 1 under the request's budget.
fn hint_at_batch_one(
    request: &MaxBatchRequest,
    options: &PlanOptions,
) -> Result<Option<BudgetHint>> {
    let (graph, target) = at_batch(request, 1)?;
    Ok(crate::budget_hint(&graph, &target, options))
}

/// The budget lies on the device and the batch limit in the zoo's range.
fn check_request(request: &MaxBatchRequest) -> Result<()> {
    request.device.validate()?;
    let memory_bytes = request.device.memory_bytes;
    if request.budget_bytes == 0 {
        return Err(Error::invalid(
            "budget",
            "0",
            "must be positive",
            format!(
                "[1, {memory_bytes}] bytes, e.g. 11GB (a size: a share of the footprint changes with the batch)"
            ),
        ));
    }
    if request.budget_bytes > memory_bytes {
        return Err(ErrorKind::BudgetOverDevice {
            budget_bytes: request.budget_bytes,
            device: request.device.name.clone(),
            memory_bytes,
        }
        .into());
    }
    let max = outcore_graph::zoo::MAX_BATCH;
    if !(1..=max).contains(&request.batch_limit) {
        return Err(Error::invalid(
            "batch limit (--limit)",
            request.batch_limit.to_string(),
            "out of range",
            format!("a whole number in [1, {max}], e.g. 65536"),
        ));
    }
    crate::planning::check_chunk_fits(&request.allocator, request.budget_bytes)
}

/// The model at `batch`.
fn load_at(request: &MaxBatchRequest, batch: u64) -> Result<crate::LoadedGraph> {
    load_graph(&GraphSource::Zoo {
        model: request.model.clone(),
        batch: Some(batch),
        knobs: request.knobs.clone(),
        optimizer: request.optimizer.clone(),
    })
}

/// The model at `batch` and the request's target for it.
fn at_batch(request: &MaxBatchRequest, batch: u64) -> Result<(crate::LoadedGraph, Target)> {
    let graph = load_at(request, batch)?;
    let target = Target::new(
        &graph,
        request.device.clone(),
        request.budget_bytes,
        request.allocator.clone(),
    )?;
    Ok((graph, target))
}

/// Plans the model at `batch` and judges the plan as `compare` does.
fn probe(
    planner: &dyn Planner,
    request: &MaxBatchRequest,
    cost: &dyn CostModel,
    options: &PlanOptions,
    batch: u64,
) -> Result<Probe> {
    let (graph, target) = at_batch(request, batch)?;
    let outcome: PlannerOutcome = plan_and_check(planner, &graph, cost, &target, options);
    let reason = || outcome.reason.clone().unwrap_or_default();
    Ok(match (outcome.status, &outcome.report) {
        (Runnability::Feasible, Some(report)) => Probe::Feasible(report.iter_time_s),
        (Runnability::NotRunnable, _) => Probe::NotRunnable(reason()),
        _ => Probe::Infeasible(reason()),
    })
}

/// Doubling then bisection for one planner.
fn search_one(
    planner: &dyn Planner,
    request: &MaxBatchRequest,
    cost: &dyn CostModel,
    options: &PlanOptions,
) -> Result<MaxBatchRow> {
    let t0 = Instant::now();
    let mut row = MaxBatchRow {
        planner: planner.name().to_string(),
        max_batch: None,
        first_infeasible_batch: None,
        iter_time_s: None,
        throughput_samples_per_s: None,
        reason: None,
        not_runnable: None,
        probes: 0,
        search_time_s: 0.0,
    };
    // Largest feasible (batch, time) and smallest infeasible batch so far.
    let mut good: Option<(u64, f64)> = None;
    let mut bad: Option<u64> = None;
    let mut next = Some(1);
    while let Some(batch) = next {
        row.probes += 1;
        match probe(planner, request, cost, options, batch)? {
            Probe::Feasible(time_s) => good = Some((batch, time_s)),
            Probe::Infeasible(why) => {
                bad = Some(batch);
                row.reason = Some(why);
            }
            Probe::NotRunnable(why) => {
                row.not_runnable = Some(format!("batch {batch}: {why}"));
                break;
            }
        }
        next = next_batch(good.map(|g| g.0), bad, request.batch_limit);
    }
    if let Some((batch, time_s)) = good {
        row.max_batch = Some(batch);
        row.iter_time_s = Some(time_s);
        row.throughput_samples_per_s = Some(batch as f64 / time_s);
    }
    row.first_infeasible_batch = bad;
    if row.max_batch.is_none() && row.not_runnable.is_none() {
        row.reason = Some(format!(
            "not even batch 1 plans under {}: {}",
            fmt_bytes(request.budget_bytes),
            row.reason.unwrap_or_default()
        ));
    }
    row.search_time_s = t0.elapsed().as_secs_f64();
    Ok(row)
}

/// The next batch to try: double the largest feasible one until one fails (or
/// the limit), then the midpoint; `None` when the answer is known.
pub fn next_batch(good: Option<u64>, bad: Option<u64>, limit: u64) -> Option<u64> {
    match (good, bad) {
        // Batch 1 failed: nothing plans.
        (None, Some(_)) => None,
        (None, None) => Some(1),
        (Some(lo), None) if lo >= limit => None,
        (Some(lo), None) => Some(lo.saturating_mul(2).min(limit)),
        (Some(lo), Some(hi)) if hi - lo <= 1 => None,
        (Some(lo), Some(hi)) => Some(lo + (hi - lo) / 2),
    }
}

#[cfg(test)]
mod tests {
    use super::{MaxBatchRequest, max_batch, next_batch};
    use crate::PlanOptions;
    use outcore_cost::DeviceProfile;
    use outcore_plan::AllocatorSpec;

    /// A move count bounds `outcore`'s searches here as in `plan`: where no
    /// planner asked for counts moves it is refused, not ignored.
    #[test]
    fn a_move_count_without_outcore_is_refused() {
        let request = MaxBatchRequest {
            model: "mlp".into(),
            knobs: Default::default(),
            optimizer: None,
            device: DeviceProfile::builtin("a100-40gb").expect("profile"),
            budget_bytes: 1 << 30,
            allocator: AllocatorSpec::Perfect,
            batch_limit: 8,
        };
        let options = PlanOptions {
            max_moves: Some(10),
            ..PlanOptions::default()
        };
        let e = max_batch(&request, &["checkpoint-sqrt".into()], &options).expect_err("refused");
        assert!(e.to_string().contains("has no move count"), "{e}");
    }

    /// Replays the search against a known threshold: every batch up to `max`
    /// plans. The answer is `max` (capped at the limit), found in about
    /// 2 log2(max) probes.
    fn search(max: u64, limit: u64) -> (Option<u64>, u32) {
        let (mut good, mut bad, mut probes) = (None, None, 0);
        while let Some(b) = next_batch(good, bad, limit) {
            probes += 1;
            if b <= max {
                good = Some(b);
            } else {
                bad = Some(b);
            }
        }
        (good, probes)
    }

    #[test]
    fn doubling_then_bisection_finds_the_threshold() {
        for max in [0, 1, 2, 3, 7, 8, 9, 100, 1000, 4095] {
            let (found, probes) = search(max, 1 << 16);
            assert_eq!(found, (max > 0).then_some(max), "threshold {max}");
            assert!(probes <= 2 * 17, "threshold {max}: {probes} probes");
        }
        // At the limit: the limit itself is the answer, and nothing above it is tried.
        assert_eq!(search(1 << 20, 1000).0, Some(1000));
        assert_eq!(search(999, 1000).0, Some(999));
    }
}
