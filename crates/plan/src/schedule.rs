//! Schedules: a planner's decisions (compute order, and the gaps during which a
//! tensor is off the device, restored by swapping or recomputation), and their
//! lowering to the one Plan with every copy, free and wait in place.

use crate::plan::{Instr, Plan, PlannerInfo, Residency, StepRef, Stream};
use outcore_graph::{Graph, OpId, TensorId};
use std::fmt;

/// How a tensor comes back after a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    Swap,
    Recompute,
}

/// An interval of the compute order during which a storage owner is not resident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// A storage owner (`tensor.allocates()`).
    pub tensor: TensorId,
    /// Position in `order` of the last use before the gap; `None`: from the
    /// iteration start (a persistent tensor kept on the host between iterations).
    pub after: Option<usize>,
    /// Position in `order` of the next use after the gap; `None`: to the end of the
    /// iteration (a persistent tensor swapped out for the next iteration).
    pub before: Option<usize>,
    pub how: Restore,
    /// Swap only: the swap-in starts once the compute op at this position has
    /// finished. `None`: as soon as the h2d stream reaches it after the free.
    pub prefetch_after: Option<usize>,
    /// Swap only: the compute op at this position waits until the swap-out has
    /// completed and the memory is freed. `None`: no compute op waits.
    pub reclaim_before: Option<usize>,
}

/// A planner's decisions, before lowering.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Schedule {
    /// Compute order: every op once, dependencies respected.
    pub order: Vec<OpId>,
    pub gaps: Vec<Gap>,
    /// Persistent tensors not resident at the iteration start.
    pub initial_residency: Vec<(TensorId, Residency)>,
}

impl Schedule {
    /// The graph's own order with no gaps.
    pub fn in_graph_order(graph: &Graph) -> Schedule {
        Schedule {
            order: graph.ops.iter().map(|o| o.id).collect(),
            ..Schedule::default()
        }
    }
}

/// A schedule that cannot be lowered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid schedule: {reason}")]
pub struct ScheduleError {
    pub reason: String,
}

fn err(reason: impl fmt::Display) -> ScheduleError {
    ScheduleError {
        reason: reason.to_string(),
    }
}

/// For every storage owner, the positions in `order` that use it (read through any
/// view, produce, or write in place), ascending and without repeats.
pub fn use_positions(graph: &Graph, order: &[OpId]) -> Vec<Vec<usize>> {
    let mut uses: Vec<Vec<usize>> = vec![Vec::new(); graph.tensors.len()];
    for (pos, &op) in order.iter().enumerate() {
        let op = graph.op(op);
        for &t in op.inputs.iter().chain(&op.outputs) {
            let owner = graph.storage_owner(t);
            let list = &mut uses[owner.index()];
            if list.last() != Some(&pos) {
                list.push(pos);
            }
        }
    }
    uses
}

/// Lowers a schedule to a plan. Swap gaps: a swap-out on d2h after the compute step
/// at `after` (skipped when the host copy is still current: a redundant transfer)
/// and a free after it; a swap-in on h2d once `prefetch_after` has run and the
/// free is done; the first step at position `before` (a recomputation or the op)
/// waits for the swap-in. Recompute gaps: a free on compute after `after`, and
/// `Recompute` of the producer just before the op at `before` (several at one
/// position run in producer order, so a chain such as Chen et al.'s segment
/// recomputation works when every dropped tensor of the chain has the same
/// `before`). A gap may end before the tensor's next use. A tensor brought back
/// only to feed recomputations (no use at or after `before`) is freed right after
/// the recomputations at `before`. Every other residency period ends with a free
/// after its last use; step outputs are freed at the end.
pub fn lower_schedule(
    graph: &Graph,
    schedule: &Schedule,
    info: PlannerInfo,
    budget_bytes: u64,
) -> Result<Plan, ScheduleError> {
    let n = schedule.order.len();
    if n != graph.ops.len() {
        return Err(err(format!(
            "the order has {n} ops but the graph {}",
            graph.ops.len()
        )));
    }
    let mut seen = vec![false; n];
    for &op in &schedule.order {
        if op.index() >= n || std::mem::replace(&mut seen[op.index()], true) {
            return Err(err(format!(
                "{op} is missing from the graph or listed twice in the order"
            )));
        }
    }
    let uses = use_positions(graph, &schedule.order);

    // Validate gaps and index them by position.
    let mut gaps: Vec<&Gap> = schedule.gaps.iter().collect();
    gaps.sort_by_key(|g| (g.tensor, g.after.map_or(0, |a| a + 1)));
    for (i, g) in gaps.iter().enumerate() {
        let t = g.tensor;
        if t.index() >= graph.tensors.len() || !graph.tensor(t).allocates() {
            return Err(err(format!("gap on {t}, which is not a storage owner")));
        }
        let persistent = graph.tensor(t).is_persistent();
        if (g.after.is_none() || g.before.is_none()) && !persistent {
            return Err(err(format!(
                "open-ended gap on {t}, which is not persistent"
            )));
        }
        if g.how == Restore::Recompute {
            let producer = graph.tensor(t).producer;
            if g.after.is_none() || g.before.is_none() || producer.is_none() {
                return Err(err(format!(
                    "recompute gap on {t} needs both ends and a producer"
                )));
            }
        }
        if let (Some(a), Some(b)) = (g.after, g.before) {
            if a >= b || b >= n {
                return Err(err(format!(
                    "gap on {t} from position {a} to {b} is empty or out of range"
                )));
            }
            let u = &uses[t.index()];
            let after_prev_gap = i > 0 && gaps[i - 1].tensor == t && gaps[i - 1].before == Some(a);
            if u.binary_search(&a).is_err() && !after_prev_gap {
                return Err(err(format!(
                    "gap on {t} must start at a position that uses it (or where its previous gap ends)"
                )));
            }
            // The gap may end before the next use: the tensor is then back early,
            // e.g. to feed a recomputation, or only for that (then freed right after).
            if u.iter().any(|&p| p > a && p < b) {
                return Err(err(format!("{t} is used inside its gap ({a}, {b})")));
            }
        }
        if let Some(q) = g.prefetch_after
            && (g.before.is_some_and(|b| q >= b) || g.after.is_some_and(|a| q < a))
        {
            return Err(err(format!(
                "gap on {t}: prefetch trigger {q} is outside the gap"
            )));
        }
        if let Some(r) = g.reclaim_before
            && g.after.is_none_or(|a| r <= a)
        {
            return Err(err(format!(
                "gap on {t}: reclaim point {r} is not after the gap starts"
            )));
        }
        if i > 0 && gaps[i - 1].tensor == t {
            let prev = gaps[i - 1];
            match (prev.before, g.after) {
                (Some(pb), Some(a)) if a >= pb => {}
                _ => return Err(err(format!("gaps on {t} overlap"))),
            }
        }
    }

    let mut plan = Plan::new(graph, info, budget_bytes);
    for &(t, r) in &schedule.initial_residency {
        if let Some(entry) = plan.initial_residency.iter_mut().find(|e| e.0 == t) {
            entry.1 = r;
        } else {
            return Err(err(format!(
                "initial residency for {t}, which is not persistent"
            )));
        }
    }

    // Per position: gaps starting after it, recomputes before it, swap-ins to trigger after it.
    let mut starts_after: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut recompute_before: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut swap_in_before: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut reclaim_at: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut trigger_after: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut from_start: Vec<usize> = Vec::new();
    for (gi, g) in gaps.iter().enumerate() {
        match g.after {
            Some(a) => starts_after[a].push(gi),
            None => from_start.push(gi),
        }
        if let Some(b) = g.before {
            match g.how {
                Restore::Recompute => recompute_before[b].push(gi),
                Restore::Swap => {
                    swap_in_before[b].push(gi);
                    if let Some(q) = g.prefetch_after.or(g.after) {
                        trigger_after[q].push(gi);
                    }
                }
            }
        }
        if let Some(r) = g.reclaim_before {
            reclaim_at[r].push(gi);
        }
    }
    for list in &mut recompute_before {
        list.sort_by_key(|&gi| graph.tensor(gaps[gi].tensor).producer.map_or(0, |p| p.0));
    }
    // Swap-ins triggered at one position go in order of need.
    for list in &mut trigger_after {
        list.sort_by_key(|&gi| gaps[gi].before.unwrap_or(usize::MAX));
    }

    // Final free position of each storage owner (after its last residency period).
    let last_gap_end: Vec<Option<Option<usize>>> = {
        let mut v: Vec<Option<Option<usize>>> = vec![None; graph.tensors.len()];
        for g in &gaps {
            let e = &mut v[g.tensor.index()];
            let cur = g.before;
            *e = Some(match *e {
                None => cur,
                Some(prev) => match (prev, cur) {
                    (None, _) | (_, None) => None,
                    (Some(p), Some(c)) => Some(p.max(c)),
                },
            });
        }
        v
    };
    let mut final_free_after: Vec<Vec<TensorId>> = vec![Vec::new(); n];
    // Tensors whose last gap ends after their last use: back only for recomputations.
    let mut free_after_recomputes: Vec<Vec<TensorId>> = vec![Vec::new(); n];
    let mut free_at_end: Vec<TensorId> = Vec::new();
    let output_storage = graph.output_storage();
    for t in graph
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
    {
        let u = &uses[t.id.index()];
        if output_storage[t.id.index()] {
            free_at_end.push(t.id);
            continue;
        }
        match last_gap_end[t.id.index()] {
            // The last gap runs to the end: nothing to free.
            Some(None) => {}
            Some(Some(b)) if u.last().is_none_or(|&l| l < b) => free_after_recomputes[b].push(t.id),
            _ => match u.last() {
                Some(&last) => final_free_after[last].push(t.id),
                None => free_at_end.push(t.id),
            },
        }
    }

    // Writes per position (in-place updates), for host-copy currency.
    let mut host_current: Vec<bool> = graph
        .tensors
        .iter()
        .map(|t| {
            let initial = plan
                .initial_residency
                .iter()
                .find(|e| e.0 == t.id)
                .map(|e| e.1);
            let batch_input = t.producer.is_none() && !t.is_persistent();
            batch_input || matches!(initial, Some(Residency::Host | Residency::DeviceAndHost))
        })
        .collect();

    let mut free_step: Vec<Option<StepRef>> = vec![None; gaps.len()];
    let mut swap_in_step: Vec<Option<StepRef>> = vec![None; gaps.len()];

    // Swap-ins of tensors resident on the host at the start.
    for &gi in &from_start {
        if gaps[gi].prefetch_after.is_none() {
            let s = plan.push(Stream::H2d, Instr::SwapIn(gaps[gi].tensor), Vec::new());
            swap_in_step[gi] = Some(s);
        }
    }

    for pos in 0..n {
        let op = schedule.order[pos];
        // Waits go on the first step of this position: a recomputation or the op.
        let mut waits: Vec<StepRef> = Vec::new();
        for &gi in &swap_in_before[pos] {
            let Some(s) = swap_in_step[gi] else {
                return Err(err(format!(
                    "the swap-in of {} is not triggered before position {pos}",
                    gaps[gi].tensor
                )));
            };
            waits.push(s);
        }
        for &gi in &reclaim_at[pos] {
            if let Some(s) = free_step[gi] {
                waits.push(s);
            }
        }
        for &gi in &recompute_before[pos] {
            let g = gaps[gi];
            let producer = graph.tensor(g.tensor).producer.unwrap_or(OpId(0));
            plan.push(
                Stream::Compute,
                Instr::Recompute {
                    op: producer,
                    outputs: vec![g.tensor],
                },
                std::mem::take(&mut waits),
            );
        }
        for &t in &free_after_recomputes[pos] {
            plan.push(Stream::Compute, Instr::Free(t), std::mem::take(&mut waits));
        }
        let at = plan.push(Stream::Compute, Instr::Compute(op), waits);
        for &o in &graph.op(op).outputs {
            if let Some(target) = graph.tensor(o).inplace_update_of {
                host_current[graph.storage_owner(target).index()] = false;
            }
        }
        for &t in &final_free_after[pos] {
            plan.push(Stream::Compute, Instr::Free(t), Vec::new());
        }
        for &gi in &starts_after[pos] {
            let g = gaps[gi];
            let t = g.tensor;
            let free = match g.how {
                Restore::Recompute => plan.push(Stream::Compute, Instr::Free(t), Vec::new()),
                Restore::Swap if host_current[t.index()] => {
                    // The host copy is current: skip the redundant copy-out.
                    plan.push(Stream::Compute, Instr::Free(t), Vec::new())
                }
                Restore::Swap => {
                    plan.push(Stream::D2h, Instr::SwapOut(t), vec![at]);
                    host_current[t.index()] = true;
                    plan.push(Stream::D2h, Instr::Free(t), Vec::new())
                }
            };
            free_step[gi] = Some(free);
        }
        for &gi in &trigger_after[pos] {
            let g = gaps[gi];
            let mut waits = vec![at];
            if let Some(f) = free_step[gi] {
                waits.push(f);
            }
            let s = plan.push(Stream::H2d, Instr::SwapIn(g.tensor), waits);
            swap_in_step[gi] = Some(s);
        }
    }
    for t in free_at_end {
        plan.push(Stream::Compute, Instr::Free(t), Vec::new());
    }
    Ok(plan)
}
