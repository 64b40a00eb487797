//! A local search over the best individual's memory pool, run between the
//! genetic algorithm's phases (`ga::run`, with the share of the time each
//! phase leaves it): outcore's addition to SwapAdvisor (the paper has only
//! the GA).
//!
//! The order stays the GA's; only `CLS` / `CNT` move, by three kinds of
//! neighbour ([`neighbours`]):
//! - **split**: one class split in two before one of its sizes, the upper
//!   part taking some of the class's objects (four counts from its minimum
//!   to all of them), the lower part the rest at its smaller size;
//! - **merge**: two adjacent classes made one, at the larger size, with as
//!   many objects as both had;
//! - **transfer**: objects of one class exchanged for as many bytes of
//!   another's, between the classes holding the most bytes.
//!
//! Each neighbour is repaired as the GA's children are (counts within their
//! bounds and the budget) and the budget it leaves unused is filled, largest
//! classes first. The neighbours are scored in chunks of [`CHUNK`], in
//! parallel; the fastest of a chunk that beats the current pool replaces it,
//! and the scan goes on from there over the new pool's neighbours; it ends
//! when a whole scan finds nothing faster, at the deadline, or after
//! [`MAX_ACCEPTED`] moves. A fixed chunk size keeps the result the same for
//! any number of threads.
//!
//! Why: on copy-bound graphs the GA's pools leave a large share of the budget
//! as rounding. On NasNet-25 (batch 64, `v100-16gb-pcie3`, 16 GiB) the best
//! pool after a 20 s search put the 250 to 677 MB tensors in one class of
//! thirteen 677 MB objects (half the pool), so a 455 MB tensor, 21.6 GiB of
//! what is live at the end of the forward pass, wasted a third of its
//! object; the plan held 10.2 GiB of live tensors at most in its 16 GiB. A
//! GA moves `CLS` by random +-1 shifts with the counts averaged through the
//! extended counts, so a split that pays only with its counts re-balanced is
//! rarely drawn whole, and the search's best had not moved from 100 s to
//! 300 s (BENCHMARKS.md). Splits alone, first improvement, took that plan
//! from 27.70 s to 27.46 s per iteration in 11 s.

use super::encoding::{self, AllocGene, Bounds, SizeDemand};
use outcore_graph::OpId;
use std::time::Instant;

/// Neighbours scored at once; the fastest improving one of a chunk is taken.
pub const CHUNK: usize = 8;
/// Moves taken at most.
pub const MAX_ACCEPTED: usize = 200;
/// Classes (by bytes held) between which objects are transferred.
pub const TRANSFER_CLASSES: usize = 6;
/// Counts tried for the upper part of a split.
const SPLIT_COUNTS: u64 = 4;
/// Relative gain below which a neighbour does not replace the pool (keeps the
/// search from walking on ties).
pub const MIN_GAIN: f64 = 1e-6;

/// What the polish did.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct PolishStats {
    pub evaluations: u64,
    pub accepted: u64,
    pub before_s: f64,
    pub after_s: f64,
    /// Whether the deadline (not a scan without gain) ended it.
    pub cut_by_time: bool,
}

/// The pool's context: sizes, demand and budget.
#[derive(Debug, Clone, Copy)]
pub struct PoolSpace<'a> {
    pub ts: &'a [u64],
    pub demand: &'a SizeDemand,
    pub budget_bytes: u64,
}

impl PoolSpace<'_> {
    /// `CLS` / `CNT` repaired as the GA's children are
    /// ([`encoding::repair_and_fill`]) with `bounds`, `cls`'s bounds on the
    /// order; `None` when even the minimum does not fit.
    fn repaired(&self, cls: Vec<u32>, cnt: Vec<u64>, bounds: &Bounds) -> Option<AllocGene> {
        let mut gene = AllocGene { cls, cnt };
        encoding::repair_and_fill(self.ts, &mut gene, bounds, self.budget_bytes).then_some(gene)
    }

    /// [`PoolSpace::repaired`] with `cls`'s bounds on `order`.
    fn repaired_on(&self, cls: Vec<u32>, cnt: Vec<u64>, order: &[OpId]) -> Option<AllocGene> {
        let bounds = self.demand.bounds(&cls, order);
        self.repaired(cls, cnt, &bounds)
    }
}

/// The neighbours of `gene` on `order` (module doc), those touching the
/// classes that hold the most bytes first; distinct from `gene` and from
/// each other.
pub fn neighbours(space: &PoolSpace<'_>, gene: &AllocGene, order: &[OpId]) -> Vec<AllocGene> {
    let k = encoding::n_classes(&gene.cls);
    let sizes = encoding::class_sizes(space.ts, &gene.cls);
    let held = |c: usize| encoding::rounded(sizes[c]).saturating_mul(gene.cnt[c]);
    let class_of = encoding::class_of_sizes(&gene.cls);
    let mut out: Vec<(u64, AllocGene)> = Vec::new();
    // Splits before size i of its class.
    for (i, &c) in class_of.iter().enumerate().skip(1) {
        if gene.cls[i] != gene.cls[i - 1] {
            continue;
        }
        let mut cls = gene.cls.clone();
        for x in cls.iter_mut().skip(i) {
            *x += 1;
        }
        let bounds = space.demand.bounds(&cls, order);
        let lowest_upper = bounds.min[c + 1];
        let all = gene.cnt[c];
        for j in 1..=SPLIT_COUNTS {
            let upper = lowest_upper + all.saturating_sub(lowest_upper) * j / SPLIT_COUNTS;
            let mut cnt = gene.cnt.clone();
            cnt[c] = all.saturating_sub(upper);
            cnt.insert(c + 1, upper);
            if let Some(g) = space.repaired(cls.clone(), cnt, &bounds) {
                out.push((held(c), g));
            }
        }
    }
    // Merges of classes c and c + 1.
    for c in 0..k.saturating_sub(1) {
        let first = class_of
            .iter()
            .position(|&x| x == c + 1)
            .unwrap_or(gene.cls.len());
        let mut cls = gene.cls.clone();
        for x in cls.iter_mut().skip(first) {
            *x -= 1;
        }
        let mut cnt = gene.cnt.clone();
        cnt[c] += cnt[c + 1];
        cnt.remove(c + 1);
        if let Some(g) = space.repaired_on(cls, cnt, order) {
            out.push((held(c).max(held(c + 1)), g));
        }
    }
    // Transfers between the classes holding the most bytes.
    let mut top: Vec<usize> = (0..k).collect();
    top.sort_by_key(|&c| (std::cmp::Reverse(held(c)), c));
    top.truncate(TRANSFER_CLASSES);
    for &from in &top {
        for &to in &top {
            if from == to {
                continue;
            }
            let n = gene.cnt[from];
            for give in [1, (n / 8).max(1)] {
                if give > n {
                    continue;
                }
                let freed = encoding::rounded(sizes[from]).saturating_mul(give);
                let gain = freed / encoding::rounded(sizes[to]).max(1);
                if gain == 0 {
                    continue;
                }
                let mut cnt = gene.cnt.clone();
                cnt[from] -= give;
                cnt[to] += gain;
                if let Some(g) = space.repaired_on(gene.cls.clone(), cnt, order) {
                    out.push((held(from).max(held(to)), g));
                }
            }
        }
    }
    // Stable: equal weights keep the kinds' order.
    out.sort_by_key(|(w, _)| std::cmp::Reverse(*w));
    let mut seen = std::collections::HashSet::new();
    seen.insert(gene.clone());
    out.into_iter()
        .map(|(_, g)| g)
        .filter(|g| seen.insert(g.clone()))
        .collect()
}

/// The polish of the module doc from `start` (scored `start_s`): `score`
/// scores a batch of genes on `order` (feasible time, or `None`), in any
/// order of threads but answering in the batch's order.
pub fn polish<E>(
    space: &PoolSpace<'_>,
    order: &[OpId],
    start: AllocGene,
    start_s: f64,
    deadline: Instant,
    mut score: impl FnMut(&[AllocGene]) -> Result<Vec<Option<f64>>, E>,
) -> Result<(AllocGene, PolishStats), E> {
    let mut stats = PolishStats {
        before_s: start_s,
        after_s: start_s,
        ..PolishStats::default()
    };
    let mut best = start;
    let mut cands = neighbours(space, &best, order);
    // Where the scan goes on, and how many neighbours in a row gave nothing.
    let mut at = 0usize;
    let mut idle = 0usize;
    while idle < cands.len() && (stats.accepted as usize) < MAX_ACCEPTED {
        if Instant::now() >= deadline {
            stats.cut_by_time = true;
            break;
        }
        let chunk: Vec<AllocGene> = (0..CHUNK.min(cands.len()))
            .map(|j| cands[(at + j) % cands.len()].clone())
            .collect();
        let times = score(&chunk)?;
        stats.evaluations += chunk.len() as u64;
        let winner = times
            .iter()
            .enumerate()
            .filter_map(|(j, t)| t.map(|t| (j, t)))
            .filter(|&(_, t)| t < stats.after_s * (1.0 - MIN_GAIN))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        match winner {
            Some((j, t)) => {
                best = chunk[j].clone();
                stats.after_s = t;
                stats.accepted += 1;
                let resume = (at + j + 1) % cands.len();
                cands = neighbours(space, &best, order);
                at = resume % cands.len().max(1);
                idle = 0;
            }
            None => {
                at = (at + chunk.len()) % cands.len();
                idle += chunk.len();
            }
        }
    }
    Ok((best, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_graph::{Graph, footprint};
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn resnet18() -> Graph {
        outcore_graph::zoo::build("resnet18", Some(16), &BTreeMap::new(), None).expect("zoo model")
    }

    /// A graph's sizes, its demand, its order and a budget of 80% of its
    /// footprint.
    struct Setting {
        ts: Vec<u64>,
        demand: SizeDemand,
        order: Vec<OpId>,
        budget_bytes: u64,
    }

    impl Setting {
        fn of(g: &Graph) -> Setting {
            let ts = encoding::tensor_sizes(g);
            let demand = SizeDemand::new(g, &ts);
            let (fp, _) = footprint(g);
            Setting {
                ts,
                demand,
                order: g.ops.iter().map(|o| o.id).collect(),
                budget_bytes: fp * 8 / 10,
            }
        }

        fn space(&self) -> PoolSpace<'_> {
            PoolSpace {
                ts: &self.ts,
                demand: &self.demand,
                budget_bytes: self.budget_bytes,
            }
        }
    }

    fn start(space: &PoolSpace<'_>, order: &[OpId]) -> AllocGene {
        let cls = encoding::top_merged(space.ts.len(), 5);
        let cnt = vec![0; encoding::n_classes(&cls)];
        space
            .repaired_on(cls, cnt, order)
            .expect("the minimum fits")
    }

    #[test]
    fn neighbours_are_distinct_valid_pools_within_the_budget() {
        let g = resnet18();
        let setting = Setting::of(&g);
        let (space, order) = (setting.space(), &setting.order[..]);
        let gene = start(&space, order);
        let k = encoding::n_classes(&gene.cls);
        let all = neighbours(&space, &gene, order);
        let distinct: std::collections::HashSet<&AllocGene> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        assert!(!distinct.contains(&gene));
        for n in &all {
            assert!(encoding::cls_valid(&n.cls), "{:?}", n.cls);
            let b = setting.demand.bounds(&n.cls, order);
            assert_eq!(n.cnt.len(), b.min.len());
            for (c, &x) in n.cnt.iter().enumerate() {
                assert!(
                    b.min[c] <= x && x <= b.max[c].max(b.min[c]),
                    "class {c}: {x}"
                );
            }
            let sizes = encoding::class_sizes(&setting.ts, &n.cls);
            assert!(encoding::pool_bytes(&sizes, &n.cnt) <= setting.budget_bytes);
        }
        // Each kind is there: a split (one class more), a merge (one fewer)
        // and a transfer (the same classes, other counts).
        let classes = |n: &AllocGene| encoding::n_classes(&n.cls);
        assert!(all.iter().any(|n| classes(n) == k + 1));
        assert!(all.iter().any(|n| classes(n) + 1 == k));
        assert!(all.iter().any(|n| n.cls == gene.cls));
    }

    /// On a made-up score the polish must end where no neighbour scores
    /// less, having counted every neighbour it scored.
    #[test]
    fn the_polish_ends_in_a_local_optimum_and_counts_its_evaluations() {
        let g = resnet18();
        let setting = Setting::of(&g);
        let (space, order) = (setting.space(), &setting.order[..]);
        // Fewer classes is faster; among equals, fewer objects of the
        // largest class.
        let time = |gene: &AllocGene| {
            encoding::n_classes(&gene.cls) as f64 + 1e-3 * *gene.cnt.last().unwrap_or(&0) as f64
        };
        let gene = start(&space, order);
        let start_s = time(&gene);
        let mut calls = 0u64;
        let deadline = Instant::now() + Duration::from_secs(600);
        let (best, stats) = polish(&space, order, gene, start_s, deadline, |genes| {
            calls += genes.len() as u64;
            Ok::<_, ()>(genes.iter().map(|g| Some(time(g))).collect())
        })
        .expect("scored");
        assert_eq!(stats.evaluations, calls);
        assert!(stats.accepted > 0);
        assert!(!stats.cut_by_time);
        assert_eq!(stats.before_s, start_s);
        assert_eq!(stats.after_s, time(&best));
        assert!(stats.after_s < start_s);
        for n in neighbours(&space, &best, order) {
            assert!(time(&n) >= stats.after_s * (1.0 - MIN_GAIN), "{n:?}");
        }
    }

    #[test]
    fn a_passed_deadline_leaves_the_pool_as_it_was() {
        let g = resnet18();
        let setting = Setting::of(&g);
        let (space, order) = (setting.space(), &setting.order[..]);
        let gene = start(&space, order);
        let (best, stats) = polish(&space, order, gene.clone(), 1.0, Instant::now(), |genes| {
            Ok::<_, ()>(vec![Some(0.0); genes.len()])
        })
        .expect("scored");
        assert_eq!(best, gene);
        assert!(stats.cut_by_time);
        assert_eq!(stats.evaluations, 0);
        assert_eq!(stats.after_s, 1.0);
    }
}
