//! The "no swap stalls compute" check of Algorithm 2, on the copies as the
//! plan issues them.
//!
//! [`super::swap`] places each copy in a free slot of its direction's
//! timeline, but the plan does not carry slot times: a swap-out is issued when
//! its access before the gap ends and a swap-in when its trigger op ends, each
//! direction runs its copies one at a time in issue order (the lowering's
//! order: position, then tensor), a swap-in also waits for its own swap-out,
//! and while both directions copy each moves at the slower duplex rate. So a
//! slot that is free on the planned timeline can still end late: two swap-ins
//! issued after the same op run in tensor order, not slot order, and a copy
//! beside one in the other direction runs slower than alone (measured
//! 2026-11-23, `tensile_table -- protocol` before this check: EOR 1.047 and
//! 1.055 on Inception v3 and v4, where Algorithm 2 promises none).
//!
//! Choice: a set of gaps is accepted only if this replay of both directions
//! on the compute-only timeline (the access sequence's op times) finishes
//! every swap-in before its use starts, every swap-out before the op that
//! waits for it, and every copy by the end of the iteration (the next one
//! starts only when all streams are done). The replay uses the rates the
//! simulator uses (`CostModel::copy_rates`), so the paper's rule "swapping
//! never makes compute wait" is checked on what the executor will run, not
//! on the slots that chose the trigger ops.

use super::access::AccessSequence;
use outcore_cost::{CopyRates, CostModel};
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore};

/// Slack on deadlines (sums of op and copy times: rounding only).
const DEADLINE_EPS_S: f64 = 1e-9;

/// One copy as issued.
#[derive(Debug, Clone)]
struct Copy {
    /// Issue order key: position after which it is issued, then tensor, then
    /// the gap's start (the lowering's order).
    key: (usize, TensorId, usize),
    issue_s: f64,
    bytes: f64,
    deadline_s: f64,
    /// Swap-ins: the index of the gap whose swap-out must finish first.
    gap: usize,
}

/// Whether every copy of `gaps` ends by its deadline (see the module docs).
pub fn hidden(tas: &AccessSequence<'_, '_>, cost: &dyn CostModel, gaps: &[Gap]) -> bool {
    let ctx = tas.ctx;
    let end_of_iteration_s = tas.iteration_s();
    let (mut outs, mut ins) = (Vec::new(), Vec::new());
    let copied_out = copied_out(tas, gaps);
    for (i, g) in gaps.iter().enumerate() {
        if g.how != Restore::Swap {
            continue;
        }
        let bytes = ctx.size(g.tensor) as f64;
        let start = g.after.map_or(0, |a| a + 1);
        if let Some(a) = g.after.filter(|_| copied_out[i]) {
            outs.push(Copy {
                key: (a, g.tensor, start),
                issue_s: tas.end_s(a),
                bytes,
                deadline_s: g
                    .reclaim_before
                    .map_or(end_of_iteration_s, |r| tas.start_s(r)),
                gap: i,
            });
        }
        if let Some(b) = g.before {
            let (key_pos, issue_s) = match g.prefetch_after {
                Some(p) => (p + 1, tas.end_s(p)),
                None => (0, 0.0),
            };
            ins.push(Copy {
                key: (key_pos, g.tensor, start),
                issue_s,
                bytes,
                deadline_s: tas.start_s(b),
                gap: i,
            });
        }
    }
    outs.sort_by_key(|c| c.key);
    ins.sort_by_key(|c| c.key);
    let mut out_done_s = vec![0.0f64; gaps.len()];
    for c in &outs {
        out_done_s[c.gap] = f64::INFINITY;
    }
    Replay::new(cost.copy_rates(), [ins, outs]).run(&mut out_done_s)
}

/// Per gap: whether the plan copies the tensor out when the gap starts. The
/// lowering skips the copy when the host already holds the current value: a
/// batch input, a persistent tensor that starts the iteration on the host, or
/// a tensor copied out by an earlier gap, in each case with no in-place write
/// since (a parameter swapped out after its forward use and again after its
/// backward use is copied once).
pub(crate) fn copied_out(tas: &AccessSequence<'_, '_>, gaps: &[Gap]) -> Vec<bool> {
    let ctx = tas.ctx;
    let mut order: Vec<usize> = (0..gaps.len())
        .filter(|&i| gaps[i].how == Restore::Swap)
        .collect();
    // Per tensor, by start (from the iteration start first).
    order.sort_by_key(|&i| (gaps[i].tensor, gaps[i].after.map_or(0, |a| a + 1)));
    let mut out = vec![false; gaps.len()];
    // (tensor, position from which the host copy is current).
    let mut current: Option<(TensorId, usize)> = None;
    for i in order {
        let g = &gaps[i];
        let t = g.tensor;
        let tensor = ctx.graph.tensor(t);
        let Some(a) = g.after else {
            // On the host at the start: current from there.
            current = Some((t, 0));
            continue;
        };
        let from = match current {
            Some((u, from)) if u == t => Some(from),
            _ if tensor.producer.is_none() && !ctx.persistent(t) => Some(0),
            _ => None,
        };
        let written = |from: usize| ctx.writes[t.index()].iter().any(|&w| w >= from && w <= a);
        out[i] = from.is_none_or(written);
        current = Some((t, a + 1));
    }
    out
}

/// Both directions' queues and clocks (index 0: host-to-device, 1:
/// device-to-host, as in `CopyRates`).
struct Replay {
    latency_s: f64,
    one_way: [f64; 2],
    duplex: [f64; 2],
    queues: [Vec<Copy>; 2],
}

/// A copy in flight.
#[derive(Debug, Clone, Copy)]
struct Flight {
    latency_left_s: f64,
    bytes_left: f64,
}

impl Replay {
    fn new(r: CopyRates, queues: [Vec<Copy>; 2]) -> Self {
        Replay {
            latency_s: r.latency_s,
            one_way: r.one_way_bytes_per_s,
            duplex: r.duplex_bytes_per_s,
            queues,
        }
    }

    /// Runs both queues to the end; false at the first missed deadline.
    /// `out_done_s[gap]` is when each gap's swap-out has ended (infinite
    /// until then; 0 for gaps without one): a swap-in waits for it.
    fn run(&self, out_done_s: &mut [f64]) -> bool {
        let mut next = [0usize; 2];
        let mut flight: [Option<Flight>; 2] = [None, None];
        let mut now_s = 0.0f64;
        loop {
            // Start what can start now; otherwise note when it can.
            let mut wake_s = f64::INFINITY;
            for d in 0..2 {
                let Some(c) = self.queues[d].get(next[d]) else {
                    continue;
                };
                if flight[d].is_some() {
                    continue;
                }
                let ready_s = if d == 0 {
                    c.issue_s.max(out_done_s[c.gap])
                } else {
                    c.issue_s
                };
                if ready_s <= now_s {
                    flight[d] = Some(Flight {
                        latency_left_s: self.latency_s,
                        bytes_left: c.bytes,
                    });
                } else {
                    wake_s = wake_s.min(ready_s);
                }
            }
            if flight.iter().all(Option::is_none) && !wake_s.is_finite() {
                // Nothing in flight and nothing to wait for: every queue has
                // run (a swap-in whose swap-out never runs cannot be lowered).
                return (0..2).all(|d| next[d] >= self.queues[d].len());
            }
            let both = flight[0].is_some() && flight[1].is_some();
            let rate = |d: usize| {
                if both {
                    self.duplex[d]
                } else {
                    self.one_way[d]
                }
            };
            let finish_s: [f64; 2] = std::array::from_fn(|d| {
                flight[d].map_or(f64::INFINITY, |f| f.latency_left_s + f.bytes_left / rate(d))
            });
            let step_s = (wake_s - now_s).min(finish_s[0]).min(finish_s[1]);
            now_s += step_s;
            for d in 0..2 {
                let Some(f) = flight[d].as_mut() else {
                    continue;
                };
                if finish_s[d] <= step_s {
                    let c = &self.queues[d][next[d]];
                    if now_s > c.deadline_s + DEADLINE_EPS_S {
                        return false;
                    }
                    if d == 1 {
                        out_done_s[c.gap] = now_s;
                    }
                    flight[d] = None;
                    next[d] += 1;
                } else {
                    let latency_s = f.latency_left_s.min(step_s);
                    f.latency_left_s -= latency_s;
                    f.bytes_left -= (step_s - latency_s) * rate(d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 byte/s one way, 0.5 byte/s each way while both copy, no latency.
    fn rates() -> CopyRates {
        CopyRates {
            latency_s: 0.0,
            one_way_bytes_per_s: [1.0, 1.0],
            duplex_bytes_per_s: [0.5, 0.5],
        }
    }

    fn copy(
        pos: usize,
        tensor: usize,
        issue_s: f64,
        bytes: f64,
        deadline_s: f64,
        gap: usize,
    ) -> Copy {
        Copy {
            key: (pos, TensorId(tensor as u32), pos),
            issue_s,
            bytes,
            deadline_s,
            gap,
        }
    }

    fn run(ins: Vec<Copy>, outs: Vec<Copy>, gaps: usize) -> bool {
        let mut done = vec![0.0; gaps];
        for c in &outs {
            done[c.gap] = f64::INFINITY;
        }
        Replay::new(rates(), [ins, outs]).run(&mut done)
    }

    #[test]
    fn swap_ins_issued_together_run_in_issue_order() {
        // Two 1-byte swap-ins issued at 0: the first in the queue ends at 1,
        // the second at 2. Deadlines 2 then 1 miss; 1 then 2 hold.
        let late_first = vec![copy(0, 0, 0.0, 1.0, 2.0, 0), copy(0, 1, 0.0, 1.0, 1.0, 1)];
        assert!(!run(late_first, vec![], 2));
        let early_first = vec![copy(0, 0, 0.0, 1.0, 1.0, 0), copy(0, 1, 0.0, 1.0, 2.0, 1)];
        assert!(run(early_first, vec![], 2));
    }

    #[test]
    fn copies_in_both_directions_slow_each_other_down() {
        // A 1-byte swap-in and an unrelated 1-byte swap-out both issued at 0
        // move at 0.5 byte/s: both end at 2, so a deadline of 1.5 misses.
        let ins = vec![copy(0, 0, 0.0, 1.0, 1.5, 0)];
        let outs = vec![copy(0, 1, 0.0, 1.0, 10.0, 1)];
        assert!(!run(ins.clone(), outs, 2));
        // Alone it ends at 1.
        assert!(run(ins, vec![], 2));
    }

    #[test]
    fn a_swap_in_waits_for_its_own_swap_out() {
        // The swap-out of gap 0 is issued at 3 and ends at 4; its swap-in,
        // issued at 0, can only start then and ends at 5.
        let outs = vec![copy(0, 0, 3.0, 1.0, 10.0, 0)];
        let ins = vec![copy(0, 0, 0.0, 1.0, 5.0, 0)];
        assert!(run(ins.clone(), outs.clone(), 1));
        let ins_tight = vec![copy(0, 0, 0.0, 1.0, 4.5, 0)];
        assert!(!run(ins_tight, outs, 1));
    }
}
