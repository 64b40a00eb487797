//! Device memory over one iteration, by tensor kind, rebuilt from the plan and
//! the step times the simulator reported (see `timeline.rs`), and its figure:
//! stacked areas, the budget line, the peak with the ops around it and the
//! largest tensors resident there.
//!
//! The memory effects mirror the simulator's: at the start of the iteration
//! the persistent tensors not on the host and the batch inputs are allocated;
//! a step allocates as it starts (an op's storage-owning outputs and its
//! workspace, a recomputation's kept outputs, the other outputs and the
//! workspace as scratch; a swap-in its tensor), a `Free` releases its tensor,
//! and scratch is released when its step ends. The curve's maximum is checked
//! against the simulator's peak in tests, so the two cannot drift apart
//! silently.

use super::svg::{Svg, num, ticks};
use super::timeline::{StepTimes, step_name};
use outcore_graph::{Graph, TensorId, TensorKind};
use outcore_plan::{Instr, Plan, PreparedGraph, Residency, fmt_bytes};

/// The kinds the figure stacks, bottom to top.
pub const KINDS: [&str; 5] = [
    "parameters",
    "optimizer state",
    "activations",
    "gradients",
    "temporaries",
];
const KIND_COLORS: [&str; 5] = ["#4e79a7", "#b07aa1", "#59a14f", "#f28e2b", "#bab0ac"];

/// Which stacked kind a tensor counts as (buffers count as parameters: both
/// are the model's persistent state; inputs, labels and the loss as
/// activations: forward values of the batch).
pub fn kind_index(kind: TensorKind) -> usize {
    match kind {
        TensorKind::Parameter | TensorKind::Buffer => 0,
        TensorKind::OptimizerState => 1,
        TensorKind::Activation | TensorKind::Input | TensorKind::Label | TensorKind::Loss => 2,
        TensorKind::ParameterGradient | TensorKind::Gradient => 3,
        TensorKind::Temporary => 4,
    }
}

/// Live bytes by kind from `time_s` until the next sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub time_s: f64,
    pub bytes_by_kind: [u64; 5],
}

impl Sample {
    pub fn total_bytes(&self) -> u64 {
        self.bytes_by_kind.iter().sum()
    }
}

/// The memory curve and what is resident at its peak.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryCurve {
    pub samples: Vec<Sample>,
    pub peak_bytes: u64,
    pub peak_time_s: f64,
    /// The step whose start reached the peak.
    pub peak_step: Option<String>,
    /// Compute steps around the peak (two before, the one running, two after).
    pub ops_around_peak: Vec<String>,
    /// The largest tensors resident at the peak, largest first, with their size.
    pub largest_at_peak: Vec<(String, u64)>,
    pub budget_bytes: u64,
}

/// How many resident tensors the figure lists at the peak.
const LARGEST_LISTED: usize = 8;

/// The live set as steps run.
struct Live<'a> {
    graph: &'a Graph,
    bytes_by_kind: [u64; 5],
    resident: Vec<bool>,
}

impl Live<'_> {
    fn alloc(&mut self, t: TensorId, size: u64) {
        self.bytes_by_kind[kind_index(self.graph.tensor(t).kind)] += size;
        self.resident[t.index()] = true;
    }

    fn free(&mut self, t: TensorId, size: u64) {
        let k = kind_index(self.graph.tensor(t).kind);
        self.bytes_by_kind[k] = self.bytes_by_kind[k].saturating_sub(size);
        self.resident[t.index()] = false;
    }

    fn largest(&self, pg: &PreparedGraph) -> Vec<(String, u64)> {
        let mut v: Vec<(u64, usize)> = (0..self.resident.len())
            .filter(|&i| self.resident[i])
            .map(|i| (pg.size_bytes[i], i))
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.iter()
            .take(LARGEST_LISTED)
            .map(|&(size, i)| (self.graph.tensors[i].name.clone(), size))
            .collect()
    }
}

/// Allocations of a step as it starts: (tensors allocated, scratch bytes).
fn step_allocations(pg: &PreparedGraph, instr: &Instr) -> (Vec<TensorId>, u64) {
    match instr {
        Instr::Compute(op) => (
            pg.op_allocated(*op).to_vec(),
            pg.workspace_bytes[op.index()],
        ),
        Instr::Recompute { op, outputs } => {
            let mut scratch = pg.workspace_bytes[op.index()];
            let mut kept = Vec::new();
            for &o in pg.op_allocated(*op) {
                match outputs.contains(&o) {
                    true => kept.push(o),
                    false => scratch += pg.size_bytes[o.index()],
                }
            }
            (kept, scratch)
        }
        Instr::SwapIn(t) => (vec![*t], 0),
        Instr::SwapOut(_) | Instr::Free(_) => (Vec::new(), 0),
    }
}

/// Rebuilds live bytes by kind over the iteration (see the module doc).
pub fn memory_curve(graph: &Graph, plan: &Plan, times: &StepTimes) -> MemoryCurve {
    let pg = PreparedGraph::new(graph);
    let mut live = Live {
        graph,
        bytes_by_kind: [0; 5],
        resident: vec![false; pg.n_tensors()],
    };
    let on_host: Vec<TensorId> = plan
        .initial_residency
        .iter()
        .filter(|(_, r)| *r == Residency::Host)
        .map(|(t, _)| *t)
        .collect();
    for &t in &pg.persistent_ids {
        if !on_host.contains(&t) {
            live.alloc(t, pg.size_bytes[t.index()]);
        }
    }
    for i in (0..pg.n_tensors()).filter(|&i| pg.batch_input[i] && pg.allocates[i]) {
        live.alloc(TensorId(i as u32), pg.size_bytes[i]);
    }
    let mut curve = MemoryCurve {
        samples: vec![Sample {
            time_s: 0.0,
            bytes_by_kind: live.bytes_by_kind,
        }],
        peak_bytes: live.bytes_by_kind.iter().sum(),
        peak_time_s: 0.0,
        peak_step: None,
        ops_around_peak: Vec::new(),
        largest_at_peak: live.largest(&pg),
        budget_bytes: plan.budget_bytes,
    };
    // Scratch to release: (end time, bytes), released before any step that
    // starts at or after its end, as the simulator finishes steps first.
    let mut pending: Vec<(f64, u64)> = Vec::new();
    let eps = 1e-9 * times.iter_time_s.max(1e-12);
    let temporaries = kind_index(TensorKind::Temporary);
    for at in &times.start_order {
        let (s, i) = (at.stream.index(), at.index as usize);
        let instr = &plan.streams[s][i].instr;
        let start = times.start_s[s][i];
        pending.sort_by(|a, b| a.0.total_cmp(&b.0));
        let done = pending.iter().take_while(|p| p.0 <= start + eps).count();
        for (end, bytes) in pending.drain(..done) {
            live.bytes_by_kind[temporaries] -= bytes;
            curve.samples.push(Sample {
                time_s: end,
                bytes_by_kind: live.bytes_by_kind,
            });
        }
        if let Instr::Free(t) = instr {
            live.free(*t, pg.size_bytes[t.index()]);
        }
        let (tensors, scratch) = step_allocations(&pg, instr);
        for t in tensors {
            live.alloc(t, pg.size_bytes[t.index()]);
        }
        if scratch > 0 {
            live.bytes_by_kind[temporaries] += scratch;
            pending.push((times.end_s[s][i], scratch));
        }
        let total: u64 = live.bytes_by_kind.iter().sum();
        if total > curve.peak_bytes {
            curve.peak_bytes = total;
            curve.peak_time_s = start;
            curve.peak_step = Some(step_name(graph, instr));
            curve.largest_at_peak = live.largest(&pg);
        }
        curve.samples.push(Sample {
            time_s: start,
            bytes_by_kind: live.bytes_by_kind,
        });
    }
    pending.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (end, bytes) in pending {
        live.bytes_by_kind[temporaries] -= bytes;
        curve.samples.push(Sample {
            time_s: end,
            bytes_by_kind: live.bytes_by_kind,
        });
    }
    curve.ops_around_peak = ops_around(graph, plan, times, curve.peak_time_s);
    curve
}

/// Names of the compute steps around `time_s`: two before the one running
/// (or next to run) then, it, and two after.
fn ops_around(graph: &Graph, plan: &Plan, times: &StepTimes, time_s: f64) -> Vec<String> {
    let timed: Vec<usize> = (0..plan.streams[0].len())
        .filter(|&i| !matches!(plan.streams[0][i].instr, Instr::Free(_)))
        .collect();
    let Some(pos) = timed
        .iter()
        .position(|&i| times.end_s[0][i] > time_s)
        .or(timed.len().checked_sub(1))
    else {
        return Vec::new();
    };
    timed[pos.saturating_sub(2)..(pos + 3).min(timed.len())]
        .iter()
        .map(|&i| {
            let mark = if timed[pos] == i {
                " (at the peak)"
            } else {
                ""
            };
            format!("{}{mark}", step_name(graph, &plan.streams[0][i].instr))
        })
        .collect()
}

/// At most about two samples per pixel column: in each column the sample of
/// the largest total is kept (so the peak survives downsampling), in time order.
pub fn downsample(samples: &[Sample], iter_time_s: f64, columns: usize) -> Vec<Sample> {
    if samples.len() <= 2 * columns || columns == 0 {
        return samples.to_vec();
    }
    let span = iter_time_s.max(1e-12);
    let mut best: Vec<Option<Sample>> = vec![None; columns];
    for s in samples {
        let c = ((s.time_s / span * columns as f64) as usize).min(columns - 1);
        if best[c].is_none_or(|b| s.total_bytes() > b.total_bytes()) {
            best[c] = Some(*s);
        }
    }
    best.into_iter().flatten().collect()
}

const WIDTH_PX: f64 = 1200.0;
const HEIGHT_PX: f64 = 420.0;
const LEFT_PX: f64 = 80.0;
const RIGHT_PX: f64 = 300.0;
const TOP_PX: f64 = 30.0;
const BOTTOM_PX: f64 = 50.0;

/// The figure (see the module doc).
pub fn render(curve: &MemoryCurve, iter_time_s: f64) -> String {
    let mut svg = Svg::new(WIDTH_PX, HEIGHT_PX);
    let plot_w = WIDTH_PX - LEFT_PX - RIGHT_PX;
    let plot_h = HEIGHT_PX - TOP_PX - BOTTOM_PX;
    let max_bytes = (curve.peak_bytes.max(curve.budget_bytes) as f64 * 1.08).max(1.0);
    let span_s = iter_time_s.max(1e-12);
    let x = |t: f64| LEFT_PX + (t / span_s).clamp(0.0, 1.0) * plot_w;
    let y = |b: f64| TOP_PX + plot_h - b / max_bytes * plot_h;
    svg.text(
        LEFT_PX,
        18.0,
        14.0,
        "start",
        "Device memory over one iteration, live bytes by tensor kind",
    );
    let samples = downsample(&curve.samples, iter_time_s, plot_w as usize);
    // Stacked step areas: each kind between the cumulative sum below it and
    // the sum including it, drawn as one polygon per kind.
    let mut below = vec![0u64; samples.len()];
    for (k, color) in KIND_COLORS.iter().enumerate() {
        let mut top = Vec::with_capacity(samples.len() * 2);
        let mut bottom = Vec::with_capacity(samples.len() * 2);
        for (j, s) in samples.iter().enumerate() {
            let next_t = samples.get(j + 1).map_or(iter_time_s, |n| n.time_s);
            let lo = below[j] as f64;
            let hi = (below[j] + s.bytes_by_kind[k]) as f64;
            top.push((x(s.time_s), y(hi)));
            top.push((x(next_t), y(hi)));
            bottom.push((x(s.time_s), y(lo)));
            bottom.push((x(next_t), y(lo)));
            below[j] += s.bytes_by_kind[k];
        }
        bottom.reverse();
        top.extend(bottom);
        let kind_peak = samples
            .iter()
            .map(|s| s.bytes_by_kind[k])
            .max()
            .unwrap_or(0);
        let title = format!("{}: up to {}", KINDS[k], fmt_bytes(kind_peak));
        svg.polygon(&top, color, Some(&title));
    }
    axes(&mut svg, max_bytes, span_s, plot_w, plot_h);
    let budget_y = y(curve.budget_bytes as f64);
    svg.line(
        LEFT_PX,
        budget_y,
        LEFT_PX + plot_w,
        budget_y,
        "#d62728",
        true,
    );
    svg.text(
        LEFT_PX + plot_w - 4.0,
        budget_y - 5.0,
        11.0,
        "end",
        &format!("budget {}", fmt_bytes(curve.budget_bytes)),
    );
    let peak_title = format!(
        "peak {} at {:.3} ms{}",
        fmt_bytes(curve.peak_bytes),
        curve.peak_time_s * 1e3,
        curve
            .peak_step
            .as_ref()
            .map(|s| format!(", as {s} starts"))
            .unwrap_or_default()
    );
    svg.circle(
        x(curve.peak_time_s),
        y(curve.peak_bytes as f64),
        5.0,
        "#d62728",
        Some(&peak_title),
    );
    side_panel(&mut svg, curve, &peak_title);
    svg.finish()
}

/// The byte unit of the axis: the largest binary unit the axis reaches.
fn byte_unit(max_bytes: f64) -> (f64, &'static str) {
    [(30, "GiB"), (20, "MiB"), (10, "KiB")]
        .into_iter()
        .map(|(shift, name)| ((1u64 << shift) as f64, name))
        .find(|(unit, _)| max_bytes >= *unit)
        .unwrap_or((1.0, "B"))
}

fn axes(svg: &mut Svg, max_bytes: f64, span_s: f64, plot_w: f64, plot_h: f64) {
    let base_y = TOP_PX + plot_h;
    let (unit, unit_name) = byte_unit(max_bytes);
    svg.line(LEFT_PX, base_y, LEFT_PX + plot_w, base_y, "#333", false);
    svg.line(LEFT_PX, TOP_PX, LEFT_PX, base_y, "#333", false);
    for g in ticks(max_bytes / unit, 6) {
        let py = base_y - g * unit / max_bytes * plot_h;
        svg.line(LEFT_PX - 4.0, py, LEFT_PX, py, "#333", false);
        svg.text(LEFT_PX - 6.0, py + 4.0, 11.0, "end", &num(g));
    }
    svg.text(16.0, TOP_PX + plot_h / 2.0, 12.0, "start", unit_name);
    for t in ticks(span_s * 1e3, 8) {
        let px = LEFT_PX + t * 1e-3 / span_s * plot_w;
        svg.line(px, base_y, px, base_y + 4.0, "#333", false);
        svg.text(px, base_y + 16.0, 11.0, "middle", &num(t));
    }
    svg.text(
        LEFT_PX + plot_w / 2.0,
        base_y + 36.0,
        12.0,
        "middle",
        "time in the iteration (ms)",
    );
}

/// `text` cut to `max_chars` (the side panel is 300 px wide; the full text
/// is in the peak marker's hover title).
fn clip(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// Legend, the peak, the ops around it and the largest resident tensors.
fn side_panel(svg: &mut Svg, curve: &MemoryCurve, peak_title: &str) {
    let x0 = WIDTH_PX - RIGHT_PX + 16.0;
    let mut yy = TOP_PX + 4.0;
    for (k, color) in KIND_COLORS.iter().enumerate().rev() {
        svg.rect(x0, yy - 9.0, 10.0, 10.0, color, None);
        svg.text(x0 + 16.0, yy, 11.0, "start", KINDS[k]);
        yy += 15.0;
    }
    yy += 8.0;
    svg.text(x0, yy, 11.0, "start", &clip(peak_title, 48));
    yy += 18.0;
    svg.text(x0, yy, 11.0, "start", "compute ops around the peak:");
    for op in &curve.ops_around_peak {
        yy += 14.0;
        svg.text(x0 + 8.0, yy, 10.0, "start", &clip(op, 52));
    }
    yy += 20.0;
    svg.text(
        x0,
        yy,
        11.0,
        "start",
        "largest tensors resident at the peak:",
    );
    for (name, size) in &curve.largest_at_peak {
        yy += 14.0;
        svg.text(
            x0 + 8.0,
            yy,
            10.0,
            "start",
            &format!("{} {name}", fmt_bytes(*size)),
        );
    }
}
