//! Held exchanges: a start for the local search in which recomputations
//! that need a chain are traded for cheaper ones whose inputs the lowering
//! holds ([`outcore_plan::lower_schedule`]: a tensor that a recomputation
//! reads after its last use stays resident until then).
//!
//! Why a start and not a move: the trade pays only in bulk. In DenseNet-121
//! each layer's concatenation of the block's earlier features is saved for
//! its batch norm's backward. Recomputing it reads the features themselves
//! (small, dead after the forward pass), so the first such recomputation in
//! a block holds the block's features through the peak, and alone it is
//! over the budget; every later one in the block holds nothing more. The
//! plans recomputed the batch norm and ReLU after each concatenation
//! instead (ReLU's output is saved; the batch norm's is its dead input),
//! twice the compute per byte freed. On DenseNet-121 b64 at 50% on
//! `v100-16gb-pcie3`, the search's best schedule (0.892 of ideal) with every
//! such pair traded at once, by hand, was 0.910 and 160 MB under the
//! budget; no single move reaches it from there, since the first trade of a
//! block is over the budget.
//!
//! What [`held_exchanges`] does, for one schedule on its own order:
//! 1. prices each recomputation that is not only a chain link: its
//!    producer's time plus that of the recomputations of its producer's
//!    inputs at the same position (its chain), per byte of the tensor;
//! 2. dearest first, trades it for a saved activation kept on the device
//!    whose interval (last forward use to first backward use) covers the
//!    gap, at least as large, cheaper per byte to recompute, the smallest
//!    such tensor first (a trade frees about what it keeps), then the
//!    tightest interval, each used once;
//! 3. removes every gap of the new recomputations' non-persistent inputs,
//!    which are then resident or held where they are read;
//! 4. removes the chain links no recomputation reads any more.
//!
//! The result may be over the budget or slower: it is a start, which the
//! search repairs and improves like the others, and which loses to them
//! where the trade does not pay.

use super::moves::{Kinds, Neighbourhood, recompute_gap};
use crate::framework::Ctx;
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore, Schedule};

/// `schedule` with its chained recomputations traded for held ones (module
/// docs), or `None` when no trade applies.
pub fn held_exchanges(ctx: &Ctx<'_>, schedule: &Schedule) -> Option<Schedule> {
    let trades = trades(ctx, schedule);
    if trades.is_empty() {
        return None;
    }
    let mut gaps: Vec<Gap> = schedule
        .gaps
        .iter()
        .enumerate()
        .filter(|(i, _)| !trades.iter().any(|(x, _)| x == i))
        .map(|(_, g)| g.clone())
        .collect();
    let added: Vec<Gap> = trades.into_iter().map(|(_, g)| g).collect();
    for new in &added {
        for owner in ctx.producer_inputs(new.tensor) {
            if !ctx.persistent(owner) {
                gaps.retain(|g| g.tensor != owner);
            }
        }
    }
    gaps.extend(added);
    drop_orphan_links(ctx, &mut gaps);
    Some(ctx.schedule(gaps))
}

/// The trades of step 2: (index of the gap given up, the partner's
/// recomputation gap).
fn trades(ctx: &Ctx<'_>, schedule: &Schedule) -> Vec<(usize, Gap)> {
    let partners: Vec<(TensorId, usize, usize, f64)> = Neighbourhood::of(ctx, schedule, Kinds::All)
        .ungapped
        .iter()
        .filter_map(|&(t, a, b)| Some((t, a, b, ctx.producer_time_s(t)? / ctx.size(t) as f64)))
        .filter(|p| p.3.is_finite())
        .collect();
    let mut dearest: Vec<(f64, usize)> = schedule
        .gaps
        .iter()
        .enumerate()
        .filter(|(_, g)| g.how == Restore::Recompute && !ctx.chain_link(g))
        .filter_map(|(i, g)| {
            let (Some(_), Some(b)) = (g.after, g.before) else {
                return None;
            };
            let links_s: f64 = ctx
                .producer_inputs(g.tensor)
                .filter(|&o| {
                    schedule.gaps.iter().any(|l| {
                        l.tensor == o && l.before == Some(b) && l.how == Restore::Recompute
                    })
                })
                .filter_map(|o| ctx.producer_time_s(o))
                .sum();
            let per_byte =
                (ctx.producer_time_s(g.tensor)? + links_s) / ctx.size(g.tensor).max(1) as f64;
            Some((per_byte, i))
        })
        .collect();
    dearest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut taken = vec![false; partners.len()];
    let mut out = Vec::new();
    for (per_byte, i) in dearest {
        let g = &schedule.gaps[i];
        let (Some(a), Some(b)) = (g.after, g.before) else {
            continue;
        };
        let size = ctx.size(g.tensor);
        let best = partners
            .iter()
            .enumerate()
            .filter(|&(k, &(t, pa, pb, c))| {
                !taken[k] && pa <= a && pb >= b && ctx.size(t) >= size && c < per_byte
            })
            .min_by_key(|&(_, &(t, pa, pb, _))| (ctx.size(t), pb - pa));
        if let Some((k, &(t, pa, pb, _))) = best {
            taken[k] = true;
            out.push((i, recompute_gap(t, pa, pb)));
        }
    }
    out
}

/// Removes recomputation gaps that bring a tensor back after its last use
/// where no recomputation reads it any more (and no later gap of it starts
/// there), pass after pass until none is left (a link may feed only another
/// orphan).
pub(crate) fn drop_orphan_links(ctx: &Ctx<'_>, gaps: &mut Vec<Gap>) {
    // (tensor, position) of each chain link, sorted, with whether something
    // still needs it there, and which tensors have a link at all, so that
    // only inputs of a linked tensor are looked up. This runs on every move
    // that gives up a recomputation; indexing an entry per gap and input
    // instead, and sorting them, took 8.7% of the samples of a 20 s
    // `outcore plan` of DenseNet-121 b64 at 12.5% (perf), 5.0% this way.
    let mut links: Vec<((TensorId, usize), bool)> = Vec::new();
    let mut linked: Vec<bool> = Vec::new();
    loop {
        links.clear();
        links.extend(
            gaps.iter()
                .filter(|l| l.how == Restore::Recompute && ctx.chain_link(l))
                .filter_map(|l| l.before.map(|b| ((l.tensor, b), false))),
        );
        // Most schedules have no chain link: then nothing to look up.
        if links.is_empty() {
            return;
        }
        links.sort_unstable_by_key(|&(key, _)| key);
        links.dedup_by_key(|&mut (key, _)| key);
        linked.clear();
        linked.resize(ctx.graph.tensors.len(), false);
        for &((t, _), _) in &links {
            linked[t.index()] = true;
        }
        let mut mark = |key: (TensorId, usize)| {
            if linked[key.0.index()]
                && let Ok(k) = links.binary_search_by_key(&key, |&(key, _)| key)
            {
                links[k].1 = true;
            }
        };
        // A link is needed where a recomputation there reads it, or where a
        // gap of its tensor starts.
        for g in gaps.iter() {
            if let (Restore::Recompute, Some(b)) = (g.how, g.before) {
                ctx.producer_inputs(g.tensor).for_each(|o| mark((o, b)));
            }
            if let Some(a) = g.after {
                mark((g.tensor, a));
            }
        }
        let before = gaps.len();
        gaps.retain(|l| {
            let orphan = l.how == Restore::Recompute
                && ctx.chain_link(l)
                && l.before.is_some_and(|b| {
                    links
                        .binary_search_by_key(&(l.tensor, b), |&(key, _)| key)
                        .is_ok_and(|k| !links[k].1)
                });
            !orphan
        });
        if gaps.len() == before {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::v100;
    use crate::joint::moves::{Move, apply};
    use outcore_eval::{Evaluator, Scratch};
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    use outcore_graph::{DType, Graph};
    use outcore_plan::AllocatorSpec;

    /// A dense layer: `c = concat(f1, f2)`, `r = relu(batch_norm(c))`, then
    /// a head. `c` is saved for the batch norm's backward and `r` for the
    /// ReLU's and the head's; the batch norm's output `n` and `f2` are dead
    /// after the forward pass. Returns the graph and (f2, c, n, r).
    fn dense_layer() -> (Graph, [TensorId; 4]) {
        let mut b = GraphBuilder::new("dense", 8, DType::Float32);
        let x = b.input("x", &[8, 16, 32, 32]);
        let y = b.label("y", &[8]);
        let f1 = b.conv2d("conv1", x, 16, 3, 1, 1);
        let f2 = b.conv2d("conv2", f1, 16, 3, 1, 1);
        let c = b.concat(&[f1, f2], 1);
        let n = b.batch_norm("norm", c);
        let r = b.relu(n);
        let p = b.global_avg_pool(r);
        let logits = b.linear("head", p, 10, true);
        let loss = b.softmax_cross_entropy(logits, y);
        let g = b.finish(loss, Optimizer::sgd_momentum()).expect("valid");
        let owner = |t| g.storage_owner(t);
        let ids = [owner(f2), owner(c), owner(n), owner(r)];
        (g, ids)
    }

    /// `r` recomputed before its first backward use, with `n` brought back
    /// there as a chain link (from the concatenation, which stays).
    fn chained(ctx: &Ctx<'_>, n: TensorId, r: TensorId) -> Schedule {
        let (after, before) = ctx.forward_backward_gap(r).expect("r is saved");
        let n_last = *ctx.uses[n.index()].last().expect("n is used");
        ctx.schedule(vec![
            recompute_gap(r, after, before),
            recompute_gap(n, n_last, before),
        ])
    }

    #[test]
    fn a_chained_recomputation_is_traded_for_a_held_one() {
        let (g, [f2, c, n, r]) = dense_layer();
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let start = chained(&ctx, n, r);
        let traded = held_exchanges(&ctx, &start).expect("a trade applies");
        // The concatenation is recomputed instead of the batch norm and ReLU;
        // the chain link `n` has no reader left and is gone.
        let on = |s: &Schedule, t: TensorId| s.gaps.iter().filter(|x| x.tensor == t).count();
        assert_eq!((on(&traded, c), on(&traded, r), on(&traded, n)), (1, 0, 0));
        // Its input `f2` is dead after the forward pass: the lowering holds it.
        assert!(
            ctx.uses[f2.index()].last().expect("used") < &traded.gaps[0].before.expect("closed")
        );
        let ev = Evaluator::new(&g, &cost, u64::MAX, AllocatorSpec::Perfect);
        let mut scratch = Scratch::default();
        let run = |s: &Schedule, scratch: &mut Scratch| {
            let e = ev.evaluate(s, scratch);
            assert!(
                e.schedule_error.is_none() && e.violations == 0,
                "{:?}",
                e.first_violation
            );
            e.sim.expect("simulated").expect("runs").recompute_time_s
        };
        let (before_s, after_s) = (run(&start, &mut scratch), run(&traded, &mut scratch));
        assert!(
            after_s < before_s,
            "recompute {after_s} s after the trade, {before_s} s before"
        );
    }

    #[test]
    fn nothing_to_trade_gives_none() {
        let (g, [_, c, _, _]) = dense_layer();
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        assert!(held_exchanges(&ctx, &ctx.schedule(Vec::new())).is_none());
        // The concatenation recomputed with its input held: no saved
        // activation's interval covers its gap (the ReLU's output is made
        // after it and read before it), so there is no partner.
        let (a, b) = ctx.forward_backward_gap(c).expect("c is saved");
        assert!(held_exchanges(&ctx, &ctx.schedule(vec![recompute_gap(c, a, b)])).is_none());
    }

    #[test]
    fn giving_up_a_recomputation_drops_its_chain_links() {
        let (g, [_, _, n, r]) = dense_layer();
        let cost = v100();
        let ctx = Ctx::in_graph_order(&g, &cost);
        let start = chained(&ctx, n, r);
        let r_gap = start
            .gaps
            .iter()
            .position(|x| x.tensor == r)
            .expect("r's gap");
        for mv in [Move::Drop { gap: r_gap }, Move::ToSwap { gap: r_gap }] {
            let next = apply(&ctx, &cost, &start, mv);
            assert!(
                next.gaps.iter().all(|x| x.tensor != n),
                "{mv:?} left n's link: {:?}",
                next.gaps
            );
        }
    }
}
