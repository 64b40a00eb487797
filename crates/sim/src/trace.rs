//! Chrome Trace Event JSON: one track per stream and a device-memory counter track;
//! opens in Perfetto (ui.perfetto.dev) and chrome://tracing.

use serde_json::{Value, json};

/// Accumulates trace events; times are seconds from the iteration start.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    events: Vec<Value>,
    last_memory: Option<u64>,
}

const STREAM_NAMES: [&str; 3] = ["compute", "h2d (swap-in)", "d2h (swap-out)"];

impl TraceBuilder {
    pub fn new() -> Self {
        TraceBuilder::default()
    }

    /// A complete span on stream track `stream` (0 compute, 1 h2d, 2 d2h).
    pub fn span(&mut self, stream: usize, name: &str, start_s: f64, dur_s: f64, op: Option<u32>) {
        self.events.push(json!({
            "name": name,
            "ph": "X",
            "pid": 1,
            "tid": stream,
            "ts": start_s * 1e6,
            "dur": dur_s * 1e6,
            "args": { "op": op },
        }));
    }

    /// A device-memory counter sample (skipped when unchanged).
    pub fn memory(&mut self, at_s: f64, live_bytes: u64) {
        if self.last_memory == Some(live_bytes) {
            return;
        }
        self.last_memory = Some(live_bytes);
        self.events.push(json!({
            "name": "device memory",
            "ph": "C",
            "pid": 1,
            "ts": at_s * 1e6,
            "args": { "live_bytes": live_bytes },
        }));
    }

    /// The finished `{"traceEvents": [...]}` document.
    pub fn finish(mut self, model: &str) -> Value {
        let mut meta = vec![json!({
            "name": "process_name", "ph": "M", "pid": 1,
            "args": { "name": format!("outcore simulation: {model}") },
        })];
        for (tid, name) in STREAM_NAMES.iter().enumerate() {
            meta.push(json!({
                "name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                "args": { "name": name },
            }));
        }
        meta.append(&mut self.events);
        json!({ "traceEvents": meta, "displayTimeUnit": "ms" })
    }
}
