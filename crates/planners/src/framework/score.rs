//! The one scoring path and the one way a planner picks and proves its plan.
//!
//! A candidate schedule is scored by [`Search::score`]: lowered, verified, then
//! simulated under the request's allocator. It is the single place to swap in
//! a faster evaluator; whatever scores candidates, the plan a planner returns
//! is lowered again and verified in full ([`Search::best`] / `prove`).
//!
//! Choices:
//! - Every score simulates [`SCORE_ITERATIONS`] = 2 iterations (the report is
//!   the last one's): with a real allocator the first iteration starts from an
//!   empty cache, and gaps that cross the iteration boundary (persistent
//!   tensors kept on the host) only show their cost in steady state. The
//!   baselines used 1 iteration before; 2 is what the command line reports.
//! - `size-class` with no classes given means "size the pool for this plan":
//!   the classes come from the plan's own trace under a perfect allocator
//!   ([`outcore_alloc::SizeClassConfig::for_trace`]); a pool larger than the
//!   budget makes the candidate an allocator failure. Classes given in the
//!   request are used as they are.
//! - An allocator failure (simulated out of memory, or a pool that does not
//!   fit) makes the candidate infeasible, never a returned plan.
//! - Candidates are scored in parallel (rayon); all scores are collected and
//!   the choice is by (score, candidate index), so the plan is the same for
//!   any number of threads. Candidate 0 is always scored; later ones are
//!   skipped once the request's time limit is spent (`time_limit_cut_search`
//!   in the plan's settings).
//! - A lowering error or a verify violation other than memory on any scored
//!   candidate is a planner bug: the search stops with a [`PlannerError`].

use super::ctx::Ctx;
use super::pressure::{MARGINS, margin_budget};
use outcore_alloc::{SizeClassConfig, SizeClassPool};
use outcore_graph::{Graph, TensorId};
use outcore_plan::{
    AllocatorSpec, Gap, Infeasible, InfeasibleKind, Instr, Plan, PlanOutcome, PlanRequest,
    PlannerError, PlannerErrorKind, PlannerInfo, Schedule, StepRef, ViolationKind, fmt_bytes,
    lower_schedule, verify,
};
use outcore_sim::{SimErrorKind, SimOptions, simulate};
use rayon::prelude::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Iterations every score simulates (module doc).
pub const SCORE_ITERATIONS: usize = 2;

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
    /// Verified except for memory: the most bytes it may need, and where.
    OverBudget {
        needed_bytes: u64,
        at: Option<String>,
    },
    /// Fits in bytes, but the allocator cannot place it.
    AllocatorFailure { message: String },
    /// No schedule: its producer ran short.
    Shortfall(Shortfall),
    /// Not scored: the time limit was spent.
    Skipped,
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
}

impl<'s, 'g> Search<'s, 'g> {
    /// Starts the clock of the request's time limit now.
    pub fn new(ctx: &'s Ctx<'g>, request: &PlanRequest<'g>, name: &'static str) -> Self {
        let limit = Duration::try_from_secs_f64(request.time_limit_s.max(0.0))
            .unwrap_or(Duration::from_secs(u64::MAX / 4));
        let now = Instant::now();
        Search {
            ctx,
            request: *request,
            name,
            deadline: now.checked_add(limit).unwrap_or(now),
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
        lower_schedule(self.ctx.graph, schedule, info, self.request.budget_bytes)
            .map_err(|e| self.error(PlannerErrorKind::Lowering, e.to_string()))
    }

    /// Verify's verdict on memory: `None` when the plan verifies, the most
    /// bytes it may need and where when only memory is violated; any other
    /// violation is a planner bug.
    fn over_budget(&self, plan: &Plan) -> Result<Option<(u64, Option<StepRef>)>, PlannerError> {
        let violations = verify(plan, self.ctx.graph);
        let mut worst: Option<(u64, Option<StepRef>)> = None;
        for v in &violations {
            match v.kind {
                ViolationKind::OverBudget { bytes, .. } => {
                    if worst.is_none_or(|(b, _)| bytes > b) {
                        worst = Some((bytes, v.at));
                    }
                }
                _ => {
                    return Err(self.error(
                        PlannerErrorKind::Verification,
                        format!("{} verify violations, first: {v}", violations.len()),
                    ));
                }
            }
        }
        Ok(worst)
    }

    /// The one scoring path: lower -> verify -> simulate under the request's
    /// allocator (module doc).
    pub fn score(&self, schedule: &Schedule) -> Result<Score, PlannerError> {
        let mut plan = self.lower(schedule, Value::Null)?;
        if let Some((needed_bytes, at)) = self.over_budget(&plan)? {
            return Ok(Score::OverBudget {
                needed_bytes,
                at: describe_peak(self.ctx.graph, &plan, at),
            });
        }
        plan.allocator = match self.allocator_for(&plan)? {
            Ok(allocator) => allocator,
            Err(message) => return Ok(Score::AllocatorFailure { message }),
        };
        let options = SimOptions {
            iterations: SCORE_ITERATIONS,
            ..SimOptions::default()
        };
        let out = match simulate(self.ctx.graph, &plan, self.request.cost, &options) {
            Ok(out) => out,
            Err(e) if matches!(e.kind, SimErrorKind::BadAllocator(_)) => {
                return Ok(Score::AllocatorFailure {
                    message: e.to_string(),
                });
            }
            Err(e) => return Err(self.error(PlannerErrorKind::Simulation, e.to_string())),
        };
        if let Some(oom) = &out.report.oom {
            return Ok(Score::AllocatorFailure {
                message: format!(
                    "out of memory in the {} allocator: {} (free {}, largest free block {})",
                    plan.allocator.name(),
                    oom.message,
                    fmt_bytes(oom.free_bytes),
                    fmt_bytes(oom.largest_free_block_bytes)
                ),
            });
        }
        Ok(Score::Feasible {
            iter_time_s: out.report.iter_time_s,
            throughput_vs_ideal: out.report.throughput_vs_ideal,
            peak_bytes: out.report.peak_live_bytes,
            allocator: plan.allocator,
        })
    }

    /// The allocator a verified plan runs under: the request's, with an unsized
    /// `size-class` pool sized from the plan's own perfect-allocator trace.
    /// The inner `Err` is an allocator failure (the pool does not fit).
    fn allocator_for(&self, plan: &Plan) -> Result<Result<AllocatorSpec, String>, PlannerError> {
        let AllocatorSpec::SizeClass(config) = self.request.allocator else {
            return Ok(Ok(self.request.allocator.clone()));
        };
        if !config.is_unsized() {
            return Ok(Ok(self.request.allocator.clone()));
        }
        let mut probe = plan.clone();
        probe.allocator = AllocatorSpec::Perfect;
        let options = SimOptions {
            iterations: 1,
            record_alloc_trace: true,
            ..SimOptions::default()
        };
        let out = simulate(self.ctx.graph, &probe, self.request.cost, &options)
            .map_err(|e| self.error(PlannerErrorKind::Simulation, e.to_string()))?;
        let Some(trace) = out.alloc_trace else {
            return Err(self.error(
                PlannerErrorKind::Simulation,
                "the simulator recorded no allocation trace",
            ));
        };
        let sized = SizeClassConfig::for_trace(&trace);
        Ok(
            match SizeClassPool::from_config(&sized, self.request.budget_bytes) {
                Ok(_) => Ok(AllocatorSpec::SizeClass(sized)),
                Err(e) => Err(format!(
                    "the size-class pool this plan needs does not fit the budget of {}: {e}",
                    fmt_bytes(self.request.budget_bytes)
                )),
            },
        )
    }

    /// Scores one schedule as a candidate.
    pub fn scored(&self, settings: Value, gaps: Vec<Gap>) -> Result<Scored, PlannerError> {
        let schedule = self.ctx.schedule(gaps);
        let score = self.score(&schedule)?;
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
        produce: impl Fn(u64, f64) -> (Value, Result<Vec<Gap>, Shortfall>),
    ) -> Result<Scored, PlannerError> {
        let mut first: Option<Scored> = None;
        for margin in MARGINS {
            let (settings, gaps) =
                produce(margin_budget(self.request.budget_bytes, margin), margin);
            let scored = match gaps {
                Ok(gaps) => self.scored(settings, gaps)?,
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
        eval: impl Fn(&C) -> Result<Scored, PlannerError> + Sync,
    ) -> Result<PlanOutcome, PlannerError> {
        let results: Vec<Result<Scored, PlannerError>> = items
            .par_iter()
            .enumerate()
            .map(|(i, item)| {
                if i > 0 && Instant::now() >= self.deadline {
                    return Ok(Scored {
                        settings: Value::Null,
                        schedule: None,
                        score: Score::Skipped,
                    });
                }
                eval(item)
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
        let scored = self.scored(settings, Vec::new())?;
        if !scored.is_feasible() {
            return Ok(None);
        }
        self.prove(scored, &[]).map(Some)
    }

    /// The infeasibility a set of failed candidates comes to: the one that
    /// needs the least memory, else the first allocator failure.
    pub fn infeasible(&self, what: &str, scored: &[Scored]) -> Infeasible {
        let budget_bytes = self.request.budget_bytes;
        let mut closest: Option<(u64, &Score)> = None;
        let mut allocator_failure: Option<&str> = None;
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
            }
        }
        let name = self.name;
        match (closest, allocator_failure) {
            (Some((needed_bytes, Score::OverBudget { at, .. })), _) => Infeasible {
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
            },
            (Some((_, Score::Shortfall(f))), _) => Infeasible {
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
            (_, Some(message)) => Infeasible {
                kind: InfeasibleKind::AllocatorFailure,
                needed_bytes: None,
                budget_bytes,
                at: None,
                message: format!(
                    "{name}: {what}; every plan that fits {} in bytes fails in the {} allocator: {message}",
                    fmt_bytes(budget_bytes),
                    self.request.allocator.name()
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
        let mut plan = self.lower(schedule, Value::Null)?;
        plan.budget_bytes = 0;
        Ok(self.over_budget(&plan)?.map_or(0, |(bytes, _)| bytes))
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
