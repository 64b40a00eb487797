//! Evaluations per second of CPU time on the benchmark's schedules, for quick
//! comparisons on a busy machine (CPU time, unlike wall time, does not count
//! time spent waiting for a core). The criterion benchmark `benches/evaluate.rs`
//! is the reference; run this with
//! `cargo run --release -p outcore-eval --example eval_rate -- [resnet50|nasnet] [N] [alternate]`.
//! With `alternate`, every other evaluation scores the same decisions in a
//! random topological order, so no evaluation finds its order cached.

// An example prints its measurement; the workspace lint is for library code.
#![allow(clippy::print_stdout)]

use outcore_cost::{DeviceProfile, RooflineModel};
use outcore_eval::testing::{mixed_schedule, random_decisions, random_topological_order};
use outcore_eval::{Evaluator, Scratch};
use outcore_graph::{footprint, zoo};
use outcore_plan::{AllocatorSpec, Schedule};
use std::collections::BTreeMap;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("resnet50", String::as_str);
    let n: u32 = args.get(2).map_or(Ok(2000), |s| s.parse())?;
    let (name, batch, knobs): (&str, u64, BTreeMap<String, u64>) = match which {
        "nasnet" => ("nasnet", 8, [("repeats".to_string(), 25)].into()),
        _ => ("resnet50", 256, BTreeMap::new()),
    };
    let g = zoo::build(name, Some(batch), &knobs, None)?;
    let cost = RooflineModel::new(DeviceProfile::builtin("v100-16gb-pcie3")?);
    let schedule = mixed_schedule(
        &g,
        Schedule::in_graph_order(&g).order,
        &random_decisions(64, 7),
    );
    let alternate = args.get(3).map(String::as_str) == Some("alternate");
    let other = mixed_schedule(
        &g,
        random_topological_order(&g, 7),
        &random_decisions(64, 7),
    );
    let schedules = if alternate {
        [&schedule, &other]
    } else {
        [&schedule, &schedule]
    };
    let evaluator = Evaluator::new(&g, &cost, footprint(&g).0 / 2, AllocatorSpec::Perfect);
    let mut scratch = Scratch::default();
    let mut checksum = 0.0;
    let cpu0 = cpu_time_s();
    let wall = Instant::now();
    for i in 0..n {
        checksum += evaluator
            .evaluate(schedules[i as usize % 2], &mut scratch)
            .iter_time_s()
            .unwrap_or(0.0);
    }
    let cpu_s = cpu_time_s() - cpu0;
    println!(
        "{which}: {n} evaluations, {:.1} us CPU each ({:.0}/s), {:.1} us wall each; checksum {checksum:.3}",
        cpu_s / n as f64 * 1e6,
        n as f64 / cpu_s,
        wall.elapsed().as_secs_f64() / n as f64 * 1e6
    );
    Ok(())
}

/// User + system CPU seconds of this process, from /proc/self/stat (Linux).
fn cpu_time_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}
