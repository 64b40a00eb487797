//! Schedules: a planner's decisions (compute order, and the gaps during which a
//! tensor is off the device, restored by swapping or recomputation), and their
//! lowering to the one Plan with every copy, free and wait in place.

use crate::plan::{Plan, PlannerInfo, Residency, StepRef, Stream, graph_fingerprint};
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
    /// For a persistent tensor that begins the iteration on the device, it may
    /// also be a position before its first use: the previous iteration left
    /// it there (an optimizer state updated late in that iteration), and it is
    /// copied out after the op at `after` and back for its first use. Its
    /// copy-out then runs early in the iteration, while the link is idle,
    /// instead of after its update at the previous iteration's end.
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
    /// Swap only: the copy-out starts once the compute op at this position
    /// (before `after`) has finished, while the tensor is still resident and
    /// read up to `after`; the free then runs on the compute stream, waiting
    /// for the copy, after the op before `reclaim_before` (or after
    /// `prefetch_after` if that is earlier, or after `after` if there is no
    /// reclaim point): the copy may run past `after`, and compute waits for
    /// it only where a reclaim point says it may. The
    /// tensor must be resident there (used or produced at or before it,
    /// back from its previous gap, or a persistent tensor with no gap
    /// before) and written by no op after it up to `after`, so the copy holds
    /// its value at the gap. `None`: the copy-out starts after `after`.
    ///
    /// Why: a copy-out that starts only where the gap starts loads the d2h
    /// link where tensors leave together (the features of a dense block at
    /// its last concatenation; a parameter that leaves the device at its
    /// last read in the backward pass just as the largest activations of
    /// the iteration are alive, the memory it frees needed at once), where
    /// the copy could have run any time since the tensor last changed.
    ///
    /// A position after `after` delays the copy-out instead: the tensor
    /// stays resident, unread, to that op's end, then is copied out and
    /// freed on the d2h stream as at a gap's start. It must come before the
    /// reclaim point, the gap's end, and the swap-in's trigger (which must
    /// then be given: one at `after` would run before the free). Why: the
    /// d2h stream copies in the order the copies are issued, so a large
    /// copy whose memory is needed late, issued first, holds up a small one
    /// whose memory an op waits for; a delay lets the small one go first.
    pub copy_out_after: Option<usize>,
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
/// and a free after it (with [`Gap::copy_out_after`], the swap-out after that
/// earlier step instead and the free on the compute stream, waiting for it;
/// or, past `after`, the swap-out and free after that later step); a swap-in on h2d once `prefetch_after` has run and the
/// free is done; the first step at position `before` (a recomputation or the op)
/// waits for the swap-in. Recompute gaps: a free on compute after `after`, and
/// `Recompute` of the producer just before the op at `before` (several at one
/// position run in producer order, so a chain such as Chen et al.'s segment
/// recomputation works when every dropped tensor of the chain has the same
/// `before`; the gaps of one producer at one position share one step, so the
/// op runs once for all of them). A gap may end before the tensor's next use.
/// A gap starts after a use, where the tensor's previous gap ends, or where a
/// recomputation reads it. A tensor that is at position `p` only for the
/// recomputations there (op `p` does not use it, and it is gone again after
/// `p`: brought back at `p` with no use at or after `p`, or its next gap,
/// restored by recomputation, starts at `p` where it was recomputed or read
/// by a recomputation) is freed right after the last recomputation step at
/// `p` that reads it (right after its own recomputation if none does, or
/// after all of them if it came back by a swap-in nothing there reads), so
/// that a long chain holds at most the links still to be read. A tensor
/// that a recomputation at `p` reads after its last use, with no gap of it
/// ending at or after `p`, is held: resident from its last use to `p`, and
/// freed there in the same way (see `index_holds`). Every other
/// residency period ends with a free after its last use; step outputs are
/// freed at the end.
pub fn lower_schedule(
    graph: &Graph,
    schedule: &Schedule,
    info: PlannerInfo,
    budget_bytes: u64,
) -> Result<Plan, ScheduleError> {
    lower_schedule_prepared(
        graph,
        &PreparedGraph::new(graph),
        graph_fingerprint(graph),
        schedule,
        info,
        budget_bytes,
    )
}

/// [`lower_schedule`] with the graph's lookup tables and fingerprint already
/// at hand (`prepared` must be `PreparedGraph::new(graph)` and `fingerprint`
/// `graph_fingerprint(graph)`): a search lowers many schedules of one graph.
pub fn lower_schedule_prepared(
    graph: &Graph,
    prepared: &PreparedGraph,
    fingerprint: String,
    schedule: &Schedule,
    info: PlannerInfo,
    budget_bytes: u64,
) -> Result<Plan, ScheduleError> {
    let mut plan = Plan::with_fingerprint(graph, info, budget_bytes, fingerprint);
    lower_into(
        graph,
        prepared,
        schedule,
        &mut LowerScratch::default(),
        &mut plan,
    )?;
    plan.lowered_from = Some(std::sync::Arc::new(schedule.clone()));
    Ok(plan)
}

/// Reusable buffers of [`lower_into`]: a search lowers many schedules of one
/// graph, and keeping these between calls avoids an allocation per position.
#[derive(Debug, Clone, Default)]
pub struct LowerScratch {
    seen: Vec<bool>,
    /// Per storage owner: the last position that uses it (`u32::MAX`: none).
    last_use: Vec<u32>,
    /// Per tensor: its index in `gapped` (`u32::MAX`: no gap).
    gap_index: Vec<u32>,
    /// The tensors with a gap, in the order first seen; per tensor, where its
    /// last gap ends ([`TO_END`] or a position; [`NO_GAP`] before its gaps are
    /// indexed).
    gapped: Vec<(TensorId, u32)>,
    /// The (prepared graph id, op order) that `last_use`, `use_start`,
    /// `use_items` and `last_uses` describe. A search scores many schedules
    /// in one order (every planner but SwapAdvisor keeps the graph's), so
    /// the backward pass over the order that fills them runs once per order,
    /// not once per schedule.
    indexed_order: Option<(u64, Vec<OpId>)>,
    /// Use positions of every storage owner, ascending, as compressed rows:
    /// `use_items[use_start[t]..use_start[t + 1]]`.
    use_start: Vec<u32>,
    use_items: Vec<u32>,
    use_fill: Vec<u32>,
    /// (position, tensor): the non-persistent owners used for the last time
    /// at a position, in descending position; the lowering takes them from
    /// the end, and `last_uses_end` is how many it has not taken yet.
    last_uses: Vec<(u32, TensorId)>,
    last_uses_end: usize,
    /// Gap indices sorted by (tensor, start); a gap's place here is its rank.
    sorted: Vec<u32>,
    /// (tensor, start, index) of every gap, packed, to sort (see `sort_gaps`).
    gap_keys: Vec<u128>,
    gap_keys64: Vec<u64>,
    /// What happens at each position (see [`Action`]), as pushed, then
    /// grouped by position.
    actions: Vec<Action>,
    grouped: Vec<Action>,
    /// `grouped[action_start[p]..action_start[p + 1]]` act at position `p`.
    action_start: Vec<u32>,
    /// Gaps (indices) on tensors resident on the host at the start.
    from_start: Vec<u32>,
    host_current: Vec<bool>,
    free_step: Vec<Option<StepRef>>,
    swap_in_step: Vec<Option<StepRef>>,
    /// Per gap: its early copy-out's step ([`Gap::copy_out_after`]), once
    /// written (none where the host copy was current).
    copy_out_step: Vec<Option<StepRef>>,
    waits: Vec<StepRef>,
    frees: Vec<TensorId>,
    /// Outputs of the recomputation step being written.
    recompute_outputs: Vec<TensorId>,
    /// (storage owner, position) where a recomputation reads it, sorted.
    /// Packed as `tensor << 32 | position`: one integer compare per step of
    /// the sort and the search, where a pair takes two.
    chain_reads: Vec<u64>,
    /// The tensors at the position being written only for its
    /// recomputations (see [`ChainFree`]).
    chain_frees: Vec<ChainFree>,
    /// `chain_frees`' tensors with their indices, sorted: what each
    /// recomputation at the position looks its reads up in.
    chain_free_index: Vec<(TensorId, u32)>,
}

/// A tensor at a position only for the recomputations there, freed right
/// after the recomputation step of `after_producer` (the last one at the
/// position that reads or brings it back; [`NONE`]: after all of them).
#[derive(Debug, Clone, Copy)]
struct ChainFree {
    tensor: TensorId,
    after_producer: u32,
    /// The gap this free starts ([`NONE`]: it ends a residency period).
    gap: u32,
}

/// `LowerScratch::gapped`: no gap indexed yet.
const NO_GAP: u32 = u32::MAX;
/// `LowerScratch::gapped`: its last gap runs to the end of the iteration.
const TO_END: u32 = u32::MAX - 1;
/// No position, no index.
const NONE: u32 = u32::MAX;

/// What the lowering does at a position, in the order it does it: the waits
/// of the position's first step, recomputations, frees of tensors brought
/// back only for them, the op itself (not an action), final frees, gap starts
/// and triggered swap-ins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Wait for the swap-in of a gap ending here (value: gap rank).
    SwapInWait,
    /// Wait for the free of a gap reclaimed here (value: gap rank).
    ReclaimWait,
    /// Recompute a gap's tensor (key: producer, value: gap rank).
    Recompute,
    /// Free a tensor back only to feed recomputations (key and value: tensor).
    FreeAfterRecomputes,
    /// Free tensors after their last use (not an action: found from the op's
    /// operands when it is emitted).
    FinalFree,
    /// Start a gap's early copy-out (value: gap rank; see
    /// [`Gap::copy_out_after`]).
    CopyOut,
    /// Start a gap: swap out or drop (value: gap rank).
    GapStart,
    /// Start a gap's swap-in (key: where it is needed, value: gap rank).
    Trigger,
}

/// One action: at `position`, in `phase`, ordered within the phase by `key`
/// and then by the order it was pushed.
#[derive(Debug, Clone, Copy)]
struct Action {
    position: u32,
    phase: Phase,
    key: u32,
    value: u32,
}

/// The key of "a recomputation at `position` reads tensor `t`".
#[inline]
fn chain_key(t: u32, position: u32) -> u64 {
    (t as u64) << 32 | position as u64
}

impl LowerScratch {
    /// Fills `sorted` with the gap indices in (tensor, start, index) order.
    /// The three are packed in one integer, cheap to compare: a `u64` when
    /// their bit widths fit (any graph below millions of tensors and ops),
    /// else a `u128`.
    fn sort_gaps(&mut self, gaps: &[Gap]) {
        let start = |g: &Gap| g.after.map_or(0, |a| a as u64 + 1);
        let bits = |max: u64| u64::BITS - max.leading_zeros();
        let max_t = gaps.iter().map(|g| g.tensor.0 as u64).max().unwrap_or(0);
        let max_s = gaps.iter().map(start).max().unwrap_or(0);
        let (bt, bs, bi) = (bits(max_t), bits(max_s), bits(gaps.len() as u64));
        self.sorted.clear();
        if bt + bs + bi < 64 {
            self.gap_keys64.clear();
            self.gap_keys64.extend(
                gaps.iter()
                    .enumerate()
                    .map(|(i, g)| ((g.tensor.0 as u64) << (bs + bi)) | (start(g) << bi) | i as u64),
            );
            self.gap_keys64.sort_unstable();
            let mask = (1u64 << bi) - 1;
            self.sorted
                .extend(self.gap_keys64.iter().map(|&k| (k & mask) as u32));
        } else {
            self.gap_keys.clear();
            self.gap_keys.extend(gaps.iter().enumerate().map(|(i, g)| {
                ((g.tensor.0 as u128) << 96) | ((start(g) as u128) << 32) | i as u128
            }));
            self.gap_keys.sort_unstable();
            self.sorted.extend(self.gap_keys.iter().map(|&k| k as u32));
        }
    }

    /// Whether a recomputation at `position` reads `t`.
    fn chain_read(&self, t: TensorId, position: usize) -> bool {
        self.chain_reads
            .binary_search(&chain_key(t.0, position as u32))
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
                    self.chain_reads.push(chain_key(o.0, b as u32));
                }
            }
        }
        self.chain_reads.sort_unstable();
        self.chain_reads.dedup();
    }

    /// The positions that use storage owner `t`, ascending.
    fn uses(&self, t: TensorId) -> &[u32] {
        let i = t.index();
        &self.use_items[self.use_start[i] as usize..self.use_start[i + 1] as usize]
    }

    /// Lists the tensors with gaps, resetting what the previous call marked.
    fn mark_gapped(&mut self, n_t: usize, gaps: &[Gap]) {
        if self.gap_index.len() != n_t {
            self.gap_index.clear();
            self.gap_index.resize(n_t, NONE);
            self.gapped.clear();
        }
        for (t, _) in self.gapped.drain(..) {
            self.gap_index[t.index()] = NONE;
        }
        for g in gaps {
            if let Some(slot) = self.gap_index.get_mut(g.tensor.index())
                && *slot == NONE
            {
                *slot = self.gapped.len() as u32;
                self.gapped.push((g.tensor, NO_GAP));
            }
        }
    }

    /// Whether the per-order tables describe `order` of `prepared`'s graph
    /// (which was then checked by [`check_order`] too).
    fn order_indexed(&self, prepared: &PreparedGraph, order: &[OpId]) -> bool {
        matches!(&self.indexed_order, Some((id, o)) if *id == prepared.id() && o[..] == *order)
    }

    /// One backward pass over `order` (checked by [`check_order`]): the last
    /// use of every storage owner (the first met), the tensors each position
    /// may free after its op, and every owner's use positions.
    fn index_order(&mut self, prepared: &PreparedGraph, order: &[OpId]) {
        let n_t = prepared.n_tensors();
        self.last_use.clear();
        self.last_use.resize(n_t, NONE);
        self.last_uses.clear();
        self.use_start.clear();
        self.use_start.resize(n_t + 1, 0);
        for &op in order {
            for &o in prepared.op_owners(op) {
                self.use_start[o.index() + 1] += 1;
            }
        }
        let mut sum = 0;
        for c in &mut self.use_start[1..] {
            sum += *c;
            *c = sum;
        }
        self.use_items.clear();
        self.use_items.resize(sum as usize, 0);
        // Filled from each row's end, positions descending: rows ascend.
        self.use_fill.clear();
        self.use_fill.extend_from_slice(&self.use_start[1..]);
        for (pos, &op) in order.iter().enumerate().rev() {
            for &o in prepared.op_owners(op) {
                let slot = &mut self.use_fill[o.index()];
                *slot -= 1;
                self.use_items[*slot as usize] = pos as u32;
                let last = &mut self.last_use[o.index()];
                if *last == NONE {
                    *last = pos as u32;
                    if prepared.freed_after_use[o.index()] {
                        self.last_uses.push((pos as u32, o));
                    }
                }
            }
        }
        // Within one position, tensors descending: the lowering takes them
        // from the end, so it meets each position's frees in ascending order.
        // Groups are short and pushed in operand order: an insertion sort.
        for i in 1..self.last_uses.len() {
            let mut j = i;
            while j > 0
                && self.last_uses[j - 1].0 == self.last_uses[j].0
                && self.last_uses[j - 1].1 < self.last_uses[j].1
            {
                self.last_uses.swap(j - 1, j);
                j -= 1;
            }
        }
        let mut key = self.indexed_order.take().unwrap_or_default();
        key.0 = prepared.id();
        key.1.clear();
        key.1.extend_from_slice(order);
        self.indexed_order = Some(key);
    }

    fn act(&mut self, position: usize, phase: Phase, key: u32, value: u32) {
        self.actions.push(Action {
            position: position as u32,
            phase,
            key,
            value,
        });
    }

    /// Groups the actions by position (a counting sort, which keeps push
    /// order), then orders each position's actions by (phase, key), ties in
    /// push order.
    fn group_actions(&mut self, n: usize) {
        self.action_start.clear();
        self.action_start.resize(n + 2, 0);
        for a in &self.actions {
            self.action_start[a.position as usize + 2] += 1;
        }
        let mut sum = 0;
        for s in &mut self.action_start[1..] {
            sum += *s;
            *s = sum;
        }
        // `action_start[p + 1]` is now where position `p` begins: fill from there.
        self.grouped.clear();
        self.grouped.resize(
            self.actions.len(),
            Action {
                position: 0,
                phase: Phase::SwapInWait,
                key: 0,
                value: 0,
            },
        );
        for &a in &self.actions {
            let slot = &mut self.action_start[a.position as usize + 1];
            self.grouped[*slot as usize] = a;
            *slot += 1;
        }
        // Now `action_start[p + 1]` is where position `p` ends, `action_start[p]`
        // where it begins.
        self.action_start.truncate(n + 1);
        // Runs are short and mostly in order: a stable insertion sort.
        for p in 0..n {
            let run =
                &mut self.grouped[self.action_start[p] as usize..self.action_start[p + 1] as usize];
            for i in 1..run.len() {
                let a = run[i];
                let mut j = i;
                while j > 0 && (run[j - 1].phase, run[j - 1].key) > (a.phase, a.key) {
                    run[j] = run[j - 1];
                    j -= 1;
                }
                run[j] = a;
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
        // A persistent tensor's first gap may start before its first use
        // (see `Gap::after`); one that begins on the host has a gap from the
        // start before it, so this is its first only if it begins on the device.
        let before_first_use =
            persistent && prev.is_none() && u.first().is_some_and(|&f| a < f as usize);
        if u.binary_search(&(a as u32)).is_err()
            && !after_prev_gap
            && !before_first_use
            && !scratch.chain_read(t, a)
        {
            return Err(err(format!(
                "gap on {t} must start at a position that uses it (or where its previous gap ends, where a recomputation reads it, or, for a persistent tensor, before its first use)"
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
    // An open-ended gap's start and any reclaim point are positions too.
    for (what, p) in [("start", g.after), ("reclaim point", g.reclaim_before)] {
        if let Some(p) = p
            && p >= n
        {
            return Err(err(format!(
                "gap on {t}: {what} {p} is past the last position of the order ({})",
                n.saturating_sub(1)
            )));
        }
    }
    Ok(())
}

/// Checks gap `g`'s early copy-out after position `c` ([`Gap::copy_out_after`]):
/// a swap gap that starts after `c`, the tensor resident at `c` (`prev`: its
/// gap before `g`, if any) and not written after `c` up to the gap's start.
fn check_copy_out(
    prepared: &PreparedGraph,
    scratch: &LowerScratch,
    order: &[OpId],
    g: &Gap,
    prev: Option<&Gap>,
    c: usize,
) -> Result<(), ScheduleError> {
    let t = g.tensor;
    if g.after == Some(c) {
        return Err(err(format!(
            "gap on {t}: a copy-out after position {c}, where the gap starts, is its own: leave `copy_out_after` unset"
        )));
    }
    let Some(a) = g.after.filter(|&a| g.how == Restore::Swap && c < a) else {
        return Err(err(format!(
            "gap on {t}: a copy-out after position {c} needs a swap gap that starts after it"
        )));
    };
    let u = scratch.uses(t);
    let resident = match prev {
        Some(p) => p.before.is_some_and(|b| b <= c),
        None => prepared.persistent[t.index()] || u.first().is_some_and(|&f| f as usize <= c),
    };
    if !resident {
        return Err(err(format!(
            "gap on {t}: its copy-out after position {c} starts where it is not resident"
        )));
    }
    let from = u.partition_point(|&p| p as usize <= c);
    if let Some(&p) = u[from..]
        .iter()
        .take_while(|&&p| p as usize <= a)
        .find(|&&p| prepared.op_written(order[p as usize]).contains(&t))
    {
        return Err(err(format!(
            "gap on {t}: written at position {p}, after its copy-out starts ({c}) and before its gap ({a})"
        )));
    }
    Ok(())
}

/// Checks gap `g`'s delayed copy-out after position `c`, past its start
/// ([`Gap::copy_out_after`]): a swap, with `c` inside the order, before the
/// gap's end and its reclaim point, and no later than its swap-in's trigger,
/// which must be given.
fn check_delayed_copy_out(g: &Gap, c: usize, n: usize) -> Result<(), ScheduleError> {
    let t = g.tensor;
    if g.how != Restore::Swap {
        return Err(err(format!(
            "gap on {t}: a copy-out after position {c} needs a swap gap"
        )));
    }
    let last = g.before.map_or(n, |b| b).min(g.reclaim_before.unwrap_or(n));
    if c >= last {
        return Err(err(format!(
            "gap on {t}: its copy-out after position {c} must come before the gap's end and reclaim point (positions up to {})",
            last as i64 - 1
        )));
    }
    if g.before.is_some() && g.prefetch_after.is_none_or(|q| q < c) {
        return Err(err(format!(
            "gap on {t}: its copy-out after position {c} comes after its swap-in's trigger ({}); trigger the swap-in at or after {c}",
            g.prefetch_after
                .or(g.after)
                .map_or("none".into(), |q| q.to_string())
        )));
    }
    Ok(())
}

/// Where gap `g` (starting after position `a`) starts on the streams: its
/// free, or its copy-out and free, after this position and in this key of
/// its phase. A delayed copy-out ([`Gap::copy_out_after`] after `a`) goes
/// after the gaps that start there, keyed by its reclaim point, or its
/// gap's end where it has none (the earliest need first; ties by tensor).
fn gap_start_at(g: &Gap, a: usize) -> (usize, u32) {
    match g.copy_out_after {
        Some(c) if c > a => {
            let need = g
                .reclaim_before
                .or(g.before)
                .map_or(u32::MAX - 1, |p| p as u32);
            (c, need.saturating_add(1))
        }
        _ => (freed_after(g, a), 0),
    }
}

/// Lists what each gap does and where (see [`Phase`]), in rank order.
fn index_gaps(prepared: &PreparedGraph, gaps: &[Gap], s: &mut LowerScratch) {
    s.actions.clear();
    s.from_start.clear();
    for rank in 0..s.sorted.len() {
        let gi = s.sorted[rank];
        let g = &gaps[gi as usize];
        let rank = rank as u32;
        match g.after {
            Some(a) => {
                let (at, key) = gap_start_at(g, a);
                s.act(at, Phase::GapStart, key, rank);
            }
            None => s.from_start.push(gi),
        }
        if let Some(c) = g.copy_out_after
            && g.after.is_none_or(|a| c < a)
        {
            s.act(c, Phase::CopyOut, 0, rank);
        }
        if let Some(b) = g.before {
            match g.how {
                // Recomputations at one position run in producer order.
                Restore::Recompute => {
                    let producer = prepared.producer[g.tensor.index()].map_or(0, |p| p.0);
                    s.act(b, Phase::Recompute, producer, rank);
                }
                Restore::Swap => {
                    s.act(b, Phase::SwapInWait, 0, rank);
                    // Swap-ins triggered at one position go in order of need.
                    if let Some(q) = g.prefetch_after.or(g.after) {
                        s.act(q, Phase::Trigger, b as u32, rank);
                    }
                }
            }
        }
        if let Some(r) = g.reclaim_before {
            s.act(r, Phase::ReclaimWait, 0, rank);
        }
        // Where the tensor's last gap ends.
        let end = g.before.map_or(TO_END, |b| b as u32);
        let e = &mut s.gapped[s.gap_index[g.tensor.index()] as usize].1;
        *e = match *e {
            NO_GAP => end,
            TO_END => TO_END,
            _ if end == TO_END => TO_END,
            prev => prev.max(end),
        };
    }
}

/// Where gap `g` (starting after position `a`) frees its tensor: after the
/// op at `a`, or, for an early copy-out ([`Gap::copy_out_after`]), on the
/// compute stream once the copy is done, after the op before the reclaim
/// point (or the swap-in's trigger, if earlier; `a` if neither), so that
/// compute waits for the copy only where the gap says it may.
fn freed_after(g: &Gap, a: usize) -> usize {
    if g.copy_out_after.is_none() {
        return a;
    }
    let reclaim = g.reclaim_before.map(|r| r - 1);
    match (reclaim, g.prefetch_after) {
        (Some(r), Some(q)) => r.min(q),
        (Some(r), None) => r,
        _ => a,
    }
    .max(a)
}

/// Holds: a storage owner that a recomputation at position `p` reads after
/// its last use in the order, with no gap ending at or after `p` (and none
/// open to the iteration's end), stays resident from its last use to `p`
/// instead of being freed there, and is freed right after the last
/// recomputation step at `p` that reads it ([`index_recompute_frees`] places
/// that free, as for a tensor brought back only to feed recomputations).
///
/// Why: a recomputation's inputs are often dead after the forward pass. In a
/// DenseNet layer the concatenation of the block's earlier features is saved
/// for its batch norm's backward; recomputing it instead reads the features
/// themselves, the small outputs of earlier layers, which no backward op
/// reads. Without a hold the only ways to have them back were a swap-in or a
/// recomputation of each (a convolution), so a plan kept the large
/// concatenations and recomputed the batch norm and ReLU after them instead,
/// twice the compute per byte freed. Such a schedule failed `verify()`
/// before (the recomputation read a freed tensor), so a hold changes no
/// schedule that verified before. A storage written in place after the read
/// the recomputation needs is still refused, by `verify()`'s version check.
fn index_holds(prepared: &PreparedGraph, s: &mut LowerScratch) {
    let mut k = 0;
    while k < s.chain_reads.len() {
        // `chain_reads` is sorted by (tensor, position): the run's last entry
        // is the tensor's latest read.
        let t = (s.chain_reads[k] >> 32) as u32;
        while k + 1 < s.chain_reads.len() && (s.chain_reads[k + 1] >> 32) as u32 == t {
            k += 1;
        }
        let p = s.chain_reads[k] as u32;
        k += 1;
        let ti = t as usize;
        let last = s.last_use[ti];
        if !prepared.freed_after_use[ti] || last == NONE || last >= p {
            continue;
        }
        match s.gap_index[ti] {
            NONE => {
                s.gap_index[ti] = s.gapped.len() as u32;
                s.gapped.push((TensorId(t), p));
            }
            g => {
                let end = &mut s.gapped[g as usize].1;
                // Every indexed gap has set its end: a position or `TO_END`.
                if *end != TO_END && *end < p {
                    *end = p;
                }
            }
        }
    }
}

/// Tensors brought back after their last use, only to feed recomputations,
/// and tensors held for them ([`index_holds`]), are freed right after them.
/// (Every other non-persistent storage owner is freed after its last use,
/// found when that op is emitted, or at the end.)
fn index_recompute_frees(prepared: &PreparedGraph, s: &mut LowerScratch) {
    for k in 0..s.gapped.len() {
        let (t, end) = s.gapped[k];
        let last = s.last_use[t.index()];
        if prepared.freed_after_use[t.index()] && end != TO_END && (last == NONE || last < end) {
            s.act(end as usize, Phase::FreeAfterRecomputes, t.0, t.0);
        }
    }
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
    if !scratch.order_indexed(prepared, &schedule.order) {
        check_order(graph.ops.len(), &schedule.order, &mut scratch.seen)?;
        scratch.index_order(prepared, &schedule.order);
    }
    scratch.last_uses_end = scratch.last_uses.len();
    let gaps = &schedule.gaps;
    scratch.mark_gapped(prepared.n_tensors(), gaps);

    // Validate gaps in (tensor, start) order.
    scratch.sort_gaps(gaps);
    scratch.index_chain_reads(prepared, gaps, n);
    for i in 0..gaps.len() {
        check_gap(prepared, scratch, gaps, i, n)?;
        let g = &gaps[scratch.sorted[i] as usize];
        match g.copy_out_after {
            Some(c) if g.after.is_some_and(|a| c > a) => check_delayed_copy_out(g, c, n)?,
            Some(c) => {
                let prev = (i > 0)
                    .then(|| &gaps[scratch.sorted[i - 1] as usize])
                    .filter(|p| p.tensor == g.tensor);
                check_copy_out(prepared, scratch, &schedule.order, g, prev, c)?;
            }
            None => {}
        }
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
    index_gaps(prepared, gaps, s);
    index_holds(prepared, s);
    index_recompute_frees(prepared, s);
    s.group_actions(n);
    emit(prepared, schedule, s, sink)
}

/// Writes the steps, position by position (see [`lower_schedule`]).
fn emit<S: ProgramSink>(
    prepared: &PreparedGraph,
    schedule: &Schedule,
    s: &mut LowerScratch,
    sink: &mut S,
) -> Result<(), ScheduleError> {
    let gaps = &schedule.gaps;
    s.free_step.clear();
    s.free_step.resize(gaps.len(), None);
    s.swap_in_step.clear();
    s.swap_in_step.resize(gaps.len(), None);
    s.copy_out_step.clear();
    s.copy_out_step.resize(gaps.len(), None);

    // Swap-ins of tensors resident on the host at the start.
    for &gi in &s.from_start {
        let g = &gaps[gi as usize];
        if g.prefetch_after.is_none() {
            let step = sink.push_step(Stream::H2d, StepInstr::SwapIn(g.tensor), &[]);
            s.swap_in_step[gi as usize] = Some(step);
        }
    }
    for (pos, &op) in schedule.order.iter().enumerate() {
        // Waits go on the first step of this position: a recomputation or the op.
        s.waits.clear();
        let (k, end) = (
            s.action_start[pos] as usize,
            s.action_start[pos + 1] as usize,
        );
        chain_frees_at(prepared, gaps, s, pos, op, k, end);
        let k = emit_before_op(prepared, gaps, s, pos, k, end, sink)?;
        let at = sink.push_step(Stream::Compute, StepInstr::Compute(op), &s.waits);
        for &w in prepared.op_written(op) {
            s.host_current[w.index()] = false;
        }
        final_frees(s, pos);
        for &t in &s.frees {
            sink.push_step(Stream::Compute, StepInstr::Free(t), &[]);
        }
        emit_after_op(gaps, s, at, k, end, sink);
    }
    for &t in &prepared.freed_at_end {
        sink.push_step(Stream::Compute, StepInstr::Free(t), &[]);
    }
    Ok(())
}
/// The steps of position `pos` before its op (actions `s.grouped[k..end]`
/// up to the final frees): waits for swap-ins and reclaimed memory (on
/// `s.waits`, for the first step), recomputations, and frees. Returns the
/// index of the first action left for after the op.
#[inline]
fn emit_before_op<S: ProgramSink>(
    prepared: &PreparedGraph,
    gaps: &[Gap],
    s: &mut LowerScratch,
    pos: usize,
    mut k: usize,
    end: usize,
    sink: &mut S,
) -> Result<usize, ScheduleError> {
    while k < end && s.grouped[k].phase < Phase::FinalFree {
        let a = s.grouped[k];
        k += 1;
        match a.phase {
            Phase::SwapInWait => {
                let gi = s.sorted[a.value as usize] as usize;
                let Some(step) = s.swap_in_step[gi] else {
                    return Err(err(format!(
                        "the swap-in of {} is not triggered before position {pos}",
                        gaps[gi].tensor
                    )));
                };
                s.waits.push(step);
            }
            Phase::ReclaimWait => {
                if let Some(step) = s.free_step[s.sorted[a.value as usize] as usize] {
                    s.waits.push(step);
                }
            }
            Phase::Recompute => k = emit_recompute(prepared, gaps, s, a, k, end, sink),
            _ => {
                let t = TensorId(a.value);
                let freed_by_chain = s
                    .chain_frees
                    .iter()
                    .any(|c| c.tensor == t && c.after_producer != NONE);
                if !freed_by_chain {
                    sink.push_step(Stream::Compute, StepInstr::Free(t), &s.waits);
                    s.waits.clear();
                }
            }
        }
    }
    Ok(k)
}

/// One recomputation step for action `a` and the recompute actions after it
/// (from `k`) with the same producer: gaps of one producer ending at a
/// position are adjacent (keyed by producer) and share one step, the op
/// running once for all the outputs it brings back. Then the frees of the
/// chain links this step was the last to read. Returns the next action's
/// index.
#[inline]
fn emit_recompute<S: ProgramSink>(
    prepared: &PreparedGraph,
    gaps: &[Gap],
    s: &mut LowerScratch,
    a: Action,
    mut k: usize,
    end: usize,
    sink: &mut S,
) -> usize {
    let mut outputs = std::mem::take(&mut s.recompute_outputs);
    outputs.clear();
    outputs.push(gaps[s.sorted[a.value as usize] as usize].tensor);
    while k < end && s.grouped[k].phase == Phase::Recompute && s.grouped[k].key == a.key {
        outputs.push(gaps[s.sorted[s.grouped[k].value as usize] as usize].tensor);
        k += 1;
    }
    let producer = prepared.producer[outputs[0].index()].unwrap_or(OpId(0));
    let instr = StepInstr::Recompute {
        op: producer,
        outputs: &outputs,
    };
    sink.push_step(Stream::Compute, instr, &s.waits);
    s.waits.clear();
    s.recompute_outputs = outputs;
    for c in s.chain_frees.iter().filter(|c| c.after_producer == a.key) {
        let free = sink.push_step(Stream::Compute, StepInstr::Free(c.tensor), &[]);
        if c.gap != NONE {
            s.free_step[c.gap as usize] = Some(free);
        }
    }
    k
}

/// The steps of a position after its op (step `at`; actions
/// `s.grouped[k..end]`): early copy-outs of tensors whose host copy is
/// stale, gap starts (frees, after a copy-out where one ran), and swap-ins
/// triggered here.
#[inline]
fn emit_after_op<S: ProgramSink>(
    gaps: &[Gap],
    s: &mut LowerScratch,
    at: StepRef,
    k: usize,
    end: usize,
    sink: &mut S,
) {
    for i in k..end {
        let a = s.grouped[i];
        match a.phase {
            Phase::CopyOut => {
                let gi = s.sorted[a.value as usize] as usize;
                let t = gaps[gi].tensor;
                if !s.host_current[t.index()] {
                    let copy = sink.push_step(Stream::D2h, StepInstr::SwapOut(t), &[at]);
                    s.copy_out_step[gi] = Some(copy);
                    s.host_current[t.index()] = true;
                }
            }
            Phase::GapStart => {
                let gi = s.sorted[a.value as usize] as usize;
                if s.free_step[gi].is_some() {
                    // Already freed among the recomputations at this position.
                    continue;
                }
                let g = &gaps[gi];
                let free = match s.copy_out_step[gi] {
                    // Copied out early: the compute stream frees it once
                    // the copy is done.
                    Some(copy) => {
                        sink.push_step(Stream::Compute, StepInstr::Free(g.tensor), &[copy])
                    }
                    None => start_gap(g, at, &mut s.host_current, sink),
                };
                s.free_step[gi] = Some(free);
            }
            _ => {
                let gi = s.sorted[a.value as usize] as usize;
                let mut waits = [at; 2];
                let len = match s.free_step[gi] {
                    Some(f) => {
                        waits[1] = f;
                        2
                    }
                    None => 1,
                };
                let instr = StepInstr::SwapIn(gaps[gi].tensor);
                let step = sink.push_step(Stream::H2d, instr, &waits[..len]);
                s.swap_in_step[gi] = Some(step);
            }
        }
    }
}

/// Fills `s.chain_frees` for position `pos` (op `op`, actions
/// `s.grouped[k..end]`): the tensors there only for its recomputations (see
/// [`lower_schedule`]), each with the producer of the last recomputation step
/// there that brings it back or reads it. Most positions recompute nothing:
/// that check is inlined into the per-position loop, the rest is not.
#[inline(always)]
fn chain_frees_at(
    prepared: &PreparedGraph,
    gaps: &[Gap],
    s: &mut LowerScratch,
    pos: usize,
    op: OpId,
    k: usize,
    end: usize,
) {
    s.chain_frees.clear();
    if s.grouped[k..end]
        .iter()
        .any(|a| a.phase == Phase::Recompute)
    {
        chain_frees_with_recomputes(prepared, gaps, s, pos, op, k, end);
    }
}

/// [`chain_frees_at`] at a position with recomputations.
#[inline(never)]
fn chain_frees_with_recomputes(
    prepared: &PreparedGraph,
    gaps: &[Gap],
    s: &mut LowerScratch,
    pos: usize,
    op: OpId,
    k: usize,
    end: usize,
) {
    let actions = &s.grouped[k..end];
    let recomputed_here = |t: TensorId| {
        actions.iter().any(|a| {
            a.phase == Phase::Recompute && gaps[s.sorted[a.value as usize] as usize].tensor == t
        })
    };
    for a in actions {
        match a.phase {
            Phase::FreeAfterRecomputes => s.chain_frees.push(ChainFree {
                tensor: TensorId(a.value),
                after_producer: NONE,
                gap: NONE,
            }),
            Phase::GapStart => {
                let gi = s.sorted[a.value as usize];
                let g = &gaps[gi as usize];
                let t = g.tensor;
                if g.how == Restore::Recompute
                    && !prepared.op_owners(op).contains(&t)
                    && (recomputed_here(t) || s.chain_read(t, pos))
                {
                    s.chain_frees.push(ChainFree {
                        tensor: t,
                        after_producer: NONE,
                        gap: gi,
                    });
                }
            }
            _ => {}
        }
    }
    // Recomputation steps run in producer order: the last one that touches a
    // link has the largest producer. Each recomputation looks its tensor and
    // its producer's reads up in the links, sorted by tensor, rather than
    // scanning every link for every read (at DenseNet-121's backward
    // positions dozens of recomputations each read dozens of tensors).
    if s.chain_frees.is_empty() {
        return;
    }
    s.chain_free_index.clear();
    s.chain_free_index.extend(
        s.chain_frees
            .iter()
            .enumerate()
            .map(|(i, c)| (c.tensor, i as u32)),
    );
    s.chain_free_index.sort_unstable();
    for a in actions.iter().filter(|a| a.phase == Phase::Recompute) {
        let t = gaps[s.sorted[a.value as usize] as usize].tensor;
        let producer = prepared.producer[t.index()].unwrap_or(OpId(0));
        let touched = std::iter::once(t).chain(prepared.op_reads(producer).iter().map(|r| r.0));
        for u in touched {
            let from = s.chain_free_index.partition_point(|&(x, _)| x < u);
            for &(x, i) in &s.chain_free_index[from..] {
                if x != u {
                    break;
                }
                s.chain_frees[i as usize].after_producer = a.key;
            }
        }
    }
}

/// The tensors freed right after the op at `pos`, ascending: the owners used
/// there for the last time (taken from the end of `last_uses`), unless a gap
/// keeps them off the device to the end or they come back after it only to
/// feed recomputations. Inlined into its one caller, the per-position loop.
#[inline(always)]
fn final_frees(s: &mut LowerScratch, pos: usize) {
    s.frees.clear();
    while let Some(&(p, o)) = s.last_uses[..s.last_uses_end].last()
        && p as usize == pos
    {
        s.last_uses_end -= 1;
        let g = s.gap_index[o.index()];
        let end = if g == NONE {
            NO_GAP
        } else {
            s.gapped[g as usize].1
        };
        if end == NO_GAP || (end != TO_END && pos as u32 >= end) {
            s.frees.push(o);
        }
    }
    // Ascending: `index_order` sorted each position's group.
    debug_assert!(s.frees.is_sorted());
}

/// Starts gap `g` after the compute step `at`: a free (recompute, or swap
/// with a current host copy) or a swap-out then a free; returns the free.
fn start_gap<S: ProgramSink>(
    g: &Gap,
    at: StepRef,
    host_current: &mut [bool],
    sink: &mut S,
) -> StepRef {
    let t = g.tensor;
    match g.how {
        Restore::Recompute => sink.push_step(Stream::Compute, StepInstr::Free(t), &[]),
        Restore::Swap if host_current[t.index()] => {
            // The host copy is current: skip the redundant copy-out.
            sink.push_step(Stream::Compute, StepInstr::Free(t), &[])
        }
        Restore::Swap => {
            sink.push_step(Stream::D2h, StepInstr::SwapOut(t), &[at]);
            host_current[t.index()] = true;
            sink.push_step(Stream::D2h, StepInstr::Free(t), &[])
        }
    }
}
