//! `capuchin`: Capuchin (Peng et al., ASPLOS 2020) as HOME (paper 002, Sec. 2.2 and
//! 4.1) and TENSILE (paper 004, Sec. II and V-A) describe and reimplement it.
//!
//! Walking the ops in access order, wherever memory would exceed the budget, a
//! resident tensor not used by that op leaves the device: swapped when its copies
//! can be hidden (the swap-out fits the compute between its last use and the
//! pressure point, the swap-in the compute before its next use), otherwise
//! recomputed when that costs less than the exposed copy time, the recompute
//! candidates ranked by MSPS (memory saved per second of recomputation). Swap-ins
//! are timed just in time from the cost model; a feedback loop then re-plans with
//! the prefetch lead stretched and keeps the fastest simulated plan (Capuchin's
//! measured-execution feedback).
//!
//! Choices where the papers are vague:
//! - The cost of a candidate per byte is its exposed copy time (0 when hidden) for
//!   a swap and its producer's run time for a recomputation; the cheapest per byte
//!   goes first, older last accesses first among equals.
//! - Only single-op recomputations whose inputs are resident at the reuse are
//!   considered (no recomputation chains).
//! - Feedback is global, not per tensor: the simulator reports no per-op stalls,
//!   so the rounds scale every prefetch lead by 1, 1.5, 2 and 3.
//! - If no round gives a feasible plan, a swap-only variant is tried before giving up.
//! - Each round plans against the tightening margins of `framework::MARGINS`
//!   until a plan scores feasible; the rounds are scored in parallel.

use crate::framework::{Choice, Ctx, Evictable, Pick, Search, Shortfall, evict_on_demand};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError};

/// Capuchin-style swap-or-recompute under memory pressure.
#[derive(Debug, Default)]
pub struct Capuchin;

/// Prefetch-lead multipliers tried by the feedback rounds.
const LEAD_FACTORS: [f64; 4] = [1.0, 1.5, 2.0, 3.0];

impl Planner for Capuchin {
    fn name(&self) -> &'static str {
        "capuchin"
    }

    fn description(&self) -> &'static str {
        "evict on pressure in access order: swap when hidden, else recompute by MSPS; feedback on prefetch timing (Capuchin per HOME Sec. 2.2, TENSILE Sec. V-A)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let mut outcome = None;
        for allow_recompute in [true, false] {
            let result = search.best(
                "after evicting on pressure",
                &LEAD_FACTORS,
                Pick::Fastest,
                |&lead_factor, scratch| {
                    search.with_margins(scratch, |budget_bytes, margin| {
                        let settings = serde_json::json!({
                            "prefetch_lead_factor": lead_factor,
                            "recompute": allow_recompute,
                            "planning_margin": margin,
                        });
                        let gaps = capuchin_gaps(
                            &ctx,
                            request,
                            budget_bytes,
                            lead_factor,
                            allow_recompute,
                        );
                        (settings, gaps)
                    })
                },
            )?;
            if matches!(result, PlanOutcome::Feasible(_)) {
                return Ok(result);
            }
            // The infeasibility of the first variant (with recomputation) is
            // the one reported.
            outcome.get_or_insert(result);
        }
        Ok(outcome.unwrap_or_else(|| {
            PlanOutcome::Infeasible(search.infeasible("after evicting on pressure", &[]))
        }))
    }
}

/// The gaps Capuchin's policy chooses under `budget_bytes`.
pub(crate) fn capuchin_gaps(
    ctx: &Ctx<'_>,
    request: &PlanRequest<'_>,
    budget_bytes: u64,
    lead_factor: f64,
    allow_recompute: bool,
) -> Result<Vec<Gap>, Shortfall> {
    let cost = request.cost;
    evict_on_demand(
        ctx,
        budget_bytes,
        allow_recompute,
        |_q, cands: &[Evictable]| capuchin_choice(cost, lead_factor, cands),
    )
}

/// Capuchin's pick among the candidates at one pressure point: the cheapest per
/// byte, where a hidden swap costs nothing, an exposed one its stall, and a
/// recomputation its run time (considered only when the swap would stall).
pub(crate) fn capuchin_choice(
    cost: &dyn outcore_cost::CostModel,
    lead_factor: f64,
    cands: &[Evictable],
) -> Option<(usize, Choice)> {
    let mut best: Option<(f64, i64, usize, Choice)> = None;
    for (i, c) in cands.iter().enumerate() {
        let size = c.size_bytes.max(1) as f64;
        let h2d_s = cost.h2d_time_s(c.size_bytes);
        let d2h_s = cost.d2h_time_s(c.size_bytes);
        let exposed_s = (h2d_s - c.ahead_s).max(0.0) + (d2h_s - c.behind_s).max(0.0);
        let swap = Choice::Swap {
            lead_s: h2d_s * lead_factor,
        };
        // Recompute only what cannot be swapped for free (Capuchin prefers swapping).
        let recompute = c
            .recompute_s
            .filter(|_| exposed_s > 0.0)
            .map(|r| (r, Choice::Recompute));
        // Chained, not collected into a vector: this runs for every
        // candidate of every eviction, and with a vector `malloc` and
        // `free` took 15% of `capuchin`'s samples.
        for (cost_s, choice) in std::iter::once((exposed_s, swap)).chain(recompute) {
            let per_byte = cost_s / size;
            let better = best
                .as_ref()
                .is_none_or(|b| per_byte < b.0 || (per_byte == b.0 && c.last_access < b.1));
            if better {
                best = Some((per_byte, c.last_access, i, choice));
            }
        }
    }
    best.map(|b| (b.2, b.3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::v100;
    use outcore_graph::TensorId;

    fn candidate(id: u32, ahead_s: f64, recompute_s: Option<f64>) -> Evictable {
        Evictable {
            tensor: TensorId(id),
            size_bytes: 64 << 20,
            after: 1,
            before: 9,
            wraps: false,
            last_access: 1,
            ahead_s,
            behind_s: ahead_s,
            recompute_s,
        }
    }

    #[test]
    fn recomputes_what_cannot_be_hidden_and_swaps_what_can() {
        let cost = v100();
        // 64 MiB takes milliseconds over PCIe; 1 us of compute hides nothing.
        let exposed = candidate(1, 1e-6, Some(1e-5));
        let hidden = candidate(2, 1.0, Some(1e-5));
        match capuchin_choice(&cost, 1.0, std::slice::from_ref(&exposed)) {
            Some((0, Choice::Recompute)) => {}
            other => panic!("expected a recomputation, got {other:?}"),
        }
        match capuchin_choice(&cost, 1.0, std::slice::from_ref(&hidden)) {
            Some((0, Choice::Swap { .. })) => {}
            other => panic!("expected a swap, got {other:?}"),
        }
        // Both at once: the free (hidden) swap goes first.
        match capuchin_choice(&cost, 1.0, &[exposed, hidden]) {
            Some((1, Choice::Swap { .. })) => {}
            other => panic!("expected the hidden swap, got {other:?}"),
        }
        // Not recomputable and not hidden: swapped anyway.
        match capuchin_choice(&cost, 1.0, &[candidate(3, 1e-6, None)]) {
            Some((0, Choice::Swap { .. })) => {}
            other => panic!("expected a swap, got {other:?}"),
        }
    }
}
