//! `window`: the locally adaptive schedule-window swap scheduler of paper 003
//! (out-of-core training with a schedule-window and virtual addressing), Sec. 3 and
//! Figure 2.
//!
//! The variable sequence is the storage owners each op touches, op by op. At op
//! `i` the window covers the variables from op `i`'s first one onwards while their
//! accumulated bytes stay within `W`: (a) every swapped-out variable entering the
//! window is swapped in (its prefetch trigger is the op before the first op whose
//! window reaches it); (b) when memory would exceed the budget at op `i`, op `i`
//! waits for the oldest reserved swap-outs, just enough of them (`reclaim_before`);
//! (c) after op `i`, a swap-out is reserved for each variable it used unless the
//! variable appears again inside the window of op `i + 1` (then it stays) or never
//! again (then it is freed). Redundant swap-outs of variables whose host copy is
//! current are skipped by the shared lowering (Fig. 2d).
//!
//! Choices where the paper is vague:
//! - `W` is picked per graph and budget by simulating a small fixed candidate set
//!   (0 and budget / 64 .. budget / 1 in steps of sqrt(2)) and keeping the fastest plan
//!   that verifies; `W` is recorded in `settings.window_bytes`.
//! - A window always covers at least the op's own variables.
//! - Persistent tensors (weights, optimizer state) are variables too; the window
//!   wraps into the next iteration, so one used again soon after the iteration
//!   boundary stays resident, and others leave the device between iterations.
//! - Waits for the oldest swap-outs are ordered on the d2h stream: waiting for one
//!   swap-out's free also orders every earlier one, as in the paper's FIFO.
//! - No recomputation (the paper swaps only).

use crate::pressure::{
    Checked, Ctx, MARGINS, absent_range, check, fits_without_swapping, infeasible, live_bytes,
    margin_budget,
};
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerInfo, Restore};

/// The schedule-window swap scheduler.
#[derive(Debug, Default)]
pub struct Window;

impl Planner for Window {
    fn name(&self) -> &'static str {
        "window"
    }

    fn description(&self) -> &'static str {
        "schedule-window swapping: prefetch within a byte window, swap out after last use in it, wait for the oldest swap-outs only under pressure (paper 003 Sec. 3)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> PlanOutcome {
        if let Some(outcome) = fits_without_swapping(request, self.name()) {
            return outcome;
        }
        let ctx = Ctx::new(request.graph, request.cost);
        let mut best: Option<(Checked, u64, f64)> = None;
        let mut first_problem = String::from("the graph has no ops");
        for window_bytes in candidate_windows(request.budget_bytes) {
            for margin in MARGINS {
                let budget = margin_budget(request.budget_bytes, margin);
                let gaps = match window_gaps(&ctx, window_bytes, budget) {
                    Ok(g) => g,
                    Err(e) => {
                        first_problem = e;
                        // A tighter margin cannot help an op that alone exceeds it.
                        break;
                    }
                };
                let info = PlannerInfo {
                    name: self.name().into(),
                    seed: None,
                    settings: serde_json::json!({
                        "window_bytes": window_bytes,
                        "planning_margin": margin,
                    }),
                };
                match check(request, gaps, info) {
                    Ok(c) => {
                        if best
                            .as_ref()
                            .is_none_or(|b| c.iter_time_s < b.0.iter_time_s)
                        {
                            best = Some((c, window_bytes, margin));
                        }
                        break;
                    }
                    Err(e) => first_problem = e,
                }
            }
        }
        match best {
            Some((c, _, _)) => PlanOutcome::Feasible(Box::new(c.plan)),
            None => infeasible(request, &first_problem),
        }
    }
}

/// The window sizes tried: 0 (prefetch just in time) and fractions of the budget
/// from 1/64 to 1 in steps of sqrt(2) (large windows hide more copy time but
/// prefetch earlier, so the best one sits just below where memory runs out).
fn candidate_windows(budget_bytes: u64) -> Vec<u64> {
    let mut out = vec![0];
    for half_steps in (0..=12).rev() {
        let fraction = 0.5f64.powf(half_steps as f64 / 2.0);
        out.push((budget_bytes as f64 * fraction) as u64);
    }
    out.dedup();
    out
}

/// The gaps the window algorithm decides for window `window_bytes`, with waits
/// placed so that the modelled live bytes stay within `budget_bytes`.
pub(crate) fn window_gaps(
    ctx: &Ctx<'_>,
    window_bytes: u64,
    budget_bytes: u64,
) -> Result<Vec<Gap>, String> {
    let n = ctx.n;
    if n == 0 {
        return Ok(Vec::new());
    }
    // The variable sequence: block `i` holds op i's owners; cum[j] is the bytes before j.
    let mut block_start = Vec::with_capacity(n + 1);
    let mut cum: Vec<u64> = vec![0];
    for owners in &ctx.owners_at {
        block_start.push(cum.len() - 1);
        for &t in owners {
            let last = cum.last().copied().unwrap_or(0);
            cum.push(last + ctx.size(t));
        }
    }
    block_start.push(cum.len() - 1);
    let len = cum.len() - 1;
    // right[i]: last variable index inside op i's window (two pointers; monotone).
    let mut right = Vec::with_capacity(n);
    let mut r = 0usize;
    for i in 0..n {
        let l = block_start[i];
        let own_end = block_start[i + 1].max(l + 1) - 1;
        r = r.max(own_end);
        while r + 1 < len && cum[r + 2] - cum[l] <= window_bytes {
            r += 1;
        }
        right.push(r);
    }
    // Window end at op i of the unbounded repetition of iterations.
    let right_at = |i: usize| right[i % n] + (i / n) * len;
    // The first op (>= lo) whose window reaches variable index j.
    let first_covering = |j: usize, lo: usize| -> usize {
        let mut lo = lo;
        let mut hi = j / len.max(1) * n + n; // the op owning j covers it
        while lo < hi {
            let mid = (lo + hi) / 2;
            if right_at(mid) >= j {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    let occurrence = |t, pos: usize| -> usize {
        let idx = ctx.owners_at[pos].iter().position(|&o| o == t).unwrap_or(0);
        block_start[pos] + idx
    };

    let mut gaps: Vec<Gap> = Vec::new();
    for t in ctx.owners() {
        let uses = &ctx.uses[t.index()];
        if ctx.size(t) == 0 || uses.is_empty() {
            continue;
        }
        for pair in uses.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let j = occurrence(t, b);
            if j <= right_at(a + 1) {
                continue; // used again inside the window: never swapped out
            }
            let k = first_covering(j, a + 1);
            gaps.push(Gap {
                tensor: t,
                after: Some(a),
                before: Some(b),
                how: Restore::Swap,
                prefetch_after: Some(k.saturating_sub(1).max(a)),
                reclaim_before: None,
            });
        }
        if ctx.persistent(t) {
            let (first, last) = (uses[0], uses[uses.len() - 1]);
            let j = occurrence(t, first) + len;
            if j <= right_at(last + 1) {
                continue;
            }
            let k = first_covering(j, last + 1);
            if k <= n {
                continue; // needed from the iteration start: keep it resident
            }
            gaps.push(Gap {
                tensor: t,
                after: Some(last),
                before: None,
                how: Restore::Swap,
                prefetch_after: None,
                reclaim_before: None,
            });
            gaps.push(Gap {
                tensor: t,
                after: None,
                before: Some(first),
                how: Restore::Swap,
                prefetch_after: Some(k - n - 1),
                reclaim_before: None,
            });
        }
    }
    place_reclaims(ctx, &mut gaps, budget_bytes)?;
    Ok(gaps)
}

/// Fig. 2b: walking the ops, when the live bytes would exceed the budget, the op
/// waits for the oldest reserved swap-outs (d2h order) until enough memory is back.
pub(crate) fn place_reclaims(
    ctx: &Ctx<'_>,
    gaps: &mut [Gap],
    budget_bytes: u64,
) -> Result<(), String> {
    let n = ctx.n;
    let live = live_bytes(ctx, gaps);
    // d2h order: by the op after which the swap-out is issued, then list order.
    let mut d2h: Vec<usize> = (0..gaps.len())
        .filter(|&g| gaps[g].how == Restore::Swap && gaps[g].after.is_some())
        .collect();
    d2h.sort_by_key(|&g| (gaps[g].after, g));
    let mut next_issued = 0usize;
    let mut pending: std::collections::VecDeque<usize> = Default::default();
    let mut saved = vec![0i128; n + 1];
    let mut running = 0i128;
    for q in 0..n {
        running += saved[q];
        while next_issued < d2h.len() && gaps[d2h[next_issued]].after.is_some_and(|a| a < q) {
            pending.push_back(d2h[next_issued]);
            next_issued += 1;
        }
        let mut excess = live[q] - running - budget_bytes as i128;
        while excess > 0 {
            let Some(g) = pending.pop_front() else {
                return Err(format!(
                    "op {} needs {} bytes live with every earlier swap-out completed, over the budget of {budget_bytes} bytes",
                    ctx.graph.ops[q].name,
                    live[q] - running
                ));
            };
            if let Some((lo, hi)) = absent_range(ctx, &gaps[g], Some(q))
                && lo == q
            {
                let size = ctx.size(gaps[g].tensor) as i128;
                running += size;
                saved[hi + 1] -= size;
                excess -= size;
                gaps[g].reclaim_before = Some(q);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pressure::testing::{mlp_chain, v100};

    /// Bytes of the variable sequence from op `a + 1`'s first variable through
    /// `t`'s occurrence at op `b`.
    fn bytes_until_reuse(ctx: &Ctx<'_>, a: usize, b: usize, t: outcore_graph::TensorId) -> u64 {
        let mut bytes = 0;
        for pos in a + 1..=b {
            for &o in &ctx.owners_at[pos] {
                bytes += ctx.size(o);
                if pos == b && o == t {
                    return bytes;
                }
            }
        }
        bytes
    }

    #[test]
    fn never_swaps_a_tensor_used_again_inside_the_window() {
        let graph = mlp_chain(6, 256, 64);
        let cost = v100();
        let ctx = Ctx::new(&graph, &cost);
        let unlimited = u64::MAX / 4;
        let total_bytes: u64 = ctx.owners_at.iter().flatten().map(|&t| ctx.size(t)).sum();
        for window_bytes in [0, 200_000, 1_000_000, total_bytes] {
            let gaps = window_gaps(&ctx, window_bytes, unlimited).expect("plans");
            for g in &gaps {
                if let (Some(a), Some(b)) = (g.after, g.before) {
                    assert!(b > a + 1, "a tensor used by the next op left the device");
                    assert!(
                        bytes_until_reuse(&ctx, a, b, g.tensor) > window_bytes,
                        "{} swapped out though reused within {window_bytes} bytes",
                        g.tensor
                    );
                }
            }
            if window_bytes == total_bytes {
                assert!(
                    gaps.is_empty(),
                    "a window covering everything swaps nothing"
                );
            }
            if window_bytes == 0 {
                assert!(!gaps.is_empty(), "a zero window swaps every long gap");
            }
        }
    }

    #[test]
    fn waits_only_when_the_budget_demands() {
        let graph = mlp_chain(6, 256, 64);
        let cost = v100();
        let ctx = Ctx::new(&graph, &cost);
        let gaps = window_gaps(&ctx, 0, u64::MAX / 4).expect("plans");
        assert!(gaps.iter().all(|g| g.reclaim_before.is_none()));
        let (footprint_bytes, _) = outcore_graph::footprint(&graph);
        let tight = window_gaps(&ctx, 0, footprint_bytes * 3 / 4).expect("plans");
        assert!(tight.iter().any(|g| g.reclaim_before.is_some()));
        let live = crate::pressure::live_bytes(&ctx, &tight);
        assert!(live.iter().all(|&b| b <= (footprint_bytes * 3 / 4) as i128));
    }
}

#[cfg(test)]
mod diagnose {
    use super::*;

    #[test]
    #[ignore = "diagnosis: first verify problem per window and margin on resnet50 b64"]
    #[allow(clippy::print_stdout)] // the diagnosis is printed
    fn first_problem_per_window() {
        let graph = outcore_graph::zoo::build("resnet50", Some(64), &Default::default(), None)
            .expect("zoo");
        let cost = crate::pressure::testing::v100();
        let ctx = Ctx::new(&graph, &cost);
        let budget_bytes = outcore_graph::footprint(&graph).0 / 2;
        let request = PlanRequest {
            graph: &graph,
            cost: &cost,
            budget_bytes,
            seed: 0,
            time_limit_s: 1.0,
        };
        for w in candidate_windows(budget_bytes) {
            for margin in [1.0, 0.8] {
                let r = window_gaps(&ctx, w, margin_budget(budget_bytes, margin)).and_then(|g| {
                    let info = PlannerInfo {
                        name: "window".into(),
                        seed: None,
                        settings: serde_json::Value::Null,
                    };
                    check(&request, g, info).map(|c| c.throughput_vs_ideal.to_string())
                });
                println!("W {w} margin {margin}: {r:?}");
            }
        }
    }
}
