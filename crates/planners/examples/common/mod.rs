//! Helpers shared by the TENSILE examples of this crate (`mod common;`).

use outcore_cost::CostModel;
use outcore_cost::predict::{Dataset, MlpConfig, MlpPredictor, PerKindLeastSquares};
use outcore_graph::Graph;
use outcore_plan::{PlanOutcome, PlanRequest, verify};
use outcore_sim::{SimOptions, simulate};

/// `planner` at `budget_bytes` planning with `plan_cost`, simulated with
/// `true_cost`: (iteration time, peak, settings), or `None` if infeasible.
pub fn plan_and_simulate(
    planner: &str,
    g: &Graph,
    plan_cost: &dyn CostModel,
    true_cost: &dyn CostModel,
    budget_bytes: u64,
) -> Result<Option<(f64, u64, serde_json::Value)>, String> {
    let p = outcore_planners::by_name(planner)?;
    match p
        .plan(&PlanRequest::new(g, plan_cost, budget_bytes))
        .map_err(|e| e.to_string())?
    {
        PlanOutcome::Feasible(plan) => {
            if let Some(v) = verify(&plan, g).first() {
                return Err(format!("{planner} does not verify: {v}"));
            }
            let out =
                simulate(g, &plan, true_cost, &SimOptions::default()).map_err(|e| e.to_string())?;
            Ok(Some((
                out.report.iter_time_s,
                out.report.peak_live_bytes,
                plan.planner.settings,
            )))
        }
        PlanOutcome::Infeasible(_) => Ok(None),
    }
}

/// The rows of the items `held_out` rejects (training) and of those it
/// accepts (test).
pub fn split<T>(
    items: &[T],
    held_out: impl Fn(&T) -> bool,
    data: impl Fn(&T) -> &Dataset,
) -> (Dataset, Dataset) {
    let (mut train, mut test) = (Dataset::default(), Dataset::default());
    for item in items {
        if held_out(item) {
            test.extend(data(item).clone());
        } else {
            train.extend(data(item).clone());
        }
    }
    (train, test)
}

/// The two predictors compared: TENSILE's MLP (default configuration) and
/// the per-kind least squares, both fitted on `train`.
pub fn fit_both(train: &Dataset) -> Result<(MlpPredictor, PerKindLeastSquares), String> {
    let mlp = MlpPredictor::fit(train, &MlpConfig::default()).map_err(|e| e.to_string())?;
    let lsq = PerKindLeastSquares::fit(&train.deduplicated().samples).map_err(|e| e.to_string())?;
    Ok((mlp, lsq))
}
