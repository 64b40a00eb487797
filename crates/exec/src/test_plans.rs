//! Plans that swap or recompute, derived from the in-order lowering, for testing the
//! executor until the real planners land. They are simple, verified by the callers
//! with `outcore_plan::verify`, and not meant to be good.

use outcore_graph::{Graph, OpId, Phase, TensorId, TensorKind};
use outcore_plan::{
    Instr, Plan, PlannerInfo, StepRef, Stream, ViolationKind, frees_after_op, frees_at_end,
    lower_in_order, uses_by_owner, verify,
};

/// A tensor saved for backward: its last forward use and first later use.
#[derive(Debug, Clone, Copy)]
struct Saved {
    tensor: TensorId,
    last_fwd: usize,
    first_bwd: usize,
}

/// Non-persistent storage owners (activations and inputs) used in forward and again
/// at least `min_gap_ops` ops later.
fn saved_tensors(graph: &Graph, min_gap_ops: usize) -> Vec<Saved> {
    let uses = uses_by_owner(graph);
    let mut out = Vec::new();
    for t in &graph.tensors {
        if !t.allocates()
            || t.is_persistent()
            || !matches!(t.kind, TensorKind::Activation | TensorKind::Input)
        {
            continue;
        }
        let u = &uses[t.id.index()];
        let Some(last_fwd) = u
            .iter()
            .filter(|o| graph.op(**o).phase == Phase::Forward)
            .map(|o| o.index())
            .max()
        else {
            continue;
        };
        let Some(first_bwd) = u.iter().map(|o| o.index()).find(|&o| o > last_fwd) else {
            continue;
        };
        if first_bwd >= last_fwd + min_gap_ops.max(3) {
            out.push(Saved {
                tensor: t.id,
                last_fwd,
                first_bwd,
            });
        }
    }
    out
}

fn info(name: &str) -> PlannerInfo {
    PlannerInfo {
        name: name.to_string(),
        seed: None,
        settings: serde_json::Value::Null,
    }
}

/// Compute-stream index of each op's `Compute` step in the in-order layout.
fn compute_positions(graph: &Graph) -> Vec<u32> {
    let frees = frees_after_op(graph);
    let mut pos = Vec::with_capacity(graph.ops.len());
    let mut i = 0u32;
    for op in &graph.ops {
        pos.push(i);
        i += 1 + frees[op.id.index()].len() as u32;
    }
    pos
}

/// The in-order plan with every saved activation swapped out after its last forward
/// use (d2h, then freed there), swapped back in one op before its first backward use
/// (h2d, waiting for that op so memory stays bounded), and the compute stream
/// waiting for the free two ops later and for the swap-in before the use. Inputs
/// arrive with a host copy, so they are freed without a copy-out.
pub fn swapping_plan(graph: &Graph, budget_bytes: u64, min_gap_ops: usize) -> Plan {
    let frees = frees_after_op(graph);
    let pos = compute_positions(graph);
    let mut saved = saved_tensors(graph, min_gap_ops);
    let cref = |op: usize| StepRef {
        stream: Stream::Compute,
        index: pos[op],
    };
    let mut plan = outcore_plan::Plan::new(graph, info("test-swap"), budget_bytes);
    // D2h program in order of last forward use.
    saved.sort_by_key(|s| (s.last_fwd, s.tensor));
    let mut d2h_free: Vec<(TensorId, StepRef)> = Vec::new();
    for s in &saved {
        let arrives_with_host_copy = graph.tensor(s.tensor).producer.is_none();
        if !arrives_with_host_copy {
            plan.push(
                Stream::D2h,
                Instr::SwapOut(s.tensor),
                vec![cref(s.last_fwd)],
            );
        }
        let waits = if arrives_with_host_copy {
            vec![cref(s.last_fwd)]
        } else {
            Vec::new()
        };
        let f = plan.push(Stream::D2h, Instr::Free(s.tensor), waits);
        d2h_free.push((s.tensor, f));
    }
    // H2d program in order of first backward use.
    saved.sort_by_key(|s| (s.first_bwd, s.tensor));
    let mut compute_waits: Vec<Vec<StepRef>> = vec![Vec::new(); graph.ops.len()];
    for s in &saved {
        let free = d2h_free
            .iter()
            .find(|(t, _)| *t == s.tensor)
            .map(|(_, f)| *f);
        let mut waits = vec![cref(s.first_bwd - 1)];
        waits.extend(free);
        let swap_in = plan.push(Stream::H2d, Instr::SwapIn(s.tensor), waits);
        compute_waits[s.first_bwd].push(swap_in);
        if let Some(f) = free {
            let at = (s.last_fwd + 2).min(s.first_bwd);
            compute_waits[at].push(f);
        }
    }
    for op in &graph.ops {
        let waits = std::mem::take(&mut compute_waits[op.id.index()]);
        plan.push(Stream::Compute, Instr::Compute(op.id), waits);
        for &t in &frees[op.id.index()] {
            plan.push(Stream::Compute, Instr::Free(t), Vec::new());
        }
    }
    for t in frees_at_end(graph) {
        plan.push(Stream::Compute, Instr::Free(t), Vec::new());
    }
    plan
}

/// The in-order plan with activations freed after their last forward use and
/// re-materialised by `Recompute` right before their first backward use, where the
/// producer's inputs are still resident (persistent, or alive until then and not
/// themselves dropped).
pub fn recompute_plan(graph: &Graph, budget_bytes: u64, min_gap_ops: usize) -> Plan {
    let uses = uses_by_owner(graph);
    let frees = frees_after_op(graph);
    let mut saved = saved_tensors(graph, min_gap_ops);
    saved.sort_by_key(|s| (s.first_bwd, s.tensor));
    let mut dropped: Vec<(Saved, Vec<(OpId, TensorId)>)> = Vec::new();
    let mut needed: Vec<TensorId> = Vec::new();
    let alive_at = |x: TensorId, at: usize, dropped: &[(Saved, Vec<(OpId, TensorId)>)]| {
        let owner = graph.storage_owner(x);
        if graph.tensor(owner).is_persistent() {
            return true;
        }
        let alive_until = uses[owner.index()].last().map(|u| u.index()).unwrap_or(0);
        alive_until >= at && !dropped.iter().any(|(d, _)| d.tensor == owner)
    };
    for s in saved {
        let t = graph.tensor(s.tensor);
        let Some(producer) = t.producer else { continue };
        let op = graph.op(producer);
        if !op.recomputable || needed.contains(&s.tensor) {
            continue;
        }
        // Inputs that are gone by then may be recomputed first from resident inputs
        // (a chain of two), then freed again right after.
        let mut chain: Vec<(OpId, TensorId)> = Vec::new();
        let mut ok = true;
        for &x in &op.inputs {
            if alive_at(x, s.first_bwd, &dropped) {
                continue;
            }
            let owner = graph.storage_owner(x);
            let q = graph.tensor(owner).producer.map(|q| graph.op(q));
            match q {
                Some(q)
                    if q.recomputable
                        && !needed.contains(&owner)
                        && !dropped.iter().any(|(d, _)| d.tensor == owner)
                        && !chain.iter().any(|(_, c)| *c == owner)
                        && q.inputs.iter().all(|&y| alive_at(y, s.first_bwd, &dropped)) =>
                {
                    chain.push((q.id, owner));
                }
                _ => ok = false,
            }
        }
        if ok {
            needed.extend(op.inputs.iter().map(|&x| graph.storage_owner(x)));
            for (q, _) in &chain {
                needed.extend(graph.op(*q).inputs.iter().map(|&y| graph.storage_owner(y)));
            }
            dropped.push((s, chain));
        }
    }
    let mut plan = outcore_plan::Plan::new(graph, info("test-recompute"), budget_bytes);
    for op in &graph.ops {
        let i = op.id.index();
        for (d, chain) in dropped.iter().filter(|(d, _)| d.first_bwd == i) {
            for &(q, x) in chain {
                let r = Instr::Recompute {
                    op: q,
                    outputs: vec![x],
                };
                plan.push(Stream::Compute, r, Vec::new());
            }
            let producer = graph.tensor(d.tensor).producer.unwrap_or(OpId(0));
            plan.push(
                Stream::Compute,
                Instr::Recompute {
                    op: producer,
                    outputs: vec![d.tensor],
                },
                Vec::new(),
            );
            for &(_, x) in chain {
                plan.push(Stream::Compute, Instr::Free(x), Vec::new());
            }
        }
        plan.push(Stream::Compute, Instr::Compute(op.id), Vec::new());
        for &t in &frees[i] {
            plan.push(Stream::Compute, Instr::Free(t), Vec::new());
        }
        for (d, _) in dropped.iter().filter(|(d, _)| d.last_fwd == i) {
            plan.push(Stream::Compute, Instr::Free(d.tensor), Vec::new());
        }
    }
    for t in frees_at_end(graph) {
        plan.push(Stream::Compute, Instr::Free(t), Vec::new());
    }
    plan
}

/// The in-order plan (no swapping) at `budget_bytes`.
pub fn in_order_plan(graph: &Graph, budget_bytes: u64) -> Plan {
    lower_in_order(graph, info("in-order"), budget_bytes)
}

/// The memory bound verify() proves for `plan`: the largest `OverBudget` figure at a
/// zero budget. Errors with the other violations when the plan is unsafe.
pub fn verified_peak_bytes(plan: &Plan, graph: &Graph) -> Result<u64, Vec<String>> {
    let mut probe = plan.clone();
    probe.budget_bytes = 0;
    let mut peak = 0;
    let mut other = Vec::new();
    for v in verify(&probe, graph) {
        match v.kind {
            ViolationKind::OverBudget { bytes, .. } => peak = peak.max(bytes),
            _ => other.push(v.to_string()),
        }
    }
    if other.is_empty() {
        Ok(peak)
    } else {
        Err(other)
    }
}

/// Sets the plan's budget to its verified peak plus `slack_fraction` (room for the
/// allocator's 512-byte rounding and fragmentation) and checks verify() accepts it.
pub fn fit_budget(plan: &mut Plan, graph: &Graph, slack_fraction: f64) -> Result<u64, Vec<String>> {
    let peak = verified_peak_bytes(plan, graph)?;
    let n_tensors = graph.tensors.len() as u64;
    let budget = (peak as f64 * (1.0 + slack_fraction)) as u64 + 512 * n_tensors.min(64);
    plan.budget_bytes = budget;
    let violations: Vec<String> = verify(plan, graph).iter().map(|v| v.to_string()).collect();
    if violations.is_empty() {
        Ok(budget)
    } else {
        Err(violations)
    }
}
