//! Memory pressure: a conservative live-bytes model of a schedule, the
//! tightening margins the model-driven planners plan against, and the on-demand
//! eviction loop shared by `capuchin` and `odswap` (walk the positions in order
//! and, wherever the modelled live bytes exceed the budget, let a policy pick a
//! resident tensor not used there to drop, swap or recompute, until it fits).
//! The loop is a producer of gaps like [`super::decisions::materialise`]; its
//! schedules are scored by the one scoring path.

use super::ctx::Ctx;
use super::decisions::recompute_gap;
use super::score::Shortfall;
use outcore_graph::TensorId;
use outcore_plan::{Gap, Restore, fmt_bytes};
use std::collections::HashMap;

/// The positions `[lo, hi]` at which a gap's tensor is surely off the device in
/// verify's accounting, given the position its free is ordered before (`freed_by`).
/// Swap: from `freed_by` up to the prefetch trigger; recompute: strictly inside.
pub fn absent_range(ctx: &Ctx<'_>, gap: &Gap, freed_by: Option<usize>) -> Option<(usize, usize)> {
    let last_pos = ctx.n.checked_sub(1)?;
    match gap.how {
        Restore::Recompute => {
            let (a, b) = (gap.after?, gap.before?);
            (b > a + 1).then_some((a + 1, b - 1))
        }
        Restore::Swap => {
            let lo = match gap.after {
                None => 0,
                Some(_) => freed_by?,
            };
            let hi = match gap.before {
                None => last_pos,
                // Resident again once the trigger op has finished.
                Some(_) => gap.prefetch_after?,
            };
            (lo <= hi).then_some((lo, hi))
        }
    }
}

/// Scratch bytes a recomputation needs for its producer's other outputs.
pub fn recompute_scratch_bytes(ctx: &Ctx<'_>, t: TensorId) -> u64 {
    let Some(p) = ctx.graph.tensor(t).producer else {
        return 0;
    };
    ctx.graph
        .op(p)
        .outputs
        .iter()
        .filter(|&&o| o != t && ctx.graph.tensor(o).allocates())
        .map(|&o| ctx.size(o))
        .sum()
}

/// Per position, the bytes `gaps` take off the device: [`live_bytes`] with
/// no gaps minus with them, never below zero (a recomputation's scratch
/// adds bytes where it runs). What the planners that count every tensor
/// resident (DTR by position) are given on top of the budget.
pub fn absent_bytes(ctx: &Ctx<'_>, gaps: &[Gap]) -> Vec<u64> {
    live_bytes(ctx, &[])
        .iter()
        .zip(&live_bytes(ctx, gaps))
        .map(|(all, with)| u64::try_from(all - with).unwrap_or(0))
        .collect()
}

/// Live bytes per position under a set of gaps, with each swap gap's free
/// ordered before the compute op named by its own `reclaim_before` (a model;
/// verify is the judge).
pub fn live_bytes(ctx: &Ctx<'_>, gaps: &[Gap]) -> Vec<i128> {
    let n = ctx.n;
    let mut delta = owner_deltas(ctx);
    for g in gaps {
        let size = ctx.size(g.tensor) as i128;
        if let Some((lo, hi)) = absent_range(ctx, g, g.reclaim_before) {
            delta[lo] -= size;
            delta[hi + 1] += size;
        }
        if g.how == Restore::Recompute
            && let Some(b) = g.before
        {
            let scratch = recompute_scratch_bytes(ctx, g.tensor) as i128;
            delta[b] += scratch;
            delta[b + 1] -= scratch;
        }
    }
    running_sum(&delta, n)
}

/// Bytes resident per position under `gaps`: each owner over its base
/// interval, less the part of each gap's absence inside it. Unlike
/// [`live_bytes`] an absence outside the interval takes nothing away: a
/// recomputation chain's input is recomputed for a reader that
/// [`Ctx::base_interval`] does not count, and its gap runs past the
/// interval's end (on the PyTorch GPT-2 export at 25%, 176 gaps holding
/// 1.06 GB did, and [`live_bytes`] fell below zero at the LM head). No
/// recomputation scratch. What `outcore`'s fitted lead holds swap-ins to.
pub fn resident_bytes(ctx: &Ctx<'_>, gaps: &[Gap]) -> Vec<i128> {
    let mut delta = owner_deltas(ctx);
    for g in gaps {
        let Some((lo, hi)) = absent_range(ctx, g, g.reclaim_before) else {
            continue;
        };
        let (base_lo, base_hi) = ctx.base_interval(g.tensor);
        let (lo, hi) = (lo.max(base_lo), hi.min(base_hi));
        if lo <= hi {
            delta[lo] -= i128::from(ctx.size(g.tensor));
            delta[hi + 1] += i128::from(ctx.size(g.tensor));
        }
    }
    running_sum(&delta, ctx.n)
}

/// Per position (and one past the end), the change in bytes as each owner's
/// base interval opens and closes.
fn owner_deltas(ctx: &Ctx<'_>) -> Vec<i128> {
    let mut delta = vec![0i128; ctx.n + 1];
    for t in ctx.owners() {
        let (lo, hi) = ctx.base_interval(t);
        delta[lo] += ctx.size(t) as i128;
        delta[hi + 1] -= ctx.size(t) as i128;
    }
    delta
}

/// The first `n` running sums of `delta`.
fn running_sum(delta: &[i128], n: usize) -> Vec<i128> {
    let mut cur = 0i128;
    delta
        .iter()
        .take(n)
        .map(|d| {
            cur += d;
            cur
        })
        .collect()
}

/// Fractions of the budget the planners plan against, tightest last: verify also
/// counts copies that overlap compute and frees not yet ordered, which the live
/// model only approximates.
pub const MARGINS: [f64; 6] = [1.0, 0.95, 0.9, 0.8, 0.65, 0.5];

/// The internal budget for a margin.
pub fn margin_budget(budget_bytes: u64, margin: f64) -> u64 {
    (budget_bytes as f64 * margin) as u64
}

/// Positions that an on-demand planner must keep an owner resident at (inputs of
/// a recomputation placed there).
pub fn pinned_inside(
    pins: &[usize],
    after: Option<usize>,
    before: Option<usize>,
    n: usize,
) -> bool {
    let lo = after.map_or(0, |a| a + 1);
    let hi = before.unwrap_or(n);
    pins.iter().any(|&p| p >= lo && p < hi)
}

/// A resident tensor that could leave the device at the pressure point `q`.
#[derive(Debug, Clone)]
pub struct Evictable {
    pub tensor: TensorId,
    pub size_bytes: u64,
    /// The use before `q` (for a persistent tensor before its first use this
    /// iteration: its last use, of the previous iteration).
    pub after: usize,
    /// The use after `q` (for a persistent tensor after its last use: its first
    /// use, of the next iteration).
    pub before: usize,
    /// The gap crosses the iteration boundary (persistent tensors only).
    pub wraps: bool,
    /// When it was last accessed, in positions relative to this iteration's start
    /// (negative: in the previous iteration).
    pub last_access: i64,
    /// Compute time of the positions strictly between the pressure point and the
    /// next use (the time a prefetch issued now could hide behind).
    pub ahead_s: f64,
    /// Compute time of the positions strictly between the last use and `q` (the
    /// time a swap-out issued after the last use has before `q` waits for it).
    pub behind_s: f64,
    /// Recomputation time, when recomputing it before its next use is possible.
    pub recompute_s: Option<f64>,
}

/// How a policy restores a chosen candidate.
#[derive(Debug, Clone, Copy)]
pub enum Choice {
    /// Swap out (the pressure op waits for it) and start the swap-in this many
    /// seconds of compute ahead of the next use (clamped to the pressure point).
    Swap { lead_s: f64 },
    /// Recompute just before the next use.
    Recompute,
}

/// Runs the loop; `choose` returns the index of the candidate to drop and how.
pub fn evict_on_demand(
    ctx: &Ctx<'_>,
    budget_bytes: u64,
    allow_recompute: bool,
    choose: impl FnMut(usize, &[Evictable]) -> Option<(usize, Choice)>,
) -> Result<Vec<Gap>, Shortfall> {
    evict_with(ctx, budget_bytes, allow_recompute, Candidates::Kept, choose)
}

/// How the loop gets the candidates after each eviction at one position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidates {
    /// Kept, with what the eviction changed ([`after_eviction`]).
    Kept,
    /// Built again from every live owner (the reference the tests check
    /// [`Candidates::Kept`] against).
    #[cfg_attr(not(test), allow(dead_code))]
    Rebuilt,
}

/// [`evict_on_demand`], with the candidates kept or rebuilt as `how` says.
///
/// Why kept: far below the footprint the loop evicts hundreds of tensors at
/// one position, and building the candidates from every live owner each
/// time was most of the planners' time. On DenseNet-121 b64 at 12.5% on
/// `h100-80gb`, `capuchin`'s loop built them 1,000 times at its first 8
/// pressure points, over about 1,000 live owners each (`perf`: 63% of
/// `capuchin`'s time in `candidates`). Kept, `outcore plan --model
/// densenet121 --batch 64 --device h100-80gb --budget 12.5% --planner
/// capuchin` took 0.21-0.22 s against 0.37-0.49 s (the whole command, two
/// runs each), and the plans of `capuchin` and `odswap` on four suite cases
/// came out the same.
fn evict_with(
    ctx: &Ctx<'_>,
    budget_bytes: u64,
    allow_recompute: bool,
    how: Candidates,
    mut choose: impl FnMut(usize, &[Evictable]) -> Option<(usize, Choice)>,
) -> Result<Vec<Gap>, Shortfall> {
    let budget = budget_bytes as i128;
    let mut state = Evictions::new(ctx);
    let owners: Vec<TensorId> = ctx.owners().filter(|&t| ctx.size(t) > 0).collect();
    let mut live_owners = LiveOwners::new(ctx, &owners);
    // The candidates at `cands_at`, as they stand after the evictions there.
    let mut cands: Vec<Evictable> = Vec::new();
    let mut cands_at: Option<usize> = None;
    for q in 0..ctx.n {
        if state.live[q] > budget {
            live_owners.advance_to(q);
        }
        while state.live[q] > budget {
            if cands_at != Some(q) || how == Candidates::Rebuilt {
                cands = candidates(
                    ctx,
                    q,
                    &live_owners.live,
                    &state.gapped,
                    &state.reopenable,
                    &state.pins,
                    allow_recompute,
                );
                cands_at = Some(q);
            }
            let Some((ci, choice)) = choose(q, &cands) else {
                return Err(nothing_can_leave(ctx, q, state.live[q]));
            };
            if ci >= cands.len() {
                return Err(Shortfall {
                    needed_bytes: None,
                    at: Some(format!("op `{}`", ctx.op_at(q).name)),
                    message: "the eviction policy chose no candidate".into(),
                });
            }
            let c = cands.remove(ci);
            state.take(ctx, q, &c, choice);
            let recomputed = matches!(choice, Choice::Recompute) && !c.wraps;
            after_eviction(ctx, &mut cands, &c, recomputed, &state.gapped, &state.pins);
        }
    }
    Ok(state.gaps)
}

/// The shortfall where op `q` needs `live` bytes and no candidate is left.
fn nothing_can_leave(ctx: &Ctx<'_>, q: usize, live: i128) -> Shortfall {
    let needed_bytes = u64::try_from(live).unwrap_or(u64::MAX);
    Shortfall {
        needed_bytes: Some(needed_bytes),
        at: Some(format!("op `{}`", ctx.op_at(q).name)),
        message: format!(
            "op `{}` needs {} live and nothing else can leave the device",
            ctx.op_at(q).name,
            fmt_bytes(needed_bytes)
        ),
    }
}

/// The eviction loop's state: the gaps chosen so far, the live bytes at
/// each position as they leave them, and what later choices depend on.
struct Evictions {
    /// Positions in the order.
    n: usize,
    live: Vec<i128>,
    gaps: Vec<Gap>,
    /// (tensor, after) of every gap pair already chosen; wrap pairs use
    /// `after` = last use.
    gapped: Gapped,
    /// Per storage owner, the positions where a recomputation reads it.
    pins: Vec<Vec<usize>>,
    /// Persistent tensors evicted across the iteration boundary before their
    /// first use, whose copy-out after the last use frees nothing yet: the
    /// index of that gap, so a pressure point after the last use can still
    /// take the device copy away (the same gap, freed there).
    reopenable: HashMap<TensorId, usize>,
}

impl Evictions {
    fn new(ctx: &Ctx<'_>) -> Evictions {
        let tensors = ctx.graph.tensors.len();
        Evictions {
            n: ctx.n,
            live: live_bytes(ctx, &[]),
            gaps: Vec::new(),
            gapped: Gapped::new(tensors),
            pins: vec![Vec::new(); tensors],
            reopenable: HashMap::new(),
        }
    }

    /// `size_bytes` off the device at positions `lo..=hi`.
    fn absent(&mut self, lo: usize, hi: usize, size_bytes: u64) {
        for v in &mut self.live[lo..=hi] {
            *v -= size_bytes as i128;
        }
    }

    /// Evicts candidate `c` at pressure point `q` as `choice` says.
    fn take(&mut self, ctx: &Ctx<'_>, q: usize, c: &Evictable, choice: Choice) {
        self.gapped.insert(c.tensor, c.after);
        match (choice, c.wraps) {
            (Choice::Recompute, false) => self.recompute(ctx, c),
            (Choice::Swap { lead_s }, false) => self.swap(ctx, q, c, lead_s),
            (_, true) if reopens(c, q, &self.reopenable) => {
                // Already swapped out after its last use and back before its
                // first: free the device copy here as well.
                if let Some(gi) = self.reopenable.remove(&c.tensor) {
                    self.gaps[gi].reclaim_before = Some(q);
                }
                self.absent(q, self.n - 1, c.size_bytes);
            }
            (_, true) => self.swap_across_boundary(ctx, q, c, lead_of(choice)),
        }
    }

    /// Recomputed just before its next use: absent between its uses, its
    /// producer's scratch live at the next use, and the producer's inputs
    /// pinned there.
    fn recompute(&mut self, ctx: &Ctx<'_>, c: &Evictable) {
        self.absent(c.after + 1, c.before - 1, c.size_bytes);
        let scratch = recompute_scratch_bytes(ctx, c.tensor) as i128;
        self.live[c.before] += scratch;
        if let Some(p) = ctx.graph.tensor(c.tensor).producer {
            for &x in &ctx.graph.op(p).inputs {
                self.pins[ctx.graph.storage_owner(x).index()].push(c.before);
            }
        }
        self.gaps.push(recompute_gap(c.tensor, c.after, c.before));
    }

    /// Swapped out (freed before `q`) and back in `lead_s` of compute ahead
    /// of its next use.
    fn swap(&mut self, ctx: &Ctx<'_>, q: usize, c: &Evictable, lead_s: f64) {
        let p = prefetch_trigger(ctx, q, c.before, lead_s);
        self.absent(q, p, c.size_bytes);
        self.gaps.push(Gap {
            tensor: c.tensor,
            after: Some(c.after),
            before: Some(c.before),
            how: Restore::Swap,
            prefetch_after: Some(p),
            reclaim_before: Some(q),
            copy_out_after: None,
        });
    }

    /// A persistent tensor off the device across the iteration boundary:
    /// out after its last use, back before its first.
    fn swap_across_boundary(&mut self, ctx: &Ctx<'_>, q: usize, c: &Evictable, lead_s: f64) {
        let after_last = q > c.after;
        if !after_last {
            self.reopenable.insert(c.tensor, self.gaps.len());
        }
        let lo = if after_last { 0 } else { q };
        let p = prefetch_trigger(ctx, lo, c.before, lead_s);
        if after_last {
            self.absent(q, self.n - 1, c.size_bytes);
        }
        self.absent(0, p, c.size_bytes);
        self.gaps.push(Gap {
            tensor: c.tensor,
            after: Some(c.after),
            before: None,
            how: Restore::Swap,
            prefetch_after: None,
            reclaim_before: after_last.then_some(q),
            copy_out_after: None,
        });
        self.gaps.push(Gap {
            tensor: c.tensor,
            after: None,
            before: Some(c.before),
            how: Restore::Swap,
            prefetch_after: Some(p),
            reclaim_before: None,
            copy_out_after: None,
        });
    }
}

/// The candidates at a pressure point after `taken` (already removed from
/// them) was evicted there: what [`candidates`] would build again, without
/// rebuilding. The eviction changed three things the candidates depend on:
/// - `gapped` gained `taken`'s gap, which rules out recomputing a tensor
///   whose producer reads `taken` ([`recompute_time`]); only those
///   candidates' recomputation times are taken again (a time can only go
///   from some to none, as `gapped` only grows);
/// - with `recomputed`, `pins` gained `taken`'s next use for every input of
///   its producer, which may now pin those candidates to the device;
/// - `reopenable` changed for `taken`'s tensor alone, which is no candidate
///   any more (its gap is in `gapped`).
///
/// Nothing else a candidate holds depends on the loop's state.
fn after_eviction(
    ctx: &Ctx<'_>,
    cands: &mut Vec<Evictable>,
    taken: &Evictable,
    recomputed: bool,
    gapped: &Gapped,
    pins: &[Vec<usize>],
) {
    let graph = ctx.graph;
    let taken_inputs: &[TensorId] = match graph.tensor(taken.tensor).producer {
        Some(p) if recomputed => &graph.op(p).inputs,
        _ => &[],
    };
    let reads_taken = |t: TensorId| {
        graph.tensor(t).producer.is_some_and(|p| {
            graph
                .op(p)
                .inputs
                .iter()
                .any(|&x| graph.storage_owner(x) == taken.tensor)
        })
    };
    cands.retain_mut(|cand| {
        let newly_pinned = taken_inputs
            .iter()
            .any(|&x| graph.storage_owner(x) == cand.tensor);
        if newly_pinned
            && pinned_at(
                &pins[cand.tensor.index()],
                cand.wraps,
                cand.after,
                cand.before,
                ctx.n,
            )
        {
            return false;
        }
        if cand.recompute_s.is_some() && reads_taken(cand.tensor) {
            cand.recompute_s = recompute_time(ctx, cand.tensor, cand.before, gapped);
        }
        true
    });
}

/// Whether `pins` keeps a tensor on the device inside its gap: strictly
/// between `after` and `before`, or for a gap across the iteration boundary
/// (`wraps`: `after` the last use, `before` the first) after the last use or
/// before the first.
fn pinned_at(pins: &[usize], wraps: bool, after: usize, before: usize, n: usize) -> bool {
    if wraps {
        pins.iter().any(|&p| p > after || p < before)
    } else {
        pinned_inside(pins, Some(after), Some(before), n)
    }
}

/// The `(tensor, after)` of every gap the loop has chosen (wrap gaps: `after`
/// is the last use), by tensor: a tensor has a handful at most, so a scan of
/// its own list is cheaper than hashing the pair, which took 29% of
/// `capuchin`'s time on BERT-base b32 at 12.5% of its footprint (`perf`).
struct Gapped(Vec<Vec<usize>>);

impl Gapped {
    fn new(tensors: usize) -> Self {
        Gapped(vec![Vec::new(); tensors])
    }

    fn insert(&mut self, t: TensorId, after: usize) {
        let afters = &mut self.0[t.index()];
        if !afters.contains(&after) {
            afters.push(after);
        }
    }

    fn contains(&self, t: TensorId, after: usize) -> bool {
        self.0[t.index()].contains(&after)
    }
}

/// The owners whose base interval ([`Ctx::base_interval`]) holds the current
/// position, in the order of `owners`, kept as the loop's position only
/// grows: the candidates are drawn from these alone instead of every owner
/// at every eviction (on BERT-base b32 at 12.5% of its footprint the loop
/// evicts thousands of times over its 2,000-odd owners).
struct LiveOwners {
    /// Owners and their base intervals, by the interval's start.
    by_start: Vec<(usize, usize, TensorId)>,
    /// How many of `by_start` have been taken in.
    taken: usize,
    /// The owners live at the position last advanced to, ascending by id
    /// (the order of [`Ctx::owners`]).
    live: Vec<TensorId>,
    /// Each owner's interval end, by tensor index.
    end: Vec<usize>,
}

impl LiveOwners {
    fn new(ctx: &Ctx<'_>, owners: &[TensorId]) -> Self {
        let mut end = vec![0; ctx.graph.tensors.len()];
        let mut by_start: Vec<(usize, usize, TensorId)> = owners
            .iter()
            .map(|&t| {
                let (lo, hi) = ctx.base_interval(t);
                end[t.index()] = hi;
                (lo, hi, t)
            })
            .collect();
        by_start.sort_by_key(|&(lo, _, t)| (lo, t));
        LiveOwners {
            by_start,
            taken: 0,
            live: Vec::new(),
            end,
        }
    }

    /// Moves to position `q` (never below the last one).
    fn advance_to(&mut self, q: usize) {
        let end = &self.end;
        self.live.retain(|t| end[t.index()] >= q);
        let before = self.live.len();
        while let Some(&(lo, hi, t)) = self.by_start.get(self.taken) {
            if lo > q {
                break;
            }
            self.taken += 1;
            if hi >= q {
                self.live.push(t);
            }
        }
        if self.live.len() > before {
            self.live.sort_unstable();
        }
    }
}

/// Taking `c` at `q` frees, after its last use, a tensor already evicted
/// across the iteration boundary before its first use (its gap is reopened,
/// not a new one made).
fn reopens(c: &Evictable, q: usize, reopenable: &HashMap<TensorId, usize>) -> bool {
    c.wraps && q > c.after && reopenable.contains_key(&c.tensor)
}

fn lead_of(choice: Choice) -> f64 {
    match choice {
        Choice::Swap { lead_s } => lead_s,
        Choice::Recompute => 0.0,
    }
}

/// The latest trigger in `[lo, before - 1]` that leaves at least `lead_s` of
/// compute before `before`; `lo` when none does.
pub fn prefetch_trigger(ctx: &Ctx<'_>, lo: usize, before: usize, lead_s: f64) -> usize {
    let mut p = before.saturating_sub(1).max(lo);
    while p > lo && ctx.time_s(p + 1, before) < lead_s {
        p -= 1;
    }
    p
}

/// The tensors evictable at `q`, in `owners`' order; `owners` are the
/// owners whose base interval holds `q` ([`LiveOwners`]).
fn candidates(
    ctx: &Ctx<'_>,
    q: usize,
    owners: &[TensorId],
    gapped: &Gapped,
    reopenable: &HashMap<TensorId, usize>,
    pins: &[Vec<usize>],
    allow_recompute: bool,
) -> Vec<Evictable> {
    let n = ctx.n;
    let mut out = Vec::new();
    for &t in owners {
        let uses = &ctx.uses[t.index()];
        let (Some(&first), Some(&last)) = (uses.first(), uses.last()) else {
            continue;
        };
        let (prev, next) = ctx.neighbours(t, q);
        if uses.binary_search(&q).is_ok() {
            continue;
        }
        let cand = match (prev, next) {
            (Some(a), Some(b)) => {
                if pinned_at(&pins[t.index()], false, a, b, n) {
                    continue;
                }
                let recompute_s = if allow_recompute {
                    recompute_time(ctx, t, b, gapped)
                } else {
                    None
                };
                Evictable {
                    tensor: t,
                    size_bytes: ctx.size(t),
                    after: a,
                    before: b,
                    wraps: false,
                    last_access: a as i64,
                    ahead_s: ctx.time_s(q + 1, b),
                    behind_s: ctx.time_s(a + 1, q),
                    recompute_s,
                }
            }
            _ if ctx.persistent(t) && first > 0 => {
                if pinned_at(&pins[t.index()], true, last, first, n) {
                    continue;
                }
                let after_last = q > last;
                Evictable {
                    tensor: t,
                    size_bytes: ctx.size(t),
                    after: last,
                    before: first,
                    wraps: true,
                    last_access: last as i64 - if after_last { 0 } else { n as i64 },
                    ahead_s: if after_last {
                        ctx.time_s(q + 1, n) + ctx.time_s(0, first)
                    } else {
                        ctx.time_s(q + 1, first)
                    },
                    behind_s: if after_last {
                        ctx.time_s(last + 1, q)
                    } else {
                        ctx.time_s(last + 1, n) + ctx.time_s(0, q)
                    },
                    recompute_s: None,
                }
            }
            _ => continue,
        };
        if gapped.contains(t, cand.after) && !reopens(&cand, q, reopenable) {
            continue;
        }
        out.push(cand);
    }
    out
}

/// Recomputing `t` just before its use at `b` is possible when its producer may be
/// re-run, writes nothing in place, and every input is resident at `b` with the
/// same version it had when the producer first ran.
fn recompute_time(ctx: &Ctx<'_>, t: TensorId, b: usize, gapped: &Gapped) -> Option<f64> {
    let graph = ctx.graph;
    let p = graph.tensor(t).producer?;
    let op = graph.op(p);
    if !op.recomputable || op.outputs.iter().any(|&o| !graph.tensor(o).allocates()) {
        return None;
    }
    let p_pos = ctx.position(p);
    for &x in &op.inputs {
        let x = graph.storage_owner(x);
        let (lo, hi) = ctx.base_interval(x);
        if b < lo || b > hi {
            return None;
        }
        if ctx.writes[x.index()].iter().any(|&w| w > p_pos && w <= b) {
            return None;
        }
        let uses = &ctx.uses[x.index()];
        if uses.binary_search(&b).is_err() {
            let (prev, next) = ctx.neighbours(x, b);
            let key = match (prev, next) {
                (Some(a), Some(_)) => a,
                _ => uses.last().copied().unwrap_or(0),
            };
            if gapped.contains(x, key) {
                return None;
            }
        }
    }
    Some(ctx.op_time_s[p_pos])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::testing::v100;
    use outcore_graph::footprint;

    /// What the policy is shown at each call: the position, and of each
    /// candidate what is not a function of the position alone.
    type Shown = Vec<(usize, Vec<(TensorId, usize, usize, bool, Option<f64>)>)>;

    /// The loop with its candidates kept ([`after_eviction`]) shows its
    /// policy the same candidates in the same order, and so chooses what it
    /// chooses with them rebuilt at every eviction, on three graphs at three
    /// budgets, under `capuchin`'s policy (with and without recomputation)
    /// and under one that recomputes the last candidate it can (so that
    /// many recomputations' pins and gaps, which [`after_eviction`] must
    /// follow, change the candidates at one position); and the cases
    /// include recomputations.
    #[test]
    fn kept_candidates_choose_as_rebuilt_ones_do() {
        let cost = v100();
        let mut recomputed = 0;
        for (model, batch) in [("densenet121", 2), ("resnet18", 4), ("bert-base", 1)] {
            let g = outcore_graph::zoo::build(model, Some(batch), &Default::default(), None)
                .expect("zoo");
            let ctx = Ctx::in_graph_order(&g, &cost);
            let (footprint_bytes, _) = footprint(&g);
            for share in [0.5, 0.25, 0.125] {
                let budget_bytes = (footprint_bytes as f64 * share) as u64;
                for (allow_recompute, policy) in [(true, 0), (false, 0), (true, 1)] {
                    let run = |how| {
                        let mut shown: Shown = Vec::new();
                        let gaps =
                            evict_with(&ctx, budget_bytes, allow_recompute, how, |q, cands| {
                                let seen = cands
                                    .iter()
                                    .map(|c| (c.tensor, c.after, c.before, c.wraps, c.recompute_s));
                                shown.push((q, seen.collect()));
                                if policy == 0 {
                                    return crate::capuchin::capuchin_choice(&cost, 1.0, cands);
                                }
                                match cands.iter().rposition(|c| c.recompute_s.is_some()) {
                                    Some(i) => Some((i, Choice::Recompute)),
                                    None => (!cands.is_empty())
                                        .then_some((0, Choice::Swap { lead_s: 0.0 })),
                                }
                            });
                        (gaps, shown)
                    };
                    let (kept, kept_shown) = run(Candidates::Kept);
                    let (rebuilt, rebuilt_shown) = run(Candidates::Rebuilt);
                    let case = format!(
                        "{model} at {share} (recompute: {allow_recompute}, policy {policy})"
                    );
                    assert!(kept_shown == rebuilt_shown, "the candidates differ: {case}");
                    assert_eq!(format!("{kept:?}"), format!("{rebuilt:?}"), "{case}");
                    if let Ok(gaps) = &kept {
                        recomputed += gaps
                            .iter()
                            .filter(|g| matches!(g.how, Restore::Recompute))
                            .count();
                    }
                }
            }
        }
        assert!(recomputed > 0, "no case recomputed");
    }
}
