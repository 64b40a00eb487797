//! Schedules: a planner's decisions (compute order, and the gaps during which a
//! tensor is off the device, restored by swapping or recomputation), and their
//! lowering to the one Plan with every copy, free and wait in place.

use crate::plan::{Plan, PlannerInfo, Residency, StepRef, Stream};
use crate::prepared::PreparedGraph;
use crate::program::{ProgramSink, StepInstr};
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
/// `before`). A gap may end before the tensor's next use. A gap starts after a
/// use, where the tensor's previous gap ends, or where a recomputation reads
/// it. A tensor that is at position `p` only for the recomputations there (op
/// `p` does not use it, and it is gone again after `p`: brought back at `p`
/// with no use at or after `p`, or its next gap, restored by recomputation,
/// starts at `p` where it was recomputed or read by a recomputation) is freed
/// right after the last recomputation at `p` that reads it (right after its
/// own recomputation if none does, or after all of them if it came back by a
/// swap-in nothing there reads), so that a long chain holds at most the links
/// still to be read. Every other residency period ends with a free after its
/// last use; step outputs are freed at the end.
pub fn lower_schedule(
    graph: &Graph,
    schedule: &Schedule,
    info: PlannerInfo,
    budget_bytes: u64,
) -> Result<Plan, ScheduleError> {
    let prepared = PreparedGraph::new(graph);
    let mut plan = Plan::new(graph, info, budget_bytes);
    lower_into(
        graph,
        &prepared,
        schedule,
        &mut LowerScratch::default(),
        &mut plan,
    )?;
    Ok(plan)
}

/// Reusable buffers of [`lower_into`]: a search lowers many schedules of one
/// graph, and keeping these between calls avoids an allocation per position.
#[derive(Debug, Clone, Default)]
pub struct LowerScratch {
    seen: Vec<bool>,
    /// Use positions per storage owner, as compressed rows.
    use_start: Vec<u32>,
    use_items: Vec<u32>,
    use_fill: Vec<u32>,
    /// Gap indices sorted by (tensor, start).
    sorted: Vec<u32>,
    /// (position, secondary key, gap) for each per-position event list.
    starts_after: Buckets,
    recompute_before: Buckets,
    swap_in_before: Buckets,
    reclaim_at: Buckets,
    trigger_after: Buckets,
    final_free_after: Buckets,
    free_after_recomputes: Buckets,
    from_start: Vec<u32>,
    free_at_end: Vec<TensorId>,
    /// Per tensor: `None` no gap; `Some(None)` the last gap runs to the end;
    /// `Some(Some(b))` the last gap ends at `b`.
    last_gap_end: Vec<Option<Option<usize>>>,
    host_current: Vec<bool>,
    free_step: Vec<Option<StepRef>>,
    swap_in_step: Vec<Option<StepRef>>,
    waits: Vec<StepRef>,
    /// Per position: tensors brought back only for its recomputations, with
    /// the index of the recomputation after which each is freed
    /// (`usize::MAX`: after all of them) and the gap it starts, if any.
    chain_frees: Vec<(TensorId, usize, Option<u32>)>,
    recomputed_here: Vec<TensorId>,
    /// (storage owner, position) where a recomputation reads it, sorted.
    chain_reads: Vec<(u32, u32)>,
}

/// Items grouped by position: `(position, key, value)` sorted, with an index of
/// where each position's run starts. Within a position, items are in key order
/// and then in the order they were pushed.
#[derive(Debug, Clone, Default)]
struct Buckets {
    items: Vec<(u32, u64, u32)>,
    sorted: Vec<(u32, u64, u32)>,
    start: Vec<u32>,
    /// Whether items within a position are ordered by key (otherwise by push order).
    keyed: bool,
}

impl Buckets {
    fn clear(&mut self) {
        self.items.clear();
        self.keyed = false;
    }

    fn push(&mut self, position: usize, key: u64, value: u32) {
        self.keyed |= key != 0;
        self.items.push((position as u32, key, value));
    }

    /// Groups by position (a counting sort, which keeps push order), then
    /// orders each position's items by key, ties in push order.
    fn finish(&mut self, n: usize) {
        self.start.clear();
        self.start.resize(n + 2, 0);
        for &(p, _, _) in &self.items {
            self.start[p as usize + 2] += 1;
        }
        for i in 0..n {
            self.start[i + 2] += self.start[i + 1];
        }
        // `start[p + 1]` is now where position `p` begins: fill from there.
        self.sorted.clear();
        self.sorted.resize(self.items.len(), (0, 0, 0));
        for &item in &self.items {
            let slot = &mut self.start[item.0 as usize + 1];
            self.sorted[*slot as usize] = item;
            *slot += 1;
        }
        // Now `start[p + 1]` is where position `p` ends, `start[p]` where it begins.
        std::mem::swap(&mut self.items, &mut self.sorted);
        self.start.truncate(n + 1);
        if self.keyed {
            for p in 0..n {
                let run = &mut self.items[self.start[p] as usize..self.start[p + 1] as usize];
                if run.len() > 1 {
                    // Values were pushed in ascending order: (key, value) is the
                    // order a stable sort by key gives.
                    run.sort_unstable_by_key(|e| (e.1, e.2));
                }
            }
        }
    }

    #[inline]
    fn at(&self, position: usize) -> impl Iterator<Item = u32> + '_ {
        self.items[self.start[position] as usize..self.start[position + 1] as usize]
            .iter()
            .map(|e| e.2)
    }
}

impl LowerScratch {
    /// The per-position lists that [`index_gaps`] fills.
    fn gap_buckets(&mut self) -> [&mut Buckets; 5] {
        [
            &mut self.starts_after,
            &mut self.recompute_before,
            &mut self.swap_in_before,
            &mut self.reclaim_at,
            &mut self.trigger_after,
        ]
    }

    /// Whether a recomputation at `position` reads `t`.
    fn chain_read(&self, t: TensorId, position: usize) -> bool {
        self.chain_reads
            .binary_search(&(t.0, position as u32))
            .is_ok()
    }

    /// Fills `chain_reads` from the recompute gaps (skipping malformed ones,
    /// which [`check_gap`] reports).
    fn index_chain_reads(&mut self, prepared: &PreparedGraph, gaps: &[Gap], n: usize) {
        self.chain_reads.clear();
        for g in gaps.iter().filter(|g| g.how == Restore::Recompute) {
            let (Some(b), Some(Some(producer))) =
                (g.before, prepared.producer.get(g.tensor.index()).copied())
            else {
                continue;
            };
            if b < n {
                for &(o, _) in prepared.op_reads(producer) {
                    self.chain_reads.push((o.0, b as u32));
                }
            }
        }
        self.chain_reads.sort_unstable();
        self.chain_reads.dedup();
    }

    fn uses(&self, t: TensorId) -> &[u32] {
        &self.use_items[self.use_start[t.index()] as usize..self.use_start[t.index() + 1] as usize]
    }

    /// Fills the use positions of every storage owner under `order`.
    fn index_uses(&mut self, prepared: &PreparedGraph, order: &[OpId]) {
        let n_t = prepared.n_tensors();
        self.use_start.clear();
        self.use_start.resize(n_t + 1, 0);
        for &op in order {
            for &o in prepared.op_owners(op) {
                self.use_start[o.index() + 1] += 1;
            }
        }
        for i in 0..n_t {
            self.use_start[i + 1] += self.use_start[i];
        }
        self.use_items.clear();
        self.use_items
            .resize(self.use_start[n_t] as usize, u32::MAX);
        self.use_fill.clear();
        self.use_fill.extend_from_slice(&self.use_start[..n_t]);
        for (pos, &op) in order.iter().enumerate() {
            for &o in prepared.op_owners(op) {
                let slot = &mut self.use_fill[o.index()];
                self.use_items[*slot as usize] = pos as u32;
                *slot += 1;
            }
        }
    }
}

/// Checks that `order` lists every op of the graph once.
fn check_order(n_ops: usize, order: &[OpId], seen: &mut Vec<bool>) -> Result<(), ScheduleError> {
    let n = order.len();
    if n != n_ops {
        return Err(err(format!("the order has {n} ops but the graph {n_ops}")));
    }
    seen.clear();
    seen.resize(n, false);
    for &op in order {
        if op.index() >= n || std::mem::replace(&mut seen[op.index()], true) {
            return Err(err(format!(
                "{op} is missing from the graph or listed twice in the order"
            )));
        }
    }
    Ok(())
}

/// Checks one gap (the `i`-th in (tensor, start) order) against the uses and
/// its predecessor on the same tensor.
fn check_gap(
    prepared: &PreparedGraph,
    scratch: &LowerScratch,
    gaps: &[Gap],
    i: usize,
    n: usize,
) -> Result<(), ScheduleError> {
    let g = &gaps[scratch.sorted[i] as usize];
    let prev = (i > 0)
        .then(|| &gaps[scratch.sorted[i - 1] as usize])
        .filter(|p| p.tensor == g.tensor);
    let t = g.tensor;
    if t.index() >= prepared.n_tensors() || !prepared.allocates[t.index()] {
        return Err(err(format!("gap on {t}, which is not a storage owner")));
    }
    let persistent = prepared.persistent[t.index()];
    if (g.after.is_none() || g.before.is_none()) && !persistent {
        return Err(err(format!(
            "open-ended gap on {t}, which is not persistent"
        )));
    }
    if g.how == Restore::Recompute
        && (g.after.is_none() || g.before.is_none() || prepared.producer[t.index()].is_none())
    {
        return Err(err(format!(
            "recompute gap on {t} needs both ends and a producer"
        )));
    }
    if let (Some(a), Some(b)) = (g.after, g.before) {
        if a >= b || b >= n {
            return Err(err(format!(
                "gap on {t} from position {a} to {b} is empty or out of range"
            )));
        }
        let u = scratch.uses(t);
        let after_prev_gap = prev.is_some_and(|p| p.before == Some(a));
        if u.binary_search(&(a as u32)).is_err() && !after_prev_gap && !scratch.chain_read(t, a) {
            return Err(err(format!(
                "gap on {t} must start at a position that uses it (or where its previous gap ends, or where a recomputation reads it)"
            )));
        }
        // The gap may end before the next use: the tensor is then back early,
        // e.g. to feed a recomputation, or only for that (then freed right after).
        let next = u.partition_point(|&p| p as usize <= a);
        if u.get(next).is_some_and(|&p| (p as usize) < b) {
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
    if let Some(prev) = prev {
        match (prev.before, g.after) {
            (Some(pb), Some(a)) if a >= pb => {}
            _ => return Err(err(format!("gaps on {t} overlap"))),
        }
    }
    Ok(())
}

/// Indexes the gaps by the positions where they act (see [`LowerScratch`]).
fn index_gaps(prepared: &PreparedGraph, gaps: &[Gap], scratch: &mut LowerScratch, n: usize) {
    let s = scratch;
    for b in s.gap_buckets() {
        b.clear();
    }
    s.from_start.clear();
    // Values are ranks in (tensor, start) order, so that ties within a position
    // keep that order, as the stable sorts of the first lowering did.
    for (rank, &gi) in s.sorted.iter().enumerate() {
        let gi_rank = rank as u32;
        let g = &gaps[gi as usize];
        match g.after {
            Some(a) => s.starts_after.push(a, 0, gi_rank),
            None => s.from_start.push(gi),
        }
        if let Some(b) = g.before {
            match g.how {
                // Recomputations at one position run in producer order.
                Restore::Recompute => {
                    let producer = prepared.producer[g.tensor.index()].map_or(0, |p| p.0);
                    s.recompute_before.push(b, producer as u64, gi_rank);
                }
                Restore::Swap => {
                    s.swap_in_before.push(b, 0, gi_rank);
                    // Swap-ins triggered at one position go in order of need.
                    if let Some(q) = g.prefetch_after.or(g.after) {
                        s.trigger_after.push(q, b as u64, gi_rank);
                    }
                }
            }
        }
        if let Some(r) = g.reclaim_before {
            s.reclaim_at.push(r, 0, gi_rank);
        }
    }
    for b in s.gap_buckets() {
        b.finish(n);
    }
}

/// Where each non-persistent storage owner is finally freed.
fn index_final_frees(prepared: &PreparedGraph, gaps: &[Gap], s: &mut LowerScratch, n: usize) {
    let n_t = prepared.n_tensors();
    s.last_gap_end.clear();
    s.last_gap_end.resize(n_t, None);
    for &gi in &s.sorted {
        let g = &gaps[gi as usize];
        let e = &mut s.last_gap_end[g.tensor.index()];
        let cur = g.before;
        *e = Some(match *e {
            None => cur,
            Some(prev) => match (prev, cur) {
                (None, _) | (_, None) => None,
                (Some(p), Some(c)) => Some(p.max(c)),
            },
        });
    }
    s.final_free_after.clear();
    s.free_after_recomputes.clear();
    s.free_at_end.clear();
    for ti in 0..n_t {
        if !prepared.allocates[ti] || prepared.persistent[ti] {
            continue;
        }
        let t = TensorId(ti as u32);
        if prepared.output_storage[ti] {
            s.free_at_end.push(t);
            continue;
        }
        let last = s.uses(t).last().map(|&p| p as usize);
        match s.last_gap_end[ti] {
            // The last gap runs to the end: nothing to free.
            Some(None) => {}
            // Back after its last use: only to feed recomputations.
            Some(Some(b)) if last.is_none_or(|l| l < b) => {
                s.free_after_recomputes.push(b, 0, ti as u32)
            }
            _ => match last {
                Some(l) => s.final_free_after.push(l, 0, ti as u32),
                None => s.free_at_end.push(t),
            },
        }
    }
    s.final_free_after.finish(n);
    s.free_after_recomputes.finish(n);
}

/// [`lower_schedule`] into any [`ProgramSink`] (a `Plan`, or a reusable
/// `CompactProgram`) already reset to every persistent tensor on the device.
pub fn lower_into<S: ProgramSink>(
    graph: &Graph,
    prepared: &PreparedGraph,
    schedule: &Schedule,
    scratch: &mut LowerScratch,
    sink: &mut S,
) -> Result<(), ScheduleError> {
    let n = schedule.order.len();
    check_order(graph.ops.len(), &schedule.order, &mut scratch.seen)?;
    scratch.index_uses(prepared, &schedule.order);

    // Validate gaps in (tensor, start) order.
    let gaps = &schedule.gaps;
    scratch.sorted.clear();
    scratch.sorted.extend(0..gaps.len() as u32);
    scratch.sorted.sort_unstable_by_key(|&i| {
        let g = &gaps[i as usize];
        (g.tensor, g.after.map_or(0, |a| a + 1), i)
    });
    scratch.index_chain_reads(prepared, gaps, n);
    for i in 0..gaps.len() {
        check_gap(prepared, scratch, gaps, i, n)?;
    }

    // Initial residency; a host copy is current for batch inputs and for
    // persistent tensors that start with one.
    let s = scratch;
    s.host_current.clear();
    s.host_current.extend_from_slice(&prepared.batch_input);
    for &(t, r) in &schedule.initial_residency {
        if !sink.set_initial_residency(t, r) {
            return Err(err(format!(
                "initial residency for {t}, which is not persistent"
            )));
        }
        s.host_current[t.index()] = prepared.batch_input[t.index()]
            || matches!(r, Residency::Host | Residency::DeviceAndHost);
    }
    index_gaps(prepared, gaps, s, n);
    index_final_frees(prepared, gaps, s, n);
    emit(prepared, schedule, s, sink)
}

/// Fills `s.chain_frees` for position `pos` (op `op`): the tensors brought
/// back there only for its recomputations (see [`lower_schedule`]), each with
/// the index, among the recomputations at `pos`, of the last one that reads it.
fn chain_frees_at(
    prepared: &PreparedGraph,
    schedule: &Schedule,
    s: &mut LowerScratch,
    pos: usize,
    op: OpId,
) {
    let gaps = &schedule.gaps;
    s.chain_frees.clear();
    s.recomputed_here.clear();
    for rank in s.recompute_before.at(pos) {
        s.recomputed_here
            .push(gaps[s.sorted[rank as usize] as usize].tensor);
    }
    for t in s.free_after_recomputes.at(pos) {
        s.chain_frees.push((TensorId(t), usize::MAX, None));
    }
    if s.recomputed_here.is_empty() {
        return;
    }
    for rank in s.starts_after.at(pos) {
        let gi = s.sorted[rank as usize];
        let g = &gaps[gi as usize];
        let t = g.tensor;
        let used_here = prepared.op_owners(op).contains(&t);
        let here_for_chains = s.recomputed_here.contains(&t) || s.chain_read(t, pos);
        if g.how == Restore::Recompute && !used_here && here_for_chains {
            s.chain_frees.push((t, usize::MAX, Some(gi)));
        }
    }
    if s.chain_frees.is_empty() {
        return;
    }
    for (i, rank) in s.recompute_before.at(pos).enumerate() {
        let t = gaps[s.sorted[rank as usize] as usize].tensor;
        let producer = prepared.producer[t.index()].unwrap_or(OpId(0));
        for c in s.chain_frees.iter_mut() {
            // Its own recomputation, then (later in producer order) its readers.
            if c.0 == t || prepared.op_reads(producer).iter().any(|r| r.0 == c.0) {
                c.1 = i;
            }
        }
    }
}

/// Writes the steps, position by position (see [`lower_schedule`]).
fn emit<S: ProgramSink>(
    prepared: &PreparedGraph,
    schedule: &Schedule,
    s: &mut LowerScratch,
    sink: &mut S,
) -> Result<(), ScheduleError> {
    let gaps = &schedule.gaps;
    let n = schedule.order.len();
    s.free_step.clear();
    s.free_step.resize(gaps.len(), None);
    s.swap_in_step.clear();
    s.swap_in_step.resize(gaps.len(), None);

    // Swap-ins of tensors resident on the host at the start.
    for &gi in &s.from_start {
        let g = &gaps[gi as usize];
        if g.prefetch_after.is_none() {
            let step = sink.push_step(Stream::H2d, StepInstr::SwapIn(g.tensor), &[]);
            s.swap_in_step[gi as usize] = Some(step);
        }
    }
    for pos in 0..n {
        let op = schedule.order[pos];
        // Waits go on the first step of this position: a recomputation or the op.
        s.waits.clear();
        for rank in s.swap_in_before.at(pos) {
            let gi = s.sorted[rank as usize] as usize;
            let Some(step) = s.swap_in_step[gi] else {
                return Err(err(format!(
                    "the swap-in of {} is not triggered before position {pos}",
                    gaps[gi].tensor
                )));
            };
            s.waits.push(step);
        }
        for rank in s.reclaim_at.at(pos) {
            if let Some(step) = s.free_step[s.sorted[rank as usize] as usize] {
                s.waits.push(step);
            }
        }
        chain_frees_at(prepared, schedule, s, pos, op);
        for (i, rank) in s.recompute_before.at(pos).enumerate() {
            let g = &gaps[s.sorted[rank as usize] as usize];
            let producer = prepared.producer[g.tensor.index()].unwrap_or(OpId(0));
            let instr = StepInstr::Recompute {
                op: producer,
                outputs: std::slice::from_ref(&g.tensor),
            };
            sink.push_step(Stream::Compute, instr, &s.waits);
            s.waits.clear();
            for &(t, _, gap) in s.chain_frees.iter().filter(|c| c.1 == i) {
                let free = sink.push_step(Stream::Compute, StepInstr::Free(t), &[]);
                if let Some(gi) = gap {
                    s.free_step[gi as usize] = Some(free);
                }
            }
        }
        for &(t, _, gap) in s.chain_frees.iter().filter(|c| c.1 == usize::MAX) {
            let free = sink.push_step(Stream::Compute, StepInstr::Free(t), &s.waits);
            s.waits.clear();
            if let Some(gi) = gap {
                s.free_step[gi as usize] = Some(free);
            }
        }
        let at = sink.push_step(Stream::Compute, StepInstr::Compute(op), &s.waits);
        for &w in prepared.op_written(op) {
            s.host_current[w.index()] = false;
        }
        for t in s.final_free_after.at(pos) {
            sink.push_step(Stream::Compute, StepInstr::Free(TensorId(t)), &[]);
        }
        for rank in s.starts_after.at(pos) {
            let gi = s.sorted[rank as usize];
            let g = &gaps[gi as usize];
            let t = g.tensor;
            let free = match g.how {
                // Already freed among the recomputations at `pos`.
                Restore::Recompute if s.free_step[gi as usize].is_some() => continue,
                Restore::Recompute => sink.push_step(Stream::Compute, StepInstr::Free(t), &[]),
                Restore::Swap if s.host_current[t.index()] => {
                    // The host copy is current: skip the redundant copy-out.
                    sink.push_step(Stream::Compute, StepInstr::Free(t), &[])
                }
                Restore::Swap => {
                    sink.push_step(Stream::D2h, StepInstr::SwapOut(t), &[at]);
                    s.host_current[t.index()] = true;
                    sink.push_step(Stream::D2h, StepInstr::Free(t), &[])
                }
            };
            s.free_step[gi as usize] = Some(free);
        }
        for rank in s.trigger_after.at(pos) {
            let gi = s.sorted[rank as usize];
            let mut waits = [at; 2];
            let len = match s.free_step[gi as usize] {
                Some(f) => {
                    waits[1] = f;
                    2
                }
                None => 1,
            };
            let g = &gaps[gi as usize];
            let step = sink.push_step(Stream::H2d, StepInstr::SwapIn(g.tensor), &waits[..len]);
            s.swap_in_step[gi as usize] = Some(step);
        }
    }
    for &t in &s.free_at_end {
        sink.push_step(Stream::Compute, StepInstr::Free(t), &[]);
    }
    Ok(())
}
