//! The exact offset layout of a plan's device memory (the `offsets`
//! allocator): an address for every allocation of the iteration, fixed ahead
//! of time, valid for every timing the plan allows.
//!
//! Which allocations may share bytes comes from the same happens-before order
//! that [`crate::verify`] proves memory with: two buffers may overlap in
//! address only if one's free completes before the other's allocation in
//! every timing (stream order plus waits). So the layout holds whatever the
//! copies' speeds, as the plan's memory bound does. Its height is usually
//! at or above that bound (the bound sums, at each allocating step, what may
//! be resident then; a layout adds gaps), and can be slightly below it: the
//! bound also counts, at one step, two buffers on other streams that are
//! each possibly resident then but ordered with respect to each other.
//!
//! A persistent tensor resident at the start of the iteration that leaves
//! and comes back must end the iteration where it started, since the next
//! iteration begins with it there: its first and last buffers are laid out
//! as one.
//!
//! The assignment is the dynamic storage allocation problem on the
//! "may be live together" graph (NP-hard in general). Choice: greedy
//! placement (each buffer at a gap between the buffers already placed that it
//! conflicts with, else on top), the heuristic TensorFlow Lite's arena
//! planner and XLA's heap simulator start from, in eight orders (see
//! `assign`), then randomised restarts of greedy by size (each size scaled by
//! a draw from [0.5, 1.5), a fixed seed), as many as about 2e8 / n² for n
//! buffers (at most 64), the lowest layout kept. Its cost is quadratic in the
//! buffers (0.05-2 s on the suite's plans), paid once per plan, never inside
//! a search. It is not always close: within 1% of the plan's memory bound at
//! half the footprint, 8% and 26% over on BERT-base and GPT-2 at a quarter
//! (RESULTS.md), where a backlogged d2h stream keeps many staggered
//! activations alive across the LM head's 0.8 GB buffers. On saved plans the
//! restarts took DenseNet-121 at a quarter from 1.1% to 0.6% over the bound
//! and GPT-2 from 31% to 26%; an exact solver on the large buffers is not
//! built.
//!
//! [`lay_out_timed`] orders the placements by predicted lifetimes instead of
//! compute-stream positions; `outcore_planners::layout` uses it on plans
//! first pinned to that timeline ([`crate::pin_frees`]), so that a free the
//! prediction puts before an allocation is ordered before it.

use crate::pin::TimedStep;
use crate::plan::{AllocatorSpec, Instr, Plan};
use crate::prepared::PreparedGraph;
use crate::verify::{Buffer, NONE, VerifyScratch, Violation, ViolationKind, verify_program};
use outcore_alloc::{ALIGNMENT_BYTES, OffsetsConfig, OwnerOffsets};
use outcore_graph::{Graph, OpId, TensorId};
use std::collections::BTreeMap;
use std::fmt;

/// Why a plan could not be laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError {
    /// The plan's first violation: only a verified plan is laid out.
    pub violation: String,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "only a plan that verifies can be laid out, and this one does not: {}",
            self.violation
        )
    }
}

impl std::error::Error for LayoutError {}

/// A layout and how it compares with the plan's memory bound.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The `offsets` allocator's configuration.
    pub config: OffsetsConfig,
    /// The plan's memory bound ([`crate::MemoryBound`]), which the height is
    /// compared with (module docs).
    pub bound_bytes: u64,
    /// Buffers laid out (allocations of one iteration, scratch included).
    pub buffers: usize,
}

impl Layout {
    /// The layout's height over the memory bound (1.0: no byte lost).
    pub fn overhead(&self) -> f64 {
        if self.bound_bytes == 0 {
            1.0
        } else {
            self.config.height_bytes as f64 / self.bound_bytes as f64
        }
    }
}

/// Lays `plan` out (module docs). The plan must verify; its allocator is not
/// read (the caller sets the result as `AllocatorSpec::Offsets`).
pub fn lay_out(plan: &Plan, graph: &Graph) -> Result<Layout, LayoutError> {
    lay_out_with(plan, graph, None)
}

/// [`lay_out`], ordering the placements by the buffers' lifetimes in
/// `timeline` (the plan's predicted iteration, as [`crate::pin_frees`]
/// takes it) rather than by compute-stream positions. Which buffers may
/// share bytes still comes from the plan's order alone: the timeline only
/// chooses the order in which the greedy places them. It matters where a
/// copy stream lags the compute stream: a swap-out's free on a backlogged
/// d2h stream comes long after the compute step its copy waited for, which
/// is all a compute position can say of it (GPT-2 at a quarter: a layout
/// 31% over the memory bound by positions, RESULTS.md).
pub fn lay_out_timed(
    plan: &Plan,
    graph: &Graph,
    timeline: &[TimedStep],
) -> Result<Layout, LayoutError> {
    lay_out_with(plan, graph, Some(timeline))
}

fn lay_out_with(
    plan: &Plan,
    graph: &Graph,
    timeline: Option<&[TimedStep]>,
) -> Result<Layout, LayoutError> {
    let prepared = PreparedGraph::new(graph);
    let mut scratch = VerifyScratch::recording_resident();
    let mut violations = Vec::new();
    let bound = verify_program(graph, &prepared, plan, &mut scratch, &mut violations);
    if let Some(v) = violations.first() {
        return Err(LayoutError {
            violation: v.to_string(),
        });
    }
    let buffers = scratch.buffers();
    let slots: Vec<u64> = buffers.iter().map(|b| slot_bytes(b, plan, graph)).collect();
    let groups = groups(buffers, &prepared);
    let spans = match timeline {
        Some(timeline) => timed_spans(&groups, buffers, &scratch, timeline)?,
        None => compute_spans(&groups, buffers, &scratch),
    };
    let offsets = assign(&groups, &slots, &spans, &scratch, buffers);
    let config = config_of(buffers, &slots, &groups, &offsets, &prepared);
    Ok(Layout {
        config,
        bound_bytes: bound.peak_bytes,
        buffers: buffers.len(),
    })
}

/// `size_bytes` as the allocators round it (a multiple of 512, at least 512).
pub fn rounded(size_bytes: u64) -> u64 {
    size_bytes.max(1).div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES
}

/// The pieces of a step's scratch slot, each at an aligned offset inside it:
/// the op's workspace first (its rounded size; `None` without one), then
/// each output of a recomputation that `listed` does not keep, in the op's
/// output order, as the executor allocates them (views included: it gives
/// every such output its own bytes). A compute step's slot is its workspace.
pub fn scratch_pieces(
    graph: &Graph,
    op: OpId,
    listed: Option<&[TensorId]>,
) -> (u64, Vec<(TensorId, u64)>) {
    let o = graph.op(op);
    let workspace = if o.workspace_bytes > 0 {
        rounded(o.workspace_bytes)
    } else {
        0
    };
    let mut pieces = Vec::new();
    let mut at = workspace;
    if let Some(listed) = listed {
        for &t in &o.outputs {
            if !listed.contains(&t) {
                pieces.push((t, at));
                at += rounded(graph.tensor(t).size_bytes);
            }
        }
    }
    (at, pieces)
}

/// The bytes laid out for buffer `b`: its rounded size, or for a step's
/// scratch the room its pieces take at aligned offsets ([`scratch_pieces`]).
fn slot_bytes(b: &Buffer, plan: &Plan, graph: &Graph) -> u64 {
    let own = rounded(b.size_bytes);
    let n_tensors = graph.tensors.len();
    let Some(step) = b.owner(n_tensors).checked_sub(n_tensors as u64) else {
        return own;
    };
    let pieces = match plan.streams[0].get(step as usize).map(|s| &s.instr) {
        Some(Instr::Compute(op)) => scratch_pieces(graph, *op, None).0,
        Some(Instr::Recompute { op, outputs }) => scratch_pieces(graph, *op, Some(outputs)).0,
        _ => 0,
    };
    own.max(pieces)
}

/// Buffers that share one offset: each buffer alone, except a persistent
/// tensor's first buffer (resident from the start) and last (resident to the
/// end) when they differ (module docs).
struct Groups {
    /// Per group, its members (one or two buffer indices).
    members: Vec<Vec<usize>>,
    /// Per buffer, its group.
    group_of: Vec<usize>,
}

/// Per owner, its buffers' indices in allocation order.
fn by_owner(buffers: &[Buffer], n_tensors: usize) -> BTreeMap<u64, Vec<usize>> {
    let mut owners: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, b) in buffers.iter().enumerate() {
        owners.entry(b.owner(n_tensors)).or_default().push(i);
    }
    owners
}

/// Whether the owner's buffers `list` start and end the iteration resident
/// (so the first and last are one allocation across iterations).
fn wraps(list: &[usize], buffers: &[Buffer], prepared: &PreparedGraph) -> bool {
    let owner = buffers[list[0]].owner(prepared.n_tensors());
    let persistent = (owner as usize) < prepared.n_tensors() && prepared.persistent[owner as usize];
    persistent
        && list.len() >= 2
        && buffers[list[0]].alloc == NONE
        && buffers[list[list.len() - 1]].free_index == NONE
}

fn groups(buffers: &[Buffer], prepared: &PreparedGraph) -> Groups {
    let mut members: Vec<Vec<usize>> = Vec::with_capacity(buffers.len());
    let mut group_of = vec![usize::MAX; buffers.len()];
    for list in by_owner(buffers, prepared.n_tensors()).values() {
        let wrap = wraps(list, buffers, prepared);
        for (k, &i) in list.iter().enumerate() {
            if wrap && k + 1 == list.len() {
                group_of[i] = group_of[list[0]];
                members[group_of[i]].push(i);
            } else {
                group_of[i] = members.len();
                members.push(vec![i]);
            }
        }
    }
    Groups { members, group_of }
}

/// Whether buffers `a` and `b` may be resident at the same time.
fn conflict(a: &Buffer, b: &Buffer, scratch: &VerifyScratch) -> bool {
    !(scratch.freed_before(a, b) || scratch.freed_before(b, a))
}

fn groups_conflict(g: &[usize], h: &[usize], buffers: &[Buffer], scratch: &VerifyScratch) -> bool {
    g.iter().any(|&a| {
        h.iter()
            .any(|&b| conflict(&buffers[a], &buffers[b], scratch))
    })
}

/// Above this many buffer groups only two of the eight placements are tried
/// (greedy by size with best fit, size times lifetime with first fit): one
/// placement of NasNet-25's 30,739 buffers took about 4.6 s on the 2-core VM.
const MANY_GROUPS: usize = 8_000;

/// A group's span: its first member's start to its last member's end (a
/// wrap group spans the whole iteration), in compute-stream positions
/// ([`VerifyScratch::compute_span`]).
fn compute_spans(groups: &Groups, buffers: &[Buffer], scratch: &VerifyScratch) -> Vec<(i64, i64)> {
    groups
        .members
        .iter()
        .map(|m| {
            if m.len() > 1 {
                return (-1, i64::MAX);
            }
            scratch.compute_span(&buffers[m[0]])
        })
        .collect()
}

/// [`compute_spans`] in nanoseconds of `timeline` (the allocating step's
/// start to the freeing step's end).
fn timed_spans(
    groups: &Groups,
    buffers: &[Buffer],
    scratch: &VerifyScratch,
    timeline: &[TimedStep],
) -> Result<Vec<(i64, i64)>, LayoutError> {
    let total = scratch.n_steps();
    let mut times = vec![None; total];
    for t in timeline {
        if let Some(id) = scratch.step_id(t.at) {
            times[id] = Some((t.start_s, t.end_s));
        }
    }
    let ns = |s: f64| (s * 1e9).round() as i64;
    let time_of = |id: usize| {
        times[id].ok_or_else(|| LayoutError {
            violation: format!(
                "the timeline lacks step {id} of {total}; simulate the plan again with its timeline recorded"
            ),
        })
    };
    let mut spans = Vec::with_capacity(groups.members.len());
    for m in &groups.members {
        if m.len() > 1 {
            spans.push((-1, i64::MAX));
            continue;
        }
        let b = &buffers[m[0]];
        let start = match b.alloc {
            NONE => -1,
            id => ns(time_of(id as usize)?.0),
        };
        let end = match scratch.free_id(b) {
            None => i64::MAX,
            Some(id) => ns(time_of(id)?.1),
        };
        spans.push((start, end));
    }
    Ok(spans)
}

/// Each group's offset: greedy placement (module docs) in four orders, each
/// at the smallest gap that holds it (best fit) and at the lowest (first
/// fit), then the randomised restarts; the lowest layout kept (ties to the
/// first). The orders: largest first (TensorFlow Lite's greedy by size), by allocation
/// time (what an allocator that knew every lifetime would do online), by size
/// times lifetime (long, large buffers first), and latest end first. No one
/// of them is lowest everywhere: on an LSTM swapping plan greedy by size was
/// 5% over the memory bound and the best of the others 0.01%; on DenseNet-121
/// at 25% size times lifetime with first fit was lowest (RESULTS.md).
fn assign(
    groups: &Groups,
    slots: &[u64],
    spans: &[(i64, i64)],
    scratch: &VerifyScratch,
    buffers: &[Buffer],
) -> Vec<u64> {
    let size = |g: usize| {
        groups.members[g]
            .iter()
            .map(|&i| slots[i])
            .max()
            .unwrap_or(ALIGNMENT_BYTES)
    };
    let sizes: Vec<u64> = (0..groups.members.len()).map(size).collect();
    let length = |g: usize| {
        let (a, b) = spans[g];
        b.saturating_sub(a).max(1) as u128
    };
    let n = sizes.len();
    let mut by_size: Vec<usize> = (0..n).collect();
    by_size.sort_by_key(|&g| (std::cmp::Reverse(sizes[g]), spans[g].0));
    let mut by_start: Vec<usize> = (0..n).collect();
    by_start.sort_by_key(|&g| (spans[g].0, std::cmp::Reverse(sizes[g])));
    let mut by_area: Vec<usize> = (0..n).collect();
    by_area.sort_by_key(|&g| std::cmp::Reverse(sizes[g] as u128 * length(g)));
    let mut by_end: Vec<usize> = (0..n).collect();
    by_end.sort_by_key(|&g| (std::cmp::Reverse(spans[g].1), std::cmp::Reverse(sizes[g])));
    // Each variant costs a quadratic pass: on large plans only two are tried.
    let variants: Vec<(&[usize], bool)> = if n > MANY_GROUPS {
        vec![(&by_size, false), (&by_area, true)]
    } else {
        [&by_size, &by_start, &by_area, &by_end]
            .into_iter()
            .flat_map(|o| [(o.as_slice(), false), (o.as_slice(), true)])
            .collect()
    };
    let mut best: Option<(u64, Vec<u64>)> = None;
    let mut keep = |offsets: Vec<u64>| {
        let height = (0..n).map(|g| offsets[g] + sizes[g]).max().unwrap_or(0);
        if best.as_ref().is_none_or(|(h, _)| height < *h) {
            best = Some((height, offsets));
        }
    };
    for (order, lowest) in variants {
        keep(place(order, &sizes, groups, scratch, buffers, lowest));
    }
    // Restarts: greedy by size with each size scaled by a factor drawn
    // from [0.5, 1.5), first and best fit in turn (module docs).
    let mut rng = XorShift(RESTART_SEED);
    let mut order: Vec<usize> = (0..n).collect();
    for k in 0..restarts(n) {
        let keys: Vec<f64> = sizes
            .iter()
            .map(|&s| s as f64 * (0.5 + rng.unit()))
            .collect();
        order.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]).then(a.cmp(&b)));
        keep(place(&order, &sizes, groups, scratch, buffers, k % 2 == 0));
    }
    best.map(|(_, offsets)| offsets).unwrap_or_default()
}

/// The seed of the restarts' draws: fixed, so a plan's layout is the same
/// on every run.
const RESTART_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// How many randomised restarts follow the eight orders for `n` groups:
/// about 2e8 / n² (each placement is quadratic), at most 64: 61 on GPT-2's
/// 1,777 buffers (about 0.01 s each on the 2-core VM), 16 on DenseNet-121's
/// 3,469, none above 14,142.
fn restarts(n: usize) -> usize {
    let n = n.max(1) as u128;
    (200_000_000 / (n * n)).min(64) as usize
}

/// A xorshift64 generator: the restarts need cheap, reproducible draws,
/// not statistical quality.
struct XorShift(u64);

impl XorShift {
    /// A draw in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Places the groups in `order`, each at the smallest gap (`lowest`: the
/// lowest gap) that holds it between the groups already placed that it
/// conflicts with.
fn place(
    order: &[usize],
    sizes: &[u64],
    groups: &Groups,
    scratch: &VerifyScratch,
    buffers: &[Buffer],
    lowest: bool,
) -> Vec<u64> {
    let mut offsets = vec![0u64; sizes.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(sizes.len());
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for &g in order {
        taken.clear();
        for &p in &placed {
            if groups_conflict(&groups.members[g], &groups.members[p], buffers, scratch) {
                taken.push((offsets[p], offsets[p] + sizes[p]));
            }
        }
        offsets[g] = if lowest {
            lowest_gap(&mut taken, sizes[g])
        } else {
            smallest_gap(&mut taken, sizes[g])
        };
        placed.push(g);
    }
    offsets
}

/// The start of the lowest gap between the ranges `taken` that holds `size`
/// bytes (first fit), or the end of the highest range if none does.
fn lowest_gap(taken: &mut [(u64, u64)], size: u64) -> u64 {
    taken.sort_unstable();
    let mut cursor = 0u64;
    for &(start, end) in taken.iter() {
        if start >= cursor.saturating_add(size) {
            return cursor;
        }
        cursor = cursor.max(end);
    }
    cursor
}

/// The start of the smallest gap between the ranges `taken` that holds
/// `size` bytes, or the end of the highest range if none does (the lowest
/// such start on ties).
fn smallest_gap(taken: &mut [(u64, u64)], size: u64) -> u64 {
    taken.sort_unstable();
    let mut best: Option<(u64, u64)> = None; // (gap bytes, start)
    let mut cursor = 0u64;
    for &(start, end) in taken.iter() {
        if start > cursor {
            let gap = start - cursor;
            if gap >= size && best.is_none_or(|(b, _)| gap < b) {
                best = Some((gap, cursor));
            }
        }
        cursor = cursor.max(end);
    }
    best.map_or(cursor, |(_, start)| start)
}

/// The allocator's configuration: per owner, its offsets in the order the
/// simulator and the executor allocate it ([`outcore_alloc::offsets`]).
fn config_of(
    buffers: &[Buffer],
    slots: &[u64],
    groups: &Groups,
    offsets: &[u64],
    prepared: &PreparedGraph,
) -> OffsetsConfig {
    let mut owners = Vec::new();
    let mut height_bytes = 0u64;
    for (owner, list) in by_owner(buffers, prepared.n_tensors()) {
        let at = |i: usize| offsets[groups.group_of[i]];
        let size_bytes = list
            .iter()
            .map(|&i| slots[i])
            .max()
            .unwrap_or(ALIGNMENT_BYTES);
        for &i in &list {
            height_bytes = height_bytes.max(at(i) + size_bytes);
        }
        let (initial_offset_bytes, inner) = if starts_allocated(&list, buffers, prepared) {
            (Some(at(list[0])), &list[1..])
        } else {
            (None, &list[..])
        };
        owners.push(OwnerOffsets {
            id: owner,
            size_bytes,
            initial_offset_bytes,
            offsets_bytes: inner.iter().map(|&i| at(i)).collect(),
        });
    }
    OffsetsConfig {
        height_bytes,
        owners,
    }
}

/// Whether the owner's first buffer is allocated once before the first
/// iteration (a persistent tensor resident from the start) rather than in
/// each iteration (batch inputs arrive with every batch).
fn starts_allocated(list: &[usize], buffers: &[Buffer], prepared: &PreparedGraph) -> bool {
    let owner = buffers[list[0]].owner(prepared.n_tensors()) as usize;
    owner < prepared.n_tensors() && prepared.persistent[owner] && buffers[list[0]].alloc == NONE
}

/// The violations of `plan`'s `offsets` layout, if it has one: an allocation
/// the layout does not place as the plan makes it, or two buffers that may
/// be resident together at overlapping addresses. `scratch` holds the plan's
/// verified walk.
pub(crate) fn layout_violations(
    plan: &Plan,
    prepared: &PreparedGraph,
    scratch: &VerifyScratch,
) -> Vec<Violation> {
    let AllocatorSpec::Offsets(config) = &plan.allocator else {
        return Vec::new();
    };
    let bad = |reason: String| Violation {
        at: None,
        kind: ViolationKind::Layout { reason },
    };
    let buffers = scratch.buffers();
    let by_id: BTreeMap<u64, &OwnerOffsets> = config.owners.iter().map(|o| (o.id, o)).collect();
    // Each buffer's range, from the layout.
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(buffers.len());
    for (owner, list) in by_owner(buffers, prepared.n_tensors()) {
        let Some(o) = by_id.get(&owner) else {
            return vec![bad(format!("allocation {owner} is not in the layout"))];
        };
        let initial = starts_allocated(&list, buffers, prepared);
        let inner = if initial { &list[1..] } else { &list[..] };
        if o.initial_offset_bytes.is_some() != initial || o.offsets_bytes.len() != inner.len() {
            return vec![bad(format!(
                "allocation {owner} is made {} time(s) per iteration{}; the layout has {}{}",
                inner.len(),
                if initial {
                    " after one before the first"
                } else {
                    ""
                },
                o.offsets_bytes.len(),
                if o.initial_offset_bytes.is_some() {
                    " and one before the first"
                } else {
                    ""
                },
            ))];
        }
        let offsets = o.initial_offset_bytes.iter().chain(&o.offsets_bytes);
        for (&i, &offset) in list.iter().zip(offsets) {
            if rounded(buffers[i].size_bytes) > o.size_bytes {
                return vec![bad(format!(
                    "allocation {owner} needs {} bytes; the layout reserves {}",
                    buffers[i].size_bytes, o.size_bytes
                ))];
            }
            ranges.push((offset, offset + o.size_bytes, i));
        }
        if wraps(&list, buffers, prepared)
            && o.initial_offset_bytes != o.offsets_bytes.last().copied()
        {
            return vec![bad(format!(
                "allocation {owner} ends the iteration at another offset than it starts it; the next iteration would find it elsewhere"
            ))];
        }
    }
    if let Some(&(_, end, i)) = ranges.iter().max_by_key(|r| r.1)
        && end > plan.budget_bytes
    {
        return vec![bad(format!(
            "allocation {} ends at byte {end}, past the budget of {} bytes",
            buffers[i].owner(prepared.n_tensors()),
            plan.budget_bytes
        ))];
    }
    // Sweep by start address: each range against the later-starting ones it
    // overlaps in address.
    ranges.sort_unstable();
    let mut out = Vec::new();
    for (k, &(_, end, i)) in ranges.iter().enumerate() {
        for &(start2, _, j) in &ranges[k + 1..] {
            if start2 >= end {
                break;
            }
            let (a, b) = (&buffers[i], &buffers[j]);
            // A tensor's own buffers are ordered (one is freed before the
            // next is made), so only a wrong layout makes this conflict.
            if conflict(a, b, scratch) {
                out.push(bad(format!(
                    "allocations {} and {} may be resident at once at overlapping addresses",
                    a.owner(prepared.n_tensors()),
                    b.owner(prepared.n_tensors())
                )));
                if out.len() >= 10 {
                    return out;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_gap_that_fits_wins_else_the_top() {
        // Gaps: [0, 100) of 100, [300, 350) of 50, then the top at 500.
        let mut taken = vec![(350, 500), (100, 300)];
        assert_eq!(smallest_gap(&mut taken, 40), 300);
        assert_eq!(smallest_gap(&mut taken, 60), 0);
        assert_eq!(smallest_gap(&mut taken, 101), 500);
        assert_eq!(smallest_gap(&mut [], 7), 0);
    }

    #[test]
    fn sizes_round_as_the_allocators_do() {
        assert_eq!(rounded(0), 512);
        assert_eq!(rounded(512), 512);
        assert_eq!(rounded(513), 1024);
    }
}
