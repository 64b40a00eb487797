//! `checkmate-milp`: the exact recompute-only reference for small graphs, a
//! mixed-integer linear program in the style of Checkmate (Jain et al.,
//! MLSys 2020, Sec. 4: `R` and `S` matrices over stages, memory accounting
//! with `FREE` variables, a budget constraint, total recomputation cost
//! minimised), solved by `microlp`, a pure-Rust branch and bound over a
//! simplex that needs no licence and no system library.
//!
//! The program is written over the request's compute order and over exactly
//! the schedules the shared lowering can express with recompute gaps, so that
//! its optimum is the least recomputation time of any recompute-only schedule
//! in that order, and its solution lowers to a plan whose `verify()` peak is
//! what the program counted (see `remat` for the memory rules):
//! - stage `k` is position `k`: the recomputations before op `k` run in
//!   producer order, then op `k`;
//! - `R[k][v]` (binary): storage `v` is recomputed before op `k` (cost: its
//!   producer's run time; the objective is their sum). Storages of one
//!   producer recomputed at one position share one run (the lowering makes
//!   one step of them), as Checkmate's `R` is per op: their run is a
//!   continuous `Y[k][op] >= R[k][v]` for each of them that carries the cost
//!   instead. (Before this, each sibling paid a whole run, and
//!   `outcore-recompute` found a plan on tiny-cnn with less recomputation than
//!   the "proven optimum".) Their memory is still counted as one step per
//!   storage with the others as scratch, which is conservative: the merged
//!   step needs no more;
//! - `S[k][v]` (continuous in [0, 1], integral at every optimum): `v` is
//!   resident when position `k` starts. A use needs `S + R = 1`; residency
//!   carries over (`S[k+1] <= S[k] + R[k]`), and, because the lowering frees
//!   a tensor only after a position that uses it, recomputes it or recomputes
//!   something from it, it may only end after such a position (`S[k+1] >=
//!   S[k] - sum of R[k][c] over the storages c made from v` elsewhere). Past
//!   its last use a storage is resident only at a position that recomputes it;
//! - a recomputation needs its producer's inputs: `R[k][u] <= S[k][w] +
//!   R[k][w]` for every rematerialisable input `w`; other inputs must be
//!   persistent or pinned and resident at `k`, and the producer must read
//!   the versions it first read (no in-place write since);
//! - `FREE[k][v][r]`: `v`, at `k` only for the recomputations there
//!   (recomputed or read by them; op `k` does not read it and it is not
//!   resident into `k + 1`), is freed right after the recomputation `r`, the
//!   last at `k` that reads it (`r = v` when none does): Checkmate's `FREE`
//!   with its hazard constraints (`FREE[k][v][r] <= 1 - R[k][r']` for every
//!   later reader `r'`), which is the lowering's rule for chain links;
//! - memory is bounded at every recomputation step (resident storage +
//!   recomputed so far - freed so far + the step's tensor and scratch) and at
//!   every op (the same + the op's outputs and workspace), as verify bounds it.
//!
//! Choices, each with its reason:
//! - Only recomputation (no swaps, not even of the input batch, whose host
//!   copy is current): the reference is for recompute-only planners.
//! - microlp is used directly rather than through `good_lp`: the program is
//!   built row by row anyway, and microlp's own API says whether optimality
//!   was proven and returns a solve cut short by its time limit as a value.
//! - Bytes are counted in units of the budget and times in units of the
//!   longest producer, to keep the coefficients within microlp's recommended
//!   range; a storage smaller than a millionth of the budget is pinned over
//!   its uses rather than made a variable (its coefficient would fall outside
//!   that range), and the budget row is held one millionth below the budget
//!   to absorb the solver's feasibility tolerance. Either can in principle
//!   exclude a schedule that fits by a few bytes (the plan records how many
//!   storages were pinned for being tiny: none on the graphs of the tests and
//!   of RESULTS.md).
//! - The solution is rounded (a binary within microlp's integrality
//!   tolerance), turned into gaps and lowered; the returned plan is proven by
//!   `verify()` like every plan, and a disagreement with the program's memory
//!   count is reported as a planner error, never hidden.
//! - DTR's schedule at the same budget, when the program can express it, is
//!   given to microlp as its first incumbent (a warm start): it prunes the
//!   search, and an answer cut by the time limit is never worse than DTR's.
//!   Only a proven optimum is a reference; the plan records whether it is.
//! - The solve runs under the request's time limit. The answer is
//!   [`MilpAnswer::Solved`] with `proven_optimal` (microlp completed the
//!   proof) or not (an incumbent at the limit), or
//!   [`MilpAnswer::NoSolutionWithinTimeLimit`], or, when the program has no
//!   solution, [`MilpAnswer::Infeasible`]. The planner reports the last two as
//!   infeasibility values with their reason.
//! - It is not in `all()` (so `--planners all` stays fast on large models);
//!   `by_name("checkmate-milp")` and the CLI reach it, and it refuses graphs
//!   of more than [`MAX_OPS`] ops with an error naming both numbers.

use crate::framework::decisions::recompute_gap;
use crate::framework::{Ctx, Scratch, Search};
use crate::remat::{RematFacts, Residence};
use microlp::{ComparisonOp, OptimizationDirection, Problem, SolveOptions, SolveOutcome, Variable};
use outcore_graph::TensorId;
use outcore_plan::{
    Gap, Infeasible, InfeasibleKind, PlanOutcome, PlanRequest, Planner, PlannerError,
    PlannerErrorKind, Restore, Schedule, fmt_bytes,
};
use serde_json::json;
use std::time::{Duration, Instant};

/// The largest graph (in ops) the reference accepts.
pub const MAX_OPS: usize = 100;

/// Storage smaller than this fraction of the budget is pinned, not a variable.
const TINY_FRACTION: f64 = 1e-6;

/// The budget row's slack for the solver's feasibility tolerance (a fraction).
const BUDGET_SLACK: f64 = 1e-6;

/// The exact recompute-only reference as a planner (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct CheckmateMilp;

/// A solved program.
#[derive(Debug, Clone)]
pub struct MilpSolution {
    /// Total run time of the recomputations in the schedule.
    pub recompute_time_s: f64,
    /// Whether microlp proved the solution optimal (else: the incumbent at the
    /// time limit).
    pub proven_optimal: bool,
    pub schedule: Schedule,
    pub stats: MilpStats,
}

/// The size of the program and what solving it took.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MilpStats {
    pub binary_vars: usize,
    pub continuous_vars: usize,
    pub constraints: usize,
    pub solve_time_s: f64,
    /// Branch-and-bound nodes microlp solved.
    pub nodes: u64,
    /// The relative gap between the solution and microlp's best bound when
    /// the solve stopped (0 when proven optimal).
    pub gap: Option<f64>,
    /// Whether the DTR schedule was accepted as the starting incumbent.
    pub warm_started: bool,
    /// Rematerialisable storages pinned for being smaller than a millionth
    /// of the budget.
    pub tiny_pinned: usize,
}

/// What the reference answers.
#[derive(Debug, Clone)]
pub enum MilpAnswer {
    Solved(MilpSolution),
    /// The time limit passed before microlp found any solution.
    NoSolutionWithinTimeLimit {
        time_limit_s: f64,
        stats: MilpStats,
    },
    /// No recompute-only schedule in this order fits the budget.
    Infeasible {
        message: String,
        stats: MilpStats,
    },
}

impl Planner for CheckmateMilp {
    fn name(&self) -> &'static str {
        "checkmate-milp"
    }

    fn description(&self) -> &'static str {
        "exact recompute-only reference for graphs of at most 100 ops: a Checkmate-style MILP (Jain et al. 2020, Sec. 4) over the request's order, solved by microlp"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let n_ops = request.graph.ops.len();
        if n_ops > MAX_OPS {
            return Err(PlannerError::new(
                self.name(),
                PlannerErrorKind::InvalidRequest,
                format!(
                    "the graph has {n_ops} ops but the exact reference solves graphs of at most {MAX_OPS}; use `dtr` or a checkpoint planner, or a smaller model (fewer layers, shorter sequence)"
                ),
            ));
        }
        let ctx = Ctx::for_request(request, self.name())?;
        let answer = solve(&ctx, request.budget_bytes, request.time_limit_s)
            .map_err(|e| PlannerError::new(self.name(), PlannerErrorKind::Lowering, e))?;
        let budget_bytes = request.budget_bytes;
        let infeasible = |kind, message: String| {
            Ok(PlanOutcome::Infeasible(Infeasible {
                kind,
                needed_bytes: None,
                budget_bytes,
                at: None,
                message: format!("{}: {message}", self.name()),
            }))
        };
        let solution = match answer {
            MilpAnswer::Solved(s) => s,
            MilpAnswer::NoSolutionWithinTimeLimit { time_limit_s, .. } => {
                return infeasible(
                    InfeasibleKind::NoCandidate,
                    format!(
                        "no solution within the time limit of {time_limit_s} s (microlp found no feasible schedule in time); give it more time or plan a smaller graph"
                    ),
                );
            }
            MilpAnswer::Infeasible { message, .. } => {
                return infeasible(InfeasibleKind::OverBudget, message);
            }
        };
        let search = Search::new(&ctx, request, self.name());
        let settings = json!({
            "proven_optimal": solution.proven_optimal,
            "recompute_time_s": solution.recompute_time_s,
            "milp": solution.stats,
        });
        let scored = search.scored(
            settings,
            solution.schedule.gaps.clone(),
            &mut Scratch::default(),
        )?;
        if scored.is_feasible() {
            return search.prove(scored, &[]);
        }
        let why = search.infeasible("after solving the recompute-only MILP", &[scored]);
        if why.kind == InfeasibleKind::AllocatorFailure {
            return Ok(PlanOutcome::Infeasible(why));
        }
        Err(PlannerError::new(
            self.name(),
            PlannerErrorKind::Verification,
            format!(
                "the MILP's schedule fits its own memory count but not verify's: {}",
                why.message
            ),
        ))
    }
}

/// Solves the recompute-only program for the context's order under
/// `budget_bytes`, within `time_limit_s`. `Err` only for a solver failure
/// (microlp's numerical or internal error), with its message.
pub fn solve(ctx: &Ctx<'_>, budget_bytes: u64, time_limit_s: f64) -> Result<MilpAnswer, String> {
    let facts = RematFacts::new(ctx);
    let mut model = Model::new(ctx, &facts, budget_bytes);
    if let Some(message) = model.fixed_shortfall() {
        return Ok(MilpAnswer::Infeasible {
            message,
            stats: MilpStats::default(),
        });
    }
    model.build();
    let mut stats = model.stats;
    let mut options = SolveOptions::default();
    options.time_limit = Some(
        Duration::try_from_secs_f64(time_limit_s.max(0.0)).unwrap_or(Duration::from_secs(3600)),
    );
    // DTR's schedule, when the program can express it, is the first
    // incumbent: it prunes the search, and an answer cut by the time limit
    // is then never worse than DTR's.
    if let Some(hint) = model.hint(&crate::dtr::dtr_gaps(ctx, &facts, budget_bytes)) {
        options.warm_start = Some(hint);
        stats.warm_started = true;
    }
    let started = Instant::now();
    let outcome = model.problem.solve_with(options);
    stats.solve_time_s = started.elapsed().as_secs_f64();
    let solution = match outcome {
        Ok(SolveOutcome::Solution(s)) => s,
        Ok(SolveOutcome::Interrupted(_)) => {
            return Ok(MilpAnswer::NoSolutionWithinTimeLimit {
                time_limit_s,
                stats,
            });
        }
        Err(microlp::Error::Infeasible) => {
            return Ok(MilpAnswer::Infeasible {
                message: format!(
                    "no recompute-only schedule in this order fits {} (the MILP has no solution)",
                    fmt_bytes(budget_bytes)
                ),
                stats,
            });
        }
        Err(e) => return Err(format!("microlp failed: {e}")),
    };
    let proven_optimal = solution.status() == microlp::SolutionStatus::Optimal;
    stats.nodes = solution.stats().nodes_solved;
    stats.gap = solution.gap();
    let gaps = model.gaps(&|v| solution.var_value(v));
    // One run per (position, producer): siblings share it.
    let mut runs: Vec<(Option<usize>, usize, f64)> = gaps
        .iter()
        .map(|g| {
            let i = g.tensor.index();
            (g.before, facts.made_at[i], facts.recompute_s[i])
        })
        .collect();
    runs.sort_by_key(|r| (r.0, r.1));
    runs.dedup_by_key(|r| (r.0, r.1));
    let recompute_time_s = runs.iter().map(|r| r.2).sum();
    Ok(MilpAnswer::Solved(MilpSolution {
        recompute_time_s,
        proven_optimal,
        schedule: ctx.schedule(gaps),
        stats,
    }))
}

/// The program under construction, with its variables by (storage, position).
struct Model<'a> {
    ctx: &'a Ctx<'a>,
    facts: &'a RematFacts,
    budget_bytes: u64,
    /// The residence the program uses: `facts.residence` with tiny storage pinned.
    residence: Vec<Residence>,
    /// Rematerialisable storage in production order.
    vars_of: Vec<TensorId>,
    /// Per storage: `R` for positions `made_at + 1 ..`, `None` where it may
    /// not be recomputed.
    r: Vec<Vec<Option<Variable>>>,
    /// Per storage: `S` for positions `made_at + 1 ..= last_use`.
    s: Vec<Vec<Variable>>,
    /// Bytes no decision moves, before the first step of each position.
    fixed_before: Vec<u64>,
    time_unit_s: f64,
    problem: Problem,
    stats: MilpStats,
}

impl<'a> Model<'a> {
    fn new(ctx: &'a Ctx<'a>, facts: &'a RematFacts, budget_bytes: u64) -> Self {
        let tiny_bytes = (budget_bytes as f64 * TINY_FRACTION).ceil() as u64;
        let residence: Vec<Residence> = facts
            .residence
            .iter()
            .enumerate()
            .map(|(i, &r)| match r {
                Residence::Rematerialisable if facts.size_bytes[i] < tiny_bytes => {
                    Residence::Pinned {
                        from: Some(facts.made_at[i]),
                        to: facts.last_use[i],
                    }
                }
                other => other,
            })
            .collect();
        let tiny_pinned = residence
            .iter()
            .zip(&facts.residence)
            .filter(|(m, f)| m != f)
            .count();
        let mut vars_of: Vec<TensorId> = (0..residence.len())
            .filter(|&i| residence[i] == Residence::Rematerialisable)
            .map(|i| TensorId(i as u32))
            .collect();
        vars_of.sort_unstable_by_key(|t| (facts.made_at[t.index()], *t));
        let fixed_before = fixed_bytes_before(facts, &residence);
        let time_unit_s = facts
            .recompute_s
            .iter()
            .copied()
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE);
        let nt = residence.len();
        Model {
            ctx,
            facts,
            budget_bytes,
            residence,
            vars_of,
            r: vec![Vec::new(); nt],
            s: vec![Vec::new(); nt],
            fixed_before,
            time_unit_s,
            problem: Problem::new(OptimizationDirection::Minimize),
            stats: MilpStats {
                tiny_pinned,
                ..MilpStats::default()
            },
        }
    }

    /// When what no decision moves already exceeds the budget somewhere.
    fn fixed_shortfall(&self) -> Option<String> {
        (0..self.facts.n).find_map(|k| {
            let needed = self.fixed_before[k] + self.facts.op_bytes(k);
            (needed > self.budget_bytes).then(|| {
                format!(
                    "op `{}` needs {} with every rematerialisable tensor gone (persistent and pinned tensors, its outputs and workspace), over the budget of {}",
                    self.ctx.op_at(k).name,
                    fmt_bytes(needed),
                    fmt_bytes(self.budget_bytes)
                )
            })
        })
    }

    /// Bytes in units of the budget.
    fn bytes(&self, b: u64) -> f64 {
        b as f64 / self.budget_bytes.max(1) as f64
    }

    fn r_at(&self, v: TensorId, k: usize) -> Option<Variable> {
        let p = self.facts.made_at[v.index()];
        if k <= p {
            return None;
        }
        self.r[v.index()].get(k - p - 1).copied().flatten()
    }

    fn s_at(&self, v: TensorId, k: usize) -> Option<Variable> {
        let p = self.facts.made_at[v.index()];
        if k <= p {
            return None;
        }
        self.s[v.index()].get(k - p - 1).copied()
    }

    fn is_var(&self, t: TensorId) -> bool {
        self.residence[t.index()] == Residence::Rematerialisable
    }

    fn build(&mut self) {
        let horizon = self.recompute_horizons();
        self.add_residency_vars();
        self.add_recompute_vars(&horizon);
        self.add_shared_runs();
        self.add_residency_rows();
        self.add_input_rows();
        self.add_usefulness_rows();
        for k in 0..self.facts.n {
            self.add_memory_rows(k);
        }
    }

    /// Per storage: the last position at which recomputing it may help (a
    /// use, or a recomputation of a rematerialisable child) and is possible
    /// (versions unchanged, pinned inputs still resident).
    fn recompute_horizons(&self) -> Vec<usize> {
        let facts = self.facts;
        let mut horizon = vec![0usize; self.residence.len()];
        for &v in self.vars_of.iter().rev() {
            let i = v.index();
            let mut useful = facts.last_use[i];
            for &c in &facts.children[i] {
                if self.is_var(c) {
                    useful = useful.max(horizon[c.index()]);
                }
            }
            let mut h = useful.min(facts.version_horizon[i]);
            for &w in &facts.parents[i] {
                if let Residence::Pinned { to, .. } = self.residence[w.index()] {
                    h = h.min(to);
                }
            }
            horizon[i] = h;
        }
        horizon
    }

    fn add_residency_vars(&mut self) {
        for idx in 0..self.vars_of.len() {
            let v = self.vars_of[idx];
            let (p, l) = (
                self.facts.made_at[v.index()],
                self.facts.last_use[v.index()],
            );
            let vars: Vec<Variable> = (p + 1..=l)
                .map(|_| self.problem.add_var(0.0, (0.0, 1.0)))
                .collect();
            self.stats.continuous_vars += vars.len();
            self.s[v.index()] = vars;
        }
    }

    /// `R` where a recomputation is possible: inside the horizon, and with
    /// every rematerialisable input of the producer resident or itself
    /// recomputable there (inputs first, in production order).
    fn add_recompute_vars(&mut self, horizon: &[usize]) {
        for idx in 0..self.vars_of.len() {
            let v = self.vars_of[idx];
            let i = v.index();
            let p = self.facts.made_at[i];
            // A storage with siblings pays through its producer's shared run.
            let cost = if self.has_siblings(v) {
                0.0
            } else {
                self.facts.recompute_s[i] / self.time_unit_s
            };
            let mut vars = Vec::new();
            for k in p + 1..=horizon[i] {
                let inputs_ok = self.facts.parents[i].iter().all(|&w| {
                    !self.is_var(w) || self.s_at(w, k).is_some() || self.r_at(w, k).is_some()
                });
                vars.push(inputs_ok.then(|| {
                    self.stats.binary_vars += 1;
                    self.problem.add_binary_var(cost)
                }));
            }
            self.r[i] = vars;
        }
    }

    /// Whether another rematerialisable storage has the same producer.
    fn has_siblings(&self, v: TensorId) -> bool {
        let p = self.facts.made_at[v.index()];
        self.vars_of
            .iter()
            .any(|&u| u != v && self.facts.made_at[u.index()] == p)
    }

    /// `Y[k][op]`: one run of a producer with several rematerialisable
    /// storages per position where any of them is recomputed (module docs).
    fn add_shared_runs(&mut self) {
        let mut producers: Vec<usize> = self
            .vars_of
            .iter()
            .filter(|&&v| self.has_siblings(v))
            .map(|v| self.facts.made_at[v.index()])
            .collect();
        producers.sort_unstable();
        producers.dedup();
        for p in producers {
            let siblings: Vec<TensorId> = self
                .vars_of
                .iter()
                .copied()
                .filter(|v| self.facts.made_at[v.index()] == p)
                .collect();
            let cost = self.facts.recompute_s[siblings[0].index()] / self.time_unit_s;
            let last = siblings
                .iter()
                .map(|v| p + self.r[v.index()].len())
                .max()
                .unwrap_or(p);
            for k in p + 1..=last {
                let rs: Vec<Variable> = siblings.iter().filter_map(|&v| self.r_at(v, k)).collect();
                if rs.is_empty() {
                    continue;
                }
                let y = self.problem.add_var(cost, (0.0, 1.0));
                self.stats.continuous_vars += 1;
                for r in rs {
                    self.row(&[(y, 1.0), (r, -1.0)], ComparisonOp::Ge, 0.0);
                }
            }
        }
    }

    fn row(&mut self, terms: &[(Variable, f64)], op: ComparisonOp, rhs: f64) {
        self.problem.add_constraint(terms, op, rhs);
        self.stats.constraints += 1;
    }

    /// Uses, exclusion, carry-over and "frees only after an anchor".
    fn add_residency_rows(&mut self) {
        for idx in 0..self.vars_of.len() {
            let v = self.vars_of[idx];
            let i = v.index();
            let (p, l) = (self.facts.made_at[i], self.facts.last_use[i]);
            let uses = self.ctx.uses[i].clone();
            for k in p + 1..=l {
                let Some(s) = self.s_at(v, k) else { continue };
                let r = self.r_at(v, k);
                let mut sr = vec![(s, 1.0)];
                sr.extend(r.map(|r| (r, 1.0)));
                if uses.binary_search(&k).is_ok() {
                    self.row(&sr, ComparisonOp::Ge, 1.0);
                }
                if r.is_some() {
                    self.row(&sr, ComparisonOp::Le, 1.0);
                }
                if k < l
                    && let Some(next) = self.s_at(v, k + 1)
                {
                    let mut carry = vec![(next, 1.0), (s, -1.0)];
                    carry.extend(r.map(|r| (r, -1.0)));
                    self.row(&carry, ComparisonOp::Le, 0.0);
                    if uses.binary_search(&k).is_err() {
                        // Leaves only after a recomputation here reads it.
                        let mut stay = vec![(next, 1.0), (s, -1.0)];
                        stay.extend(self.child_recomputes(v, k).into_iter().map(|r| (r, 1.0)));
                        self.row(&stay, ComparisonOp::Ge, 0.0);
                    }
                }
            }
        }
    }

    /// A recomputation needs every rematerialisable input resident or
    /// recomputed (earlier, in producer order) at the same position.
    fn add_input_rows(&mut self) {
        for idx in 0..self.vars_of.len() {
            let u = self.vars_of[idx];
            let i = u.index();
            let p = self.facts.made_at[i];
            for k in p + 1..p + 1 + self.r[i].len() {
                let Some(r) = self.r_at(u, k) else { continue };
                for w in self.facts.parents[i].clone() {
                    if !self.is_var(w) {
                        continue;
                    }
                    let mut terms = vec![(r, 1.0)];
                    terms.extend(self.s_at(w, k).map(|s| (s, -1.0)));
                    terms.extend(self.r_at(w, k).map(|r| (r, -1.0)));
                    self.row(&terms, ComparisonOp::Le, 0.0);
                }
            }
        }
    }

    /// The `R` variables at `k` of the rematerialisable storages whose
    /// producer reads `v`.
    fn child_recomputes(&self, v: TensorId, k: usize) -> Vec<Variable> {
        self.facts.children[v.index()]
            .iter()
            .filter(|&&c| self.is_var(c))
            .filter_map(|&c| self.r_at(c, k))
            .collect()
    }

    /// A valid cut (every optimum meets it, since a recomputation costs
    /// time): a storage is recomputed at `k` only if op `k` reads it, a
    /// recomputation at `k` reads it, or it stays resident into `k + 1`.
    fn add_usefulness_rows(&mut self) {
        for idx in 0..self.vars_of.len() {
            let v = self.vars_of[idx];
            let i = v.index();
            let p = self.facts.made_at[i];
            for k in p + 1..p + 1 + self.r[i].len() {
                let Some(r) = self.r_at(v, k) else { continue };
                if self.ctx.uses[i].binary_search(&k).is_ok() {
                    continue;
                }
                let mut terms = vec![(r, 1.0)];
                terms.extend(self.s_at(v, k + 1).map(|s| (s, -1.0)));
                terms.extend(self.child_recomputes(v, k).into_iter().map(|rc| (rc, -1.0)));
                self.row(&terms, ComparisonOp::Le, 0.0);
            }
        }
    }

    /// The recomputations at `k` in the lowering's order (producer op id,
    /// then tensor id).
    fn recomputed_at(&self, k: usize) -> Vec<(TensorId, Variable)> {
        let graph = self.ctx.graph;
        let mut out: Vec<(TensorId, Variable)> = self
            .vars_of
            .iter()
            .filter_map(|&v| self.r_at(v, k).map(|r| (v, r)))
            .collect();
        out.sort_unstable_by_key(|(v, _)| (graph.tensor(*v).producer, *v));
        out
    }

    /// Memory at every recomputation step of position `k` and at op `k`.
    fn add_memory_rows(&mut self, k: usize) {
        let budget = 1.0 - BUDGET_SLACK - self.bytes(self.fixed_before[k]);
        // base = bytes of rematerialisable storage resident when `k` starts.
        let base = self.problem.add_var(0.0, (0.0, f64::INFINITY));
        self.stats.continuous_vars += 1;
        let mut base_row = vec![(base, -1.0)];
        for idx in 0..self.vars_of.len() {
            let v = self.vars_of[idx];
            if let Some(s) = self.s_at(v, k) {
                base_row.push((s, self.bytes(self.facts.size(v))));
            }
        }
        self.row(&base_row, ComparisonOp::Eq, 0.0);
        let steps = self.recomputed_at(k);
        let frees = self.free_vars(k, &steps);
        // cum = recomputed so far minus freed so far, after each step.
        let mut cum: Option<Variable> = None;
        for (j, &(u, r)) in steps.iter().enumerate() {
            let step_bytes = self.facts.size(u) + self.facts.scratch_bytes[u.index()];
            let mut at_step = vec![(base, 1.0), (r, self.bytes(step_bytes))];
            at_step.extend(cum.map(|c| (c, 1.0)));
            self.row(&at_step, ComparisonOp::Le, budget);
            let next = self.problem.add_var(0.0, (0.0, f64::INFINITY));
            self.stats.continuous_vars += 1;
            let mut cum_row = vec![(next, -1.0), (r, self.bytes(self.facts.size(u)))];
            cum_row.extend(cum.map(|c| (c, 1.0)));
            for &(v, step, f) in &frees {
                if step == j {
                    cum_row.push((f, -self.bytes(self.facts.size(v))));
                }
            }
            self.row(&cum_row, ComparisonOp::Eq, 0.0);
            cum = Some(next);
        }
        let op_budget = budget - self.bytes(self.facts.op_bytes(k));
        let mut at_op = vec![(base, 1.0)];
        at_op.extend(cum.map(|c| (c, 1.0)));
        self.row(&at_op, ComparisonOp::Le, op_budget);
    }

    /// Checkmate's `FREE` for position `k`: per storage that op `k` does not
    /// read and that is recomputed at `k` or read by a recomputation there,
    /// one variable per step after which it may be freed (its own
    /// recomputation, or a reader's), bounded by its presence, by its leaving
    /// after `k`, and by the hazards (a later reader). Returns (storage, step
    /// index, variable).
    fn free_vars(
        &mut self,
        k: usize,
        steps: &[(TensorId, Variable)],
    ) -> Vec<(TensorId, usize, Variable)> {
        let mut out = Vec::new();
        for idx in 0..self.vars_of.len() {
            let v = self.vars_of[idx];
            if self.facts.needs_at[k].contains(&v) {
                continue;
            }
            let own = steps.iter().position(|&(u, _)| u == v);
            // (step index, its R variable) of v's own recomputation, then of
            // its readers, in step order.
            let mut candidates: Vec<(usize, Variable)> =
                own.map(|j| (j, steps[j].1)).into_iter().collect();
            candidates.extend(
                steps
                    .iter()
                    .enumerate()
                    .filter(|(_, (u, _))| self.facts.parents[u.index()].contains(&v))
                    .map(|(j, &(_, r))| (j, r)),
            );
            if candidates.is_empty() {
                continue;
            }
            let present: Vec<(Variable, f64)> = self
                .s_at(v, k)
                .into_iter()
                .chain(self.r_at(v, k))
                .map(|x| (x, -1.0))
                .collect();
            let leaves = self.s_at(v, k + 1);
            let mut sum_row = Vec::new();
            for (ci, &(j, rj)) in candidates.iter().enumerate() {
                let f = self.problem.add_var(0.0, (0.0, 1.0));
                self.stats.continuous_vars += 1;
                // That step runs, and (for a reader) v is there.
                self.row(&[(f, 1.0), (rj, -1.0)], ComparisonOp::Le, 0.0);
                if Some(j) != own {
                    let mut row = vec![(f, 1.0)];
                    row.extend(present.iter().copied());
                    self.row(&row, ComparisonOp::Le, 0.0);
                }
                if let Some(s) = leaves {
                    self.row(&[(f, 1.0), (s, 1.0)], ComparisonOp::Le, 1.0);
                }
                for &(_, later) in &candidates[ci + 1..] {
                    self.row(&[(f, 1.0), (later, 1.0)], ComparisonOp::Le, 1.0);
                }
                sum_row.push((f, 1.0));
                out.push((v, j, f));
            }
            if sum_row.len() > 1 {
                self.row(&sum_row, ComparisonOp::Le, 1.0);
            }
        }
        out
    }

    /// The values of `R` for a schedule's recompute gaps (every other `R`
    /// 0; the rest is completed by microlp), or `None` when the program has
    /// no variable for one of them.
    fn hint(&self, gaps: &Option<Vec<Gap>>) -> Option<Vec<(Variable, f64)>> {
        let gaps = gaps.as_ref()?;
        let mut on: Vec<Variable> = Vec::new();
        for g in gaps {
            if g.how != Restore::Recompute {
                return None;
            }
            on.push(self.r_at(g.tensor, g.before?)?);
        }
        let mut hint = Vec::new();
        for &v in &self.vars_of {
            for r in self.r[v.index()].iter().flatten() {
                hint.push((*r, if on.contains(r) { 1.0 } else { 0.0 }));
            }
        }
        Some(hint)
    }

    /// The gaps a solution describes: a storage leaves after its last use or
    /// recomputation before each recomputation, which brings it back.
    fn gaps(&self, value: &dyn Fn(Variable) -> f64) -> Vec<Gap> {
        let mut gaps = Vec::new();
        for &v in &self.vars_of {
            let i = v.index();
            let p = self.facts.made_at[i];
            let uses = &self.ctx.uses[i];
            let mut anchor = p;
            for k in p + 1..p + 1 + self.r[i].len().max(self.s[i].len()) {
                let recomputed = self.r_at(v, k).is_some_and(|r| value(r) > 0.5);
                if recomputed {
                    gaps.push(recompute_gap(v, anchor, k));
                    anchor = k;
                } else if uses.binary_search(&k).is_ok()
                    || self
                        .child_recomputes(v, k)
                        .into_iter()
                        .any(|r| value(r) > 0.5)
                {
                    // A use, or a read by a recomputation: a gap may start here.
                    anchor = k;
                }
            }
        }
        gaps
    }
}

/// Bytes of persistent and pinned storage resident before the first step of
/// each position.
fn fixed_bytes_before(facts: &RematFacts, residence: &[Residence]) -> Vec<u64> {
    let n = facts.n;
    let mut delta = vec![0i128; n + 1];
    for (i, r) in residence.iter().enumerate() {
        if let Residence::Pinned { from, to } = *r {
            let lo = from.map_or(0, |f| f + 1);
            if lo <= to && lo < n {
                delta[lo] += facts.size_bytes[i] as i128;
                delta[(to + 1).min(n)] -= facts.size_bytes[i] as i128;
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut cur = facts.persistent_bytes as i128;
    for d in delta.iter().take(n) {
        cur += d;
        out.push(cur.max(0) as u64);
    }
    out
}
