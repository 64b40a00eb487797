//! The cut's linear program (step 5 of the crate's derivation): the same cut
//! as `crate::cut`, but a recomputation needs its inputs.
//!
//! The closed-form relaxation ([`crate::solve`]) lets any recomputable
//! storage be restored for its producer's time alone, as if the producer's
//! inputs were at hand. On transformers that is most of the gap: an
//! elementwise op's output (GELU, dropout, a layer norm) is "recomputed" from
//! an input that is itself absent, and the relaxation restores gigabytes for
//! a few milliseconds. Here a recomputation of op `p` counts only as far as
//! every input of `p` is *available* after the cut: present at the cut,
//! swapped in after it, or itself recomputed.
//!
//! # The program
//!
//! The cut is at the *start* of op `c`: the ancestors `A` of `c` (without
//! `c`) have run, `c` and its descendants `D` have not. The other ops are
//! *free*: an order may run each on either side (a `clone` that a PyTorch
//! export saves for a backward op reads a forward output but feeds no
//! ancestor of the loss). For each free op `f` a fraction `x_f` runs
//! before the cut (`x = 1` for the ops of `A`, `0` for `{c} ∪ D`), with
//! `x_q <= x_p` when free `q` reads free `p` (a first run follows its
//! inputs'). At that moment `c`'s inputs, outputs and workspace are
//! allocated (the working set `W`, fixed present). `N` is the set of
//! storages that an op outside `A` reads or writes and that were produced
//! by an op outside `{c} ∪ D` or are persistent or batch inputs.
//! `X` is the set of activation storages that feed, within [`DEPTH`]
//! producer steps, the recomputation of a storage of `N`. For every storage
//! `g` of `(N ∪ X) \ W` there are fractions `k_g` (present at the cut) and
//! `s_g` (swapped in after it), and for every recomputable producer `p` of
//! one of them a fraction `r_p` (re-run after the cut):
//!
//! - every `g ∈ N` is restored as far as its producer `p` runs before the
//!   cut and a user `q` after it: `k_g + s_g + r_p >= x_p - x_q` for every
//!   such `q` (`>= 1` for a producer in `A` and a user in `{c} ∪ D`);
//! - a recomputation has its inputs: `r_p <= k_y + s_y + r_{p(y)}` for every
//!   input storage `y` of `p` in `N ∪ X`, plus `1 - x_{p(y)}` when `p(y)` is
//!   free (run after the cut, it makes `y` there); inputs outside the set,
//!   and those of free producers that no restoration row names, are taken
//!   as available, which only lowers the bound;
//! - memory at the cut: `Σ k_g size_g <= B - size(W)`;
//! - time, with `R = Σ t_p r_p`, `S_a` the swapped activation bytes (each
//!   copied out before the cut, since it was produced on the device and
//!   freed before the cut), `S` all swapped bytes and `S_u` the swapped
//!   bytes of persistent tensors that an op updates (copied out once per
//!   iteration, as in step 3; `b` of them before the cut and `a` after,
//!   as the program chooses, with `b` of those an op after the cut
//!   updates at most `B`: see `LpGraph::copy_out_rows`): `T >= C + R`,
//!   `T >= u + v` with `u >= max(F, (S_a + b) / r_out)` and
//!   `v >= max(G + R, (S + κ_in a) / r_in, (a + κ_out S) / r_out)`, where
//!   `F` is the compute time of `A` plus `Σ x_f t_f`, `G` that of
//!   `{c} ∪ D` plus `Σ (1 - x_f) t_f` (the free ops no row names share one
//!   variable) and `κ` the share of the link the other direction takes
//!   ([`crate::link`]); and, over the whole iteration,
//!   `T >= (S + κ_in (S_a + S_u)) / r_in` and
//!   `T >= (S_a + S_u + κ_out S) / r_out`. In every row a copy in counts
//!   `λ_in` bytes more, for its latency, where its own direction's bytes
//!   count (`S`, and the copy-in windows of `LpGraph::link_windows`), and a
//!   copy out `λ_out` more (`S_a`, the copy-out windows, and `S_u` over the
//!   whole iteration; not `b` and `a`, which split copy time, not copies,
//!   and not in the other direction's `κ` share); [`crate::link`] derives
//!   it: a copy pays its latency before its bytes move, one copy at a time
//!   each way. A swapped storage is copied in at least once after the cut,
//!   an activation out once before it, an updated persistent one out once.
//!
//! Minimise `T`. Any valid plan gives a feasible point: `x_f = 1` if free
//! `f` first runs before the start of `c`; `k_g = 1` for what is
//! allocated at the start of `c`; otherwise `s_g = 1` if the first time `g`
//! is made valid again after the cut is a swap-in; and `r_p = 1` if `p` runs
//! again after the cut at all. A row of `g ∈ N` asks for something only
//! when `p` ran before the cut and `q` runs after it; then `g` is restored
//! before `q`, by a swap-in or a re-run. An input of a re-run that was
//! absent at the cut was made valid before it the same two ways when its
//! producer ran before the cut, or else by that producer's first run after
//! it (the `1 - x` term; a producer in `A` always ran before). A first
//! restoration by swap-in copies from the host, so (for an activation) a
//! copy-out ran before the cut, after the producer's first run. So the
//! program's minimum is at most the plan's time.
//!
//! Relaxations that keep it a bound, each chosen to keep the program small
//! and its coefficients within the solver's range: storages smaller than a
//! millionth of the budget take no memory and are always available; op times
//! below a billionth of the compute time cost nothing; inputs deeper than
//! [`DEPTH`] steps are available; at a cut with more than
//! `MAX_LATER_FREE_OPS` free ops outside the forward phase, those ask for
//! nothing and make nothing the program sees (their time still counts, on
//! whichever side). At a backward cut they number in the hundreds or
//! thousands (the other layers' gradient and optimizer ops): with them all,
//! the program took up to 2.4 s a cut on the PyTorch GPT-2 export (345 to
//! 2,149 such ops a cut) and its bound at 75% 42 s, against 0.3 s without
//! any free op. The free ops that bind, a forward op whose output only the
//! backward pass reads (the exports' saved clones), are always kept; the
//! PyTorch MobileNet v2 export has 159 of the others at the end of its
//! forward pass, and leaving those out there changed the program's choice
//! enough that `outcore`'s search from it ended at 0.647 of ideal (the plan
//! stayed at a seed's 0.854) instead of 0.907.

use crate::cut::{ancestors_and_self, descendants};
use crate::link::Link;
use microlp::{
    ComparisonOp, OptimizationDirection, Problem, Solution, SolutionStatus, SolveOutcome, Variable,
};
use outcore_graph::{Graph, OpId, Phase, TensorId};
use serde::Serialize;

/// How many producer steps behind a needed storage the inputs of its
/// recomputation are tracked (beyond that they are taken as available).
pub const DEPTH: usize = 3;

/// The program's optimum at one cut.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LpCut {
    /// The least iteration time any plan can have, by this cut.
    pub time_s: f64,
    /// Recomputation time after the cut at the optimum.
    pub recompute_s: f64,
    /// Bytes swapped in after the cut at the optimum.
    pub swapped_bytes: f64,
    /// Storages with variables (the program's size).
    pub storages: usize,
}

/// One storage's part in the program's optimum at a cut: fractions of it
/// present at the cut, swapped in after it, and restored by re-running its
/// producer (each in `[0, 1]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StorageChoice {
    pub storage: TensorId,
    /// Whether an op that runs (or may run) after the cut reads or writes it
    /// (else it is only an input of a recomputation).
    pub needed: bool,
    pub kept: f64,
    pub swapped: f64,
    pub recomputed: f64,
}

/// The program's optimum at one cut with the choice behind it: what a
/// planner can start from (`outcore`'s "bound's program" start).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LpChoice {
    /// The op at whose start the cut is.
    pub cut: OpId,
    pub optimum: LpCut,
    /// Every storage with variables (activations produced before the cut,
    /// persistent tensors and batch inputs above a millionth of the budget).
    pub storages: Vec<StorageChoice>,
    /// The free ops (neither ancestors nor descendants of the cut op) that
    /// the optimum runs mostly after the cut, in the graph's order.
    pub deferred: Vec<OpId>,
}

/// Facts shared by every cut of one graph.
#[derive(Debug)]
pub struct LpGraph<'g> {
    graph: &'g Graph,
    op_time_s: &'g [f64],
    compute_s: f64,
    /// Longest compute path ending with each op (it included): no order
    /// finishes the op earlier.
    head_s: Vec<f64>,
    /// Longest compute path starting with each op (it included): no order
    /// starts the op later than `T - tail_s`.
    tail_s: Vec<f64>,
    /// Storage owners that some op updates in place.
    updated: Vec<bool>,
    /// Each in-place update: (the storage owner it updates, the op).
    updates: Vec<(usize, usize)>,
}

impl<'g> LpGraph<'g> {
    /// Prepares `graph` with op times `op_time_s` summing to `compute_s`.
    pub fn new(graph: &'g Graph, op_time_s: &'g [f64], compute_s: f64) -> LpGraph<'g> {
        let (head_s, tail_s) = longest_paths(graph, op_time_s);
        LpGraph {
            graph,
            op_time_s,
            compute_s,
            head_s,
            tail_s,
            updated: crate::cut::updated_storage(graph),
            updates: graph
                .tensors
                .iter()
                .filter(|t| t.inplace_update_of.is_some())
                .filter_map(|t| Some((graph.storage_owner(t.id).index(), t.producer?.index())))
                .collect(),
        }
    }

    fn owner(&self, t: TensorId) -> usize {
        self.graph.storage_owner(t).index()
    }

    /// The program's unit of time: the compute time, kept above zero so
    /// that dividing by it stays finite.
    fn time_unit_s(&self) -> f64 {
        self.compute_s.max(f64::MIN_POSITIVE)
    }

    fn size(&self, g: usize) -> u64 {
        self.graph.tensors[g].size_bytes
    }

    /// The program at the start of op `cut` under `budget_bytes`, with the
    /// fastest copy rates each way; `None` when the solver fails (then only
    /// the closed form counts).
    pub fn solve(&self, cut: OpId, budget_bytes: u64, link: Link) -> Option<LpCut> {
        self.solve_choice(cut, budget_bytes, link)
            .map(|choice| choice.optimum)
    }

    /// [`LpGraph::solve`] with the per-storage choice at the optimum.
    pub fn solve_choice(&self, cut: OpId, budget_bytes: u64, link: Link) -> Option<LpChoice> {
        let graph = self.graph;
        let side = sides(graph, cut);
        let time_on = |which: Side| -> f64 {
            (0..graph.ops.len())
                .filter(|&i| side[i] == which)
                .map(|i| self.op_time_s[i])
                .sum()
        };
        let (before_s, after_s) = (time_on(Side::Before), time_on(Side::After));
        let budget = budget_bytes as f64;
        let (in_ws, ws_bytes) = self.working_set(cut);
        let room = budget - ws_bytes;
        if room < 0.0 {
            return None;
        }
        let view = CutView::new(graph, &side, &in_ws, budget);
        let (needs, needed, deadline_s) = self.needs(&view);
        let storages = self.with_recompute_inputs(&view, &needed);
        if storages.is_empty() {
            return None;
        }
        let (optimum, choices, deferred) = self.program(&ProgramInput {
            storages: &storages,
            needs: &needs,
            needed: &needed,
            side: &side,
            deadline_s: &deadline_s,
            room_bytes: room,
            budget_bytes: budget,
            before_s,
            after_s,
            link,
        })?;
        Some(LpChoice {
            cut,
            optimum,
            storages: choices,
            deferred,
        })
    }

    /// The storages of op `cut`'s inputs and outputs (present at the cut,
    /// fixed), and their bytes with its workspace.
    fn working_set(&self, cut: OpId) -> (Vec<bool>, f64) {
        let mut in_ws = vec![false; self.graph.tensors.len()];
        let op = &self.graph.ops[cut.index()];
        let mut ws_bytes = op.workspace_bytes as f64;
        for &t in op.inputs.iter().chain(&op.outputs) {
            let g = self.owner(t);
            if !in_ws[g] {
                in_ws[g] = true;
                ws_bytes += self.size(g) as f64;
            }
        }
        (in_ws, ws_bytes)
    }

    /// N: the storages an op that runs (or may run) after the cut reads or
    /// writes, one row per (storage, free producer, free user), sorted; which
    /// storages are in N; and for each, the longest tail of an op surely
    /// after the cut that needs it.
    fn needs(&self, view: &CutView<'_>) -> (Vec<Need>, Vec<bool>, Vec<f64>) {
        let graph = self.graph;
        let mut needs: Vec<Need> = Vec::new();
        let mut needed = vec![false; graph.tensors.len()];
        let mut deadline_s = vec![0.0f64; graph.tensors.len()];
        for o in graph
            .ops
            .iter()
            .filter(|o| view.side[o.id.index()] != Side::Before)
        {
            let q = o.id.index();
            if view.ignored(q) {
                continue;
            }
            for &t in o.inputs.iter().chain(&o.outputs) {
                let g = self.owner(t);
                let producer = graph.tensors[g].producer.map(|p| p.index());
                if !view.is_candidate(g) || producer == Some(q) {
                    continue;
                }
                needed[g] = true;
                needs.push(Need {
                    storage: g,
                    free_producer: producer.and_then(|p| view.free_of(p)),
                    free_user: view.free_of(q),
                });
                if view.side[q] == Side::After {
                    deadline_s[g] = deadline_s[g].max(self.tail_s[q]);
                }
            }
        }
        needs.sort_unstable();
        needs.dedup();
        (needs, needed, deadline_s)
    }

    /// N and X, the inputs of the recomputations of N, [`DEPTH`] steps
    /// deep, in storage order.
    fn with_recompute_inputs(&self, view: &CutView<'_>, needed: &[bool]) -> Vec<usize> {
        let graph = self.graph;
        let mut in_set = needed.to_vec();
        let mut frontier: Vec<usize> = (0..needed.len()).filter(|&g| needed[g]).collect();
        for _ in 0..DEPTH {
            let mut next = Vec::new();
            for &g in &frontier {
                let Some(p) = graph.tensors[g].producer else {
                    continue;
                };
                if !graph.ops[p.index()].recomputable {
                    continue;
                }
                for &t in &graph.ops[p.index()].inputs {
                    let x = self.owner(t);
                    if !in_set[x] && view.is_candidate(x) {
                        in_set[x] = true;
                        next.push(x);
                    }
                }
            }
            frontier = next;
        }
        (0..in_set.len()).filter(|&g| in_set[g]).collect()
    }

    /// Builds and solves the program over `input.storages`: its optimum,
    /// each storage's choice there, and the free ops it runs mostly after the
    /// cut. Variables and rows are added in a fixed order (the solver's
    /// pivots, and so its last digits, follow it).
    fn program(&self, input: &ProgramInput<'_>) -> Option<(LpCut, Vec<StorageChoice>, Vec<OpId>)> {
        let mut lp = Problem::new(OptimizationDirection::Minimize);
        let vars = self.program_vars(&mut lp, input);
        self.free_order_rows(&mut lp, &vars.x);
        let t_var = lp.add_var(1.0, (0.0, f64::INFINITY));
        let u = lp.add_var(0.0, (0.0, f64::INFINITY));
        let v = lp.add_var(0.0, (0.0, f64::INFINITY));
        self.restoration_rows(&mut lp, input, &vars)?;
        self.recompute_input_rows(&mut lp, input, &vars);
        self.memory_row(&mut lp, input, &vars.k);
        let recompute = self.time_rows(&mut lp, input, &vars, (t_var, u, v));
        self.link_rows(&mut lp, input, &vars.s, (t_var, u, v));
        let solution = match lp.solve() {
            // Only a proven optimum is a minimum (a feasible point is not).
            Ok(SolveOutcome::Solution(sol)) if sol.status() == SolutionStatus::Optimal => sol,
            _ => return None,
        };
        Some(self.read_solution(input, &vars, &recompute, &solution))
    }

    /// The program's choice variables, each in `[0, 1]`: `k` and `s` per
    /// storage, `r` per recomputable producer of one, and `x` per free op
    /// of a restoration row (the fraction of it that runs before the cut;
    /// the other free ops' time is split by one variable, in
    /// [`LpGraph::time_rows`]).
    fn program_vars(&self, lp: &mut Problem, input: &ProgramInput<'_>) -> ProgramVars {
        let graph = self.graph;
        let mut vars = ProgramVars {
            k: vec![None; graph.tensors.len()],
            s: vec![None; graph.tensors.len()],
            r: vec![None; graph.ops.len()],
            x: vec![None; graph.ops.len()],
        };
        for &g in input.storages {
            vars.k[g] = Some(lp.add_var(0.0, (0.0, 1.0)));
            vars.s[g] = Some(lp.add_var(0.0, (0.0, 1.0)));
            if let Some(p) = graph.tensors[g].producer
                && graph.ops[p.index()].recomputable
                && vars.r[p.index()].is_none()
            {
                vars.r[p.index()] = Some(lp.add_var(0.0, (0.0, 1.0)));
            }
        }
        for need in input.needs {
            for f in [need.free_producer, need.free_user].into_iter().flatten() {
                if vars.x[f].is_none() {
                    vars.x[f] = Some(lp.add_var(0.0, (0.0, 1.0)));
                }
            }
        }
        vars
    }

    /// Every needed storage is restored, as far as its producer runs
    /// before the cut and its user after: `k + s + r >= x_p - x_q`, with
    /// `x = 1` for an op surely before and `0` for one surely after.
    /// `None` where a needed storage has no variable.
    fn restoration_rows(
        &self,
        lp: &mut Problem,
        input: &ProgramInput<'_>,
        vars: &ProgramVars,
    ) -> Option<()> {
        for need in input.needs {
            let g = need.storage;
            let mut row = vec![(vars.k[g]?, 1.0), (vars.s[g]?, 1.0)];
            if let Some(rp) = self.graph.tensors[g]
                .producer
                .and_then(|p| vars.r[p.index()])
            {
                row.push((rp, 1.0));
            }
            let mut rhs = 1.0;
            if let Some(p) = need.free_producer {
                row.push((vars.x[p]?, -1.0));
                rhs = 0.0;
            }
            if let Some(q) = need.free_user {
                row.push((vars.x[q]?, 1.0));
            }
            lp.add_constraint(row.as_slice(), ComparisonOp::Ge, rhs);
        }
        Some(())
    }

    /// A recomputation has its inputs: `r_p <= k_y + s_y + r_{p(y)}`, plus
    /// `1 - x_{p(y)}` for an input whose producer is free (run after the
    /// cut, it makes the input there).
    fn recompute_input_rows(&self, lp: &mut Problem, input: &ProgramInput<'_>, vars: &ProgramVars) {
        let graph = self.graph;
        let mut inputs = Vec::new();
        for (p, rp) in vars.r.iter().enumerate() {
            let Some(rp) = *rp else { continue };
            inputs.clear();
            inputs.extend(graph.ops[p].inputs.iter().map(|&t| self.owner(t)));
            inputs.sort_unstable();
            inputs.dedup();
            for &y in &inputs {
                let (Some(ky), Some(sy)) = (vars.k[y], vars.s[y]) else {
                    continue;
                };
                let mut row = vec![(ky, 1.0), (sy, 1.0), (rp, -1.0)];
                let producer = graph.tensors[y].producer.map(|q| q.index());
                if let Some(ry) = producer.and_then(|q| vars.r[q]) {
                    row.push((ry, 1.0));
                }
                let mut rhs = 0.0;
                if let Some(q) = producer.filter(|&q| input.side[q] == Side::Free) {
                    // A free producer with no variable takes no side: its
                    // output is taken as available.
                    let Some(xq) = vars.x[q] else { continue };
                    row.push((xq, -1.0));
                    rhs = -1.0;
                }
                lp.add_constraint(row.as_slice(), ComparisonOp::Ge, rhs);
            }
        }
    }

    /// Memory at the cut, in units of the budget: `Σ k_g size_g <= room`.
    fn memory_row(&self, lp: &mut Problem, input: &ProgramInput<'_>, k: &[Option<Variable>]) {
        let budget = input.budget_bytes;
        let memory: Vec<(Variable, f64)> = input
            .storages
            .iter()
            .map(|&g| {
                (
                    k[g].expect("every storage has k"),
                    self.size(g) as f64 / budget,
                )
            })
            .collect();
        lp.add_constraint(
            memory.as_slice(),
            ComparisonOp::Le,
            input.room_bytes / budget,
        );
    }

    /// The compute rows, in units of the compute time: `T >= C + R`,
    /// `u >= F + Σ x_f t_f` and `v >= G + Σ (1 - x_f) t_f + R` (the free ops
    /// without a variable as one `z` in `[0, their time]`). Returns `R`'s
    /// terms `(r_p, t_p / C)`.
    fn time_rows(
        &self,
        lp: &mut Problem,
        input: &ProgramInput<'_>,
        vars: &ProgramVars,
        (t_var, u, v): (Variable, Variable, Variable),
    ) -> Vec<(Variable, f64)> {
        let c_s = self.time_unit_s();
        let recompute: Vec<(Variable, f64)> = vars
            .r
            .iter()
            .enumerate()
            .filter_map(|(p, rp)| {
                let w = self.op_time_s[p] / c_s;
                rp.filter(|_| w >= 1e-9).map(|rp| (rp, w))
            })
            .collect();
        let mut free_before: Vec<(Variable, f64)> = vars
            .x
            .iter()
            .enumerate()
            .filter_map(|(f, xf)| Some((((*xf)?), self.op_time_s[f] / c_s)))
            .collect();
        let rest_s: f64 = (0..self.graph.ops.len())
            .filter(|&f| input.side[f] == Side::Free && vars.x[f].is_none())
            .map(|f| self.op_time_s[f] / c_s)
            .sum();
        if rest_s > 0.0 {
            free_before.push((lp.add_var(0.0, (0.0, 1.0)), rest_s));
        }
        let free_s: f64 = free_before.iter().map(|&(_, w)| w).sum();
        // T >= C + R.
        let mut row = vec![(t_var, 1.0)];
        row.extend(recompute.iter().map(|&(x, w)| (x, -w)));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 1.0);
        // u >= F + Σ x_f t_f.
        let mut row = vec![(u, 1.0)];
        row.extend(free_before.iter().map(|&(x, w)| (x, -w)));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, input.before_s / c_s);
        // v >= G + Σ (1 - x_f) t_f + R.
        let mut row = vec![(v, 1.0)];
        row.extend(recompute.iter().map(|&(x, w)| (x, -w)));
        row.extend(free_before.iter().map(|&(x, w)| (x, w)));
        lp.add_constraint(
            row.as_slice(),
            ComparisonOp::Ge,
            input.after_s / c_s + free_s,
        );
        recompute
    }

    /// The link rows: each side's copies ([`LpGraph::copy_out_rows`],
    /// [`LpGraph::link_windows`]), `T >= u + v`, and the whole iteration's
    /// copies on the shared link: `T >= (S + κ_in (S_a + S_u)) / r_in` and
    /// the same the other way.
    fn link_rows(
        &self,
        lp: &mut Problem,
        input: &ProgramInput<'_>,
        s: &[Option<Variable>],
        (t_var, u, v): (Variable, Variable, Variable),
    ) {
        let graph = self.graph;
        let is_activation = |g: usize| graph.tensors[g].producer.is_some();
        let out_later = |g: usize| is_activation(g) || self.updated[g];
        let link = input.link;
        let (r_in, r_out) = (link.in_bytes_per_s, link.out_bytes_per_s);
        self.copy_out_rows(lp, input, s, (u, v));
        self.link_windows(lp, input, s, u, v);
        lp.add_constraint([(t_var, 1.0), (u, -1.0), (v, -1.0)], ComparisonOp::Ge, 0.0);
        // Every swapped storage is copied in once, an activation or an
        // updated persistent tensor out once: a latency each.
        let all_in = |g: usize| 1.0 + if out_later(g) { link.out_cost_in } else { 0.0 };
        let mut row = vec![(t_var, 1.0)];
        row.extend(self.copy_terms(input.storages, s, r_in, all_in, |_| link.in_copy_bytes));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 0.0);
        let all_out = |g: usize| link.in_cost_out + if out_later(g) { 1.0 } else { 0.0 };
        let out_copy = |g: usize| {
            if out_later(g) {
                link.out_copy_bytes
            } else {
                0.0
            }
        };
        let mut row = vec![(t_var, 1.0)];
        row.extend(self.copy_terms(input.storages, s, r_out, all_out, out_copy));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 0.0);
    }

    /// The optimum, each storage's choice and the free ops run mostly after
    /// the cut, read from `solution`.
    fn read_solution(
        &self,
        input: &ProgramInput<'_>,
        vars: &ProgramVars,
        recompute: &[(Variable, f64)],
        solution: &Solution,
    ) -> (LpCut, Vec<StorageChoice>, Vec<OpId>) {
        let c_s = self.time_unit_s();
        let recompute_s = recompute.iter().map(|&(x, w)| solution[x] * w).sum::<f64>() * c_s;
        let swapped_bytes = input
            .storages
            .iter()
            .map(|&g| solution[vars.s[g].expect("s")] * self.size(g) as f64)
            .sum();
        let choices = input
            .storages
            .iter()
            .map(|&g| StorageChoice {
                storage: TensorId(g as u32),
                needed: input.needed[g],
                kept: solution[vars.k[g].expect("k")],
                swapped: solution[vars.s[g].expect("s")],
                recomputed: self.graph.tensors[g]
                    .producer
                    .and_then(|p| vars.r[p.index()])
                    .map_or(0.0, |rp| solution[rp]),
            })
            .collect();
        // The simplex's optimum is exact up to its tolerances (about 1e-9 on
        // these unit-scaled rows); shaving a relative 1e-6 keeps it a bound.
        let optimum = LpCut {
            time_s: solution.objective() * c_s * (1.0 - 1e-6),
            recompute_s,
            swapped_bytes,
            storages: input.storages.len(),
        };
        let deferred = vars
            .x
            .iter()
            .enumerate()
            .filter(|(_, xf)| xf.is_some_and(|xf| solution[xf] < 0.5))
            .map(|(f, _)| OpId(f as u32))
            .collect();
        (optimum, choices, deferred)
    }

    /// A free op runs before the cut no more than the free ops it reads
    /// from: `x_q <= x_p` for every free producer `p` of an input of free
    /// `q` (a first run follows its inputs' first runs).
    fn free_order_rows(&self, lp: &mut Problem, x: &[Option<Variable>]) {
        for (q, xq) in x.iter().enumerate() {
            let Some(xq) = *xq else { continue };
            for &t in &self.graph.ops[q].inputs {
                if let Some(xp) = self.graph.tensor(t).producer.and_then(|p| x[p.index()])
                    && xp != xq
                {
                    lp.add_constraint([(xq, 1.0), (xp, -1.0)], ComparisonOp::Le, 0.0);
                }
            }
        }
    }

    /// `-s_g size_g weight(g) / rate` per storage of `storages` with a
    /// positive weight, in units of the compute time (one term per storage).
    fn byte_terms(
        &self,
        storages: &[usize],
        s: &[Option<Variable>],
        rate: f64,
        weight: impl Fn(usize) -> f64,
    ) -> Vec<(Variable, f64)> {
        self.copy_terms(storages, s, rate, weight, |_| 0.0)
    }

    /// [`LpGraph::byte_terms`] with `latency(g)` more bytes per copy of
    /// `g` (the link time its latency takes, [`crate::link`]):
    /// `-s_g (size_g weight(g) + latency(g)) / rate`.
    fn copy_terms(
        &self,
        storages: &[usize],
        s: &[Option<Variable>],
        rate: f64,
        weight: impl Fn(usize) -> f64,
        latency: impl Fn(usize) -> f64,
    ) -> Vec<(Variable, f64)> {
        let c_s = self.time_unit_s();
        storages
            .iter()
            .filter_map(|&g| {
                let bytes = self.size(g) as f64 * weight(g) + latency(g);
                (bytes > 0.0).then(|| (s[g].expect("every storage has s"), -bytes / (rate * c_s)))
            })
            .collect()
    }

    /// The copies on each side of the cut (rows added to `lp`, times in
    /// units of the compute time; `u` bounds the time before the cut, `v`
    /// the time after it).
    ///
    /// Before the cut, every swapped activation is copied out (`S_a`).
    /// After it, every swapped storage is copied in (`S`). A swapped
    /// persistent tensor that an op updates is copied out once in the
    /// iteration (`S_u`), and the program chooses on which side: `b` bytes
    /// before, `a` after. When an op after the cut updates it, a copy-out
    /// before the cut is of the value the iteration started with, kept on
    /// the device since the iteration before (the host's copy was stale,
    /// or the copy-out would be the one after the update): so those bytes
    /// were all allocated when the iteration started, `b_1 <= B`. Else
    /// (its update before the cut, or on either side) nothing is claimed
    /// of the side. Then, by the shared link ([`crate::link`]):
    ///
    /// - `u >= (S_a + b) / r_out`;
    /// - `v >= (S + κ_in a) / r_in` and `v >= (a + κ_out S) / r_out`.
    fn copy_out_rows(
        &self,
        lp: &mut Problem,
        input: &ProgramInput<'_>,
        s: &[Option<Variable>],
        (u, v): (Variable, Variable),
    ) {
        let graph = self.graph;
        let link = input.link;
        let (r_in, r_out) = (link.in_bytes_per_s, link.out_bytes_per_s);
        let c_s = self.time_unit_s();
        // Persistent storages some op after the cut updates.
        let mut updated_after = vec![false; graph.tensors.len()];
        for &(owner, op) in &self.updates {
            if input.side[op] == Side::After {
                updated_after[owner] = true;
            }
        }
        let persistent_updated = |g: usize| self.updated[g] && graph.tensors[g].producer.is_none();
        let one = |yes: bool| if yes { 1.0 } else { 0.0 };
        // Copy-out time of the updated swapped storages, split by side, in
        // units of the compute time at `r_out`: (b_1, a_1) for those
        // updated after the cut, (b_2, a_2) for the others.
        let b1 = lp.add_var(0.0, (0.0, input.budget_bytes / (r_out * c_s)));
        let a1 = lp.add_var(0.0, (0.0, f64::INFINITY));
        let b2 = lp.add_var(0.0, (0.0, f64::INFINITY));
        let a2 = lp.add_var(0.0, (0.0, f64::INFINITY));
        for ((b, a), after) in [((b1, a1), true), ((b2, a2), false)] {
            let mut row = vec![(b, 1.0), (a, 1.0)];
            row.extend(self.byte_terms(input.storages, s, r_out, |g| {
                one(persistent_updated(g) && updated_after[g] == after)
            }));
            lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 0.0);
        }
        // u >= (S_a + b) / r_out, a latency per activation copied out (the
        // copy-outs of `b` are left theirs: the split is by time, not count).
        let is_activation = |g: usize| graph.tensors[g].producer.is_some();
        let mut row = vec![(u, 1.0), (b1, -1.0), (b2, -1.0)];
        row.extend(self.copy_terms(
            input.storages,
            s,
            r_out,
            |g| one(is_activation(g)),
            |g| one(is_activation(g)) * link.out_copy_bytes,
        ));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 0.0);
        // v >= (S + κ_in a) / r_in: `a` is in time at `r_out`.
        let a_in = link.out_cost_in * r_out / r_in;
        let mut row = vec![(v, 1.0)];
        if a_in > 0.0 {
            row.extend([(a1, -a_in), (a2, -a_in)]);
        }
        row.extend(self.copy_terms(input.storages, s, r_in, |_| 1.0, |_| link.in_copy_bytes));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 0.0);
        // v >= (a + κ_out S) / r_out.
        let mut row = vec![(v, 1.0), (a1, -1.0), (a2, -1.0)];
        row.extend(self.byte_terms(input.storages, s, r_out, |_| link.in_cost_out));
        lp.add_constraint(row.as_slice(), ComparisonOp::Ge, 0.0);
    }

    /// The copies' windows (rows added to `lp`, times in units of the
    /// compute time). A copy-out of activation `g` starts after its
    /// producer ends, no earlier than `head(p(g))`; so for a threshold `θ`,
    /// the swapped activations with `head >= θ` leave within `[θ, t_c]`:
    /// `u >= θ + Σ s_g size_g / r_out`. The swap-in that first restores `g`
    /// ends before the first op after the cut that needs it starts, which
    /// is no later than `T - tail(q)` for each such op `q`, so no later than
    /// `T - deadline(g)`; so for `δ`, the swapped storages with `deadline >=
    /// δ` arrive within `[t_c, T - δ]`: `v >= δ + Σ s_g size_g / r_in`.
    /// Thresholds are [`WINDOWS`] quantiles of each side's values.
    fn link_windows(
        &self,
        lp: &mut Problem,
        input: &ProgramInput<'_>,
        s: &[Option<Variable>],
        u: Variable,
        v: Variable,
    ) {
        let graph = self.graph;
        let released_s = |g: usize| graph.tensors[g].producer.map(|p| self.head_s[p.index()]);
        let link = input.link;
        self.window_rows(
            lp,
            input.storages,
            s,
            (u, link.out_bytes_per_s, link.out_copy_bytes),
            released_s,
        );
        let due_s = |g: usize| Some(input.deadline_s[g]).filter(|&d| d > 0.0);
        self.window_rows(
            lp,
            input.storages,
            s,
            (v, link.in_bytes_per_s, link.in_copy_bytes),
            due_s,
        );
    }

    /// One side's rows: for each threshold `θ` among [`WINDOWS`] quantiles
    /// of `when` over `storages`, `side >= θ + Σ_{when(g) >= θ} s_g (size_g +
    /// λ) / rate`, with `λ` the bytes' worth of one copy's latency.
    fn window_rows(
        &self,
        lp: &mut Problem,
        storages: &[usize],
        s: &[Option<Variable>],
        (side, rate, copy_bytes): (Variable, f64, f64),
        when: impl Fn(usize) -> Option<f64>,
    ) {
        let c_s = self.time_unit_s();
        let mut values: Vec<f64> = storages.iter().filter_map(|&g| when(g)).collect();
        values.sort_by(f64::total_cmp);
        values.dedup();
        if values.is_empty() {
            return;
        }
        for j in 0..WINDOWS {
            let threshold = values[j * (values.len() - 1) / (WINDOWS - 1)];
            let mut row = vec![(side, 1.0)];
            row.extend(storages.iter().filter_map(|&g| {
                when(g).filter(|&x| x >= threshold)?;
                Some((s[g]?, -(self.size(g) as f64 + copy_bytes) / (rate * c_s)))
            }));
            lp.add_constraint(row.as_slice(), ComparisonOp::Ge, threshold / c_s);
        }
    }
}

/// Free ops outside the forward phase that a cut's program places on
/// either side, at most (beyond, it places only the forward ones; module
/// doc).
const MAX_LATER_FREE_OPS: usize = 256;

/// Thresholds per side in [`LpGraph::link_windows`].
const WINDOWS: usize = 12;

/// Per op, the longest path of op times ending with it and starting with it
/// (the graph's ops are in a topological order).
fn longest_paths(graph: &Graph, op_time_s: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = graph.ops.len();
    let mut head_s = vec![0.0f64; n];
    for op in &graph.ops {
        let i = op.id.index();
        let before = op
            .inputs
            .iter()
            .filter_map(|&t| graph.tensor(t).producer)
            .map(|p| head_s[p.index()])
            .fold(0.0, f64::max);
        head_s[i] = before + op_time_s[i];
    }
    let consumers = graph.consumers();
    let mut tail_s = vec![0.0f64; n];
    for op in graph.ops.iter().rev() {
        let i = op.id.index();
        let after = op
            .outputs
            .iter()
            .flat_map(|&t| &consumers[t.index()])
            .map(|q| tail_s[q.index()])
            .fold(0.0, f64::max);
        tail_s[i] = after + op_time_s[i];
    }
    (head_s, tail_s)
}

/// What a cut makes of each op and storage: its side, whether a storage is
/// a candidate for the program's variables, whether an op is left out.
struct CutView<'a> {
    graph: &'a Graph,
    side: &'a [Side],
    /// The cut op's working set (present, fixed).
    in_ws: &'a [bool],
    budget: f64,
    /// Whether the free ops of the backward and optimizer phases are left out
    /// (there are more than [`MAX_LATER_FREE_OPS`] of them; see the module doc).
    ignore_later_free: bool,
}

impl<'a> CutView<'a> {
    fn new(graph: &'a Graph, side: &'a [Side], in_ws: &'a [bool], budget: f64) -> CutView<'a> {
        let mut view = CutView {
            graph,
            side,
            in_ws,
            budget,
            ignore_later_free: false,
        };
        let n_later_free = (0..graph.ops.len()).filter(|&o| view.later_free(o)).count();
        view.ignore_later_free = n_later_free > MAX_LATER_FREE_OPS;
        view
    }

    /// A free op of the backward or optimizer phase.
    fn later_free(&self, o: usize) -> bool {
        self.side[o] == Side::Free && self.graph.ops[o].phase != Phase::Forward
    }

    /// Left out of the program: its reads ask for nothing, its outputs are
    /// not candidates.
    fn ignored(&self, o: usize) -> bool {
        self.ignore_later_free && self.later_free(o)
    }

    /// A storage that may exist at the cut and gets variables: outside the
    /// working set, at least a millionth of the budget, and persistent, a
    /// batch input, or produced by an op that runs (or may run) before it.
    fn is_candidate(&self, g: usize) -> bool {
        let t = &self.graph.tensors[g];
        !self.in_ws[g]
            && (t.size_bytes as f64) >= self.budget * 1e-6
            && t.producer
                .is_none_or(|p| self.side[p.index()] != Side::After && !self.ignored(p.index()))
    }

    /// `Some(o)` where op `o` is free.
    fn free_of(&self, o: usize) -> Option<usize> {
        (self.side[o] == Side::Free).then_some(o)
    }
}

/// Where an op runs relative to a cut at the start of op `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// An ancestor of `c`: in every order it has run when `c` starts.
    Before,
    /// `c` or a descendant of it: it runs after `c` starts.
    After,
    /// Neither: an order may run it on either side.
    Free,
}

/// Each op's side of the cut at the start of `cut`.
fn sides(graph: &Graph, cut: OpId) -> Vec<Side> {
    let before = ancestors_and_self(graph, cut);
    let after = descendants(graph, cut);
    (0..graph.ops.len())
        .map(|i| {
            if i == cut.index() || after[i] {
                Side::After
            } else if before[i] {
                Side::Before
            } else {
                Side::Free
            }
        })
        .collect()
}

/// One restoration row: `storage` must be restored after the cut as far as
/// its producer runs before the cut and this user after it (`None`: that op
/// is surely on its side, or the storage has no producer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Need {
    storage: usize,
    free_producer: Option<usize>,
    free_user: Option<usize>,
}

/// The program's choice variables ([`LpGraph::program_vars`]), indexed by
/// storage (`k`, `s`) or op (`r`, `x`); `None` where the program has none.
struct ProgramVars {
    /// Present at the cut.
    k: Vec<Option<Variable>>,
    /// Swapped in after the cut.
    s: Vec<Option<Variable>>,
    /// Re-run after the cut (recomputable producers).
    r: Vec<Option<Variable>>,
    /// Run before the cut (free ops of restoration rows).
    x: Vec<Option<Variable>>,
}

/// What [`LpGraph::program`] needs of one cut.
struct ProgramInput<'a> {
    storages: &'a [usize],
    needs: &'a [Need],
    /// Per storage: it has a restoration row.
    needed: &'a [bool],
    side: &'a [Side],
    /// Per storage: it must be back this long before the iteration ends.
    deadline_s: &'a [f64],
    room_bytes: f64,
    budget_bytes: f64,
    before_s: f64,
    after_s: f64,
    link: Link,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower_bound;
    use outcore_cost::{CostModel, DeviceProfile, UnitCostModel};
    use outcore_graph::{DType, GraphMeta, Op, OpKind, Phase, Tensor, TensorKind};

    /// Op times are the ops' FLOPs; copies move `rate` bytes/s each way.
    #[derive(Debug)]
    struct Flops(DeviceProfile);

    impl CostModel for Flops {
        fn device(&self) -> &DeviceProfile {
            &self.0
        }
        fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
            graph.op(op).flops as f64
        }
        fn name(&self) -> String {
            "flops".into()
        }
    }

    fn flops_model(rate: f64) -> Flops {
        Flops(DeviceProfile {
            h2d_bytes_per_s: rate,
            d2h_bytes_per_s: rate,
            duplex_bytes_per_s: 2.0 * rate,
            ..UnitCostModel::profile()
        })
    }

    fn tensor(id: u32, bytes: u64, producer: Option<u32>) -> Tensor {
        Tensor {
            id: TensorId(id),
            name: format!("t{id}"),
            shape: vec![bytes],
            dtype: DType::Uint8,
            size_bytes: bytes,
            kind: if producer.is_some() {
                TensorKind::Activation
            } else {
                TensorKind::Input
            },
            producer: producer.map(OpId),
            view_of: None,
            inplace_update_of: None,
            is_output: false,
        }
    }

    fn op(id: u32, name: &str, inputs: &[u32], outputs: &[u32], flops: u64) -> Op {
        Op {
            id: OpId(id),
            name: name.into(),
            kind: OpKind::Named { name: "k".into() },
            phase: Phase::Forward,
            inputs: inputs.iter().map(|&t| TensorId(t)).collect(),
            outputs: outputs.iter().map(|&t| TensorId(t)).collect(),
            flops,
            bytes_read: 0,
            bytes_written: 0,
            workspace_bytes: 0,
            recomputable: true,
            module: None,
        }
    }

    /// `A` (40 s) makes t1 (100 B) from the input t0 (10 B); `B` (1 s)
    /// makes t2 (100 B) from t1; `C`, `E`, `F` (1 s each) lead through t3
    /// (10 B), t5 (140 B) and t6 (1 B) to `D` (1 s), which reads t2 again.
    /// Every op's working set fits 200 B (`B`'s is the largest).
    fn expensive_source() -> Graph {
        test_graph(
            "expensive-source",
            vec![
                tensor(0, 10, None),
                tensor(1, 100, Some(0)),
                tensor(2, 100, Some(1)),
                tensor(3, 10, Some(2)),
                tensor(4, 10, Some(5)),
                tensor(5, 140, Some(3)),
                tensor(6, 1, Some(4)),
            ],
            vec![
                op(0, "A", &[0], &[1], 40),
                op(1, "B", &[1], &[2], 1),
                op(2, "C", &[2], &[3], 1),
                op(3, "E", &[3], &[5], 1),
                op(4, "F", &[5], &[6], 1),
                op(5, "D", &[2, 6], &[4], 1),
            ],
        )
    }

    /// `A` makes t2 (10 B) from the input t0 (5 B); `B` makes t3 (5 B)
    /// from t2 with 100 B of workspace; `C` makes the gradient t4 (5 B)
    /// from t3 and the parameter t1 (100 B); `U` updates t1 in place from
    /// t4 (t5). Each op takes 1 s.
    fn updated_parameter() -> Graph {
        let mut param = tensor(1, 100, None);
        param.kind = TensorKind::Parameter;
        let mut update = tensor(5, 100, Some(3));
        update.inplace_update_of = Some(TensorId(1));
        let mut b = op(1, "B", &[2], &[3], 1);
        b.workspace_bytes = 100;
        let mut c = op(2, "C", &[3, 1], &[4], 1);
        c.phase = Phase::Backward;
        let mut u = op(3, "U", &[4, 1], &[5], 1);
        u.phase = Phase::Optimizer;
        test_graph(
            "updated-parameter",
            vec![
                tensor(0, 5, None),
                param,
                tensor(2, 10, Some(0)),
                tensor(3, 5, Some(1)),
                tensor(4, 5, Some(2)),
                update,
            ],
            vec![op(0, "A", &[0], &[2], 1), b, c, u],
        )
    }

    /// The parameter's copy-out shares the link with its copy-in.
    ///
    /// Under 120 B, at the start of `B` its working set (t2, t3 and the
    /// workspace: 115 B) leaves 5 B, so 95 B of t1 are swapped in after the
    /// cut (`S = 95`) and, updated by `U`, copied out once (`S_u = 95`).
    /// Copies move 1 B/s one way and 0.5 B/s each while both directions
    /// copy, so `κ = (1 - 0.5) / 0.5 = 1`. A copy-out of `b` bytes before
    /// the cut gives `u >= b`; the `a = 95 - b` after it give `v >= 95 + a`;
    /// and t1's swap-in must end before `C` and `U` (2 s) do, so `v >= 97`:
    /// `T = b + max(97, 190 - b) = 190` for any `b <= 93`. A real plan
    /// copies t1 out while `A` runs, frees it, runs `B` while t1 comes back
    /// and ends with `C` and `U`: 202 s (`window`, `odswap` and `outcore`
    /// find 204 s). With directions that do not share
    /// (`κ = 0`: 1 B/s each way at once) the program gives the old `1 +
    /// 97 = 98` s.
    #[test]
    fn a_copy_out_after_the_cut_shares_the_link_with_the_copies_in() {
        let g = updated_parameter();
        let at_b = |duplex_total: f64| {
            let cost = Flops(DeviceProfile {
                h2d_bytes_per_s: 1.0,
                d2h_bytes_per_s: 1.0,
                duplex_bytes_per_s: duplex_total,
                ..UnitCostModel::profile()
            });
            let times = op_times(&g, &cost);
            LpGraph::new(&g, &times, 4.0)
                .solve(OpId(1), 120, Link::of(&cost.copy_rates()))
                .expect("solves")
        };
        let shared = at_b(1.0);
        assert!((shared.time_s - 190.0).abs() < 1e-3, "{shared:?}");
        assert!((shared.swapped_bytes - 95.0).abs() < 1e-6, "{shared:?}");
        let independent = at_b(2.0);
        assert!((independent.time_s - 98.0).abs() < 1e-3, "{independent:?}");
        // Every plan held to the budget is slower than the bound.
        let cost = Flops(DeviceProfile {
            h2d_bytes_per_s: 1.0,
            d2h_bytes_per_s: 1.0,
            duplex_bytes_per_s: 1.0,
            ..UnitCostModel::profile()
        });
        every_plan_is_slower(&g, &cost, 120, shared.time_s);
    }

    /// Each copy's latency takes the link too. [`updated_parameter`] under
    /// 120 B with directions that do not share (1 B/s each way, at once or
    /// not) and 2 s of latency a copy: at the start of `B`, 95 B of t1 are
    /// swapped in after the cut (`s = 0.95`), and that swap-in must end
    /// before `C` and `U` (2 s), so `v >= 2 + 0.95 (100 + 2) = 98.9`; its
    /// copy-out (95 B, after the cut) asks only `v >= 95`, and the whole
    /// iteration `T >= 0.95 (100 + 2) = 96.9` either way; before the cut `A`
    /// (1 s): `T = 99.9` s, where without latency it is `1 + 97 = 98` s (the
    /// test above). Every plan held to the budget is slower.
    #[test]
    fn each_copy_pays_its_latency_on_the_link() {
        let g = updated_parameter();
        let cost = Flops(DeviceProfile {
            h2d_bytes_per_s: 1.0,
            d2h_bytes_per_s: 1.0,
            duplex_bytes_per_s: 2.0,
            copy_latency_s: 2.0,
            ..UnitCostModel::profile()
        });
        let link = Link::of(&cost.copy_rates());
        assert_eq!((link.in_copy_bytes, link.out_copy_bytes), (2.0, 2.0));
        let times = op_times(&g, &cost);
        let at_b = LpGraph::new(&g, &times, 4.0)
            .solve(OpId(1), 120, link)
            .expect("solves");
        assert!((at_b.time_s - 99.9).abs() < 1e-3, "{at_b:?}");
        every_plan_is_slower(&g, &cost, 120, at_b.time_s);
    }

    /// Every planner's verified plan for `g` within `budget_bytes` simulates
    /// no faster than `bound_s`, and at least one planner finds one.
    fn every_plan_is_slower(g: &Graph, cost: &dyn CostModel, budget_bytes: u64, bound_s: f64) {
        let mut plans = 0;
        for planner in outcore_planners::all() {
            let request = outcore_plan::PlanRequest {
                graph: g,
                cost,
                budget_bytes,
                seed: 0,
                time_limit_s: 0.5,
                allocator: &outcore_plan::AllocatorSpec::Perfect,
                order: None,
                fingerprint: None,
            };
            let Ok(outcore_plan::PlanOutcome::Feasible(plan)) = planner.plan(&request) else {
                continue;
            };
            if plan.budget_bytes > budget_bytes || !outcore_plan::verify(&plan, g).is_empty() {
                continue;
            }
            let sim = outcore_sim::simulate(g, &plan, cost, &Default::default())
                .expect("a verified plan simulates");
            assert!(
                sim.report.iter_time_s >= bound_s,
                "{}: {} s",
                planner.name(),
                sim.report.iter_time_s
            );
            plans += 1;
        }
        assert!(plans > 0, "no planner found a plan within {budget_bytes} B");
    }

    /// A test graph of `tensors` and `ops` (batch 1, no optimizer).
    fn test_graph(model: &str, tensors: Vec<Tensor>, ops: Vec<Op>) -> Graph {
        Graph {
            meta: GraphMeta {
                model: model.into(),
                batch: 1,
                seq: None,
                optimizer: "none".into(),
                source: "test".into(),
            },
            tensors,
            ops,
        }
    }

    fn op_times(g: &Graph, cost: &dyn CostModel) -> Vec<f64> {
        (0..g.ops.len())
            .map(|i| cost.op_time_s(g, OpId(i as u32)))
            .collect()
    }

    /// The program at the start of `E` under `budget_bytes`, copies at
    /// `rate` bytes/s each way.
    fn at_start_of_e(budget_bytes: u64, rate: f64) -> LpCut {
        let g = expensive_source();
        let cost = flops_model(rate);
        let times = op_times(&g, &cost);
        let lp = LpGraph::new(&g, &times, 45.0);
        lp.solve(OpId(3), budget_bytes, Link::of(&cost.copy_rates()))
            .expect("solves")
    }

    /// Hand-checked, with a link too slow to matter (1e-6 B/s). At the start
    /// of `E` its working set (t3 + t5 = 150 B) leaves 50 B of the 200 B
    /// budget, and t2 (100 B), which `D` reads later, is at most half
    /// present. Re-running `B` restores t2 only with t1 at hand, and keeping
    /// t1 costs the same 100 B per unit as keeping t2; so the rest comes from
    /// re-running `A` and `B` (41 s per unit) with t0 present (10 B per
    /// unit): `100 (1 - y) + 10 y <= 50` gives `y = 5/9`, 205/9 s of
    /// recomputation on top of the 45 s of compute: 67.78 s. The closed form
    /// takes t1 as at hand and prices the restoration at `B`'s 1 s per
    /// 100 B: far below.
    #[test]
    fn recomputation_needs_its_inputs() {
        let g = expensive_source();
        let cost = flops_model(1e-6);
        let times = op_times(&g, &cost);
        let rate = Link::of(&cost.copy_rates()).in_bytes_per_s;
        let at_e = at_start_of_e(200, rate);
        let expected = 45.0 + 205.0 / 9.0;
        assert!((at_e.time_s - expected).abs() < 1e-4, "{at_e:?}");
        assert!((at_e.recompute_s - 205.0 / 9.0).abs() < 1e-4, "{at_e:?}");
        // The bound takes it; the closed form alone stays below 46 s.
        let crate::Bound::Time(bound) = lower_bound(&g, &cost, 200) else {
            panic!("every working set fits 200 B");
        };
        assert!((bound.time_s - expected).abs() < 1e-4, "{bound:?}");
        assert_eq!(bound.program.as_ref().map(|p| p.op.as_str()), Some("E"));
        let closed = crate::cut_items(&g, &times, OpId(3));
        let relaxed = crate::solve(&closed, 40.0, 45.0, rate, rate);
        assert!(relaxed.time_s < 46.0, "{relaxed:?}");
    }

    /// With room to spare (300 B: the working set of `E` and t2 are 150 +
    /// 100 = 250 B) nothing is absent and the program gives the compute time.
    #[test]
    fn enough_memory_gives_the_compute_time() {
        let at_e = at_start_of_e(300, 1.0);
        assert!((at_e.time_s - 45.0).abs() < 1e-4, "{at_e:?}");
    }

    /// Hand-checked copy windows, on a 1 B/s link. At the start of `E` half
    /// of t2 is present (50 B of room). Each unit of the other half comes
    /// back one of three ways:
    /// - `y`: re-run `A` and `B` (41 s after the cut) with t0 copied in
    ///   (10 B; an input needs no copy-out);
    /// - `z`: copy t1 out and in (100 B each way), re-run `B` (1 s);
    /// - `b`: copy t2 out and in (100 B each way).
    ///
    /// Copy-outs start when their producer ends (t1 at 40 s, t2 at 41 s at
    /// the earliest), so `t_c >= max(42, 40 + 100 (z + b), 41 + 100 b)`.
    /// Every copy costs 100 s of `t_c` per unit beyond the 2 B (t1) and 1 B
    /// (t2) that fit before the cut and saves only 40 or 41 s of
    /// recomputation, so the optimum is `b = z = 1/100`, `y = 0.48`:
    /// `R = 41 * 0.48 + 0.01 = 19.69` s, `T = 45 + R = 64.69` s (and
    /// `t_c + 3 + R` is the same), with 1 + 1 + 4.8 = 6.8 bytes copied in.
    #[test]
    fn copy_windows_charge_late_copies() {
        let at_e = at_start_of_e(200, 1.0);
        assert!((at_e.time_s - 64.69).abs() < 1e-4, "{at_e:?}");
        assert!((at_e.swapped_bytes - 6.8).abs() < 1e-3, "{at_e:?}");
    }

    /// `A` (1 s) makes t1 (100 B) from the input t0 (10 B); `B` (1 s) makes
    /// t2 (10 B) from t1; `K` (10 s), a copy as PyTorch exports save for a
    /// backward op (made dear here), makes t3 (100 B) from t1; `C` (1 s)
    /// makes t4 (10 B) from t2; `D` (1 s) reads t3 and t4.
    fn free_clone() -> Graph {
        test_graph(
            "free-clone",
            vec![
                tensor(0, 10, None),
                tensor(1, 100, Some(0)),
                tensor(2, 10, Some(1)),
                tensor(3, 100, Some(2)),
                tensor(4, 10, Some(3)),
                tensor(5, 1, Some(4)),
            ],
            vec![
                op(0, "A", &[0], &[1], 1),
                op(1, "B", &[1], &[2], 1),
                op(2, "K", &[1], &[3], 10),
                op(3, "C", &[2], &[4], 1),
                op(4, "D", &[3, 4], &[5], 1),
            ],
        )
    }

    /// Hand-checked, with a link too slow to matter (1e-6 B/s). At the start
    /// of `C` the ancestors are `A` and `B`, the descendant `D`, and `K` is
    /// free: an order may run it on either side. Either t3 (`K` before the
    /// cut, `D` reads it after) or t1 (`K` after the cut reads it) must be
    /// restored, and the 70 B budget leaves 50 B beside `C`'s working set
    /// (t2 + t4). Ignoring `K` there would be nothing to restore (the
    /// compute time, 14 s). With `K` after the cut (`x = 0`), t1 comes back
    /// by keeping it (100 B per unit) or by re-running `A` with t0 kept
    /// (10 B and 1 s per unit): `100 (1 - y) + 10 y <= 50` gives `y = 5/9`,
    /// so `T = 14 + 5/9` s. Each unit of `x` instead asks for a unit of t3,
    /// kept (100 B) or re-run by `K` (10 s), and spares only a unit of t1's
    /// restoration, so the optimum has `x = 0`: `K` is deferred. (With `K`
    /// as cheap as the others, the relaxation's optimum takes `x = 1/2`.)
    #[test]
    fn a_free_op_may_run_on_either_side_of_the_cut() {
        let g = free_clone();
        let cost = flops_model(1e-6);
        let times = op_times(&g, &cost);
        let link = Link::of(&cost.copy_rates());
        let lp = LpGraph::new(&g, &times, 14.0);
        let choice = lp.solve_choice(OpId(3), 70, link).expect("solves");
        let expected = 14.0 + 5.0 / 9.0;
        assert!(
            (choice.optimum.time_s - expected).abs() < 1e-4,
            "{choice:?}"
        );
        assert!(
            (choice.optimum.recompute_s - 5.0 / 9.0).abs() < 1e-4,
            "{choice:?}"
        );
        assert_eq!(choice.deferred, vec![OpId(2)]);
        // With room for t1 or t3 beside the working set, nothing is dear.
        let roomy = lp.solve_choice(OpId(3), 120, link).expect("solves");
        assert!((roomy.optimum.time_s - 14.0).abs() < 1e-4, "{roomy:?}");
    }
}
