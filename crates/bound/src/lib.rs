//! outcore-bound: a lower bound on the iteration time of *any* plan for a
//! (graph, device, budget), computed from the graph and the cost model alone,
//! independently of every planner, so that a plan's gap to it says how much
//! any planner could still gain.
//!
//! # Derivation
//!
//! Let `T` be the iteration time of some valid plan (any compute order, any
//! swaps, recomputations and layout) under budget `B`. Op times `t(o)` are the
//! cost model's; copies move at most `r_in` bytes/s host-to-device and `r_out`
//! device-to-host (the larger of each direction's one-way and duplex rates;
//! steps 3 and 4 ignore latency, which only lowers the bound). Where a
//! direction slows while the other copies too, the cut's program (step 5)
//! also charges each direction a share of the other's bytes, and each copy
//! it counts its latency ([`link`]).
//!
//! 1. **Compute.** Every op runs at least once on the one compute stream:
//!    `T >= C = sum t(o)` (the "ideal" time).
//! 2. **Working sets.** An op runs with its inputs, outputs and workspace
//!    allocated, so if some op's working set exceeds `B`, no plan exists
//!    ([`Bound::NoPlan`]).
//! 3. **A cut.** Pick an op `c`. In every valid order the ancestors `A(c)` of
//!    `c` (and `c`) run before `c` ends, at time `t_c`, and its descendants
//!    `D(c)` run after. A storage produced by an op of `A(c) ∪ {c}` and read
//!    by an op of `D(c)` is needed across `t_c`, and so is a persistent tensor
//!    (parameter, buffer, optimizer state) or batch input that an op of `D(c)`
//!    reads or writes. At `t_c` at most `B` bytes are allocated, so at least
//!    `E = (bytes of those storages) - B` bytes of them are *absent* at `t_c`.
//!    An absent storage is brought back after `t_c` by
//!    - a swap-in: `s` bytes host-to-device after `t_c`; for an activation
//!      also `s` bytes device-to-host before `t_c` (it was produced on the
//!      device, and its memory was only freed once its copy-out had
//!      finished), and for an updated persistent tensor `s` bytes
//!      device-to-host somewhere in the iteration (the plan ends with the
//!      residency it started with, and the update happens on the device);
//!    - or a recomputation of its producer, after `t_c`, taking at least that
//!      op's time (one recomputation restores every output of the op; inputs
//!      that must be restored first only add time). Persistent tensors, batch
//!      inputs and outputs of ops that are not recomputable cannot be.
//!
//!    With `a` activation bytes and `p` persistent bytes swapped and `R` the
//!    recomputation time:
//!    `T >= max(F, a / r_out) + max(G + R, (a + p) / r_in)`, where `F` is the
//!    compute time of `A(c) ∪ {c}` and `G` that of `D(c)` (the compute stream
//!    is serial; copy-outs of absent activations end before `t_c`, copy-ins
//!    and recomputations start after it);
//!    `T >= C + R`; and `T >= (a + p_updated) / r_out`.
//! 4. **Relaxation.** Choosing which storages are absent and how is a
//!    knapsack; its fractional relaxation is a lower bound of it. For fixed
//!    `(p, a)`, the best fractional choice swaps persistent bytes that are not
//!    updated first (they need no copy-out), swaps the activations that are
//!    dearest to recompute (per byte), and recomputes the cheapest remaining
//!    `m = E - p - a` bytes: `R(m)` is a prefix sum of increasing ratios, so
//!    convex in `m`, and every term above is convex in `(p, a)`. The minimum
//!    over `(p, a)` is found by nested ternary search (see [`solve`]).
//!
//! 5. **The cut's program.** The relaxation takes a recomputation's inputs
//!    as at hand, and counts only what an ancestor makes for a descendant.
//!    At the start of each cut op, [`LpGraph`] solves a linear program
//!    where a recomputation counts only as far as its inputs are present,
//!    copied in or recomputed themselves, the cut op's working set is
//!    present, each copy keeps to its window, and an op that is neither an
//!    ancestor nor a descendant of the cut op runs on the side the program
//!    chooses, its inputs or its outputs needed across the cut accordingly
//!    (see [`lp`]'s doc).
//!
//! The bound is `max(C, max over cuts c of T*(c) and of the program's optimum
//! at c)`. Cuts are spread over the
//! graph's order (at most [`MAX_CUTS`] of them), plus the first op of the
//! backward phase, where the most is saved for later, and the
//! [`WORKING_SET_CUTS`] ops with the largest working sets, where the least
//! room is left for it (on the PyTorch GPT-2 export at a quarter of its
//! footprint on `v100-16gb-pcie3`, the LM head's log-softmax: the bound went
//! from 0.903 to 0.790 of ideal throughput at most, and the suite's 96
//! bounds took 38 s instead of 34 s; four times as many spread cuts and 32
//! such ops moved no suite case by more than 0.007 more and took 120 s).
//!
//! [`swap_only_bound`] is steps 1 to 4 with recomputation ruled out: the
//! bound for plans that only keep and swap.
//!
//! What it deliberately leaves out (each would only raise the bound): copy
//! latency outside the cut's program, in its rows before and after the cut
//! for the copies out of updated persistent tensors (split by time, `b` and
//! `a`), and in the share of the link the other direction's copies take;
//! the inputs of a recomputation that must themselves be restored,
//! allocator fragmentation, and storages live across `t_c` that no op of
//! `D(c)` reads.

mod cut;
pub mod link;
pub mod lp;
mod solve;

use outcore_cost::CostModel;
use outcore_graph::{Graph, OpId};
use serde::Serialize;

pub use cut::{CutItems, Recompute, cut_items};
pub use link::Link;
pub use lp::{LpChoice, LpCut, LpGraph, StorageChoice};
pub use solve::{Relaxed, solve};

/// At most this many cuts are tried (each costs a pass over the graph).
pub const MAX_CUTS: usize = 64;

/// Cuts also tried at the ops with the largest working sets.
pub const WORKING_SET_CUTS: usize = 8;

/// The bound, or the proof that no plan exists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Bound {
    /// No plan is faster than `time_s`.
    Time(TimeBound),
    /// Op `op` needs `working_set_bytes` allocated at once, more than the budget.
    NoPlan {
        op: String,
        working_set_bytes: u64,
        budget_bytes: u64,
    },
}

impl Bound {
    /// The bound in seconds (`None` when no plan exists).
    pub fn time_s(&self) -> Option<f64> {
        match self {
            Bound::Time(t) => Some(t.time_s),
            Bound::NoPlan { .. } => None,
        }
    }
}

/// A lower bound on the iteration time and what sets it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeBound {
    /// The bound: no plan's iteration is shorter.
    pub time_s: f64,
    /// The compute time of every op once (the ideal time).
    pub compute_s: f64,
    /// The cut whose relaxation gives the bound, when it is above `compute_s`
    /// and the cut's linear program does not give more.
    pub cut: Option<CutBound>,
    /// The cut whose linear program gives the bound, when it is above both
    /// `compute_s` and every closed-form relaxation.
    pub program: Option<ProgramBound>,
}

/// The linear program at the binding cut.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgramBound {
    /// The op at whose start the cut is.
    pub op: String,
    /// The program's optimum there.
    pub optimum: LpCut,
}

/// The relaxation at the binding cut.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CutBound {
    /// The op the cut is after.
    pub op: String,
    /// Bytes that must be absent at the cut.
    pub absent_bytes: u64,
    /// The relaxation's optimum there.
    pub relaxed: Relaxed,
}

/// The cut program at the end of the forward pass, where the activations
/// peak (the later of the two cuts around the first backward op that gives
/// more), with the choice behind its optimum: which storages it keeps, swaps
/// and recomputes there. A planner may start from it; it is not a plan (it
/// says nothing of the other moments). `None` when nothing must leave the
/// device there, the graph has no backward op, or the solver fails.
///
/// Only these two cuts are solved (a fraction of [`lower_bound`]'s time:
/// on backward cuts the programs are larger). The program that sets the
/// bound is often there or close: on the zoo's DenseNet-121, BERT-base and
/// GPT-2 at 50% on `v100-16gb-pcie3` it is at `loss`, the op before the
/// first backward op; on the PyTorch MobileNet v2 export at `aten.mean.dim`,
/// six ops earlier, with an optimum 0.1% above these cuts'.
///
/// `link_scale` multiplies the device's copy rates the program prices
/// swaps at: 1 for the bound's own program. Any other value makes it a
/// heuristic, not a bound (a planner may price the link lower to lean on
/// recomputation). Copies' latency is left out here
/// ([`Link::without_latency`]); [`lower_bound`]'s programs count it.
///
/// `None` at once where some op's working set alone is over the budget
/// (step 2: no plan exists, and the programs would take as long to solve
/// for nothing).
pub fn forward_end_program(
    graph: &Graph,
    cost: &dyn CostModel,
    budget_bytes: u64,
    link_scale: f64,
) -> Option<LpChoice> {
    if no_plan(graph, budget_bytes).is_some() {
        return None;
    }
    let ends = forward_end_cuts(graph)?;
    let op_time_s = op_times_s(graph, cost);
    let compute_s: f64 = op_time_s.iter().sum();
    // Without the copies' latency, as `outcore`'s start from it was tuned
    // (at its link scale of 0.01 the bytes take a hundred times as long
    // and a latency no longer, so it would weigh little there anyway).
    let link = Link::of(&cost.copy_rates())
        .scaled(link_scale)
        .without_latency();
    let programs = LpGraph::new(graph, &op_time_s, compute_s);
    ends.into_iter()
        .filter_map(|c| programs.solve_choice(c, budget_bytes, link))
        .filter(|choice| choice.optimum.time_s > compute_s)
        .max_by(|a, b| a.optimum.time_s.total_cmp(&b.optimum.time_s))
}

/// Each op's time under `cost` (negative times taken as zero).
fn op_times_s(graph: &Graph, cost: &dyn CostModel) -> Vec<f64> {
    (0..graph.ops.len())
        .map(|i| cost.op_time_s(graph, OpId(i as u32)).max(0.0))
        .collect()
}

/// The lower bound for `graph` on `cost`'s device under `budget_bytes`.
pub fn lower_bound(graph: &Graph, cost: &dyn CostModel, budget_bytes: u64) -> Bound {
    if let Some(no_plan) = no_plan(graph, budget_bytes) {
        return no_plan;
    }
    let op_time_s = op_times_s(graph, cost);
    let link = Link::of(&cost.copy_rates());
    let cuts = cut_candidates(graph);
    let mut best = relaxed_over_cuts(graph, &op_time_s, &cuts, budget_bytes, link, false);
    let programs = LpGraph::new(graph, &op_time_s, best.compute_s);
    for &c in &cuts {
        let Some(optimum) = programs.solve(c, budget_bytes, link) else {
            continue;
        };
        if optimum.time_s > best.time_s {
            best.time_s = optimum.time_s;
            best.cut = None;
            best.program = Some(ProgramBound {
                op: graph.op(c).name.clone(),
                optimum,
            });
        }
    }
    Bound::Time(best)
}

/// A lower bound on the iteration time of any plan that recomputes nothing
/// (keeps and swaps only, as `swapadvisor`, `odswap`, `lms` and the `vdnn`
/// planners plan): step 3 of the derivation with no recomputation (`R =
/// 0`), so every absent storage is swapped (an activation copied out before
/// the cut and in after it), relaxed as in step 4, at the same cuts as
/// [`lower_bound`]. The cut's program (step 5) is left out: it is built
/// around recomputations' inputs, and leaving a bound's rows out only
/// lowers it.
///
/// Why a second bound: a swap-only planner's gap to [`lower_bound`] mixes
/// what it could still gain by swapping better with what only
/// recomputation could give. On NasNet-25 (batch 64, `v100-16gb-pcie3`,
/// 16 GiB) [`lower_bound`] allows 0.88 of ideal throughput (by recomputing
/// 0.70 s), and no swap-only plan passes 0.203 (26.14 s against 5.30 s of
/// compute): at the end of the loss, 158.2 GB of what is needed later are
/// off the device, at the optimum 155.4 GB of activations (copied out at
/// 12 GB/s before the loss and back in after it) and 2.8 GB of persistent
/// tensors (copied in after it).
pub fn swap_only_bound(graph: &Graph, cost: &dyn CostModel, budget_bytes: u64) -> Bound {
    if let Some(no_plan) = no_plan(graph, budget_bytes) {
        return no_plan;
    }
    let op_time_s = op_times_s(graph, cost);
    let link = Link::of(&cost.copy_rates());
    let cuts = cut_candidates(graph);
    Bound::Time(relaxed_over_cuts(
        graph,
        &op_time_s,
        &cuts,
        budget_bytes,
        link,
        true,
    ))
}

/// Step 2: [`Bound::NoPlan`] when some op's working set exceeds the budget.
fn no_plan(graph: &Graph, budget_bytes: u64) -> Option<Bound> {
    let (op, working_set_bytes) = largest_working_set_over(graph, budget_bytes)?;
    Some(Bound::NoPlan {
        op,
        working_set_bytes,
        budget_bytes,
    })
}

/// The larger of the compute time (step 1) and every cut's relaxation
/// (steps 3 and 4) over `cuts`; with `swaps_only`, nothing is recomputed
/// (every absent storage is swapped).
fn relaxed_over_cuts(
    graph: &Graph,
    op_time_s: &[f64],
    cuts: &[OpId],
    budget_bytes: u64,
    link: Link,
    swaps_only: bool,
) -> TimeBound {
    let compute_s: f64 = op_time_s.iter().sum();
    let mut best = TimeBound {
        time_s: compute_s,
        compute_s,
        cut: None,
        program: None,
    };
    for &c in cuts {
        let mut items = cut_items(graph, op_time_s, c);
        if swaps_only {
            for group in &mut items.activations {
                group.1 = Recompute::Never;
            }
        }
        let absent_bytes = items.total_bytes().saturating_sub(budget_bytes);
        if absent_bytes == 0 {
            continue;
        }
        let relaxed = solve(
            &items,
            absent_bytes as f64,
            compute_s,
            link.in_bytes_per_s,
            link.out_bytes_per_s,
        );
        if relaxed.time_s > best.time_s {
            best.time_s = relaxed.time_s;
            best.cut = Some(CutBound {
                op: graph.op(c).name.clone(),
                absent_bytes,
                relaxed,
            });
        }
    }
    best
}

/// The first op whose inputs, outputs (storage owners, each once) and
/// workspace exceed the budget, with that working set.
fn largest_working_set_over(graph: &Graph, budget_bytes: u64) -> Option<(String, u64)> {
    let mut owners = Vec::new();
    graph.ops.iter().find_map(|op| {
        let bytes = working_set_bytes(graph, op, &mut owners);
        (bytes > budget_bytes).then(|| (op.name.clone(), bytes))
    })
}

/// Bytes `op` needs allocated while it runs: its inputs and outputs (storage
/// owners, each once) and its workspace (step 2 of the derivation). `owners`
/// is scratch. Public so that planners measure working sets as the bound
/// does (the joint planner's room step finds the largest).
pub fn working_set_bytes(
    graph: &Graph,
    op: &outcore_graph::Op,
    owners: &mut Vec<outcore_graph::TensorId>,
) -> u64 {
    owners.clear();
    owners.extend(
        op.inputs
            .iter()
            .chain(&op.outputs)
            .map(|&t| graph.storage_owner(t)),
    );
    owners.sort_unstable();
    owners.dedup();
    owners
        .iter()
        .map(|&t| graph.tensor(t).size_bytes)
        .fold(op.workspace_bytes, u64::saturating_add)
}

/// The `count` ops with the largest working sets (ties to the earlier op).
fn largest_working_sets(graph: &Graph, count: usize) -> Vec<OpId> {
    let mut owners = Vec::new();
    let mut by_size: Vec<(u64, OpId)> = graph
        .ops
        .iter()
        .map(|op| (working_set_bytes(graph, op, &mut owners), op.id))
        .collect();
    by_size.sort_unstable_by_key(|&(bytes, id)| (std::cmp::Reverse(bytes), id));
    by_size.into_iter().take(count).map(|(_, id)| id).collect()
}

/// Ops to cut at: evenly spread over the graph's order, plus the first
/// backward op and the one before it (the end of the forward pass, where
/// activations peak) and the ops with the largest working sets (where the
/// least room is left).
fn cut_candidates(graph: &Graph) -> Vec<OpId> {
    let mut cuts = spread_cuts(graph);
    cuts.extend(forward_end_cuts(graph).into_iter().flatten());
    cuts.extend(largest_working_sets(graph, WORKING_SET_CUTS));
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// At most [`MAX_CUTS`] ops evenly spread over the graph's order.
fn spread_cuts(graph: &Graph) -> Vec<OpId> {
    let n = graph.ops.len();
    let step = n.div_ceil(MAX_CUTS).max(1);
    (0..n).step_by(step).map(|i| OpId(i as u32)).collect()
}

/// The cuts at the end of the forward pass: at the op just before the first
/// backward op (the last one the forward pass needs) and at that op.
fn forward_end_cuts(graph: &Graph) -> Option<[OpId; 2]> {
    let first_backward = graph
        .ops
        .iter()
        .find(|o| o.phase == outcore_graph::Phase::Backward)?
        .id;
    Some([OpId(first_backward.0.saturating_sub(1)), first_backward])
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_cost::{DeviceProfile, RooflineModel};
    use outcore_graph::footprint;

    /// Three forward ops (`x -> a1 -> a2 -> a3`), a loss `a3 -> l` and three
    /// backward ops (`(l, a3) -> g3`, `(g3, a2) -> g2`, `(g2, a1) -> g1`),
    /// every tensor 100 B and every op 1 FLOP, on the unit cost model (1
    /// FLOP/s, 1 B/s each way).
    fn swap_chain() -> Graph {
        use outcore_graph::{DType, GraphMeta, Op, OpKind, Phase, Tensor, TensorId, TensorKind};
        let tensor = |id: u32, name: &str, kind: TensorKind, producer: Option<u32>| Tensor {
            id: TensorId(id),
            name: name.into(),
            shape: vec![100],
            dtype: DType::Uint8,
            size_bytes: 100,
            kind,
            producer: producer.map(OpId),
            view_of: None,
            inplace_update_of: None,
            is_output: false,
        };
        let op = |id: u32, phase: Phase, inputs: &[u32], output: u32| Op {
            id: OpId(id),
            name: format!("op{id}"),
            kind: OpKind::Named { name: "k".into() },
            phase,
            inputs: inputs.iter().map(|&t| TensorId(t)).collect(),
            outputs: vec![TensorId(output)],
            flops: 1,
            bytes_read: 0,
            bytes_written: 0,
            workspace_bytes: 0,
            recomputable: true,
            module: None,
        };
        use TensorKind::{Activation, Gradient, Input, Loss};
        let mut tensors = vec![
            tensor(0, "x", Input, None),
            tensor(1, "a1", Activation, Some(0)),
            tensor(2, "a2", Activation, Some(1)),
            tensor(3, "a3", Activation, Some(2)),
            tensor(4, "l", Loss, Some(3)),
            tensor(5, "g3", Gradient, Some(4)),
            tensor(6, "g2", Gradient, Some(5)),
            tensor(7, "g1", Gradient, Some(6)),
        ];
        tensors[7].is_output = true;
        let ops = vec![
            op(0, Phase::Forward, &[0], 1),
            op(1, Phase::Forward, &[1], 2),
            op(2, Phase::Forward, &[2], 3),
            op(3, Phase::Forward, &[3], 4),
            op(4, Phase::Backward, &[4, 3], 5),
            op(5, Phase::Backward, &[5, 2], 6),
            op(6, Phase::Backward, &[6, 1], 7),
        ];
        Graph {
            meta: GraphMeta {
                model: "swap-chain".into(),
                batch: 1,
                seq: None,
                optimizer: "none".into(),
                source: "hand-made".into(),
            },
            tensors,
            ops,
        }
    }

    /// Under 300 B, the end of the loss (`op3`) has `a1`, `a2`, `a3` and `l`
    /// (400 B) needed later, so 100 B are off the device there. Kept and
    /// swapped only, those bytes go out before (100 s at 1 B/s, against 4 s
    /// of compute up to the loss) and come back after (100 s against 3 s):
    /// 200 s; no other cut has more than 300 B live across it. With
    /// recomputation nothing has to go out: `x` comes back instead (an
    /// input has its host copy) to recompute `a1`, so the bound for any
    /// plan is lower (its program: about 105 s).
    #[test]
    fn without_recomputation_the_absent_bytes_cross_the_link_twice() {
        let g = swap_chain();
        let cost = outcore_cost::UnitCostModel;
        let Bound::Time(swap) = swap_only_bound(&g, &cost, 300) else {
            panic!("every working set is 200 or 300 B");
        };
        assert!((swap.time_s - 200.0).abs() < 1e-6, "{swap:?}");
        let cut = swap.cut.expect("a cut binds");
        assert_eq!((cut.op.as_str(), cut.absent_bytes), ("op3", 100));
        assert_eq!(cut.relaxed.recompute_s, 0.0);
        let Bound::Time(any) = lower_bound(&g, &cost, 300) else {
            panic!("the same working sets");
        };
        assert!(any.time_s < 0.6 * swap.time_s, "{any:?}");
        // With room for everything, both are the compute time.
        assert_eq!(swap_only_bound(&g, &cost, 400).time_s(), Some(7.0));
        // An op's working set over the budget rules every plan out.
        assert!(matches!(
            swap_only_bound(&g, &cost, 250),
            Bound::NoPlan { .. }
        ));
    }

    /// The most any of `cuts`' programs asks.
    fn most_of(programs: &LpGraph<'_>, cuts: &[OpId], budget: u64, link: Link) -> f64 {
        cuts.iter()
            .filter_map(|&c| programs.solve(c, budget, link))
            .map(|o| o.time_s)
            .fold(0.0, f64::max)
    }

    /// The PyTorch GPT-2 export's LM head holds the logits, their
    /// log-softmax and its gradient (206 MB each, vocabulary-wide: the
    /// largest working sets of the graph) for a few ops at the turn from the
    /// forward to the backward pass. A cut there leaves the least room for
    /// what the backward pass needs later, and the evenly spread cuts step
    /// over it (at a quarter of the footprint on `v100-16gb-pcie3` the bound
    /// allowed 0.903 of ideal throughput without these cuts, 0.790 with).
    #[test]
    fn a_cut_at_the_largest_working_set_raises_the_bound() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/examples/gpt2_b4_s256_adamw.json");
        let g = outcore_graph::format::load_graph_file(&path)
            .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
        let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin"));
        let (fp, _) = footprint(&g);
        let budget = fp / 4;
        let op_time_s = op_times_s(&g, &cost);
        let compute_s: f64 = op_time_s.iter().sum();
        let link = Link::of(&cost.copy_rates());
        let programs = LpGraph::new(&g, &op_time_s, compute_s);
        let mut spread = spread_cuts(&g);
        spread.extend(forward_end_cuts(&g).into_iter().flatten());
        let at_spread = most_of(&programs, &spread, budget, link);
        let at_largest = most_of(
            &programs,
            &largest_working_sets(&g, WORKING_SET_CUTS),
            budget,
            link,
        );
        assert!(
            at_largest > at_spread * 1.1,
            "largest working sets {at_largest} s, spread cuts {at_spread} s"
        );
        let Bound::Time(bound) = lower_bound(&g, &cost, budget) else {
            panic!("every working set fits a quarter of the footprint");
        };
        assert!(bound.time_s >= at_largest, "{bound:?}");
    }
}
