//! Lays out saved plan files and prints each layout's height against the
//! plan's memory bound, and the time it took: for studying the layout
//! heuristic on real plans (`outcore plan ... --allocator perfect -o FILE`).
//!
//! `cargo run --release -p outcore --example layout_probe -- PLAN.json...`

fn main() -> Result<(), String> {
    for path in std::env::args().skip(1) {
        let plan = outcore::load_plan(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
        let graph = outcore::graph_of_plan(&plan).map_err(|e| e.to_string())?;
        let t0 = std::time::Instant::now();
        let layout = outcore_plan::lay_out(&plan, &graph).map_err(|e| e.to_string())?;
        eprintln!(
            "{path}: height {} bound {} budget {} height/bound {:.4} buffers {} in {:.2} s",
            layout.config.height_bytes,
            layout.bound_bytes,
            plan.budget_bytes,
            layout.overhead(),
            layout.buffers,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
