//! Room at the largest working set: the saved activations resident across
//! the op with the largest working set recomputed, so that the polish
//! ([`super::local::polish`]) can start swap-ins there.
//!
//! Why: where the backward pass waits on the h2d link, a swap-in can start
//! only where memory has room for it, and the op with the largest working
//! set leaves the least. On the PyTorch GPT-2 export at a quarter of its
//! footprint the LM head's `_log_softmax_backward_data` holds three 196 MiB
//! tensors; beside them the fastest schedule keeps about 250 MiB of saved
//! activations (softmaxes, q/k copies, residual sums), memory is full, and
//! on `v100-16gb-pcie3` the h2d link idles for 14.8 ms around the LM head
//! while the backward pass after it waits on copies. No single move frees
//! enough to start a swap-in there: one 3 MiB recomputation is a little
//! slower and leads nothing, so the search never takes it. Recomputing them
//! together, each kept only where the schedule still verifies and fits
//! (dropout masks may not be recomputed; a residual sum's chain may not
//! hold), and polishing from there, took the `outcore` plan at 5 s to
//! 0.2104 s where the same polish from the plan itself ends at 0.2126 s,
//! and on `h100-80gb` to 0.04820 s against 0.04998 s (a probe). Inside the
//! planner, in four paired 54 s runs on `h100-80gb`: 0.0469-0.0476 s
//! against 0.0479-0.0489 s without it; on `v100-16gb-pcie3` 0.2039 s
//! against 0.2035 s (RESULTS.md, issue-16 section, "Room at the largest
//! working set").
//!
//! Cheapest per byte first (the producer's time over the tensor's bytes):
//! the recomputations cost compute, which a link-bound backward pass has to
//! spare, but not without limit, so at most [`ROOM_RECOMPUTATIONS`] are
//! taken and the schedule may get at most [`ROOM_SLOWDOWN`] slower before
//! the polish.

use super::local::Cost;
use super::moves::{Kinds, Move, Neighbourhood, apply};
use crate::framework::{Ctx, Score, Scratch, Search};
use outcore_cost::CostModel;
use outcore_graph::TensorId;
use outcore_plan::Schedule;
use std::time::Instant;

/// At most this many recomputations are added. On the GPT-2 export at 25%
/// (above) 32 freed 108 MiB on `v100-16gb-pcie3` and 123 MiB on
/// `h100-80gb`; 64 freed almost nothing more (the rest are tiny layer-norm
/// statistics) and polished no faster.
pub const ROOM_RECOMPUTATIONS: usize = 32;

/// The most the recomputations may slow the schedule before the polish,
/// as a share of its time (on the GPT-2 export: +0.04% and +0.3%).
pub const ROOM_SLOWDOWN: f64 = 0.01;

/// The position in `schedule`'s order of the op with the largest working
/// set ([`outcore_bound::working_set_bytes`]: its inputs', outputs' and
/// workspace's bytes), the first of equals.
pub fn largest_working_set(ctx: &Ctx<'_>, schedule: &Schedule) -> Option<usize> {
    let mut owners: Vec<TensorId> = Vec::new();
    (0..schedule.order.len())
        // The least of the reversed sizes is the largest, the first of equals.
        .min_by_key(|&pos| {
            let op = ctx.graph.op(schedule.order[pos]);
            std::cmp::Reverse(outcore_bound::working_set_bytes(ctx.graph, op, &mut owners))
        })
}

/// `start` (feasible, scored `start_cost`) with saved activations resident
/// across `at` recomputed instead, cheapest per byte first, each kept where
/// the schedule stays feasible and within [`ROOM_SLOWDOWN`] of
/// `start_cost`; `None` where none is kept (or `deadline` passes first).
pub fn room_at(
    search: &Search<'_, '_>,
    ctx: &Ctx<'_>,
    cost: &dyn CostModel,
    (start, start_cost): (&Schedule, Cost),
    at: usize,
    deadline: Instant,
) -> Option<(Schedule, Cost)> {
    let g = ctx.graph;
    let limit_s = start_cost.time_s * (1.0 + ROOM_SLOWDOWN);
    let hood = Neighbourhood::of(ctx, start, Kinds::All);
    let mut candidates: Vec<(f64, Move)> = hood
        .ungapped
        .iter()
        .filter(|&&(_, after, before)| after < at && at < before)
        .filter_map(|&(tensor, after, before)| {
            let producer = g.tensor(tensor).producer?;
            let per_byte_s = cost.op_time_s(g, producer) / ctx.size(tensor).max(1) as f64;
            Some((
                per_byte_s,
                Move::AddRecompute {
                    tensor,
                    after,
                    before,
                },
            ))
        })
        .collect();
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut scratch = Scratch::default();
    let mut current: Option<(Schedule, Cost)> = None;
    let mut taken = 0;
    for (_, mv) in candidates {
        if taken == ROOM_RECOMPUTATIONS || Instant::now() >= deadline {
            break;
        }
        let base = current.as_ref().map_or(start, |(s, _)| s);
        let next = apply(ctx, cost, base, mv);
        // A recomputation that may not run (a dropout mask), whose chain
        // does not hold, or that pushes another stretch over the budget
        // is left out.
        if let Ok(Score::Feasible { iter_time_s, .. }) = search.score(&next, &mut scratch)
            && iter_time_s <= limit_s
        {
            current = Some((next, Cost::feasible(iter_time_s)));
            taken += 1;
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_cost::{DeviceProfile, RooflineModel};
    use outcore_graph::zoo;
    use outcore_plan::{PlanRequest, Restore};
    use std::time::Duration;

    /// A 6-layer MLP (batch 256, width 1024): every op's working set is a
    /// weight (4 MiB) and a 1 MiB activation or two, except the loss's.
    fn mlp() -> outcore_graph::Graph {
        let knobs = [("layers".to_string(), 6), ("hidden".to_string(), 1024)]
            .into_iter()
            .collect();
        zoo::build("mlp", Some(256), &knobs, None).expect("zoo mlp")
    }

    #[test]
    fn the_largest_working_set_is_found_and_its_resident_activations_recomputed() {
        let g = mlp();
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").unwrap());
        let request = PlanRequest::new(&g, &cost, u64::MAX / 4);
        let schedule = Schedule::in_graph_order(&g);
        let ctx = Ctx::new(&g, &cost, schedule.order.clone());
        let search = Search::new(&ctx, &request, "outcore");
        let at = largest_working_set(&ctx, &schedule).expect("an op");
        // No op's working set is larger than the one found, and none before
        // it is as large.
        let ws = |pos: usize| -> u64 {
            outcore_bound::working_set_bytes(&g, g.op(schedule.order[pos]), &mut Vec::new())
        };
        assert!((0..schedule.order.len()).all(|p| ws(p) <= ws(at)));
        assert!((0..at).all(|p| ws(p) < ws(at)));
        let start_s = match search.score(&schedule, &mut Scratch::default()) {
            Ok(Score::Feasible { iter_time_s, .. }) => iter_time_s,
            other => panic!("keep-all does not fit a roomy budget: {other:?}"),
        };
        // Pick a position in the middle of the order, where saved
        // activations of the forward pass wait for the backward pass.
        let mid = schedule
            .order
            .iter()
            .position(|&o| g.op(o).phase == outcore_graph::Phase::Backward)
            .expect("a backward op");
        let far = Instant::now() + Duration::from_secs(600);
        let (roomed, roomed_cost) = room_at(
            &search,
            &ctx,
            &cost,
            (&schedule, Cost::feasible(start_s)),
            mid,
            far,
        )
        .expect("some saved activation is recomputable across the turn");
        let added: Vec<_> = roomed
            .gaps
            .iter()
            .filter(|gap| gap.how == Restore::Recompute)
            .collect();
        assert!(!added.is_empty() && added.len() <= ROOM_RECOMPUTATIONS);
        // Every recomputation spans the position, and the schedule stays
        // within the allowed slowdown.
        for gap in &added {
            assert!(gap.after.is_some_and(|a| a < mid), "{gap:?}");
            assert!(gap.before.is_some_and(|b| b > mid), "{gap:?}");
        }
        // The point: fewer bytes resident at the position.
        let resident = |gaps: &[outcore_plan::Gap]| {
            crate::framework::pressure::resident_bytes(&ctx, gaps)[mid]
        };
        let freed: u64 = added.iter().map(|gap| ctx.size(gap.tensor)).sum();
        assert_eq!(
            resident(&schedule.gaps) - resident(&roomed.gaps),
            i128::from(freed)
        );
        assert!(roomed_cost.time_s <= start_s * (1.0 + ROOM_SLOWDOWN));
        assert!(roomed_cost.time_s >= start_s, "recomputing adds compute");
        // Past its deadline it adds nothing.
        assert!(
            room_at(
                &search,
                &ctx,
                &cost,
                (&schedule, Cost::feasible(start_s)),
                mid,
                Instant::now()
            )
            .is_none()
        );
    }
}
