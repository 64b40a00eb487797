//! HOME's particle swarm (paper 002, Sec. 3.3 and 3.5, Algorithms 1 and 3).
//!
//! Algorithm 1: `m` particles start as random policies; each iteration
//! evaluates every particle (line 7), keeps the best policy ever seen, and
//! updates every particle (Algorithm 3). Algorithm 3: for each particle and
//! each tensor `j` in turn, set `j`'s action to that of the best policy of the
//! last iteration (`P1`) and evaluate, then to that of the particle's own best
//! policy so far (`P2`) and evaluate, and keep the cheaper (`P1` only when
//! strictly cheaper, as the pseudocode's `if O1 < O2`).
//!
//! Choices, and why:
//! - Algorithm 3 as written costs `2 m n` evaluations per iteration. The
//!   update here evaluates only what can differ: where `P1[j] == P2[j]` both
//!   trials are the same policy, so the action is set without evaluating;
//!   where the particle already holds `P1[j]` (or `P2[j]`) and the cost of its
//!   current policy is known from the previous trial, that trial is not
//!   repeated. The result is exactly Algorithm 3's (the skipped evaluations
//!   would return known numbers); the count of trials actually run is
//!   reported. As the swarm agrees, fewer dimensions differ and iterations
//!   get cheaper.
//! - Initial policies (lines 1-3): the paper says only that they are
//!   random. Drawn uniformly, every particle moves about two thirds of its
//!   feature maps off the device, far from the mostly-retained policies that
//!   win at moderate pressure, and since the update has no randomness the
//!   swarm never reaches what its starts do not contain. So half the starts
//!   are stratified by density ([`initial_policy`]): particle `i < m / 2`
//!   draws each action uniformly with probability `2 (i + 1) / m` and
//!   retains the tensor otherwise, so that half holds every density from
//!   nearly all retained to the uniform draw; the other half are the
//!   paper's uniform draws, which the tightest budgets need. Measured on
//!   HOME's CIFAR-10 models (RESULTS.md, "HOME"): at 1.5x `none`'s maximum
//!   batch, 4 seeds, uniform starts with 128 particles were behind the
//!   recompute-only search `outcore-recompute` on MobileNet at 3 of 4
//!   seeds, half-stratified starts with 512 particles are ahead of it on all
//!   six models at every seed; all starts stratified (256 particles) lost
//!   2-6% of the maximum batch on MobileNet and Plain20, and small swarms
//!   (16 particles) found no plan for ResNet-18 b64 at 60% on the V100.
//! - Fig. 5's worked example compares `P1[j]` with the particle's *current*
//!   action, while Algorithm 3 and the text compare `P1[j]` with `P2[j]`; the
//!   pseudocode is followed.
//! - The update has no randomness: once no particle changes in an update, every
//!   later iteration would repeat the same evaluations, so the search stops
//!   there (`Stop::Converged`) with the answer the full run would give.
//! - Costs are compared lexicographically by (bytes over the capacity, time),
//!   so an infeasible policy ranks by how close it comes, and any feasible
//!   policy beats every infeasible one. Ties keep the earlier particle (line 8
//!   replaces the best only when strictly lower).
//! - Parallel and reproducible: particles are initialised from a ChaCha8
//!   stream per particle (seed, particle index), evaluated and updated in
//!   parallel with rayon, and every reduction runs in particle order, so the
//!   result is the same for any number of threads.
//! - Stagnation: with `patience > 0` the search also stops once that many
//!   iterations in a row have not lowered the best cost (the planner's
//!   default; Fig. 8 and our convergence runs show the best settling within
//!   tens of iterations while the paper's `iters = 500` keeps going).
//! - Time limit: it is checked before every particle update and every 32
//!   dimensions within one; an iteration cut by it is discarded whole, so the
//!   answer is that of the iterations completed. The first evaluation of the
//!   initial swarm always runs.

use super::policy::{Action, PolicySpace};
use outcore_plan::PlannerError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::Serialize;
use std::cmp::Ordering;
use std::time::Instant;

/// What a policy costs: bytes over the capacity first, then seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cost {
    /// 0 when the policy fits.
    pub excess_bytes: u64,
    /// Iteration time (infinite when unknown for an infeasible policy).
    pub time_s: f64,
}

impl Cost {
    pub fn fits(&self) -> bool {
        self.excess_bytes == 0
    }

    /// The total order searches rank by.
    pub fn cmp_key(&self, other: &Cost) -> Ordering {
        self.excess_bytes
            .cmp(&other.excess_bytes)
            .then(self.time_s.total_cmp(&other.time_s))
    }

    pub fn lt(&self, other: &Cost) -> bool {
        self.cmp_key(other) == Ordering::Less
    }
}

/// How policies are scored.
pub trait Objective: Sync {
    type Scratch: Default + Send;
    /// Algorithm 1, line 7: the cost that ranks particles and bests.
    fn evaluate(&self, policy: &[Action], s: &mut Self::Scratch) -> Result<Cost, PlannerError>;
    /// Algorithm 3, lines 6 and 8: the cost of a trial policy.
    fn trial(&self, policy: &[Action], s: &mut Self::Scratch) -> Result<Cost, PlannerError>;
    /// Whether `trial` and `evaluate` are the same function (then a particle's
    /// last trial cost is its line-7 cost and is not computed again).
    fn trial_is_evaluate(&self) -> bool;
}

/// Algorithm 1's parameters.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PsoConfig {
    /// `m`: particles.
    pub particles: usize,
    /// `iters`: iterations.
    pub iterations: usize,
    /// Stop once this many iterations in a row have not lowered the best
    /// cost (0: never; the paper always runs `iters`).
    pub patience: usize,
    pub seed: u64,
}

/// Why the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// All `iters` iterations ran.
    Iterations,
    /// An update changed no particle: later iterations would repeat it.
    Converged,
    /// `patience` iterations in a row did not lower the best cost.
    Stagnated,
    /// The time limit was spent.
    TimeLimit,
}

/// One iteration's costs (Fig. 8): over the particles that fit.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IterationStats {
    pub iteration: usize,
    /// Particles that fit the capacity.
    pub feasible: usize,
    pub worst_s: Option<f64>,
    pub average_s: Option<f64>,
    pub best_s: Option<f64>,
    /// The best policy found so far (fitting or not).
    pub best_so_far: Cost,
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct PsoResult {
    pub best: Vec<Action>,
    pub best_cost: Cost,
    /// The last evaluated swarm, in particle order, with its costs (fallbacks
    /// when the best does not survive the final proof).
    pub last_swarm: Vec<(Vec<Action>, Cost)>,
    pub history: Vec<IterationStats>,
    pub iterations_run: usize,
    pub stop: Stop,
    /// Line-7 evaluations and Algorithm 3 trials actually computed.
    pub evaluations: usize,
    pub trials: usize,
}

/// Particle `index`'s initial policy in a swarm of `m` (module docs): each
/// action drawn uniformly among the tensor's actions with probability
/// `min(1, 2 (index + 1) / m)`, retained otherwise; its own ChaCha8 stream.
pub fn initial_policy(space: &PolicySpace, seed: u64, index: usize, m: usize) -> Vec<Action> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index as u64);
    // The first half of the swarm spans the densities, the second half is
    // the paper's uniform draw.
    let moved_p = (2.0 * (index + 1) as f64 / m.max(1) as f64).min(1.0);
    (0..space.len())
        .map(|j| {
            let actions = space.actions(j);
            let drawn = actions[rng.random_range(0..actions.len())];
            if rng.random::<f64>() < moved_p {
                drawn
            } else {
                Action::Retain
            }
        })
        .collect()
}

/// A policy drawn uniformly (each tensor's action uniform among its
/// actions), from stream `index`: the random policies of the accuracy study.
pub fn random_policy(space: &PolicySpace, seed: u64, index: usize) -> Vec<Action> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index as u64);
    (0..space.len())
        .map(|j| {
            let actions = space.actions(j);
            actions[rng.random_range(0..actions.len())]
        })
        .collect()
}

/// One particle's update (Algorithm 3, lines 3-14), or `None` when the
/// deadline passed during it.
struct Updated {
    policy: Vec<Action>,
    /// The cost of `policy` by `trial`, when the last step computed it.
    cost: Option<Cost>,
    trials: usize,
    changed: bool,
}

/// The index of the least cost (first among equals).
fn argmin(costs: &[Cost]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, c) in costs.iter().enumerate() {
        if best.is_none_or(|b| c.lt(&costs[b])) {
            best = Some(i);
        }
    }
    best
}

/// Algorithm 3 for one particle: `p1` is the last iteration's best, `p2` the
/// particle's best so far, `known` the cost of `current` by `trial` if known.
fn update_particle<O: Objective>(
    objective: &O,
    current: &[Action],
    known: Option<Cost>,
    p1: &[Action],
    p2: &[Action],
    deadline: Instant,
    scratch: &mut O::Scratch,
) -> Result<Option<Updated>, PlannerError> {
    let mut policy = current.to_vec();
    let mut cost = known;
    let mut trials = 0;
    for j in 0..policy.len() {
        if j % 32 == 0 && Instant::now() >= deadline {
            return Ok(None);
        }
        let (a1, a2) = (p1[j], p2[j]);
        if a1 == a2 {
            if policy[j] != a1 {
                policy[j] = a1;
                cost = None;
            }
            continue;
        }
        let held = policy[j];
        let mut cost_with = |a: Action,
                             policy: &mut Vec<Action>,
                             trials: &mut usize|
         -> Result<Cost, PlannerError> {
            if held == a
                && let Some(c) = cost
            {
                return Ok(c);
            }
            policy[j] = a;
            *trials += 1;
            objective.trial(policy, scratch)
        };
        let o1 = cost_with(a1, &mut policy, &mut trials)?;
        let o2 = cost_with(a2, &mut policy, &mut trials)?;
        if o1.lt(&o2) {
            policy[j] = a1;
            cost = Some(o1);
        } else {
            policy[j] = a2;
            cost = Some(o2);
        }
    }
    let changed = policy != current;
    Ok(Some(Updated {
        policy,
        cost,
        trials,
        changed,
    }))
}

/// Runs Algorithms 1 and 3. `on_iteration` sees each iteration's statistics
/// (for a progress display).
pub fn run<O: Objective>(
    space: &PolicySpace,
    config: PsoConfig,
    objective: &O,
    deadline: Instant,
    mut on_iteration: impl FnMut(&IterationStats),
) -> Result<PsoResult, PlannerError> {
    let m = config.particles.max(1);
    // Lines 1-3.
    let mut swarm = Swarm {
        particles: (0..m)
            .map(|i| initial_policy(space, config.seed, i, m))
            .collect(),
        known: vec![None; m],
        personal: Vec::with_capacity(m),
        best: None,
        since_better: 0,
    };
    let mut history = Vec::new();
    let (mut evaluations, mut trials) = (0, 0);
    let mut stop = Stop::Iterations;
    let mut last_swarm = Vec::new();
    let iterations = config.iterations.max(1);
    let mut iterations_run = 0;
    for iteration in 0..iterations {
        // Lines 6-12: evaluate every particle (reusing a known trial cost).
        let (costs, evaluated) = swarm.evaluate(objective)?;
        evaluations += evaluated;
        iterations_run = iteration + 1;
        let Some(it_best) = argmin(&costs) else {
            break;
        };
        swarm.remember(&costs, it_best);
        let stats = iteration_stats(iteration, &costs, swarm.best.as_ref().map(|b| b.1));
        on_iteration(&stats);
        history.push(stats);
        last_swarm = swarm
            .particles
            .iter()
            .cloned()
            .zip(costs.iter().copied())
            .collect();
        if iteration + 1 == iterations {
            break;
        }
        if config.patience > 0 && swarm.since_better >= config.patience {
            stop = Stop::Stagnated;
            break;
        }
        if Instant::now() >= deadline {
            stop = Stop::TimeLimit;
            break;
        }
        // Line 13: Algorithm 3.
        match swarm.update(objective, it_best, deadline)? {
            Moved::Cut => {
                stop = Stop::TimeLimit;
                break;
            }
            Moved::Trials(n, any_changed) => {
                trials += n;
                if !any_changed {
                    stop = Stop::Converged;
                    break;
                }
            }
        }
    }
    let (best, best_cost) = swarm.best.unwrap_or_else(|| {
        (
            space.retain_all(),
            Cost {
                excess_bytes: u64::MAX,
                time_s: f64::INFINITY,
            },
        )
    });
    Ok(PsoResult {
        best,
        best_cost,
        last_swarm,
        history,
        iterations_run,
        stop,
        evaluations,
        trials,
    })
}

/// The swarm between iterations: each particle's policy and, where the last
/// update computed it, its trial cost; each particle's best so far; the
/// global best and how many iterations ago it last improved.
struct Swarm {
    particles: Vec<Vec<Action>>,
    known: Vec<Option<Cost>>,
    personal: Vec<(Vec<Action>, Cost)>,
    best: Option<(Vec<Action>, Cost)>,
    since_better: usize,
}

/// What one Algorithm 3 step over the swarm did.
enum Moved {
    /// The deadline passed before every particle moved: the swarm is as it was.
    Cut,
    /// Every particle moved: the trials computed, and whether any policy changed.
    Trials(usize, bool),
}

impl Swarm {
    /// Line 7 for every particle, in parallel: its cost, reusing the known
    /// trial cost where trial and evaluation are the same function. Returns
    /// the costs and how many were computed.
    fn evaluate<O: Objective>(&self, objective: &O) -> Result<(Vec<Cost>, usize), PlannerError> {
        let reuse = objective.trial_is_evaluate();
        let costs: Vec<(Cost, bool)> = self
            .particles
            .par_iter()
            .zip(self.known.par_iter())
            .map_init(O::Scratch::default, |s, (p, k)| match k {
                Some(c) if reuse => Ok((*c, false)),
                _ => objective.evaluate(p, s).map(|c| (c, true)),
            })
            .collect::<Result<_, _>>()?;
        let evaluated = costs.iter().filter(|c| c.1).count();
        Ok((costs.into_iter().map(|c| c.0).collect(), evaluated))
    }

    /// Lines 8-12: the global best (the iteration's best, `it_best`, where it
    /// is lower) and each particle's personal best.
    fn remember(&mut self, costs: &[Cost], it_best: usize) {
        if self.best.as_ref().is_none_or(|(_, c)| costs[it_best].lt(c)) {
            self.best = Some((self.particles[it_best].clone(), costs[it_best]));
            self.since_better = 0;
        } else {
            self.since_better += 1;
        }
        if self.personal.is_empty() {
            self.personal = self
                .particles
                .iter()
                .cloned()
                .zip(costs.iter().copied())
                .collect();
        } else {
            for (i, c) in costs.iter().enumerate() {
                if c.lt(&self.personal[i].1) {
                    self.personal[i] = (self.particles[i].clone(), *c);
                }
            }
        }
    }

    /// Line 13, Algorithm 3 for every particle in parallel, towards the
    /// iteration's best (`it_best`) and its own best; the swarm moves only
    /// if every particle finished before `deadline`.
    fn update<O: Objective>(
        &mut self,
        objective: &O,
        it_best: usize,
        deadline: Instant,
    ) -> Result<Moved, PlannerError> {
        let reuse = objective.trial_is_evaluate();
        let p1 = self.particles[it_best].clone();
        let updated: Vec<Option<Updated>> = self
            .particles
            .par_iter()
            .zip(self.known.par_iter())
            .zip(self.personal.par_iter())
            .map_init(O::Scratch::default, |s, ((p, k), (p2, _))| {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                // A known line-7 cost is a trial cost only when they are the same function.
                let k = if reuse { *k } else { None };
                update_particle(objective, p, k, &p1, p2, deadline, s)
            })
            .collect::<Result<_, _>>()?;
        if updated.iter().any(Option::is_none) {
            return Ok(Moved::Cut);
        }
        let updated: Vec<Updated> = updated.into_iter().flatten().collect();
        let trials = updated.iter().map(|u| u.trials).sum::<usize>();
        let any_changed = updated.iter().any(|u| u.changed);
        for (i, u) in updated.into_iter().enumerate() {
            self.particles[i] = u.policy;
            self.known[i] = u.cost;
        }
        Ok(Moved::Trials(trials, any_changed))
    }
}

fn iteration_stats(iteration: usize, costs: &[Cost], best_so_far: Option<Cost>) -> IterationStats {
    let fit: Vec<f64> = costs
        .iter()
        .filter(|c| c.fits())
        .map(|c| c.time_s)
        .collect();
    let worst_s = fit.iter().copied().reduce(f64::max);
    let best_s = fit.iter().copied().reduce(f64::min);
    let average_s = (!fit.is_empty()).then(|| fit.iter().sum::<f64>() / fit.len() as f64);
    IterationStats {
        iteration,
        feasible: fit.len(),
        worst_s,
        average_s,
        best_s,
        best_so_far: best_so_far.unwrap_or(Cost {
            excess_bytes: u64::MAX,
            time_s: f64::INFINITY,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_graph::TensorId;

    /// A separable objective: each dimension's action has a fixed cost; the
    /// policy's cost is their sum.
    struct Table(Vec<[f64; 3]>);

    impl Objective for Table {
        type Scratch = usize;
        fn evaluate(&self, p: &[Action], s: &mut usize) -> Result<Cost, PlannerError> {
            self.trial(p, s)
        }
        fn trial(&self, p: &[Action], s: &mut usize) -> Result<Cost, PlannerError> {
            *s += 1;
            let time_s = p.iter().zip(&self.0).map(|(&a, row)| row[a as usize]).sum();
            Ok(Cost {
                excess_bytes: 0,
                time_s,
            })
        }
        fn trial_is_evaluate(&self) -> bool {
            true
        }
    }

    fn space(n: usize) -> PolicySpace {
        PolicySpace {
            feature_maps: (0..n as u32).map(TensorId).collect(),
            recomputable: vec![true; n],
        }
    }

    #[test]
    fn the_update_keeps_the_cheaper_of_the_two_bests_per_tensor() {
        // Dimension 0: swap (1) is cheaper than recompute (2); dimension 1:
        // recompute is cheaper than retain; dimension 2: both bests agree.
        let table = Table(vec![[5.0, 1.0, 2.0], [3.0, 9.0, 0.5], [0.0, 0.0, 0.0]]);
        let p1 = [Action::Recompute, Action::Retain, Action::Swap];
        let p2 = [Action::Swap, Action::Recompute, Action::Swap];
        // Dimension 2 already holds the bests' common action, so the cost of
        // the final policy stays known from its last trial.
        let current = [Action::Retain, Action::Retain, Action::Swap];
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        let mut s = 0usize;
        let u = update_particle(&table, &current, None, &p1, &p2, far, &mut s)
            .expect("no error")
            .expect("no deadline");
        assert_eq!(
            u.policy,
            vec![Action::Swap, Action::Recompute, Action::Swap]
        );
        // 1 + 0.5 + 0: the cost of the final policy, known from its last trial.
        assert_eq!(u.cost.map(|c| c.time_s), Some(1.5));
        assert!(u.changed);
        // Dimension 0 needs two trials; dimension 1 one (the particle holds
        // P1's retain there and the first trial's cost is known); dimension 2
        // none (the bests agree).
        assert_eq!(u.trials, 3);
        assert_eq!(s, 3);
    }

    #[test]
    fn ties_go_to_the_particles_own_best() {
        let table = Table(vec![[1.0, 1.0, 1.0]]);
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        let u = update_particle(
            &table,
            &[Action::Retain],
            None,
            &[Action::Swap],
            &[Action::Recompute],
            far,
            &mut 0,
        )
        .expect("no error")
        .expect("no deadline");
        assert_eq!(u.policy, vec![Action::Recompute]);
    }

    #[test]
    fn the_swarm_finds_the_separable_optimum_and_is_reproducible() {
        // 12 dimensions, each with one cheapest action; 64 particles cover
        // every action of every dimension with near certainty (particle i
        // starts a dimension on a given action other than retain with
        // probability (i + 1) / (3 * 64), so none of the 64 does with
        // probability about exp(-2080 / 192) < 2e-5), and the per-dimension
        // update then keeps it.
        let rows: Vec<[f64; 3]> = (0..12)
            .map(|j| {
                let mut r = [3.0, 2.0, 1.0];
                r.rotate_left(j % 3);
                r
            })
            .collect();
        let optimum: f64 = rows
            .iter()
            .map(|r| r.iter().copied().fold(f64::MAX, f64::min))
            .sum();
        let table = Table(rows);
        let config = PsoConfig {
            particles: 64,
            iterations: 20,
            patience: 0,
            seed: 7,
        };
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        let a = run(&space(12), config, &table, far, |_| {}).expect("runs");
        assert_eq!(a.best_cost.time_s, optimum);
        assert_eq!(a.stop, Stop::Converged);
        // Best-so-far never rises.
        for w in a.history.windows(2) {
            assert!(!w[0].best_so_far.lt(&w[1].best_so_far));
        }
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool")
            .install(|| run(&space(12), config, &table, far, |_| {}).expect("runs"));
        assert_eq!(one.best, a.best);
        assert_eq!(one.iterations_run, a.iterations_run);
        assert_eq!(one.trials, a.trials);
    }

    #[test]
    fn random_policies_use_only_offered_actions() {
        let mut sp = space(200);
        sp.recomputable = (0..200).map(|j| j % 2 == 0).collect();
        let p = random_policy(&sp, 3, 5);
        for (j, a) in p.iter().enumerate() {
            assert!(sp.actions(j).contains(a));
        }
        assert!(p.contains(&Action::Recompute) && p.contains(&Action::Swap));
        assert_ne!(p, random_policy(&sp, 3, 6));
        assert_eq!(p, random_policy(&sp, 3, 5));
    }

    #[test]
    fn initial_policies_spread_from_mostly_retained_to_uniform() {
        let mut sp = space(3000);
        sp.recomputable = (0..3000).map(|j| j % 2 == 0).collect();
        let m = 10;
        let moved = |i: usize| {
            let p = initial_policy(&sp, 11, i, m);
            for (j, a) in p.iter().enumerate() {
                assert!(sp.actions(j).contains(a));
            }
            p.iter().filter(|&&a| a != Action::Retain).count() as f64 / 3000.0
        };
        // Particle i moves a tensor with probability min(1, 2 (i + 1) / m)
        // times the chance the uniform draw is not Retain: (1/2 + 2/3) / 2 =
        // 7/12 here (half the tensors offer two actions, half three).
        for i in 0..m {
            let expected = (2.0 * (i + 1) as f64 / m as f64).min(1.0) * 7.0 / 12.0;
            let got = moved(i);
            assert!(
                (got - expected).abs() < 0.04,
                "particle {i}: {got:.3} moved, expected about {expected:.3}"
            );
        }
        assert_eq!(initial_policy(&sp, 11, 4, m), initial_policy(&sp, 11, 4, m));
        assert_ne!(initial_policy(&sp, 11, 4, m), initial_policy(&sp, 12, 4, m));
    }
}
