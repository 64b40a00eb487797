//! Planning for the `offsets` allocator: any planner's plan, pinned to its
//! predicted timeline, laid out exactly ([`outcore_plan::lay_out_timed`]),
//! with the budget lowered while the layout needs more than the budget.
//!
//! Why pin: a plan orders its streams only where correctness needs it, so a
//! swap-out's free on the d2h stream is often never waited for, and a layout
//! valid for every timing must keep those bytes from everything allocated
//! after it. [`outcore_plan::pin_frees`] adds the waits the prediction
//! already satisfies (it is unchanged), so the layout may reuse them; the
//! price is that a copy slower than predicted delays the compute stream, as
//! any allocator that reuses a block another stream used must make it wait.
//! Measured on a saved BERT-base plan at a quarter of the footprint
//! (RESULTS.md): pinning alone took its layout from 19% over the plan's
//! memory bound to 9.5%.
//!
//! Why a loop around the planner rather than layout-aware planning: every
//! planner plans in bytes (the perfect allocator) and the layout of a plan
//! is exact for every timing, so the only way a layout misses the budget is
//! by its gaps, typically 0-1% of the plan's memory bound at half the
//! footprint, more where copies on three streams overlap loosely (RESULTS.md).
//! The plan is remade at a lower budget ([`plan_laid_out`]); six rounds at
//! most, so the planning time is at most six times the planner's.
//! Searching offsets inside the planners' own loops would cost a layout per
//! candidate (quadratic in the buffers) for that one percent.

use outcore_plan::{
    AllocatorSpec, Infeasible, InfeasibleKind, Plan, PlanOutcome, PlanRequest, Planner,
    PlannerError, PlannerErrorKind, TimedStep, fmt_bytes, lay_out_timed, pin_frees,
};
use outcore_sim::{SimOptions, simulate};

/// Plans at most this many times per request (module docs).
pub const LAYOUT_ROUNDS: usize = 6;

/// The smallest step of the cut, as a fraction of the budget (1/512: 0.2%),
/// so that five doublings reach 6%: a first layout a few bytes over the
/// budget otherwise started the cut at those bytes, and a plan remade that
/// little lower was over again (ViT-B/16 at a quarter on `h100-80gb`: six
/// rounds, no plan, RESULTS.md).
const MIN_CUT_PER_BUDGET: u64 = 512;

/// Whether `allocator` asks for a layout (an `offsets` allocator that lists
/// no allocation yet).
pub fn wants_layout(allocator: &AllocatorSpec) -> bool {
    matches!(allocator, AllocatorSpec::Offsets(c) if c.owners.is_empty())
}

/// Plans with `planner` for the perfect allocator at the request's budget,
/// lays the plan out, and while the layout spans more than the budget plans
/// again at a lower budget (module docs): the cut below the budget starts at
/// the layout's excess and at least doubles while layouts stay too tall; once
/// a cut leaves the planner with no plan, the next cut is halfway between the
/// largest too-small one and it (a bisection). A cut grows by at least 0.2%
/// of the budget (`MIN_CUT_PER_BUDGET`). The plan returned carries its
/// layout as its allocator, the request's budget, and in its settings
/// (`layout`) the layout's height, the plan's memory bound, the budget it was
/// planned at, the rounds taken and the time spent pinning and laying out.
/// The request's allocator is not read.
pub fn plan_laid_out(
    planner: &dyn Planner,
    request: &PlanRequest<'_>,
) -> Result<PlanOutcome, PlannerError> {
    let budget = request.budget_bytes;
    let mut cut = 0u64;
    // Cuts known to leave the layout too tall / the planner with no plan.
    let mut too_small = 0u64;
    let mut too_big: Option<(u64, String)> = None;
    let mut height = 0u64;
    let mut layout_time_s = 0.0;
    for round in 1..=LAYOUT_ROUNDS {
        let planned_at = budget - cut;
        let perfect = PlanRequest {
            budget_bytes: planned_at,
            allocator: &AllocatorSpec::Perfect,
            ..*request
        };
        let mut plan = match planner.plan(&perfect)? {
            PlanOutcome::Feasible(plan) => plan,
            PlanOutcome::Infeasible(why) if round == 1 => return Ok(PlanOutcome::Infeasible(why)),
            PlanOutcome::Infeasible(why) => {
                too_big = Some((cut, why.message));
                cut = too_small + (cut - too_small) / 2;
                continue;
            }
        };
        let t0 = std::time::Instant::now();
        let (pinned_waits, timeline) = pin(&mut plan, request, planner.name())?;
        let layout = lay_out_timed(&plan, request.graph, &timeline).map_err(|e| {
            PlannerError::new(
                planner.name(),
                PlannerErrorKind::Verification,
                e.to_string(),
            )
        })?;
        layout_time_s += t0.elapsed().as_secs_f64();
        height = layout.config.height_bytes;
        if height <= budget {
            if let serde_json::Value::Object(settings) = &mut plan.planner.settings {
                settings.insert(
                    "layout".into(),
                    serde_json::json!({
                        "height_bytes": height,
                        "memory_bound_bytes": layout.bound_bytes,
                        "buffers": layout.buffers,
                        "pinned_waits": pinned_waits,
                        "planned_at_budget_bytes": planned_at,
                        "rounds": round,
                        "layout_time_s": layout_time_s,
                    }),
                );
            }
            plan.budget_bytes = budget;
            plan.allocator = AllocatorSpec::Offsets(layout.config);
            return Ok(PlanOutcome::Feasible(plan));
        }
        too_small = cut;
        let excess = (height - budget).max(outcore_alloc::ALIGNMENT_BYTES);
        let grown = cut.saturating_add(excess.max(cut).max(budget / MIN_CUT_PER_BUDGET));
        cut = match &too_big {
            Some((big, _)) => cut + (big - cut) / 2,
            None => grown.min(budget - 1),
        };
    }
    let why_not = too_big.map_or(String::new(), |(big, message)| {
        format!(
            "; at {} the planner finds no plan ({message})",
            fmt_bytes(budget - big)
        )
    });
    Ok(infeasible(
        height,
        budget,
        format!(
            "after {LAYOUT_ROUNDS} plans at budgets from {} down, the last plan's layout still needs {} where the budget is {}{why_not}; give a larger budget, or plan with --allocator perfect",
            fmt_bytes(budget),
            fmt_bytes(height),
            fmt_bytes(budget),
        ),
    ))
}

/// Pins `plan`'s frees to its predicted timeline under the request's cost
/// model ([`pin_frees`]: the prediction is unchanged, and frees on one
/// stream are ordered before what the others allocate after them, as the
/// prediction has it, so the layout may reuse their bytes); returns the
/// waits added and the timeline.
fn pin(
    plan: &mut Plan,
    request: &PlanRequest<'_>,
    name: &str,
) -> Result<(usize, Vec<TimedStep>), PlannerError> {
    let options = SimOptions {
        iterations: 1,
        record_timeline: true,
        ..SimOptions::default()
    };
    let error = |kind, message: String| PlannerError::new(name, kind, message);
    let timeline = simulate(request.graph, plan, request.cost, &options)
        .map_err(|e| error(PlannerErrorKind::Simulation, e.to_string()))?
        .timeline
        .unwrap_or_default();
    let waits = pin_frees(plan, &timeline)
        .map_err(|e| error(PlannerErrorKind::Simulation, e.to_string()))?;
    Ok((waits, timeline))
}

/// The layout of the last plan made needs `height_bytes` of `budget_bytes`.
fn infeasible(height_bytes: u64, budget_bytes: u64, message: String) -> PlanOutcome {
    PlanOutcome::Infeasible(Infeasible {
        kind: InfeasibleKind::AllocatorFailure,
        needed_bytes: Some(height_bytes),
        budget_bytes,
        at: None,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_cost::UnitCostModel;
    use outcore_graph::{footprint, zoo};

    fn tiny_cnn() -> outcore_graph::Graph {
        let knobs = [("depth".to_string(), 8), ("width".to_string(), 8)].into();
        zoo::build("tiny-cnn", Some(16), &knobs, None).expect("zoo")
    }

    #[test]
    fn a_recomputing_plan_is_laid_out_within_the_budget() {
        let g = tiny_cnn();
        let budget = footprint(&g).0 * 40 / 100;
        let request = PlanRequest::new(&g, &UnitCostModel, budget);
        let dtr = crate::by_name("dtr").expect("dtr");
        let plan = match plan_laid_out(dtr.as_ref(), &request).expect("plans") {
            PlanOutcome::Feasible(plan) => plan,
            PlanOutcome::Infeasible(why) => panic!("{why:?}"),
        };
        assert_eq!(plan.budget_bytes, budget);
        let AllocatorSpec::Offsets(c) = &plan.allocator else {
            panic!("not laid out: {:?}", plan.allocator);
        };
        assert!(c.height_bytes <= budget);
        let v = outcore_plan::verify(&plan, &g);
        assert!(v.is_empty(), "{}", v[0]);
        let layout = &plan.planner.settings["layout"];
        assert!(
            layout["rounds"].as_u64().is_some_and(|r| r >= 1),
            "{layout}"
        );
    }

    /// Pinning a swapping plan (`odswap` on tiny-transformer at 40%, on a
    /// V100's roofline, where the d2h stream lags the compute stream) adds
    /// waits, keeps the predicted iteration exactly, and the plan still
    /// verifies and lays out within its budget.
    #[test]
    fn pinning_keeps_the_prediction_and_the_plan_verifies() {
        use outcore_cost::{DeviceProfile, RooflineModel};
        let knobs = [("layers".to_string(), 2)].into();
        let g = zoo::build("tiny-transformer", Some(8), &knobs, None).expect("zoo");
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
        let budget = footprint(&g).0 * 40 / 100;
        let request = PlanRequest::new(&g, &cost, budget);
        let odswap = crate::by_name("odswap").expect("odswap");
        let PlanOutcome::Feasible(plan) = odswap.plan(&request).expect("plans") else {
            panic!("odswap finds no plan at 40%");
        };
        let predict = |p: &Plan| {
            simulate(&g, p, &cost, &SimOptions::default())
                .expect("simulates")
                .report
                .iter_time_s
        };
        let mut pinned = plan.clone();
        let (waits, timeline) = pin(&mut pinned, &request, "odswap").expect("pins");
        assert!(waits > 0, "no wait added");
        let total_waits =
            |p: &Plan| -> usize { p.streams.iter().flatten().map(|st| st.waits.len()).sum() };
        let added = total_waits(&pinned) - total_waits(&plan);
        assert_eq!(added, waits);
        assert_eq!(predict(&pinned), predict(&plan));
        let v = outcore_plan::verify(&pinned, &g);
        assert!(v.is_empty(), "{}", v[0]);
        let layout = lay_out_timed(&pinned, &g, &timeline).expect("lays out");
        pinned.allocator = AllocatorSpec::Offsets(layout.config);
        let v = outcore_plan::verify(&pinned, &g);
        assert!(v.is_empty(), "{}", v[0]);
    }

    #[test]
    fn a_budget_no_plan_fits_stays_infeasible() {
        let g = tiny_cnn();
        let request = PlanRequest::new(&g, &UnitCostModel, 1024);
        let dtr = crate::by_name("dtr").expect("dtr");
        assert!(matches!(
            plan_laid_out(dtr.as_ref(), &request).expect("no planner error"),
            PlanOutcome::Infeasible(_)
        ));
    }
}
