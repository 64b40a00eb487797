//! Shared machinery of the baseline planners (vDNN, checkpointing, SuperNeurons,
//! LMS): which tensors backward keeps from forward, when a recomputation can read
//! its inputs under the shared lowering, and the lower -> verify -> simulate
//! pipeline that turns candidate schedules into a plan or an infeasibility reason.
//!
//! A limit of the shared lowering shapes every recompute decision here: a gap must
//! end at a position that uses the tensor, and a `Recompute` step waits for no
//! swap-in. So a tensor can be rematerialised only from inputs that are already
//! resident just before its first backward use (one hop); chains through
//! intermediates that backward never reads cannot be expressed.

use outcore_graph::{Graph, OpId, Phase, TensorId, TensorKind, footprint};
use outcore_plan::{
    Gap, Plan, PlanOutcome, PlanRequest, PlannerInfo, Restore, Schedule, ViolationKind, fmt_bytes,
    lower_in_order, lower_schedule, use_positions, verify,
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
    for v in &violations {
        match v.kind {
            ViolationKind::OverBudget { bytes, .. } => peak_bytes = peak_bytes.max(bytes),
            _ => {
                return Checked::Broken(format!(
                    "{} verify violations, first: {v}",
                    violations.len()
                ));
            }
        }
    }
    Checked::OverBudget { peak_bytes }
}

/// Simulated iteration time, `None` when the simulation fails or runs out of memory.
pub fn simulated_time_s(request: &PlanRequest<'_>, plan: &Plan) -> Option<f64> {
    let options = SimOptions {
        iterations: 1,
        ..SimOptions::default()
    };
    let out = simulate(request.graph, plan, request.cost, &options).ok()?;
    out.report.oom.is_none().then_some(out.report.iter_time_s)
}

/// One candidate: its settings (recorded in the plan) and its gaps.
#[derive(Debug)]
pub struct Candidate {
    pub settings: serde_json::Value,
    pub gaps: Vec<Gap>,
}

/// Lowers and verifies every candidate, simulates those that verify, and returns
/// the fastest (the first on ties, so the choice is deterministic); otherwise an
/// infeasibility naming the smallest peak any candidate still needs.
pub fn best_of(
    request: &PlanRequest<'_>,
    name: &str,
    what: &str,
    candidates: Vec<Candidate>,
) -> PlanOutcome {
    let n_candidates = candidates.len();
    let mut best: Option<(f64, Box<Plan>)> = None;
    let mut fallback: Option<Box<Plan>> = None;
    let mut least_peak_bytes: Option<u64> = None;
    let mut broken: Option<String> = None;
    for candidate in candidates {
        let info = PlannerInfo {
            name: name.into(),
            seed: None,
            settings: candidate.settings,
        };
        match lower_and_verify(request, candidate.gaps, info) {
            Checked::Verified(plan) => match simulated_time_s(request, &plan) {
                Some(time_s) if best.as_ref().is_none_or(|(b, _)| time_s < *b) => {
                    best = Some((time_s, plan));
                }
                Some(_) => {}
                None => {
                    if fallback.is_none() {
                        fallback = Some(plan);
                    }
                }
            },
            Checked::OverBudget { peak_bytes } => {
                least_peak_bytes =
                    Some(least_peak_bytes.map_or(peak_bytes, |p: u64| p.min(peak_bytes)));
            }
            Checked::Broken(reason) => {
                if broken.is_none() {
                    broken = Some(reason);
                }
            }
        }
    }
    let chosen = best
        .map(|(time_s, plan)| (Some(time_s), plan))
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
    let reason = match (least_peak_bytes, broken) {
        (Some(peak_bytes), _) => format!(
            "{name}: {what}, the plan still needs {} of device memory but the budget is {} ({} short)",
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
