//! `odswap`: SwapAdvisor's on-demand LRU swapping baseline (paper 000, Sec. 6.1).
//!
//! First iteration: whenever an op's memory would exceed the budget, the least
//! recently used resident tensor not used by that op is swapped out, the op waiting
//! for the copy (synchronous eviction), and it is swapped back in on demand, just
//! before its next use. Later iterations know the access order from the first, so
//! every swap-in is issued a fixed number of ops ahead of its use (prefetch). The
//! plan returned is the steady-state one; the first iteration's throughput is in
//! `settings.first_iteration_throughput`.
//!
//! Choices where the paper is vague:
//! - The look-ahead is fixed at `LOOKAHEAD_OPS` ops, never before the eviction.
//! - Persistent tensors are LRU candidates too; one evicted stays on the host
//!   across the iteration boundary.
//! - Each margin of `framework::MARGINS` is tried in turn until the steady-state
//!   plan scores feasible; the first iteration is scored at the same margin.
//! - Evictions are the same in both iterations (the prefetch only changes when
//!   swap-ins start), which is what a deterministic LRU replays.

use crate::framework::{
    Choice, Ctx, Evictable, Pick, Score, Scratch, Search, Shortfall, evict_on_demand,
};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError};

/// On-demand LRU swapping with a fixed prefetch look-ahead in steady state.
#[derive(Debug, Default)]
pub struct OdSwap;

/// Ops ahead of a use at which the steady-state swap-in starts.
pub const LOOKAHEAD_OPS: usize = 4;

impl Planner for OdSwap {
    fn name(&self) -> &'static str {
        "odswap"
    }

    fn description(&self) -> &'static str {
        "on-demand LRU swapping, then prefetch from the observed order (SwapAdvisor Sec. 6.1 baseline)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let steady = search.best(
            "after swapping on demand",
            &[()],
            Pick::Fastest,
            |_, scratch| {
                search.with_margins(scratch, |budget_bytes, margin| {
                    let settings = serde_json::json!({
                        "lookahead_ops": LOOKAHEAD_OPS,
                        "planning_margin": margin,
                    });
                    (settings, odswap_gaps(&ctx, budget_bytes, LOOKAHEAD_OPS))
                })
            },
        )?;
        let PlanOutcome::Feasible(mut plan) = steady else {
            return Ok(steady);
        };
        // The first iteration: the same evictions swapped in on demand.
        let margin = plan.planner.settings["planning_margin"]
            .as_f64()
            .unwrap_or(1.0);
        let budget_bytes = crate::framework::margin_budget(request.budget_bytes, margin);
        let first_throughput = match odswap_gaps(&ctx, budget_bytes, 0) {
            Ok(gaps) => match search
                .scored(serde_json::Value::Null, gaps, &mut Scratch::default())?
                .score
            {
                Score::Feasible {
                    throughput_vs_ideal,
                    ..
                } => Some(throughput_vs_ideal),
                _ => None,
            },
            Err(_) => None,
        };
        if let serde_json::Value::Object(map) = &mut plan.planner.settings {
            map.insert("first_iteration_throughput".into(), first_throughput.into());
        }
        Ok(PlanOutcome::Feasible(plan))
    }
}

/// The LRU evictions under `budget_bytes`, each swap-in `lookahead_ops` ahead of
/// its use (0: on demand).
pub(crate) fn odswap_gaps(
    ctx: &Ctx<'_>,
    budget_bytes: u64,
    lookahead_ops: usize,
) -> Result<Vec<Gap>, Shortfall> {
    // Lead in seconds of the `lookahead_ops` ops before each use, found per
    // candidate: the trigger search takes a time, so convert ops to time here.
    evict_on_demand(ctx, budget_bytes, false, |_q, cands: &[Evictable]| {
        let i = least_recently_used(cands)?;
        let c = &cands[i];
        let lead_s = if lookahead_ops == 0 {
            0.0
        } else {
            let lo = c.before.saturating_sub(lookahead_ops);
            // Just under the compute time of the look-ahead ops, so that the
            // trigger lands exactly `lookahead_ops` before the use.
            ctx.time_s(lo, c.before) * (1.0 - 1e-9)
        };
        Some((i, Choice::Swap { lead_s }))
    })
}

/// The candidate accessed longest ago (ties: lower tensor id, for determinism).
pub(crate) fn least_recently_used(cands: &[Evictable]) -> Option<usize> {
    cands
        .iter()
        .enumerate()
        .min_by_key(|(_, c)| (c.last_access, c.tensor))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{mlp_chain, v100};

    #[test]
    fn evicts_the_least_recently_used_tensor() {
        let graph = mlp_chain(6, 256, 64);
        let cost = v100();
        for order in [
            crate::framework::graph_order(&graph),
            outcore_plan::random_topological_order(&graph, 9),
        ] {
            evicts_lru_on(&Ctx::new(&graph, &cost, order));
        }
    }

    fn evicts_lru_on(ctx: &Ctx<'_>) {
        let graph = ctx.graph;
        let (footprint_bytes, _) = outcore_graph::footprint(graph);
        // Just under the peak, so that the first pressure point comes after every
        // weight's first use (no weight is evicted before it is first read).
        let budget_bytes = footprint_bytes * 19 / 20;
        let gaps = odswap_gaps(ctx, budget_bytes, 0).expect("plans");
        let first = gaps.first().expect("something is evicted");
        let q = first.reclaim_before.expect("the eviction is synchronous");
        // Independently: the resident tensors not used at q with a later use, and
        // the oldest previous use among them.
        let oldest = ctx
            .owners()
            .filter(|&t| ctx.size(t) > 0)
            .filter(|&t| {
                let (lo, hi) = ctx.base_interval(t);
                lo <= q && q <= hi && !ctx.uses[t.index()].contains(&q)
            })
            .filter_map(|t| match ctx.neighbours(t, q) {
                (Some(a), Some(_)) => Some(a),
                // A weight after its last use waits for the next iteration.
                (Some(a), None) if ctx.persistent(t) => Some(a),
                _ => None,
            })
            .min()
            .expect("candidates");
        assert_eq!(first.after, Some(oldest));
        // On demand: the swap-in starts right before the use.
        if let Some(b) = first.before {
            assert_eq!(first.prefetch_after, Some(b - 1));
        }
        let ahead = odswap_gaps(ctx, budget_bytes, LOOKAHEAD_OPS).expect("plans");
        assert!(ahead.iter().any(|g| {
            g.prefetch_after
                .zip(g.before)
                .is_some_and(|(p, b)| p + 1 < b)
        }));
    }
}
