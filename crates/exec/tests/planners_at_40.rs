//! Real planners' plans at 40% of the footprint, executed on the CPU backend for 10
//! iterations with checks: parameters bit-identical to an unconstrained run, loss
//! decreasing. mlp runs with the `virtual-chunks` arena allocator: at 40% its plans
//! fit in bytes but not in a contiguous arena's addresses (see BENCHMARKS.md).

use outcore_cost::RooflineModel;
use outcore_exec::{CpuBackend, CpuBackendOptions, ExecOptions, execute};
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{PlanOutcome, PlanRequest, PlannerInfo, lower_in_order, verify};
use std::collections::BTreeMap;

const ITERS: u32 = 10;

fn graph(name: &str, batch: u64, knobs: &[(&str, u64)]) -> Graph {
    let knobs: BTreeMap<String, u64> = knobs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    zoo::build(name, Some(batch), &knobs, None).expect("zoo model builds")
}

/// Runs each planner's plan at 40% for `ITERS` iterations and compares it with an
/// unconstrained in-order run; `allocator` replaces the plan's arena allocator.
fn run_planners_at_40(
    g: &Graph,
    planners: &[&str],
    allocator: Option<outcore_plan::AllocatorSpec>,
) {
    run_planners_at_40_with(g, planners, allocator, Planning::default())
}

/// How a planner is asked, beyond the budget.
struct Planning {
    time_limit_s: f64,
    /// Plan with the allocator in the loop (the request names the arena
    /// allocator instead of `perfect`) and issue in the simulated order, as
    /// `outcore run` does.
    allocator_aware: bool,
}

impl Default for Planning {
    fn default() -> Self {
        Planning {
            time_limit_s: 10.0,
            allocator_aware: false,
        }
    }
}

fn run_planners_at_40_with(
    g: &Graph,
    planners: &[&str],
    allocator: Option<outcore_plan::AllocatorSpec>,
    planning: Planning,
) {
    let (fp, _) = footprint(g);
    let budget = fp * 40 / 100;
    let mut options = ExecOptions {
        iters: ITERS,
        check: true,
        trace: false,
        ..ExecOptions::default()
    };
    let info = PlannerInfo {
        name: "reference".into(),
        seed: None,
        settings: serde_json::Value::Null,
    };
    let reference_plan = lower_in_order(g, info, fp * 2);
    let reference = execute(
        g,
        &reference_plan,
        &CpuBackend::new(CpuBackendOptions::default()),
        &options,
    )
    .expect("the unconstrained run succeeds");
    assert!(
        reference.losses[ITERS as usize - 1] < reference.losses[0],
        "{}: loss does not decrease",
        g.meta.model
    );
    let cost = RooflineModel::new(outcore_exec::cpu::device_profile(budget, None, 1e10));
    for name in planners {
        let planner = outcore_planners::by_name(name).expect("planner exists");
        let request_allocator = match &allocator {
            Some(config) if planning.allocator_aware => config.clone(),
            _ => outcore_plan::AllocatorSpec::Perfect,
        };
        let request = PlanRequest {
            graph: g,
            cost: &cost,
            budget_bytes: budget,
            seed: 0,
            time_limit_s: planning.time_limit_s,
            allocator: &request_allocator,
            order: None,
            fingerprint: None,
        };
        // An empty `offsets` layout asks for the plan's own: planned in bytes,
        // laid out, replanned lower while the layout misses the budget.
        let laid_out = matches!(&allocator, Some(a) if outcore_planners::layout::wants_layout(a));
        let outcome = if laid_out {
            outcore_planners::layout::plan_laid_out(planner.as_ref(), &request)
        } else {
            planner.plan(&request)
        };
        let mut plan = match outcome {
            Ok(PlanOutcome::Feasible(p)) => *p,
            Ok(PlanOutcome::Infeasible(why)) => panic!("{name} on {}: {why}", g.meta.model),
            Err(e) => panic!("{name} on {}: {e}", g.meta.model),
        };
        match &allocator {
            // The plan carries its layout (the executor then needs no issue
            // order: the layout holds for every timing).
            Some(_) if laid_out => assert!(
                matches!(&plan.allocator, outcore_plan::AllocatorSpec::Offsets(c) if !c.owners.is_empty()),
                "{name}: not laid out"
            ),
            Some(config) => plan.allocator = config.clone(),
            None => {}
        }
        assert_eq!(plan.budget_bytes, budget);
        let v = verify(&plan, g);
        assert!(v.is_empty(), "{name}: {}", v[0]);
        options.issue_order = if planning.allocator_aware {
            let sim_options = outcore_sim::SimOptions {
                record_start_order: true,
                ..outcore_sim::SimOptions::default()
            };
            let predicted =
                outcore_sim::simulate(g, &plan, &cost, &sim_options).expect("the plan simulates");
            assert!(
                predicted.report.oom.is_none(),
                "{name}: simulated out of memory"
            );
            predicted.start_order
        } else {
            None
        };
        let report = execute(
            g,
            &plan,
            &CpuBackend::new(CpuBackendOptions::default()),
            &options,
        )
        .unwrap_or_else(|e| panic!("{name} on {} at 40%: {e}", g.meta.model));
        assert_eq!(report.checks_passed, Some(true), "{name}");
        assert!(
            report.swap_in_bytes > 0 || report.recomputes > 0,
            "{name} neither swaps nor recomputes"
        );
        assert!(report.peak_device_bytes <= budget, "{name}");
        let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&report.losses),
            bits(&reference.losses),
            "{name}: losses differ"
        );
        assert!(
            report.final_state() == reference.final_state(),
            "{name}: final parameters differ"
        );
    }
}

/// 64 KiB virtual chunks, tensors up to 16 KiB sharing chunks.
fn virtual_chunks_64k() -> outcore_plan::AllocatorSpec {
    outcore_plan::AllocatorSpec::VirtualChunks(outcore_alloc::VirtualChunksConfig {
        chunk_bytes: 64 * 1024,
        small_alloc_max_bytes: 16 * 1024,
    })
}

/// The tiny models plan with the arena's allocator in the loop and run in the
/// simulated order: planned for `perfect` and run on the executor's best-fit
/// arena, odswap's tiny-cnn plan fragmented it in some runs and not others
/// (512 KiB asked with 3 MiB free, largest block 485 to 521 KiB, as the copy
/// threads' timing went).
fn allocator_aware() -> Planning {
    Planning {
        allocator_aware: true,
        ..Planning::default()
    }
}

#[test]
fn tiny_cnn_under_three_planners_at_40_percent() {
    let g = graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]);
    run_planners_at_40_with(
        &g,
        &["window", "lms", "odswap"],
        Some(virtual_chunks_64k()),
        allocator_aware(),
    );
}

#[test]
fn tiny_transformer_under_three_planners_at_40_percent() {
    let g = graph("tiny-transformer", 32, &[("layers", 8)]);
    run_planners_at_40_with(
        &g,
        &["lms", "odswap", "vdnn-all"],
        Some(virtual_chunks_64k()),
        allocator_aware(),
    );
}

#[test]
fn mlp_under_three_planners_at_40_percent_with_virtual_chunks() {
    let g = graph("mlp", 2048, &[("layers", 24), ("hidden", 128)]);
    // 64 KiB chunks: the mlp's 1 MiB activations span many chunks and the rounding
    // waste stays small against a 14 MiB budget; tensors up to 16 KiB share chunks.
    // odswap is not here: it finds no plan for this mlp at 40% (fc0 alone needs
    // more than its schedule leaves), a planning limit, not an arena one.
    let virtual_chunks =
        outcore_plan::AllocatorSpec::VirtualChunks(outcore_alloc::VirtualChunksConfig {
            chunk_bytes: 64 * 1024,
            small_alloc_max_bytes: 16 * 1024,
        });
    run_planners_at_40(
        &g,
        &["window", "lms", "vdnn-all-sync"],
        Some(virtual_chunks),
    );
}

/// Planned for `perfect`, laid out with `offsets` and run in the executor's
/// own issue order (no simulated order): the layout holds for every timing,
/// where best-fit fragmented in some runs (see `allocator_aware`).
/// Recomputing planners (`dtr`, `checkpoint-sqrt`) use scratch slots.
#[test]
fn tiny_models_with_an_offsets_layout_at_40_percent() {
    let layout = || Some(outcore_plan::AllocatorSpec::Offsets(Default::default()));
    let cnn = graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]);
    run_planners_at_40(&cnn, &["odswap", "dtr", "checkpoint-sqrt"], layout());
    let transformer = graph("tiny-transformer", 32, &[("layers", 8)]);
    run_planners_at_40(&transformer, &["lms", "dtr"], layout());
}

#[test]
fn home_on_tiny_cnn_and_tiny_transformer_at_40_percent() {
    // HOME's plans fit 40% in bytes, but planned for the `perfect` allocator
    // they fragmented the executor's best-fit arena (512 KiB asked with 1.6 MiB
    // free, largest block 256 KiB, at a point that moved with the copy threads'
    // timing). So home plans with the arena's allocator in the loop, and the
    // executor issues in the simulated order, as `outcore run` does.
    // The swarm stops at its iteration count or its time limit, whichever comes
    // first: a limit no run reaches makes the plan the same on every machine
    // and build profile (10 s cut the debug build's search short).
    let virtual_chunks =
        outcore_plan::AllocatorSpec::VirtualChunks(outcore_alloc::VirtualChunksConfig {
            chunk_bytes: 64 * 1024,
            small_alloc_max_bytes: 16 * 1024,
        });
    let planning = || Planning {
        time_limit_s: 3600.0,
        allocator_aware: true,
    };
    let cnn = graph("tiny-cnn", 16, &[("depth", 8), ("width", 8)]);
    run_planners_at_40_with(&cnn, &["home"], Some(virtual_chunks.clone()), planning());
    let transformer = graph("tiny-transformer", 32, &[("layers", 8)]);
    run_planners_at_40_with(&transformer, &["home"], Some(virtual_chunks), planning());
}

/// `best-fit-paged` scaled down for tiny models: 64 KiB pages, small requests
/// up to 16 KiB in 64 KiB segments, shared large segments of 256 KiB.
fn best_fit_paged_64k() -> outcore_plan::AllocatorSpec {
    outcore_plan::AllocatorSpec::BestFit(outcore_alloc::BestFitConfig {
        small_size_bytes: 16 * 1024,
        small_segment_bytes: 64 * 1024,
        large_segment_bytes: 256 * 1024,
        min_large_alloc_bytes: 128 * 1024,
        round_large_bytes: 64 * 1024,
        paged_segments: true,
        page_bytes: 64 * 1024,
    })
}

/// Segments on any free pages: the executor places every allocation through
/// its physical ranges (`physical_segments`), bit-identical to the
/// unconstrained run.
#[test]
fn tiny_transformer_on_best_fit_paged_at_40_percent() {
    let g = graph("tiny-transformer", 32, &[("layers", 8)]);
    run_planners_at_40_with(
        &g,
        &["lms", "odswap"],
        Some(best_fit_paged_64k()),
        allocator_aware(),
    );
}
