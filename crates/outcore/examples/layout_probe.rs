//! Lays out saved plan files and prints each layout's height against the
//! plan's memory bound and its simulated peak, and the time it took: for
//! studying the layout heuristic on real plans (`outcore plan ...
//! --allocator perfect -o FILE`). With `--pin`, each plan is first pinned
//! to its predicted timeline on its own device (`outcore_plan::pin_frees`),
//! and its placements are ordered by the
//! predicted lifetimes (`outcore_plan::lay_out_timed`), as `--allocator
//! offsets` does.
//!
//! `cargo run --release -p outcore --example layout_probe -- [--pin] PLAN.json...`

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pin = args.iter().any(|a| a == "--pin");
    for path in args.iter().filter(|a| *a != "--pin") {
        let mut plan = outcore::load_plan(std::path::Path::new(path)).map_err(|e| e.to_string())?;
        let graph = outcore::graph_of_plan(&plan).map_err(|e| e.to_string())?;
        let device = plan.device.clone().ok_or("the plan names no device")?;
        let cost = outcore_cost::RooflineModel::new(device);
        let options = outcore_sim::SimOptions {
            iterations: 1,
            record_timeline: true,
            ..outcore_sim::SimOptions::default()
        };
        let out =
            outcore_sim::simulate(&graph, &plan, &cost, &options).map_err(|e| e.to_string())?;
        let timeline = out.timeline.unwrap_or_default();
        let mut waits = 0;
        if pin {
            waits = outcore_plan::pin_frees(&mut plan, &timeline).map_err(|e| e.to_string())?;
        }
        let t0 = std::time::Instant::now();
        let layout = if pin {
            outcore_plan::lay_out_timed(&plan, &graph, &timeline)
        } else {
            outcore_plan::lay_out(&plan, &graph)
        }
        .map_err(|e| e.to_string())?;
        eprintln!(
            "{path}: height {} bound {} simulated peak {} budget {} height/bound {:.4} height/peak {:.4} buffers {} waits added {waits} in {:.2} s",
            layout.config.height_bytes,
            layout.bound_bytes,
            out.report.peak_live_bytes,
            plan.budget_bytes,
            layout.overhead(),
            layout.config.height_bytes as f64 / out.report.peak_live_bytes as f64,
            layout.buffers,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
