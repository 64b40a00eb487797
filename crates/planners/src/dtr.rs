//! `dtr`: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021,
//! Sec. 3-4) run over the static graph, as the paper's simulator runs it over
//! recorded traces. The ops run in the request's order; before an op runs,
//! every storage it reads that is not resident is rematerialised, recursively
//! (a recomputation first brings back what its producer reads). Whenever an
//! allocation would exceed the budget, the resident evictable storage with
//! the smallest
//!
//! ```text
//! h_DTR^eq(t) = (c(t) + sum of the costs of the distinct equivalence classes
//!                of t's evicted neighbours) / (m(t) * s(t))
//! ```
//!
//! is evicted (`c`: the producer's run time, `m`: bytes, `s`: staleness) until
//! the allocation fits. The equivalence classes are the paper's union-find
//! approximation of the evicted neighbourhood e*(t) (Sec. 4, "h_DTR^eq"): when
//! a storage is evicted it forms a class with its own cost and is merged with
//! the classes of its evicted parents and children; when it is rematerialised
//! its cost leaves its class and it leaves the class (classes never split,
//! as in the paper). Storage that is dead (past its last use) is freed and
//! evicted eagerly (the paper's "eager eviction"), so it joins the classes and
//! can still be rematerialised for a recomputation that reads it. Nothing is
//! swapped. The decisions become a Schedule (the request's order plus one
//! recompute gap per eviction that is later rematerialised) lowered through the
//! shared machinery and proven like every plan.
//!
//! Choices where the paper (written for a runtime) leaves a static simulator
//! free, each with its reason:
//! - **Staleness** is measured on DTR's own clock, the simulated compute time
//!   so far including recomputations (the prototype's `clock`), as `clock -
//!   last access`; a storage is accessed when it is produced, read, written in
//!   place or read by a recomputation. Zero staleness gives an infinite score.
//! - **Evictable** storage: non-persistent storage owners whose producer may be
//!   re-run and allocates all its outputs, that some op reads after production,
//!   and that are not step outputs (see `remat::Residence`). Parameters,
//!   buffers, optimizer state, the input batch and labels, and the outputs of
//!   ops that may not be recomputed are never evicted (the paper pins
//!   constants the same way).
//! - **Recomputation horizon**: a storage is evicted only if it can still be
//!   rematerialised at its next use, i.e. no in-place write since production
//!   changes what its producer reads (or the storage itself), and every input
//!   of its producer is then persistent, still resident by the rules above,
//!   or itself rematerialisable (recursively). This replaces the prototype's
//!   "banishing" with a static check, so rematerialisation never fails.
//! - **Locks**: everything op `k` reads is locked until op `k` has run; a
//!   storage rematerialised before op `k`, or read by a recomputation there,
//!   and not read by op `k` is locked until the last recomputation that reads
//!   it has run, then unlocked (evicted at once if dead), as the prototype
//!   unlocks a recomputation's inputs once it has run. When such a link later
//!   leaves the device, the shared lowering frees it right after that last
//!   reader (its gap starts at `k`), which is no later than here. A storage
//!   is rematerialised at most once per op.
//! - **Order of recomputations**: the storages missing before op `k` are found
//!   recursively (the paper's rematerialisation) and then recomputed in
//!   producer order (op id), the order the lowering runs recomputations at
//!   one position in, so the memory counted here bounds what `verify()`
//!   counts: every free the lowering emits comes no later than DTR's
//!   eviction (a gap's free follows the last use, recomputation or read by a
//!   recomputation before the eviction).
//! - **Kept chain links** (a variant, not the paper's, used only by
//!   `outcore`'s kept-link seeds: `dtr_gaps_remade` with `Remade::Kept`): a
//!   storage rematerialised only for recomputations stays resident after
//!   them, evictable by its score, instead of leaving at once; the `dtr`
//!   planner keeps the paper's eager eviction.
//! - **Multi-output producers**: a recomputation restores only the storage
//!   asked for; the producer's other outputs are scratch for that step (the
//!   one Plan's `Recompute` semantics), and each recomputation costs the
//!   producer's whole run time.
//! - **Ties** (equal scores) go to the lowest tensor id, so the plan is
//!   reproducible; there is nothing random (the seed is unused).
//! - **Budget**: DTR is greedy, and a run against a smaller budget sometimes
//!   evicts earlier and so avoids a dead end (a rematerialisation whose chain
//!   no longer fits) or a thrash that the run at the full budget meets. The
//!   planner therefore runs DTR at the request's budget and at each of the
//!   framework's tighter planning margins (`MARGINS`: 95% down to 50% of it),
//!   scores every run (verify and simulate, under the request's allocator) and
//!   returns the fastest that fits; the plan records the margin it came from.
//!   When no run fits (nothing left that DTR may evict and an allocation still
//!   does not fit), the planner is infeasible and says where the run at the
//!   full budget stopped.

use crate::framework::decisions::recompute_gap;
use crate::framework::{
    Ctx, MARGINS, Pick, Score, Scored, Scratch, Search, Shortfall, margin_budget,
};
use crate::remat::{RematFacts, Residence};
use outcore_graph::TensorId;
use outcore_plan::{
    Gap, PlanOutcome, PlanRequest, Planner, PlannerError, PlannerErrorKind, fmt_bytes,
};
use serde_json::json;

/// DTR's greedy eviction with on-demand rematerialisation (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Dtr;

impl Planner for Dtr {
    fn name(&self) -> &'static str {
        "dtr"
    }

    fn description(&self) -> &'static str {
        "Dynamic Tensor Rematerialization (Kirisame et al. 2021, Sec. 3-4): evict the smallest h_DTR^eq = e*-cost / (bytes x staleness) on demand, rematerialise recursively; no swapping"
    }

    fn plan(&self, request: &PlanRequest<'_>) -> Result<PlanOutcome, PlannerError> {
        let ctx = Ctx::for_request(request, self.name())?;
        let search = Search::new(&ctx, request, self.name());
        let facts = RematFacts::new(&ctx);
        let horizon = remat_horizons(&facts);
        let what = "after evicting everything DTR may evict, at the budget and at every tighter planning margin";
        let attempt = |margin: f64, scratch: &mut Scratch| {
            let budget_bytes = margin_budget(request.budget_bytes, margin);
            match run_dtr(&ctx, &facts, &horizon, Budget::Uniform(budget_bytes)) {
                Ok(run) => search.scored(run.settings(margin), run.gaps, scratch),
                Err(DtrFailure::Shortfall(s)) => Ok(Scored {
                    settings: json!({ "planning_margin": margin }),
                    schedule: None,
                    score: Score::Shortfall(s),
                }),
                Err(DtrFailure::Bug(message)) => Err(PlannerError::new(
                    self.name(),
                    PlannerErrorKind::Lowering,
                    message,
                )),
            }
        };
        let outcome = search.best(what, &MARGINS, Pick::Fastest, |&m, scratch| {
            attempt(m, scratch)
        })?;
        if outcome.plan().is_some() {
            return Ok(outcome);
        }
        // Say why at the request's own budget, not at a tighter margin.
        let full = attempt(1.0, &mut Scratch::default())?;
        Ok(PlanOutcome::Infeasible(search.infeasible(what, &[full])))
    }
}

/// DTR's recompute gaps for the context's order under `budget_bytes`, or
/// `None` when DTR runs out of memory (for the exact reference's warm start).
pub(crate) fn dtr_gaps(ctx: &Ctx<'_>, facts: &RematFacts, budget_bytes: u64) -> Option<Vec<Gap>> {
    dtr_gaps_remade(ctx, facts, budget_bytes, Remade::Evicted)
}

/// DTR's recompute gaps for the context's order when the memory it may use
/// differs by position: `budget_at[k]` bytes before and while op `k` runs
/// (every persistent tensor counted resident, as always). `None` when DTR
/// runs out of memory somewhere.
///
/// Why: the streamed seeds ([`crate::joint::streamed`]) keep persistent
/// tensors on the host except around their uses, so the memory left to
/// activations changes along the order. Planned under one budget, DTR
/// either keeps too much where the streamed tensors are on the device or
/// finds no plan where they are not. On `tools/examples/vgg16_b32.json`
/// (the PyTorch VGG-16 b32 export with in-place ReLUs) at 50% on
/// `v100-16gb-pcie3`, DTR with every persistent tensor resident needs
/// 2.71 GiB, and its plan at 2.89 GiB merged with every persistent tensor
/// streamed peaked at 2.58 GiB against the 1.86 GiB budget; by position,
/// DTR plans within the budget and the merge of the optimizer state fits
/// (at 36007aa; see [`crate::joint::streamed`] for what changed since).
pub(crate) fn dtr_gaps_under(
    ctx: &Ctx<'_>,
    facts: &RematFacts,
    budget_at: &[u64],
) -> Option<Vec<Gap>> {
    dtr_gaps_under_remade(ctx, facts, budget_at, Remade::Evicted)
}

/// [`dtr_gaps_under`] with rematerialised chain links handled as `remade`
/// says (see [`dtr_gaps_remade`]).
pub(crate) fn dtr_gaps_under_remade(
    ctx: &Ctx<'_>,
    facts: &RematFacts,
    budget_at: &[u64],
    remade: Remade,
) -> Option<Vec<Gap>> {
    if budget_at.len() != facts.n {
        return None;
    }
    let horizon = remat_horizons(facts);
    run_dtr_with(ctx, facts, &horizon, Budget::ByPosition(budget_at), remade)
        .ok()
        .map(|run| run.gaps)
}

/// The bytes DTR may hold: one number, or one per position of the order.
#[derive(Debug, Clone, Copy)]
enum Budget<'a> {
    Uniform(u64),
    ByPosition(&'a [u64]),
}

impl Budget<'_> {
    /// The budget while position `k`'s recomputations and op run.
    fn at(self, k: usize) -> u64 {
        match self {
            Budget::Uniform(b) => b,
            Budget::ByPosition(b) => b[k],
        }
    }
}

/// Per storage owner: the last position at which it can be rematerialised
/// (see the module docs). Producers come before their outputs in any order,
/// so one pass in production order sees every parent's horizon first.
pub(crate) fn remat_horizons(facts: &RematFacts) -> Vec<usize> {
    let nt = facts.residence.len();
    let mut by_production: Vec<(usize, usize)> = (0..nt)
        .filter(|&i| facts.residence[i] == Residence::Rematerialisable)
        .map(|i| (facts.made_at[i], i))
        .collect();
    by_production.sort_unstable();
    let mut horizon = vec![0usize; nt];
    for (_, i) in by_production {
        let mut h = facts.version_horizon[i];
        for &w in &facts.parents[i] {
            let reachable = match facts.residence[w.index()] {
                Residence::Pinned { to, .. } => to,
                // Resident through its last use once it may no longer be
                // evicted; rematerialisable up to its own horizon before.
                Residence::Rematerialisable => horizon[w.index()].max(facts.last_use[w.index()]),
                Residence::Persistent | Residence::NotOwner => usize::MAX,
            };
            h = h.min(reachable);
        }
        horizon[i] = h;
    }
    horizon
}

/// The storages a position's recomputations involve (those recomputed and
/// those they read), each with the index of the last recomputation in the
/// list that reads it (for one recomputed and read by none: its own).
fn chain_links(facts: &RematFacts, closure: &[TensorId]) -> Vec<(TensorId, usize)> {
    let mut links: Vec<(TensorId, usize)> = Vec::new();
    let mut note = |t: TensorId, i: usize| match links.iter_mut().find(|l| l.0 == t) {
        Some(l) => l.1 = l.1.max(i),
        None => links.push((t, i)),
    };
    for (i, &c) in closure.iter().enumerate() {
        note(c, i);
        for &p in &facts.parents[c.index()] {
            note(p, i);
        }
    }
    links
}

/// Why a DTR run produced no schedule.
enum DtrFailure {
    /// Memory ran out with nothing left to evict.
    Shortfall(Shortfall),
    /// The simulation met a state its own rules exclude (a planner bug).
    Bug(String),
}

/// What one DTR run decided.
#[derive(Debug)]
struct DtrRun {
    gaps: Vec<Gap>,
    evictions: usize,
    recomputations: usize,
    recompute_time_s: f64,
    peak_bytes: u64,
}

impl DtrRun {
    fn settings(&self, margin: f64) -> serde_json::Value {
        json!({
            "heuristic": "h_DTR^eq (equivalence-class e* cost / (bytes x staleness))",
            "staleness": "DTR clock (compute time including recomputation) since last access",
            "planning_margin": margin,
            "evictions": self.evictions,
            "recomputations": self.recomputations,
            "modelled_recompute_time_s": self.recompute_time_s,
            "modelled_peak_bytes": self.peak_bytes,
        })
    }
}

/// Runs DTR over the context's order under `budget`.
fn run_dtr(
    ctx: &Ctx<'_>,
    facts: &RematFacts,
    horizon: &[usize],
    budget: Budget<'_>,
) -> Result<DtrRun, DtrFailure> {
    run_dtr_with(ctx, facts, horizon, budget, Remade::Evicted)
}

/// What DTR does with a storage it rematerialised only for recomputations
/// (a chain link, past its last use by an op) once they have read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remade {
    /// Evicts it at once, as any dead storage (the paper's eager eviction).
    Evicted,
    /// Leaves it resident, evictable by its score like any other storage,
    /// so that the recomputations after find it while it lasts.
    Kept,
}

/// DTR's recompute gaps for the context's order under `budget_bytes`, with
/// rematerialised chain links handled as `remade` says; `None` when DTR
/// runs out of memory.
///
/// Why [`Remade::Kept`]: on DenseNet-121 b64 at 12.5% of its footprint on
/// `v100-16gb-pcie3` a dense block's new features are dead after the
/// block's last concatenation; every concatenation the backward pass
/// recomputes rematerialises them, with the chain behind each, and eager
/// eviction drops them again right after, so the next one starts over
/// (some convolutions ran seventeen times, 0.22 s of recomputation over
/// 0.22 s of compute).
pub(crate) fn dtr_gaps_remade(
    ctx: &Ctx<'_>,
    facts: &RematFacts,
    budget_bytes: u64,
    remade: Remade,
) -> Option<Vec<Gap>> {
    let horizon = remat_horizons(facts);
    run_dtr_with(ctx, facts, &horizon, Budget::Uniform(budget_bytes), remade)
        .ok()
        .map(|run| run.gaps)
}

fn run_dtr_with(
    ctx: &Ctx<'_>,
    facts: &RematFacts,
    horizon: &[usize],
    budget: Budget<'_>,
    remade: Remade,
) -> Result<DtrRun, DtrFailure> {
    let mut sim = DtrSim::new(ctx, facts, horizon, budget);
    sim.remade = remade;
    for k in 0..facts.n {
        sim.step(k)?;
    }
    Ok(DtrRun {
        gaps: sim.gaps,
        evictions: sim.evictions,
        recomputations: sim.recomputations,
        recompute_time_s: sim.recompute_time_s,
        peak_bytes: sim.peak_bytes,
    })
}

/// Union-find over evicted storages, each class carrying its total cost.
#[derive(Debug, Default)]
struct EqClasses {
    parent: Vec<u32>,
    cost_s: Vec<f64>,
}

impl EqClasses {
    fn make(&mut self, cost_s: f64) -> u32 {
        let id = self.parent.len() as u32;
        self.parent.push(id);
        self.cost_s.push(cost_s);
        id
    }

    fn root(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let up = self.parent[self.parent[x as usize] as usize];
            self.parent[x as usize] = up;
            x = up;
        }
        x
    }

    fn merge(&mut self, a: u32, b: u32) {
        let (ra, rb) = (self.root(a), self.root(b));
        if ra != rb {
            self.parent[ra as usize] = rb;
            self.cost_s[rb as usize] += self.cost_s[ra as usize];
        }
    }
}

/// The simulation state: residency, locks, DTR's clock and metadata, and
/// the gaps recorded so far.
struct DtrSim<'a> {
    ctx: &'a Ctx<'a>,
    facts: &'a RematFacts,
    horizon: &'a [usize],
    budget: Budget<'a>,
    remade: Remade,
    /// Rematerialised at least once (for [`Remade::Kept`]).
    was_remade: Vec<bool>,
    resident: Vec<bool>,
    /// `k + 1` while locked at position `k`.
    locked: Vec<usize>,
    last_access_s: Vec<f64>,
    /// Last position that produced, used or rematerialised the storage: where
    /// its next gap starts.
    anchor: Vec<usize>,
    /// Equivalence class of an evicted storage.
    class_of: Vec<Option<u32>>,
    classes: EqClasses,
    /// Resident evictable storages, and each one's index in it.
    pool: Vec<TensorId>,
    pool_index: Vec<usize>,
    live_bytes: u64,
    clock_s: f64,
    gaps: Vec<Gap>,
    evictions: usize,
    recomputations: usize,
    recompute_time_s: f64,
    peak_bytes: u64,
}

const NOT_IN_POOL: usize = usize::MAX;

impl<'a> DtrSim<'a> {
    fn new(
        ctx: &'a Ctx<'a>,
        facts: &'a RematFacts,
        horizon: &'a [usize],
        budget: Budget<'a>,
    ) -> Self {
        let nt = facts.residence.len();
        let mut resident = vec![false; nt];
        let mut live_bytes = facts.persistent_bytes;
        for (i, r) in facts.residence.iter().enumerate() {
            if let Residence::Pinned { from: None, .. } = r {
                resident[i] = true;
                live_bytes += facts.size_bytes[i];
            }
        }
        DtrSim {
            ctx,
            facts,
            horizon,
            budget,
            remade: Remade::Evicted,
            was_remade: vec![false; nt],
            resident,
            locked: vec![0; nt],
            last_access_s: vec![0.0; nt],
            anchor: vec![0; nt],
            class_of: vec![None; nt],
            classes: EqClasses::default(),
            pool: Vec::new(),
            pool_index: vec![NOT_IN_POOL; nt],
            live_bytes,
            clock_s: 0.0,
            gaps: Vec::new(),
            evictions: 0,
            recomputations: 0,
            recompute_time_s: 0.0,
            peak_bytes: live_bytes,
        }
    }

    /// Position `k`: rematerialise what op `k` reads, run it, free the dead.
    fn step(&mut self, k: usize) -> Result<(), DtrFailure> {
        let facts = self.facts;
        let closure = self.missing_closure(k)?;
        let links = chain_links(facts, &closure);
        for &t in facts.needs_at[k].iter().chain(links.iter().map(|l| &l.0)) {
            self.locked[t.index()] = k + 1;
        }
        for (i, &t) in closure.iter().enumerate() {
            self.rematerialise(t, k)?;
            self.release_chain_links(&links, i, k);
        }
        self.run_op(k)?;
        for &t in facts.needs_at[k]
            .iter()
            .chain(&facts.outputs_at[k])
            .chain(&closure)
        {
            self.free_if_dead(t, k);
        }
        Ok(())
    }

    /// The storages that must be rematerialised before op `k`: what it
    /// needs that is not resident, and recursively what their producers read
    /// that is not resident, in producer order (the lowering's order).
    fn missing_closure(&self, k: usize) -> Result<Vec<TensorId>, DtrFailure> {
        let facts = self.facts;
        let mut seen: Vec<TensorId> = Vec::new();
        let mut stack: Vec<TensorId> = facts.needs_at[k]
            .iter()
            .copied()
            .filter(|t| !self.is_available(*t))
            .collect();
        while let Some(t) = stack.pop() {
            if seen.contains(&t) {
                continue;
            }
            if !facts.is_rematerialisable(t) || k > self.horizon[t.index()] {
                return Err(DtrFailure::Bug(format!(
                    "dtr: {t} is needed at position {k} (op `{}`) but is gone and cannot be rematerialised there",
                    self.ctx.op_at(k).name
                )));
            }
            seen.push(t);
            for &p in &facts.parents[t.index()] {
                if !self.is_available(p) {
                    stack.push(p);
                }
            }
        }
        // The lowering runs the recomputations at one position by producer
        // op id, ties by tensor id.
        let graph = self.ctx.graph;
        seen.sort_unstable_by_key(|&t| (graph.tensor(t).producer, t));
        Ok(seen)
    }

    /// After the `i`-th recomputation at `k`: unlocks the storages that op
    /// `k` does not read and that no later recomputation reads (the lowering
    /// frees such a storage right there if it leaves the device at `k`); the
    /// dead ones leave at once (eager eviction).
    fn release_chain_links(&mut self, links: &[(TensorId, usize)], i: usize, k: usize) {
        for &(c, last) in links {
            if last != i || self.facts.needs_at[k].contains(&c) {
                continue;
            }
            self.locked[c.index()] = 0;
            if self.resident[c.index()]
                && self.facts.is_rematerialisable(c)
                && self.facts.last_use[c.index()] < k
                && !self.kept_link(c, k)
            {
                self.evict(c);
            }
        }
    }

    /// Whether `t`, dead at `k`, stays resident as a rematerialised chain
    /// link ([`Remade::Kept`]).
    fn kept_link(&self, t: TensorId, k: usize) -> bool {
        self.remade == Remade::Kept
            && self.was_remade[t.index()]
            && self.facts.last_use[t.index()] < k
    }

    /// Resident, or never leaving the device (persistent).
    fn is_available(&self, t: TensorId) -> bool {
        self.resident[t.index()] || self.facts.residence[t.index()] == Residence::Persistent
    }

    fn rematerialise(&mut self, t: TensorId, k: usize) -> Result<(), DtrFailure> {
        let facts = self.facts;
        let i = t.index();
        self.make_room(facts.size_bytes[i] + facts.scratch_bytes[i], k)?;
        self.touch_all(&facts.parents[i]);
        // A read by a recomputation is an anchor: a gap may start here.
        for &p in &facts.parents[i] {
            self.anchor[p.index()] = k;
        }
        self.live_bytes += facts.size_bytes[i];
        self.peak_bytes = self
            .peak_bytes
            .max(self.live_bytes + facts.scratch_bytes[i]);
        self.clock_s += facts.recompute_s[i];
        self.recompute_time_s += facts.recompute_s[i];
        self.recomputations += 1;
        if let Some(c) = self.class_of[i].take() {
            let root = self.classes.root(c);
            self.classes.cost_s[root as usize] -= facts.recompute_s[i];
        }
        self.gaps.push(recompute_gap(t, self.anchor[i], k));
        self.anchor[i] = k;
        self.resident[i] = true;
        self.was_remade[i] = true;
        self.pool_add(t);
        Ok(())
    }

    fn run_op(&mut self, k: usize) -> Result<(), DtrFailure> {
        let facts = self.facts;
        self.make_room(facts.op_bytes(k), k)?;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes + facts.op_bytes(k));
        self.clock_s += self.ctx.op_time_s[k];
        for &o in &facts.outputs_at[k] {
            self.live_bytes += facts.size(o);
            self.resident[o.index()] = true;
            self.locked[o.index()] = k + 1;
            if facts.is_rematerialisable(o) {
                self.pool_add(o);
            }
        }
        for &t in facts.needs_at[k].iter().chain(&facts.outputs_at[k]) {
            self.anchor[t.index()] = k;
        }
        self.touch_all(&facts.needs_at[k]);
        self.touch_all(&facts.outputs_at[k]);
        Ok(())
    }

    fn touch_all(&mut self, ts: &[TensorId]) {
        for &t in ts {
            self.last_access_s[t.index()] = self.clock_s;
        }
    }

    /// Frees a storage after position `k` if nothing reads it later: pinned
    /// storage at the end of its interval, evictable storage after its last
    /// use (eagerly evicted: it keeps a class and can be rematerialised).
    fn free_if_dead(&mut self, t: TensorId, k: usize) {
        let i = t.index();
        if !self.resident[i] {
            return;
        }
        match self.facts.residence[i] {
            Residence::Pinned { to, .. } if to <= k => {
                self.resident[i] = false;
                self.live_bytes -= self.facts.size_bytes[i];
            }
            Residence::Rematerialisable if self.facts.last_use[i] <= k && !self.kept_link(t, k) => {
                self.evict(t)
            }
            _ => {}
        }
    }

    /// Evicts by h_DTR^eq until `bytes` more fit the budget.
    fn make_room(&mut self, bytes: u64, k: usize) -> Result<(), DtrFailure> {
        while self.live_bytes + bytes > self.budget.at(k) {
            let Some(victim) = self.choose_victim(k) else {
                let needed = self.live_bytes + bytes;
                let op = &self.ctx.op_at(k).name;
                return Err(DtrFailure::Shortfall(Shortfall {
                    needed_bytes: Some(needed),
                    at: Some(format!("op `{op}`")),
                    message: format!(
                        "DTR needs {} at op `{op}` (position {k}) with nothing left that it may evict; {} of that is locked, pinned or persistent",
                        fmt_bytes(needed),
                        fmt_bytes(self.live_bytes),
                    ),
                }));
            };
            self.evict(victim);
            self.evictions += 1;
        }
        Ok(())
    }

    /// The evictable resident storage with the smallest score, ties to the
    /// lowest id; `None` when nothing may be evicted at `k`.
    fn choose_victim(&mut self, k: usize) -> Option<TensorId> {
        let mut best: Option<(f64, TensorId)> = None;
        for idx in 0..self.pool.len() {
            let t = self.pool[idx];
            let i = t.index();
            if self.locked[i] == k + 1 || !self.may_evict(t, k) {
                continue;
            }
            let h = self.score(t);
            let better = best.is_none_or(|(bh, bt)| h < bh || (h == bh && t < bt));
            if better {
                best = Some((h, t));
            }
        }
        best.map(|b| b.1)
    }

    /// Evicting at `k` is safe when the next use can still rematerialise it.
    fn may_evict(&self, t: TensorId, k: usize) -> bool {
        let uses = &self.ctx.uses[t.index()];
        let next = uses.partition_point(|&u| u <= k);
        match uses.get(next) {
            Some(&u) => u <= self.horizon[t.index()],
            // A dead storage is resident only as a kept chain link: evicting
            // it is what eager eviction would have done.
            None => self.kept_link(t, k + 1),
        }
    }

    /// h_DTR^eq: cost of `t` and of its evicted neighbours' distinct classes,
    /// over bytes times staleness.
    fn score(&mut self, t: TensorId) -> f64 {
        let i = t.index();
        let facts = self.facts;
        let mut roots: Vec<u32> = Vec::new();
        for &n in facts.parents[i].iter().chain(&facts.children[i]) {
            if let Some(c) = self.class_of[n.index()] {
                let r = self.classes.root(c);
                if !roots.contains(&r) {
                    roots.push(r);
                }
            }
        }
        let cost_s = facts.recompute_s[i]
            + roots
                .iter()
                .map(|&r| self.classes.cost_s[r as usize].max(0.0))
                .sum::<f64>();
        let staleness_s = self.clock_s - self.last_access_s[i];
        let denominator = facts.size_bytes[i] as f64 * staleness_s;
        if denominator > 0.0 {
            cost_s / denominator
        } else {
            f64::INFINITY
        }
    }

    /// Frees `t` and puts it in an equivalence class with its evicted
    /// neighbours.
    fn evict(&mut self, t: TensorId) {
        let i = t.index();
        let facts = self.facts;
        self.resident[i] = false;
        self.live_bytes -= facts.size_bytes[i];
        self.pool_remove(t);
        let class = self.classes.make(facts.recompute_s[i]);
        for &n in facts.parents[i].iter().chain(&facts.children[i]) {
            if let Some(c) = self.class_of[n.index()] {
                self.classes.merge(c, class);
            }
        }
        self.class_of[i] = Some(class);
    }

    fn pool_add(&mut self, t: TensorId) {
        if self.pool_index[t.index()] == NOT_IN_POOL {
            self.pool_index[t.index()] = self.pool.len();
            self.pool.push(t);
        }
    }

    fn pool_remove(&mut self, t: TensorId) {
        let idx = std::mem::replace(&mut self.pool_index[t.index()], NOT_IN_POOL);
        if idx == NOT_IN_POOL {
            return;
        }
        self.pool.swap_remove(idx);
        if let Some(&moved) = self.pool.get(idx) {
            self.pool_index[moved.index()] = idx;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::graph_order;
    use crate::framework::testing::v100;
    use outcore_graph::builder::{GraphBuilder, Optimizer};
    use outcore_graph::{DType, Graph, footprint};

    /// Six linear + relu layers 256 wide at batch 1024 (1 MiB activations,
    /// 256 KiB weights), trained with SGD and momentum: the activations dominate.
    fn mlp() -> Graph {
        let mut b = GraphBuilder::new("mlp", 1024, DType::Float32);
        let mut x = b.input("x", &[1024, 256]);
        for i in 0..6 {
            let y = b.linear(&format!("fc{i}"), x, 256, false);
            x = b.relu(y);
        }
        let labels = b.label("labels", &[1024]);
        let loss = b.softmax_cross_entropy(x, labels);
        b.finish(loss, Optimizer::sgd_momentum())
            .expect("hand graph")
    }

    /// A budget the same at every position plans as that budget does; room
    /// everywhere evicts nothing; a budget tight only from the backward
    /// pass on still makes DTR recompute; a profile of the wrong length is
    /// refused.
    #[test]
    fn a_budget_by_position_plans_like_dtr_at_each_position() {
        let g = mlp();
        let cost = v100();
        let ctx = Ctx::new(&g, &cost, graph_order(&g));
        let facts = RematFacts::new(&ctx);
        let n = ctx.n;
        let (footprint_bytes, _) = footprint(&g);
        let tight = footprint_bytes * 7 / 10;
        let uniform = dtr_gaps(&ctx, &facts, tight).expect("DTR fits at 70%");
        assert!(
            !uniform.is_empty(),
            "70% of the footprint needs recomputation"
        );
        assert_eq!(dtr_gaps_under(&ctx, &facts, &vec![tight; n]), Some(uniform));
        assert_eq!(
            dtr_gaps_under(&ctx, &facts, &vec![footprint_bytes; n]),
            Some(Vec::new())
        );
        let backward = crate::framework::ctx::backward_start(&g, &ctx.order);
        assert!(backward > 0 && backward < n, "{backward} of {n}");
        let profile: Vec<u64> = (0..n)
            .map(|k| if k < backward { footprint_bytes } else { tight })
            .collect();
        let gaps = dtr_gaps_under(&ctx, &facts, &profile).expect("fits");
        assert!(
            !gaps.is_empty(),
            "tight in the backward pass, yet nothing recomputed"
        );
        assert!(
            gaps.iter()
                .all(|g| g.how == outcore_plan::Restore::Recompute)
        );
        assert_eq!(dtr_gaps_under(&ctx, &facts, &profile[1..]), None);
    }

    #[test]
    fn equivalence_classes_sum_merged_costs_and_lose_rematerialised_ones() {
        let mut classes = EqClasses::default();
        let a = classes.make(1.0);
        let b = classes.make(2.0);
        let c = classes.make(4.0);
        classes.merge(a, b);
        let ab = classes.root(a);
        assert_eq!(classes.root(b), ab);
        assert_eq!(classes.cost_s[ab as usize], 3.0);
        // Merging twice counts once.
        classes.merge(b, a);
        let root = classes.root(a);
        assert_eq!(classes.cost_s[root as usize], 3.0);
        classes.merge(c, a);
        let all = classes.root(c);
        assert_eq!(classes.root(a), all);
        assert_eq!(classes.cost_s[all as usize], 7.0);
        // A rematerialised member's cost leaves its class (as DTR does); the
        // class itself is not split.
        classes.cost_s[all as usize] -= 2.0;
        let root = classes.root(b);
        assert_eq!(classes.cost_s[root as usize], 5.0);
    }
}
