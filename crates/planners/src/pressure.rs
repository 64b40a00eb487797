//! Shared machinery of the swap/recompute planners: use positions, a conservative
//! live-bytes model of a `Schedule`, and the lower-verify-simulate finish with a
//! tightening margin when verify's accounting is stricter than the model.

use outcore_cost::CostModel;
use outcore_graph::{Graph, TensorId};
use outcore_plan::{
    Gap, Plan, PlanOutcome, PlanRequest, PlannerInfo, Residency, Restore, Schedule, fmt_bytes,
    lower_in_order, lower_schedule, use_positions, verify,
};
use outcore_sim::{SimOptions, simulate};

/// Facts about the graph in its own order that every planner here needs.
pub(crate) struct Ctx<'g> {
    pub graph: &'g Graph,
    /// Number of ops (positions).
    pub n: usize,
    /// Use positions per storage owner (empty for non-owners).
    pub uses: Vec<Vec<usize>>,
    /// Storage owners each position touches, deduplicated, in operand order.
    pub owners_at: Vec<Vec<TensorId>>,
    /// Compute time of each position under the cost model.
    pub op_time_s: Vec<f64>,
    /// `prefix_time_s[i]`: total compute time of positions `0..i`.
    pub prefix_time_s: Vec<f64>,
    /// Positions that write each owner in place (through an update tensor).
    pub writes: Vec<Vec<usize>>,
}

impl<'g> Ctx<'g> {
    pub fn new(graph: &'g Graph, cost: &dyn CostModel) -> Self {
        let order: Vec<_> = graph.ops.iter().map(|o| o.id).collect();
        let uses = use_positions(graph, &order);
        let n = order.len();
        let mut owners_at: Vec<Vec<TensorId>> = vec![Vec::new(); n];
        let mut writes: Vec<Vec<usize>> = vec![Vec::new(); graph.tensors.len()];
        for (pos, op) in graph.ops.iter().enumerate() {
            for &t in op.inputs.iter().chain(&op.outputs) {
                let owner = graph.storage_owner(t);
                if !owners_at[pos].contains(&owner) {
                    owners_at[pos].push(owner);
                }
            }
            for &t in &op.outputs {
                if graph.tensor(t).inplace_update_of.is_some() {
                    writes[graph.storage_owner(t).index()].push(pos);
                }
            }
        }
        let op_time_s: Vec<f64> = graph
            .ops
            .iter()
            .map(|o| cost.op_time_s(graph, o.id).max(0.0))
            .collect();
        let mut prefix_time_s = Vec::with_capacity(n + 1);
        let mut acc = 0.0;
        prefix_time_s.push(acc);
        for &t in &op_time_s {
            acc += t;
            prefix_time_s.push(acc);
        }
        Ctx {
            graph,
            n,
            uses,
            owners_at,
            op_time_s,
            prefix_time_s,
            writes,
        }
    }

    /// Compute time of positions `lo..hi` (empty when `hi <= lo`).
    pub fn time_s(&self, lo: usize, hi: usize) -> f64 {
        if hi <= lo {
            return 0.0;
        }
        self.prefix_time_s[hi.min(self.n)] - self.prefix_time_s[lo.min(self.n)]
    }

    pub fn size(&self, t: TensorId) -> u64 {
        self.graph.tensor(t).size_bytes
    }

    pub fn persistent(&self, t: TensorId) -> bool {
        self.graph.tensor(t).is_persistent()
    }

    /// Storage owners, in tensor order.
    pub fn owners(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.graph
            .tensors
            .iter()
            .filter(|t| t.allocates())
            .map(|t| t.id)
    }

    /// The positions `[first, last]` at which an owner occupies memory when
    /// nothing is swapped (as `footprint` counts it).
    pub fn base_interval(&self, t: TensorId) -> (usize, usize) {
        let tensor = self.graph.tensor(t);
        let uses = &self.uses[t.index()];
        let last_pos = self.n.saturating_sub(1);
        let first = if tensor.producer.is_some() {
            uses.first().copied().unwrap_or(0)
        } else {
            0
        };
        let to_end = tensor.is_persistent() || tensor.is_output || uses.is_empty();
        let last = if to_end {
            last_pos
        } else {
            uses.last().copied().unwrap_or(last_pos)
        };
        (first, last.max(first))
    }

    /// The previous and next use around `q` (exclusive), if any.
    pub fn neighbours(&self, t: TensorId, q: usize) -> (Option<usize>, Option<usize>) {
        let uses = &self.uses[t.index()];
        let idx = uses.partition_point(|&u| u < q);
        let prev = if idx > 0 { Some(uses[idx - 1]) } else { None };
        let next_idx = if uses.get(idx) == Some(&q) {
            idx + 1
        } else {
            idx
        };
        (prev, uses.get(next_idx).copied())
    }
}

/// The positions `[lo, hi]` at which a gap's tensor is surely off the device in
/// verify's accounting, given the position its free is ordered before (`freed_by`).
/// Swap: from `freed_by` up to the prefetch trigger; recompute: strictly inside.
pub(crate) fn absent_range(
    ctx: &Ctx<'_>,
    gap: &Gap,
    freed_by: Option<usize>,
) -> Option<(usize, usize)> {
    let last_pos = ctx.n.checked_sub(1)?;
    match gap.how {
        Restore::Recompute => {
            let (a, b) = (gap.after?, gap.before?);
            (b > a + 1).then_some((a + 1, b - 1))
        }
        Restore::Swap => {
            let lo = match gap.after {
                None => 0,
                Some(_) => freed_by?,
            };
            let hi = match gap.before {
                None => last_pos,
                // Resident again once the trigger op has finished.
                Some(_) => gap.prefetch_after?,
            };
            (lo <= hi).then_some((lo, hi))
        }
    }
}

/// Scratch bytes a recomputation needs for its producer's other outputs.
pub(crate) fn recompute_scratch_bytes(ctx: &Ctx<'_>, t: TensorId) -> u64 {
    let Some(p) = ctx.graph.tensor(t).producer else {
        return 0;
    };
    ctx.graph
        .op(p)
        .outputs
        .iter()
        .filter(|&&o| o != t && ctx.graph.tensor(o).allocates())
        .map(|&o| ctx.size(o))
        .sum()
}

/// Live bytes per position under a set of gaps, with each swap gap's free
/// ordered before the compute op named by its own `reclaim_before` (a model;
/// verify is the judge).
pub(crate) fn live_bytes(ctx: &Ctx<'_>, gaps: &[Gap]) -> Vec<i128> {
    let n = ctx.n;
    let mut delta = vec![0i128; n + 1];
    for t in ctx.owners() {
        let (lo, hi) = ctx.base_interval(t);
        delta[lo] += ctx.size(t) as i128;
        delta[hi + 1] -= ctx.size(t) as i128;
    }
    for g in gaps {
        let size = ctx.size(g.tensor) as i128;
        if let Some((lo, hi)) = absent_range(ctx, g, g.reclaim_before) {
            delta[lo] -= size;
            delta[hi + 1] += size;
        }
        if g.how == Restore::Recompute
            && let Some(b) = g.before
        {
            let scratch = recompute_scratch_bytes(ctx, g.tensor) as i128;
            delta[b] += scratch;
            delta[b + 1] -= scratch;
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut cur = 0i128;
    for d in delta.iter().take(n) {
        cur += d;
        out.push(cur);
    }
    out
}

/// Initial residency implied by the gaps: persistent tensors with a gap from the
/// iteration start begin on the host.
pub(crate) fn initial_residency(gaps: &[Gap]) -> Vec<(TensorId, Residency)> {
    let mut out: Vec<(TensorId, Residency)> = gaps
        .iter()
        .filter(|g| g.after.is_none())
        .map(|g| (g.tensor, Residency::Host))
        .collect();
    out.sort_by_key(|e| e.0);
    out.dedup_by_key(|e| e.0);
    out
}

/// A checked plan and its simulated timing.
pub(crate) struct Checked {
    pub plan: Plan,
    pub iter_time_s: f64,
    pub throughput_vs_ideal: f64,
}

/// Lowers, verifies and simulates a set of gaps; `Err` carries the first problem.
pub(crate) fn check(
    request: &PlanRequest<'_>,
    gaps: Vec<Gap>,
    info: PlannerInfo,
) -> Result<Checked, String> {
    let graph = request.graph;
    let mut schedule = Schedule::in_graph_order(graph);
    schedule.initial_residency = initial_residency(&gaps);
    schedule.gaps = gaps;
    let plan =
        lower_schedule(graph, &schedule, info, request.budget_bytes).map_err(|e| e.to_string())?;
    if let Some(v) = verify(&plan, graph).first() {
        return Err(v.to_string());
    }
    simulated(request, plan)
}

/// Simulates a verified plan.
pub(crate) fn simulated(request: &PlanRequest<'_>, plan: Plan) -> Result<Checked, String> {
    let out = simulate(request.graph, &plan, request.cost, &SimOptions::default())
        .map_err(|e| e.to_string())?;
    if let Some(oom) = &out.report.oom {
        return Err(format!("simulation ran out of memory: {}", oom.message));
    }
    Ok(Checked {
        plan,
        iter_time_s: out.report.iter_time_s,
        throughput_vs_ideal: out.report.throughput_vs_ideal,
    })
}

/// The `none` plan under this planner's name when the footprint already fits:
/// nothing to swap, so the plan equals `none`'s.
pub(crate) fn fits_without_swapping(request: &PlanRequest<'_>, name: &str) -> Option<PlanOutcome> {
    let (footprint_bytes, _) = outcore_graph::footprint(request.graph);
    (footprint_bytes <= request.budget_bytes).then(|| {
        let info = PlannerInfo {
            name: name.into(),
            seed: None,
            settings: serde_json::json!({ "note": "footprint fits the budget: nothing swapped" }),
        };
        PlanOutcome::Feasible(Box::new(lower_in_order(
            request.graph,
            info,
            request.budget_bytes,
        )))
    })
}

/// Fractions of the budget the planners plan against, tightest last: verify also
/// counts copies that overlap compute and frees not yet ordered, which the live
/// model only approximates.
pub(crate) const MARGINS: [f64; 6] = [1.0, 0.95, 0.9, 0.8, 0.65, 0.5];

/// The internal budget for a margin.
pub(crate) fn margin_budget(budget_bytes: u64, margin: f64) -> u64 {
    (budget_bytes as f64 * margin) as u64
}

/// The Infeasible outcome with a reason naming the budget.
pub(crate) fn infeasible(request: &PlanRequest<'_>, why: &str) -> PlanOutcome {
    PlanOutcome::Infeasible {
        reason: format!(
            "no verified plan within {} (footprint {}): {why}",
            fmt_bytes(request.budget_bytes),
            fmt_bytes(outcore_graph::footprint(request.graph).0)
        ),
    }
}

/// Positions that an on-demand planner must keep an owner resident at (inputs of
/// a recomputation placed there).
pub(crate) fn pinned_inside(
    pins: &[usize],
    after: Option<usize>,
    before: Option<usize>,
    n: usize,
) -> bool {
    let lo = after.map_or(0, |a| a + 1);
    let hi = before.unwrap_or(n);
    pins.iter().any(|&p| p >= lo && p < hi)
}

/// Small hand graphs and a cost model for the planners' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use outcore_cost::{DeviceProfile, RooflineModel};
    use outcore_graph::DType;
    use outcore_graph::Graph;
    use outcore_graph::builder::{GraphBuilder, Optimizer};

    /// A chain of `layers` linear + relu layers of width `width` on batch `batch`,
    /// trained without an optimizer (so only activations and gradients move).
    pub fn mlp_chain(layers: usize, width: u64, batch: u64) -> Graph {
        let mut b = GraphBuilder::new("hand-mlp", batch, DType::Float32);
        let mut x = b.input("x", &[batch, width]);
        for i in 0..layers {
            let y = b.linear(&format!("fc{i}"), x, width, false);
            x = b.relu(y);
        }
        let labels = b.label("labels", &[batch]);
        let loss = b.softmax_cross_entropy(x, labels);
        match b.finish(loss, Optimizer::None) {
            Ok(g) => g,
            Err(e) => panic!("hand graph: {e}"),
        }
    }

    pub fn v100() -> RooflineModel {
        match DeviceProfile::builtin("v100-16gb-pcie3") {
            Ok(d) => RooflineModel::new(d),
            Err(e) => panic!("builtin device: {e}"),
        }
    }
}
