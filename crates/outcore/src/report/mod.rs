//! Reports people look at: one self-contained HTML file (inline SVG, no
//! script, no network, no external resource) with
//! - for a plan: device memory over one iteration by tensor kind with the
//!   budget and the peak (`memory.rs`), and the three streams as a timeline
//!   with compute stalls highlighted (`timeline.rs`), both from one
//!   simulation of the plan under its own device and allocator;
//! - for `compare --json` output: throughput vs ideal per planner and budget
//!   with the lower bound (`compare.rs`).
//!
//! Figures are plain SVG written by `svg.rs` (why not a plotting crate: see
//! there); hover text is SVG `<title>` elements, which browsers show as
//! tooltips without any script. Each figure is also a standalone `.svg`
//! document ([`Report::write_svgs`]).
//!
//! Not covered: best / mean / worst per generation of search planners, since
//! no planner records its search history in a plan or in `compare` output.

pub mod compare;
pub mod memory;
pub mod search;
pub mod svg;
pub mod timeline;

use crate::planning::verified_graph_and_cost;
use crate::{Error, ErrorKind, Result};
use outcore_cost::MeasuredTable;
use outcore_graph::Graph;
use outcore_plan::{Plan, fmt_bytes};
use outcore_sim::{SimOptions, SimReport, simulate};
use std::path::{Path, PathBuf};

pub use compare::{CompareRow, CompareRun, parse_compare};
pub use memory::{MemoryCurve, Sample};
pub use timeline::{Stall, StepTimes};

/// One figure: a file stem for `--svg-dir`, a heading and the SVG document.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub stem: String,
    pub heading: String,
    pub svg: String,
}

/// A report: a title, summary lines and figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub title: String,
    pub summary: Vec<String>,
    pub figures: Vec<Figure>,
}

/// What the plan figures are drawn from (public so tests can check the data).
#[derive(Debug, Clone)]
pub struct PlanFigures {
    pub report: SimReport,
    pub times: StepTimes,
    pub curve: MemoryCurve,
    pub stalls: Vec<Stall>,
}

/// Simulates `plan` once on its own device and allocator (after rebuilding
/// its graph and verifying it, as `simulate_plan` does), recording the trace
/// and start order, and derives the figures' data.
pub fn plan_figures(
    plan: &Plan,
    latency_table: Option<&MeasuredTable>,
) -> Result<(Graph, PlanFigures)> {
    let (graph, cost) = verified_graph_and_cost(plan, latency_table)?;
    // One iteration: the allocator changes no time, and the report draws
    // the live bytes, which are the same in every iteration.
    let options = SimOptions {
        iterations: 1,
        record_trace: true,
        record_start_order: true,
        ..SimOptions::default()
    };
    let out = simulate(&graph, plan, cost.as_ref(), &options)?;
    let trace = out.trace.unwrap_or_default();
    let order = out.start_order.unwrap_or_default();
    let times = timeline::step_times(plan, &trace, &order, out.report.iter_time_s)?;
    let curve = memory::memory_curve(&graph, plan, &times);
    let stalls = timeline::stalls(&graph, plan, &times);
    Ok((
        graph,
        PlanFigures {
            report: out.report,
            times,
            curve,
            stalls,
        },
    ))
}

/// The report of a plan: its memory and stream figures.
pub fn plan_report(plan: &Plan, latency_table: Option<&MeasuredTable>) -> Result<Report> {
    let (graph, f) = plan_figures(plan, latency_table)?;
    let r = &f.report;
    let mut summary = vec![
        format!(
            "planner {}, {} on {}, budget {}, allocator {}",
            plan.planner.name,
            graph.meta.model,
            plan.device.as_ref().map_or("?", |d| d.name.as_str()),
            fmt_bytes(plan.budget_bytes),
            plan.allocator.name()
        ),
        format!(
            "iteration {:.4} s ({:.1}% of ideal {:.4} s); peak live {}; swapped in {}, out {}; recomputation {:.4} s; compute stalls {:.4} s in {} intervals",
            r.iter_time_s,
            r.throughput_vs_ideal * 100.0,
            r.ideal_time_s,
            fmt_bytes(r.peak_live_bytes),
            fmt_bytes(r.swap_in_bytes),
            fmt_bytes(r.swap_out_bytes),
            r.recompute_time_s,
            r.stall_time_s,
            f.stalls.len()
        ),
    ];
    if let Some(oom) = &r.oom {
        summary.push(format!(
            "allocation failure under {}: {}",
            plan.allocator.name(),
            oom.message
        ));
    }
    Ok(Report {
        title: format!(
            "outcore report: {} plan for {}",
            plan.planner.name, graph.meta.model
        ),
        summary,
        figures: plan_figure_list(plan, &graph, &f),
    })
}

/// The memory and stream figures, and the search figure when the planner
/// recorded its search (see [`search`]).
fn plan_figure_list(plan: &Plan, graph: &Graph, f: &PlanFigures) -> Vec<Figure> {
    let mut figures = vec![
        Figure {
            stem: "memory".into(),
            heading: "Device memory".into(),
            svg: memory::render(&f.curve, f.report.iter_time_s),
        },
        Figure {
            stem: "streams".into(),
            heading: "Streams".into(),
            svg: timeline::render(graph, plan, &f.times, &f.stalls),
        },
    ];
    let curves = search::curves(&plan.planner.settings);
    if !curves.is_empty() {
        figures.push(Figure {
            stem: "search".into(),
            heading: "Search".into(),
            svg: search::render(&curves),
        });
    }
    figures
}

/// The report of one or more `compare` runs.
pub fn compare_report(runs: &[CompareRun]) -> Result<Report> {
    if runs.is_empty() {
        return Err(Error::invalid(
            "compare output",
            "(none)",
            "no comparison given",
            "at least one file written by `outcore compare --json`",
        ));
    }
    let summary = runs
        .iter()
        .map(|r| {
            let feasible = r.rows.iter().filter(|x| x.status == "feasible").count();
            format!(
                "{} b{} on {}, budget {} ({:.0}% of the footprint): {feasible} of {} planners feasible; lower bound {}",
                r.model,
                r.batch,
                r.device,
                fmt_bytes(r.budget_bytes),
                r.budget_bytes as f64 / r.footprint_bytes as f64 * 100.0,
                r.rows.len(),
                r.lower_bound_s.map_or("none: no plan exists".into(), |b| format!("{b:.4} s"))
            )
        })
        .collect();
    Ok(Report {
        title: "outcore report: planner comparison".into(),
        summary,
        figures: vec![Figure {
            stem: "compare".into(),
            heading: "Throughput vs ideal".into(),
            svg: compare::render(runs),
        }],
    })
}

impl Report {
    /// One self-contained HTML page: inline SVG (without the namespace
    /// attribute, which HTML does not need), inline CSS, no script.
    pub fn to_html(&self) -> String {
        let mut html = format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>body{{font-family:sans-serif;margin:20px;color:#222}} figure{{margin:0 0 28px 0}} svg{{max-width:100%;height:auto;border:1px solid #ddd}}</style>\n</head>\n<body>\n<h1>{}</h1>\n<ul>\n",
            svg::escape(&self.title),
            svg::escape(&self.title)
        );
        for line in &self.summary {
            html.push_str(&format!("<li>{}</li>\n", svg::escape(line)));
        }
        html.push_str("</ul>\n");
        for f in &self.figures {
            html.push_str(&format!(
                "<figure id=\"{}\">\n<h2>{}</h2>\n{}</figure>\n",
                svg::escape(&f.stem),
                svg::escape(&f.heading),
                f.svg
                    .replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1)
            ));
        }
        html.push_str("</body>\n</html>\n");
        html
    }

    /// Writes each figure as `DIR/STEM.svg` (creating `dir`); returns the paths.
    pub fn write_svgs(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).map_err(|source| ErrorKind::Io {
            action: "create the directory",
            path: dir.display().to_string(),
            source,
        })?;
        let mut paths = Vec::new();
        for f in &self.figures {
            let path = dir.join(format!("{}.svg", f.stem));
            std::fs::write(&path, &f.svg).map_err(|source| ErrorKind::Io {
                action: "write",
                path: path.display().to_string(),
                source,
            })?;
            paths.push(path);
        }
        Ok(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GraphSource, PlanOptions, Target, load_graph, plan};
    use outcore_plan::Instr;

    /// A feasible plan of a small zoo model by `planner` at `budget`.
    fn small_plan(model: &str, planner: &str, budget: &str) -> Plan {
        let graph = load_graph(&GraphSource::zoo(model)).expect("zoo model");
        let target = Target::parse(&graph, "v100-16gb-pcie3", budget, "perfect").expect("target");
        plan(&graph, planner, &target, &PlanOptions::default())
            .expect("feasible plan")
            .plan
    }

    fn swaps(plan: &Plan) -> usize {
        plan.streams[1]
            .iter()
            .filter(|s| matches!(s.instr, Instr::SwapIn(_)))
            .count()
    }

    #[test]
    fn memory_curve_peaks_at_the_simulated_peak_and_kinds_sum_to_live_bytes() {
        let cases = [
            ("tiny-cnn", "window", "80%"),
            ("mlp", "window", "70%"),
            ("tiny-transformer", "lms", "70%"),
            ("tiny-cnn", "checkpoint-sqrt", "70%"),
            ("tiny-transformer", "capuchin", "70%"),
        ];
        for (model, planner, budget) in cases {
            let p = small_plan(model, planner, budget);
            let (_, f) = plan_figures(&p, None).expect("figures");
            assert_eq!(
                f.curve.peak_bytes, f.report.peak_live_bytes,
                "{model} {planner}"
            );
            let max = f
                .curve
                .samples
                .iter()
                .map(Sample::total_bytes)
                .max()
                .unwrap();
            assert_eq!(max, f.report.peak_live_bytes, "{model} {planner}");
            assert!(f.curve.peak_bytes <= p.budget_bytes);
            // Each kind is non-negative by type; the parameters are resident
            // at the start, so the first sample is not empty.
            assert!(f.curve.samples[0].bytes_by_kind[0] > 0);
            assert!(!f.curve.largest_at_peak.is_empty());
            let listed: u64 = f.curve.largest_at_peak.iter().map(|x| x.1).sum();
            assert!(listed <= f.curve.peak_bytes);
            assert!(!f.curve.ops_around_peak.is_empty());
            // Times are within the iteration and ordered.
            let t = &f.curve.samples;
            assert!(t.windows(2).all(|w| w[0].time_s <= w[1].time_s + 1e-12));
            assert!(t.last().unwrap().time_s <= f.report.iter_time_s * (1.0 + 1e-9));
        }
    }

    #[test]
    fn stalls_sum_to_the_simulated_stall_time_and_every_step_is_timed() {
        let p = small_plan("tiny-cnn", "window", "80%");
        assert!(
            swaps(&p) > 0,
            "the plan swaps, so there is something to draw on h2d"
        );
        let (_, f) = plan_figures(&p, None).expect("figures");
        for s in 0..3 {
            assert!(f.times.start_s[s].iter().all(|t| t.is_finite()));
            for (a, b) in f.times.start_s[s].iter().zip(&f.times.end_s[s]) {
                assert!(a <= b);
            }
        }
        assert!(
            f.report.stall_time_s > 0.0 && !f.stalls.is_empty(),
            "a swapping plan that stalls"
        );
        let stall_s: f64 = f.stalls.iter().map(|s| s.end_s - s.start_s).sum();
        let expected = f.report.stall_time_s;
        assert!(
            (stall_s - expected).abs() <= 1e-9 * f.report.iter_time_s.max(1e-12) * 10.0,
            "stalls {stall_s} vs simulated {expected}"
        );
    }

    #[test]
    fn downsampling_keeps_the_peak() {
        let samples: Vec<Sample> = (0..10_000)
            .map(|i| Sample {
                time_s: i as f64,
                bytes_by_kind: [1, 0, (i % 97) as u64 + u64::from(i == 4321) * 1000, 0, 0],
            })
            .collect();
        let d = memory::downsample(&samples, 10_000.0, 100);
        assert!(d.len() <= 100);
        assert_eq!(
            d.iter().map(Sample::total_bytes).max(),
            Some(1 + 4321 % 97 + 1000)
        );
    }

    #[test]
    fn html_is_self_contained_with_a_non_empty_drawing_per_figure() {
        let p = small_plan("tiny-cnn", "window", "80%");
        let report = plan_report(&p, None).expect("report");
        let html = report.to_html();
        assert_eq!(report.figures.len(), 2);
        assert_eq!(html.matches("<svg").count(), 2);
        assert_eq!(html.matches("</svg>").count(), 2);
        assert!(html.contains("<polygon") && html.contains("<title>"));
        for banned in [
            "http://", "https://", "src=", "href=", "<script", "@import", "url(",
        ] {
            assert!(
                !html.contains(banned),
                "the page must not load anything: found {banned}"
            );
        }
        // Standalone figures keep the namespace so they open as .svg files.
        assert!(
            report
                .figures
                .iter()
                .all(|f| f.svg.contains("xmlns=\"http://www.w3.org/2000/svg\""))
        );
    }

    #[test]
    fn compare_output_is_parsed_and_bad_input_is_named() {
        let text = r#"{"model":"m","batch":8,"device":"d","budget_bytes":50,"footprint_bytes":100,
            "allocator":"perfect","ideal_time_s":1.0,"lower_bound":{"Time":{"time_s":1.25}},
            "results":[{"planner":"a","status":"feasible","throughput_vs_ideal":0.5,"iter_time_s":2.0},
                       {"planner":"b","status":"infeasible","reason":"too big"}]}"#;
        let runs = parse_compare(text, "x.json").expect("parses");
        assert_eq!(runs[0].rows.len(), 2);
        assert_eq!(runs[0].best_possible_throughput(), Some(0.8));
        let svg = compare::render(&runs);
        assert!(svg.contains("<title>a at m b8 d 50%: 50.0% of ideal"));
        assert!(svg.contains("b at m b8 d 50%: infeasible (too big)"));
        let no_plan = text.replace(r#"{"Time":{"time_s":1.25}}"#, r#"{"NoPlan":{"op":"x"}}"#);
        assert_eq!(
            parse_compare(&no_plan, "x.json").unwrap()[0].best_possible_throughput(),
            None
        );
        let bad = text.replace("\"ideal_time_s\":1.0", "\"ideal_time_s\":-1");
        let e = parse_compare(&bad, "x.json").unwrap_err().to_string();
        assert!(
            e.contains("ideal_time_s") && e.contains("compare --json"),
            "{e}"
        );
        let e = parse_compare("{}", "y.json").unwrap_err().to_string();
        assert!(e.contains("y.json") && e.contains("missing"), "{e}");
        assert!(parse_compare("[]", "z.json").is_err());
        assert!(parse_compare("not json", "z.json").is_err());
    }
}
