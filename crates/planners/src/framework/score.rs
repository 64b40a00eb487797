//! The one scoring path and the one way a planner picks and proves its plan.
//!
//! A candidate schedule is scored by [`Search::score`] with the search
//! evaluator ([`outcore_eval::Evaluator`]), which answers exactly as lower ->
//! verify -> simulate would, without building a `Plan`. Whatever scores
//! candidates, the plan a planner returns is lowered in full with
//! `lower_schedule` and proven with `verify()` (`Search::prove`).
//!
//! Choices:
//! - Iterations simulated per score are the evaluator's: one with the perfect
//!   allocator (every iteration of a plan that ends where it started is the
//!   same), two with a real allocator (caches carry over; the report is the
//!   last iteration's, as `simulate`'s default).
//! - `size-class` with no classes given means "size the pool for this plan":
//!   a candidate is first scored under the perfect allocator; if feasible, its
//!   pool comes from its own trace under a perfect allocator
//!   ([`outcore_alloc::SizeClassConfig::for_trace`]) and it is simulated again
//!   under that pool (the full pipeline: the pool differs per candidate). A
//!   pool larger than the budget makes the candidate an allocator failure.
//!   Classes given in the request are used as they are.
//! - An allocator failure (simulated out of memory, a pool that does not fit,
//!   or the simulator refusing a real allocator's configuration) makes the
//!   candidate infeasible, never a returned plan.
//! - Candidates are scored in parallel (rayon, one evaluator scratch per
//!   worker); all scores are collected and the choice is by (score, candidate
//!   index), so the plan is the same for any number of threads. Candidate 0 is
//!   always scored; later ones are skipped once the request's time limit is
//!   spent (`time_limit_cut_search` in the plan's settings).
//! - A lowering error or a verify violation other than memory on any scored
//!   candidate is a planner bug: the search stops with a [`PlannerError`].

use super::ctx::Ctx;
use super::pressure::{MARGINS, margin_budget};
use outcore_alloc::{SizeClassConfig, SizeClassPool};
use outcore_eval::{Evaluation, Evaluator, Scratch, Screened};
use outcore_graph::{Graph, TensorId};
use outcore_plan::{
    AllocatorSpec, Gap, Infeasible, InfeasibleKind, Instr, Plan, PlanOutcome, PlanRequest,
    PlannerError, PlannerErrorKind, PlannerInfo, Schedule, StepRef, Stream, TimedStep, fmt_bytes,
    lower_schedule_prepared, verify,
};
use outcore_sim::{SimOptions, simulate};
use rayon::prelude::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A producer (eviction loop, window sweep) ran short of memory in its own
/// model before any schedule existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub needed_bytes: Option<u64>,
    /// Where, in words.
    pub at: Option<String>,
    pub message: String,
}

/// What the scoring path said about one candidate.
#[derive(Debug, Clone, PartialEq)]
pub enum Score {
    /// Verified within the budget and simulated without running out of memory.
    Feasible {
        iter_time_s: f64,
        throughput_vs_ideal: f64,
        /// Simulated peak of live bytes.
        peak_bytes: u64,
        /// The allocator it was simulated with (a sized pool for `size-class`).
        allocator: AllocatorSpec,
    },
    /// Verified except for memory: the most bytes it may need, and the step
    /// where (put in words only when reported, see [`Search::describe`]).
    OverBudget {
        needed_bytes: u64,
        at_step: Option<StepRef>,
    },
    /// Fits in bytes, but the allocator cannot place it.
    AllocatorFailure { message: String },
    /// No schedule: its producer ran short.
    Shortfall(Shortfall),
    /// Not scored: the time limit was spent.
    Skipped,
}

/// Where [`Search::peak_at`] found a schedule's peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakAt {
    /// At the swap-in of this tensor (`verify` bounds a swap-in by the most
    /// that is live over its window).
    SwapIn(TensorId),
    /// At the compute op at this position of the order.
    Position(usize),
}

/// What [`Search::score_unless_slower`] found.
#[derive(Debug)]
pub enum Screen {
    /// Simulated in `iter_time_s`, no faster than asked, and not verified.
    Slower { iter_time_s: f64 },
    /// Not screened out: [`Search::score`]'s answer.
    Scored(Score),
}

/// One candidate's settings (recorded in the plan), schedule and score.
#[derive(Debug)]
pub struct Scored {
    pub settings: Value,
    pub schedule: Option<Schedule>,
    pub score: Score,
}

impl Scored {
    pub fn is_feasible(&self) -> bool {
        matches!(self.score, Score::Feasible { .. })
    }
}

/// Which feasible candidate [`Search::best`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The least simulated iteration time.
    Fastest,
    /// The least simulated peak of live bytes (then the least time).
    LeastPeak,
}

/// One planner's search on one request: the context, the request, the
/// planner's name and the time limit's deadline.
#[derive(Debug)]
pub struct Search<'s, 'g> {
    pub ctx: &'s Ctx<'g>,
    pub request: PlanRequest<'g>,
    pub name: &'static str,
    deadline: Instant,
    evaluator: Evaluator<'g>,
    /// `size-class` without classes: pools are sized per candidate.
    size_pool_per_candidate: bool,
}

impl<'s, 'g> Search<'s, 'g> {
    /// Starts the clock of the request's time limit now.
    pub fn new(ctx: &'s Ctx<'g>, request: &PlanRequest<'g>, name: &'static str) -> Self {
        let limit = Duration::try_from_secs_f64(request.time_limit_s.max(0.0))
            .unwrap_or(Duration::from_secs(u64::MAX / 4));
        let now = Instant::now();
        let size_pool_per_candidate =
            matches!(request.allocator, AllocatorSpec::SizeClass(c) if c.is_unsized());
        let evaluator_allocator = if size_pool_per_candidate {
            AllocatorSpec::Perfect
        } else {
            request.allocator.clone()
        };
        Search {
            ctx,
            request: *request,
            name,
            deadline: now.checked_add(limit).unwrap_or(now),
            evaluator: Evaluator::with_fingerprint(
                ctx.graph,
                request.cost,
                request.budget_bytes,
                evaluator_allocator,
                request.graph_fingerprint(),
            ),
            size_pool_per_candidate,
        }
    }

    fn error(&self, kind: PlannerErrorKind, message: impl Into<String>) -> PlannerError {
        PlannerError::new(self.name, kind, message)
    }

    /// Lowers a schedule at the request's budget.
    fn lower(&self, schedule: &Schedule, settings: Value) -> Result<Plan, PlannerError> {
        let info = PlannerInfo {
            name: self.name.into(),
            seed: None,
            settings,
        };
        lower_schedule_prepared(
            self.ctx.graph,
            self.evaluator.prepared(),
            self.evaluator.fingerprint().to_owned(),
            schedule,
            info,
            self.request.budget_bytes,
        )
        .map_err(|e| self.error(PlannerErrorKind::Lowering, e.to_string()))
    }

    /// The one scoring path (module doc). A schedule over the budget is not
    /// simulated ([`Evaluator::evaluate_within_budget`]): its score is the
    /// bytes it needs.
    pub fn score(&self, schedule: &Schedule, scratch: &mut Scratch) -> Result<Score, PlannerError> {
        let e = self.evaluator.evaluate_within_budget(schedule, scratch);
        self.score_evaluation(schedule, e)
    }

    /// [`Search::score`], or [`Screen::Slower`] for a schedule whose
    /// simulated iteration takes `slower_from_s` or more, which is then
    /// neither verified nor scored further
    /// ([`Evaluator::evaluate_unless_slower`]): for a search that takes only
    /// what is faster than `slower_from_s`. Where the request's allocator is
    /// sized per candidate this is `score`.
    pub fn score_unless_slower(
        &self,
        schedule: &Schedule,
        scratch: &mut Scratch,
        slower_from_s: f64,
    ) -> Result<Screen, PlannerError> {
        if self.size_pool_per_candidate {
            return self.score(schedule, scratch).map(Screen::Scored);
        }
        match self
            .evaluator
            .evaluate_unless_slower(schedule, scratch, slower_from_s)
        {
            Screened::Slower { iter_time_s } => Ok(Screen::Slower { iter_time_s }),
            Screened::Evaluated(e) => self.score_evaluation(schedule, e).map(Screen::Scored),
        }
    }

    /// The score of `schedule`, evaluated as `e`.
    fn score_evaluation(&self, schedule: &Schedule, e: Evaluation) -> Result<Score, PlannerError> {
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
            return Ok(Score::OverBudget {
                needed_bytes: e.bound.peak_bytes,
                at_step: e.bound.at,
            });
        }
        let sim = match e.sim {
            Some(Ok(sim)) => sim,
            // With a real allocator the simulator's refusal is its
            // configuration's (the only error a verified plan can meet).
            Some(Err(message)) if *self.evaluator.allocator() != AllocatorSpec::Perfect => {
                return Ok(Score::AllocatorFailure { message });
            }
            Some(Err(message)) => return Err(self.error(PlannerErrorKind::Simulation, message)),
            None => {
                return Err(self.error(
                    PlannerErrorKind::Simulation,
                    "the evaluator did not simulate a verified schedule",
                ));
            }
        };
        if let Some(oom) = &sim.oom {
            return Ok(Score::AllocatorFailure {
                message: format!(
                    "out of memory in the {} allocator: {} (free {}, largest free block {})",
                    self.evaluator.allocator().name(),
                    oom.message,
                    fmt_bytes(oom.free_bytes),
                    fmt_bytes(oom.largest_free_block_bytes)
                ),
            });
        }
        if self.size_pool_per_candidate {
            return self.score_with_own_pool(schedule);
        }
        Ok(Score::Feasible {
            iter_time_s: sim.iter_time_s,
            throughput_vs_ideal: sim.throughput_vs_ideal,
            peak_bytes: sim.peak_live_bytes,
            allocator: self.evaluator.allocator().clone(),
        })
    }

    /// The compute stream's stalls in `schedule`'s simulated iteration (s),
    /// under the search's evaluator; `None` unless it lowers, verifies within
    /// the budget and simulates. With a pool sized per candidate this is the
    /// perfect allocator's answer.
    pub fn stall_s(&self, schedule: &Schedule, scratch: &mut Scratch) -> Option<f64> {
        let e = self.evaluator.evaluate(schedule, scratch);
        if !e.feasible() {
            return None;
        }
        match e.sim {
            Some(Ok(sim)) => Some(sim.stall_time_s),
            _ => None,
        }
    }

    /// Where `verify` puts `schedule`'s memory peak, given its `score`, when
    /// that is over the budget: at a swap-in, or at the compute op at a
    /// position of the order (`None` when it fits, the peak is at another
    /// step, or it does not lower). Lowers the schedule again, and only
    /// when it is over the budget.
    ///
    /// Why: a lead that starts many swap-ins earlier at once, each held to a
    /// model of the resident bytes, fails whole when the model misses one of
    /// them (`joint::local`'s fitted lead retries without it).
    pub fn peak_at(&self, schedule: &Schedule, score: &Score) -> Option<PeakAt> {
        let Score::OverBudget {
            at_step: Some(at), ..
        } = score
        else {
            return None;
        };
        let plan = self.lower(schedule, Value::Null).ok()?;
        match plan.step(*at)?.instr {
            Instr::SwapIn(t) => Some(PeakAt::SwapIn(t)),
            Instr::Compute(op) if op.index() < self.ctx.graph.ops.len() => {
                Some(PeakAt::Position(self.ctx.position(op)))
            }
            _ => None,
        }
    }

    /// The tensors whose swap-ins compute waited for in `schedule`'s
    /// simulated iteration, each with the [`QUEUED_BEFORE`] swap-ins the h2d
    /// stream ran just before it (started later, they let it start
    /// earlier), ascending; empty when nothing waits for a swap-in or the
    /// schedule does not lower or simulate.
    ///
    /// A compute step waited for a swap-in when it started after the step
    /// before it on the compute stream ended, and the latest-ending step it
    /// waits for is a swap-in: the rule `outcore`'s report draws its stalls
    /// by (`outcore::report::timeline::stalls`, on the trace), which this
    /// crate cannot call (`outcore` depends on it). One shared function in
    /// `outcore_plan`, beside `TimedStep`, would serve both; not built.
    /// This lowers the schedule to a `Plan` and simulates it with a timeline
    /// (the evaluator records none): a few times an evaluation's cost, for a
    /// search that asks once per accepted move.
    pub fn stalled_swap_ins(&self, schedule: &Schedule) -> Vec<TensorId> {
        let Ok(plan) = self.lower(schedule, Value::Null) else {
            return Vec::new();
        };
        let options = SimOptions {
            // As the evaluator: a real allocator's caches carry over.
            iterations: if *self.evaluator.allocator() == AllocatorSpec::Perfect {
                1
            } else {
                2
            },
            record_timeline: true,
            ..SimOptions::default()
        };
        let timeline = match simulate(self.ctx.graph, &plan, self.request.cost, &options) {
            Ok(out) => out.timeline.unwrap_or_default(),
            Err(_) => return Vec::new(),
        };
        stalled_swap_ins(&plan, &timeline)
    }

    /// A schedule feasible under the perfect allocator, scored under a
    /// size-class pool sized from its own trace (module doc).
    fn score_with_own_pool(&self, schedule: &Schedule) -> Result<Score, PlannerError> {
        let mut plan = self.lower(schedule, Value::Null)?;
        let trace_options = SimOptions {
            iterations: 1,
            record_alloc_trace: true,
            ..SimOptions::default()
        };
        let probe = simulate(self.ctx.graph, &plan, self.request.cost, &trace_options)
            .map_err(|e| self.error(PlannerErrorKind::Simulation, e.to_string()))?;
        let Some(trace) = probe.alloc_trace else {
            return Err(self.error(
                PlannerErrorKind::Simulation,
                "the simulator recorded no allocation trace",
            ));
        };
        let sized = SizeClassConfig::for_trace(&trace);
        if let Err(e) = SizeClassPool::from_config(&sized, self.request.budget_bytes) {
            return Ok(Score::AllocatorFailure {
                message: format!(
                    "the size-class pool this plan needs does not fit the budget of {}: {e}",
                    fmt_bytes(self.request.budget_bytes)
                ),
            });
        }
        plan.allocator = AllocatorSpec::SizeClass(sized);
        let out = match simulate(
            self.ctx.graph,
            &plan,
            self.request.cost,
            &SimOptions::default(),
        ) {
            Ok(out) => out,
            Err(e) => {
                return Ok(Score::AllocatorFailure {
                    message: e.to_string(),
                });
            }
        };
        if let Some(oom) = &out.report.oom {
            return Ok(Score::AllocatorFailure {
                message: format!("out of memory in the sized pool: {}", oom.message),
            });
        }
        Ok(Score::Feasible {
            iter_time_s: out.report.iter_time_s,
            throughput_vs_ideal: out.report.throughput_vs_ideal,
            peak_bytes: out.report.peak_live_bytes,
            allocator: plan.allocator,
        })
    }

    /// Scores one schedule as a candidate.
    pub fn scored(
        &self,
        settings: Value,
        gaps: Vec<Gap>,
        scratch: &mut Scratch,
    ) -> Result<Scored, PlannerError> {
        let schedule = self.ctx.schedule(gaps);
        let score = self.score(&schedule, scratch)?;
        Ok(Scored {
            settings,
            schedule: Some(schedule),
            score,
        })
    }

    /// Plans against tighter internal budgets in turn ([`MARGINS`]) until a
    /// schedule from `produce(budget_bytes, margin)` scores feasible; returns
    /// that, or the first failure (at the real budget, the most informative).
    /// A shortfall stops the loop: the producers' models are exact or
    /// conservative, so a tighter margin cannot help.
    pub fn with_margins(
        &self,
        scratch: &mut Scratch,
        produce: impl Fn(u64, f64) -> (Value, Result<Vec<Gap>, Shortfall>),
    ) -> Result<Scored, PlannerError> {
        let mut first: Option<Scored> = None;
        for margin in MARGINS {
            let (settings, gaps) =
                produce(margin_budget(self.request.budget_bytes, margin), margin);
            let scored = match gaps {
                Ok(gaps) => self.scored(settings, gaps, scratch)?,
                Err(shortfall) => Scored {
                    settings,
                    schedule: None,
                    score: Score::Shortfall(shortfall),
                },
            };
            let stop = matches!(scored.score, Score::Shortfall(_));
            if scored.is_feasible() {
                return Ok(scored);
            }
            first.get_or_insert(scored);
            if stop {
                break;
            }
        }
        Ok(first.unwrap_or(Scored {
            settings: Value::Null,
            schedule: None,
            score: Score::Skipped,
        }))
    }

    /// Scores `eval(item)` for every item in parallel (candidate 0 always,
    /// later ones until the time limit), and returns the best feasible one by
    /// `pick` and candidate index, proven; otherwise an infeasibility built
    /// from the closest failure. `what` says what the planner did, for the
    /// infeasibility message.
    pub fn best<C: Sync>(
        &self,
        what: &str,
        items: &[C],
        pick: Pick,
        eval: impl Fn(&C, &mut Scratch) -> Result<Scored, PlannerError> + Sync,
    ) -> Result<PlanOutcome, PlannerError> {
        let results: Vec<Result<Scored, PlannerError>> = items
            .par_iter()
            .enumerate()
            .map_init(Scratch::default, |scratch, (i, item)| {
                if i > 0 && Instant::now() >= self.deadline {
                    return Ok(Scored {
                        settings: Value::Null,
                        schedule: None,
                        score: Score::Skipped,
                    });
                }
                eval(item, scratch)
            })
            .collect();
        let scored = results.into_iter().collect::<Result<Vec<Scored>, _>>()?;
        let n_scored = scored
            .iter()
            .filter(|s| !matches!(s.score, Score::Skipped))
            .count();
        let mut best: Option<(usize, f64, u64)> = None;
        for (i, s) in scored.iter().enumerate() {
            if let Score::Feasible {
                iter_time_s,
                peak_bytes,
                ..
            } = s.score
            {
                let peak_bytes = if pick == Pick::LeastPeak {
                    peak_bytes
                } else {
                    0
                };
                let better = best.is_none_or(|(_, t, p)| {
                    (peak_bytes, iter_time_s).partial_cmp(&(p, t)) == Some(std::cmp::Ordering::Less)
                });
                if better {
                    best = Some((i, iter_time_s, peak_bytes));
                }
            }
        }
        let Some((index, _, _)) = best else {
            return Ok(PlanOutcome::Infeasible(self.infeasible(what, &scored)));
        };
        let Some(chosen) = scored.into_iter().nth(index) else {
            return Err(self.error(PlannerErrorKind::Verification, "lost the chosen candidate"));
        };
        self.prove(
            chosen,
            &[
                ("candidates_tried", items.len().into()),
                ("candidates_scored", n_scored.into()),
                ("time_limit_cut_search", (n_scored < items.len()).into()),
            ],
        )
    }

    /// The returned plan: the chosen schedule lowered again with its settings
    /// (and `extra` ones), under the allocator it was scored with, verified in
    /// full. Any violation here is a planner bug.
    pub fn prove(
        &self,
        chosen: Scored,
        extra: &[(&str, Value)],
    ) -> Result<PlanOutcome, PlannerError> {
        let (
            Score::Feasible {
                iter_time_s,
                allocator,
                ..
            },
            Some(schedule),
        ) = (chosen.score, chosen.schedule)
        else {
            return Err(self.error(
                PlannerErrorKind::Verification,
                "asked to prove a candidate that did not score feasible",
            ));
        };
        let mut settings = match chosen.settings {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            other => {
                let mut map = serde_json::Map::new();
                map.insert("settings".into(), other);
                map
            }
        };
        for (k, v) in extra {
            settings.insert((*k).into(), v.clone());
        }
        settings.insert("simulated_iter_time_s".into(), iter_time_s.into());
        let mut plan = self.lower(&schedule, Value::Object(settings))?;
        plan.allocator = allocator;
        let violations = verify(&plan, self.ctx.graph);
        if let Some(v) = violations.first() {
            return Err(self.error(
                PlannerErrorKind::Verification,
                format!(
                    "the chosen plan scored feasible but fails verify ({} violations), first: {v}",
                    violations.len()
                ),
            ));
        }
        Ok(PlanOutcome::Feasible(Box::new(plan)))
    }

    /// When the plan with nothing swapped or recomputed is feasible (fits the
    /// budget and the allocator): that plan under this planner's name.
    pub fn fits_as_is(&self) -> Result<Option<PlanOutcome>, PlannerError> {
        let settings = serde_json::json!({
            "note": "the plan fits the budget as it is: nothing swapped or recomputed",
        });
        let scored = self.scored(settings, Vec::new(), &mut Scratch::default())?;
        if !scored.is_feasible() {
            return Ok(None);
        }
        self.prove(scored, &[]).map(Some)
    }

    /// The infeasibility a set of failed candidates comes to: the first
    /// allocator failure, else the candidate that needs the least memory.
    pub fn infeasible(&self, what: &str, scored: &[Scored]) -> Infeasible {
        let budget_bytes = self.request.budget_bytes;
        let mut closest: Option<(u64, &Score)> = None;
        let mut allocator_failure: Option<&str> = None;
        let mut closest_at: Option<(&Schedule, Option<StepRef>)> = None;
        for s in scored {
            let needed = match &s.score {
                Score::OverBudget { needed_bytes, .. } => *needed_bytes,
                Score::Shortfall(f) => f.needed_bytes.unwrap_or(u64::MAX),
                Score::AllocatorFailure { message } => {
                    allocator_failure.get_or_insert(message);
                    continue;
                }
                Score::Feasible { .. } | Score::Skipped => continue,
            };
            if closest.is_none_or(|(n, _)| needed < n) {
                closest = Some((needed, &s.score));
                closest_at = match (&s.score, &s.schedule) {
                    (Score::OverBudget { at_step, .. }, Some(schedule)) => {
                        Some((schedule, *at_step))
                    }
                    _ => None,
                };
            }
        }
        let name = self.name;
        // A candidate that fit in bytes but not in the allocator says more
        // than one that did not fit at all.
        if let Some(message) = allocator_failure {
            return Infeasible {
                kind: InfeasibleKind::AllocatorFailure,
                needed_bytes: None,
                budget_bytes,
                at: None,
                message: format!(
                    "{name}: {what}; every plan that fits {} in bytes fails in the {} allocator: {message}",
                    fmt_bytes(budget_bytes),
                    self.request.allocator.name()
                ),
            };
        }
        match closest {
            Some((needed_bytes, Score::OverBudget { .. })) => {
                let at = closest_at.and_then(|(schedule, step)| self.describe(schedule, step));
                Infeasible {
                    kind: InfeasibleKind::OverBudget,
                    needed_bytes: Some(needed_bytes),
                    budget_bytes,
                    at: at.clone(),
                    message: format!(
                        "{name}: {what}, the plan still needs {} of device memory but the budget is {} ({} short){}",
                        fmt_bytes(needed_bytes),
                        fmt_bytes(budget_bytes),
                        fmt_bytes(needed_bytes.saturating_sub(budget_bytes)),
                        at.as_ref()
                            .map(|a| format!(" (peak at {a})"))
                            .unwrap_or_default()
                    ),
                }
            }
            Some((_, Score::Shortfall(f))) => Infeasible {
                kind: InfeasibleKind::OverBudget,
                needed_bytes: f.needed_bytes,
                budget_bytes,
                at: f.at.clone(),
                message: format!(
                    "{name}: no plan within {}: {}",
                    fmt_bytes(budget_bytes),
                    f.message
                ),
            },
            _ => Infeasible {
                kind: InfeasibleKind::NoCandidate,
                needed_bytes: None,
                budget_bytes,
                at: None,
                message: format!("{name}: no candidate plan to try"),
            },
        }
    }

    /// The most bytes verify says a schedule's plan may need at any step.
    pub fn needed_bytes(&self, schedule: &Schedule) -> Result<u64, PlannerError> {
        let e = self.evaluator.evaluate(schedule, &mut Scratch::default());
        if let Some(err) = e.schedule_error {
            return Err(self.error(PlannerErrorKind::Lowering, err.to_string()));
        }
        if !e.only_over_budget {
            return Err(self.error(
                PlannerErrorKind::Verification,
                format!("{} verify violations", e.violations),
            ));
        }
        Ok(e.bound.peak_bytes)
    }

    /// Where a schedule's memory peaks (the step the evaluator named), in words.
    pub fn describe(&self, schedule: &Schedule, at: Option<StepRef>) -> Option<String> {
        let plan = self.lower(schedule, Value::Null).ok()?;
        describe_peak(self.ctx.graph, &plan, at)
    }
}

/// Where a plan's peak falls, in words: the step and, for an op, the bytes it
/// touches itself (its inputs, outputs and workspace); `None` when unknown.
pub fn describe_peak(graph: &Graph, plan: &Plan, at: Option<StepRef>) -> Option<String> {
    let step = at.and_then(|a| plan.step(a))?;
    let op = match &step.instr {
        Instr::Compute(op) | Instr::Recompute { op, .. } => *op,
        Instr::SwapIn(t) | Instr::SwapOut(t) | Instr::Free(t) => {
            let what = match step.instr {
                Instr::SwapIn(_) => "the swap-in of",
                Instr::SwapOut(_) => "the swap-out of",
                _ => "the free of",
            };
            return graph.tensors.get(t.index()).map(|tensor| {
                format!(
                    "{what} `{}` ({}), with everything the ops around it hold",
                    tensor.name,
                    fmt_bytes(tensor.size_bytes)
                )
            });
        }
    };
    if op.index() >= graph.ops.len() {
        return None;
    }
    let op = graph.op(op);
    let mut owners: Vec<TensorId> = op
        .inputs
        .iter()
        .chain(&op.outputs)
        .map(|&t| graph.storage_owner(t))
        .collect();
    owners.sort_unstable();
    owners.dedup();
    let own: u64 = owners
        .iter()
        .map(|&t| graph.tensor(t).size_bytes)
        .sum::<u64>()
        + op.workspace_bytes;
    let what = if matches!(step.instr, Instr::Recompute { .. }) {
        "the recomputation of"
    } else {
        "op"
    };
    Some(format!(
        "{what} `{}` ({}), whose own inputs, outputs and workspace take {}",
        op.name,
        op.kind.label(),
        fmt_bytes(own)
    ))
}

/// Swap-ins run just before a waited-for one on the h2d stream that
/// [`Search::stalled_swap_ins`] also names.
pub const QUEUED_BEFORE: usize = 2;

/// [`Search::stalled_swap_ins`] on a plan's simulated `timeline`.
pub fn stalled_swap_ins(plan: &Plan, timeline: &[TimedStep]) -> Vec<TensorId> {
    let streams = [Stream::Compute, Stream::H2d, Stream::D2h];
    let mut times: Vec<Vec<(f64, f64)>> = streams
        .iter()
        .map(|&s| vec![(f64::NAN, f64::NAN); plan.stream(s).len()])
        .collect();
    for t in timeline {
        if let Some(slot) = times[t.at.stream.index()].get_mut(t.at.index as usize) {
            *slot = (t.start_s, t.end_s);
        }
    }
    let end_s = |r: &StepRef| {
        times[r.stream.index()]
            .get(r.index as usize)
            .map_or(f64::NAN, |t| t.1)
    };
    let h2d = plan.stream(Stream::H2d);
    let mut stalled = Vec::new();
    let mut previous_end_s = 0.0_f64;
    for (i, step) in plan.stream(Stream::Compute).iter().enumerate() {
        let (start_s, end) = times[Stream::Compute.index()][i];
        // A wait of less than a picosecond is rounding, not a stall.
        if start_s > previous_end_s + 1e-12 {
            let binding = step
                .waits
                .iter()
                .max_by(|a, b| end_s(a).total_cmp(&end_s(b)));
            if let Some(w) = binding.filter(|w| w.stream == Stream::H2d && !h2d.is_empty()) {
                let last = (w.index as usize).min(h2d.len() - 1);
                for s in &h2d[last.saturating_sub(QUEUED_BEFORE)..=last] {
                    if let Instr::SwapIn(t) = s.instr {
                        stalled.push(t);
                    }
                }
            }
        }
        if end.is_finite() {
            previous_end_s = previous_end_s.max(end);
        }
    }
    stalled.sort_unstable();
    stalled.dedup();
    stalled
}
