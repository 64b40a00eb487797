//! The planner comparison figure from `outcore compare --json` output: for
//! each budget, each planner's throughput against the ideal (unlimited
//! memory), and the best throughput any plan could reach there (the ideal
//! time over the lower bound, `Comparison.lower_bound`), where it exists.

use super::svg::{Svg, num, ticks};
use crate::{Error, Result};
use serde_json::Value;

/// One planner's result at one budget.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareRow {
    pub planner: String,
    /// `feasible`, `infeasible` or `not_runnable`.
    pub status: String,
    pub throughput_vs_ideal: Option<f64>,
    pub iter_time_s: Option<f64>,
    pub reason: Option<String>,
}

/// One `compare` run: one model, device and budget.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareRun {
    pub model: String,
    pub batch: u64,
    pub device: String,
    pub budget_bytes: u64,
    pub footprint_bytes: u64,
    pub ideal_time_s: f64,
    /// The lower bound's time, `None` when no plan exists at this budget.
    pub lower_bound_s: Option<f64>,
    pub rows: Vec<CompareRow>,
}

impl CompareRun {
    /// The throughput no plan can beat here: ideal time over the bound.
    pub fn best_possible_throughput(&self) -> Option<f64> {
        self.lower_bound_s
            .filter(|b| *b > 0.0)
            .map(|b| (self.ideal_time_s / b).min(1.0))
    }
}

fn bad(origin: &str, field: &str, problem: &str) -> Error {
    Error::invalid(
        format!("compare output {origin}"),
        field.to_string(),
        problem.to_string(),
        "the JSON printed by `outcore compare --json` (one object, or an array of them); rerun compare with --json and pass that file",
    )
}

fn field<'a>(v: &'a Value, name: &str, origin: &str) -> Result<&'a Value> {
    v.get(name)
        .filter(|x| !x.is_null())
        .ok_or_else(|| bad(origin, name, "missing"))
}

fn positive(v: &Value, name: &str, origin: &str) -> Result<f64> {
    let x = field(v, name, origin)?
        .as_f64()
        .ok_or_else(|| bad(origin, name, "not a number"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err(bad(
            origin,
            name,
            &format!("{x} is not a positive finite number"),
        ));
    }
    Ok(x)
}

fn parse_row(r: &Value, origin: &str) -> Result<CompareRow> {
    let text = |name: &str| r.get(name).and_then(Value::as_str).map(str::to_string);
    // The CLI prints the report's numbers flat in each row; the facade's
    // `Comparison` (e.g. serialised by the Python package) nests them in
    // `report`: both are read.
    let number = |name: &str| {
        r.get(name)
            .or_else(|| r.get("report").and_then(|rep| rep.get(name)))
            .and_then(Value::as_f64)
    };
    let throughput = number("throughput_vs_ideal");
    if let Some(t) = throughput
        && !(t.is_finite() && t >= 0.0)
    {
        return Err(bad(
            origin,
            "throughput_vs_ideal",
            &format!("{t} is not in [0, inf)"),
        ));
    }
    Ok(CompareRow {
        planner: text("planner").ok_or_else(|| bad(origin, "results[].planner", "missing"))?,
        status: text("status").ok_or_else(|| bad(origin, "results[].status", "missing"))?,
        throughput_vs_ideal: throughput,
        iter_time_s: number("iter_time_s"),
        reason: text("reason"),
    })
}

fn parse_run(v: &Value, origin: &str) -> Result<CompareRun> {
    let whole = |name: &str| -> Result<u64> {
        field(v, name, origin)?
            .as_u64()
            .ok_or_else(|| bad(origin, name, "not a whole number of bytes"))
    };
    let text = |name: &str| -> Result<String> {
        Ok(field(v, name, origin)?
            .as_str()
            .ok_or_else(|| bad(origin, name, "not a string"))?
            .to_string())
    };
    let bound = field(v, "lower_bound", origin)?;
    let lower_bound_s = match (bound.get("Time"), bound.get("NoPlan")) {
        (Some(t), _) => Some(positive(t, "time_s", origin)?),
        (None, Some(_)) => None,
        _ => {
            return Err(bad(
                origin,
                "lower_bound",
                "neither {\"Time\": ...} nor {\"NoPlan\": ...}",
            ));
        }
    };
    let rows = field(v, "results", origin)?
        .as_array()
        .ok_or_else(|| bad(origin, "results", "not an array"))?
        .iter()
        .map(|r| parse_row(r, origin))
        .collect::<Result<Vec<_>>>()?;
    Ok(CompareRun {
        model: text("model")?,
        batch: whole("batch")?,
        device: text("device")?,
        budget_bytes: whole("budget_bytes")?,
        footprint_bytes: whole("footprint_bytes")?.max(1),
        ideal_time_s: positive(v, "ideal_time_s", origin)?,
        lower_bound_s,
        rows,
    })
}

/// Parses `compare --json` output (`origin` names the file in errors): one
/// comparison or an array of them.
pub fn parse_compare(text: &str, origin: &str) -> Result<Vec<CompareRun>> {
    let v: Value = serde_json::from_str(crate::strip_bom(text))
        .map_err(|e| bad(origin, "(the file)", &format!("not JSON: {e}")))?;
    // Another of outcore's files (each names its format; compare's output has
    // none): say which, where a missing field would name the symptom.
    if let Some(format) = v.get("format").and_then(Value::as_str) {
        let fix = if format == "outcore-plan/1" {
            "; report a plan with `outcore report --plan FILE`"
        } else {
            ""
        };
        return Err(bad(
            origin,
            "(the file)",
            &format!("a `{format}` file, not compare's output{fix}"),
        ));
    }
    match &v {
        Value::Array(items) if !items.is_empty() => {
            items.iter().map(|i| parse_run(i, origin)).collect()
        }
        Value::Array(_) => Err(bad(origin, "(the file)", "an empty array")),
        _ => Ok(vec![parse_run(&v, origin)?]),
    }
}

const WIDTH_PX: f64 = 1200.0;
const HEIGHT_PX: f64 = 440.0;
const LEFT_PX: f64 = 70.0;
const TOP_PX: f64 = 40.0;
const BOTTOM_PX: f64 = 90.0;
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Every planner that appears, in first-seen order (one color each).
fn planners(runs: &[CompareRun]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs.iter().flat_map(|r| &r.rows) {
        if !out.contains(&r.planner) {
            out.push(r.planner.clone());
        }
    }
    out
}

/// The figure: a group of bars per run (sorted by model, device, budget).
pub fn render(runs: &[CompareRun]) -> String {
    let mut runs = runs.to_vec();
    runs.sort_by(|a, b| {
        (&a.model, a.batch, &a.device, a.budget_bytes).cmp(&(
            &b.model,
            b.batch,
            &b.device,
            b.budget_bytes,
        ))
    });
    let names = planners(&runs);
    let legend_w = 170.0;
    let plot_w = WIDTH_PX - LEFT_PX - legend_w - 20.0;
    let plot_h = HEIGHT_PX - TOP_PX - BOTTOM_PX;
    let base_y = TOP_PX + plot_h;
    let y = |t: f64| base_y - t.clamp(0.0, 1.05) / 1.05 * plot_h;
    let mut svg = Svg::new(WIDTH_PX, HEIGHT_PX);
    svg.text(LEFT_PX, 20.0, 14.0, "start", "Throughput vs ideal per planner and budget (dashed: best any plan can reach, from the lower bound; x: no feasible plan)");
    for t in ticks(1.0, 5) {
        svg.line(LEFT_PX - 4.0, y(t), LEFT_PX + plot_w, y(t), "#ddd", false);
        svg.text(LEFT_PX - 8.0, y(t) + 4.0, 11.0, "end", &num(t));
    }
    svg.line(LEFT_PX, base_y, LEFT_PX + plot_w, base_y, "#333", false);
    let group_w = plot_w / runs.len().max(1) as f64;
    let bar_w = (group_w * 0.8 / names.len().max(1) as f64).max(1.0);
    for (g, run) in runs.iter().enumerate() {
        let gx = LEFT_PX + g as f64 * group_w + group_w * 0.1;
        let pct = run.budget_bytes as f64 / run.footprint_bytes as f64 * 100.0;
        let label = format!("{} b{} {} {:.0}%", run.model, run.batch, run.device, pct);
        svg.text(gx + group_w * 0.4, base_y + 18.0, 11.0, "middle", &label);
        svg.text(
            gx + group_w * 0.4,
            base_y + 32.0,
            10.0,
            "middle",
            &format!("budget {}", outcore_plan::fmt_bytes(run.budget_bytes)),
        );
        for row in &run.rows {
            let p = names.iter().position(|n| *n == row.planner).unwrap_or(0);
            let bx = gx + p as f64 * bar_w;
            match (row.status.as_str(), row.throughput_vs_ideal) {
                ("feasible", Some(t)) => {
                    let title = format!(
                        "{} at {label}: {:.1}% of ideal ({} s/iteration)",
                        row.planner,
                        t * 100.0,
                        row.iter_time_s.map_or("?".into(), |s| format!("{s:.4}"))
                    );
                    svg.rect(
                        bx,
                        y(t),
                        bar_w * 0.9,
                        base_y - y(t),
                        PALETTE[p % PALETTE.len()],
                        Some(&title),
                    );
                }
                _ => {
                    let title = format!(
                        "{} at {label}: {} ({})",
                        row.planner,
                        row.status,
                        row.reason.as_deref().unwrap_or("no reason given")
                    );
                    svg.circle(bx + bar_w * 0.45, base_y - 6.0, 4.0, "#999", Some(&title));
                    svg.text(bx + bar_w * 0.45, base_y - 12.0, 10.0, "middle", "x");
                }
            }
        }
        if let Some(best) = run.best_possible_throughput() {
            svg.line(gx, y(best), gx + group_w * 0.8, y(best), "#222", true);
            svg.text(
                gx + group_w * 0.8,
                y(best) - 4.0,
                10.0,
                "end",
                &format!("bound {:.1}%", best * 100.0),
            );
        }
    }
    let lx = WIDTH_PX - legend_w;
    for (p, name) in names.iter().enumerate() {
        let ly = TOP_PX + 10.0 + p as f64 * 16.0;
        svg.rect(lx, ly - 9.0, 10.0, 10.0, PALETTE[p % PALETTE.len()], None);
        svg.text(lx + 16.0, ly, 11.0, "start", name);
    }
    svg.finish()
}
