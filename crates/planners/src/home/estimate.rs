//! HOME's time-cost evaluator (paper 002, Sec. 3.4, Algorithm 2): one pass over
//! the `2n` stages of an iteration (here: the positions of the compute order)
//! that tracks device memory and the time of the compute and copy streams,
//! synchronises the oldest pending swap-out whenever memory exceeds the
//! capacity (lines 3-9), and charges each tensor the stall its swap-in causes
//! and the time its recomputation takes (lines 11-18).
//!
//! It is a separate, named estimator (ARCHITECTURE.md: "a faster approximation
//! must be a separate, named estimator, never the `Evaluator`"): it reads the
//! cost model's op and copy times but shares no code with the simulator.
//!
//! How Algorithm 2's vague steps are made concrete, and why:
//! - A *stage* is one op of the order (outcore's layers are ops), so the walk
//!   is O(ops + gaps) per policy, Algorithm 2's O(n).
//! - The input is a lowered policy: the gaps that
//!   [`crate::framework::materialise`] made from it (swap spans, recomputation
//!   chains), with prefetch triggers set. The walk *places* the
//!   synchronisations: line 8's `syncoverhead(x)` is a compute op waiting for
//!   the free of `x`'s swap-out, which is exactly a gap's `reclaim_before`, so
//!   [`Algorithm2::run`] writes `reclaim_before` into the gaps it syncs and the
//!   lowering keeps them. A swap-out nobody waits for saves no memory (nothing
//!   may reuse its bytes before its free is ordered), as in verify's proof.
//! - Memory per stage counts what verify's bound counts for a compute step:
//!   every storage owner from its production (graph inputs from the start) to
//!   its last use, persistent tensors throughout, the op's workspace, a
//!   recomputation's scratch (its producer's other outputs and workspace);
//!   minus the stretches a gap keeps a tensor off the device (recompute:
//!   strictly inside the gap; swap whose host copy is current: from the free
//!   after the last use to the prefetch trigger; swap with a copy-out: from the
//!   sync to the use that waits for the swap-in, the swapped-in copy counted
//!   from the trigger). A tensor brought back after its last use only to feed
//!   recomputations counts from its swap-in (or at its recomputation) to the
//!   recomputations that read it.
//! - A swap-in is charged as verify charges it: it may run alongside every
//!   op between its trigger and its use, so what those ops (and the
//!   recomputations among them) allocate counts together with what is
//!   resident at the trigger and the swap-ins queued before it. (Verify stops
//!   the window earlier when an op waits for a swap-in queued behind it; the
//!   walk does not know the later queue, so it stays conservative.) Without
//!   this term the walk called a tenth of random ResNet-50 policies feasible
//!   that verify rejects.
//! - Swap-in timing: each swap-in becomes due at the trigger the policy
//!   lowering planned (as late as the link allows, see
//!   `policy::prefetch_as_late_as_possible`), and starts at the first stage
//!   from then on where its window fits; one whose use is the next op starts
//!   anyway, after syncs to make room (lines 3-9 again). Without the deferral
//!   a saturated link pulls every prefetch into the forward pass and every
//!   swapped tensor is counted twice for the whole backward pass.
//! - Syncs: lines 3-9 sync the oldest pending swap-out while memory is short,
//!   stalling compute until it completes. Swap-outs that have already
//!   completed when a stage starts are synced there too, at no cost: their
//!   bytes are free, and the wait is what lets verify count them free.
//! - Time: compute runs ops (and recomputations before the op that needs them)
//!   back to back; swap-outs run on a device-to-host stream in the order they
//!   are issued, swap-ins on a host-to-device stream in trigger order, each at
//!   the one-way rate of [`CostModel::d2h_time_s`] / [`CostModel::h2d_time_s`].
//!   Unlike the simulator it ignores the slower duplex rate when both
//!   directions copy at once (the paper's model has no such term either).
//! - When no pending swap-out is left to sync and memory still exceeds the
//!   capacity, Algorithm 2 "returns error"; here the walk records how far over
//!   it is ([`Estimate::excess_bytes`]) and goes on, so that a search can rank
//!   infeasible policies by how close they come.

use crate::framework::Ctx;
use outcore_cost::CostModel;
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Algorithm 2's answer for one lowered policy.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Estimate {
    /// Estimated iteration time (every stream finished).
    pub time_s: f64,
    /// The most bytes resident at any stage, after the syncs.
    pub peak_bytes: u64,
    /// How far the worst stage stays over the capacity once nothing is left to
    /// sync (0: the policy fits).
    pub excess_bytes: u64,
    /// The first stage that stays over the capacity.
    pub over_at: Option<usize>,
    /// Compute time lost waiting for swap-outs to finish (line 8).
    pub sync_stall_s: f64,
    /// Compute time lost waiting for swap-ins (line 14).
    pub swap_stall_s: f64,
    /// Time spent recomputing (line 17).
    pub recompute_s: f64,
    /// Number of synchronised swap-outs.
    pub syncs: usize,
}

impl Estimate {
    pub fn fits(&self) -> bool {
        self.excess_bytes == 0
    }
}

/// The per-graph tables of Algorithm 2 (what HOME's profiler collects, Sec.
/// 3.2: sizes, kernel times, dependencies, transfer rates), for one context.
#[derive(Debug)]
pub struct Algorithm2<'c, 'g> {
    ctx: &'c Ctx<'g>,
    /// Bytes resident at each position with no gaps, as a difference array of
    /// length `n + 1` (storage owners over their base intervals, plus workspace).
    base_delta: Vec<i128>,
    /// `alloc_prefix[q]`: bytes allocated by the ops at positions `0..q`
    /// (their outputs and workspace) with no gaps.
    alloc_prefix: Vec<i128>,
    /// Per tensor: copy times, and the producer's time and scratch when recomputed.
    h2d_s: Vec<f64>,
    d2h_s: Vec<f64>,
    recompute_s: Vec<f64>,
    recompute_scratch_bytes: Vec<u64>,
    /// Per tensor: its last use, if any.
    last_use: Vec<Option<usize>>,
    /// Per tensor: the host holds a current copy from the start (the input batch).
    host_copy: Vec<bool>,
}

/// Reusable buffers of [`Algorithm2::run`], one per thread.
#[derive(Debug, Default)]
pub struct Scratch {
    delta: Vec<i128>,
    rank: Vec<u32>,
    copies_out: Vec<bool>,
    /// (position, key, gap): issued swap-outs, swap-ins waited for,
    /// recomputations, and prefetch triggers.
    starts: Vec<(u32, u64, u32)>,
    waits: Vec<(u32, u64, u32)>,
    recomputes: Vec<(u32, u64, u32)>,
    triggers: Vec<(u32, u64, u32)>,
    out_done_s: Vec<f64>,
    in_done_s: Vec<f64>,
    fifo: VecDeque<u32>,
    /// `recompute_prefix[q]`: bytes allocated by recomputations at `0..q`.
    recompute_prefix: Vec<i128>,
    /// Swap-ins due but not started, by (use, rank).
    pending: BinaryHeap<Reverse<(u64, u32)>>,
    /// The swap-ins chosen to start at the current stage.
    issued: Vec<u32>,
}

impl<'c, 'g> Algorithm2<'c, 'g> {
    /// Profiles the context under a cost model.
    pub fn new(ctx: &'c Ctx<'g>, cost: &dyn CostModel) -> Self {
        let g = ctx.graph;
        let n = ctx.n;
        let nt = g.tensors.len();
        let mut base_delta = vec![0i128; n + 1];
        let mut h2d_s = vec![0.0; nt];
        let mut d2h_s = vec![0.0; nt];
        let mut recompute_s = vec![0.0; nt];
        let mut recompute_scratch_bytes = vec![0u64; nt];
        let mut last_use = vec![None; nt];
        let mut host_copy = vec![false; nt];
        if n > 0 {
            for t in ctx.owners() {
                let (lo, hi) = ctx.base_interval(t);
                let size = ctx.size(t) as i128;
                base_delta[lo] += size;
                base_delta[hi + 1] -= size;
            }
        }
        let mut alloc_at = vec![0i128; n];
        for (pos, &op) in ctx.order.iter().enumerate() {
            let w = g.op(op).workspace_bytes as i128;
            base_delta[pos] += w;
            base_delta[pos + 1] -= w;
            alloc_at[pos] += w;
        }
        for t in ctx.owners() {
            if let Some(p) = g.tensor(t).producer {
                alloc_at[ctx.position(p)] += ctx.size(t) as i128;
            }
        }
        let mut alloc_prefix = Vec::with_capacity(n + 1);
        let mut acc = 0i128;
        alloc_prefix.push(acc);
        for a in alloc_at {
            acc += a;
            alloc_prefix.push(acc);
        }
        for t in &g.tensors {
            let i = t.id.index();
            if !t.allocates() {
                continue;
            }
            h2d_s[i] = cost.h2d_time_s(t.size_bytes);
            d2h_s[i] = cost.d2h_time_s(t.size_bytes);
            last_use[i] = ctx.uses[i].last().copied();
            host_copy[i] = t.producer.is_none() && !t.is_persistent();
            if let Some(p) = t.producer {
                recompute_s[i] = ctx.op_time_s[ctx.position(p)];
                let op = g.op(p);
                recompute_scratch_bytes[i] = op.workspace_bytes
                    + op.outputs
                        .iter()
                        .filter(|&&o| o != t.id && g.tensor(o).allocates())
                        .map(|&o| ctx.size(o))
                        .sum::<u64>();
            }
        }
        Algorithm2 {
            ctx,
            base_delta,
            alloc_prefix,
            h2d_s,
            d2h_s,
            recompute_s,
            recompute_scratch_bytes,
            last_use,
            host_copy,
        }
    }

    pub fn ctx(&self) -> &'c Ctx<'g> {
        self.ctx
    }

    /// Host-to-device seconds of a tensor.
    pub fn h2d_time_s(&self, t: TensorId) -> f64 {
        self.h2d_s.get(t.index()).copied().unwrap_or(0.0)
    }

    /// Runs Algorithm 2 on `gaps` under `capacity_bytes`: places the syncs
    /// (overwriting every swap gap's `reclaim_before`) and the swap-in
    /// triggers (each gap's `prefetch_after` on entry is the earliest it may
    /// start, see `policy::prefetch_as_late_as_possible`; the walk defers it
    /// while memory is short), and estimates the iteration. Gaps open at
    /// either end (persistent tensors) are left alone and not charged.
    pub fn run(&self, gaps: &mut [Gap], capacity_bytes: u64, s: &mut Scratch) -> Estimate {
        let n = self.ctx.n;
        let mut est = Estimate::default();
        if n == 0 {
            return est;
        }
        self.index(gaps, s);
        let capacity = capacity_bytes as i128;
        let mut w = Walk::default();
        let (mut iw, mut ir, mut is, mut it) = (0, 0, 0, 0);
        for q in 0..n {
            w.cur += s.delta[q];
            // Swap-outs already complete are synced at no cost: their bytes
            // are free, a wait makes that provable.
            while let Some(&gi) = s.fifo.front()
                && s.out_done_s[gi as usize] <= w.compute_s
            {
                s.fifo.pop_front();
                self.sync(q, gi, gaps, s, &mut w, &mut est);
            }
            // Lines 3-9: while memory exceeds the capacity, sync the oldest
            // pending swap-out.
            while w.cur > capacity && self.sync_front(q, gaps, s, &mut w, &mut est) {}
            while let Some(&(p, key, gi)) = s.triggers.get(it)
                && p as usize == q
            {
                s.pending.push(Reverse((key, gi)));
                it += 1;
            }
            let need = self.choose_swap_ins(q, capacity, gaps, s, &mut w, &mut est);
            if need > capacity {
                let over = u64::try_from(need - capacity).unwrap_or(u64::MAX);
                est.excess_bytes = est.excess_bytes.max(over);
                est.over_at.get_or_insert(q);
            }
            est.peak_bytes = est.peak_bytes.max(u64::try_from(need).unwrap_or(0));
            // Lines 11-18: the stage's swapped inputs must have arrived, its
            // recomputed inputs are rebuilt, then it runs.
            while let Some(&(p, _, gi)) = s.waits.get(iw)
                && p as usize == q
            {
                let done = s.in_done_s[gi as usize];
                if done > w.compute_s {
                    est.swap_stall_s += done - w.compute_s;
                    w.compute_s = done;
                }
                iw += 1;
            }
            let mut last_producer = None;
            while let Some(&(p, key, gi)) = s.recomputes.get(ir)
                && p as usize == q
            {
                // The lowering runs a producer once for all the outputs it
                // brings back at one position.
                let producer = key >> 32;
                if last_producer != Some(producer) {
                    let r = self.recompute_s[gaps[gi as usize].tensor.index()];
                    est.recompute_s += r;
                    w.compute_s += r;
                    last_producer = Some(producer);
                }
                ir += 1;
            }
            w.compute_s += self.ctx.op_time_s[q];
            let end_s = w.compute_s;
            while let Some(&(p, _, gi)) = s.starts.get(is)
                && p as usize == q
            {
                let gi_us = gi as usize;
                if s.copies_out[gi_us] {
                    let start = end_s.max(w.d2h_free_s);
                    w.d2h_free_s = start + self.d2h_s[gaps[gi_us].tensor.index()];
                    s.out_done_s[gi_us] = w.d2h_free_s;
                    s.fifo.push_back(gi);
                } else {
                    s.out_done_s[gi_us] = end_s;
                }
                is += 1;
            }
            for k in 0..s.issued.len() {
                let gi = s.issued[k] as usize;
                let g = &mut gaps[gi];
                g.prefetch_after = Some(q);
                let start = end_s.max(w.h2d_free_s).max(s.out_done_s[gi]);
                w.h2d_free_s = start + self.h2d_s[g.tensor.index()];
                s.in_done_s[gi] = w.h2d_free_s;
                // The copy is resident from here to its use (beyond the last
                // use: to the recomputations that read it).
                if let Some(b) = g.before {
                    let last = if self.beyond(g) { b } else { b - 1 };
                    if last > q {
                        let size = self.ctx.size(g.tensor) as i128;
                        s.delta[q + 1] += size;
                        s.delta[last + 1] -= size;
                    }
                }
            }
        }
        est.time_s = w.compute_s.max(w.d2h_free_s).max(w.h2d_free_s);
        est
    }

    /// Picks the pending swap-ins to start after the op at `q`, in order of
    /// use, into `s.issued`, and returns the stage's need. A swap-in starts
    /// when its window (module docs) fits; one whose use is next cannot wait
    /// and is made room for by syncs; the rest wait for a later stage.
    fn choose_swap_ins(
        &self,
        q: usize,
        capacity: i128,
        gaps: &mut [Gap],
        s: &mut Scratch,
        w: &mut Walk,
        est: &mut Estimate,
    ) -> i128 {
        s.issued.clear();
        let mut need = w.cur;
        let mut queued = 0i128;
        while let Some(&Reverse((key, gi))) = s.pending.peek() {
            let b = (key >> 32) as usize;
            let lo = q + 1;
            let hi = b.max(lo);
            let between = self.alloc_prefix[hi] - self.alloc_prefix[lo] + s.recompute_prefix[hi]
                - s.recompute_prefix[lo];
            let window = queued + self.ctx.size(gaps[gi as usize].tensor) as i128 + between;
            if w.cur + window > capacity {
                if b > q + 1 {
                    break;
                }
                while w.cur + window > capacity && self.sync_front(q, gaps, s, w, est) {}
            }
            s.pending.pop();
            s.issued.push(gi);
            queued += self.ctx.size(gaps[gi as usize].tensor) as i128;
            need = need.max(w.cur + window);
        }
        need.max(w.cur)
    }

    /// Syncs the oldest pending swap-out that still frees something at `q`;
    /// `false` when none is left.
    fn sync_front(
        &self,
        q: usize,
        gaps: &mut [Gap],
        s: &mut Scratch,
        w: &mut Walk,
        est: &mut Estimate,
    ) -> bool {
        while let Some(gi) = s.fifo.pop_front() {
            if gaps[gi as usize].before.is_some_and(|b| q < b) {
                self.sync(q, gi, gaps, s, w, est);
                return true;
            }
        }
        false
    }

    /// The op at `q` waits for swap-out `gi` (line 8): its original copy is
    /// gone from `q` to its use.
    fn sync(
        &self,
        q: usize,
        gi: u32,
        gaps: &mut [Gap],
        s: &mut Scratch,
        w: &mut Walk,
        est: &mut Estimate,
    ) {
        let g = &mut gaps[gi as usize];
        let Some(b) = g.before.filter(|&b| q < b) else {
            return;
        };
        g.reclaim_before = Some(q);
        let done = s.out_done_s[gi as usize];
        if done > w.compute_s {
            est.sync_stall_s += done - w.compute_s;
            w.compute_s = done;
        }
        let size = self.ctx.size(g.tensor) as i128;
        w.cur -= size;
        s.delta[b] += size;
        est.syncs += 1;
    }

    /// Whether a gap starts at or after its tensor's last use (the tensor
    /// comes back only to feed recomputations).
    fn beyond(&self, g: &Gap) -> bool {
        g.after
            .is_none_or(|a| self.last_use[g.tensor.index()].is_none_or(|l| a >= l))
    }

    /// Clears the syncs, fills the memory difference array with every gap's
    /// effect except syncs and swap-ins, and sorts the per-position events in
    /// the lowering's order (see `outcore_plan::lower_schedule`).
    fn index(&self, gaps: &mut [Gap], s: &mut Scratch) {
        let n = self.ctx.n;
        s.delta.clear();
        s.delta.extend_from_slice(&self.base_delta);
        s.rank.clear();
        s.rank.extend(0..gaps.len() as u32);
        s.rank.sort_unstable_by_key(|&i| {
            let g = &gaps[i as usize];
            (g.tensor, g.after.map_or(0, |a| a + 1), i)
        });
        s.copies_out.clear();
        s.copies_out.resize(gaps.len(), false);
        for v in [
            &mut s.starts,
            &mut s.waits,
            &mut s.recomputes,
            &mut s.triggers,
        ] {
            v.clear();
        }
        s.out_done_s.clear();
        s.out_done_s.resize(gaps.len(), 0.0);
        s.in_done_s.clear();
        s.in_done_s.resize(gaps.len(), 0.0);
        s.fifo.clear();
        s.pending.clear();
        let mut prev: Option<TensorId> = None;
        let mut copied = false;
        for rank in 0..s.rank.len() {
            let gi = s.rank[rank];
            let beyond = self.beyond(&gaps[gi as usize]);
            let g = &mut gaps[gi as usize];
            let t = g.tensor;
            if prev != Some(t) {
                prev = Some(t);
                copied = self.host_copy.get(t.index()).copied().unwrap_or(true);
            }
            if g.how == Restore::Swap {
                g.reclaim_before = None;
            }
            let (Some(a), Some(b)) = (g.after, g.before) else {
                continue;
            };
            if a >= b || b >= n {
                continue;
            }
            let size = self.ctx.size(t) as i128;
            let mut add = |lo: usize, hi: usize, bytes: i128| {
                if lo <= hi {
                    s.delta[lo] += bytes;
                    s.delta[hi + 1] -= bytes;
                }
            };
            let (a32, b32, r32) = (a as u32, b as u32, rank as u64);
            match g.how {
                Restore::Recompute => {
                    if beyond {
                        add(b, b, size);
                    } else {
                        add(a + 1, b - 1, -size);
                    }
                    add(b, b, self.recompute_scratch_bytes[t.index()] as i128);
                    let producer = self.ctx.graph.tensor(t).producer.map_or(0, |p| p.0);
                    s.recomputes
                        .push((b32, u64::from(producer) << 32 | r32, gi));
                }
                Restore::Swap => {
                    let p = g.prefetch_after.unwrap_or(a).clamp(a, b - 1);
                    s.copies_out[gi as usize] = !copied;
                    if copied {
                        // Freed on the compute stream right after the last use.
                        if !beyond {
                            add(a + 1, b - 1, -size);
                        }
                    } else if beyond {
                        // The original stays until a sync orders its free.
                        add(a + 1, b - 1, size);
                    }
                    copied = true;
                    s.starts.push((a32, r32, gi));
                    s.waits.push((b32, r32, gi));
                    s.triggers.push((p as u32, (b as u64) << 32 | r32, gi));
                }
            }
        }
        for v in [
            &mut s.starts,
            &mut s.waits,
            &mut s.recomputes,
            &mut s.triggers,
        ] {
            v.sort_unstable();
        }
        // Bytes the recomputations allocate, by position, as prefix sums.
        s.recompute_prefix.clear();
        s.recompute_prefix.resize(n + 1, 0);
        for &(b, _, gi) in &s.recomputes {
            let t = gaps[gi as usize].tensor;
            s.recompute_prefix[b as usize + 1] +=
                (self.ctx.size(t) + self.recompute_scratch_bytes[t.index()]) as i128;
        }
        for q in 0..n {
            s.recompute_prefix[q + 1] += s.recompute_prefix[q];
        }
    }
}

/// The walk's running state.
#[derive(Debug, Default)]
struct Walk {
    /// Bytes resident at the current stage (after its syncs).
    cur: i128,
    compute_s: f64,
    d2h_free_s: f64,
    h2d_free_s: f64,
}
