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
//! - Elitism of one: the fastest individual alive always survives, and Eq. 1
//!   draws the other `Np - 1`. Without it the population drifted away from
//!   its best: Eq. 1 keeps a child 20% slower with 0.82 of a parent's odds,
//!   and the best individual alive got worse over 300 s on every model (RNN-8-8K
//!   from 26.8 s to 83.8 s) while the best ever stayed where it was found.
//!   Keeping one is not the "only the best survive" the paper warns against
//!   (Sec. 5.1): diversity still comes from Eq. 1's draw. The plan returned is
//!   the best individual ever scored (ties: the first scored).
//! - The mutation probability adapts (self-adaptation, as in evolution
//!   strategies). Each individual carries its own `P`, one for its schedule
//!   and one for its allocation (a schedule has thousands of steps, a `CLS`
//!   tens of entries: one rate cannot suit both). The first generation has
//!   the planner's `P` (the paper's 10%) for its allocation and [`P_MIN`]
//!   for its schedule ([`Breeder::first_rates`]): the seeded individuals
//!   carry the request's order (the graph's by default), which on an
//!   unrolled RNN is already the swap-friendly one, and 10% of its steps
//!   (or the 2% the rates had drifted to after 20 s) is 220 (44) random
//!   picks per child on BRNN-4-8K's 2,206 steps, which interleave its
//!   layers; crossover with the random orders still explores, and a rate that makes fast children
//!   doubles in a generation. Measured (20 s each, `swapadvisor_search`,
//!   2026-11-28; the middle variant on a temporary build): on BRNN-4-8K
//!   0.40 of ideal with 10% to start, 0.51 with the seeded half alone at
//!   [`P_MIN`], 0.59 with all of it; RNN-8-8K 0.83 / 0.87, Inception-4
//!   0.73 / 0.74, WResNet-152-10 0.84 / 0.83 (10% / all at [`P_MIN`]).
//!   Each child takes, for each
//!   part, the geometric mean of its parents' `P`, times 2, 1 or 1/2 with
//!   equal odds, within [`P_MIN`, `P_MAX`], and mutates with it; survival
//!   then favours the rates that made fast children. Why: the paper tuned `P` per model ("the
//!   effectiveness of the mutation probability varies with different models.
//!   However, 10% is a good start search point", Sec. 6.1) by a grid search
//!   we cannot afford in tens of seconds, and a fixed 10% mutates an order at
//!   ~200 of ~2,000 steps, so the search never takes small steps from its best
//!   (measured in RESULTS.md: BRNN-4-8K 0.28 of ideal at 10%, 0.51 at 1%).
//!   [`Adaptation::Fixed`] keeps the paper's fixed `P`.
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

/// The smallest mutation probability an adapting `P` reaches: about one
/// random pick per child on a 1,000-op order.
pub const P_MIN: f64 = 0.001;
/// The largest: beyond it a child keeps little of its parents.
pub const P_MAX: f64 = 0.5;

/// Whether the mutation probability stays the planner's or adapts (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Adaptation {
    /// Every child mutates with `P` (the paper).
    Fixed,
    /// Each individual carries its own `P`, inherited and perturbed.
    SelfAdaptive,
}

/// An individual's mutation probabilities: per schedule step and per `CLS` /
/// `CNT` entry.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    pub order: f64,
    pub alloc: f64,
}

impl Rates {
    /// `p` for both parts.
    pub fn both(p: f64) -> Self {
        Rates { order: p, alloc: p }
    }
}

/// What makes children: the graph's constraints and the pool's bounds.
#[derive(Debug)]
pub struct Breeder<'a> {
    pub dag: &'a Dag,
    pub demand: &'a SizeDemand,
    /// `TS`.
    pub ts: &'a [u64],
    pub budget_bytes: u64,
    /// Mutation probability `P` (of the first generation, when it adapts).
    pub p: f64,
    pub adaptation: Adaptation,
    pub search: SearchSpace,
}

impl Breeder<'_> {
    /// The count repair of an allocation gene for a schedule (fits the budget
    /// if it can), then the budget the pool leaves unused given to its
    /// largest classes (`encoding::fill_largest`; the module doc of
    /// `encoding` says why).
    pub fn repair(&self, gene: &mut AllocGene, order: &[OpId]) {
        let bounds = self.demand.bounds(&gene.cls, order);
        encoding::repair_and_fill(self.ts, gene, &bounds, self.budget_bytes);
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

    /// The four children of a pair (Sec. 5.1), each mutated with `self.p` and
    /// repaired.
    pub fn children(&self, a: &Individual, b: &Individual, rng: &mut impl Rng) -> [Individual; 4] {
        self.children_with(a, b, [Rates::both(self.p); 4], rng)
    }

    /// The first generation's mutation probabilities (module doc): the
    /// planner's `P` for both parts when it is fixed; when it adapts, `P` for
    /// the allocation and [`P_MIN`] (or `P`, if smaller) for the schedule.
    pub fn first_rates(&self) -> Rates {
        match self.adaptation {
            Adaptation::Fixed => Rates::both(self.p),
            Adaptation::SelfAdaptive => Rates {
                order: self.p.min(P_MIN),
                alloc: self.p,
            },
        }
    }

    /// A child's mutation probabilities (schedule, allocation) from its
    /// parents' (module doc).
    pub fn child_p(&self, pa: Rates, pb: Rates, rng: &mut impl Rng) -> Rates {
        match self.adaptation {
            Adaptation::Fixed => Rates::both(self.p),
            Adaptation::SelfAdaptive => {
                let mut one = |a: f64, b: f64| {
                    let factor = [0.5, 1.0, 2.0][rng.random_range(0..3)];
                    ((a * b).sqrt() * factor).clamp(P_MIN, P_MAX)
                };
                Rates {
                    order: one(pa.order, pb.order),
                    alloc: one(pa.alloc, pb.alloc),
                }
            }
        }
    }

    /// The four children of a pair, child `i` mutated with the rates `p[i]`.
    pub fn children_with(
        &self,
        a: &Individual,
        b: &Individual,
        p: [Rates; 4],
        rng: &mut impl Rng,
    ) -> [Individual; 4] {
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
        let mut make = |order: &Vec<OpId>, gene: &AllocGene, p: Rates| {
            let order = if self.search.orders() {
                schedule_ops::mutate(self.dag, order, p.order, rng)
            } else {
                order.clone()
            };
            let mut alloc = gene.clone();
            if self.search.allocations() {
                encoding::mutate_alloc(&mut alloc, p.alloc, rng);
                self.repair(&mut alloc, &order);
            }
            Individual { order, alloc }
        };
        [
            make(&s1, &g1, p[0]),
            make(&s1, &g2, p[1]),
            make(&s2, &g1, p[2]),
            make(&s2, &g2, p[3]),
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
    /// The geometric means of the mutation probabilities alive (the
    /// planner's `P` when it does not adapt).
    pub mean_p: Rates,
}

/// A local search run on the best individual between phases of the GA
/// (`run`'s doc): given the best and its time and a deadline, it answers
/// an individual no slower, its time, and whether the deadline stopped it.
pub struct Polisher<'p, E> {
    /// The share of the time left that each polish may take: a GA phase
    /// ends when the time left falls to this share of what it was when the
    /// phase began.
    pub share: f64,
    #[allow(clippy::type_complexity)]
    pub polish: &'p mut dyn FnMut(&Individual, f64, Instant) -> Result<Polished, E>,
}

/// What one polish gives back.
#[derive(Debug, Clone)]
pub struct Polished {
    pub best: Individual,
    pub time_s: f64,
    pub cut_by_time: bool,
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

/// Survival with elitism of one (module doc): the fastest of `times` (ties:
/// the lowest index), then Eq. 1's draw of `keep - 1` among the others.
pub fn elitist_survivors(times: &[f64], best: f64, keep: usize, rng: &mut impl Rng) -> Vec<usize> {
    let Some(elite) = (0..times.len()).reduce(|a, b| if times[b] < times[a] { b } else { a })
    else {
        return Vec::new();
    };
    if keep == 0 {
        return Vec::new();
    }
    let others: Vec<usize> = (0..times.len()).filter(|&i| i != elite).collect();
    let other_times: Vec<f64> = others.iter().map(|&i| times[i]).collect();
    let mut out = vec![elite];
    out.extend(
        softmax_survivors(&other_times, best, keep - 1, rng)
            .into_iter()
            .map(|j| others[j]),
    );
    out
}

/// Runs the search from `initial` (scored first); `eval` scores one
/// individual with a per-thread scratch; `on_generation` sees each
/// generation's statistics as they are recorded.
///
/// With a `polisher`, the search runs in phases: a GA phase ends once the
/// time left has fallen to the polisher's share of what it was at the
/// phase's start (or at a generation or evaluation limit); then the best
/// individual, if it changed since the last polish and is feasible, is
/// polished until the deadline, and a polished individual faster than the
/// best takes the place of the slowest one alive. The GA goes on from there
/// while time is left: a polish that ends early gives its time back to the
/// genetic search, and one that meets the deadline ends the search.
#[allow(clippy::too_many_arguments)]
pub fn run<S: Send, E: Send>(
    breeder: &Breeder<'_>,
    initial: Vec<Individual>,
    seed: u64,
    limits: Limits,
    make_scratch: impl Fn() -> S + Sync + Send,
    eval: impl Fn(&Individual, &mut S) -> Result<Fitness, E> + Sync + Send,
    on_generation: impl Fn(&GenerationStats),
    mut polisher: Option<Polisher<'_, E>>,
) -> Result<Outcome, E> {
    let started = Instant::now();
    let np = initial.len().max(2);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let score_all = |inds: &[Individual]| -> Result<Vec<Fitness>, E> {
        inds.par_iter()
            .map_init(&make_scratch, |scratch, ind| eval(ind, scratch))
            .collect()
    };
    let fitness = score_all(&initial)?;
    let mut evaluations = initial.len() as u64;
    let mut pool = Pool::new(breeder, initial, fitness);
    let mut history = vec![pool.stats(0, evaluations, started)];
    on_generation(&history[0]);
    let mut generation = 0u64;
    let pairs = (np / 4).max(1);
    let phase_end = |from: Instant, share: f64| {
        let left = limits.deadline.saturating_duration_since(from);
        from + left.mul_f64((1.0 - share).clamp(0.0, 1.0))
    };
    let mut phase_deadline = polisher.as_ref().map(|p| phase_end(started, p.share));
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
        if let (Some(p), Some(end)) = (polisher.as_mut(), phase_deadline)
            && Instant::now() >= end
        {
            if pool.polish(breeder, p, limits.deadline)? {
                break true;
            }
            phase_deadline = Some(phase_end(Instant::now(), p.share));
        }
        if Instant::now() >= limits.deadline {
            break true;
        }
        let (children, rates) = pool.breed(breeder, pairs, &mut rng);
        let child_fitness = score_all(&children)?;
        evaluations += children.len() as u64;
        pool.add_children(children, child_fitness, rates);
        pool.survive(np, &mut rng);
        generation += 1;
        let entry = pool.stats(generation, evaluations, started);
        on_generation(&entry);
        history.push(entry);
    };
    // A search stopped by its generation or evaluation limit polishes its
    // best once more with the time it has left.
    if !cut_by_time && let Some(p) = polisher.as_mut() {
        pool.polish(breeder, p, limits.deadline)?;
    }
    Ok(Outcome {
        best: pool.best.0,
        best_fitness: pool.best.1,
        history,
        generations: generation,
        evaluations,
        cut_by_time,
    })
}

/// The GA's state between generations: the population with each
/// individual's fitness and mutation rates, and the best individual found.
struct Pool {
    population: Vec<Individual>,
    fitness: Vec<Fitness>,
    mut_p: Vec<Rates>,
    best: (Individual, Fitness),
    /// The time of the best individual last polished (`None`: none yet).
    polished_s: Option<f64>,
}

impl Pool {
    /// The initial population with its fitness; the best is the fastest
    /// (the first of equals).
    fn new(breeder: &Breeder<'_>, population: Vec<Individual>, fitness: Vec<Fitness>) -> Pool {
        let mut best_i = 0;
        for (i, f) in fitness.iter().enumerate() {
            if f.time_s < fitness[best_i].time_s {
                best_i = i;
            }
        }
        let best = (population[best_i].clone(), fitness[best_i]);
        Pool {
            mut_p: vec![breeder.first_rates(); population.len()],
            population,
            fitness,
            best,
            polished_s: None,
        }
    }

    /// The generation's statistics.
    fn stats(&self, generation: u64, evaluations: u64, started: Instant) -> GenerationStats {
        stats(
            generation,
            evaluations,
            started,
            &self.fitness,
            self.best.1.time_s,
            &self.mut_p,
        )
    }

    /// Polishes the best individual (unless infeasible or polished already at
    /// its time); a faster result replaces the slowest alive (ties: the
    /// first) and becomes the best. Returns whether the polish was cut by the
    /// deadline.
    fn polish<E>(
        &mut self,
        breeder: &Breeder<'_>,
        polisher: &mut Polisher<'_, E>,
        deadline: Instant,
    ) -> Result<bool, E> {
        if !self.best.1.feasible || self.polished_s == Some(self.best.1.time_s) {
            return Ok(false);
        }
        let r = (polisher.polish)(&self.best.0, self.best.1.time_s, deadline)?;
        if r.time_s < self.best.1.time_s {
            let fit = Fitness {
                time_s: r.time_s,
                feasible: true,
            };
            // The slowest alive (ties: the first) makes room.
            let fitness = &self.fitness;
            let worst = (0..fitness.len())
                .rev()
                .max_by(|&a, &b| fitness[a].time_s.total_cmp(&fitness[b].time_s))
                .unwrap_or(0);
            if worst < self.population.len() {
                self.population[worst] = r.best.clone();
                self.fitness[worst] = fit;
                self.mut_p[worst] = breeder.first_rates();
            }
            self.best = (r.best, fit);
        }
        self.polished_s = Some(self.best.1.time_s);
        Ok(r.cut_by_time)
    }

    /// One generation's children: `pairs` pairs of parents, the children's
    /// mutation probabilities and a seed per pair drawn from `rng` in order,
    /// then each pair's four children bred in parallel from its own seed.
    /// Returns the children and their mutation rates.
    fn breed(
        &self,
        breeder: &Breeder<'_>,
        pairs: usize,
        rng: &mut ChaCha8Rng,
    ) -> (Vec<Individual>, Vec<Rates>) {
        let population = &self.population;
        let plan: Vec<(usize, usize, [Rates; 4], u64)> = (0..pairs)
            .map(|_| {
                let a = rng.random_range(0..population.len());
                let mut b = rng.random_range(0..population.len() - 1);
                if b >= a {
                    b += 1;
                }
                let p = std::array::from_fn(|_| breeder.child_p(self.mut_p[a], self.mut_p[b], rng));
                (a, b, p, rng.next_u64())
            })
            .collect();
        let children: Vec<Individual> = plan
            .par_iter()
            .flat_map_iter(|&(a, b, p, s)| {
                let mut child_rng = ChaCha8Rng::seed_from_u64(s);
                breeder.children_with(&population[a], &population[b], p, &mut child_rng)
            })
            .collect();
        let rates = plan.iter().flat_map(|e| e.2).collect();
        (children, rates)
    }

    /// The scored children join the population (a faster one becomes the best).
    fn add_children(
        &mut self,
        children: Vec<Individual>,
        fitness: Vec<Fitness>,
        rates: Vec<Rates>,
    ) {
        self.mut_p.extend(rates);
        for (c, f) in children.iter().zip(&fitness) {
            if f.time_s < self.best.1.time_s {
                self.best = (c.clone(), *f);
            }
        }
        self.population.extend(children);
        self.fitness.extend(fitness);
    }

    /// Keeps `np` individuals by [`elitist_survivors`], in population order.
    fn survive(&mut self, np: usize, rng: &mut ChaCha8Rng) {
        let times: Vec<f64> = self.fitness.iter().map(|f| f.time_s).collect();
        let mut keep = elitist_survivors(&times, self.best.1.time_s, np, rng);
        keep.sort_unstable();
        let population = std::mem::take(&mut self.population);
        let mut slots: Vec<Option<Individual>> = population.into_iter().map(Some).collect();
        self.population = keep.iter().filter_map(|&i| slots[i].take()).collect();
        self.fitness = keep.iter().map(|&i| self.fitness[i]).collect();
        self.mut_p = keep.iter().map(|&i| self.mut_p[i]).collect();
    }
}

fn stats(
    generation: u64,
    evaluations: u64,
    started: Instant,
    fitness: &[Fitness],
    best_ever_s: f64,
    mut_p: &[Rates],
) -> GenerationStats {
    let geo_mean = |part: fn(&Rates) -> f64| {
        if mut_p.is_empty() {
            0.0
        } else {
            (mut_p.iter().map(|p| part(p).ln()).sum::<f64>() / mut_p.len() as f64).exp()
        }
    };
    let mean_p = Rates {
        order: geo_mean(|r| r.order),
        alloc: geo_mean(|r| r.alloc),
    };
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
        mean_p,
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

    #[test]
    fn the_fastest_always_survives_and_nobody_twice() {
        // The fastest sits last, where Eq. 1 alone would often drop it when
        // only 2 of 40 survive.
        let mut times: Vec<f64> = (0..40).map(|i| 2.0 + i as f64 * 0.01).collect();
        times[39] = 1.0;
        for seed in 0..200 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let kept = elitist_survivors(&times, 1.0, 2, &mut rng);
            assert_eq!(kept.len(), 2);
            assert_eq!(kept[0], 39);
            assert_ne!(kept[1], 39);
        }
        // Ties: the lowest index is the elite.
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(
            elitist_survivors(&[3.0, 1.0, 1.0], 1.0, 1, &mut rng),
            vec![1]
        );
        assert!(elitist_survivors(&[], 1.0, 3, &mut rng).is_empty());
        assert!(elitist_survivors(&[1.0], 1.0, 0, &mut rng).is_empty());
    }

    /// What a breeder borrows, for tiny-cnn.
    struct TinyCnn {
        dag: Dag,
        ts: Vec<u64>,
        demand: SizeDemand,
    }

    impl TinyCnn {
        fn new() -> Self {
            let g = outcore_graph::zoo::build("tiny-cnn", None, &Default::default(), None)
                .expect("zoo model");
            let ts = encoding::tensor_sizes(&g);
            TinyCnn {
                dag: Dag::new(&g),
                demand: SizeDemand::new(&g, &ts),
                ts,
            }
        }

        /// A joint search's breeder at P = 10% under a 1 GiB budget.
        fn breeder(&self, adaptation: Adaptation) -> Breeder<'_> {
            Breeder {
                dag: &self.dag,
                demand: &self.demand,
                ts: &self.ts,
                budget_bytes: 1 << 30,
                p: 0.1,
                adaptation,
                search: SearchSpace::Joint,
            }
        }
    }

    #[test]
    fn child_rates_are_fixed_or_stay_within_a_factor_two_and_the_bounds() {
        let tiny = TinyCnn::new();
        let fixed = tiny.breeder(Adaptation::Fixed);
        let adapt = tiny.breeder(Adaptation::SelfAdaptive);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let a = Rates {
            order: 0.04,
            alloc: 0.2,
        };
        let b = Rates {
            order: 0.01,
            alloc: 0.2,
        };
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            assert_eq!(fixed.child_p(a, b, &mut rng), Rates::both(0.1));
            let c = adapt.child_p(a, b, &mut rng);
            // Geometric means 0.02 and 0.2; factors 1/2, 1 or 2.
            for (got, mean) in [(c.order, 0.02), (c.alloc, 0.2)] {
                let ratio = got / mean;
                assert!(
                    [0.5, 1.0, 2.0].iter().any(|f| (ratio - f).abs() < 1e-9),
                    "{got} from {mean}"
                );
            }
            seen.insert((c.order * 1e6) as u64);
        }
        assert_eq!(seen.len(), 3, "every factor is drawn");
        let low = Rates::both(P_MIN);
        let high = Rates::both(P_MAX);
        for _ in 0..50 {
            let c = adapt.child_p(low, low, &mut rng);
            assert!(c.order >= P_MIN && c.alloc >= P_MIN);
            let c = adapt.child_p(high, high, &mut rng);
            assert!(c.order <= P_MAX && c.alloc <= P_MAX);
        }
    }

    #[test]
    fn an_adapting_first_generation_starts_its_orders_at_the_floor() {
        let tiny = TinyCnn::new();
        let fixed = tiny.breeder(Adaptation::Fixed);
        assert_eq!(
            fixed.first_rates(),
            Rates::both(0.1),
            "the paper's P for both"
        );
        let mut adapt = tiny.breeder(Adaptation::SelfAdaptive);
        let expected = Rates {
            order: P_MIN,
            alloc: 0.1,
        };
        assert_eq!(adapt.first_rates(), expected);
        // A P below the floor is kept for both parts.
        adapt.p = 0.0005;
        assert_eq!(adapt.first_rates(), Rates::both(0.0005));
    }
}
