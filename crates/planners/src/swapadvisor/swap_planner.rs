//! SwapAdvisor's swap planner (paper 000, Sec. 4.2): for one operator schedule
//! and one memory pool, which tensors to swap out and when to swap out and in.
//!
//! The planner scans the schedule and keeps, per size class of the pool, which
//! tensors hold its objects. An op needs its operands resident and an object
//! for each output and its workspace; an absent operand is swapped in. When a
//! class has no free object, the victim is chosen by Belady's rule within that
//! class: the resident tensor (not used by this op) whose next use is furthest
//! away, among those last used at least a threshold of time ago. Each
//! swap-out / swap-in pair is placed as early as is safe: the swap-out right
//! after the victim's last use, and the swap-in once the object is free. The
//! double pass fixes the parameters resident at the iteration start so that the
//! plan repeats: pass one starts with every persistent tensor on the host, pass
//! two starts with those pass one ends with on the device, and evicting one of
//! them before its first use removes it from that set.
//!
//! In outcore's terms a pair is two gaps of the shared lowering: the victim's
//! gap starts at its last use, and the compute op at `reclaim_before` waits for
//! its free; the swap-in's gap is triggered (`prefetch_after`) at or after that
//! op. Every object therefore passes from one tensor to the next in an order
//! that holds in every timing: the previous holder's free happens before the
//! next holder's allocation. So in any timing each class holds at most its
//! count (the plan never fails in the pool), and at every compute step the
//! bytes `verify()` counts fit in the pool, which fits in the budget.
//! `verify()` is stricter at a swap-in step: a copy may run at any time
//! between its trigger and its use, so it counts the most bytes resident at
//! any compute position of that window, with buffers freed behind a copy-out
//! counted until the op that waits for the free. A final sweep therefore
//! delays a trigger (never past the op before the use, where the bound is
//! the pool's again) until the bytes that may be live at the swap-in fit the
//! budget ([`sweep`]).
//!
//! Choices where the paper is vague:
//! - Threshold: a candidate qualifies when its object is estimated free,
//!   plus, for room needed by a swap-in, that swap-in, by the time the op
//!   that needs the room starts (at the compute rate). The object is free
//!   once the swap-out is done; the d2h stream copies in order of last use,
//!   one at a time ([`super::copy_queue`]), so a swap-out starts after the
//!   victim's last use or once the copy-outs of earlier last uses are done,
//!   whichever is later. A candidate whose host copy is current needs no
//!   copy, but counts as free only once every copy-out placed so far is
//!   estimated done. When none qualifies, Belady's choice is made among all
//!   the candidates (the next use furthest away): the paper's rule without
//!   its threshold. Until 2026-11-30 the least recently used candidate was
//!   taken instead (its object frees soonest); on a copy-bound graph that
//!   is nearly every choice (NasNet-25 b64 at 16 GiB: 99% of them), so the
//!   planner evicted by LRU, bringing back tensors needed soon. With
//!   Belady's, the first generations of BRNN-4-8K and NasNet-25 went from
//!   23.26 to 21.91 s and from 28.60 to 27.79 s per iteration (Inception-4's
//!   from 9.88 to 10.13 s, the other two unchanged), and 60 s searches
//!   (`outcore compare ... --planners swapadvisor --seconds 60`, seeds 0 to
//!   2) BRNN-4-8K from 0.717 to 0.740-0.746 of ideal and NasNet-25 from
//!   0.190 to 0.191-0.192; RNN-8-8K, WResNet-152-10 and Inception-4 stay
//!   within their seeds' spread (RESULTS.md, "Belady's choice when no
//!   candidate is free in time"). Why a queue: counting
//!   only the victim's own copy, the threshold and the reclaim point below
//!   took copies that waited behind others as done (on WResNet-152-10 at
//!   16 GiB half of a plan's 4.3 s of stalls; a queue in the scan's order
//!   lifted the first generation's best from 0.766 to 0.797 of ideal,
//!   Inception-4's from 0.656 to 0.745). Why in the stream's order: see
//!   [`super::copy_queue`]. Why current host copies wait for the queue: an
//!   empirical choice, kept from the scan-order queue, where it was a side
//!   effect; counting them free at their last use changes which victims
//!   qualify while the link is busy, and BRNN-4-8K's 60 s search fell from
//!   0.708 to 0.567 of ideal (RESULTS.md).
//! - The reclaim point of room for a swap-in is the first op after the last
//!   use by which the swap-out should be done at the compute rate, behind
//!   the copy-outs of earlier last uses (never later than needed), so that the
//!   swap-in can start there. Room for an op's own output or workspace is
//!   reclaimed at that op: an earlier wait gains
//!   nothing and stalls compute whenever the d2h stream is behind the
//!   estimate (on WResNet-152-10 at 16 GiB, 4.6 s of the seed plan's 7.4 s
//!   of compute stalls passed while the d2h stream was busy, from its Chrome
//!   trace; with this rule one 60 s search went from 0.805 to 0.840 of ideal,
//!   one on Inception-4 from 0.718 to 0.729).
//! - Copy-outs go on the d2h stream earliest deadline first, not in order
//!   of last use: one due later is delayed behind one due first
//!   ([`super::d2h_order`]). The estimate above (the threshold, the reclaim
//!   points) still counts them in order of last use.
//! - Swap-ins go on the h2d stream earliest deadline first, not in the
//!   order of their triggers ([`super::h2d_order`]).
//! - A swap-out whose host copy is current costs nothing (the lowering frees
//!   on the compute stream); the reclaim wait is kept anyway, so the ordering
//!   holds even if the lowering disagrees about the copy.
//! - Pass two: persistent tensors ending pass one resident start resident, in
//!   order of first use while their classes have objects left (batch inputs
//!   take theirs first). A persistent tensor resident at the end of pass two
//!   but not at its start is swapped out after its last use; one resident at
//!   the start but not at the end starts on the host instead and is swapped in
//!   at the iteration start into the object it held.

use super::copy_queue::CopyQueue;
use super::d2h_order::{self, CopyOut};
use super::encoding::PoolModel;
use super::h2d_order::{self, SwapIn};
use crate::range_tree::RangeMax;
use outcore_graph::{Graph, OpId, TensorId};
use outcore_plan::{Gap, PreparedGraph, Residency, Restore, Schedule};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

const NONE: u32 = u32::MAX;

/// What the swap planner needs of a graph, computed once per search.
#[derive(Debug)]
pub struct Facts<'g> {
    pub graph: &'g Graph,
    pub prepared: PreparedGraph,
    /// Seconds of each op, by op id.
    pub op_time_s: Vec<f64>,
    /// Seconds to copy each tensor in and out.
    pub h2d_s: Vec<f64>,
    pub d2h_s: Vec<f64>,
    /// Storage owners, ascending.
    pub owners: Vec<TensorId>,
}

impl<'g> Facts<'g> {
    pub fn new(graph: &'g Graph, cost: &dyn outcore_cost::CostModel, op_time_s: &[f64]) -> Self {
        let prepared = PreparedGraph::new(graph);
        let h2d_s = graph
            .tensors
            .iter()
            .map(|t| cost.h2d_time_s(t.size_bytes))
            .collect();
        let d2h_s = graph
            .tensors
            .iter()
            .map(|t| cost.d2h_time_s(t.size_bytes))
            .collect();
        let owners = graph
            .tensors
            .iter()
            .filter(|t| t.allocates())
            .map(|t| t.id)
            .collect();
        Facts {
            graph,
            prepared,
            op_time_s: op_time_s.to_vec(),
            h2d_s,
            d2h_s,
            owners,
        }
    }
}

/// The op that the pool could not serve.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolShortfall {
    /// Position in the schedule.
    pub position: usize,
    /// Object size of the class that ran out.
    pub class_bytes: u64,
    pub message: String,
}

/// A swap plan: the schedule to lower, and what it took.
#[derive(Debug, Clone)]
pub struct SwapPlan {
    pub schedule: Schedule,
    /// Swap-outs that copy (the others free a tensor whose host copy is current).
    pub swap_outs: usize,
    pub swap_ins: usize,
    /// Persistent tensors resident at the iteration start.
    pub initial_resident: usize,
    /// Swap-in triggers the final sweep delayed for `verify()`'s bound.
    pub delayed_prefetches: usize,
    /// Swap-in triggers moved behind copies needed earlier (the h2d
    /// stream's earliest-deadline-first order).
    pub reordered_swap_ins: usize,
    /// Copy-outs delayed behind copies due earlier (the d2h stream's
    /// earliest-deadline-first order).
    pub delayed_swap_outs: usize,
}

/// The first pass alone, with every persistent tensor on the host at the
/// start (what the paper's Fig. 3 walks through), finished like
/// [`plan_swaps`]: whatever it ends with on the device is swapped out after
/// its last use.
pub fn plan_first_pass(
    facts: &Facts<'_>,
    order: &[OpId],
    pool: &PoolModel,
    budget_bytes: u64,
) -> Result<SwapPlan, PoolShortfall> {
    let setup = Setup::new(facts, order, pool)?;
    let first = Scan::run(&setup, &vec![false; facts.graph.tensors.len()])?;
    Ok(finish(&setup, first, budget_bytes))
}

/// Plans the swaps of `order` (a topological order of `facts.graph`) under
/// `pool` and `budget_bytes` (module doc).
pub fn plan_swaps(
    facts: &Facts<'_>,
    order: &[OpId],
    pool: &PoolModel,
    budget_bytes: u64,
) -> Result<SwapPlan, PoolShortfall> {
    let setup = Setup::new(facts, order, pool)?;
    let n_t = facts.graph.tensors.len();
    let first = Scan::run(&setup, &vec![false; n_t])?;
    let second = Scan::run(&setup, &first.resident_at_end)?;
    Ok(finish(&setup, second, budget_bytes))
}

/// Per-order and per-pool tables shared by both passes.
struct Setup<'a, 'g> {
    facts: &'a Facts<'g>,
    order: &'a [OpId],
    pool: &'a PoolModel,
    /// `prefix_s[p]`: compute time of positions `0..p`.
    prefix_s: Vec<f64>,
    /// Per tensor: its class (owners only).
    class: Vec<u32>,
    /// Per op: the class of its workspace (`NONE`: none).
    ws_class: Vec<u32>,
    /// Per storage owner: use positions, as compressed rows.
    use_start: Vec<u32>,
    use_items: Vec<u32>,
}

impl<'a, 'g> Setup<'a, 'g> {
    fn new(
        facts: &'a Facts<'g>,
        order: &'a [OpId],
        pool: &'a PoolModel,
    ) -> Result<Self, PoolShortfall> {
        let g = facts.graph;
        let pg = &facts.prepared;
        let n = order.len();
        let mut prefix_s = Vec::with_capacity(n + 1);
        let mut acc = 0.0;
        prefix_s.push(acc);
        for &op in order {
            acc += facts.op_time_s[op.index()].max(0.0);
            prefix_s.push(acc);
        }
        let too_large = |size: u64, position: usize| PoolShortfall {
            position,
            class_bytes: pool.class_bytes.last().copied().unwrap_or(0),
            message: format!(
                "a buffer of {} is larger than every class of the pool",
                outcore_plan::fmt_bytes(size)
            ),
        };
        let mut class = vec![NONE; g.tensors.len()];
        for &t in &facts.owners {
            let size = pg.size_bytes[t.index()];
            class[t.index()] = pool.class_of(size).ok_or_else(|| too_large(size, 0))? as u32;
        }
        let mut ws_class = vec![NONE; g.ops.len()];
        for (pos, &op) in order.iter().enumerate() {
            let ws = pg.workspace_bytes[op.index()];
            if ws > 0 {
                ws_class[op.index()] = pool.class_of(ws).ok_or_else(|| too_large(ws, pos))? as u32;
            }
        }
        let mut use_start = vec![0u32; g.tensors.len() + 1];
        for &op in order {
            for &o in pg.op_owners(op) {
                use_start[o.index() + 1] += 1;
            }
        }
        for i in 0..g.tensors.len() {
            use_start[i + 1] += use_start[i];
        }
        let mut fill = use_start.clone();
        let mut use_items = vec![0u32; use_start[g.tensors.len()] as usize];
        for (pos, &op) in order.iter().enumerate() {
            for &o in pg.op_owners(op) {
                use_items[fill[o.index()] as usize] = pos as u32;
                fill[o.index()] += 1;
            }
        }
        Ok(Setup {
            facts,
            order,
            pool,
            prefix_s,
            class,
            ws_class,
            use_start,
            use_items,
        })
    }

    fn n(&self) -> usize {
        self.order.len()
    }

    fn uses(&self, t: TensorId) -> &[u32] {
        &self.use_items[self.use_start[t.index()] as usize..self.use_start[t.index() + 1] as usize]
    }

    fn size(&self, t: TensorId) -> u64 {
        self.facts.prepared.size_bytes[t.index()]
    }
}

/// Per tensor state of a scan.
#[derive(Debug, Clone, Copy)]
struct TState {
    resident: bool,
    last_use: u32,
    /// Index into the tensor's uses of the next use not yet reached.
    cursor: u32,
    host_current: bool,
    /// Resident from the iteration start and not used yet (pass two).
    initial_unused: bool,
    /// Starts the iteration on the device.
    initial: bool,
    /// The gap (by index) the tensor is in, waiting for its swap-in.
    open_gap: u32,
    /// The buffer (by index) of its current residency.
    buf: u32,
    /// The buffer it held from the iteration start (`NONE`: none).
    init_buf: u32,
    /// Key in its class's victim set (`u64::MAX`: not in it).
    key: u64,
}

/// Per class state of a scan.
#[derive(Debug, Default)]
struct ClassState {
    /// Objects never used (free from the start).
    fresh: u64,
    /// Freed objects by the position from which they are free.
    recycled: BinaryHeap<Reverse<u32>>,
    /// Victim candidates by next use: `(key, tensor)`.
    victims: BTreeSet<(u64, u32)>,
}

/// One residency of one buffer, as positions `[start, end]` that `verify()`
/// may count it at (see the module doc).
#[derive(Debug, Clone, Copy)]
struct Buffer {
    size: u64,
    start: u32,
    end: u32,
    /// The gap whose swap-in allocates it (`NONE`: made by an op, or resident
    /// from the start).
    swap_in_gap: u32,
    /// Freed on the d2h stream behind its copy-out: `verify()` counts it
    /// beside a swap-in until the op that waits for the free has started,
    /// one position past `end` (see [`sweep`]).
    freed_by_copy: bool,
}

/// What a pass ends with.
struct Scanned {
    gaps: Vec<Gap>,
    buffers: Vec<Buffer>,
    state: Vec<TState>,
    resident_at_end: Vec<bool>,
    swap_outs: usize,
    /// The gaps (by index) whose swap-out copies (its host copy is stale).
    copy_outs: Vec<u32>,
}

/// One pass over the schedule.
struct Scan<'s, 'a, 'g> {
    s: &'s Setup<'a, 'g>,
    t: Vec<TState>,
    classes: Vec<ClassState>,
    gaps: Vec<Gap>,
    buffers: Vec<Buffer>,
    swap_outs: usize,
    /// The copy-outs placed so far, in the d2h stream's order (module doc).
    d2h: CopyQueue,
    /// The gaps (by index) whose swap-out copies.
    copy_outs: Vec<u32>,
}

impl<'s, 'a, 'g> Scan<'s, 'a, 'g> {
    /// Runs a pass with the persistent tensors of `initial` starting resident
    /// (as many as their classes hold, by first use).
    fn run(s: &'s Setup<'a, 'g>, initial: &[bool]) -> Result<Scanned, PoolShortfall> {
        let pg = &s.facts.prepared;
        let n_t = s.facts.graph.tensors.len();
        let mut scan = Scan {
            s,
            t: vec![
                TState {
                    resident: false,
                    last_use: NONE,
                    cursor: 0,
                    host_current: false,
                    initial_unused: false,
                    initial: false,
                    open_gap: NONE,
                    buf: NONE,
                    init_buf: NONE,
                    key: u64::MAX,
                };
                n_t
            ],
            classes: s
                .pool
                .count
                .iter()
                .map(|&c| ClassState {
                    fresh: c,
                    ..ClassState::default()
                })
                .collect(),
            d2h: CopyQueue::default(),
            copy_outs: Vec::new(),
            gaps: Vec::new(),
            buffers: Vec::new(),
            swap_outs: 0,
        };
        for &t in &s.facts.owners {
            let i = t.index();
            scan.t[i].host_current = pg.batch_input[i] || pg.persistent[i];
        }
        // Batch inputs arrive with the batch.
        for &t in &s.facts.owners {
            if pg.batch_input[t.index()] {
                scan.take_fresh(t, "an input of the batch")?;
            }
        }
        // Initial residents, by first use, while their classes have objects.
        let mut wanted: Vec<(u32, TensorId)> = s
            .facts
            .owners
            .iter()
            .filter(|t| initial[t.index()] && pg.persistent[t.index()])
            .filter_map(|&t| s.uses(t).first().map(|&u| (u, t)))
            .collect();
        wanted.sort_unstable();
        for (first, t) in wanted {
            let k = s.class[t.index()] as usize;
            if scan.classes[k].fresh == 0 {
                continue;
            }
            scan.classes[k].fresh -= 1;
            let st = &mut scan.t[t.index()];
            st.resident = true;
            st.initial = true;
            st.initial_unused = true;
            st.host_current = false;
            scan.new_buffer(t, 0, NONE);
            scan.t[t.index()].init_buf = scan.t[t.index()].buf;
            scan.set_victim(t, first as u64);
        }
        for q in 0..s.n() {
            scan.step(q)?;
        }
        let resident_at_end = scan.t.iter().map(|st| st.resident).collect();
        Ok(Scanned {
            gaps: scan.gaps,
            buffers: scan.buffers,
            state: scan.t,
            resident_at_end,
            swap_outs: scan.swap_outs,
            copy_outs: scan.copy_outs,
        })
    }

    fn take_fresh(&mut self, t: TensorId, what: &str) -> Result<(), PoolShortfall> {
        let k = self.s.class[t.index()] as usize;
        if self.classes[k].fresh == 0 {
            return Err(self.shortfall(0, k, what));
        }
        self.classes[k].fresh -= 1;
        self.t[t.index()].resident = true;
        self.new_buffer(t, 0, NONE);
        Ok(())
    }

    fn shortfall(&self, position: usize, class: usize, what: &str) -> PoolShortfall {
        let class_bytes = self.s.pool.class_bytes[class];
        let op = self.s.order.get(position).map_or_else(
            || "the iteration start".to_string(),
            |&op| format!("op `{}`", self.s.facts.graph.op(op).name),
        );
        PoolShortfall {
            position,
            class_bytes,
            message: format!(
                "{op} finds no object of the {} class ({} objects) for {what}: every one holds an operand of the op or nothing can leave in time",
                outcore_plan::fmt_bytes(class_bytes),
                self.s.pool.count[class]
            ),
        }
    }

    fn new_buffer(&mut self, t: TensorId, start: u32, swap_in_gap: u32) {
        self.t[t.index()].buf = self.buffers.len() as u32;
        self.buffers.push(Buffer {
            size: self.s.size(t),
            start,
            end: self.s.n().saturating_sub(1) as u32,
            swap_in_gap,
            freed_by_copy: false,
        });
    }

    fn set_victim(&mut self, t: TensorId, key: u64) {
        let k = self.s.class[t.index()] as usize;
        self.t[t.index()].key = key;
        self.classes[k].victims.insert((key, t.0));
    }

    fn clear_victim(&mut self, t: TensorId) {
        let key = self.t[t.index()].key;
        if key != u64::MAX {
            let k = self.s.class[t.index()] as usize;
            self.classes[k].victims.remove(&(key, t.0));
            self.t[t.index()].key = u64::MAX;
        }
    }

    /// One op: its operands resident, room for its outputs and workspace, then
    /// the bookkeeping of its uses.
    fn step(&mut self, q: usize) -> Result<(), PoolShortfall> {
        let s = self.s;
        let pg = &s.facts.prepared;
        let op = s.order[q];
        for &o in pg.op_owners(op) {
            if self.t[o.index()].resident {
                self.clear_victim(o);
            }
        }
        let allocated = pg.op_allocated(op);
        for &o in pg.op_owners(op) {
            if !self.t[o.index()].resident && !allocated.contains(&o) {
                self.swap_in(o, q)?;
            }
        }
        for &o in allocated {
            let k = s.class[o.index()] as usize;
            self.room(k, q, 0.0, q, "an output")?;
            self.t[o.index()].resident = true;
            self.new_buffer(o, q as u32, NONE);
        }
        let ws = s.ws_class[op.index()];
        if ws != NONE {
            self.room(ws as usize, q, 0.0, q, "its workspace")?;
            let size = pg.workspace_bytes[op.index()];
            self.buffers.push(Buffer {
                size,
                start: q as u32,
                end: q as u32,
                swap_in_gap: NONE,
                freed_by_copy: false,
            });
        }
        for &o in pg.op_owners(op) {
            self.after_use(o, q);
        }
        for &w in pg.op_written(op) {
            self.t[w.index()].host_current = false;
        }
        if ws != NONE {
            self.classes[ws as usize]
                .recycled
                .push(Reverse(q as u32 + 1));
        }
        Ok(())
    }

    /// Brings `x` back for its use at `q`: an object, then the trigger.
    fn swap_in(&mut self, x: TensorId, q: usize) -> Result<(), PoolShortfall> {
        let s = self.s;
        let k = s.class[x.index()] as usize;
        let gap = self.t[x.index()].open_gap;
        // Triggers must precede the use; an object free from the start also
        // serves a swap-in issued at the iteration start.
        let limit = q.saturating_sub(1);
        let free_since = self.room(k, limit, s.facts.h2d_s[x.index()], q, "a swap-in")?;
        let start = if gap == NONE {
            let prefetch = (free_since > 0).then_some(free_since);
            if prefetch.is_some_and(|p| p >= q) {
                return Err(self.shortfall(q, k, "a swap-in"));
            }
            self.gaps.push(Gap {
                tensor: x,
                after: None,
                before: Some(q),
                how: Restore::Swap,
                prefetch_after: prefetch,
                reclaim_before: None,
                copy_out_after: None,
            });
            free_since
        } else {
            let g = &mut self.gaps[gap as usize];
            let t = free_since.max(g.after.unwrap_or(0));
            g.prefetch_after = Some(t);
            t
        };
        let gap_index = if gap == NONE {
            self.gaps.len() - 1
        } else {
            gap as usize
        };
        let st = &mut self.t[x.index()];
        st.resident = true;
        st.open_gap = NONE;
        self.new_buffer(x, start as u32, gap_index as u32);
        Ok(())
    }

    /// An object of class `k` free by position `limit` (from the free list, or
    /// by evicting a victim), for a need at `q`; returns the position from
    /// which it is free.
    fn room(
        &mut self,
        k: usize,
        limit: usize,
        need_s: f64,
        q: usize,
        what: &str,
    ) -> Result<usize, PoolShortfall> {
        let c = &mut self.classes[k];
        if c.fresh > 0 {
            c.fresh -= 1;
            return Ok(0);
        }
        if let Some(&Reverse(f)) = c.recycled.peek()
            && f as usize <= limit
        {
            c.recycled.pop();
            return Ok(f as usize);
        }
        let Some(victim) = self.choose_victim(k, limit, need_s, q) else {
            return Err(self.shortfall(q, k, what));
        };
        // Room for a swap-in is reclaimed as early as the swap-out should be
        // done, so that the swap-in can start then; room for an op's own
        // buffer is needed only at the op itself.
        let for_swap_in = limit < q;
        Ok(self.evict(victim, limit, for_swap_in))
    }

    /// When the copy-out of a victim last used at position `a` (`out_s`
    /// long) is estimated done: it starts after that use or once the
    /// copy-outs of earlier last uses are done, whichever is later.
    fn copy_done_s(&self, a: usize, out_s: f64) -> f64 {
        self.d2h
            .finish_if_placed_s(a as u32, self.s.prefix_s[a + 1], out_s)
    }

    /// When the object of a victim last used at position `a` is estimated
    /// free (module doc): after its copy-out, or, when its host copy is
    /// current, once the d2h stream has done every copy-out placed so far.
    fn object_free_s(&self, t: TensorId, a: usize) -> f64 {
        if self.t[t.index()].host_current {
            self.s.prefix_s[a + 1].max(self.d2h.tail_s())
        } else {
            self.copy_done_s(a, self.s.facts.d2h_s[t.index()])
        }
    }

    /// Belady's choice within class `k` (module doc): the first candidate,
    /// furthest next use first, that is free in time; else the first last
    /// used before `limit`.
    fn choose_victim(&self, k: usize, limit: usize, need_s: f64, q: usize) -> Option<TensorId> {
        let s = self.s;
        let mut fallback: Option<TensorId> = None;
        for &(_, ti) in self.classes[k].victims.iter().rev() {
            let t = TensorId(ti);
            let st = &self.t[t.index()];
            if st.initial_unused {
                return Some(t);
            }
            let a = st.last_use as usize;
            if a + 1 > limit {
                continue;
            }
            if self.object_free_s(t, a) + need_s <= s.prefix_s[q] {
                return Some(t);
            }
            fallback.get_or_insert(t);
        }
        fallback
    }

    /// Takes `t` off the device; returns the position from which its object
    /// is free (never after `limit`): the first op by which the swap-out
    /// should be done at the compute rate when `early` (room for a swap-in),
    /// else `limit` itself.
    fn evict(&mut self, t: TensorId, limit: usize, early: bool) -> usize {
        self.clear_victim(t);
        let s = self.s;
        let n = s.n();
        let st = self.t[t.index()];
        self.t[t.index()].resident = false;
        if st.initial_unused {
            // Not resident at the start after all: it is swapped in before
            // its first use, and its object was never used.
            let tt = &mut self.t[t.index()];
            tt.initial_unused = false;
            tt.initial = false;
            tt.host_current = true;
            self.buffers[st.buf as usize].size = 0;
            return 0;
        }
        let a = st.last_use as usize;
        let uses = s.uses(t);
        let before = uses.get(st.cursor as usize).map(|&u| u as usize);
        let (reclaim, free_since) = if st.host_current {
            (a + 1, a + 1)
        } else {
            self.swap_outs += 1;
            // Its copy-out joins the d2h stream in order of last use; when
            // it is estimated done.
            let copied_s = self
                .d2h
                .place(a as u32, s.prefix_s[a + 1], s.facts.d2h_s[t.index()]);
            if early {
                // The first op by which the copy is done, at most `limit`.
                let lo = a + 1;
                let r = s.prefix_s[lo..=limit.min(n)].partition_point(|&p| p < copied_s) + lo;
                let r = r.min(limit);
                (r, r)
            } else {
                (limit, limit)
            }
        };
        self.t[t.index()].host_current = true;
        self.buffers[st.buf as usize].end = (free_since - 1) as u32;
        if !st.host_current {
            self.copy_outs.push(self.gaps.len() as u32);
            self.buffers[st.buf as usize].freed_by_copy = true;
        }
        self.gaps.push(Gap {
            tensor: t,
            after: Some(a),
            before,
            how: Restore::Swap,
            prefetch_after: None,
            reclaim_before: Some(reclaim),
            copy_out_after: None,
        });
        if before.is_some() {
            self.t[t.index()].open_gap = (self.gaps.len() - 1) as u32;
        }
        free_since
    }

    /// Bookkeeping after `o` is used at `q`.
    fn after_use(&mut self, o: TensorId, q: usize) {
        let s = self.s;
        let pg = &s.facts.prepared;
        let n = s.n();
        let uses = s.uses(o);
        let st = &mut self.t[o.index()];
        st.last_use = q as u32;
        st.initial_unused = false;
        while (st.cursor as usize) < uses.len() && uses[st.cursor as usize] as usize <= q {
            st.cursor += 1;
        }
        let next = uses.get(st.cursor as usize).copied();
        let i = o.index();
        if let Some(b) = next {
            self.set_victim(o, b as u64);
        } else if pg.persistent[i] {
            let first = uses.first().copied().unwrap_or(0) as u64;
            self.set_victim(o, n as u64 + first);
        } else if !pg.output_storage[i] {
            // Dead: freed right after this op.
            self.t[i].resident = false;
            let buf = self.t[i].buf as usize;
            self.buffers[buf].end = q as u32;
            let k = s.class[i] as usize;
            self.classes[k].recycled.push(Reverse(q as u32 + 1));
        }
    }
}

/// Pass two's end fixed up (module doc), the swap-in triggers swept against
/// `verify()`'s bound, and the schedule.
fn finish(s: &Setup<'_, '_>, mut scanned: Scanned, budget_bytes: u64) -> SwapPlan {
    let pg = &s.facts.prepared;
    for &t in &s.facts.owners {
        let i = t.index();
        if !pg.persistent[i] {
            continue;
        }
        let uses = s.uses(t);
        let (Some(&first), Some(&last)) = (uses.first(), uses.last()) else {
            continue;
        };
        let st = scanned.state[i];
        let resident = scanned.resident_at_end[i];
        if st.initial && !resident {
            // Starts on the host, swapped in at the start into its object.
            scanned.state[i].initial = false;
            scanned.gaps.push(Gap {
                tensor: t,
                after: None,
                before: Some(first as usize),
                how: Restore::Swap,
                prefetch_after: None,
                reclaim_before: None,
                copy_out_after: None,
            });
            if st.init_buf != NONE {
                scanned.buffers[st.init_buf as usize].swap_in_gap = (scanned.gaps.len() - 1) as u32;
            }
        } else if !st.initial && resident {
            if !st.host_current {
                scanned.copy_outs.push(scanned.gaps.len() as u32);
            }
            scanned.gaps.push(Gap {
                tensor: t,
                after: Some(last as usize),
                before: None,
                how: Restore::Swap,
                prefetch_after: None,
                reclaim_before: None,
                copy_out_after: None,
            });
        }
    }
    let delayed_swap_outs = order_swap_outs(s, &mut scanned);
    let reordered_swap_ins = order_swap_ins(s, &mut scanned);
    let delayed = sweep(s.n(), &mut scanned.buffers, &mut scanned.gaps, budget_bytes);
    let mut initial_residency: Vec<(TensorId, Residency)> = pg
        .persistent_ids
        .iter()
        .filter(|t| !scanned.state[t.index()].initial)
        .map(|&t| (t, Residency::Host))
        .collect();
    initial_residency.sort_by_key(|e| e.0);
    let swap_ins = scanned.gaps.iter().filter(|g| g.before.is_some()).count();
    let initial_resident = pg
        .persistent_ids
        .iter()
        .filter(|t| scanned.state[t.index()].initial)
        .count();
    SwapPlan {
        schedule: Schedule {
            order: s.order.to_vec(),
            gaps: scanned.gaps,
            initial_residency,
        },
        swap_outs: scanned.swap_outs,
        swap_ins,
        initial_resident,
        delayed_prefetches: delayed,
        reordered_swap_ins,
        delayed_swap_outs,
    }
}

/// Delays copy-outs so that the d2h stream copies earliest deadline first
/// ([`super::d2h_order`]); returns how many were delayed. Runs before the
/// swap-ins are ordered: their triggers only move later, so a delayed
/// copy-out stays at or before its own swap-in's trigger.
fn order_swap_outs(s: &Setup<'_, '_>, scanned: &mut Scanned) -> usize {
    let n = s.n();
    let (copies, gaps): (Vec<CopyOut>, Vec<u32>) = scanned
        .copy_outs
        .iter()
        .filter_map(|&gi| {
            let g = &scanned.gaps[gi as usize];
            // Every gap with a copy-out starts after a use.
            let after = g.after?;
            let due = g.reclaim_before.or(g.before).unwrap_or(n);
            // Before the reclaim point and the gap's end, and no later than
            // the swap-in's trigger (none given: not delayed at all).
            let trigger = match g.before {
                Some(_) => g.prefetch_after.unwrap_or(after),
                None => n,
            };
            let latest = due.saturating_sub(1).min(trigger).min(n.saturating_sub(1));
            let copy = CopyOut {
                after,
                due,
                latest,
                d2h_s: s.facts.d2h_s[g.tensor.index()],
            };
            Some((copy, gi))
        })
        .unzip();
    let sequence = d2h_order::edf_sequence(&copies, &s.prefix_s);
    let issue = d2h_order::realise(&copies, &sequence);
    let mut delayed = 0;
    for ((c, &gi), &at) in copies.iter().zip(&gaps).zip(&issue) {
        if at > c.after {
            scanned.gaps[gi as usize].copy_out_after = Some(at);
            delayed += 1;
        }
    }
    delayed
}

/// Moves swap-in triggers so that the h2d stream copies earliest deadline
/// first ([`super::h2d_order`]); returns how many moved.
fn order_swap_ins(s: &Setup<'_, '_>, scanned: &mut Scanned) -> usize {
    let (copies, gaps): (Vec<SwapIn>, Vec<usize>) = scanned
        .gaps
        .iter()
        .enumerate()
        .filter(|(_, g)| g.how == Restore::Swap)
        .filter_map(|(i, g)| {
            let before = g.before?;
            let copy = SwapIn {
                trigger: g.prefetch_after.or(g.after),
                before,
                h2d_s: s.facts.h2d_s[g.tensor.index()],
            };
            Some((copy, i))
        })
        .unzip();
    let sequence = h2d_order::edf_sequence(&copies, &s.prefix_s);
    let triggers = h2d_order::realise(&copies, &sequence);
    // Each swap-in's buffer starts at its trigger.
    let mut buffer_of = vec![NONE; scanned.gaps.len()];
    for (bi, b) in scanned.buffers.iter().enumerate() {
        if b.swap_in_gap != NONE {
            buffer_of[b.swap_in_gap as usize] = bi as u32;
        }
    }
    let mut moved = 0;
    for ((c, &gi), &t) in copies.iter().zip(&gaps).zip(&triggers) {
        if t == c.trigger {
            continue;
        }
        let Some(q) = t else { continue };
        scanned.gaps[gi].prefetch_after = Some(q);
        if let Some(b) = scanned.buffers.get_mut(buffer_of[gi] as usize) {
            b.start = b.start.max(q as u32);
        }
        moved += 1;
    }
    moved
}

/// Delays swap-in triggers until the bytes that may be live at each swap-in
/// fit the budget (module doc); returns how many were delayed.
///
/// `verify()` bounds a swap-in by the most bytes resident at any one compute
/// position of its window (from the op it is triggered after to the op
/// before its use), not by their sum over the window: the compute stream
/// frees as it goes. So the bound here is the maximum over the positions
/// `t..before` of the buffers live there, this swap-in's own included from
/// its trigger `t`; a buffer freed behind a copy-out counts one position
/// longer (to the op that waits for its free, which `verify()` counts
/// running). Swap-ins issued after this one and triggered inside its window
/// count as live there too, which `verify()` does not: the bound is above
/// `verify()`'s, never below. Before 2026-11-30 (afternoon) this sweep
/// added every buffer allocated in the window to the bytes live at the
/// trigger, the bound of an older `verify()`.
fn sweep(n: usize, buffers: &mut [Buffer], gaps: &mut [Gap], budget_bytes: u64) -> usize {
    if n == 0 {
        return 0;
    }
    // The bytes live at each position, summed from each buffer's start and
    // end in one pass and the tree built on them: one range add per buffer
    // into the tree took a quarter of an RNN-8-8K search.
    let mut delta = vec![0i128; n + 1];
    for b in buffers.iter() {
        if b.size == 0 || b.end < b.start {
            continue;
        }
        let end = (b.end as usize + usize::from(b.freed_by_copy)).min(n - 1);
        let start = b.start as usize;
        if start > end {
            continue;
        }
        delta[start] += b.size as i128;
        delta[end + 1] -= b.size as i128;
    }
    let at: Vec<i128> = delta[..n]
        .iter()
        .scan(0i128, |sum, d| {
            *sum += d;
            Some(*sum)
        })
        .collect();
    let mut live = RangeMax::new(&at);
    let mut swap_ins: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].swap_in_gap != NONE && buffers[i].size > 0)
        .collect();
    swap_ins.sort_by_key(|&i| (buffers[i].start, i));
    let budget = budget_bytes as i128;
    let mut delayed = 0;
    for bi in swap_ins {
        let b = buffers[bi];
        let g = b.swap_in_gap as usize;
        let Some(before) = gaps[g].before else {
            continue;
        };
        // The first trigger from which no position of the window holds
        // more than the budget: past the last position that does (every
        // window starting at or before it includes it), and not past the op
        // before the use.
        let t0 = b.start as usize;
        let t = if t0 + 1 >= before {
            t0
        } else {
            live.last_above(t0, before, budget)
                .map_or(t0, |p| (p + 1).min(before - 1))
        };
        if t > t0 {
            // Its buffer now starts at `t`.
            live.add(t0, t, -(b.size as i128));
            buffers[bi].start = t as u32;
            gaps[g].prefetch_after = Some(t);
            delayed += 1;
        }
    }
    delayed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(size: u64, start: u32, end: u32, swap_in_gap: u32) -> Buffer {
        Buffer {
            size,
            start,
            end,
            swap_in_gap,
            freed_by_copy: false,
        }
    }

    fn swap_in_gap(before: usize, trigger: usize) -> Gap {
        Gap {
            tensor: TensorId(0),
            after: None,
            before: Some(before),
            how: Restore::Swap,
            prefetch_after: Some(trigger),
            reclaim_before: None,
            copy_out_after: None,
        }
    }

    /// Budget 10, six positions. A (6 bytes) is live at 0..=1, B (6) from
    /// 2 on; X (4) is swapped in for position 5, triggered after 0. The
    /// most live at any position of X's window is 10 (A + X, then B + X), so
    /// X keeps its trigger. (Adding B, allocated inside the window, to the
    /// bytes live at the trigger, as the sweep did before, gave 16 and
    /// delayed X to 2.)
    #[test]
    fn a_buffer_freed_inside_the_window_does_not_count_beside_a_later_one() {
        let mut gaps = vec![swap_in_gap(5, 0)];
        let mut buffers = vec![
            buffer(6, 0, 1, NONE),
            buffer(6, 2, 5, NONE),
            buffer(4, 0, 5, 0),
        ];
        assert_eq!(sweep(6, &mut buffers, &mut gaps, 10), 0);
        assert_eq!(gaps[0].prefetch_after, Some(0));
        assert_eq!(buffers[2].start, 0);
    }

    /// The same, with A freed behind its copy-out: it counts one position
    /// longer, at 2 with B and X (16 > 10), so X's trigger moves to 3, the
    /// first from which its window holds at most 10; its buffer starts there.
    #[test]
    fn a_buffer_freed_behind_a_copy_counts_to_the_op_that_waits_for_it() {
        let mut gaps = vec![swap_in_gap(5, 0)];
        let mut a = buffer(6, 0, 1, NONE);
        a.freed_by_copy = true;
        let mut buffers = vec![a, buffer(6, 2, 5, NONE), buffer(4, 0, 5, 0)];
        assert_eq!(sweep(6, &mut buffers, &mut gaps, 10), 1);
        assert_eq!(gaps[0].prefetch_after, Some(3));
        assert_eq!(buffers[2].start, 3);
        // Never past the op before the use: with a budget of 9 nothing fits,
        // and the trigger stops at 4.
        let mut gaps = vec![swap_in_gap(5, 0)];
        let mut buffers = vec![a, buffer(6, 2, 5, NONE), buffer(4, 0, 5, 0)];
        assert_eq!(sweep(6, &mut buffers, &mut gaps, 9), 1);
        assert_eq!(gaps[0].prefetch_after, Some(4));
    }
}
