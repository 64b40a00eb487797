//! When every step of a plan ran, read back from the simulator's Chrome trace
//! and start order, and the figure of the three streams (compute, h2d, d2h)
//! with the compute stream's stalls highlighted.
//!
//! The simulator's trace has one span per timed step (kernels and copies) in
//! the order each stream ran them, and `start_order` lists every step as it
//! started. A `Free` takes no time and has no span: it happens as soon as the
//! previous step of its stream ended and every step it waits for ended, which
//! is exactly when the simulator starts it, so its time is recomputed here
//! from those ends rather than guessed.

use super::svg::{Svg, num, ticks};
use crate::{Error, Result};
use outcore_graph::Graph;
use outcore_plan::{Instr, Plan, StepRef};
use serde_json::Value;

/// Start and end of every step of the plan, by stream and index.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimes {
    pub start_s: [Vec<f64>; 3],
    pub end_s: [Vec<f64>; 3],
    /// Every step in the order the simulator started it.
    pub start_order: Vec<StepRef>,
    pub iter_time_s: f64,
}

/// A step's label: the op it runs or the tensor it moves or frees.
pub fn step_name(graph: &Graph, instr: &Instr) -> String {
    match instr {
        Instr::Compute(op) => graph.op(*op).name.clone(),
        Instr::Recompute { op, .. } => format!("recompute {}", graph.op(*op).name),
        Instr::SwapIn(t) => format!("swap-in {}", graph.tensor(*t).name),
        Instr::SwapOut(t) => format!("swap-out {}", graph.tensor(*t).name),
        Instr::Free(t) => format!("free {}", graph.tensor(*t).name),
    }
}

fn trace_error(problem: &str) -> Error {
    Error::invalid(
        "simulator trace",
        "(recorded for the report)",
        problem.to_string(),
        "one span per timed step of the plan; this is a bug in the report or the simulator, please report it",
    )
}

/// The spans of the trace per stream, as (start, duration) in seconds,
/// in the order each stream ran them.
fn trace_spans(trace: &Value) -> Result<[Vec<(f64, f64)>; 3]> {
    let events = trace["traceEvents"]
        .as_array()
        .ok_or_else(|| trace_error("no traceEvents array"))?;
    let mut spans: [Vec<(f64, f64)>; 3] = Default::default();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let stream = e["tid"].as_u64().unwrap_or(u64::MAX) as usize;
        let (Some(ts), Some(dur)) = (e["ts"].as_f64(), e["dur"].as_f64()) else {
            return Err(trace_error("a span without ts or dur"));
        };
        spans
            .get_mut(stream)
            .ok_or_else(|| trace_error("a span on a stream other than 0, 1, 2"))?
            .push((ts * 1e-6, dur * 1e-6));
    }
    for s in &mut spans {
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(spans)
}

/// Every step's start and end: timed steps from the trace, frees from the
/// ends of what precedes them (see the module doc).
pub fn step_times(
    plan: &Plan,
    trace: &Value,
    start_order: &[StepRef],
    iter_time_s: f64,
) -> Result<StepTimes> {
    let spans = trace_spans(trace)?;
    let mut next_span = [0usize; 3];
    let n = |s: usize| plan.streams[s].len();
    let mut start_s = [
        vec![f64::NAN; n(0)],
        vec![f64::NAN; n(1)],
        vec![f64::NAN; n(2)],
    ];
    let mut end_s = start_s.clone();
    let mut prev_end_s = [0.0f64; 3];
    for at in start_order {
        let s = at.stream.index();
        let i = at.index as usize;
        let step = plan.streams[s]
            .get(i)
            .ok_or_else(|| trace_error("a started step the plan lacks"))?;
        let (start, end) = if let Instr::Free(_) = step.instr {
            let mut t = prev_end_s[s];
            for w in &step.waits {
                let e = end_s[w.stream.index()]
                    .get(w.index as usize)
                    .copied()
                    .unwrap_or(f64::NAN);
                t = t.max(e);
            }
            (t, t)
        } else {
            let &(t, d) = spans[s]
                .get(next_span[s])
                .ok_or_else(|| trace_error("fewer spans than timed steps"))?;
            next_span[s] += 1;
            (t, t + d)
        };
        start_s[s][i] = start;
        end_s[s][i] = end;
        prev_end_s[s] = end;
    }
    if (0..3).any(|s| next_span[s] != spans[s].len()) {
        return Err(trace_error("more spans than timed steps"));
    }
    Ok(StepTimes {
        start_s,
        end_s,
        start_order: start_order.to_vec(),
        iter_time_s,
    })
}

/// An interval in which the compute stream runs nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Stall {
    pub start_s: f64,
    pub end_s: f64,
    /// The compute step that ends the stall and the step it waited for last.
    pub before: String,
    pub waiting_for: Option<String>,
}

/// The compute stream's idle intervals within the iteration (gaps shorter
/// than a billionth of the iteration are rounding, not stalls).
pub fn stalls(graph: &Graph, plan: &Plan, times: &StepTimes) -> Vec<Stall> {
    let eps = 1e-9 * times.iter_time_s.max(1e-12);
    let mut out = Vec::new();
    let mut busy_until_s = 0.0f64;
    for (i, step) in plan.streams[0].iter().enumerate() {
        if matches!(step.instr, Instr::Free(_)) {
            continue;
        }
        let start = times.start_s[0][i];
        if start > busy_until_s + eps {
            let waiting_for = step
                .waits
                .iter()
                .filter(|w| w.stream.index() != 0)
                .max_by(|a, b| {
                    let e = |w: &&StepRef| times.end_s[w.stream.index()][w.index as usize];
                    e(a).total_cmp(&e(b))
                })
                .map(|w| {
                    step_name(
                        graph,
                        &plan.streams[w.stream.index()][w.index as usize].instr,
                    )
                });
            out.push(Stall {
                start_s: busy_until_s,
                end_s: start,
                before: step_name(graph, &step.instr),
                waiting_for,
            });
        }
        busy_until_s = busy_until_s.max(times.end_s[0][i]);
    }
    if times.iter_time_s > busy_until_s + eps {
        out.push(Stall {
            start_s: busy_until_s,
            end_s: times.iter_time_s,
            before: "the end of the iteration".into(),
            waiting_for: None,
        });
    }
    out
}

const WIDTH_PX: f64 = 1200.0;
const LEFT_PX: f64 = 90.0;
const RIGHT_PX: f64 = 20.0;
const LANE_PX: f64 = 34.0;
const TOP_PX: f64 = 30.0;
/// Spans narrower than this are merged with their thin neighbours into one
/// rectangle (its hover text counts them), so ResNet-50's thousands of short
/// kernels do not cost a rectangle each where none could be seen or hovered.
const MIN_RECT_PX: f64 = 0.75;

const STREAM_LABELS: [&str; 3] = ["compute", "h2d (in)", "d2h (out)"];
const STREAM_COLORS: [&str; 3] = ["#4e79a7", "#59a14f", "#f28e2b"];

/// A run of thin spans being merged into one rectangle.
struct Merge {
    x0: f64,
    x1: f64,
    count: usize,
    first: String,
    last: String,
    start_s: f64,
    end_s: f64,
}

fn fmt_ms(t_s: f64) -> String {
    format!("{:.3} ms", t_s * 1e3)
}

fn flush(svg: &mut Svg, merge: &mut Option<Merge>, y: f64, color: &str) {
    if let Some(m) = merge.take() {
        let title = if m.count == 1 {
            format!("{}: {} to {}", m.first, fmt_ms(m.start_s), fmt_ms(m.end_s))
        } else {
            format!(
                "{} steps, {} ... {}: {} to {}",
                m.count,
                m.first,
                m.last,
                fmt_ms(m.start_s),
                fmt_ms(m.end_s)
            )
        };
        svg.rect(
            m.x0,
            y,
            (m.x1 - m.x0).max(MIN_RECT_PX),
            LANE_PX - 8.0,
            color,
            Some(&title),
        );
    }
}

/// The figure: one lane per stream, a rectangle per timed step (thin ones
/// merged), stalls of the compute stream in red under its lane.
pub fn render(graph: &Graph, plan: &Plan, times: &StepTimes, stalls: &[Stall]) -> String {
    let height = TOP_PX + 3.0 * LANE_PX + 24.0 + 40.0;
    let mut svg = Svg::new(WIDTH_PX, height);
    let span_s = times.iter_time_s.max(1e-12);
    let plot_w = WIDTH_PX - LEFT_PX - RIGHT_PX;
    let x = |t: f64| LEFT_PX + t / span_s * plot_w;
    svg.text(LEFT_PX, 18.0, 14.0, "start", "Streams over one iteration (hover a bar for its op or tensor and times; red: compute stalls)");
    for s in 0..3 {
        let y = TOP_PX + s as f64 * LANE_PX;
        svg.text(
            LEFT_PX - 6.0,
            y + LANE_PX / 2.0,
            12.0,
            "end",
            STREAM_LABELS[s],
        );
        svg.rect(LEFT_PX, y, plot_w, LANE_PX - 8.0, "#f4f4f4", None);
        if s == 0 {
            for st in stalls {
                let title = match &st.waiting_for {
                    Some(w) => format!(
                        "stall {} ({} to {}) before {}, waiting for {}",
                        fmt_ms(st.end_s - st.start_s),
                        fmt_ms(st.start_s),
                        fmt_ms(st.end_s),
                        st.before,
                        w
                    ),
                    None => format!(
                        "stall {} ({} to {}) before {}",
                        fmt_ms(st.end_s - st.start_s),
                        fmt_ms(st.start_s),
                        fmt_ms(st.end_s),
                        st.before
                    ),
                };
                let w = (x(st.end_s) - x(st.start_s)).max(MIN_RECT_PX);
                svg.rect(x(st.start_s), y, w, LANE_PX - 8.0, "#e15759", Some(&title));
            }
        }
        let mut merge: Option<Merge> = None;
        for (i, step) in plan.streams[s].iter().enumerate() {
            if matches!(step.instr, Instr::Free(_)) {
                continue;
            }
            let (t0, t1) = (times.start_s[s][i], times.end_s[s][i]);
            let (x0, x1) = (x(t0), x(t1));
            let name = step_name(graph, &step.instr);
            // Only thin spans join, and only a group still too thin to see.
            let joins = x1 - x0 < MIN_RECT_PX
                && merge
                    .as_ref()
                    .is_some_and(|m| x0 - m.x1 < MIN_RECT_PX && m.x1 - m.x0 < MIN_RECT_PX);
            if joins {
                if let Some(m) = merge.as_mut() {
                    m.x1 = x1;
                    m.count += 1;
                    m.last = name;
                    m.end_s = t1;
                }
                continue;
            }
            flush(&mut svg, &mut merge, y, STREAM_COLORS[s]);
            merge = Some(Merge {
                x0,
                x1,
                count: 1,
                first: name.clone(),
                last: name,
                start_s: t0,
                end_s: t1,
            });
        }
        flush(&mut svg, &mut merge, y, STREAM_COLORS[s]);
    }
    let axis_y = TOP_PX + 3.0 * LANE_PX;
    for t in ticks(span_s * 1e3, 10) {
        let px = x(t * 1e-3);
        svg.line(px, axis_y - 4.0, px, axis_y + 2.0, "#333", false);
        svg.text(px, axis_y + 16.0, 11.0, "middle", &num(t));
    }
    svg.text(
        LEFT_PX + plot_w / 2.0,
        axis_y + 34.0,
        12.0,
        "middle",
        "time in the iteration (ms)",
    );
    svg.finish()
}
