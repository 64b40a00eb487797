//! The benchmark suite (issue 16): every planner on a fixed set of zoo models
//! and exported graphs, at fixed fractions of the footprint, on fixed devices,
//! each case judged like `compare` (verified, simulated under the allocator)
//! and set against the lower bound. One row per (graph, device, budget,
//! planner), so that tables in RESULTS.md are regenerated, not hand-edited.

use crate::error::Result;
use crate::input::{GraphSource, load_graph};
use crate::planning::{PlanOptions, Runnability, Target, compare};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One graph of the suite.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteGraph {
    /// The name rows use.
    pub label: String,
    #[serde(skip)]
    pub source: GraphSource,
}

/// What the suite runs.
#[derive(Debug, Clone, Serialize)]
pub struct Suite {
    pub graphs: Vec<SuiteGraph>,
    pub devices: Vec<String>,
    /// Budgets in percent of each graph's footprint.
    pub budget_percents: Vec<f64>,
    /// Planner names (`parse_planner_list` syntax was applied already).
    pub planners: Vec<String>,
    /// The allocator every plan is made for and simulated under (a name
    /// `--allocator` takes: `perfect`, `best-fit`, `size-class`,
    /// `virtual-chunks`, `offsets`).
    pub allocator: String,
}

/// The suite issue 16 names: CNNs and transformers from the zoo and the
/// PyTorch exports kept in the repository, at 75%, 50%, 25% and 12.5% on
/// `v100-16gb-pcie3` and `h100-80gb`.
pub fn standard_suite(planners: Vec<String>, repo_root: &std::path::Path) -> Suite {
    let zoo = |label: &str, model: &str, batch: u64, knobs: &[(&str, u64)]| SuiteGraph {
        label: label.to_string(),
        source: GraphSource::Zoo {
            model: model.to_string(),
            batch: Some(batch),
            knobs: knobs
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect::<BTreeMap<_, _>>(),
            optimizer: None,
        },
    };
    let file = |label: &str, path: &str| SuiteGraph {
        label: label.to_string(),
        source: GraphSource::File {
            path: repo_root.join(path),
        },
    };
    Suite {
        graphs: vec![
            zoo("resnet50 b64", "resnet50", 64, &[]),
            zoo("inception_v3 b64", "inception_v3", 64, &[]),
            zoo("densenet121 b64", "densenet121", 64, &[]),
            zoo("mobilenet_v2 b64", "mobilenet_v2", 64, &[]),
            zoo("vgg16 b64", "vgg16", 64, &[]),
            zoo("bert-base b32", "bert-base", 32, &[]),
            zoo("gpt2 b8", "gpt2", 8, &[]),
            zoo("vit_b_16 b64", "vit_b_16", 64, &[]),
            file("resnet50 b32 (PyTorch)", "tools/examples/resnet50_b32.json"),
            file(
                "gpt2 b4 s256 (PyTorch)",
                "tools/examples/gpt2_b4_s256_adamw.json",
            ),
            file(
                "vgg16 b32 (PyTorch)",
                "crates/graph/tests/data/vgg16_b32.json",
            ),
            file(
                "mobilenet_v2 b64 (PyTorch)",
                "crates/graph/tests/data/mobilenet_v2_b64.json",
            ),
        ],
        devices: vec!["v100-16gb-pcie3".into(), "h100-80gb".into()],
        budget_percents: vec![75.0, 50.0, 25.0, 12.5],
        planners,
        allocator: "perfect".into(),
    }
}

/// One planner on one case.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteRow {
    pub graph: String,
    pub device: String,
    pub budget_percent: f64,
    pub planner: String,
    pub status: Runnability,
    /// Iteration time of the plan, when feasible.
    pub iter_time_s: Option<f64>,
    pub throughput_vs_ideal: Option<f64>,
    /// Iteration time over the lower bound, minus one.
    pub gap_to_bound: Option<f64>,
    pub planner_time_s: f64,
    /// Where the plan's search started, for a planner that says
    /// (`outcore`'s `settings.start`: the seed or repair start whose local
    /// search gave the plan), so that a suite run shows which starts win.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
}

/// One case's bound.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteCase {
    pub graph: String,
    pub device: String,
    pub budget_percent: f64,
    pub ideal_time_s: f64,
    /// `None`: no plan exists (an op's working set is over the budget).
    pub bound_time_s: Option<f64>,
}

/// Everything the suite measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SuiteResult {
    /// The allocator the plans were made for ([`Suite::allocator`]).
    pub allocator: String,
    pub cases: Vec<SuiteCase>,
    pub rows: Vec<SuiteRow>,
    /// Graphs that could not be loaded (e.g. a file missing), with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Runs `suite`. `options.on_progress` is told after each case (and stops
/// the suite when it returns `false`); `options.time_limit_s` bounds each
/// search planner.
pub fn run_suite(suite: &Suite, options: &PlanOptions) -> Result<SuiteResult> {
    let total = suite.graphs.len() * suite.devices.len() * suite.budget_percents.len();
    let total = u32::try_from(total).unwrap_or(u32::MAX);
    let mut done = 0u32;
    let mut out = SuiteResult {
        allocator: suite.allocator.clone(),
        ..SuiteResult::default()
    };
    let per_case = PlanOptions {
        on_progress: None,
        ..options.clone()
    };
    for g in &suite.graphs {
        let loaded = match load_graph(&g.source) {
            Ok(l) => l,
            Err(e) => {
                out.skipped.push((g.label.clone(), e.to_string()));
                done = done.saturating_add(
                    u32::try_from(suite.devices.len() * suite.budget_percents.len())
                        .unwrap_or(u32::MAX),
                );
                continue;
            }
        };
        for device in &suite.devices {
            for &pct in &suite.budget_percents {
                let target = Target::parse(&loaded, device, &format!("{pct}%"), &suite.allocator)?;
                let c = compare(&loaded, &suite.planners, &target, &per_case)?;
                out.cases.push(SuiteCase {
                    graph: g.label.clone(),
                    device: device.clone(),
                    budget_percent: pct,
                    ideal_time_s: c.ideal_time_s,
                    bound_time_s: c.lower_bound.time_s(),
                });
                for o in &c.results {
                    out.rows.push(SuiteRow {
                        graph: g.label.clone(),
                        device: device.clone(),
                        budget_percent: pct,
                        planner: o.planner.clone(),
                        status: o.status,
                        iter_time_s: o.report.as_ref().map(|r| r.iter_time_s),
                        throughput_vs_ideal: o.report.as_ref().map(|r| r.throughput_vs_ideal),
                        gap_to_bound: c.gap_to_bound(o),
                        planner_time_s: o.planner_time_s,
                        start: o
                            .plan
                            .as_ref()
                            .and_then(|p| p.planner.settings.get("start"))
                            .and_then(|v| v.as_str())
                            .map(str::to_string),
                    });
                }
                done = done.saturating_add(1);
                crate::planning::tell_progress(options, "suite cases", done, total)?;
            }
        }
    }
    Ok(out)
}

impl SuiteResult {
    /// A Markdown table: one line per case with the best planner's throughput
    /// vs ideal, its gap to the bound, and every planner's throughput.
    pub fn to_markdown(&self, planners: &[String]) -> String {
        let mut s = String::from(
            "| graph | device | budget | bound vs ideal | best | best vs ideal | gap to bound |",
        );
        for p in planners {
            s.push_str(&format!(" {p} |"));
        }
        s.push_str("\n|---|---|---|---|---|---|---|");
        s.push_str(&"---|".repeat(planners.len()));
        s.push('\n');
        for case in &self.cases {
            let rows: Vec<&SuiteRow> = self
                .rows
                .iter()
                .filter(|r| {
                    r.graph == case.graph
                        && r.device == case.device
                        && r.budget_percent == case.budget_percent
                })
                .collect();
            let best = rows
                .iter()
                .filter(|r| r.gap_to_bound.is_some())
                .min_by(|a, b| {
                    a.iter_time_s
                        .unwrap_or(f64::INFINITY)
                        .total_cmp(&b.iter_time_s.unwrap_or(f64::INFINITY))
                });
            let bound = case.bound_time_s.map_or("no plan".to_string(), |b| {
                format!("{:.3}", case.ideal_time_s / b)
            });
            s.push_str(&format!(
                "| {} | {} | {}% | {bound} | {} | {} | {} |",
                case.graph,
                case.device,
                case.budget_percent,
                best.map_or("-", |r| r.planner.as_str()),
                best.and_then(|r| r.throughput_vs_ideal)
                    .map_or("-".to_string(), |t| format!("{t:.3}")),
                best.and_then(|r| r.gap_to_bound)
                    .map_or("-".to_string(), |g| format!("{:.1}%", g * 100.0)),
            ));
            for p in planners {
                let cell = rows
                    .iter()
                    .find(|r| &r.planner == p)
                    .and_then(|r| match r.status {
                        Runnability::Feasible => r.throughput_vs_ideal.map(|t| format!("{t:.3}")),
                        Runnability::NotRunnable => Some("NR".to_string()),
                        Runnability::Infeasible => None,
                    })
                    .unwrap_or_else(|| "-".to_string());
                s.push_str(&format!(" {cell} |"));
            }
            s.push('\n');
        }
        s
    }
}

/// Where the suite looks for the repository's example graphs: the current
/// directory (a checkout's root).
pub fn default_repo_root() -> PathBuf {
    PathBuf::from(".")
}
