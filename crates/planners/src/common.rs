//! Shared machinery of the baseline planners (vDNN, checkpointing, SuperNeurons,
//! LMS): which tensors backward keeps from forward, how per-tensor decisions
//! (keep, recompute, swap) become gaps under the shared lowering, and the
//! lower -> verify -> simulate pipeline that turns candidate schedules into a
//! plan or an infeasibility reason.
//!
//! [`materialise`] turns decisions into gaps with recomputation chains: a
//! dropped tensor comes back at the first position that needs it (its first
//! backward use, an anchor such as the start of a Chen et al. segment, or a
//! recomputation that reads it); a recomputation at position `p` needs its
//! inputs resident at `p`, so inputs that are gone by then (dropped, swapped,
//! or dead after forward, e.g. a batch-norm output that only feeds a ReLU) are
//! brought back at `p` too, recursively. The lowering runs the recomputations
//! at one position in producer order, lets the first step at `p` carry the
//! swap-in waits, and frees tensors brought back only for recomputations right
//! after them. [`Analysis::try_recompute`] is the older one-hop rule (inputs
//! must already be resident), kept for planners that want it.

use outcore_graph::{Graph, OpId, Phase, TensorId, TensorKind, footprint};
use outcore_plan::{
    Gap, Instr, Plan, PlanOutcome, PlanRequest, PlannerInfo, Restore, Schedule, ViolationKind,
    fmt_bytes, lower_in_order, lower_schedule, use_positions, verify,
};
use outcore_sim::{SimOptions, simulate};

/// Use positions of every storage owner in the graph's own order, and where the
/// forward phase ends.
#[derive(Debug)]
pub struct Analysis<'g> {
    pub graph: &'g Graph,
    pub order: Vec<OpId>,
    /// Per storage owner: ascending positions that read, produce or update it.
    pub uses: Vec<Vec<usize>>,
    /// Position of the first op that is not a forward op (`n_ops` if none).
    pub backward_start: usize,
}

impl<'g> Analysis<'g> {
    pub fn new(graph: &'g Graph) -> Self {
        let order: Vec<OpId> = graph.ops.iter().map(|o| o.id).collect();
        let uses = use_positions(graph, &order);
        let backward_start = graph
            .ops
            .iter()
            .position(|o| o.phase != Phase::Forward)
            .unwrap_or(graph.ops.len());
        Analysis {
            graph,
            order,
            uses,
            backward_start,
        }
    }

    /// Position of an op in the order (graph order, so its index).
    pub fn position(&self, op: OpId) -> usize {
        op.index()
    }

    pub fn last_forward_use(&self, t: TensorId) -> Option<usize> {
        self.uses[t.index()]
            .iter()
            .rev()
            .find(|&&p| p < self.backward_start)
            .copied()
    }

    pub fn first_backward_use(&self, t: TensorId) -> Option<usize> {
        self.uses[t.index()]
            .iter()
            .find(|&&p| p >= self.backward_start)
            .copied()
    }

    /// The interval from the last forward use to the first backward use, when the
    /// tensor has both and at least one op runs in between (otherwise taking it
    /// off the device gains nothing).
    pub fn forward_backward_gap(&self, t: TensorId) -> Option<(usize, usize)> {
        let after = self.last_forward_use(t)?;
        let before = self.first_backward_use(t)?;
        (before >= after + 2).then_some((after, before))
    }

    /// Feature maps backward needs: non-persistent storage owners made by forward
    /// ops (or the input batch and labels) and read again after forward, in the
    /// order they are made.
    pub fn saved_activations(&self) -> Vec<TensorId> {
        let mut out: Vec<(usize, TensorId)> = self
            .graph
            .tensors
            .iter()
            .filter(|t| t.allocates() && !t.is_persistent() && !t.is_output)
            .filter(|t| {
                matches!(
                    t.kind,
                    TensorKind::Activation | TensorKind::Input | TensorKind::Label
                )
            })
            .filter(|t| {
                t.producer
                    .is_none_or(|p| self.graph.op(p).phase == Phase::Forward)
            })
            .filter(|t| self.forward_backward_gap(t.id).is_some())
            .map(|t| (t.producer.map_or(0, |p| self.position(p) + 1), t.id))
            .collect();
        out.sort();
        out.into_iter().map(|(_, t)| t).collect()
    }

    /// Storage owners of the inputs of forward ops whose class satisfies `pick`.
    pub fn forward_inputs_where(&self, pick: impl Fn(&outcore_graph::Op) -> bool) -> Vec<bool> {
        let mut mark = vec![false; self.graph.tensors.len()];
        for op in self.graph.ops_in_phase(Phase::Forward).filter(|o| pick(o)) {
            for &t in &op.inputs {
                mark[self.graph.storage_owner(t).index()] = true;
            }
        }
        mark
    }

    /// Whether `u` is resident just before the compute step at `m`, where a
    /// recomputation of `reader` (an op) runs, given the gaps already on `u`.
    pub fn resident_for_recompute(
        &self,
        u: TensorId,
        m: usize,
        gaps: &[Gap],
        reader: OpId,
    ) -> bool {
        let tensor = self.graph.tensor(u);
        if tensor.is_persistent() {
            // The baselines never move persistent tensors.
            return true;
        }
        // A residency period: how it starts (`None`: resident from the iteration
        // start) and the position after which it ends.
        let start_ok = |start: Option<(usize, Restore)>| match start {
            None => true,
            Some((p, Restore::Recompute)) => {
                // Recomputations at one position run in producer order.
                p < m || (p == m && tensor.producer.is_some_and(|q| q < reader))
            }
            // A swap-in (or the production) at `m` itself is not ordered before
            // a recomputation at `m`.
            Some((p, Restore::Swap)) => p < m,
        };
        let mut sorted: Vec<&Gap> = gaps.iter().collect();
        sorted.sort_by_key(|g| g.after);
        let mut start: Option<(usize, Restore)> =
            tensor.producer.map(|p| (self.position(p), Restore::Swap));
        for g in sorted {
            let (Some(a), Some(b)) = (g.after, g.before) else {
                return false;
            };
            if a >= m && start_ok(start) {
                return true;
            }
            start = Some((b, g.how));
        }
        let end = if tensor.is_output {
            usize::MAX
        } else {
            self.uses[u.index()].last().copied().unwrap_or(0)
        };
        end >= m && start_ok(start)
    }

    /// Adds a recompute gap for `t` over its forward-to-backward interval when its
    /// producer may be re-run and every input is resident at the first backward
    /// use; returns whether it did. Decide tensors in production order so that
    /// every input is decided before its readers.
    pub fn try_recompute(&self, t: TensorId, gaps: &mut [Vec<Gap>]) -> bool {
        let tensor = self.graph.tensor(t);
        let Some(producer) = tensor.producer else {
            return false;
        };
        let op = self.graph.op(producer);
        if !op.recomputable || !gaps[t.index()].is_empty() {
            return false;
        }
        let Some((after, before)) = self.forward_backward_gap(t) else {
            return false;
        };
        let inputs_ready = op.inputs.iter().all(|&i| {
            let u = self.graph.storage_owner(i);
            u != t && self.resident_for_recompute(u, before, &gaps[u.index()], producer)
        });
        if !inputs_ready {
            return false;
        }
        gaps[t.index()].push(Gap {
            tensor: t,
            after: Some(after),
            before: Some(before),
            how: Restore::Recompute,
            prefetch_after: None,
            reclaim_before: None,
        });
        true
    }
}

/// When the footprint fits the budget there is nothing to do: the `none` plan.
pub fn fits_as_is(request: &PlanRequest<'_>, name: &str) -> Option<PlanOutcome> {
    let (footprint_bytes, _) = footprint(request.graph);
    (footprint_bytes <= request.budget_bytes).then(|| {
        let info = PlannerInfo {
            name: name.into(),
            seed: None,
            settings: serde_json::json!({
                "note": "the footprint fits the budget: nothing swapped or recomputed",
                "footprint_bytes": footprint_bytes,
            }),
        };
        PlanOutcome::Feasible(Box::new(lower_in_order(
            request.graph,
            info,
            request.budget_bytes,
        )))
    })
}

/// What became of one candidate schedule.
#[derive(Debug)]
pub enum Checked {
    Verified(Box<Plan>),
    /// Verified except for memory: the most bytes it may need.
    OverBudget {
        peak_bytes: u64,
        /// Where the peak falls, in words (see [`describe_peak`]).
        at: String,
    },
    /// The lowering refused it, or verify found something other than memory (a
    /// planner bug; reported rather than panicking).
    Broken(String),
}

/// Lowers a schedule in graph order and verifies it.
pub fn lower_and_verify(request: &PlanRequest<'_>, gaps: Vec<Gap>, info: PlannerInfo) -> Checked {
    let mut schedule = Schedule::in_graph_order(request.graph);
    schedule.gaps = gaps;
    let plan = match lower_schedule(request.graph, &schedule, info, request.budget_bytes) {
        Ok(plan) => plan,
        Err(e) => return Checked::Broken(e.to_string()),
    };
    let violations = verify(&plan, request.graph);
    if violations.is_empty() {
        return Checked::Verified(Box::new(plan));
    }
    let mut peak_bytes = 0;
    let mut peak_at = None;
    for v in &violations {
        match v.kind {
            ViolationKind::OverBudget { bytes, .. } => {
                if bytes > peak_bytes {
                    peak_bytes = bytes;
                    peak_at = v.at;
                }
            }
            _ => {
                return Checked::Broken(format!(
                    "{} verify violations, first: {v}",
                    violations.len()
                ));
            }
        }
    }
    Checked::OverBudget {
        peak_bytes,
        at: describe_peak(request.graph, &plan, peak_at),
    }
}

/// Simulated iteration time, `None` when the simulation fails or runs out of memory.
pub fn simulated_time_s(request: &PlanRequest<'_>, plan: &Plan) -> Option<f64> {
    simulated(request, plan).map(|(time_s, _)| time_s)
}

/// Simulated iteration time and peak live bytes, `None` when the simulation
/// fails or runs out of memory.
pub fn simulated(request: &PlanRequest<'_>, plan: &Plan) -> Option<(f64, u64)> {
    let options = SimOptions {
        iterations: 1,
        ..SimOptions::default()
    };
    let out = simulate(request.graph, plan, request.cost, &options).ok()?;
    out.report
        .oom
        .is_none()
        .then_some((out.report.iter_time_s, out.report.peak_live_bytes))
}

/// One candidate: its settings (recorded in the plan) and its gaps.
#[derive(Debug)]
pub struct Candidate {
    pub settings: serde_json::Value,
    pub gaps: Vec<Gap>,
}

/// Lowers and verifies every candidate, simulates those that verify, and returns
/// the fastest (the first on ties, so the choice is deterministic); otherwise an
/// infeasibility naming the smallest peak any candidate still needs, and where.
pub fn best_of(
    request: &PlanRequest<'_>,
    name: &str,
    what: &str,
    candidates: Vec<Candidate>,
) -> PlanOutcome {
    best_by(request, name, what, candidates, Pick::Fastest)
}

/// Which verified candidate [`best_by`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The least simulated iteration time.
    Fastest,
    /// The least simulated peak of live bytes (then the least time).
    LeastPeak,
}

/// [`best_of`] with a choice of criterion.
pub fn best_by(
    request: &PlanRequest<'_>,
    name: &str,
    what: &str,
    candidates: Vec<Candidate>,
    pick: Pick,
) -> PlanOutcome {
    let n_candidates = candidates.len();
    let mut best: Option<((u64, f64), Box<Plan>)> = None;
    let mut fallback: Option<Box<Plan>> = None;
    let mut least_peak: Option<(u64, String)> = None;
    let mut broken: Option<String> = None;
    for candidate in candidates {
        let info = PlannerInfo {
            name: name.into(),
            seed: None,
            settings: candidate.settings,
        };
        match lower_and_verify(request, candidate.gaps, info) {
            Checked::Verified(plan) => match simulated(request, &plan) {
                Some((time_s, peak_bytes)) => {
                    let key = match pick {
                        Pick::Fastest => (0, time_s),
                        Pick::LeastPeak => (peak_bytes, time_s),
                    };
                    if best.as_ref().is_none_or(|(b, _)| key < *b) {
                        best = Some((key, plan));
                    }
                }
                None => {
                    if fallback.is_none() {
                        fallback = Some(plan);
                    }
                }
            },
            Checked::OverBudget { peak_bytes, at } => {
                if least_peak.as_ref().is_none_or(|(p, _)| peak_bytes < *p) {
                    least_peak = Some((peak_bytes, at));
                }
            }
            Checked::Broken(reason) => {
                if broken.is_none() {
                    broken = Some(reason);
                }
            }
        }
    }
    let chosen = best
        .map(|((_, time_s), plan)| (Some(time_s), plan))
        .or(fallback.map(|plan| (None, plan)));
    if let Some((time_s, mut plan)) = chosen {
        if let serde_json::Value::Object(map) = &mut plan.planner.settings {
            map.insert("candidates_tried".into(), n_candidates.into());
            if let Some(t) = time_s {
                map.insert("simulated_iter_time_s".into(), t.into());
            }
        }
        return PlanOutcome::Feasible(plan);
    }
    let reason = match (least_peak, broken) {
        (Some((peak_bytes, at)), _) => format!(
            "{name}: {what}, the plan still needs {} of device memory but the budget is {} ({} short){at}",
            fmt_bytes(peak_bytes),
            fmt_bytes(request.budget_bytes),
            fmt_bytes(peak_bytes.saturating_sub(request.budget_bytes))
        ),
        (None, Some(reason)) => format!("{name}: no valid plan could be built: {reason}"),
        (None, None) => format!("{name}: no candidate plan to try"),
    };
    PlanOutcome::Infeasible { reason }
}

/// Flattens per-tensor gap lists.
pub fn flatten(gaps: Vec<Vec<Gap>>) -> Vec<Gap> {
    gaps.into_iter().flatten().collect()
}

/// Number of tensors with at least one gap restored by `how`.
pub fn count(gaps: &[Vec<Gap>], how: Restore) -> usize {
    gaps.iter()
        .filter(|g| g.iter().any(|x| x.how == how))
        .count()
}

/// Bytes of the tensors with at least one gap restored by `how`.
pub fn bytes(graph: &Graph, gaps: &[Vec<Gap>], how: Restore) -> u64 {
    gaps.iter()
        .enumerate()
        .filter(|(_, g)| g.iter().any(|x| x.how == how))
        .map(|(i, _)| graph.tensors[i].size_bytes)
        .sum()
}

/// A swap gap over `(after, before)`: the swap-in starts `lead_ops` ops before
/// the use (once the op at `before - lead_ops` has finished), and the op
/// `reclaim_lag_ops` after the last use waits for the offload (clamped to the gap).
pub fn swap_gap(
    t: TensorId,
    after: usize,
    before: usize,
    lead_ops: usize,
    reclaim_lag_ops: usize,
) -> Gap {
    let trigger = before.saturating_sub(lead_ops).max(after);
    let reclaim = (after + reclaim_lag_ops.max(1)).min(before);
    Gap {
        tensor: t,
        after: Some(after),
        before: Some(before),
        how: Restore::Swap,
        prefetch_after: Some(trigger),
        reclaim_before: Some(reclaim),
    }
}

/// What a planner decides for one storage owner between forward and backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Resident from production to its last use (brought back after that only
    /// when a recomputation reads it).
    Keep,
    /// Freed after its last forward use, recomputed when first needed again.
    Recompute,
    /// Offloaded after its last forward use, swapped in when first needed again.
    Swap,
}

/// Per-owner decisions for [`materialise`].
#[derive(Debug, Clone)]
pub struct Decisions {
    pub how: Vec<Decision>,
    /// Extra positions at which a tensor must be resident (before any
    /// recomputation there), e.g. the first backward op of its Chen segment.
    pub anchors: Vec<Vec<usize>>,
}

impl Decisions {
    /// Every tensor kept, no anchors.
    pub fn keep_all(graph: &Graph) -> Self {
        Decisions {
            how: vec![Decision::Keep; graph.tensors.len()],
            anchors: vec![Vec::new(); graph.tensors.len()],
        }
    }

    pub fn set(&mut self, t: TensorId, how: Decision) {
        if let Some(slot) = self.how.get_mut(t.index()) {
            *slot = how;
        }
    }

    pub fn anchor(&mut self, t: TensorId, position: usize) {
        if let Some(list) = self.anchors.get_mut(t.index()) {
            list.push(position);
        }
    }
}

/// Swap timing of the swap gaps [`materialise`] makes (see [`swap_gap`]).
#[derive(Debug, Clone, Copy)]
pub struct SwapTiming {
    pub lead_ops: usize,
    pub reclaim_lag_ops: usize,
}

/// Gaps for a set of decisions, and what it took.
#[derive(Debug, Default)]
pub struct Materialised {
    pub gaps: Vec<Vec<Gap>>,
    /// Tensors decided `Keep` (or never read by backward) brought back only to
    /// feed recomputations.
    pub chain_only: usize,
    /// Recompute gaps, i.e. recomputation steps in the plan.
    pub recompute_steps: usize,
    /// Decided tensors set back to `Keep` because no chain could bring back
    /// what their recomputation reads (an input with no recomputable producer
    /// and no host copy).
    pub relaxed: usize,
}

/// A demand at `position` on `tensor` that nothing can satisfy.
struct Unsatisfiable {
    position: usize,
    /// Per owner: the positions where it was recomputed, up to the failure.
    regen: Vec<Vec<usize>>,
}

/// Turns decisions into gaps, with recomputation chains (see the module docs).
/// Never fails: a decision whose chain cannot be built is relaxed to `Keep`.
///
/// `rebuild` says whether a tensor decided `Keep` may be recomputed when a
/// recomputation reads it after its last use (a dead intermediate of a chain);
/// when it may not, the recomputations that need it are relaxed.
pub fn materialise(
    an: &Analysis<'_>,
    decisions: &Decisions,
    timing: SwapTiming,
    rebuild: &dyn Fn(TensorId) -> bool,
) -> Materialised {
    let mut d = decisions.clone();
    let mut relaxed = 0;
    loop {
        match materialise_once(an, &d, timing, rebuild) {
            Ok(mut m) => {
                m.relaxed = relaxed;
                return m;
            }
            Err(failure) => {
                // Relax the decided recomputations that run at the failing position.
                let mut any = false;
                for (i, positions) in failure.regen.iter().enumerate() {
                    if d.how[i] == Decision::Recompute && positions.contains(&failure.position) {
                        d.how[i] = Decision::Keep;
                        d.anchors[i].clear();
                        relaxed += 1;
                        any = true;
                    }
                }
                if !any {
                    relaxed += d.how.iter().filter(|&&h| h != Decision::Keep).count();
                    d = Decisions::keep_all(an.graph);
                }
            }
        }
    }
}

fn materialise_once(
    an: &Analysis<'_>,
    d: &Decisions,
    timing: SwapTiming,
    rebuild: &dyn Fn(TensorId) -> bool,
) -> Result<Materialised, Unsatisfiable> {
    let g = an.graph;
    let nt = g.tensors.len();
    let output_storage = g.output_storage();
    let mut demands: Vec<Vec<usize>> = d.anchors.clone();
    demands.resize(nt, Vec::new());
    let mut regen: Vec<Vec<usize>> = vec![Vec::new(); nt];
    let mut gaps: Vec<Vec<Gap>> = vec![Vec::new(); nt];
    let mut m = Materialised::default();
    // Consumers before producers, so every demand on a tensor is known when it
    // is decided.
    let mut owners: Vec<(usize, TensorId)> = g
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
        .map(|t| (t.producer.map_or(0, |p| an.position(p) + 1), t.id))
        .collect();
    owners.sort_unstable_by(|a, b| b.cmp(a));
    for (_, u) in owners {
        let tensor = g.tensor(u);
        let ui = u.index();
        let uses = &an.uses[ui];
        let mut dem = std::mem::take(&mut demands[ui]);
        dem.sort_unstable();
        dem.dedup();
        let fail = |position: usize, regen: Vec<Vec<usize>>| Unsatisfiable { position, regen };
        let producer = tensor.producer;
        let recomputable = producer.is_some_and(|p| g.op(p).recomputable);
        let never_freed = output_storage.get(ui).copied().unwrap_or(false);
        let Some(&last_use) = uses.last() else {
            if let Some(&p) = dem.first() {
                return Err(fail(p, regen));
            }
            continue;
        };
        let last_use = if never_freed { usize::MAX } else { last_use };
        // How it comes back when it is gone: by its decision, or for a kept
        // tensor needed after its last use, whichever works.
        let decided = d.how.get(ui).copied().unwrap_or(Decision::Keep);
        let dropped = match decided {
            Decision::Recompute if recomputable => Some(Restore::Recompute),
            Decision::Swap => Some(Restore::Swap),
            _ => None,
        };
        let backward_uses = uses.iter().copied().filter(|&p| p >= an.backward_start);
        let mut spans: Vec<(usize, usize, Restore)> = Vec::new();
        let dropped_from = dropped.and_then(|how| {
            if never_freed {
                return None;
            }
            let lf = an.last_forward_use(u)?;
            let mut q: Vec<usize> = backward_uses.chain(dem.iter().copied()).collect();
            q.sort_unstable();
            q.dedup();
            let &q1 = q.first()?;
            (q1 > lf).then_some((lf, q1, how, q))
        });
        match dropped_from {
            Some((lf, q1, how, q)) => {
                // Back at q1; it stays from a use or an anchor on, but leaves
                // again after a position where it only fed recomputations, and
                // after its last use.
                spans.push((lf, q1, how));
                let anchors = d.anchors.get(ui).map_or(&[][..], |a| &a[..]);
                let stays = |p: usize| uses.binary_search(&p).is_ok() || anchors.contains(&p);
                let mut came_back = true;
                for w in q.windows(2) {
                    let (p, next) = (w[0], w[1]);
                    if (came_back && !stays(p)) || p >= last_use {
                        spans.push((p, next, how));
                        came_back = true;
                    } else {
                        came_back = false;
                    }
                }
            }
            None => {
                let made_at = producer.map(|p| an.position(p));
                let mut prev = last_use;
                for &p in &dem {
                    if made_at.is_some_and(|a| p <= a) {
                        return Err(fail(p, regen));
                    }
                    if p <= prev {
                        continue;
                    }
                    let how = if recomputable && rebuild(u) {
                        Restore::Recompute
                    } else if producer.is_none() {
                        // The input batch: its host copy is current.
                        Restore::Swap
                    } else {
                        return Err(fail(p, regen));
                    };
                    spans.push((prev, p, how));
                    prev = p;
                }
                if !spans.is_empty() {
                    m.chain_only += 1;
                }
            }
        }
        for (after, before, how) in spans {
            match how {
                Restore::Recompute => {
                    gaps[ui].push(Gap {
                        tensor: u,
                        after: Some(after),
                        before: Some(before),
                        how,
                        prefetch_after: None,
                        reclaim_before: None,
                    });
                    regen[ui].push(before);
                    m.recompute_steps += 1;
                }
                Restore::Swap => gaps[ui].push(swap_gap(
                    u,
                    after,
                    before,
                    timing.lead_ops,
                    timing.reclaim_lag_ops,
                )),
            }
        }
        if regen[ui].is_empty() {
            continue;
        }
        let Some(op) = producer.map(|p| g.op(p)) else {
            continue;
        };
        for &i in &op.inputs {
            let v = g.storage_owner(i);
            if g.tensor(v).is_persistent() {
                continue;
            }
            if v == u {
                let p = regen[ui].first().copied().unwrap_or(0);
                return Err(fail(p, regen));
            }
            let positions = regen[ui].clone();
            demands[v.index()].extend(positions);
        }
    }
    m.gaps = gaps;
    Ok(m)
}

/// Where a plan's peak falls, in words: the step and, for an op, the bytes it
/// touches itself (its inputs, outputs and workspace).
pub fn describe_peak(graph: &Graph, plan: &Plan, at: Option<outcore_plan::StepRef>) -> String {
    let Some(step) = at.and_then(|a| plan.step(a)) else {
        return String::new();
    };
    let op = match &step.instr {
        Instr::Compute(op) | Instr::Recompute { op, .. } => *op,
        Instr::SwapIn(t) | Instr::SwapOut(t) | Instr::Free(t) => {
            let what = match step.instr {
                Instr::SwapIn(_) => "the swap-in of",
                Instr::SwapOut(_) => "the swap-out of",
                _ => "the free of",
            };
            return match graph.tensors.get(t.index()) {
                Some(tensor) => format!(
                    " (peak at {what} `{}` ({}), with everything the ops around it hold)",
                    tensor.name,
                    fmt_bytes(tensor.size_bytes)
                ),
                None => String::new(),
            };
        }
    };
    if op.index() >= graph.ops.len() {
        return String::new();
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
    format!(
        " (peak at {what} `{}` ({}), whose own inputs, outputs and workspace take {})",
        op.name,
        op.kind.label(),
        fmt_bytes(own)
    )
}
