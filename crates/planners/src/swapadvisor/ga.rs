//! SwapAdvisor's genetic algorithm (paper 000, Sec. 5.1): a population of
//! `Np` chromosomes (operator schedule, memory allocation) evolves by
//! crossover (two schedules and two allocations from each pair of parents,
//! hence four children), mutation of every child, scoring, and survival drawn
//! by the softmax of Eq. 1 over normalised times `(T_best - t) / T_best`, with
//! `T_best` the best time seen so far.
//!
//! Choices where the paper is vague:
//! - Each generation crosses `Np / 4` pairs of parents drawn uniformly (at
//!   least one pair), so `Np` children join the `Np` parents and Eq. 1 picks
//!   `Np` of those `S = 2 Np` without replacement. Parents keep their scores.
//! - No elitism: survival is Eq. 1's draw alone; the plan returned is the best
//!   individual ever scored (ties: the first scored).
//! - Children are bred in parallel, each pair from its own generator seeded in
//!   order from the search's, and scored in parallel; scores are collected in
//!   order, so the search depends on the seed and the number of generations,
//!   never on the number of threads.
//! - The search stops between generations, never inside one: when the time
//!   limit is spent, or the generation or evaluation limit is reached. The
//!   first generation is always scored. A run cut by the time limit is
//!   repeated exactly by asking for the generations it completed.
//! - The convergence history records, per generation, the best, mean and
//!   worst time of the feasible individuals alive (Fig. 9), how many are
//!   feasible, the best time scored so far, the evaluations so far and the
//!   elapsed time.

use super::encoding::{self, AllocGene, SizeDemand};
use super::schedule_ops::{self, Dag};
use outcore_graph::OpId;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// Which parts of the chromosome the search changes (Sec. 6.4's ablation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SearchSpace {
    /// Schedule and memory allocation together (the paper's search).
    Joint,
    /// Only the schedule; the allocation stays the seed's.
    OrderOnly,
    /// Only the allocation; the schedule stays the seed's.
    AllocationOnly,
}

impl SearchSpace {
    pub fn orders(self) -> bool {
        self != SearchSpace::AllocationOnly
    }

    pub fn allocations(self) -> bool {
        self != SearchSpace::OrderOnly
    }
}

/// One chromosome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Individual {
    pub order: Vec<OpId>,
    pub alloc: AllocGene,
}

/// What makes children: the graph's constraints and the pool's bounds.
#[derive(Debug)]
pub struct Breeder<'a> {
    pub dag: &'a Dag,
    pub demand: &'a SizeDemand,
    /// `TS`.
    pub ts: &'a [u64],
    pub budget_bytes: u64,
    /// Mutation probability `P`.
    pub p: f64,
    pub search: SearchSpace,
}

impl Breeder<'_> {
    /// The count repair of an allocation gene for a schedule (fits the budget
    /// if it can).
    pub fn repair(&self, gene: &mut AllocGene, order: &[OpId]) {
        let bounds = self.demand.bounds(&gene.cls, order);
        let sizes = encoding::class_sizes(self.ts, &gene.cls);
        gene.cnt.resize(bounds.min.len(), 0);
        encoding::repair_counts(&sizes, &mut gene.cnt, &bounds, self.budget_bytes);
    }

    /// A random allocation gene, repaired for `order`.
    pub fn random_alloc(&self, order: &[OpId], rng: &mut impl Rng) -> AllocGene {
        let cls = encoding::random_cls(self.ts.len(), rng);
        let bounds = self.demand.bounds(&cls, order);
        let sizes = encoding::class_sizes(self.ts, &cls);
        let cnt = encoding::random_cnt(&sizes, &bounds, self.budget_bytes, rng);
        let mut gene = AllocGene { cls, cnt };
        self.repair(&mut gene, order);
        gene
    }

    /// A uniformly random topological order.
    pub fn random_order(&self, rng: &mut impl Rng) -> Vec<OpId> {
        let any: Vec<OpId> = (0..self.dag.n_ops() as u32).map(OpId).collect();
        schedule_ops::mutate(self.dag, &any, 1.0, rng)
    }

    /// The four children of a pair (Sec. 5.1), each mutated and repaired.
    pub fn children(&self, a: &Individual, b: &Individual, rng: &mut impl Rng) -> [Individual; 4] {
        let (s1, s2) = if self.search.orders() && a.order.len() > 1 {
            let cr = rng.random_range(1..a.order.len());
            schedule_ops::crossover(&a.order, &b.order, cr)
        } else {
            (a.order.clone(), b.order.clone())
        };
        let (g1, g2) = if self.search.allocations() && a.alloc.cls.len() > 1 {
            let cr = rng.random_range(1..a.alloc.cls.len());
            encoding::crossover_alloc(&a.alloc, &b.alloc, cr)
        } else {
            (a.alloc.clone(), b.alloc.clone())
        };
        let mut make = |order: &Vec<OpId>, gene: &AllocGene| {
            let order = if self.search.orders() {
                schedule_ops::mutate(self.dag, order, self.p, rng)
            } else {
                order.clone()
            };
            let mut alloc = gene.clone();
            if self.search.allocations() {
                encoding::mutate_alloc(&mut alloc, self.p, rng);
                self.repair(&mut alloc, &order);
            }
            Individual { order, alloc }
        };
        [
            make(&s1, &g1),
            make(&s1, &g2),
            make(&s2, &g1),
            make(&s2, &g2),
        ]
    }
}

/// When the search stops (module doc).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub deadline: Instant,
    pub max_generations: Option<u64>,
    pub max_evaluations: Option<u64>,
}

/// One individual's score: the time Eq. 1 ranks by (a penalty when
/// infeasible) and whether it is feasible.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fitness {
    pub time_s: f64,
    pub feasible: bool,
}

/// One generation of the convergence history (Fig. 9).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationStats {
    pub generation: u64,
    pub evaluations: u64,
    pub elapsed_s: f64,
    /// Over the feasible individuals alive (`None`: none is).
    pub best_s: Option<f64>,
    pub mean_s: Option<f64>,
    pub worst_s: Option<f64>,
    pub feasible: usize,
    pub alive: usize,
    /// The best time scored so far (alive or not; a penalty when nothing
    /// feasible was scored yet).
    pub best_ever_s: f64,
}

/// What the search ends with.
#[derive(Debug)]
pub struct Outcome {
    pub best: Individual,
    pub best_fitness: Fitness,
    pub history: Vec<GenerationStats>,
    pub generations: u64,
    pub evaluations: u64,
    /// The time limit stopped the search (not a generation or evaluation limit).
    pub cut_by_time: bool,
}

/// Eq. 1: draws `keep` of `times` without replacement, each draw with
/// probability proportional to `exp((best - t) / best)` among those left.
/// When every weight left underflows, the fastest left is taken (ties: the
/// lowest index). Deterministic for a given generator state.
pub fn softmax_survivors(times: &[f64], best: f64, keep: usize, rng: &mut impl Rng) -> Vec<usize> {
    let scale = if best.is_finite() && best > 0.0 {
        best
    } else {
        1.0
    };
    let weight = |t: f64| {
        let w = ((best - t) / scale).exp();
        if w.is_finite() { w } else { 0.0 }
    };
    let mut left: Vec<(usize, f64)> = times.iter().map(|&t| weight(t)).enumerate().collect();
    let mut out = Vec::with_capacity(keep.min(times.len()));
    while out.len() < keep && !left.is_empty() {
        let total: f64 = left.iter().map(|e| e.1).sum();
        let pick = if total > 0.0 && total.is_finite() {
            let mut x = rng.random::<f64>() * total;
            let mut chosen = left.len() - 1;
            for (j, e) in left.iter().enumerate() {
                if x < e.1 {
                    chosen = j;
                    break;
                }
                x -= e.1;
            }
            chosen
        } else {
            let mut chosen = 0;
            for (j, e) in left.iter().enumerate() {
                if times[e.0] < times[left[chosen].0] {
                    chosen = j;
                }
            }
            chosen
        };
        out.push(left.remove(pick).0);
    }
    out
}

/// Runs the search from `initial` (scored first); `eval` scores one
/// individual with a per-thread scratch; `on_generation` sees each
/// generation's statistics as they are recorded.
pub fn run<S: Send, E: Send>(
    breeder: &Breeder<'_>,
    initial: Vec<Individual>,
    seed: u64,
    limits: Limits,
    make_scratch: impl Fn() -> S + Sync + Send,
    eval: impl Fn(&Individual, &mut S) -> Result<Fitness, E> + Sync + Send,
    on_generation: impl Fn(&GenerationStats),
) -> Result<Outcome, E> {
    let started = Instant::now();
    let np = initial.len().max(2);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let score_all = |inds: &[Individual]| -> Result<Vec<Fitness>, E> {
        inds.par_iter()
            .map_init(&make_scratch, |scratch, ind| eval(ind, scratch))
            .collect()
    };
    let mut fitness = score_all(&initial)?;
    let mut population = initial;
    let mut evaluations = population.len() as u64;
    let mut best_i = 0;
    for (i, f) in fitness.iter().enumerate() {
        if f.time_s < fitness[best_i].time_s {
            best_i = i;
        }
    }
    let mut best = (population[best_i].clone(), fitness[best_i]);
    let mut history = vec![stats(0, evaluations, started, &fitness, best.1.time_s)];
    on_generation(&history[0]);
    let mut generation = 0u64;
    let pairs = (np / 4).max(1);
    let cut_by_time = loop {
        if limits.max_generations.is_some_and(|g| generation >= g) {
            break false;
        }
        if limits
            .max_evaluations
            .is_some_and(|e| evaluations + 4 * pairs as u64 > e)
        {
            break false;
        }
        if Instant::now() >= limits.deadline {
            break true;
        }
        // Parents and per-pair seeds, drawn in order.
        let plan: Vec<(usize, usize, u64)> = (0..pairs)
            .map(|_| {
                let a = rng.random_range(0..population.len());
                let mut b = rng.random_range(0..population.len() - 1);
                if b >= a {
                    b += 1;
                }
                (a, b, rng.next_u64())
            })
            .collect();
        let children: Vec<Individual> = plan
            .par_iter()
            .flat_map_iter(|&(a, b, s)| {
                let mut child_rng = ChaCha8Rng::seed_from_u64(s);
                breeder.children(&population[a], &population[b], &mut child_rng)
            })
            .collect();
        let child_fitness = score_all(&children)?;
        evaluations += children.len() as u64;
        for (c, f) in children.iter().zip(&child_fitness) {
            if f.time_s < best.1.time_s {
                best = (c.clone(), *f);
            }
        }
        population.extend(children);
        fitness.extend(child_fitness);
        let times: Vec<f64> = fitness.iter().map(|f| f.time_s).collect();
        let mut keep = softmax_survivors(&times, best.1.time_s, np, &mut rng);
        keep.sort_unstable();
        let mut slots: Vec<Option<Individual>> = population.into_iter().map(Some).collect();
        population = keep.iter().filter_map(|&i| slots[i].take()).collect();
        fitness = keep.iter().map(|&i| fitness[i]).collect();
        generation += 1;
        let entry = stats(generation, evaluations, started, &fitness, best.1.time_s);
        on_generation(&entry);
        history.push(entry);
    };
    Ok(Outcome {
        best: best.0,
        best_fitness: best.1,
        history,
        generations: generation,
        evaluations,
        cut_by_time,
    })
}

fn stats(
    generation: u64,
    evaluations: u64,
    started: Instant,
    fitness: &[Fitness],
    best_ever_s: f64,
) -> GenerationStats {
    let feasible: Vec<f64> = fitness
        .iter()
        .filter(|f| f.feasible)
        .map(|f| f.time_s)
        .collect();
    let (best_s, mean_s, worst_s) = if feasible.is_empty() {
        (None, None, None)
    } else {
        (
            feasible.iter().copied().reduce(f64::min),
            Some(feasible.iter().sum::<f64>() / feasible.len() as f64),
            feasible.iter().copied().reduce(f64::max),
        )
    };
    GenerationStats {
        generation,
        evaluations,
        elapsed_s: started.elapsed().as_secs_f64(),
        best_s,
        mean_s,
        worst_s,
        feasible: feasible.len(),
        alive: fitness.len(),
        best_ever_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_survival_is_deterministic_and_prefers_the_fast() {
        let times: Vec<f64> = (0..40).map(|i| 1.0 + i as f64 * 0.05).collect();
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            softmax_survivors(&times, 1.0, 20, &mut rng)
        };
        assert_eq!(draw(5), draw(5));
        let mut counts = vec![0usize; times.len()];
        for seed in 0..400 {
            let kept = draw(seed);
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 20, "drawn twice: {kept:?}");
            for i in kept {
                counts[i] += 1;
            }
        }
        // exp(0) vs exp(-1.95): the fastest survives far more often.
        let fast: usize = counts[..10].iter().sum();
        let slow: usize = counts[30..].iter().sum();
        assert!(fast > slow + 400, "fast {fast} slow {slow}");
    }

    #[test]
    fn penalised_individuals_survive_only_when_nothing_else_is_left() {
        let mut times = vec![1.0, 1.2, 1e9, 2e9, 1.1];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut kept = softmax_survivors(&times, 1.0, 3, &mut rng);
        kept.sort_unstable();
        assert_eq!(kept, vec![0, 1, 4]);
        // All weights underflow after the feasible ones: the least penalised next.
        let kept = softmax_survivors(&times, 1.0, 4, &mut rng);
        assert!(kept.contains(&2) && !kept.contains(&3), "{kept:?}");
        // Everything infeasible: Eq. 1 over the penalties themselves.
        times = vec![5e9, 4e9, 6e9];
        let kept = softmax_survivors(&times, 4e9, 3, &mut rng);
        assert_eq!(kept.len(), 3);
    }
}
