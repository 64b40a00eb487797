//! SwapAdvisor's schedule chromosome (paper 000, Sec. 5.2): a schedule is a
//! topological order of the ops (the list `SCH`). Crossover (Fig. 4, after
//! Wu et al. [43]) takes a prefix of one parent and fills the rest in the
//! other parent's order; mutation replays the order through a dataflow
//! scheduler that, with probability `P` per step, runs a random ready op
//! instead of the one earliest in the parent.
//!
//! "Ready" uses `outcore_plan::order_predecessors`: producers of inputs and,
//! for storage written in place, the accesses a write must stay between, so
//! every child is a valid compute order for the lowering (`check_order`).

use outcore_graph::{Graph, OpId};
use rand::Rng;
use std::collections::BTreeSet;

/// Predecessor counts and successor lists of the order constraints, built once
/// per graph.
#[derive(Debug, Clone)]
pub struct Dag {
    /// Per op: how many ops must run before it.
    n_preds: Vec<u32>,
    /// Per op: the ops that wait for it, as compressed rows.
    succ_start: Vec<u32>,
    succ_items: Vec<OpId>,
}

impl Dag {
    pub fn new(graph: &Graph) -> Self {
        let preds = outcore_plan::order_predecessors(graph);
        Self::from_predecessors(&preds)
    }

    /// The DAG of explicit predecessor lists (`preds[op]`: ops before `op`).
    pub fn from_predecessors(preds: &[Vec<OpId>]) -> Self {
        let n = preds.len();
        let mut n_succ = vec![0u32; n + 1];
        for ps in preds {
            for p in ps {
                n_succ[p.index() + 1] += 1;
            }
        }
        for i in 0..n {
            n_succ[i + 1] += n_succ[i];
        }
        let succ_start = n_succ.clone();
        let mut fill = n_succ;
        let mut succ_items = vec![OpId(0); succ_start[n] as usize];
        for (op, ps) in preds.iter().enumerate() {
            for p in ps {
                let slot = &mut fill[p.index()];
                succ_items[*slot as usize] = OpId(op as u32);
                *slot += 1;
            }
        }
        Dag {
            n_preds: preds.iter().map(|p| p.len() as u32).collect(),
            succ_start,
            succ_items,
        }
    }

    pub fn n_ops(&self) -> usize {
        self.n_preds.len()
    }

    fn succs(&self, op: OpId) -> &[OpId] {
        &self.succ_items
            [self.succ_start[op.index()] as usize..self.succ_start[op.index() + 1] as usize]
    }

    /// Whether `order` lists every op once with every op after its predecessors.
    pub fn is_topological(&self, order: &[OpId]) -> bool {
        let n = self.n_ops();
        if order.len() != n {
            return false;
        }
        let mut missing = self.n_preds.clone();
        let mut done = vec![false; n];
        for &op in order {
            if op.index() >= n || done[op.index()] || missing[op.index()] != 0 {
                return false;
            }
            done[op.index()] = true;
            for &s in self.succs(op) {
                missing[s.index()] -= 1;
            }
        }
        true
    }
}

/// Fig. 4: the children of crossing `sch1` and `sch2` at `cr`:
/// `SCH2[..cr]` then the rest in `SCH1`'s order, and `SCH1[..cr]` then the
/// rest in `SCH2`'s order. Both are topological when the parents are (a prefix
/// of a topological order is closed under predecessors).
pub fn crossover(sch1: &[OpId], sch2: &[OpId], cr: usize) -> (Vec<OpId>, Vec<OpId>) {
    (fill(sch2, sch1, cr), fill(sch1, sch2, cr))
}

/// `head[..cr]` followed by the ops of `rest` not in it, in `rest`'s order.
fn fill(head: &[OpId], rest: &[OpId], cr: usize) -> Vec<OpId> {
    let cr = cr.min(head.len());
    let n = head.len().max(rest.len());
    let mut taken = vec![false; n];
    let mut out = Vec::with_capacity(n);
    for &op in &head[..cr] {
        if let Some(t) = taken.get_mut(op.index()) {
            *t = true;
        }
        out.push(op);
    }
    out.extend(
        rest.iter()
            .copied()
            .filter(|op| taken.get(op.index()).is_some_and(|&t| !t)),
    );
    out
}

/// The ready-set mutation: a dataflow scheduler over `dag` that at each step,
/// with probability `p`, runs a uniformly random ready op, and otherwise the
/// ready op earliest in `parent`.
pub fn mutate(dag: &Dag, parent: &[OpId], p: f64, rng: &mut impl Rng) -> Vec<OpId> {
    let n = dag.n_ops();
    let mut rank = vec![0u32; n];
    for (i, op) in parent.iter().enumerate() {
        rank[op.index()] = i as u32;
    }
    let mut missing = dag.n_preds.clone();
    // Ready ops keyed by their position in the parent.
    let mut ready: BTreeSet<(u32, u32)> = (0..n)
        .filter(|&i| missing[i] == 0)
        .map(|i| (rank[i], i as u32))
        .collect();
    let mut out = Vec::with_capacity(n);
    while !ready.is_empty() {
        let pick = if rng.random_bool(p) {
            let k = rng.random_range(0..ready.len());
            ready.iter().nth(k).copied()
        } else {
            ready.first().copied()
        };
        let Some(key) = pick else { break };
        ready.remove(&key);
        let op = OpId(key.1);
        out.push(op);
        for &s in dag.succs(op) {
            missing[s.index()] -= 1;
            if missing[s.index()] == 0 {
                ready.insert((rank[s.index()], s.0));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn ids(v: &[u32]) -> Vec<OpId> {
        v.iter().map(|&i| OpId(i)).collect()
    }

    /// Fig. 4: the text gives `SCH2[1..CR] = [2, 3, 4]` with `CR = 3` and says
    /// nodes 1 and 5 follow in `SCH1`'s order (node k is id k - 1 here; the
    /// figure's full lists are not in the text, so `SCH1` is taken as 1..5).
    #[test]
    fn figure_4_crossover() {
        let node = |v: &[u32]| ids(&v.iter().map(|k| k - 1).collect::<Vec<_>>());
        let sch1 = node(&[1, 2, 3, 4, 5]);
        let sch2 = node(&[2, 3, 4, 1, 5]);
        let (c1, c2) = crossover(&sch1, &sch2, 3);
        assert_eq!(c1, node(&[2, 3, 4, 1, 5]));
        assert_eq!(c2, node(&[1, 2, 3, 4, 5]));
        let sch2 = node(&[1, 3, 2, 5, 4]);
        let (c1, c2) = crossover(&sch1, &sch2, 2);
        assert_eq!(c1, node(&[1, 3, 2, 4, 5]));
        assert_eq!(c2, node(&[1, 2, 3, 5, 4]));
    }

    /// Random DAGs: children of crossover and mutation are topological orders.
    #[test]
    fn crossover_and_mutation_give_topological_orders() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for n in 2..60usize {
            let preds: Vec<Vec<OpId>> = (0..n)
                .map(|i| {
                    (0..i)
                        .filter(|_| rng.random_bool(0.15))
                        .map(|j| OpId(j as u32))
                        .collect()
                })
                .collect();
            let dag = Dag::from_predecessors(&preds);
            let identity: Vec<OpId> = (0..n as u32).map(OpId).collect();
            assert!(dag.is_topological(&identity));
            let a = mutate(&dag, &identity, 0.5, &mut rng);
            let b = mutate(&dag, &a, 1.0, &mut rng);
            for o in [&a, &b] {
                assert!(dag.is_topological(o), "{o:?}");
            }
            for cr in 1..n {
                let (c1, c2) = crossover(&a, &b, cr);
                assert!(dag.is_topological(&c1) && dag.is_topological(&c2));
            }
            // Without mutation the scheduler replays the parent.
            assert_eq!(mutate(&dag, &b, 0.0, &mut rng), b);
        }
    }
}
