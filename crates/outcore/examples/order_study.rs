//! Does the order a plan runs in matter (issue 16: the order is one of the
//! things the joint search should choose)? Plans each case in the graph's own
//! order and in the eager-update order (`outcore_plan::eager_update_order`:
//! every optimizer op as soon as its gradient is complete), with the same
//! planners and budget, and prints throughput vs ideal side by side.
//!
//! ```text
//! cargo run --release -p outcore --example order_study -- [SECONDS]
//! ```
//!
//! `SECONDS` (default 5) is each search planner's limit per case. The budget
//! is a fraction of the footprint in the graph's own order, so both orders
//! plan for the same bytes.

// An example prints its table; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore::{GraphSource, load_graph};
use outcore_cost::{CostModel, DeviceProfile, RooflineModel};
use outcore_graph::{OpId, footprint};
use outcore_plan::{PlanOutcome, PlanRequest, eager_update_order};
use outcore_planners::framework::{Ctx, live_bytes};
use std::collections::BTreeMap;
use std::path::PathBuf;

type Error = Box<dyn std::error::Error>;

fn zoo(model: &str, batch: u64) -> GraphSource {
    GraphSource::Zoo {
        model: model.to_string(),
        batch: Some(batch),
        knobs: BTreeMap::new(),
        optimizer: None,
    }
}

fn file(path: &str) -> GraphSource {
    GraphSource::File {
        path: PathBuf::from(path),
    }
}

const PLANNERS: [&str; 5] = ["dtr", "window", "checkpoint-sqrt", "capuchin", "outcore"];

fn main() -> Result<(), Error> {
    let seconds: f64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 5.0,
    };
    let cases: Vec<(&str, GraphSource, f64)> = vec![
        (
            "vgg16 b32 (PyTorch)",
            file("tools/examples/vgg16_b32.json"),
            0.5,
        ),
        (
            "gpt2 b4 s256 (PyTorch)",
            file("tools/examples/gpt2_b4_s256_adamw.json"),
            0.5,
        ),
        (
            "gpt2 b4 s256 (PyTorch)",
            file("tools/examples/gpt2_b4_s256_adamw.json"),
            0.25,
        ),
        ("bert-base b32", zoo("bert-base", 32), 0.25),
        ("gpt2 b8", zoo("gpt2", 8), 0.25),
        ("densenet121 b64", zoo("densenet121", 64), 0.5),
        ("mobilenet_v2 b64", zoo("mobilenet_v2", 64), 0.5),
        ("resnet50 b64", zoo("resnet50", 64), 0.25),
    ];
    let device = DeviceProfile::builtin("v100-16gb-pcie3")?;
    let cost = RooflineModel::new(device);
    println!(
        "| case | budget | order | footprint in that order | {} |",
        PLANNERS.join(" | ")
    );
    println!("|---|---|---|---|{}", "---|".repeat(PLANNERS.len()));
    for (label, source, fraction) in cases {
        let graph = load_graph(&source)?.graph;
        let (fp, _) = footprint(&graph);
        let budget = (fp as f64 * fraction) as u64;
        let ideal_s: f64 = (0..graph.ops.len())
            .map(|i| cost.op_time_s(&graph, OpId(i as u32)))
            .sum();
        let eager = eager_update_order(&graph);
        for (name, order) in [("graph", None), ("eager", Some(eager.as_slice()))] {
            let order_peak = order.map_or(fp, |o| peak_in_order(&graph, &cost, o));
            let mut cells = Vec::new();
            for planner in PLANNERS {
                let p = outcore_planners::by_name(planner)?;
                let request = PlanRequest {
                    order,
                    time_limit_s: seconds,
                    ..PlanRequest::new(&graph, &cost, budget)
                };
                let cell = match p.plan(&request) {
                    Ok(PlanOutcome::Feasible(plan)) => {
                        let t = plan.planner.settings["simulated_iter_time_s"]
                            .as_f64()
                            .unwrap_or(f64::NAN);
                        format!("{:.3}", ideal_s / t)
                    }
                    Ok(PlanOutcome::Infeasible(_)) => "—".to_string(),
                    Err(e) => format!("error: {e}"),
                };
                cells.push(cell);
            }
            println!(
                "| {label} | {:.1}% | {name} | {:.2} GB | {} |",
                fraction * 100.0,
                order_peak as f64 / 1e9,
                cells.join(" | ")
            );
        }
    }
    Ok(())
}

/// Peak live bytes running `order` with nothing swapped, as `footprint` counts
/// them for the graph's own order: the planners' live-bytes model of that
/// order plus each op's workspace.
fn peak_in_order(graph: &outcore_graph::Graph, cost: &RooflineModel, order: &[OpId]) -> u64 {
    let ctx = Ctx::new(graph, cost, order.to_vec());
    live_bytes(&ctx, &[])
        .iter()
        .zip(order)
        .map(|(&live, &op)| live.max(0) as u64 + graph.op(op).workspace_bytes)
        .max()
        .unwrap_or(0)
}
