//! `swapadvisor`: SwapAdvisor (paper 000, Huang et al., ASPLOS 2020) — a
//! genetic search over the operator schedule and the memory pool together,
//! each candidate given its swaps by the swap planner and scored by the
//! simulated iteration time.
//!
//! - `swap_planner`: Sec. 4.2, the swaps of one (schedule, pool): Belady's
//!   choice within a size class, pairs placed as early as is safe, the double
//!   pass over the iteration.
//! - `schedule_ops`: Sec. 5.2, schedule crossover (Fig. 4) and the
//!   ready-set mutation.
//! - `encoding`: Sec. 5.3, the pool as `CLS` / `CNT`, crossover through the
//!   extended counts, repair and mutation (Fig. 5).
//! - `ga`: Sec. 5.1, the population, four children per pair, softmax
//!   survival (Eq. 1), the convergence history.
//!
//! Fitness is the simulated iteration time of the individual's swap plan,
//! scored by the search evaluator (`outcore_eval`: the same lowering,
//! `verify()` and simulator as every plan) under the individual's own
//! `size-class` pool (its CLS / CNT encoding). Individuals that are not
//! feasible are scored with a penalty (a million times the ideal time, scaled
//! by how badly they fail) and stay in the population. The plan returned is the
//! best individual's, lowered with `lower_schedule`, verified, and carrying its
//! pool as the plan's allocator.
//!
//! Choices where the paper is vague or outcore differs:
//! - Allocators. With the `perfect` allocator or an unsized `size-class` one
//!   asked for, the pool is searched and the plan carries it (the paper). With
//!   a `size-class` pool given, the pool is fixed and only the schedule is
//!   searched. With `best-fit` or `virtual-chunks`, the searched pool is the
//!   swap planner's model of memory and candidates are scored, and the plan
//!   returned, under the allocator asked for.
//! - A plan that fits the budget with nothing swapped (under the allocator
//!   asked for) is returned as it is, as every planner does first.
//! - Seeding. The paper's first generation is random. [`Seeding::Seeded`] (the
//!   default) replaces up to 18 random individuals with seeds: each seed
//!   order (the request's, the graph's by default, and the eager-update
//!   order, see `Env::seed_orders`) with greedy pools: one class per size,
//!   as is or with adjacent classes merged while the pool of soft floors
//!   (what two consecutive ops hold at once) takes more than a quarter, a
//!   half, three quarters or all of the budget (one seed each; the merge
//!   saving most first), or with the 2, 3, ..., [`TOP_MERGED`] largest sizes
//!   in one class; each class grown from its minimum while the swap planner runs
//!   short of it on that order, then the spare budget shared by how many
//!   buffers of each class are at once in use or between two uses at most
//!   [`HOT_OPS`] ops apart, then by how many are live at once, with nothing
//!   swapped. `swapadvisor-order-only` keeps the fastest of these pools,
//!   `swapadvisor-alloc-only` the fastest seed's order. Why the merged
//!   largest sizes: on BRNN-4-8K the GA's best pools put the 327 MB to 2 GiB
//!   tensors in one class of seven 2 GiB objects, which no soft-floor merge
//!   reaches (no single adjacent merge saves bytes there), and in the
//!   eager-update order every soft-floor seed ran over the budget (the
//!   update's swap-in needs a fourth 2 GiB object while the last gradient
//!   sum holds three); with them the best seed went from 0.25 to 0.66 of
//!   ideal. Why
//!   the default: the paper searches for 30 minutes on 72 cores, outcore for
//!   tens of seconds on a few; a random order of an unrolled RNN interleaves
//!   layers (Sec. 6.2), which a short search does not undo, and a random pool
//!   of a model with many sizes rarely lets every op run. When the pool is
//!   searched, the seeded first generation is filled up to half of `Np` with
//!   the fastest seed's order and random pools, the other half random as in
//!   the paper: with only five seeds among random orders, every child of a
//!   seed is crossed with a random order, and on BRNN-4-8K at 16 GiB
//!   (2 cores, 60 s) the search never got past its seed (25% of ideal),
//!   while a search of the pool alone on the seed's order reached 61% in
//!   60 s. [`Seeding::Random`] is the paper's.
//! - The pool's polish ([`polish`], outcore's addition; the paper has only
//!   the GA). Wherever the pool is searched, the GA runs in phases: each
//!   ends once the time left falls to [`POLISH_SHARE`] of what it was at the
//!   phase's start, then the best individual's pool is polished by a local
//!   search (class splits, merges, object transfers) and the GA goes on with
//!   the polished individual in place of its slowest and with whatever time
//!   the polish did not use. Why: on NasNet-25 the GA's best pool wasted a
//!   third of its largest class on rounding and did not move from 100 s to
//!   300 s; with the polish, 60 s searches end at 27.08 / 27.36 / 27.35 s
//!   per iteration (seeds 0 to 2) where they ended at 27.69 / 27.64 s,
//!   ahead of `odswap`'s 27.43 s. `polish_share: 0.0` turns it off.
//! - On a terminal, standard error shows one progress line per generation
//!   (best and mean time, evaluations per second), cleared at the end; nothing
//!   is written when standard error is not a terminal, nor where
//!   `progress_line` is off (`outcore` runs this search as a seed and shows
//!   its own).
//! - Ablations (Sec. 6.4): `swapadvisor-order-only` keeps the seed's pool and
//!   searches the schedule; `swapadvisor-alloc-only` keeps a schedule and
//!   searches the pool. Which schedule ([`FixedOrder`]): by default the
//!   framework's default one, as in the paper ("without searching a good
//!   schedule": MXNet's, which Sec. 6.2 says interleaves the layers of an
//!   RNN like a random topological order does), that is
//!   [`outcore_plan::framework_default_order`] (the post-order depth-first
//!   visit from the outputs by which nnvm indexes the graph MXNet's executor
//!   runs); or the fastest seed's ([`FixedOrder::FastestSeed`], the graph's
//!   or the eager-update order), which tells how much the pool search adds
//!   to a good schedule rather than how much the schedule search adds. A
//!   request that sets an order fixes that one either way.

mod copy_queue;
mod d2h_order;
mod edf;
mod encoding;
mod ga;
mod h2d_order;
pub mod polish;
mod schedule_ops;
mod swap_planner;

pub use encoding::{
    AllocGene, Bounds, PoolModel, SizeDemand, class_sizes, cls_valid, pool_bytes, tensor_sizes,
};
pub use ga::{
    Adaptation, Breeder, Fitness, GenerationStats, Individual, Limits, P_MAX, P_MIN, Rates,
    SearchSpace, elitist_survivors, softmax_survivors,
};
pub use schedule_ops::Dag;
pub use swap_planner::{Facts, PoolShortfall, SwapPlan, plan_first_pass, plan_swaps};

use crate::framework::{Ctx, Score, Scored, Search};
use outcore_eval::{Evaluator, Scratch, SimSummary};
use outcore_graph::{Graph, OpId};
use outcore_plan::{
    AllocatorSpec, Infeasible, InfeasibleKind, PlanOutcome, PlanRequest, Planner, PlannerError,
    PlannerErrorKind, fmt_bytes,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Ops between two uses of a buffer within which the seed's pool counts it
/// as needed throughout (evicting it would bring it straight back): an
/// unrolled LSTM's weights and gradient accumulators come back every three or
/// four ops.
pub const HOT_OPS: usize = 8;

/// The seeds' pools with the largest sizes merged: the 2 largest in one
/// class, the 3 largest, ..., up to this many (module doc).
pub const TOP_MERGED: usize = 5;

/// By default, the share of the time left at a GA phase's start that the
/// phase leaves to the pool's polish (module doc; measured in RESULTS.md,
/// "The pool polished between GA phases").
pub const POLISH_SHARE: f64 = 1.0 / 3.0;

/// The schedule `swapadvisor-alloc-only` keeps (module doc, "Ablations").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedOrder {
    /// [`outcore_plan::framework_default_order`]: MXNet's default schedule,
    /// the paper's setting.
    FrameworkDefault,
    /// The fastest seed's order (the graph's or the eager-update one).
    FastestSeed,
}

impl FixedOrder {
    fn name(self) -> &'static str {
        match self {
            FixedOrder::FrameworkDefault => "framework default",
            FixedOrder::FastestSeed => "fastest seed",
        }
    }
}

/// How the first generation is made (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seeding {
    /// Every individual random (the paper).
    Random,
    /// One individual is the request's order with a greedy pool.
    Seeded,
}

impl Seeding {
    fn name(self) -> &'static str {
        match self {
            Seeding::Random => "random",
            Seeding::Seeded => "seeded",
        }
    }
}

/// The SwapAdvisor planner and its search settings.
#[derive(Debug, Clone)]
pub struct SwapAdvisor {
    /// `Np`: individuals alive per generation (the paper: 144).
    pub population: usize,
    /// `P`: mutation probability per schedule step and per CLS / CNT entry
    /// (the paper: 10%); when it adapts, the first generation's for the
    /// allocation (the schedule's starts at [`ga::P_MIN`]; see `ga`).
    pub mutation_probability: f64,
    /// Whether `P` stays fixed (the paper) or adapts per individual (the
    /// default; see `ga`'s module doc for why).
    pub adaptation: Adaptation,
    pub search: SearchSpace,
    pub seeding: Seeding,
    /// Stop after this many generations (besides the request's time limit).
    pub max_generations: Option<u64>,
    /// Stop before a generation would score more than this many individuals.
    pub max_evaluations: Option<u64>,
    /// The share of the time left at a GA phase's start that the phase
    /// leaves to the pool's polish ([`polish`]; 0 turns the polish off). It
    /// runs wherever the pool is searched.
    pub polish_share: f64,
    /// The schedule the allocation-only search keeps (module doc).
    pub fixed_order: FixedOrder,
    /// Show one progress line per generation on a terminal (module doc);
    /// off where another search runs this one as a part and shows its own.
    pub progress_line: bool,
}

impl SwapAdvisor {
    /// The paper's settings (Np = 144, P = 10% at the start; the schedule's
    /// at 0.1%), seeded, searching `search`, with `P` adapting per individual.
    pub fn new(search: SearchSpace) -> Self {
        SwapAdvisor {
            population: 144,
            mutation_probability: 0.1,
            adaptation: Adaptation::SelfAdaptive,
            search,
            seeding: Seeding::Seeded,
            max_generations: None,
            max_evaluations: None,
            polish_share: POLISH_SHARE,
            fixed_order: FixedOrder::FrameworkDefault,
            progress_line: true,
        }
    }

    fn check(&self) -> Result<(), PlannerError> {
        let bad = |what: String| {
            Err(PlannerError::new(
                self.name(),
                PlannerErrorKind::InvalidRequest,
                what,
            ))
        };
        if !(2..=100_000).contains(&self.population) {
            return bad(format!(
                "population {} is out of range; give 2 to 100000 (the paper uses 144)",
                self.population
            ));
        }
        let p = self.mutation_probability;
        if !(p.is_finite() && (0.0..=1.0).contains(&p)) {
            return bad(format!(
                "mutation probability {p} is out of range; give 0 to 1 (the paper uses 0.1)"
            ));
        }
        let share = self.polish_share;
        if !(share.is_finite() && (0.0..1.0).contains(&share)) {
            return bad(format!(
                "pool polish share {share} is out of range; give 0 (no polish) up to but not including 1 (the default is {POLISH_SHARE:.3})"
            ));
        }
        Ok(())
    }
}

impl Planner for SwapAdvisor {
    fn name(&self) -> &'static str {
        match self.search {
            SearchSpace::Joint => "swapadvisor",
            SearchSpace::OrderOnly => "swapadvisor-order-only",
            SearchSpace::AllocationOnly => "swapadvisor-alloc-only",
        }
    }

    fn description(&self) -> &'static str {
        match self.search {
            SearchSpace::Joint => {
                "genetic search over operator order and size-class pool, Belady swaps per class (SwapAdvisor Sec. 4-5)"
            }
            SearchSpace::OrderOnly => {
                "SwapAdvisor searching the operator order only, pool fixed (Sec. 6.4 ablation)"
            }
            SearchSpace::AllocationOnly => {
                "SwapAdvisor searching the size-class pool only, order fixed to MXNet's default schedule (Sec. 6.4 ablation)"
            }
        }
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        self.check()?;
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        if let Some(outcome) = search.fits_as_is()? {
            return Ok(outcome);
        }
        let env = Env::new(self, &ctx, request);
        env.search(&search)
    }

    fn draws_own_progress(&self) -> bool {
        self.progress_line
    }
}

/// How the pool relates to the allocator asked for (module doc).
#[derive(Debug, Clone)]
enum PoolMode {
    /// The pool is searched and is the plan's allocator.
    Own,
    /// A given pool: fixed, and the plan's allocator.
    Fixed(PoolModel),
    /// The pool is searched as a model; plans run under the allocator asked for.
    ModelFor(AllocatorSpec),
}

/// Everything the fitness of an individual needs, shared by every thread.
struct Env<'a, 'g> {
    planner: &'a SwapAdvisor,
    ctx: &'a Ctx<'g>,
    request: &'a PlanRequest<'g>,
    evaluator: Evaluator<'g>,
    facts: Facts<'g>,
    ts: Vec<u64>,
    demand: SizeDemand,
    dag: Dag,
    mode: PoolMode,
    ideal_s: f64,
    search_space: SearchSpace,
}

/// An individual judged in full.
enum Judged {
    Feasible {
        plan: Box<SwapPlan>,
        sim: Box<SimSummary>,
        allocator: AllocatorSpec,
        pool: PoolModel,
    },
    Infeasible {
        /// 0 (closest) to 4 (furthest) from feasible.
        severity: f64,
        kind: InfeasibleKind,
        needed_bytes: Option<u64>,
        message: String,
    },
}

impl<'a, 'g> Env<'a, 'g> {
    fn new(planner: &'a SwapAdvisor, ctx: &'a Ctx<'g>, request: &'a PlanRequest<'g>) -> Self {
        let graph = request.graph;
        let evaluator = Evaluator::with_fingerprint(
            graph,
            request.cost,
            request.budget_bytes,
            AllocatorSpec::Perfect,
            request.graph_fingerprint(),
        );
        let facts = Facts::new(graph, request.cost, evaluator.op_time_s());
        let ts = tensor_sizes(graph);
        let demand = SizeDemand::new(graph, &ts);
        let mode = match request.allocator {
            AllocatorSpec::Perfect => PoolMode::Own,
            AllocatorSpec::SizeClass(c) if c.is_unsized() => PoolMode::Own,
            AllocatorSpec::SizeClass(c) => match PoolModel::of_config(c) {
                Some(model) => PoolMode::Fixed(model),
                None => PoolMode::Own,
            },
            other => PoolMode::ModelFor(other.clone()),
        };
        let search_space = match mode {
            PoolMode::Fixed(_) => SearchSpace::OrderOnly,
            _ => planner.search,
        };
        let ideal_s: f64 = evaluator.op_time_s().iter().sum();
        Env {
            planner,
            ctx,
            request,
            evaluator,
            facts,
            ts,
            demand,
            dag: Dag::new(graph),
            mode,
            ideal_s: if ideal_s > 0.0 { ideal_s } else { 1.0 },
            search_space,
        }
    }

    fn graph(&self) -> &'g Graph {
        self.request.graph
    }

    fn error(&self, kind: PlannerErrorKind, message: impl Into<String>) -> PlannerError {
        PlannerError::new(self.planner.name(), kind, message)
    }

    fn breeder(&self) -> Breeder<'_> {
        Breeder {
            dag: &self.dag,
            demand: &self.demand,
            ts: &self.ts,
            budget_bytes: self.request.budget_bytes,
            p: self.planner.mutation_probability,
            adaptation: self.planner.adaptation,
            search: self.search_space,
        }
    }

    /// A greedy pool of the seed with classes `cls` (module doc), each at its
    /// minimum; while the swap planner runs short of objects on `ctx`'s
    /// order, the class it ran short in gains one (within the budget). Then the rest of the budget goes to
    /// the classes short of their hot buffers, then of their live ones (see
    /// [`Env::live_counts`]), in proportion, if that order still plans.
    fn greedy_alloc(&self, breeder: &Breeder<'_>, ctx: &Ctx<'_>, cls: Vec<u32>) -> AllocGene {
        let budget = self.request.budget_bytes;
        let bounds = self.demand.bounds(&cls, &ctx.order);
        let sizes = encoding::class_sizes(&self.ts, &cls);
        let plans = |cnt: &[u64]| -> Result<(), Option<u64>> {
            let gene = AllocGene {
                cls: cls.clone(),
                cnt: cnt.to_vec(),
            };
            let pool = PoolModel::of_config(&encoding::config_of(&self.ts, &gene)).ok_or(None)?;
            if pool.bytes() > budget {
                return Err(None);
            }
            plan_swaps(&self.facts, &ctx.order, &pool, budget)
                .map(|_| ())
                .map_err(|short| Some(short.class_bytes))
        };
        let mut cnt = bounds.min.clone();
        let mut planned = false;
        let room: u64 = bounds.max.iter().zip(&bounds.min).map(|(h, l)| h - l).sum();
        for _ in 0..=room {
            match plans(&cnt) {
                Ok(()) => {
                    planned = true;
                    break;
                }
                Err(Some(class_bytes)) => {
                    // The largest class of that (rounded, merged) object size.
                    let grow = (0..sizes.len()).rev().find(|&c| {
                        encoding::rounded(sizes[c]) == class_bytes && cnt[c] < bounds.max[c]
                    });
                    match grow {
                        Some(c) => cnt[c] += 1,
                        None => break,
                    }
                }
                Err(None) => break,
            }
        }
        let mut gene = AllocGene {
            cls: cls.clone(),
            cnt: cnt.clone(),
        };
        if planned {
            let (hot, live) = self.live_counts(ctx, &cls);
            let to_hot = self.top_up(&sizes, &cnt, &hot, &bounds.max);
            let to_live = self.top_up(&sizes, &to_hot, &live, &bounds.max);
            if plans(&to_live).is_ok() {
                gene.cnt = to_live;
            } else if plans(&to_hot).is_ok() {
                gene.cnt = to_hot;
            }
        } else {
            breeder.repair(&mut gene, &ctx.order);
        }
        gene
    }

    /// Per class of `cls`, in `ctx`'s order with nothing swapped: how many
    /// of its buffers are at once "hot" (used by the op, or between two uses
    /// at most [`HOT_OPS`] ops apart: evicting one of them would bring it
    /// straight back), and how many are live at once.
    fn live_counts(&self, ctx: &Ctx<'_>, cls: &[u32]) -> (Vec<u64>, Vec<u64>) {
        let n = ctx.n;
        let class_of = encoding::class_of_sizes(cls);
        let k = encoding::n_classes(cls);
        let class = |s: u64| self.ts.binary_search(&s).ok().map(|i| class_of[i]);
        // (position, +1 / -1, class), for live and for hot ranges.
        let mut live_events: Vec<(usize, i64, usize)> = Vec::new();
        let mut hot_events: Vec<(usize, i64, usize)> = Vec::new();
        for t in ctx.owners() {
            let Some(c) = class(ctx.size(t)) else {
                continue;
            };
            let (lo, hi) = ctx.base_interval(t);
            live_events.push((lo, 1, c));
            live_events.push((hi + 1, -1, c));
            let uses = &ctx.uses[t.index()];
            let mut i = 0;
            while i < uses.len() {
                let start = uses[i];
                while i + 1 < uses.len() && uses[i + 1] - uses[i] <= HOT_OPS {
                    i += 1;
                }
                hot_events.push((start, 1, c));
                hot_events.push((uses[i] + 1, -1, c));
                i += 1;
            }
        }
        for (p, &op) in ctx.order.iter().enumerate() {
            if let Some(c) = class(self.graph().op(op).workspace_bytes) {
                for events in [&mut live_events, &mut hot_events] {
                    events.push((p, 1, c));
                    events.push((p + 1, -1, c));
                }
            }
        }
        let most = |mut events: Vec<(usize, i64, usize)>| {
            // Frees before allocations at one position.
            events.sort_unstable_by_key(|e| (e.0, e.1, e.2));
            let mut now = vec![0i64; k];
            let mut most = vec![0u64; k];
            for (p, d, c) in events {
                if p > n {
                    continue;
                }
                now[c] += d;
                most[c] = most[c].max(now[c].max(0) as u64);
            }
            most
        };
        (most(hot_events), most(live_events))
    }

    /// `cnt` plus a share of the spare budget for each class, in proportion
    /// to what it lacks of `target` (capped at `max`).
    fn top_up(&self, sizes: &[u64], cnt: &[u64], target: &[u64], max: &[u64]) -> Vec<u64> {
        let wanted: Vec<u64> = target
            .iter()
            .zip(cnt)
            .map(|(&t, &c)| t.saturating_sub(c))
            .collect();
        let spare = self
            .request
            .budget_bytes
            .saturating_sub(encoding::pool_bytes(sizes, cnt));
        let wanted_bytes = encoding::pool_bytes(sizes, &wanted);
        let scale = if wanted_bytes > spare && wanted_bytes > 0 {
            spare as f64 / wanted_bytes as f64
        } else {
            1.0
        };
        cnt.iter()
            .zip(&wanted)
            .zip(max)
            .map(|((&c, &w), &m)| (c + (w as f64 * scale).floor() as u64).min(m.max(c)))
            .collect()
    }

    /// The seed individuals: each seed order ([`Env::seed_orders`]) with the
    /// greedy pool for each coarsening target (and none) and for each merge
    /// of the largest sizes, distinct, the fastest first.
    fn seeds(&self, breeder: &Breeder<'_>) -> Result<Vec<Individual>, PlannerError> {
        let budget = self.request.budget_bytes;
        let mut seeds: Vec<(Fitness, Individual)> = Vec::new();
        for order in self.seed_orders() {
            let owned;
            let ctx = if order == self.ctx.order {
                self.ctx
            } else {
                owned = Ctx::new(self.graph(), self.request.cost, order);
                &owned
            };
            // One class per size (no merging), merged to each target, and
            // the largest sizes merged into one class.
            let coarsened = [u64::MAX, 1, 2, 3, 4].map(|quarters| {
                let target = if quarters == u64::MAX {
                    u64::MAX
                } else {
                    u64::try_from(budget as u128 * quarters as u128 / 4).unwrap_or(budget)
                };
                self.demand.coarsen(&self.ts, &ctx.order, target)
            });
            let top =
                (2..=TOP_MERGED.min(self.ts.len())).map(|m| encoding::top_merged(self.ts.len(), m));
            for cls in coarsened.into_iter().chain(top) {
                let ind = Individual {
                    order: ctx.order.clone(),
                    alloc: self.greedy_alloc(breeder, ctx, cls),
                };
                if seeds.iter().any(|(_, s)| *s == ind) {
                    continue;
                }
                let f = self.fitness(&ind, &mut Scratch::default())?;
                seeds.push((f, ind));
            }
        }
        // Stable: ties keep the orders' and the coarsening's order.
        seeds.sort_by(|a, b| a.0.time_s.total_cmp(&b.0.time_s));
        Ok(seeds.into_iter().map(|(_, ind)| ind).collect())
    }

    /// The orders the seeds are made in: the request's, and, when the request
    /// plans in the graph's own order, also the eager-update order
    /// ([`outcore_plan::eager_update_order`]: each optimizer update right after its
    /// gradient is complete) if it differs.
    ///
    /// Why (a choice; the paper seeds nothing): a graph lists the optimizer
    /// updates after the whole backward pass, so in its order every weight,
    /// gradient and momentum must come back for the updates at the end, on a
    /// link with no compute left to hide behind; the GA could move each
    /// update up by its ready-set mutation, but with a few dozen updates among
    /// thousands of ops and the schedule's rate at the floor, a minute's
    /// search does not. Measured (`compare --planners swapadvisor --seconds
    /// 30` on the graph and on the same graph with its ops listed in the
    /// eager-update order, `v100-16gb-pcie3`, 16 GiB): BRNN-4-8K 0.589 ->
    /// 0.677 of ideal, Inception-4 0.743 -> 0.766, WResNet-152-10 0.835 ->
    /// 0.837. The seeds of both orders compete; the fastest leads.
    /// The allocation-only search with [`FixedOrder::FrameworkDefault`]
    /// (and no order in the request) has one seed order, the framework's.
    fn seed_orders(&self) -> Vec<Vec<OpId>> {
        if self.search_space == SearchSpace::AllocationOnly
            && self.planner.fixed_order == FixedOrder::FrameworkDefault
            && self.request.order.is_none()
        {
            return vec![outcore_plan::framework_default_order(self.graph())];
        }
        let mut orders = vec![self.ctx.order.clone()];
        orders.extend(crate::framework::eager_order_if_other(self.request));
        orders
    }

    fn initial_population(&self, breeder: &Breeder<'_>) -> Result<Vec<Individual>, PlannerError> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.request.seed ^ 0x5eed_5eed_5eed_5eed);
        let seeds = self.seeds(breeder)?;
        let Some(best_seed) = seeds.first().cloned() else {
            return Err(self.error(PlannerErrorKind::Verification, "no seed individual"));
        };
        let np = self.planner.population;
        let mut out = Vec::with_capacity(np);
        if self.planner.seeding == Seeding::Seeded {
            // At most half the generation (there are up to 18 seeds); with
            // the order or the pool fixed, only the seeds with the fastest
            // seed's.
            let (orders, pools) = (self.search_space.orders(), self.search_space.allocations());
            out.extend(
                seeds
                    .into_iter()
                    .filter(|s| {
                        (orders || s.order == best_seed.order)
                            && (pools || s.alloc == best_seed.alloc)
                    })
                    .take((np / 2).max(1)),
            );
            // Half the generation keeps the seed's order with a random pool
            // (module doc: random orders alone bury the seed's order).
            if self.search_space.allocations() {
                while out.len() < np / 2 {
                    let alloc = breeder.random_alloc(&best_seed.order, &mut rng);
                    out.push(Individual {
                        order: best_seed.order.clone(),
                        alloc,
                    });
                }
            }
        }
        while out.len() < np {
            let order = if self.search_space.orders() {
                breeder.random_order(&mut rng)
            } else {
                best_seed.order.clone()
            };
            let alloc = if self.search_space.allocations() {
                breeder.random_alloc(&order, &mut rng)
            } else {
                best_seed.alloc.clone()
            };
            out.push(Individual { order, alloc });
        }
        Ok(out)
    }

    fn pool_of(&self, ind: &Individual) -> Option<(PoolModel, AllocatorSpec)> {
        match &self.mode {
            PoolMode::Fixed(model) => Some((model.clone(), self.request.allocator.clone())),
            PoolMode::Own => {
                let config = encoding::config_of(&self.ts, &ind.alloc);
                let model = PoolModel::of_config(&config)?;
                Some((model, AllocatorSpec::SizeClass(config)))
            }
            PoolMode::ModelFor(spec) => {
                let config = encoding::config_of(&self.ts, &ind.alloc);
                Some((PoolModel::of_config(&config)?, spec.clone()))
            }
        }
    }

    /// Plans an individual's swaps and scores them (module doc).
    fn judge(&self, ind: &Individual, scratch: &mut Scratch) -> Result<Judged, PlannerError> {
        let budget = self.request.budget_bytes;
        let Some((pool, allocator)) = self.pool_of(ind) else {
            return Ok(Judged::Infeasible {
                severity: 4.0,
                kind: InfeasibleKind::NoCandidate,
                needed_bytes: None,
                message: "the pool encoding is not valid".into(),
            });
        };
        let pool_bytes = pool.bytes();
        if pool_bytes > budget {
            let over = (pool_bytes as f64 / budget.max(1) as f64 - 1.0).min(1.0);
            return Ok(Judged::Infeasible {
                severity: 3.0 + over,
                kind: InfeasibleKind::OverBudget,
                needed_bytes: Some(pool_bytes),
                message: format!(
                    "the pool reserves {} but the budget is {} (its classes cannot shrink below what single ops need)",
                    fmt_bytes(pool_bytes),
                    fmt_bytes(budget)
                ),
            });
        }
        let plan = match plan_swaps(&self.facts, &ind.order, &pool, budget) {
            Ok(plan) => plan,
            Err(short) => {
                let n = ind.order.len().max(1) as f64;
                return Ok(Judged::Infeasible {
                    severity: 2.0 + 1.0 - short.position as f64 / n,
                    kind: InfeasibleKind::OverBudget,
                    needed_bytes: None,
                    message: short.message,
                });
            }
        };
        let e = self
            .evaluator
            .evaluate_under(&plan.schedule, &allocator, scratch);
        if let Some(err) = e.schedule_error {
            return Err(self.error(PlannerErrorKind::Lowering, err.to_string()));
        }
        if !e.only_over_budget {
            let first = e.first_violation.map(|v| v.to_string()).unwrap_or_default();
            return Err(self.error(
                PlannerErrorKind::Verification,
                format!("{} verify violations, first: {first}", e.violations),
            ));
        }
        if e.violations > 0 {
            let needed = e.bound.peak_bytes;
            return Ok(Judged::Infeasible {
                severity: 1.0 + (needed as f64 / budget.max(1) as f64 - 1.0).clamp(0.0, 1.0),
                kind: InfeasibleKind::OverBudget,
                needed_bytes: Some(needed),
                message: format!(
                    "the swap plan may need {} of device memory in verify's bound, over the {} budget",
                    fmt_bytes(needed),
                    fmt_bytes(budget)
                ),
            });
        }
        let sim = match e.sim {
            Some(Ok(sim)) => sim,
            Some(Err(message)) => {
                return Ok(Judged::Infeasible {
                    severity: 0.5,
                    kind: InfeasibleKind::AllocatorFailure,
                    needed_bytes: None,
                    message,
                });
            }
            None => {
                return Err(self.error(
                    PlannerErrorKind::Simulation,
                    "the evaluator did not simulate a verified schedule",
                ));
            }
        };
        if let Some(oom) = &sim.oom {
            return Ok(Judged::Infeasible {
                severity: 0.5,
                kind: InfeasibleKind::AllocatorFailure,
                needed_bytes: None,
                message: format!(
                    "out of memory in the {} allocator: {}",
                    allocator.name(),
                    oom.message
                ),
            });
        }
        Ok(Judged::Feasible {
            plan: Box::new(plan),
            sim: Box::new(sim),
            allocator,
            pool,
        })
    }

    /// The pool of `best` polished on its order until `deadline` ([`polish`]).
    fn polish(
        &self,
        best: &Individual,
        best_s: f64,
        deadline: Instant,
    ) -> Result<(AllocGene, polish::PolishStats), PlannerError> {
        use rayon::prelude::*;
        let space = polish::PoolSpace {
            ts: &self.ts,
            demand: &self.demand,
            budget_bytes: self.request.budget_bytes,
        };
        let score = |genes: &[AllocGene]| -> Result<Vec<Option<f64>>, PlannerError> {
            genes
                .par_iter()
                .map_init(Scratch::default, |scratch, alloc| {
                    let ind = Individual {
                        order: best.order.clone(),
                        alloc: alloc.clone(),
                    };
                    let f = self.fitness(&ind, scratch)?;
                    Ok(f.feasible.then_some(f.time_s))
                })
                .collect()
        };
        polish::polish(
            &space,
            &best.order,
            best.alloc.clone(),
            best_s,
            deadline,
            score,
        )
    }

    fn fitness(&self, ind: &Individual, scratch: &mut Scratch) -> Result<Fitness, PlannerError> {
        Ok(match self.judge(ind, scratch)? {
            Judged::Feasible { sim, .. } => Fitness {
                time_s: sim.iter_time_s,
                feasible: true,
            },
            Judged::Infeasible { severity, .. } => Fitness {
                time_s: self.ideal_s * 1e6 * (1.0 + severity),
                feasible: false,
            },
        })
    }

    fn search(&self, search: &Search<'_, 'g>) -> Result<PlanOutcome, PlannerError> {
        let (outcome, polished) = self.evolve()?;
        let judged = self.judge(&outcome.best, &mut Scratch::default())?;
        if outcome.best_fitness.feasible != matches!(judged, Judged::Feasible { .. }) {
            return Err(self.error(
                PlannerErrorKind::Verification,
                "the best individual judged differently on a second look (a nondeterministic fitness)",
            ));
        }
        let settings = self.settings(&outcome, polished.as_deref());
        match judged {
            Judged::Feasible {
                plan,
                sim,
                allocator,
                pool,
            } => self.prove_best(search, settings, *plan, &sim, allocator, &pool),
            Judged::Infeasible {
                kind,
                needed_bytes,
                message,
                ..
            } => Ok(PlanOutcome::Infeasible(Infeasible {
                kind,
                needed_bytes,
                budget_bytes: self.request.budget_bytes,
                at: None,
                message: format!(
                    "{}: no individual in {} generations ({} evaluations) is feasible; the closest: {message}",
                    self.planner.name(),
                    outcome.generations,
                    outcome.evaluations
                ),
            })),
        }
    }

    /// Runs the GA from the initial population within the request's time
    /// limit and the planner's generation and evaluation limits, polishing
    /// the best pool between phases where the search space has allocations
    /// and the planner a polish share; the polishes' records come back
    /// (`None` where there were to be none).
    fn evolve(&self) -> Result<(ga::Outcome, Option<Vec<polish::PolishStats>>), PlannerError> {
        let breeder = self.breeder();
        let initial = self.initial_population(&breeder)?;
        let now = Instant::now();
        let limit = Duration::try_from_secs_f64(self.request.time_limit_s.max(0.0))
            .unwrap_or(Duration::from_secs(u64::MAX / 4));
        let polishes = self.search_space.allocations() && self.planner.polish_share > 0.0;
        let mut polished: Vec<polish::PolishStats> = Vec::new();
        let mut polish_best = |best: &Individual, best_s: f64, deadline: Instant| {
            let (alloc, stats) = self.polish(best, best_s, deadline)?;
            polished.push(stats);
            Ok(ga::Polished {
                best: Individual {
                    order: best.order.clone(),
                    alloc,
                },
                time_s: stats.after_s,
                cut_by_time: stats.cut_by_time,
            })
        };
        let polisher = polishes.then_some(ga::Polisher {
            share: self.planner.polish_share,
            polish: &mut polish_best,
        });
        let limits = Limits {
            deadline: now.checked_add(limit).unwrap_or(now),
            max_generations: self.planner.max_generations,
            max_evaluations: self.planner.max_evaluations,
        };
        let progress = Progress::new(
            self.planner.name(),
            self.ideal_s,
            self.planner.progress_line,
        );
        let outcome = ga::run(
            &breeder,
            initial,
            self.request.seed,
            limits,
            Scratch::default,
            |ind, scratch| self.fitness(ind, scratch),
            |h| progress.show(h),
            polisher,
        );
        progress.clear();
        Ok((outcome?, polishes.then_some(polished)))
    }

    /// The plan's record of the search: the GA's settings, its counts and
    /// history, and the polishes (null where there were none to run).
    fn settings(
        &self,
        outcome: &ga::Outcome,
        polished: Option<&[polish::PolishStats]>,
    ) -> serde_json::Value {
        json!({
            "population": self.planner.population,
            "mutation_probability": self.planner.mutation_probability,
            "mutation_adaptation": self.planner.adaptation,
            "search": self.search_space,
            "seeding": self.planner.seeding.name(),
            "fixed_order": (self.search_space == SearchSpace::AllocationOnly)
                .then(|| self.planner.fixed_order.name()),
            "generations": outcome.generations,
            "evaluations": outcome.evaluations,
            "time_limit_cut_search": outcome.cut_by_time,
            "history": outcome.history,
            "polish": polished,
        })
    }

    /// The best individual's plan, with what it swaps and its pool added to
    /// `settings`, proved by `search` and stamped with the request's seed.
    fn prove_best(
        &self,
        search: &Search<'_, 'g>,
        mut settings: serde_json::Value,
        plan: SwapPlan,
        sim: &SimSummary,
        allocator: AllocatorSpec,
        pool: &PoolModel,
    ) -> Result<PlanOutcome, PlannerError> {
        if let Some(map) = settings.as_object_mut() {
            map.insert("tensor_sizes".into(), self.ts.len().into());
            map.insert("pool_classes".into(), pool.class_bytes.len().into());
            map.insert("pool_bytes".into(), pool.bytes().into());
            map.insert("swap_outs".into(), plan.swap_outs.into());
            map.insert("swap_ins".into(), plan.swap_ins.into());
            map.insert(
                "initial_resident_persistent".into(),
                plan.initial_resident.into(),
            );
            map.insert("delayed_prefetches".into(), plan.delayed_prefetches.into());
            map.insert("reordered_swap_ins".into(), plan.reordered_swap_ins.into());
            map.insert("delayed_swap_outs".into(), plan.delayed_swap_outs.into());
        }
        let chosen = Scored {
            settings,
            schedule: Some(plan.schedule),
            score: Score::Feasible {
                iter_time_s: sim.iter_time_s,
                throughput_vs_ideal: sim.throughput_vs_ideal,
                peak_bytes: sim.peak_live_bytes,
                allocator,
            },
        };
        let mut outcome = search.prove(chosen, &[])?;
        if let PlanOutcome::Feasible(plan) = &mut outcome {
            plan.planner.seed = Some(self.request.seed);
        }
        Ok(outcome)
    }
}

/// The progress line on a terminal: generation, best and mean simulated time,
/// evaluations per second, rewritten in place on standard error; nothing when
/// standard error is not a terminal (pipes, files, tests).
struct Progress {
    name: &'static str,
    ideal_s: f64,
    terminal: bool,
}

impl Progress {
    /// Shown only where `wanted` and standard error is a terminal.
    fn new(name: &'static str, ideal_s: f64, wanted: bool) -> Self {
        Progress {
            name,
            ideal_s,
            terminal: wanted && std::io::stderr().is_terminal(),
        }
    }

    fn show(&self, h: &GenerationStats) {
        if !self.terminal {
            return;
        }
        let best = h.best_s.map_or_else(
            || "none feasible yet".to_string(),
            |b| format!("best {b:.4} s ({:.1}% of ideal)", 100.0 * self.ideal_s / b),
        );
        let mean = h
            .mean_s
            .map_or_else(String::new, |m| format!(", mean {m:.4} s"));
        let rate = h.evaluations as f64 / h.elapsed_s.max(1e-9);
        let mut err = std::io::stderr().lock();
        // Progress is a courtesy: a failed write to the terminal is ignored.
        let _ = write!(
            err,
            "\r\x1b[2K{}: generation {}, {best}{mean}, {rate:.0} evaluations/s",
            self.name, h.generation
        );
        let _ = err.flush();
    }

    fn clear(&self) {
        if self.terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_cost::{DeviceProfile, RooflineModel};
    use outcore_plan::eager_update_order;
    use std::collections::BTreeMap;

    /// The zoo's unrolled LSTM, batch 8.
    fn lstm(layers: u64, hidden: u64, seq: u64) -> Graph {
        let knobs: BTreeMap<String, u64> = [("layers", layers), ("hidden", hidden), ("seq", seq)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        outcore_graph::zoo::build("lstm", Some(8), &knobs, None).expect("zoo model")
    }

    /// The first generation of `planner` on an unrolled LSTM at 60% of its
    /// footprint, and the graph's order.
    fn first_generation(planner: &SwapAdvisor) -> (Vec<Individual>, Vec<OpId>) {
        let g = lstm(2, 256, 6);
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("profile"));
        let (fp, _) = outcore_graph::footprint(&g);
        let request = PlanRequest::new(&g, &cost, fp * 6 / 10);
        let ctx = Ctx::for_request(&request, planner.name()).expect("context");
        let env = Env::new(planner, &ctx, &request);
        let population = env
            .initial_population(&env.breeder())
            .expect("first generation");
        (population, ctx.order.clone())
    }

    #[test]
    fn a_seeded_joint_search_starts_half_on_the_seed_orders_with_varied_pools() {
        let planner = SwapAdvisor {
            population: 16,
            ..SwapAdvisor::new(SearchSpace::Joint)
        };
        let (population, order) = first_generation(&planner);
        assert_eq!(population.len(), 16);
        // The seeds are in the graph's order or the eager-update order, and
        // the rest of the first half in the fastest seed's.
        let fastest = &population[0].order;
        let eager = eager_update_order(&lstm(2, 256, 6));
        assert_ne!(eager, order, "the test graph has updates to move");
        assert!(*fastest == order || *fastest == eager);
        assert!(
            population[..8]
                .iter()
                .all(|i| i.order == order || i.order == eager)
        );
        assert!(population.iter().any(|i| i.order == eager));
        assert!(population.iter().any(|i| i.order == order));
        let distinct_pools: std::collections::BTreeSet<_> = population[..8]
            .iter()
            .map(|i| (i.alloc.cls.clone(), i.alloc.cnt.clone()))
            .collect();
        assert!(distinct_pools.len() >= 4, "{} pools", distinct_pools.len());
        // The second half is random, as in the paper.
        assert!(
            population[8..]
                .iter()
                .any(|i| i.order != order && i.order != eager)
        );
    }

    #[test]
    fn the_seeds_pools_include_the_largest_sizes_merged() {
        let planner = SwapAdvisor::new(SearchSpace::Joint);
        let (population, _) = first_generation(&planner);
        let top = population[0].alloc.cls.len();
        for m in 2..=TOP_MERGED.min(top) {
            let cls = encoding::top_merged(top, m);
            assert!(
                population.iter().any(|i| i.alloc.cls == cls),
                "no seed with the {m} largest sizes merged"
            );
        }
    }

    #[test]
    fn random_seeding_and_order_only_keep_their_first_generations() {
        let random = SwapAdvisor {
            population: 16,
            seeding: Seeding::Random,
            ..SwapAdvisor::new(SearchSpace::Joint)
        };
        let (population, order) = first_generation(&random);
        assert!(population.iter().filter(|i| i.order == order).count() < 8);
        // Order only: no random pools; every individual past the seeds has
        // a random order and the best seed's pool.
        let order_only = SwapAdvisor {
            population: 16,
            ..SwapAdvisor::new(SearchSpace::OrderOnly)
        };
        let (population, order) = first_generation(&order_only);
        assert!(population[8..].iter().any(|i| i.order != order));
        assert!(
            population[8..]
                .iter()
                .all(|i| i.alloc == population[0].alloc)
        );
    }
}
