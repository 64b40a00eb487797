//! Shared helpers of the executor's integration tests.

use outcore_exec::test_plans;
use outcore_graph::Graph;
use outcore_plan::{Plan, verify};
use std::collections::BTreeMap;

#[allow(dead_code)]
pub fn model(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    outcore_graph::zoo::build(name, Some(batch), &knobs, None).expect("zoo model builds")
}

/// Footprint of the in-order plan (its verified peak).
#[allow(dead_code)]
pub fn footprint_bytes(graph: &Graph) -> u64 {
    let plan = test_plans::in_order_plan(graph, 0);
    test_plans::verified_peak_bytes(&plan, graph).expect("in-order plan is valid")
}

/// The in-order plan at its footprint plus slack, verified.
#[allow(dead_code)]
pub fn in_order(graph: &Graph) -> Plan {
    let mut plan = test_plans::in_order_plan(graph, 0);
    test_plans::fit_budget(&mut plan, graph, 0.05).expect("in-order plan verifies");
    plan
}

#[allow(dead_code)]
pub fn assert_verified(plan: &Plan, graph: &Graph) {
    let v = verify(plan, graph);
    assert!(
        v.is_empty(),
        "plan does not verify: {:?}",
        v.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    );
}
