//! The one planning context: everything the planners derive from a graph, a
//! cost model and a compute order, indexed by position in that order (never by
//! op index, so every analysis works on a reordered schedule).

use outcore_cost::CostModel;
use outcore_graph::{Graph, Op, OpId, Phase, TensorId, TensorKind};
use outcore_plan::{
    Gap, PlanRequest, PlannerError, PlannerErrorKind, Residency, Schedule, check_order,
    use_positions,
};

/// Facts about a graph in one compute order.
#[derive(Debug)]
pub struct Ctx<'g> {
    pub graph: &'g Graph,
    /// The compute order: `order[position]` is an op.
    pub order: Vec<OpId>,
    /// `position_of[op.index()]`: where the op runs in `order`.
    pub position_of: Vec<usize>,
    /// Number of ops (positions).
    pub n: usize,
    /// Per storage owner: ascending positions that read, produce or update it
    /// (empty for non-owners).
    pub uses: Vec<Vec<usize>>,
    /// Storage owners each position touches, deduplicated, in operand order.
    pub owners_at: Vec<Vec<TensorId>>,
    /// Compute time of each position under the cost model.
    pub op_time_s: Vec<f64>,
    /// `prefix_time_s[i]`: total compute time of positions `0..i`.
    pub prefix_time_s: Vec<f64>,
    /// Per storage owner: positions that write it in place (through an update tensor).
    pub writes: Vec<Vec<usize>>,
    /// Where backward starts (see [`backward_start`]). Uses are "forward" or
    /// "backward" by position, not by phase: in a reordered schedule a forward
    /// op placed after it counts as a backward use.
    pub backward_start: usize,
}

impl<'g> Ctx<'g> {
    /// The context for a request, on its order (the graph's when `None`). A
    /// bad order is [`PlannerErrorKind::InvalidRequest`].
    pub fn for_request(request: &PlanRequest<'g>, planner: &str) -> Result<Self, PlannerError> {
        let order = match request.order {
            Some(order) => {
                check_order(request.graph, order).map_err(|e| {
                    PlannerError::new(
                        planner,
                        PlannerErrorKind::InvalidRequest,
                        format!("{}; pass a topological order of the graph's ops", e.reason),
                    )
                })?;
                order.to_vec()
            }
            None => graph_order(request.graph),
        };
        Ok(Ctx::new(request.graph, request.cost, order))
    }

    /// The context in the graph's own order.
    pub fn in_graph_order(graph: &'g Graph, cost: &dyn CostModel) -> Self {
        Ctx::new(graph, cost, graph_order(graph))
    }

    /// The context for `order`, which the caller has checked (a valid
    /// topological order of `graph`).
    pub fn new(graph: &'g Graph, cost: &dyn CostModel, order: Vec<OpId>) -> Self {
        let n = order.len();
        let uses = use_positions(graph, &order);
        let mut position_of = vec![0usize; graph.ops.len()];
        let mut owners_at: Vec<Vec<TensorId>> = vec![Vec::new(); n];
        let mut writes: Vec<Vec<usize>> = vec![Vec::new(); graph.tensors.len()];
        let mut op_time_s = Vec::with_capacity(n);
        for (pos, &id) in order.iter().enumerate() {
            position_of[id.index()] = pos;
            let op = graph.op(id);
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
            op_time_s.push(cost.op_time_s(graph, id).max(0.0));
        }
        let mut prefix_time_s = Vec::with_capacity(n + 1);
        let mut acc = 0.0;
        prefix_time_s.push(acc);
        for &t in &op_time_s {
            acc += t;
            prefix_time_s.push(acc);
        }
        let backward_start = backward_start(graph, &order);
        Ctx {
            graph,
            order,
            position_of,
            n,
            uses,
            owners_at,
            op_time_s,
            prefix_time_s,
            writes,
            backward_start,
        }
    }

    /// Position of an op in the order.
    pub fn position(&self, op: OpId) -> usize {
        self.position_of[op.index()]
    }

    /// The op at a position.
    pub fn op_at(&self, position: usize) -> &'g Op {
        self.graph.op(self.order[position])
    }

    /// Compute time of positions `lo..hi` (empty when `hi <= lo`).
    pub fn time_s(&self, lo: usize, hi: usize) -> f64 {
        if hi <= lo {
            return 0.0;
        }
        self.prefix_time_s[hi.min(self.n)] - self.prefix_time_s[lo.min(self.n)]
    }

    /// How many of the positions `0..to` have ended by `time_s`, on the
    /// order's compute times without stalls; the last of them (that count
    /// minus one) is the position a copy starting at `time_s` follows.
    pub fn ending_by(&self, to: usize, time_s: f64) -> usize {
        self.prefix_time_s[1..=to].partition_point(|&e| e <= time_s)
    }

    /// The first position of `from..limit` whose op starts at or after
    /// `time_s` (compute times without stalls, which only grow).
    pub fn first_starting_from(&self, from: usize, limit: usize, time_s: f64) -> Option<usize> {
        if from >= limit {
            return None;
        }
        let p = from + self.prefix_time_s[from..limit].partition_point(|&s| s < time_s);
        (p < limit).then_some(p)
    }

    pub fn size(&self, t: TensorId) -> u64 {
        self.graph.tensor(t).size_bytes
    }

    pub fn persistent(&self, t: TensorId) -> bool {
        self.graph.tensor(t).is_persistent()
    }

    /// The compute time of `t`'s producer (what recomputing `t` costs, its
    /// inputs at hand); `None` for a tensor no op makes.
    pub fn producer_time_s(&self, t: TensorId) -> Option<f64> {
        let op = self.graph.tensor(t).producer?;
        Some(self.op_time_s[self.position(op)])
    }

    /// The storage owners `t`'s producer reads (none for a tensor no op
    /// makes): what a recomputation of `t` needs on the device.
    pub fn producer_inputs(&self, t: TensorId) -> impl Iterator<Item = TensorId> + '_ {
        let g = self.graph;
        g.tensor(t)
            .producer
            .into_iter()
            .flat_map(move |op| g.op(op).inputs.iter().map(move |&i| g.storage_owner(i)))
    }

    /// Whether gap `g` ends after its tensor's last use: it brings the tensor
    /// back only to feed the recomputations there (a chain link).
    pub fn chain_link(&self, g: &Gap) -> bool {
        g.before
            .is_some_and(|b| self.uses[g.tensor.index()].last().is_none_or(|&l| l < b))
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

    /// Storage owners of the inputs of forward ops that satisfy `pick`.
    pub fn forward_inputs_where(&self, pick: impl Fn(&Op) -> bool) -> Vec<bool> {
        let mut mark = vec![false; self.graph.tensors.len()];
        for op in self.graph.ops_in_phase(Phase::Forward).filter(|o| pick(o)) {
            for &t in &op.inputs {
                mark[self.graph.storage_owner(t).index()] = true;
            }
        }
        mark
    }

    /// The schedule of a set of gaps on this order: persistent tensors with a
    /// gap from the iteration start begin on the host.
    pub fn schedule(&self, gaps: Vec<Gap>) -> Schedule {
        Schedule {
            order: self.order.clone(),
            initial_residency: initial_residency(&gaps),
            gaps,
        }
    }
}

/// The position of the first non-forward op that depends, directly or
/// through other ops, on a forward op (`order.len()` if none). Non-forward ops
/// that depend on nothing forward (e.g. the seed of the loss gradient) may run
/// anywhere in a valid order; counting them would let backward "start" at
/// position 0 in a random order and leave nothing to offload.
pub fn backward_start(graph: &Graph, order: &[OpId]) -> usize {
    let mut downstream = vec![false; graph.ops.len()];
    for (pos, &id) in order.iter().enumerate() {
        let op = graph.op(id);
        let forward = op.phase == Phase::Forward;
        let depends = op.inputs.iter().any(|&t| {
            graph
                .tensor(t)
                .producer
                .is_some_and(|p| downstream[p.index()])
        });
        if !forward && depends {
            return pos;
        }
        downstream[id.index()] = forward || depends;
    }
    order.len()
}

/// The graph's own order.
pub fn graph_order(graph: &Graph) -> Vec<OpId> {
    graph.ops.iter().map(|o| o.id).collect()
}

/// The eager-update order ([`outcore_plan::eager_update_order`]) when the
/// request plans in the graph's own order (an order given by the caller is
/// kept) and the two differ; the planners that seed with it call this.
pub fn eager_order_if_other(request: &PlanRequest<'_>) -> Option<Vec<OpId>> {
    if request.order.is_some() {
        return None;
    }
    let eager = outcore_plan::eager_update_order(request.graph);
    let graph_order = eager.iter().enumerate().all(|(i, op)| op.index() == i);
    (!graph_order).then_some(eager)
}

/// Initial residency implied by the gaps: persistent tensors with a gap from the
/// iteration start begin on the host.
pub fn initial_residency(gaps: &[Gap]) -> Vec<(TensorId, Residency)> {
    let mut out: Vec<(TensorId, Residency)> = gaps
        .iter()
        .filter(|g| g.after.is_none())
        .map(|g| (g.tensor, Residency::Host))
        .collect();
    out.sort_by_key(|e| e.0);
    out.dedup_by_key(|e| e.0);
    out
}
