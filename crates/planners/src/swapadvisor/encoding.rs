//! SwapAdvisor's memory-allocation chromosome (paper 000, Sec. 5.3): the
//! `CLS` / `CNT` lists over `TS`, the sorted distinct allocation sizes of the
//! graph, and the operators the genetic algorithm applies to them: one-point
//! crossover with repair (Fig. 5a), crossover of the extended counts
//! `CNT_EXT` averaged back per class (Fig. 5b), the count repair that takes
//! the excess memory off every class inversely to its size, and mutation
//! (+-1 shifts of `CLS`, Gaussian counts). [`PoolModel`] is the pool an
//! encoding describes, exactly as `outcore_alloc::SizeClassPool` builds it
//! (class sizes rounded up to 512 B, classes of equal rounded size merged),
//! so that the swap planner plans for the allocator the plan runs under.
//!
//! Choices where the paper is vague (each also said where it is made):
//! - `TS` holds every size the simulator allocates: storage-owning tensors and
//!   op workspaces (MXNet's pool also serves workspace); a zero-byte tensor
//!   takes an object of the smallest class, as the pool does.
//! - `CLS` repair after crossover shifts the whole tail taken from the second
//!   parent by one constant, the least change that makes the junction valid:
//!   up when it steps down (the paper's example, `[1,2,1,1]` -> `[1,2,2,2]`),
//!   down when it jumps by more than one (the paper does not say; increasing
//!   cannot repair a jump). The tail keeps its own steps.
//! - Averaged counts are rounded to the nearest integer (halves up).
//! - Counts are kept within `[min, max]` per class: `min` is the most objects of
//!   the class a single op needs at once (its operands, outputs and workspace),
//!   so that every op can run at all; `max` is how many buffers of the class
//!   the graph has (one workspace at a time), beyond which objects are never
//!   used. When even the minimum pool exceeds the budget the individual is
//!   infeasible (scored, not dropped).
//! - The count repair removes `ceil(excess / (k * size_c))` objects from each of
//!   the `k` classes still above their floor, repeatedly until the pool fits
//!   (the paper's example: `[8, 3]` over 1 MB and 4 MB classes with 12 MB
//!   becomes `[4, 2]`). Taking equal bytes from every class empties the classes
//!   of small tensors (biases, norms) first, though they cost next to nothing:
//!   at `min` a swap-in finds no object, since the op before still holds its
//!   operands. So each class has a soft floor (see [`Bounds`]: what two
//!   consecutive ops of the individual's order hold at once, plus batch
//!   inputs and step outputs of the class, which nothing evicts), never
//!   raising a count already below it; while the pool still does not fit,
//!   every floor moves a quarter of the way to `min`, then another.
//! - A repaired pool that leaves part of the budget unused is filled: the
//!   spare bytes go to the classes largest first, each up to its `max`
//!   ([`fill_largest`]). The paper repairs only a pool over the capacity;
//!   averaged and Gaussian-mutated counts then drift below it, and the
//!   unused bytes hold nothing: WResNet-152-10's best pool after a 30 s
//!   search held 13.5 of its 16 GiB. Largest first because a swap of a large
//!   tensor is what costs link time; shares in proportion to each class's
//!   bytes were measured too. `swapadvisor_search <model> 30` on the five
//!   Fig. 6 models (2-core VM, 2026-11-30; no fill / largest first /
//!   proportional): RNN-8-8K 0.890 / 0.902 / 0.903, BRNN-4-8K 0.705 / 0.716 /
//!   0.724, Inception-4 0.824 / 0.849 / 0.840, NasNet-25 0.187 / 0.188 /
//!   0.189, WResNet-152-10 0.909 / 0.938 / 0.931 of ideal.
//! - `CLS[0]` is never mutated (shifting the whole list changes no class);
//!   a mutated `CLS` keeps the counts through the extended counts, as crossover.
//! - A mutated count is drawn from a Gaussian with the count as mean and a
//!   standard deviation of a fifth of it (at least one object), rounded.

use outcore_alloc::{ALIGNMENT_BYTES, SizeClassConfig, SizeClassEncoding};
use outcore_graph::{Graph, OpId};
use rand::Rng;

/// The allocation part of a chromosome: `CLS` and `CNT` over a shared `TS`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AllocGene {
    /// Class of each size in `TS`: starts at 0 or 1, steps of 0 or 1.
    pub cls: Vec<u32>,
    /// Objects per class, in class order (`max(CLS) - CLS[0] + 1` entries).
    pub cnt: Vec<u64>,
}

/// `TS`: the sorted distinct sizes the simulator allocates for `graph` (storage
/// owners and op workspaces), zero excluded.
pub fn tensor_sizes(graph: &Graph) -> Vec<u64> {
    let owners = graph
        .tensors
        .iter()
        .filter(|t| t.allocates())
        .map(|t| t.size_bytes);
    let workspaces = graph.ops.iter().map(|o| o.workspace_bytes);
    SizeClassEncoding::distinct_sizes(owners.chain(workspaces).filter(|&s| s > 0))
}

/// Class index (from 0) of every `TS` entry.
pub fn class_of_sizes(cls: &[u32]) -> Vec<usize> {
    let first = cls.first().copied().unwrap_or(0);
    cls.iter()
        .map(|&c| c.saturating_sub(first) as usize)
        .collect()
}

/// Number of classes of a `CLS` list.
pub fn n_classes(cls: &[u32]) -> usize {
    match (cls.first(), cls.last()) {
        (Some(&f), Some(&l)) => (l.saturating_sub(f)) as usize + 1,
        _ => 0,
    }
}

/// A `CLS` over `n_sizes` sizes with the `m` largest in one class and every
/// other size in a class of its own (`m` of 0 or 1: one class per size).
pub fn top_merged(n_sizes: usize, m: usize) -> Vec<u32> {
    let own = n_sizes.saturating_sub(m.max(1));
    (0..n_sizes).map(|i| i.min(own) as u32).collect()
}

/// Whether `cls` is a valid `CLS` (starts at 0 or 1, steps of 0 or 1).
pub fn cls_valid(cls: &[u32]) -> bool {
    cls.first().is_some_and(|&f| f <= 1) && cls.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1)
}

/// The object size of each class: the largest `TS` entry mapped to it.
pub fn class_sizes(ts: &[u64], cls: &[u32]) -> Vec<u64> {
    let mut sizes = vec![0u64; n_classes(cls)];
    for (i, k) in class_of_sizes(cls).into_iter().enumerate() {
        sizes[k] = sizes[k].max(ts[i]);
    }
    sizes
}

/// A class size as the pool reserves it (rounded up to the alignment).
pub fn rounded(size_bytes: u64) -> u64 {
    size_bytes
        .div_ceil(ALIGNMENT_BYTES)
        .saturating_mul(ALIGNMENT_BYTES)
}

/// Bytes the pool reserves (saturating).
pub fn pool_bytes(class_sizes: &[u64], cnt: &[u64]) -> u64 {
    class_sizes.iter().zip(cnt).fold(0u64, |acc, (&s, &c)| {
        acc.saturating_add(rounded(s).saturating_mul(c))
    })
}

/// `CNT_EXT`: the count of the class of each `TS` entry (Fig. 5b).
pub fn extend_counts(cls: &[u32], cnt: &[u64]) -> Vec<u64> {
    class_of_sizes(cls)
        .into_iter()
        .map(|k| cnt.get(k).copied().unwrap_or(0))
        .collect()
}

/// `CNT` from extended counts: the rounded mean over each class's sizes (Fig. 5b).
pub fn collapse_counts(cls: &[u32], ext: &[u64]) -> Vec<u64> {
    let k = n_classes(cls);
    let mut sum = vec![0u128; k];
    let mut n = vec![0u128; k];
    for (i, c) in class_of_sizes(cls).into_iter().enumerate() {
        sum[c] += ext[i] as u128;
        n[c] += 1;
    }
    sum.iter()
        .zip(&n)
        .map(|(&s, &m)| {
            if m == 0 {
                0
            } else {
                u64::try_from((2 * s + m) / (2 * m)).unwrap_or(u64::MAX)
            }
        })
        .collect()
}

/// One-point crossover of two `CLS` lists at `cr` (1 <= cr < len), each
/// child repaired (Fig. 5a): `(CLS2[..cr] ++ CLS1[cr..], CLS1[..cr] ++ CLS2[cr..])`.
pub fn crossover_cls(cls1: &[u32], cls2: &[u32], cr: usize) -> (Vec<u32>, Vec<u32>) {
    (join_cls(cls2, cls1, cr), join_cls(cls1, cls2, cr))
}

/// `head[..cr] ++ tail[cr..]`, the tail shifted by the least constant that
/// makes the junction a step of 0 or 1 (module doc).
pub fn join_cls(head: &[u32], tail: &[u32], cr: usize) -> Vec<u32> {
    let cr = cr.min(head.len()).min(tail.len());
    let mut out: Vec<u32> = head[..cr].to_vec();
    let Some(&last) = out.last() else {
        return tail.to_vec();
    };
    let Some(&first_tail) = tail.get(cr) else {
        return out;
    };
    let shift: i64 = if first_tail < last {
        last as i64 - first_tail as i64
    } else if first_tail > last + 1 {
        (last + 1) as i64 - first_tail as i64
    } else {
        0
    };
    out.extend(tail[cr..].iter().map(|&c| (c as i64 + shift).max(0) as u32));
    out
}

/// Crossover of two allocation genes at `cr` (Fig. 5): the `CLS` children of
/// [`crossover_cls`], and their counts from the crossed extended counts.
pub fn crossover_alloc(a: &AllocGene, b: &AllocGene, cr: usize) -> (AllocGene, AllocGene) {
    let (cls1, cls2) = crossover_cls(&a.cls, &b.cls, cr);
    let (ext_a, ext_b) = (extend_counts(&a.cls, &a.cnt), extend_counts(&b.cls, &b.cnt));
    let cr = cr.min(ext_a.len());
    let ext1: Vec<u64> = ext_b[..cr].iter().chain(&ext_a[cr..]).copied().collect();
    let ext2: Vec<u64> = ext_a[..cr].iter().chain(&ext_b[cr..]).copied().collect();
    (
        AllocGene {
            cnt: collapse_counts(&cls1, &ext1),
            cls: cls1,
        },
        AllocGene {
            cnt: collapse_counts(&cls2, &ext2),
            cls: cls2,
        },
    )
}

/// Per graph, what bounds the object counts of any class (see [`Bounds`]).
#[derive(Debug, Clone)]
pub struct SizeDemand {
    /// Per op, the buffers it needs at once (its storage owners by tensor id,
    /// its workspace as `n_tensors + op`), as compressed rows; the first
    /// `op_old[op]` of a row exist before the op runs, the rest it allocates.
    op_start: Vec<u32>,
    op_items: Vec<u32>,
    op_old: Vec<u32>,
    /// Per buffer id: its `TS` index (`u32::MAX`: zero bytes, which take an
    /// object of the smallest class).
    ts_of: Vec<u32>,
    /// Per `TS` entry: how many buffers of that size the graph has (workspaces
    /// count once: one runs at a time).
    buffers: Vec<u64>,
    /// Per `TS` entry: batch inputs and step outputs (never evicted).
    pinned: Vec<u64>,
    /// Zero-byte buffers the graph has.
    zero_buffers: u64,
}

/// Count bounds of each class (see the module doc): `min`, the most objects
/// one op needs at once; `soft`, the most two consecutive ops of an order
/// hold together (a swap-in for an op needs its object while the op before
/// still holds its own) plus the buffers nothing evicts; `max`, the buffers
/// the graph has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    pub min: Vec<u64>,
    pub soft: Vec<u64>,
    pub max: Vec<u64>,
}

const ZERO: u32 = u32::MAX;

impl SizeDemand {
    pub fn new(graph: &Graph, ts: &[u64]) -> Self {
        let index = |s: u64| ts.binary_search(&s).map_or(ZERO, |i| i as u32);
        let n_t = graph.tensors.len();
        let mut ts_of: Vec<u32> = graph.tensors.iter().map(|t| index(t.size_bytes)).collect();
        let mut buffers = vec![0u64; ts.len()];
        let mut pinned = vec![0u64; ts.len()];
        let mut zero_buffers = 0u64;
        let output_storage = graph.output_storage();
        for t in graph.tensors.iter().filter(|t| t.allocates()) {
            match ts_of[t.id.index()] {
                ZERO => zero_buffers += 1,
                i => {
                    buffers[i as usize] += 1;
                    let batch_input = t.producer.is_none() && !t.is_persistent();
                    if batch_input || output_storage[t.id.index()] {
                        pinned[i as usize] += 1;
                    }
                }
            }
        }
        let mut ws_seen = vec![false; ts.len()];
        let mut op_start = vec![0u32];
        let mut op_items = Vec::new();
        let mut op_old = Vec::with_capacity(graph.ops.len());
        for op in &graph.ops {
            let mut old: Vec<u32> = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .filter(|&&t| !graph.tensor(t).allocates() || op.inputs.contains(&t))
                .map(|&t| graph.storage_owner(t).0)
                .collect();
            old.sort_unstable();
            old.dedup();
            let mut new: Vec<u32> = op
                .outputs
                .iter()
                .filter(|&&t| graph.tensor(t).allocates())
                .map(|&t| t.0)
                .filter(|t| old.binary_search(t).is_err())
                .collect();
            new.sort_unstable();
            new.dedup();
            op_old.push(old.len() as u32);
            op_items.extend(old);
            op_items.extend(new);
            let ws = index(op.workspace_bytes);
            ts_of.push(ws);
            if ws != ZERO {
                op_items.push((n_t + op.id.index()) as u32);
                if !std::mem::replace(&mut ws_seen[ws as usize], true) {
                    buffers[ws as usize] += 1;
                }
            }
            op_start.push(op_items.len() as u32);
        }
        SizeDemand {
            op_start,
            op_items,
            op_old,
            ts_of,
            buffers,
            pinned,
            zero_buffers,
        }
    }

    fn items(&self, op: OpId) -> &[u32] {
        &self.op_items[self.op_start[op.index()] as usize..self.op_start[op.index() + 1] as usize]
    }

    /// The buffers that exist before `op` runs (its inputs).
    fn old_items(&self, op: OpId) -> &[u32] {
        &self.items(op)[..self.op_old[op.index()] as usize]
    }

    /// The count bounds of each class of `cls`, the soft floor for `order`.
    pub fn bounds(&self, cls: &[u32], order: &[OpId]) -> Bounds {
        let class_of = class_of_sizes(cls);
        let k = n_classes(cls);
        if k == 0 {
            return Bounds {
                min: Vec::new(),
                soft: Vec::new(),
                max: Vec::new(),
            };
        }
        let class = |buffer: u32| match self.ts_of[buffer as usize] {
            ZERO => 0,
            i => class_of[i as usize],
        };
        let mut max = vec![0u64; k];
        let mut pinned = vec![0u64; k];
        for (i, &c) in class_of.iter().enumerate() {
            max[c] += self.buffers[i];
            pinned[c] += self.pinned[i];
        }
        max[0] += self.zero_buffers;
        let mut min = vec![1u64; k];
        let mut pair = vec![0u64; k];
        let mut here = vec![0u64; k];
        let mut stamp = vec![u32::MAX; self.ts_of.len()];
        for (pos, &op) in order.iter().enumerate() {
            for &b in self.items(op) {
                here[class(b)] += 1;
            }
            for &b in self.items(op) {
                let c = class(b);
                min[c] = min[c].max(here[c]);
            }
            for &b in self.items(op) {
                here[class(b)] = 0;
            }
            // A swap-in for this op needs its object while the op before
            // still holds its buffers: the previous op's buffers and this
            // op's inputs, together.
            let prev: &[u32] = if pos > 0 {
                self.items(order[pos - 1])
            } else {
                &[]
            };
            for &b in prev {
                stamp[b as usize] = pos as u32;
                here[class(b)] += 1;
            }
            for &b in self.old_items(op) {
                if stamp[b as usize] != pos as u32 {
                    here[class(b)] += 1;
                }
            }
            for &b in prev.iter().chain(self.old_items(op)) {
                let c = class(b);
                pair[c] = pair[c].max(here[c]);
            }
            for &b in prev.iter().chain(self.old_items(op)) {
                here[class(b)] = 0;
            }
        }
        for c in 0..k {
            max[c] = max[c].max(min[c]);
        }
        let soft = (0..k)
            .map(|c| (pair[c].max(min[c]) + pinned[c]).min(max[c]))
            .collect();
        Bounds { min, soft, max }
    }
}

impl SizeDemand {
    /// A `CLS` for the seed: from one class per size, adjacent classes merge,
    /// the merge that saves the most bytes of the soft pool (see [`Bounds`])
    /// first (a merged class holds its larger size, and as many objects as
    /// two consecutive ops hold of both at once), until the soft pool is at
    /// most `target_bytes` or no merge saves anything.
    pub fn coarsen(&self, ts: &[u64], order: &[OpId], target_bytes: u64) -> Vec<u32> {
        let mut cls: Vec<u32> = (0..ts.len() as u32).collect();
        loop {
            let k = n_classes(&cls);
            if k < 2 {
                return cls;
            }
            let sizes: Vec<u64> = class_sizes(ts, &cls).iter().map(|&s| rounded(s)).collect();
            let soft = self.bounds(&cls, order).soft;
            if pool_bytes(&sizes, &soft) <= target_bytes {
                return cls;
            }
            let merged = self.adjacent_pair_soft(&cls, order);
            let best = (0..k - 1)
                .map(|c| {
                    let before = soft[c] as u128 * sizes[c] as u128
                        + soft[c + 1] as u128 * sizes[c + 1] as u128;
                    let after = merged[c] as u128 * sizes[c + 1] as u128;
                    (before.saturating_sub(after), c)
                })
                .filter(|&(saved, _)| saved > 0)
                .max_by_key(|&(saved, c)| (saved, std::cmp::Reverse(c)));
            let Some((_, c)) = best else {
                return cls;
            };
            let first = cls[0];
            for x in cls.iter_mut() {
                if *x - first > c as u32 {
                    *x -= 1;
                }
            }
        }
    }

    /// For each class `c` of `cls`, the soft floor classes `c` and `c + 1`
    /// would have merged: the most buffers of both that one op, or two
    /// consecutive ops of `order` (the first's buffers and the second's
    /// inputs), hold at once, plus the pinned buffers of both.
    fn adjacent_pair_soft(&self, cls: &[u32], order: &[OpId]) -> Vec<u64> {
        let class_of = class_of_sizes(cls);
        let k = n_classes(cls);
        let class = |buffer: u32| match self.ts_of[buffer as usize] {
            ZERO => 0,
            i => class_of[i as usize],
        };
        let mut pinned = vec![0u64; k];
        for (i, &c) in class_of.iter().enumerate() {
            pinned[c] += self.pinned[i];
        }
        let mut most = vec![1u64; k];
        let mut here = vec![0u64; k];
        let mut stamp = vec![u32::MAX; self.ts_of.len()];
        let note = |here: &[u64], touched: &mut dyn Iterator<Item = usize>, most: &mut [u64]| {
            for c in touched {
                let next = here.get(c + 1).copied().unwrap_or(0);
                most[c] = most[c].max(here[c] + next);
                if c > 0 {
                    most[c - 1] = most[c - 1].max(here[c - 1] + here[c]);
                }
            }
        };
        for (pos, &op) in order.iter().enumerate() {
            // One op's buffers.
            for &b in self.items(op) {
                here[class(b)] += 1;
            }
            note(
                &here,
                &mut self.items(op).iter().map(|&b| class(b)),
                &mut most,
            );
            for &b in self.items(op) {
                here[class(b)] = 0;
            }
            // The previous op's buffers with this op's inputs.
            let prev: &[u32] = if pos > 0 {
                self.items(order[pos - 1])
            } else {
                &[]
            };
            for &b in prev {
                stamp[b as usize] = pos as u32;
                here[class(b)] += 1;
            }
            for &b in self.old_items(op) {
                if stamp[b as usize] != pos as u32 {
                    here[class(b)] += 1;
                }
            }
            let both = || prev.iter().chain(self.old_items(op)).map(|&b| class(b));
            note(&here, &mut both(), &mut most);
            for c in both() {
                here[c] = 0;
            }
        }
        (0..k)
            .map(|c| most[c] + pinned[c] + pinned.get(c + 1).copied().unwrap_or(0))
            .collect()
    }
}

/// The count repair (module doc): counts clamped to `[min, max]`, then the
/// excess over `budget_bytes` taken off the classes still above their minimum,
/// each in inverse proportion to its object size. Returns whether the pool
/// fits the budget.
pub fn repair_cnt(
    class_sizes: &[u64],
    cnt: &mut [u64],
    min: &[u64],
    max: &[u64],
    budget_bytes: u64,
) -> bool {
    for (c, (&lo, &hi)) in cnt.iter_mut().zip(min.iter().zip(max)) {
        *c = (*c).clamp(lo, hi.max(lo));
    }
    loop {
        let bytes = pool_bytes(class_sizes, cnt);
        if bytes <= budget_bytes {
            return true;
        }
        let excess = (bytes - budget_bytes) as u128;
        let reducible: Vec<usize> = (0..cnt.len()).filter(|&k| cnt[k] > min[k]).collect();
        if reducible.is_empty() {
            return false;
        }
        let share = reducible.len() as u128;
        for k in reducible {
            let size = rounded(class_sizes[k]).max(1) as u128;
            let drop = excess.div_ceil(share * size);
            let drop = u64::try_from(drop).unwrap_or(u64::MAX);
            cnt[k] = cnt[k].saturating_sub(drop).max(min[k]);
        }
    }
}

/// The repair of the module doc: the paper's repair with each class floored
/// between `min` and its soft floor (never above its count); while the pool
/// does not fit, the floors move towards `min` in quarters.
pub fn repair_counts(class_sizes: &[u64], cnt: &mut [u64], b: &Bounds, budget_bytes: u64) -> bool {
    for (c, (&lo, &hi)) in cnt.iter_mut().zip(b.min.iter().zip(&b.max)) {
        *c = (*c).clamp(lo, hi.max(lo));
    }
    for quarters in (0..=4u64).rev() {
        let floor: Vec<u64> = cnt
            .iter()
            .zip(b.soft.iter().zip(&b.min))
            .map(|(&c, (&soft, &lo))| {
                let f = lo + soft.saturating_sub(lo) * quarters / 4;
                c.min(f).max(lo)
            })
            .collect();
        if repair_cnt(class_sizes, cnt, &floor, &b.max, budget_bytes) {
            return true;
        }
    }
    false
}

/// `gene`'s counts repaired to `bounds` (its `CLS`'s bounds) and the budget,
/// then the spare budget filled ([`repair_counts`], [`fill_largest`]):
/// whether the repaired pool fits the budget (unfilled when it does not).
pub fn repair_and_fill(
    ts: &[u64],
    gene: &mut AllocGene,
    bounds: &Bounds,
    budget_bytes: u64,
) -> bool {
    let sizes = class_sizes(ts, &gene.cls);
    gene.cnt.resize(bounds.min.len(), 0);
    let fits = repair_counts(&sizes, &mut gene.cnt, bounds, budget_bytes);
    if fits {
        fill_largest(&sizes, &mut gene.cnt, &bounds.max, budget_bytes);
    }
    fits
}

/// The fill of the module doc: the budget the pool leaves unused given to
/// the classes largest first, each gaining objects while one fits and it is
/// below its maximum (`max`). Never removes an object.
pub fn fill_largest(class_sizes: &[u64], cnt: &mut [u64], max: &[u64], budget_bytes: u64) {
    let mut spare = budget_bytes.saturating_sub(pool_bytes(class_sizes, cnt));
    for k in (0..cnt.len()).rev() {
        let size = rounded(class_sizes[k]).max(1);
        let room = max[k].saturating_sub(cnt[k]);
        let extra = (spare / size).min(room);
        cnt[k] += extra;
        spare -= extra * size;
    }
}

/// `CLS` mutation (Sec. 5.3): each entry after the first, with probability
/// `p`, steps up by one if it equals its predecessor or down by one if it is
/// one greater, and every later entry moves with it.
pub fn mutate_cls(cls: &mut [u32], p: f64, rng: &mut impl Rng) {
    for i in 1..cls.len() {
        if !rng.random_bool(p) {
            continue;
        }
        let up = cls[i] == cls[i - 1];
        for c in &mut cls[i..] {
            *c = if up { *c + 1 } else { c.saturating_sub(1) };
        }
    }
}

/// `CNT` mutation (Sec. 5.3): each count, with probability `p`, drawn from a
/// Gaussian around it (module doc), at least zero.
pub fn mutate_cnt(cnt: &mut [u64], p: f64, rng: &mut impl Rng) {
    for c in cnt.iter_mut() {
        if !rng.random_bool(p) {
            continue;
        }
        let mean = *c as f64;
        let sd = (mean / 5.0).max(1.0);
        let drawn = (mean + sd * standard_normal(rng)).round();
        *c = if drawn <= 0.0 { 0 } else { drawn as u64 };
    }
}

/// A standard normal draw (Box-Muller), so that no distribution crate is needed.
pub fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Mutates an allocation gene with probability `p` per entry: `CLS` first,
/// the counts carried to the new classes through the extended counts, then
/// `CNT`.
pub fn mutate_alloc(gene: &mut AllocGene, p: f64, rng: &mut impl Rng) {
    let ext = extend_counts(&gene.cls, &gene.cnt);
    mutate_cls(&mut gene.cls, p, rng);
    gene.cnt = collapse_counts(&gene.cls, &ext);
    mutate_cnt(&mut gene.cnt, p, rng);
}

/// A random `CLS` from 0: each step is 1 with a probability drawn once per
/// list, uniformly in [0, 1], so that pools from one class to one class per
/// size are all drawn (with a fixed one half, nearly every list would have
/// about `n / 2` classes).
pub fn random_cls(n: usize, rng: &mut impl Rng) -> Vec<u32> {
    let mut cls = Vec::with_capacity(n);
    let mut c = 0u32;
    let step = rng.random::<f64>();
    for i in 0..n {
        if i > 0 && rng.random_bool(step) {
            c += 1;
        }
        cls.push(c);
    }
    cls
}

/// Random counts: each class's soft floor, then the rest of the budget shared
/// among the classes by random weights (capped at each class's maximum).
pub fn random_cnt(
    class_sizes: &[u64],
    b: &Bounds,
    budget_bytes: u64,
    rng: &mut impl Rng,
) -> Vec<u64> {
    let (min, max) = (&b.soft, &b.max);
    let mut cnt = min.to_vec();
    let spare = budget_bytes.saturating_sub(pool_bytes(class_sizes, &cnt)) as f64;
    let weights: Vec<f64> = (0..cnt.len()).map(|_| rng.random::<f64>()).collect();
    let total: f64 = weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    for k in 0..cnt.len() {
        let size = rounded(class_sizes[k]).max(1) as f64;
        let extra = (spare * weights[k] / total / size).floor();
        let extra = if extra.is_finite() && extra > 0.0 {
            extra as u64
        } else {
            0
        };
        cnt[k] = cnt[k].saturating_add(extra).min(max[k].max(min[k]));
    }
    cnt
}

/// The size-class configuration of a gene (the CLS / CNT encoding itself).
pub fn config_of(ts: &[u64], gene: &AllocGene) -> SizeClassConfig {
    SizeClassConfig {
        classes: Vec::new(),
        encoding: Some(SizeClassEncoding {
            tensor_sizes_bytes: ts.to_vec(),
            cls: gene.cls.clone(),
            cnt: gene.cnt.clone(),
        }),
    }
}

/// Two sizes or a size and a count.
type SizeCount = (u64, u64);

/// The pool an allocator configuration describes, as `SizeClassPool` builds it:
/// classes rounded up to the alignment and merged when equal, sizes mapped
/// through the encoding (or to the smallest class that holds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolModel {
    /// Rounded object size of each class, strictly increasing.
    pub class_bytes: Vec<u64>,
    /// Objects per class.
    pub count: Vec<u64>,
    /// Explicit mapping: `(tensor size, class)` sorted by size.
    explicit: Vec<(u64, usize)>,
}

impl PoolModel {
    /// The pool of a configuration; `None` when it has no class or neither
    /// classes nor an encoding (the pool then cannot be built either).
    pub fn of_config(config: &SizeClassConfig) -> Option<PoolModel> {
        // (object size, count) per class, and (tensor size, its class's size).
        let (specs, explicit_raw): (Vec<SizeCount>, Vec<SizeCount>) =
            match (&config.encoding, config.classes.is_empty()) {
                (Some(e), true) => {
                    let (classes, mapping) = e.classes().ok()?;
                    let specs = classes.iter().map(|c| (c.size_bytes, c.count)).collect();
                    let explicit = e
                        .tensor_sizes_bytes
                        .iter()
                        .zip(&mapping)
                        .map(|(&s, &k)| (s, classes[k].size_bytes))
                        .collect();
                    (specs, explicit)
                }
                (None, false) => (
                    config
                        .classes
                        .iter()
                        .map(|c| (c.size_bytes, c.count))
                        .collect(),
                    Vec::new(),
                ),
                _ => return None,
            };
        let mut rounded_specs: Vec<(u64, u64)> =
            specs.into_iter().map(|(s, c)| (rounded(s), c)).collect();
        rounded_specs.sort_unstable();
        let mut class_bytes: Vec<u64> = Vec::new();
        let mut count: Vec<u64> = Vec::new();
        for (s, c) in rounded_specs {
            if class_bytes.last() == Some(&s) {
                if let Some(last) = count.last_mut() {
                    *last = last.saturating_add(c);
                }
            } else {
                class_bytes.push(s);
                count.push(c);
            }
        }
        if class_bytes.is_empty() {
            return None;
        }
        let mut explicit: Vec<(u64, usize)> = explicit_raw
            .into_iter()
            .filter_map(|(s, class_size)| {
                class_bytes
                    .binary_search(&rounded(class_size))
                    .ok()
                    .map(|k| (s, k))
            })
            .collect();
        explicit.sort_unstable();
        Some(PoolModel {
            class_bytes,
            count,
            explicit,
        })
    }

    /// The class a request of `size_bytes` takes, `None` when none holds it.
    pub fn class_of(&self, size_bytes: u64) -> Option<usize> {
        if let Ok(i) = self.explicit.binary_search_by_key(&size_bytes, |e| e.0) {
            return Some(self.explicit[i].1);
        }
        let k = self.class_bytes.partition_point(|&c| c < size_bytes);
        (k < self.class_bytes.len()).then_some(k)
    }

    /// Bytes the pool reserves.
    pub fn bytes(&self) -> u64 {
        self.class_bytes
            .iter()
            .zip(&self.count)
            .fold(0u64, |acc, (&s, &c)| {
                acc.saturating_add(s.saturating_mul(c))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_alloc::{AllocId, Allocator, SizeClassPool};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const MB: u64 = 1 << 20;

    /// Fig. 5 exactly: TS = [1, 2, 3, 4] MB, 12 MB of memory.
    #[test]
    fn figure_5_crossover_and_repair() {
        let a = AllocGene {
            cls: vec![1, 1, 1, 1],
            cnt: vec![4],
        };
        let b = AllocGene {
            cls: vec![1, 2, 2, 2],
            cnt: vec![8, 1],
        };
        assert_eq!(extend_counts(&a.cls, &a.cnt), vec![4, 4, 4, 4]);
        assert_eq!(extend_counts(&b.cls, &b.cnt), vec![8, 1, 1, 1]);
        // Fig. 5a: CR = 2; CLS_C1 = [1, 2, 1, 1] repaired to [1, 2, 2, 2].
        let (c1, c2) = crossover_alloc(&a, &b, 2);
        assert_eq!(c1.cls, vec![1, 2, 2, 2]);
        assert_eq!(c2.cls, vec![1, 1, 2, 2]);
        // Fig. 5b: CNT_EXT_C1 = [8, 1, 4, 4] -> CNT_C1 = [8, 3].
        assert_eq!(c1.cnt, vec![8, 3]);
        // CNT_C1 needs 20 MB of the 12: repaired to [4, 2].
        let ts = [MB, 2 * MB, 3 * MB, 4 * MB];
        let sizes = class_sizes(&ts, &c1.cls);
        assert_eq!(sizes, vec![MB, 4 * MB]);
        let mut cnt = c1.cnt.clone();
        assert_eq!(pool_bytes(&sizes, &cnt), 20 * MB);
        assert!(repair_cnt(&sizes, &mut cnt, &[1, 1], &[100, 100], 12 * MB));
        assert_eq!(cnt, vec![4, 2]);
    }

    #[test]
    fn cls_repair_shifts_a_jumping_tail_down() {
        assert_eq!(join_cls(&[0, 0, 1], &[0, 1, 3, 4], 2), vec![0, 0, 1, 2]);
        assert_eq!(join_cls(&[0, 1, 2], &[0, 0, 0, 1], 2), vec![0, 1, 1, 2]);
    }

    #[test]
    fn crossover_and_mutation_keep_cls_valid_and_counts_sized() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for n in 1..40usize {
            for _ in 0..20 {
                let a = random_cls(n, &mut rng);
                let b = random_cls(n, &mut rng);
                assert!(cls_valid(&a) && cls_valid(&b));
                let cr = if n > 1 { rng.random_range(1..n) } else { 1 };
                let (c1, c2) = crossover_cls(&a, &b, cr);
                assert!(cls_valid(&c1), "{a:?} x {b:?} at {cr} -> {c1:?}");
                assert!(cls_valid(&c2), "{a:?} x {b:?} at {cr} -> {c2:?}");
                let mut gene = AllocGene {
                    cnt: vec![3; n_classes(&c1)],
                    cls: c1,
                };
                mutate_alloc(&mut gene, 0.3, &mut rng);
                assert!(cls_valid(&gene.cls), "{:?}", gene.cls);
                assert_eq!(gene.cnt.len(), n_classes(&gene.cls));
            }
        }
    }

    #[test]
    fn the_fill_gives_the_spare_budget_to_the_largest_classes_first() {
        // Objects of 512 B, 1 KiB and 4 KiB, [2, 1, 1] of them: 6 KiB of a
        // 16 KiB budget. The 4 KiB class may hold 3 (its max): +2 uses 8 KiB,
        // the 2 KiB left go to the 1 KiB class (+2), nothing to the smallest.
        let sizes = [512, 1024, 4096];
        let max = [100, 100, 3];
        let mut cnt = vec![2, 1, 1];
        fill_largest(&sizes, &mut cnt, &max, 16384);
        assert_eq!(cnt, vec![2, 3, 3]);
        assert_eq!(pool_bytes(&sizes, &cnt), 16384);
        // A pool at or over the budget is left as it is.
        let mut over = vec![40, 1, 1];
        fill_largest(&sizes, &mut over, &max, 16384);
        assert_eq!(over, vec![40, 1, 1]);
        // Random pools: never over the budget or a max, never an object less,
        // and no class below its max could still take an object.
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..200 {
            let k = rng.random_range(1..10usize);
            let sizes: Vec<u64> = (0..k).map(|_| rng.random_range(1..5000u64)).collect();
            let max: Vec<u64> = (0..k).map(|_| rng.random_range(0..40u64)).collect();
            let before: Vec<u64> = max.iter().map(|&m| rng.random_range(0..=m)).collect();
            let budget = pool_bytes(&sizes, &before) + rng.random_range(0..100_000u64);
            let mut cnt = before.clone();
            fill_largest(&sizes, &mut cnt, &max, budget);
            let spare = budget - pool_bytes(&sizes, &cnt);
            for i in 0..k {
                assert!(cnt[i] >= before[i] && cnt[i] <= max[i]);
                assert!(
                    cnt[i] == max[i] || rounded(sizes[i]) > spare,
                    "{i}: {cnt:?}"
                );
            }
        }
    }

    #[test]
    fn repair_fits_the_budget_or_says_the_minimum_does_not() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..200 {
            let k = rng.random_range(1..12usize);
            let sizes: Vec<u64> = (0..k).map(|_| rng.random_range(1..5000u64)).collect();
            let min: Vec<u64> = (0..k).map(|_| rng.random_range(0..4u64)).collect();
            let max: Vec<u64> = min
                .iter()
                .map(|&m| m + rng.random_range(0..50u64))
                .collect();
            let mut cnt: Vec<u64> = (0..k).map(|_| rng.random_range(0..80u64)).collect();
            let budget = rng.random_range(0..200_000u64);
            let fits = repair_cnt(&sizes, &mut cnt, &min, &max, budget);
            for i in 0..k {
                assert!(cnt[i] >= min[i] && cnt[i] <= max[i].max(min[i]));
            }
            assert_eq!(fits, pool_bytes(&sizes, &cnt) <= budget);
            if !fits {
                assert_eq!(cnt, min, "repair gave up above the minimum");
            }
        }
    }

    /// The model's classes are the pool's: every class takes exactly its count.
    #[test]
    fn pool_model_matches_the_allocator() {
        let ts = vec![100, 600, 1000, 1024, 5000, 70_000];
        let gene = AllocGene {
            cls: vec![0, 0, 1, 1, 2, 3],
            cnt: vec![3, 2, 4, 1],
        };
        let config = config_of(&ts, &gene);
        let model = PoolModel::of_config(&config).expect("model");
        let mut pool = SizeClassPool::from_config(&config, 1 << 30).expect("pool");
        assert_eq!(
            model.bytes(),
            pool.classes()
                .iter()
                .map(|c| c.size_bytes * c.count)
                .sum::<u64>()
        );
        let mut id = 0u64;
        for &s in &ts {
            let k = model.class_of(s).expect("class");
            // Fill the class from a fresh pool and check one more fails.
            let mut fresh = SizeClassPool::from_config(&config, 1 << 30).expect("pool");
            for _ in 0..model.count[k] {
                id += 1;
                assert!(fresh.allocate(AllocId(id), s).is_ok(), "size {s}");
            }
            id += 1;
            assert!(
                fresh.allocate(AllocId(id), s).is_err(),
                "size {s} class {k}"
            );
        }
        // A zero-byte request takes the smallest class.
        assert_eq!(model.class_of(0), Some(0));
        assert!(pool.allocate(AllocId(999_999), 0).is_ok());
    }
}
