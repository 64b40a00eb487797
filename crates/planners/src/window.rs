//! `window`: the locally adaptive schedule-window swap scheduler of paper 003
//! (out-of-core training with a schedule-window and virtual addressing), Sec. 2-3
//! and Figure 2.
//!
//! The variable sequence is the storage owners each op touches, op by op. At op
//! `i` the window covers the variables from op `i`'s first one onwards while their
//! accumulated bytes stay within `W`. The window rule decides *which* gaps swap:
//! after op `i`, a swap-out is reserved for each variable it used unless the
//! variable appears again inside the window of op `i + 1` (then it stays) or never
//! again (then it is freed) (Fig. 2c); the swap-in is wanted once the window
//! reaches the next use (Fig. 2a). A sweep over the ops then decides *when*, with
//! an exact model of the plan's memory as `verify` counts it (a buffer counts
//! against a step unless its free happens-before the step or its allocation
//! after it):
//! - at a compute op: every buffer not yet freed on the compute stream, every
//!   swap-in triggered by an earlier op, and every swapped-out buffer whose free on
//!   the d2h stream no compute op up to here has (transitively) waited for;
//! - at a swap-in, issued on h2d after compute op `q`: what is live after op `q`
//!   (its frees come later on the compute stream), every allocation of the ops
//!   between `q` and the use (they may run before the copy), earlier swap-ins, and
//!   swapped-out buffers not freed before it on d2h (it waits for its own free, so
//!   every older swap-out's free, d2h being FIFO).
//!
//! Fig. 2b: when a compute op would exceed the budget, it waits for the oldest
//! reserved swap-outs (d2h order), just enough of them (`reclaim_before`). When a
//! wanted swap-in does not fit, the sweep either first waits for the oldest
//! swap-outs at the trigger op (the paper's "allocate enough memory by waiting for
//! swap-outs") or delays the prefetch to a later op (step b of the brief: delay
//! prefetches while memory is short); a swap-in is never delayed past the op
//! before its use. Fig. 2d: a swap-out whose host copy is current costs nothing
//! (the lowering skips the copy), and a reserved swap-out that nobody waited for
//! by the time its swap-in is wanted is cancelled (the tensor simply stays).
//!
//! Choices where the paper is vague:
//! - `W` and the policy (reclaim first or delay first) are chosen per graph and
//!   budget by a small deterministic search: `W` = 0 and budget / 256 .. 16 x budget in
//!   steps of sqrt(2), both policies; every candidate that the model says fits is
//!   lowered, verified and simulated, and the fastest wins (the first on ties).
//!   `W`, the policy and the counts are recorded in `settings`. Candidates are
//!   scored in parallel; the search stops at the request's time limit.
//! - A window always covers at least the op's own variables.
//! - Persistent tensors (weights, optimizer state) are variables too; the window
//!   wraps into the next iteration, so one used again soon after the iteration
//!   boundary stays resident, and the others start the iteration on the host
//!   (initial residency Host, a gap from the start and one to the end), as
//!   TENSILE does across iterations.
//! - The model is exact except where it is conservative: a swap-in is assumed to
//!   be unordered with every op before its own use (a later swap-in needed earlier
//!   would order it sooner), and waits reached only through chains of frees on
//!   the compute stream are not credited.
//! - Should verify still reject a plan (a model gap), the same candidate is
//!   re-planned against tighter internal budgets (recorded as `planning_margin`).
//! - No recomputation (the paper swaps only).

use crate::framework::{Ctx, Pick, Search, Shortfall};
use crate::range_tree::{PrefixSums, RangeMax};
use outcore_graph::TensorId;
use outcore_plan::{Gap, PlanOutcome, PlanRequest, Planner, PlannerError, Restore, fmt_bytes};

/// The schedule-window swap scheduler.
#[derive(Debug, Default)]
pub struct Window;

/// What the sweep does when a wanted swap-in does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Wait for the oldest swap-outs at the trigger op first, delay if that is not enough.
    ReclaimFirst,
    /// Delay the prefetch; wait for swap-outs only when the use is next.
    DelayFirst,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::ReclaimFirst => "reclaim-first",
            Policy::DelayFirst => "delay-first",
        }
    }
}

impl Planner for Window {
    fn name(&self) -> &'static str {
        "window"
    }

    fn description(&self) -> &'static str {
        "schedule-window swapping: prefetch within a byte window, swap out after last use in it, wait for the oldest swap-outs only under pressure (paper 003 Sec. 3)"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let forms: Vec<(u64, Policy)> = candidate_windows(request.budget_bytes)
            .into_iter()
            .flat_map(|w| [(w, Policy::ReclaimFirst), (w, Policy::DelayFirst)])
            .collect();
        search.best(
            "after swapping within every window tried",
            &forms,
            Pick::Fastest,
            |&(window_bytes, policy), scratch| {
                let rule = window_rule(&ctx, window_bytes);
                search.with_margins(scratch, |budget_bytes, margin| match schedule(
                    &ctx,
                    &rule,
                    budget_bytes,
                    policy,
                ) {
                    Ok(sched) => {
                        let settings = serde_json::json!({
                            "window_bytes": window_bytes,
                            "policy": policy.name(),
                            "planning_margin": margin,
                            "swap_gaps": sched.gaps.len(),
                            "cancelled_swap_outs": sched.cancelled,
                            "delayed_prefetches": sched.delayed,
                            "reclaim_waits": sched.gaps.iter().filter(|g| g.reclaim_before.is_some()).count(),
                        });
                        (settings, Ok(sched.gaps))
                    }
                    Err(shortfall) => (serde_json::Value::Null, Err(shortfall)),
                })
            },
        )
    }
}

/// The window sizes tried: 0 (prefetch just in time) and fractions of the budget
/// from 1/256 to 16 in steps of sqrt(2) (large windows hide more copy time but
/// prefetch earlier; the sweep delays what does not fit).
pub(crate) fn candidate_windows(budget_bytes: u64) -> Vec<u64> {
    let mut out = vec![0];
    for half_steps in (-8..=16).rev() {
        let fraction = 0.5f64.powf(half_steps as f64 / 2.0);
        out.push((budget_bytes as f64 * fraction) as u64);
    }
    out.dedup();
    out
}

/// The window rule (Fig. 2a, 2c): the gaps a window of `window_bytes` swaps, each
/// with the prefetch trigger the window wants (`prefetch_after`: the op before the
/// first op whose window reaches the next use) and no reclaim yet.
pub(crate) fn window_rule(ctx: &Ctx<'_>, window_bytes: u64) -> Vec<Gap> {
    let n = ctx.n;
    if n == 0 {
        return Vec::new();
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
    if len == 0 {
        return Vec::new();
    }
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
        let mut hi = j / len * n + n; // the op owning j covers it
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
                prefetch_after: Some(k.saturating_sub(1).clamp(a, b - 1)),
                reclaim_before: None,
                copy_out_after: None,
            });
        }
        if ctx.persistent(t) {
            let (first, last) = (uses[0], uses[uses.len() - 1]);
            let j = occurrence(t, first) + len;
            if j <= right_at(last + 1) {
                continue;
            }
            let k = first_covering(j, last + 1);
            if k <= n || first == 0 {
                continue; // needed from the iteration start: keep it resident
            }
            gaps.push(Gap {
                tensor: t,
                after: Some(last),
                before: None,
                how: Restore::Swap,
                prefetch_after: None,
                reclaim_before: None,
                copy_out_after: None,
            });
            gaps.push(Gap {
                tensor: t,
                after: None,
                before: Some(first),
                how: Restore::Swap,
                prefetch_after: Some((k - n - 1).min(first - 1)),
                reclaim_before: None,
                copy_out_after: None,
            });
        }
    }
    gaps
}

/// The scheduled gaps and what the sweep did.
#[derive(Debug)]
pub(crate) struct Scheduled {
    pub gaps: Vec<Gap>,
    /// Swap-outs dropped because nobody waited for them before their swap-in.
    pub cancelled: usize,
    /// Prefetches issued later than the window wanted.
    pub delayed: usize,
}

/// Per-gap state of the sweep.
#[derive(Debug, Clone, Default)]
struct State {
    /// Index in the d2h queue when the swap-out is a real copy.
    d2h: Option<usize>,
    /// The buffer before the gap still counts at compute ops.
    old_counted: bool,
    /// The swap-in was issued (with `prefetch_after` set).
    issued: bool,
    cancelled: bool,
    /// The host copy was current before this gap's swap-out (restored on cancel).
    host_current_before: bool,
    /// d2h entries `[0, frontier)` are freed before this gap's swap-in.
    frontier: usize,
}

/// The sweep's model of the plan being built (module doc).
struct Sweep<'a, 'g> {
    ctx: &'a Ctx<'g>,
    budget: i128,
    gaps: Vec<Gap>,
    state: Vec<State>,
    /// Bytes that count at the next compute op (before its own allocations).
    cur: i128,
    host_current: Vec<bool>,
    /// Real swap-outs (gap indices) in d2h order.
    d2h: Vec<usize>,
    /// d2h entries below `cf` are freed before the current compute op.
    cf: usize,
    /// d2h entries below `hf` are freed before the latest swap-in.
    hf: usize,
    /// Per compute op: a lower bound on what counts there plus what the sweep
    /// committed above it (early prefetches, cancelled swap-outs).
    ahead: RangeMax,
    /// Per d2h entry: the bytes of its old buffer while it still counts.
    counted: PrefixSums,
}

impl Sweep<'_, '_> {
    fn size(&self, t: TensorId) -> i128 {
        self.ctx.size(t) as i128
    }

    /// Whether `bytes` more fit at every compute op in `lo..hi` assuming the
    /// oldest swap-outs can be waited for there.
    fn fits_ahead(&self, lo: usize, hi: usize, bytes: i128) -> bool {
        self.ahead
            .max(lo, hi.min(self.ctx.n))
            .is_none_or(|m| m + bytes <= self.budget)
    }

    fn commit_ahead(&mut self, lo: usize, hi: usize, bytes: i128) {
        self.ahead.add(lo, hi.min(self.ctx.n), bytes);
    }

    /// The old buffer of gap `gi` (d2h entry `k`) stops counting.
    fn uncount(&mut self, gi: usize, k: usize) {
        self.state[gi].old_counted = false;
        let s = self.size(self.gaps[gi].tensor);
        self.counted.add(k, -s);
    }

    /// d2h entries below `upto` become freed before compute op `p`; with `wait`,
    /// op `p` waits for them (`reclaim_before`), which needs them issued before
    /// op `p`. Returns the bytes that stopped counting.
    fn cover(&mut self, p: usize, upto: usize, wait: bool) -> i128 {
        let mut freed = 0i128;
        while self.cf < upto.min(self.d2h.len()) {
            let gi = self.d2h[self.cf];
            if wait && self.gaps[gi].after.is_none_or(|a| a >= p) {
                break;
            }
            if !self.state[gi].cancelled {
                if wait {
                    self.gaps[gi].reclaim_before = Some(p);
                }
                if self.state[gi].old_counted {
                    self.uncount(gi, self.cf);
                    let s = self.size(self.gaps[gi].tensor);
                    self.cur -= s;
                    freed += s;
                }
            }
            self.cf += 1;
        }
        freed
    }

    /// Counted bytes of old buffers in d2h entries `[cf, upto)`.
    fn counted_between(&self, upto: usize) -> i128 {
        // A cancelled gap's old buffer stopped counting when it was cancelled.
        let upto = upto.min(self.d2h.len());
        if upto <= self.cf {
            return 0;
        }
        self.counted.prefix(upto) - self.counted.prefix(self.cf)
    }

    /// Whether the oldest swap-out not yet freed before compute could be waited
    /// for at compute op `p`.
    fn can_wait_at(&self, p: usize) -> bool {
        self.d2h
            .get(self.cf)
            .is_some_and(|&gi| self.gaps[gi].after.is_some_and(|a| a < p))
    }
}

/// Gaps whose swap-in is not issued yet: parked by prefetch trigger until the
/// sweep reaches it, then due in order of need (next use, then tensor). Keeps
/// each op's work proportional to what becomes due there, not to every gap
/// still waiting.
struct Waiting {
    by_trigger: Vec<Vec<usize>>,
    due: std::collections::BTreeSet<(Option<usize>, TensorId, usize)>,
    /// Gaps without a trigger: never due (reported as never issued).
    never: Vec<usize>,
    /// Triggers below this were released already.
    released_below: usize,
}

impl Waiting {
    fn new(n: usize) -> Self {
        Waiting {
            by_trigger: vec![Vec::new(); n],
            due: Default::default(),
            never: Vec::new(),
            released_below: 0,
        }
    }

    fn key(gaps: &[Gap], gi: usize) -> (Option<usize>, TensorId, usize) {
        (gaps[gi].before, gaps[gi].tensor, gi)
    }

    fn add(&mut self, gaps: &[Gap], gi: usize) {
        match gaps[gi].prefetch_after {
            Some(q) if q >= self.released_below && q < self.by_trigger.len() => {
                self.by_trigger[q].push(gi)
            }
            Some(_) => {
                self.due.insert(Self::key(gaps, gi));
            }
            None => self.never.push(gi),
        }
    }

    /// Everything triggered at or before op `p` is due (triggers before `p` were
    /// released at their own op, or added since with a trigger already passed).
    fn release(&mut self, gaps: &[Gap], p: usize) {
        for gi in std::mem::take(&mut self.by_trigger[p]) {
            self.due.insert(Self::key(gaps, gi));
        }
        self.released_below = p + 1;
    }

    fn first_due(&self) -> Option<usize> {
        self.due.first().map(|k| k.2)
    }

    fn done(&mut self, gaps: &[Gap], gi: usize) {
        self.due.remove(&Self::key(gaps, gi));
    }

    fn any_left(&self) -> Option<usize> {
        self.due
            .first()
            .map(|k| k.2)
            .or_else(|| self.never.first().copied())
            .or_else(|| self.by_trigger.iter().flatten().next().copied())
    }
}

/// The sweep: decides prefetch triggers and reclaim waits for the window rule's
/// gaps with the exact memory model (module doc), so that every compute op and
/// every swap-in stays within `budget_bytes`.
pub(crate) fn schedule(
    ctx: &Ctx<'_>,
    rule: &[Gap],
    budget_bytes: u64,
    policy: Policy,
) -> Result<Scheduled, Shortfall> {
    let mut gaps: Vec<Gap> = rule.to_vec();
    // Lowering order: by tensor, then start.
    gaps.sort_by_key(|g| (g.tensor, g.after.map_or(0, |a| a + 1)));
    let allocs = OpAllocs::new(ctx);
    let start = IterationStart::new(ctx, &gaps);
    let (index, mut waiting) = GapIndex::new(ctx.n, &gaps)?;
    let min_live = min_live_bytes(ctx, &gaps, &allocs.work_bytes);
    let n_gaps = gaps.len();
    let mut sw = Sweep {
        ctx,
        budget: budget_bytes as i128,
        gaps,
        state: vec![State::default(); n_gaps],
        cur: start.cur,
        host_current: start.host_current,
        d2h: Vec::new(),
        cf: 0,
        hf: 0,
        ahead: RangeMax::new(&min_live),
        counted: PrefixSums::new(n_gaps),
    };
    let mut tally = Tally::default();
    for p in 0..ctx.n {
        sw.compute(p, &index.ends[p], &allocs)?;
        let snap = sw.start_gaps(&index.starts[p], &start.final_free[p], &mut waiting);
        waiting.release(&sw.gaps, p);
        sw.issue_swap_ins(p, snap, &mut waiting, &allocs, policy, &mut tally)?;
    }
    if let Some(gi) = waiting.any_left() {
        return Err(bad_rule(format!(
            "the swap-in of {} was never issued",
            sw.gaps[gi].tensor
        )));
    }
    let mut out = Vec::with_capacity(sw.gaps.len());
    for (g, s) in sw.gaps.into_iter().zip(&sw.state) {
        if !s.cancelled {
            out.push(g);
        }
    }
    Ok(Scheduled {
        gaps: out,
        cancelled: tally.cancelled,
        delayed: tally.delayed,
    })
}

/// What the sweep counts as it goes ([`Scheduled`]'s counts).
#[derive(Debug, Default)]
struct Tally {
    cancelled: usize,
    delayed: usize,
}

/// What each compute op allocates and writes, by position.
struct OpAllocs {
    /// Its outputs that own storage.
    out_bytes: Vec<i128>,
    /// Its workspace.
    work_bytes: Vec<i128>,
    /// The storages it updates in place (their host copies go stale).
    written: Vec<Vec<TensorId>>,
    /// `prefix[p]`: the allocations of ops `0..p`.
    prefix: Vec<i128>,
}

impl OpAllocs {
    fn new(ctx: &Ctx<'_>) -> Self {
        let graph = ctx.graph;
        let n = ctx.n;
        let mut out_bytes = vec![0i128; n];
        let mut work_bytes = vec![0i128; n];
        let mut written: Vec<Vec<TensorId>> = vec![Vec::new(); n];
        for (p, op) in ctx.order.iter().map(|&id| graph.op(id)).enumerate() {
            work_bytes[p] = op.workspace_bytes as i128;
            for &o in &op.outputs {
                let t = graph.tensor(o);
                if t.allocates() {
                    out_bytes[p] += t.size_bytes as i128;
                }
                if let Some(target) = t.inplace_update_of {
                    written[p].push(graph.storage_owner(target));
                }
            }
        }
        let mut prefix = vec![0i128; n + 1];
        for p in 0..n {
            prefix[p + 1] = prefix[p] + out_bytes[p] + work_bytes[p];
        }
        OpAllocs {
            out_bytes,
            work_bytes,
            written,
            prefix,
        }
    }

    /// Allocations of ops `lo..hi` (exclusive).
    fn between(&self, lo: usize, hi: usize) -> i128 {
        let hi = hi.min(self.out_bytes.len());
        if hi <= lo {
            0
        } else {
            self.prefix[hi] - self.prefix[lo]
        }
    }
}

/// The device when the iteration starts, and the frees the ops end with.
struct IterationStart {
    /// Bytes resident: batch inputs and the persistent tensors that do not
    /// start on the host.
    cur: i128,
    /// Which storages have a current host copy (batch inputs, and what
    /// starts on the host).
    host_current: Vec<bool>,
    /// Per op, the storages whose last use it is (freed after it), but for
    /// persistent tensors and the graph's outputs, which stay.
    final_free: Vec<Vec<TensorId>>,
}

impl IterationStart {
    fn new(ctx: &Ctx<'_>, gaps: &[Gap]) -> Self {
        let graph = ctx.graph;
        let output_storage = graph.output_storage();
        let mut starts_host = vec![false; graph.tensors.len()];
        for g in gaps {
            if g.after.is_none() {
                starts_host[g.tensor.index()] = true;
            }
        }
        let mut cur: i128 = 0;
        let mut host_current = vec![false; graph.tensors.len()];
        let mut final_free: Vec<Vec<TensorId>> = vec![Vec::new(); ctx.n];
        for t in graph.tensors.iter().filter(|t| t.allocates()) {
            let persistent = t.is_persistent();
            let batch_input = t.producer.is_none() && !persistent;
            host_current[t.id.index()] = batch_input || starts_host[t.id.index()];
            if batch_input || (persistent && !starts_host[t.id.index()]) {
                cur += t.size_bytes as i128;
            }
            if !persistent
                && !output_storage[t.id.index()]
                && let Some(&last) = ctx.uses[t.id.index()].last()
            {
                final_free[last].push(t.id);
            }
        }
        IterationStart {
            cur,
            host_current,
            final_free,
        }
    }
}

/// The rule's gaps by the op each starts after and the op each ends before.
struct GapIndex {
    starts: Vec<Vec<usize>>,
    ends: Vec<Vec<usize>>,
}

impl GapIndex {
    /// The index, and the gaps from the iteration's start waiting for their
    /// swap-ins; an error for a rule the sweep cannot schedule (a gap that
    /// is not a swap, or out of range).
    fn new(n: usize, gaps: &[Gap]) -> Result<(GapIndex, Waiting), Shortfall> {
        let mut starts: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut ends: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut waiting = Waiting::new(n);
        for (gi, g) in gaps.iter().enumerate() {
            if g.how != Restore::Swap {
                return Err(bad_rule(format!("gap on {} is not a swap", g.tensor)));
            }
            match g.after {
                Some(a) if a < n => starts[a].push(gi),
                Some(_) => {
                    return Err(bad_rule(format!("gap on {} starts out of range", g.tensor)));
                }
                None => waiting.add(gaps, gi),
            }
            if let Some(b) = g.before {
                if b >= n || g.after.is_some_and(|a| a >= b) || g.prefetch_after.is_none() {
                    return Err(bad_rule(format!("gap on {} ends out of range", g.tensor)));
                }
                ends[b].push(gi);
            }
        }
        Ok((GapIndex { starts, ends }, waiting))
    }
}

/// A lower bound on what counts at each op: every storage over its base
/// interval, less every swap gap's tensor from the op after the gap's start
/// to the op before its end, plus the op's workspace.
fn min_live_bytes(ctx: &Ctx<'_>, gaps: &[Gap], work_bytes: &[i128]) -> Vec<i128> {
    let n = ctx.n;
    let mut min_delta = vec![0i128; n + 1];
    for t in ctx.owners() {
        let (lo, hi) = ctx.base_interval(t);
        min_delta[lo] += ctx.size(t) as i128;
        min_delta[hi + 1] -= ctx.size(t) as i128;
    }
    for g in gaps {
        let lo = g.after.map_or(0, |a| a + 1);
        let hi = g.before.unwrap_or(n); // exclusive
        if lo < hi {
            min_delta[lo] -= ctx.size(g.tensor) as i128;
            min_delta[hi] += ctx.size(g.tensor) as i128;
        }
    }
    let mut min_live = vec![0i128; n];
    let mut acc = 0i128;
    for p in 0..n {
        acc += min_delta[p];
        min_live[p] = acc + work_bytes[p];
    }
    min_live
}

impl Sweep<'_, '_> {
    /// The planning budget, for messages.
    fn budget_bytes(&self) -> u64 {
        u64::try_from(self.budget).unwrap_or(0)
    }

    /// Compute op `p`: the frees of the swap-ins of the gaps that end before
    /// it (`ending`) are ordered before it; where it would not fit, it waits
    /// for the oldest swap-outs (Fig. 2b); then its outputs are allocated
    /// and what it updates in place loses its host copy.
    fn compute(&mut self, p: usize, ending: &[usize], allocs: &OpAllocs) -> Result<(), Shortfall> {
        for &gi in ending {
            if self.state[gi].issued {
                let upto = self.state[gi].frontier;
                self.cover(p, upto, false);
            }
        }
        let mut need = self.cur + allocs.out_bytes[p] + allocs.work_bytes[p];
        while need > self.budget {
            if !self.can_wait_at(p) {
                let name = &self.ctx.op_at(p).name;
                let needed_bytes = u64::try_from(need).unwrap_or(u64::MAX);
                return Err(Shortfall {
                    needed_bytes: Some(needed_bytes),
                    at: Some(format!("op `{name}`")),
                    message: format!(
                        "op `{name}` needs {} with every earlier swap-out waited for, over the planning budget of {}",
                        fmt_bytes(needed_bytes),
                        fmt_bytes(self.budget_bytes())
                    ),
                });
            }
            let upto = self.cf + 1;
            need -= self.cover(p, upto, true);
        }
        self.cur += allocs.out_bytes[p];
        for &t in &allocs.written[p] {
            self.host_current[t.index()] = false;
        }
        Ok(())
    }

    /// After a compute op: the storages it used last are freed (`final_free`)
    /// and the gaps that start there (`starting`) swap out (a free on the
    /// compute stream where the host copy is current, else a copy queued on
    /// d2h); those that end before a later op wait for their swap-ins. Returns what a swap-in triggered
    /// after the op finds: nothing freed after it yet.
    fn start_gaps(
        &mut self,
        starting: &[usize],
        final_free: &[TensorId],
        waiting: &mut Waiting,
    ) -> i128 {
        let snap = self.cur;
        for &t in final_free {
            self.cur -= self.size(t);
        }
        for &gi in starting {
            let t = self.gaps[gi].tensor;
            self.state[gi].host_current_before = self.host_current[t.index()];
            if self.host_current[t.index()] {
                self.cur -= self.size(t); // a free on the compute stream
            } else {
                let k = self.d2h.len();
                self.state[gi].d2h = Some(k);
                self.state[gi].old_counted = true;
                let s = self.size(t);
                self.counted.add(k, s);
                self.d2h.push(gi);
                self.host_current[t.index()] = true;
            }
            if self.gaps[gi].before.is_some() {
                waiting.add(&self.gaps, gi);
            }
        }
        snap
    }

    /// The swap-ins the window wants by op `p`, in order of need (h2d is
    /// FIFO): each whose swap-out nobody waited for is cancelled instead
    /// ([`Sweep::cancel_swap_out`]); the others are issued after op `p`
    /// while they fit (with the reclaim-first policy, after waiting at op
    /// `p` for the oldest swap-outs), and the first that does not fit, with
    /// every later one, waits for a later op (step b), unless its use is
    /// the next op: then it is issued anyway, or, where even every
    /// swap-out waited for leaves too little, the sweep fails. `snap` is
    /// what a swap-in issued after op `p` finds ([`Sweep::start_gaps`]).
    fn issue_swap_ins(
        &mut self,
        p: usize,
        mut snap: i128,
        waiting: &mut Waiting,
        allocs: &OpAllocs,
        policy: Policy,
        tally: &mut Tally,
    ) -> Result<(), Shortfall> {
        let n = self.ctx.n;
        let mut same_trigger = 0i128;
        while let Some(gi) = waiting.first_due() {
            let g = self.gaps[gi].clone();
            let b = g.before.unwrap_or(n);
            let bytes = self.size(g.tensor);
            let forced = b <= p + 1;
            let want = g.prefetch_after.unwrap_or(p);
            if self.cancel_swap_out(p, gi, b, bytes) {
                tally.cancelled += 1;
                waiting.done(&self.gaps, gi);
                continue;
            }
            // Its own free (compute stream) is ordered before it.
            let own_free = if g.after == Some(p) && self.state[gi].d2h.is_none() {
                bytes
            } else {
                0
            };
            let frontier = self
                .hf
                .max(self.cf)
                .max(self.state[gi].d2h.map_or(0, |k| k + 1));
            let swap_in_bytes = |sw: &Sweep<'_, '_>, snap: i128| {
                snap - sw.counted_between(frontier) - own_free
                    + same_trigger
                    + allocs.between(p + 1, b)
                    + bytes
            };
            let ahead_ok = self.fits_ahead(p + 1, b, bytes);
            let mut ok = ahead_ok && swap_in_bytes(self, snap) <= self.budget;
            if !ok && (ahead_ok || forced) && (policy == Policy::ReclaimFirst || forced) {
                // Fig. 2b: wait at op p for the oldest swap-outs until it fits.
                while !ok && self.can_wait_at(p) {
                    let upto = self.cf + 1;
                    snap -= self.cover(p, upto, true);
                    ok = (ahead_ok || forced) && swap_in_bytes(self, snap) <= self.budget;
                }
            }
            if forced && !ok {
                let bytes_needed = swap_in_bytes(self, snap);
                if bytes_needed > self.budget {
                    let needed_bytes = u64::try_from(bytes_needed).unwrap_or(u64::MAX);
                    let before = &self.ctx.op_at(b.min(n - 1)).name;
                    return Err(Shortfall {
                        needed_bytes: Some(needed_bytes),
                        at: Some(format!("the swap-in of {} before op `{before}`", g.tensor)),
                        message: format!(
                            "the swap-in of {} before op `{before}` needs {}, over the planning budget of {}",
                            g.tensor,
                            fmt_bytes(needed_bytes),
                            fmt_bytes(self.budget_bytes())
                        ),
                    });
                }
                ok = true; // the compute ops ahead wait for swap-outs as they come
            }
            if !ok {
                break; // delay this and every later prefetch (step b)
            }
            if want < p {
                tally.delayed += 1;
            }
            self.gaps[gi].prefetch_after = Some(p);
            self.state[gi].issued = true;
            self.state[gi].frontier = frontier;
            self.hf = frontier;
            self.cur += bytes;
            same_trigger += bytes;
            self.commit_ahead(p + 1, b, bytes);
            waiting.done(&self.gaps, gi);
        }
        Ok(())
    }

    /// Fig. 2d: where gap `gi`'s swap-out is a real copy that nobody waited
    /// for yet by the time its swap-in is wanted after op `p`, its old
    /// buffer still counts, and the tensor fits at the ops up to its use
    /// `b`, the tensor stays instead (the old buffer becomes its own
    /// again). Returns whether it was cancelled.
    fn cancel_swap_out(&mut self, p: usize, gi: usize, b: usize, bytes: i128) -> bool {
        let Some(k) = self.state[gi].d2h else {
            return false;
        };
        if k < self.cf.max(self.hf)
            || !self.state[gi].old_counted
            || !self.fits_ahead(p + 1, b, bytes)
        {
            return false;
        }
        self.state[gi].cancelled = true;
        self.uncount(gi, k); // now the tensor's own buffer
        let t = self.gaps[gi].tensor;
        self.host_current[t.index()] = self.state[gi].host_current_before;
        self.commit_ahead(p + 1, b, bytes);
        true
    }
}

/// A shortfall for a rule the sweep cannot schedule at all (no byte count).
fn bad_rule(message: String) -> Shortfall {
    Shortfall {
        needed_bytes: None,
        at: None,
        message,
    }
}

/// The window rule scheduled under `budget_bytes` with the reclaim-first policy.
#[cfg(test)]
pub(crate) fn window_gaps(
    ctx: &Ctx<'_>,
    window_bytes: u64,
    budget_bytes: u64,
) -> Result<Vec<Gap>, Shortfall> {
    let rule = window_rule(ctx, window_bytes);
    schedule(ctx, &rule, budget_bytes, Policy::ReclaimFirst).map(|s| s.gaps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::{mlp_chain, v100};
    use outcore_plan::PlannerInfo;

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
        let ctx = Ctx::in_graph_order(&graph, &cost);
        let unlimited = u64::MAX / 4;
        let total_bytes: u64 = ctx.owners_at.iter().flatten().map(|&t| ctx.size(t)).sum();
        for window_bytes in [0, 200_000, 1_000_000, total_bytes] {
            let gaps = window_rule(&ctx, window_bytes);
            let scheduled = window_gaps(&ctx, window_bytes, unlimited).expect("plans");
            assert!(
                scheduled.iter().all(|g| gaps
                    .iter()
                    .any(|r| r.tensor == g.tensor && r.after == g.after && r.before == g.before)),
                "the sweep only drops or times the window rule's gaps"
            );
            // With memory to spare nobody waits for a swap-out, so every real
            // copy is cancelled; only frees of tensors whose host copy is current
            // (weights that start on the host, the batch) remain.
            assert!(scheduled.iter().all(|g| {
                let t = graph.tensor(g.tensor);
                g.reclaim_before.is_none() && (t.is_persistent() || t.producer.is_none())
            }));
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
        let ctx = Ctx::in_graph_order(&graph, &cost);
        let gaps = window_gaps(&ctx, 0, u64::MAX / 4).expect("plans");
        assert!(gaps.iter().all(|g| g.reclaim_before.is_none()));
        assert!(!window_rule(&ctx, 0).is_empty());
        let (footprint_bytes, _) = outcore_graph::footprint(&graph);
        let mut waited = false;
        for fraction in [0.75, 0.6, 0.5, 0.4] {
            let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
            let Ok(tight) = window_gaps(&ctx, 0, budget_bytes) else {
                continue;
            };
            waited |= tight.iter().any(|g| g.reclaim_before.is_some());
            assert_eq!(verify_problem(&ctx, tight, budget_bytes), None);
        }
        assert!(waited, "no budget made an op wait for a swap-out");
    }

    /// Lowers `gaps` at `budget_bytes` and returns verify's first complaint.
    fn verify_problem(ctx: &Ctx<'_>, gaps: Vec<Gap>, budget_bytes: u64) -> Option<String> {
        let graph = ctx.graph;
        let schedule = ctx.schedule(gaps);
        let info = PlannerInfo {
            name: "window".into(),
            seed: None,
            settings: serde_json::Value::Null,
        };
        match outcore_plan::lower_schedule(graph, &schedule, info, budget_bytes) {
            Ok(plan) => outcore_plan::verify(&plan, graph)
                .first()
                .map(|v| v.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }

    #[test]
    fn a_schedule_the_model_accepts_verifies_at_the_full_budget() {
        let cost = v100();
        let graphs = [
            mlp_chain(8, 512, 64),
            outcore_graph::zoo::build("resnet18", Some(2), &Default::default(), None).expect("zoo"),
        ];
        let mut accepted = 0usize;
        let mut accepted_reordered = 0usize;
        for (gi, graph) in graphs.iter().enumerate() {
            for reordered in [false, true] {
                let ctx = if reordered {
                    Ctx::new(
                        graph,
                        &cost,
                        outcore_plan::random_topological_order(graph, 5),
                    )
                } else {
                    Ctx::in_graph_order(graph, &cost)
                };
                let (footprint_bytes, _) = outcore_graph::footprint(graph);
                for fraction in [0.7, 0.5, 0.3] {
                    let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
                    for w in candidate_windows(budget_bytes).into_iter().step_by(3) {
                        let rule = window_rule(&ctx, w);
                        for policy in [Policy::ReclaimFirst, Policy::DelayFirst] {
                            let Ok(s) = schedule(&ctx, &rule, budget_bytes, policy) else {
                                continue;
                            };
                            accepted += 1;
                            accepted_reordered += usize::from(reordered);
                            let problem = verify_problem(&ctx, s.gaps, budget_bytes);
                            assert!(
                                problem.is_none(),
                                "graph {gi} (reordered: {reordered}) at {fraction} W {w} {policy:?}: {problem:?}"
                            );
                        }
                    }
                }
            }
        }
        assert!(accepted > 10, "only {accepted} schedules accepted");
        assert!(
            accepted_reordered > 5,
            "only {accepted_reordered} schedules accepted in a random order"
        );
    }

    #[test]
    fn prefetch_is_delayed_when_memory_is_short() {
        let graph = mlp_chain(8, 512, 64);
        let cost = v100();
        let ctx = Ctx::in_graph_order(&graph, &cost);
        let (footprint_bytes, _) = outcore_graph::footprint(&graph);
        let w = footprint_bytes / 4;
        let rule = window_rule(&ctx, w);
        assert!(!rule.is_empty());
        let wanted = |g: &Gap| {
            rule.iter()
                .find(|r| r.tensor == g.tensor && r.after == g.after && r.before == g.before)
                .and_then(|r| r.prefetch_after)
        };
        // Short of memory: some prefetches come later than the window wants, none earlier.
        let mut found_short = false;
        for fraction in [0.6, 0.5, 0.45, 0.4, 0.35] {
            let budget_bytes = (footprint_bytes as f64 * fraction) as u64;
            let Ok(s) = schedule(&ctx, &rule, budget_bytes, Policy::DelayFirst) else {
                continue;
            };
            for g in &s.gaps {
                assert!(
                    g.prefetch_after >= wanted(g),
                    "a prefetch came earlier than wanted"
                );
            }
            let late = s
                .gaps
                .iter()
                .filter(|g| g.prefetch_after > wanted(g))
                .count();
            assert_eq!(late, s.delayed);
            if s.delayed > 0 {
                found_short = true;
                assert!(verify_problem(&ctx, s.gaps, budget_bytes).is_none());
            }
        }
        assert!(found_short, "no budget made the sweep delay a prefetch");
        // With memory to spare the window's triggers stand.
        let roomy = schedule(&ctx, &rule, footprint_bytes * 2, Policy::DelayFirst).expect("plans");
        assert_eq!(roomy.delayed, 0);
    }

    #[test]
    fn the_planner_plans_against_the_full_budget() {
        let graph =
            outcore_graph::zoo::build("resnet18", Some(2), &Default::default(), None).expect("zoo");
        let cost = v100();
        let (footprint_bytes, _) = outcore_graph::footprint(&graph);
        let request = PlanRequest::new(&graph, &cost, footprint_bytes / 2);
        let Ok(PlanOutcome::Feasible(plan)) = Window.plan(&request) else {
            panic!("resnet18 at half its footprint is feasible");
        };
        assert!(outcore_plan::verify(&plan, &graph).is_empty());
        assert_eq!(plan.planner.settings["planning_margin"], 1.0);
        assert!(plan.planner.settings["window_bytes"].is_u64());
    }
}
