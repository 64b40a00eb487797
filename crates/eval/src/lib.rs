//! outcore-eval: the evaluator every search scores candidates with.
//!
//! A search planner (SwapAdvisor's genetic algorithm, HOME's particle swarm,
//! outcore's joint search) scores tens of thousands of [`Schedule`]s of one
//! graph. Lowering each to a [`Plan`], running `verify()`
//! and `simulate()` costs a graph fingerprint, one allocation per step and
//! per-call analyses. The [`Evaluator`] splits the work the way tract splits a
//! model from its run state:
//! - [`Evaluator`] is immutable and `Sync`: the graph's lookup tables
//!   ([`PreparedGraph`]), every op's time and the copy rates under the cost
//!   model, the budget and the allocator. Build it once per (graph, cost model,
//!   budget, allocator) and share it between threads.
//! - [`Scratch`] holds every buffer one evaluation needs (the compact program,
//!   the lowering's and verify's tables, the simulator's flattened steps). Give
//!   each thread its own and reuse it: after the first call nothing allocates
//!   per step.
//!
//! Exactness is by construction, not by a second model: the evaluator runs the
//! same lowering ([`lower_into`]), the same proof ([`verify_program`]) and the
//! same event loop ([`simulate_program`]) as `lower_schedule`, `verify` and
//! `simulate`, over a [`CompactProgram`] instead of a `Plan`. The property
//! tests in `tests/exact.rs` check the answers are equal on random DAGs and zoo
//! models, with swap and recompute gaps, in graph and in shuffled orders.
//!
//! One deliberate shortcut: with the perfect allocator every iteration of a
//! plan that ends where it started is identical (no allocator state carries
//! over), so the evaluator simulates one iteration where `simulate` defaults to
//! two; with a real allocator it runs as many as asked (default two, as
//! `SimOptions::default()`), since caches carry over. Full lowering and
//! `verify()` remain the proof of every plan a planner returns:
//! [`Evaluator::lower_plan`] builds that plan.

pub mod testing;

use outcore_cost::CostModel;
use outcore_graph::Graph;
use outcore_plan::{
    AllocatorSpec, CompactProgram, LowerScratch, MemoryBound, Plan, PlannerInfo, PreparedGraph,
    Schedule, ScheduleError, VerifyScratch, Violation, ViolationKind, graph_fingerprint,
    lower_into, verify_program,
};
use outcore_sim::{
    SimError, SimOom, SimOptions, SimPrepared, SimReport, SimScratch, StreamBusy, simulate_program,
};

/// Scores schedules of one graph under one cost model, budget and allocator.
#[derive(Debug)]
pub struct Evaluator<'g> {
    graph: &'g Graph,
    sim: SimPrepared,
    fingerprint: String,
    budget_bytes: u64,
    allocator: AllocatorSpec,
}

/// Every buffer one evaluation uses; one per thread, reused between calls.
#[derive(Debug, Default)]
pub struct Scratch {
    lower: LowerScratch,
    program: CompactProgram,
    verify: VerifyScratch,
    violations: Vec<Violation>,
    sim: SimScratch,
}

/// What an evaluation found. The fields mirror the full pipeline's answers:
/// `schedule_error` is `lower_schedule`'s error, `violations` / `first_violation`
/// are `verify()`'s, `bound` is verify's memory bound, `sim` is `simulate()`'s
/// report (run unless the lowering failed or verify found a violation other
/// than the budget).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub schedule_error: Option<ScheduleError>,
    /// Number of violations `verify()` reports.
    pub violations: usize,
    /// The first of them, in `verify()`'s order.
    pub first_violation: Option<Violation>,
    /// Whether every violation is over budget (memory only, the plan is safe).
    pub only_over_budget: bool,
    /// The most bytes that may be resident at an allocating step, and where.
    pub bound: MemoryBound,
    pub sim: Option<Result<SimSummary, String>>,
}

/// The parts of a [`SimReport`] a search ranks by.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSummary {
    pub iter_time_s: f64,
    pub ideal_time_s: f64,
    pub throughput_vs_ideal: f64,
    pub peak_live_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub swap_in_bytes: u64,
    pub swap_out_bytes: u64,
    pub recompute_time_s: f64,
    pub stall_time_s: f64,
    pub busy: StreamBusy,
    /// The allocator's first failure: the plan does not run under it.
    pub oom: Option<SimOom>,
}

impl SimSummary {
    /// The summary of a full report.
    pub fn of(r: &SimReport) -> SimSummary {
        SimSummary {
            iter_time_s: r.iter_time_s,
            ideal_time_s: r.ideal_time_s,
            throughput_vs_ideal: r.throughput_vs_ideal,
            peak_live_bytes: r.peak_live_bytes,
            peak_reserved_bytes: r.peak_reserved_bytes,
            swap_in_bytes: r.swap_in_bytes,
            swap_out_bytes: r.swap_out_bytes,
            recompute_time_s: r.recompute_time_s,
            stall_time_s: r.stall_time_s,
            busy: r.busy,
            oom: r.oom.clone(),
        }
    }
}

/// Whether every violation is over the budget (the plan is safe).
fn only_over_budget(violations: &[Violation]) -> bool {
    violations
        .iter()
        .all(|v| matches!(v.kind, ViolationKind::OverBudget { .. }))
}

/// What [`Evaluator::evaluate_unless_slower`] found.
// Returned by value once per evaluation and matched at once: boxing the
// evaluation would allocate on the search's hot path for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Screened {
    /// Simulated in `iter_time_s`, at least the time given, and not verified:
    /// whether it is safe or fits the budget is unknown.
    Slower { iter_time_s: f64 },
    /// Faster, not lowered, its simulation failed, or the allocator is not
    /// the perfect one: [`Evaluator::evaluate`]'s answer.
    Evaluated(Evaluation),
}

impl Evaluation {
    /// The answer for a lowered schedule with verify's `violations` and
    /// memory `bound`, and the simulation `sim` (where one ran).
    fn verified(
        violations: &[Violation],
        bound: MemoryBound,
        sim: Option<Result<SimSummary, String>>,
    ) -> Evaluation {
        Evaluation {
            schedule_error: None,
            violations: violations.len(),
            first_violation: violations.first().cloned(),
            only_over_budget: only_over_budget(violations),
            bound,
            sim,
        }
    }

    /// The answer for a schedule the lowering refused with `e`.
    fn unlowered(e: ScheduleError) -> Evaluation {
        Evaluation {
            schedule_error: Some(e),
            violations: 0,
            first_violation: None,
            only_over_budget: true,
            bound: MemoryBound::default(),
            sim: None,
        }
    }

    /// Lowered, verified, and simulated without an allocator failure: the plan
    /// is safe, fits the budget and runs.
    pub fn feasible(&self) -> bool {
        self.schedule_error.is_none()
            && self.violations == 0
            && matches!(&self.sim, Some(Ok(s)) if s.oom.is_none())
    }

    /// Simulated iteration time, when the plan was simulated.
    pub fn iter_time_s(&self) -> Option<f64> {
        match &self.sim {
            Some(Ok(s)) => Some(s.iter_time_s),
            _ => None,
        }
    }

    /// A bug rather than a memory shortfall: the lowering refused the schedule,
    /// verify found something other than the budget, or the simulation failed.
    pub fn is_broken(&self) -> bool {
        self.schedule_error.is_some() || !self.only_over_budget || matches!(&self.sim, Some(Err(_)))
    }
}

impl<'g> Evaluator<'g> {
    /// Prepares `graph` under `cost` for a budget and an allocator: computes
    /// the lookup tables, op times, copy rates and the graph fingerprint once.
    pub fn new(
        graph: &'g Graph,
        cost: &dyn CostModel,
        budget_bytes: u64,
        allocator: AllocatorSpec,
    ) -> Self {
        Self::with_fingerprint(
            graph,
            cost,
            budget_bytes,
            allocator,
            graph_fingerprint(graph),
        )
    }

    /// [`Evaluator::new`] with the graph's fingerprint already computed
    /// (`fingerprint` must be `graph_fingerprint(graph)`): it serialises the
    /// whole graph, and a portfolio of searches on one graph needs it once.
    pub fn with_fingerprint(
        graph: &'g Graph,
        cost: &dyn CostModel,
        budget_bytes: u64,
        allocator: AllocatorSpec,
        fingerprint: String,
    ) -> Self {
        Evaluator {
            graph,
            sim: SimPrepared::new(graph, cost),
            fingerprint,
            budget_bytes,
            allocator,
        }
    }

    /// The graph's fingerprint, as every plan of this evaluator carries it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The graph's lookup tables.
    pub fn prepared(&self) -> &PreparedGraph {
        &self.sim.graph
    }

    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// Seconds of each op under the cost model, by op id.
    pub fn op_time_s(&self) -> &[f64] {
        &self.sim.op_time_s
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    pub fn allocator(&self) -> &AllocatorSpec {
        &self.allocator
    }

    /// Scores a schedule (any valid order), reusing `scratch`.
    pub fn evaluate(&self, schedule: &Schedule, scratch: &mut Scratch) -> Evaluation {
        self.evaluate_under(schedule, &self.allocator, scratch)
    }

    /// [`Evaluator::evaluate`] under `allocator` instead of this evaluator's
    /// (same graph, cost model and budget): for searches whose candidates each
    /// carry their own allocator configuration (SwapAdvisor's pool), without
    /// preparing the graph again per candidate.
    pub fn evaluate_under(
        &self,
        schedule: &Schedule,
        allocator: &AllocatorSpec,
        scratch: &mut Scratch,
    ) -> Evaluation {
        if let Err(e) = self.lower_into_scratch(schedule, scratch) {
            return Evaluation::unlowered(e);
        }
        let bound = self.verify_lowered(scratch);
        let sim = only_over_budget(&scratch.violations).then(|| self.simulate(allocator, scratch));
        Evaluation::verified(&scratch.violations, bound, sim)
    }

    /// [`Evaluator::evaluate`], but simulated before it is verified, and not
    /// verified at all where the simulated iteration takes `slower_from_s`
    /// or more ([`Screened::Slower`]). Otherwise the answer is `evaluate`'s,
    /// with the same simulation (`sim` still only where verify found nothing
    /// but the budget).
    ///
    /// Why: a local search accepts only a candidate faster than its current
    /// schedule, and most candidates are not. Verify is the dearest part of
    /// an evaluation (on a 10 s `outcore plan` of BERT-base b32 at 12.5% on
    /// `h100-80gb`, 23% of the samples in `verify_program` against 12% in
    /// `simulate_program`), and its answer does not matter for a candidate
    /// that is slower either way. The simulator needs no proof to time a
    /// program: an unsafe one still gets a time, or a deadlock error.
    ///
    /// Only with the perfect allocator: a real one's simulation of an
    /// unverified program may fail for the program's fault, and is then
    /// not a time to screen by; under any other allocator this is
    /// `evaluate`.
    pub fn evaluate_unless_slower(
        &self,
        schedule: &Schedule,
        scratch: &mut Scratch,
        slower_from_s: f64,
    ) -> Screened {
        if self.allocator != AllocatorSpec::Perfect {
            return Screened::Evaluated(self.evaluate(schedule, scratch));
        }
        if let Err(e) = self.lower_into_scratch(schedule, scratch) {
            return Screened::Evaluated(Evaluation::unlowered(e));
        }
        let sim = self.simulate(&self.allocator, scratch);
        if let Ok(summary) = &sim
            && summary.iter_time_s >= slower_from_s
        {
            return Screened::Slower {
                iter_time_s: summary.iter_time_s,
            };
        }
        let bound = self.verify_lowered(scratch);
        let sim = only_over_budget(&scratch.violations).then_some(sim);
        Screened::Evaluated(Evaluation::verified(&scratch.violations, bound, sim))
    }

    /// [`Evaluator::evaluate`], but not simulated where verify finds the
    /// budget exceeded (`sim` is then `None`): for a caller that wants a
    /// time only for a schedule that fits. Otherwise the answer is
    /// `evaluate`'s.
    ///
    /// Why: a search repairing a schedule over the budget ranks its
    /// candidates by the bytes they need, and most of them still need too
    /// many; the simulation is a quarter to a third of an evaluation (12% of
    /// the samples against 43% for lowering and verify in a 10 s `outcore
    /// plan` profile of BERT-base b32 at 12.5% on `h100-80gb`, 17% against
    /// 38% with the local search's screen).
    pub fn evaluate_within_budget(&self, schedule: &Schedule, scratch: &mut Scratch) -> Evaluation {
        if let Err(e) = self.lower_into_scratch(schedule, scratch) {
            return Evaluation::unlowered(e);
        }
        let bound = self.verify_lowered(scratch);
        let fits = scratch.violations.is_empty();
        let sim = fits.then(|| self.simulate(&self.allocator, scratch));
        Evaluation::verified(&scratch.violations, bound, sim)
    }

    /// Lowers `schedule` into `scratch`'s program.
    fn lower_into_scratch(
        &self,
        schedule: &Schedule,
        scratch: &mut Scratch,
    ) -> Result<(), ScheduleError> {
        let pg = &self.sim.graph;
        scratch
            .program
            .reset(pg.persistent_ids.iter().copied(), self.budget_bytes);
        lower_into(
            self.graph,
            pg,
            schedule,
            &mut scratch.lower,
            &mut scratch.program,
        )
    }

    /// Verifies the program in `scratch` (lowered), leaving its violations
    /// there; verify's memory bound.
    fn verify_lowered(&self, scratch: &mut Scratch) -> MemoryBound {
        scratch.violations.clear();
        verify_program(
            self.graph,
            &self.sim.graph,
            &scratch.program,
            &mut scratch.verify,
            &mut scratch.violations,
        )
    }

    fn simulate(
        &self,
        allocator: &AllocatorSpec,
        scratch: &mut Scratch,
    ) -> Result<SimSummary, String> {
        let iterations = match allocator {
            AllocatorSpec::Perfect => 1,
            // Allocator caches carry over: as many iterations as `simulate` runs.
            _ => SimOptions::default().iterations,
        };
        let options = SimOptions {
            iterations,
            ..SimOptions::default()
        };
        simulate_program(
            self.graph,
            &self.sim,
            &scratch.program,
            allocator,
            &options,
            &mut scratch.sim,
        )
        .map(|out| SimSummary::of(&out.report))
        .map_err(|e: SimError| e.to_string())
    }

    /// The full plan of a schedule, with the allocator and budget of this
    /// evaluator: what a planner returns (and then proves with `verify()`).
    pub fn lower_plan(
        &self,
        schedule: &Schedule,
        info: PlannerInfo,
    ) -> Result<Plan, ScheduleError> {
        let mut plan = Plan::with_fingerprint(
            self.graph,
            info,
            self.budget_bytes,
            self.fingerprint.clone(),
        );
        plan.allocator = self.allocator.clone();
        lower_into(
            self.graph,
            &self.sim.graph,
            schedule,
            &mut LowerScratch::default(),
            &mut plan,
        )?;
        Ok(plan)
    }
}
