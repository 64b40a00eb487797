//! Helpers shared by the integration tests of outcore-plan.

use outcore_graph::{Graph, TensorKind};
use outcore_plan::{Gap, PlannerInfo, Restore, Schedule, use_positions};

pub fn info() -> PlannerInfo {
    PlannerInfo {
        name: "test".into(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

/// Swap every activation whose uses are more than `min_distance` positions apart.
pub fn swap_everything(g: &Graph, min_distance: usize) -> Schedule {
    let mut s = Schedule::in_graph_order(g);
    let uses = use_positions(g, &s.order);
    for t in g
        .tensors
        .iter()
        .filter(|t| t.allocates() && t.kind == TensorKind::Activation)
    {
        for w in uses[t.id.index()].windows(2) {
            let (a, b) = (w[0], w[1]);
            if b - a > min_distance {
                s.gaps.push(Gap {
                    tensor: t.id,
                    after: Some(a),
                    before: Some(b),
                    how: Restore::Swap,
                    prefetch_after: Some(b - 1),
                    reclaim_before: Some(a + 1),
                    copy_out_after: None,
                });
            }
        }
    }
    s
}
