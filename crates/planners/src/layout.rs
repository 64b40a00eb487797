//! Planning for the `offsets` allocator: any planner's plan, laid out
//! exactly ([`outcore_plan::lay_out`]), with the budget lowered while the
//! layout needs more than the budget.
//!
//! Why a loop around the planner rather than layout-aware planning: every
//! planner plans in bytes (the perfect allocator) and the layout of a plan
//! is exact for every timing, so the only way a layout misses the budget is
//! by its gaps, typically 0-2% of the plan's memory bound at half the
//! footprint, more where copies on three streams overlap loosely (RESULTS.md).
//! The plan is remade at a lower budget ([`plan_laid_out`]); six rounds at
//! most, so the planning time is at most six times the planner's.
//! Searching offsets inside the planners' own loops would cost a layout per
//! candidate (quadratic in the buffers) for that one percent.

use outcore_plan::{
    AllocatorSpec, Infeasible, InfeasibleKind, PlanOutcome, PlanRequest, Planner, PlannerError,
    fmt_bytes, lay_out,
};

/// Plans at most this many times per request (module docs).
pub const LAYOUT_ROUNDS: usize = 6;

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
/// largest too-small one and it (a bisection). The plan returned carries its
/// layout as its allocator, the request's budget, and in its settings
/// (`layout`) the layout's height, the plan's memory bound, the budget it was
/// planned at, the rounds taken and the time spent laying out. The request's
/// allocator is not read.
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
        let layout = lay_out(&plan, request.graph).map_err(|e| {
            PlannerError::new(
                planner.name(),
                outcore_plan::PlannerErrorKind::Verification,
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
        let grown = cut.saturating_add(excess.max(cut));
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
