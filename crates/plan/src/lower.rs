//! Shared analyses for planners: next-use tables and the in-order lowering that
//! every "compute in graph order, free after last use" plan starts from.

use crate::plan::{Instr, Plan, PlannerInfo, Stream};
use outcore_graph::{Graph, OpId, TensorId};

/// For every storage owner, the op positions (graph order) that touch it: reads
/// through any view, its production, and in-place writes.
pub fn uses_by_owner(graph: &Graph) -> Vec<Vec<OpId>> {
    let mut uses: Vec<Vec<OpId>> = vec![Vec::new(); graph.tensors.len()];
    for op in &graph.ops {
        for &t in op.inputs.iter().chain(&op.outputs) {
            let owner = graph.storage_owner(t);
            let list = &mut uses[owner.index()];
            if list.last() != Some(&op.id) {
                list.push(op.id);
            }
        }
    }
    uses
}

/// Storage owners whose last use is at each op (non-persistent, not step outputs,
/// which are freed at the end of the iteration instead).
pub fn frees_after_op(graph: &Graph) -> Vec<Vec<TensorId>> {
    let uses = uses_by_owner(graph);
    let mut frees: Vec<Vec<TensorId>> = vec![Vec::new(); graph.ops.len()];
    for t in graph
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
    {
        if t.is_output {
            continue;
        }
        if let Some(&last) = uses[t.id.index()].last() {
            frees[last.index()].push(t.id);
        }
    }
    frees
}

/// Non-persistent tensors that must be freed at the very end of the iteration
/// (step outputs such as the loss, and inputs nothing reads).
pub fn frees_at_end(graph: &Graph) -> Vec<TensorId> {
    let uses = uses_by_owner(graph);
    let output_storage = graph.output_storage();
    graph
        .tensors
        .iter()
        .filter(|t| t.allocates() && !t.is_persistent())
        .filter(|t| output_storage[t.id.index()] || uses[t.id.index()].is_empty())
        .map(|t| t.id)
        .collect()
}

/// The plan that runs every op in graph order on the compute stream and frees each
/// tensor right after its last use: no swapping, no recomputation. Its peak is the
/// graph's footprint.
pub fn lower_in_order(graph: &Graph, planner: PlannerInfo, budget_bytes: u64) -> Plan {
    let mut plan = Plan::new(graph, planner, budget_bytes);
    let frees = frees_after_op(graph);
    for op in &graph.ops {
        plan.push(Stream::Compute, Instr::Compute(op.id), Vec::new());
        for &t in &frees[op.id.index()] {
            plan.push(Stream::Compute, Instr::Free(t), Vec::new());
        }
    }
    for t in frees_at_end(graph) {
        plan.push(Stream::Compute, Instr::Free(t), Vec::new());
    }
    plan
}
