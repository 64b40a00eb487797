//! `home`: HOME (He et al., "HOME: A Holistic GPU Memory Management Framework
//! for Deep Learning", paper 002): a particle-swarm search over one action per
//! feature map (retain, swap or recompute) for the whole model at once.
//!
//! The parts, each in its own module:
//! - [`policy`]: the policy space of Sec. 3.3 and its lowering through the
//!   shared decision-to-schedule path (`framework::materialise`), including
//!   how a recomputation that needs a swapped input is resolved;
//! - [`estimate`]: the time-cost evaluator of Sec. 3.4 (Algorithm 2), which
//!   also places the swap-out synchronisations the lowering keeps;
//! - [`pso`]: Algorithms 1 and 3 (the swarm and the per-tensor update).
//!
//! Scoring ([`Scoring`]): the paper scores everything with Algorithm 2. Here
//! Algorithm 2 is kept for what it is fast at, the `O(m n)` trials of
//! Algorithm 3's update, while each iteration's particles (Algorithm 1, line 7:
//! what becomes a best) are scored by outcore's evaluator, which is exact
//! (lowering, `verify()`, simulation). That default, [`Scoring::Hybrid`], was
//! chosen by measurement (RESULTS.md, "HOME"): Algorithm 2 alone picks bests
//! that its memory model wrongly thinks fit, and the evaluator alone is too
//! slow for the update on large graphs. [`Scoring::Algorithm2`] (the paper's)
//! and [`Scoring::Evaluator`] are offered as variants.
//!
//! The returned plan is the best policy by line-7 cost, lowered and proven
//! with the full `lower_schedule` + `verify()` like every planner's; if it does
//! not score feasible with the evaluator (possible under `Scoring::Algorithm2`),
//! the rest of the last swarm is tried in cost order, then the best policy at
//! tighter planning capacities (`framework::MARGINS`), before infeasibility.
//!
//! Defaults (`m` = 512 particles, `iters` = 30, patience 5). Algorithm 3's
//! update has no randomness, so a swarm converges within about 10 iterations
//! to the best mixture of its starts, and the starts decide what it finds
//! (hence the density-stratified starts, [`pso::initial_policy`]). With
//! uniform starts, 16 particles fell up to 1.7% behind recompute-only
//! planners (`dtr`, `checkpoint-sqrt`) on three of HOME's six models at some
//! of 4 seeds (Plain20, SqueezeNet and MobileNet on CIFAR-10 at 1.5x `none`'s
//! maximum batch), 64 still once, and 128 were behind outcore's own
//! recompute-only search (`outcore-recompute`) on MobileNet at 3 of 4 seeds;
//! half-stratified starts with 512 particles are ahead of every
//! single-method planner on the 6 models x 4 seeds (RESULTS.md, "HOME:
//! maximum batch ..."), in 1.1-2.3x the time 128 uniform ones took, since
//! mostly-retained starts converge sooner (BENCHMARKS.md, "HOME: evaluator
//! time per policy and whole-search time"); 30 iterations are never reached
//! on those models,
//! and the search also stops when the swarm stops changing, after `patience`
//! iterations without a better best, and at the request's time limit.
//!
//! A budget below the floor of the policy space ([`below_floor`],
//! [`policy::floor_bytes`]: what stays live with every feature map off the
//! device wherever a policy can take it off) is answered infeasible before
//! the swarm runs, naming the floor and where it peaks. The paper has no
//! such check (its budgets are the GPU's memory, which its models' weights
//! fit); here the tightest budgets leave less than the parameters, gradients
//! and optimizer state HOME never moves (38 of the benchmark suite's 96
//! cases: every graph but DenseNet-121 at 12.5%, BERT-base, GPT-2 and
//! VGG-16 at 25%, VGG-16 and the PyTorch GPT-2 export at 50%), and the
//! swarm spent its whole time limit finding no plan.

pub mod estimate;
pub mod policy;
pub mod pso;

use crate::framework::{Ctx, Score, Scored, Scratch as EvalScratch, Search};
use estimate::{Algorithm2, Scratch as Alg2Scratch};
use outcore_graph::TensorId;
use outcore_plan::{
    Infeasible, InfeasibleKind, PlanOutcome, PlanRequest, Planner, PlannerError, fmt_bytes,
};
use policy::{Action, PolicySpace, action_counts};
use pso::{Cost, Objective, PsoConfig, PsoResult};
use serde::Serialize;
use std::time::{Duration, Instant};

/// What scores policies during the search (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// Algorithm 2 for everything (the paper).
    Algorithm2,
    /// Algorithm 3's trials by Algorithm 2, line 7 by the evaluator (default).
    Hybrid,
    /// The evaluator for everything.
    Evaluator,
}

/// The HOME planner.
#[derive(Debug, Clone, Copy)]
pub struct Home {
    /// `m`.
    pub particles: usize,
    /// `iters`.
    pub iterations: usize,
    /// Iterations without a better best before the search stops (0: never).
    pub patience: usize,
    pub scoring: Scoring,
}

/// Default `m` (see the module docs).
pub const DEFAULT_PARTICLES: usize = 512;
/// Default `iters` (see the module docs).
pub const DEFAULT_ITERATIONS: usize = 30;
/// Default patience (see the module docs).
pub const DEFAULT_PATIENCE: usize = 5;

impl Default for Home {
    fn default() -> Self {
        Home {
            particles: DEFAULT_PARTICLES,
            iterations: DEFAULT_ITERATIONS,
            patience: DEFAULT_PATIENCE,
            scoring: Scoring::Hybrid,
        }
    }
}

/// The candidates of the last swarm tried when the best does not prove feasible.
const FALLBACK_CANDIDATES: usize = 8;

/// Per-thread buffers of the objective.
#[derive(Debug, Default)]
pub struct ObjectiveScratch {
    alg2: Alg2Scratch,
    eval: EvalScratch,
}

/// Scores HOME policies of one request.
struct HomeObjective<'a, 's, 'g> {
    space: &'a PolicySpace,
    model: &'a Algorithm2<'s, 'g>,
    search: &'a Search<'s, 'g>,
    scoring: Scoring,
}

impl HomeObjective<'_, '_, '_> {
    fn budget_bytes(&self) -> u64 {
        self.search.request.budget_bytes
    }

    fn by_algorithm2(&self, policy: &[Action], s: &mut ObjectiveScratch) -> Cost {
        let l = self
            .space
            .lower(self.model, policy, self.budget_bytes(), &mut s.alg2);
        Cost {
            excess_bytes: l.estimate.excess_bytes,
            time_s: l.estimate.time_s,
        }
    }

    fn by_evaluator(
        &self,
        policy: &[Action],
        s: &mut ObjectiveScratch,
    ) -> Result<Cost, PlannerError> {
        let l = self
            .space
            .lower(self.model, policy, self.budget_bytes(), &mut s.alg2);
        let schedule = self.search.ctx.schedule(l.gaps);
        let score = self.search.score(&schedule, &mut s.eval)?;
        Ok(cost_of(&score, self.budget_bytes()))
    }
}

/// A scoring-path answer as a search cost.
fn cost_of(score: &Score, budget_bytes: u64) -> Cost {
    match score {
        Score::Feasible { iter_time_s, .. } => Cost {
            excess_bytes: 0,
            time_s: *iter_time_s,
        },
        Score::OverBudget { needed_bytes, .. } => Cost {
            excess_bytes: needed_bytes.saturating_sub(budget_bytes).max(1),
            time_s: f64::INFINITY,
        },
        // Fits in bytes, not in the allocator: just short of fitting.
        Score::AllocatorFailure { .. } | Score::Shortfall(_) | Score::Skipped => Cost {
            excess_bytes: 1,
            time_s: f64::INFINITY,
        },
    }
}

impl Objective for HomeObjective<'_, '_, '_> {
    type Scratch = ObjectiveScratch;

    fn evaluate(&self, policy: &[Action], s: &mut ObjectiveScratch) -> Result<Cost, PlannerError> {
        match self.scoring {
            Scoring::Algorithm2 => Ok(self.by_algorithm2(policy, s)),
            Scoring::Hybrid | Scoring::Evaluator => self.by_evaluator(policy, s),
        }
    }

    fn trial(&self, policy: &[Action], s: &mut ObjectiveScratch) -> Result<Cost, PlannerError> {
        match self.scoring {
            Scoring::Algorithm2 | Scoring::Hybrid => Ok(self.by_algorithm2(policy, s)),
            Scoring::Evaluator => self.by_evaluator(policy, s),
        }
    }

    fn trial_is_evaluate(&self) -> bool {
        self.scoring != Scoring::Hybrid
    }
}

impl Home {
    /// The plan's settings: the search's parameters and what it did.
    fn settings(
        &self,
        space: &PolicySpace,
        result: &PsoResult,
        chosen: &[Action],
        lowered: &policy::Lowered,
        elapsed_s: f64,
        seed: u64,
    ) -> serde_json::Value {
        let (retain, swap, recompute) = action_counts(chosen);
        serde_json::json!({
            "particles": self.particles,
            "iterations": self.iterations,
            "patience": self.patience,
            "seed": seed,
            "scoring": self.scoring,
            "feature_maps": space.len(),
            "iterations_run": result.iterations_run,
            "stop": result.stop,
            "evaluations": result.evaluations,
            "trials": result.trials,
            "search_s": elapsed_s,
            "retained": retain,
            "swapped": swap,
            "recomputed": recompute,
            "relaxed_recomputations": lowered.relaxed,
            "chain_only_tensors": lowered.chain_only,
            "algorithm2_time_s": lowered.estimate.time_s,
            "algorithm2_syncs": lowered.estimate.syncs,
            "history": result.history,
        })
    }

    /// The candidates to prove, best first: the best policy, then the last
    /// swarm in cost order (deduplicated).
    fn candidates(result: &PsoResult) -> Vec<Vec<Action>> {
        let mut swarm: Vec<&(Vec<Action>, Cost)> = result.last_swarm.iter().collect();
        swarm.sort_by(|a, b| a.1.cmp_key(&b.1));
        let mut out = vec![result.best.clone()];
        for (p, _) in swarm {
            if out.len() > FALLBACK_CANDIDATES {
                break;
            }
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        out
    }
}

/// Whether HOME's policy space has no plan for `request` at all, known
/// before any search: with every feature map off the device wherever a
/// policy can take it off, what stays live still exceeds the budget
/// ([`policy::floor_bytes`]). Then `home` answers infeasible at once
/// instead of spending its time limit finding that out, and the joint
/// planner (which asks this before running `home` as a seed) hands that
/// time to its local search.
pub fn below_floor(request: &PlanRequest<'_>) -> Result<Option<Infeasible>, PlannerError> {
    let ctx = Ctx::for_request(request, "home")?;
    let feature_maps = policy::feature_maps(&ctx);
    Ok(floor_infeasible(&ctx, &feature_maps, request.budget_bytes))
}

/// The infeasibility of `budget_bytes` below the floor of HOME's policy
/// space over `feature_maps`, if it is below.
fn floor_infeasible(
    ctx: &Ctx<'_>,
    feature_maps: &[TensorId],
    budget_bytes: u64,
) -> Option<Infeasible> {
    let (floor_bytes, position) = policy::floor_bytes(ctx, feature_maps);
    if floor_bytes <= budget_bytes {
        return None;
    }
    let op = &ctx.graph.op(ctx.order[position]).name;
    Some(Infeasible {
        kind: InfeasibleKind::OverBudget,
        needed_bytes: Some(floor_bytes),
        budget_bytes,
        at: Some(format!("op `{op}`")),
        message: format!(
            "home: with every feature map off the device between its forward and backward \
             uses, {} is still live at op `{op}` (what no policy of HOME's takes off the \
             device there: parameters, gradients, optimizer state and the feature maps in \
             use), more than the budget of \
             {} ({} short); no policy of HOME's fits: raise the budget to at least {} or use \
             a planner that also moves parameters and optimizer state (`outcore`, `window`)",
            fmt_bytes(floor_bytes),
            fmt_bytes(budget_bytes),
            fmt_bytes(floor_bytes - budget_bytes),
            fmt_bytes(floor_bytes),
        ),
    })
}

impl Planner for Home {
    fn name(&self) -> &'static str {
        "home"
    }

    fn description(&self) -> &'static str {
        "HOME (paper 002, Sec. 3): particle-swarm search over retain / swap / recompute for every feature map, Algorithm 2 time-cost model"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let started = Instant::now();
        let limit = Duration::try_from_secs_f64(request.time_limit_s.max(0.0))
            .unwrap_or(Duration::from_secs(u64::MAX / 4));
        let deadline = started.checked_add(limit).unwrap_or(started);
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let space = PolicySpace::new(&ctx);
        let what = "after searching retain / swap / recompute for every feature map";
        if space.is_empty() {
            return Ok(PlanOutcome::Infeasible(search.infeasible(what, &[])));
        }
        if let Some(infeasible) = floor_infeasible(&ctx, &space.feature_maps, request.budget_bytes)
        {
            return Ok(PlanOutcome::Infeasible(infeasible));
        }
        let model = Algorithm2::new(&ctx, request.cost);
        let objective = HomeObjective {
            space: &space,
            model: &model,
            search: &search,
            scoring: self.scoring,
        };
        let config = PsoConfig {
            particles: self.particles,
            iterations: self.iterations,
            patience: self.patience,
            seed: request.seed,
        };
        let result = pso::run(&space, config, &objective, deadline, |_| {})?;
        let elapsed_s = started.elapsed().as_secs_f64();
        let mut scratch = ObjectiveScratch::default();
        let mut tried: Vec<Scored> = Vec::new();
        for policy in Self::candidates(&result) {
            let lowered = space.lower(&model, &policy, request.budget_bytes, &mut scratch.alg2);
            let settings =
                self.settings(&space, &result, &policy, &lowered, elapsed_s, request.seed);
            let scored = search.scored(settings, lowered.gaps, &mut scratch.eval)?;
            if scored.is_feasible() {
                return search.prove(scored, &[("planning_margin", 1.0.into())]);
            }
            tried.push(scored);
        }
        // Tighter capacities for Algorithm 2's syncs make the best policy's
        // plan hold less.
        let best = &result.best;
        let scored = search.with_margins(&mut scratch.eval, |capacity_bytes, margin| {
            let mut alg2 = Alg2Scratch::default();
            let lowered = space.lower(&model, best, capacity_bytes, &mut alg2);
            let mut settings =
                self.settings(&space, &result, best, &lowered, elapsed_s, request.seed);
            if let Some(map) = settings.as_object_mut() {
                map.insert("planning_margin".into(), margin.into());
            }
            (settings, Ok(lowered.gaps))
        })?;
        if scored.is_feasible() {
            return search.prove(scored, &[]);
        }
        tried.push(scored);
        Ok(PlanOutcome::Infeasible(search.infeasible(what, &tried)))
    }
}
