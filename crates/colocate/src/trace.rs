//! A Chrome trace (Trace Event JSON, opens in Perfetto) of a multi-job run: one
//! process (track group) per job with a track per stream, and one "device"
//! process with the global live-bytes counter. Times are seconds from the
//! run's start (time 0), in microseconds in the file.

use outcore_graph::Graph;
use outcore_plan::{Plan, Program, StepInstr, StepRef};
use serde_json::{Value, json};

const STREAM_NAMES: [&str; 3] = ["compute", "h2d (swap-in)", "d2h (swap-out)"];

/// Accumulates the events of a run.
#[derive(Debug, Default)]
pub(crate) struct JobTrace {
    events: Vec<Value>,
    last_memory: Option<u64>,
}

/// The label of a step: its op, or what it copies.
fn label(graph: &Graph, plan: &Plan, at: StepRef) -> String {
    match plan.instr(at.stream, at.index as usize) {
        StepInstr::Compute(op) => graph.op(op).name.clone(),
        StepInstr::Recompute { op, .. } => format!("recompute {}", graph.op(op).name),
        StepInstr::SwapIn(t) => format!("swap-in {}", graph.tensor(t).name),
        StepInstr::SwapOut(t) => format!("swap-out {}", graph.tensor(t).name),
        StepInstr::Free(t) => format!("free {}", graph.tensor(t).name),
    }
}

impl JobTrace {
    /// A finished step of job `job` (pid `job + 1`) on its stream's track.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn span(
        &mut self,
        job: usize,
        graph: &Graph,
        plan: &Plan,
        at: StepRef,
        iteration: usize,
        start_s: f64,
        dur_s: f64,
    ) {
        self.events.push(json!({
            "name": label(graph, plan, at),
            "ph": "X",
            "pid": job + 1,
            "tid": at.stream.index(),
            "ts": start_s * 1e6,
            "dur": dur_s * 1e6,
            "args": { "iteration": iteration },
        }));
    }

    /// A sample of the global live bytes (skipped when unchanged).
    pub(crate) fn memory(&mut self, at_s: f64, live_bytes: u64) {
        if self.last_memory == Some(live_bytes) {
            return;
        }
        self.last_memory = Some(live_bytes);
        self.events.push(json!({
            "name": "device memory (all jobs)",
            "ph": "C",
            "pid": 0,
            "ts": at_s * 1e6,
            "args": { "live_bytes": live_bytes },
        }));
    }

    /// The `{"traceEvents": [...]}` document, with the jobs' names.
    pub(crate) fn finish(mut self, names: &[&str]) -> Value {
        let mut meta = vec![json!({
            "name": "process_name", "ph": "M", "pid": 0,
            "args": { "name": "device" },
        })];
        for (j, name) in names.iter().enumerate() {
            meta.push(json!({
                "name": "process_name", "ph": "M", "pid": j + 1,
                "args": { "name": format!("job {name}") },
            }));
            for (tid, stream) in STREAM_NAMES.iter().enumerate() {
                meta.push(json!({
                    "name": "thread_name", "ph": "M", "pid": j + 1, "tid": tid,
                    "args": { "name": stream },
                }));
            }
        }
        meta.append(&mut self.events);
        json!({ "traceEvents": meta, "displayTimeUnit": "ms" })
    }
}
