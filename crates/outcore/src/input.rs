//! Inputs: graphs (a zoo model or a file, with where they came from), budgets,
//! sizes, devices, allocators, optimizers, knobs, latency tables and plan files,
//! each parsed once here so that the CLI and the Python package accept the same
//! text and give the same errors.

use crate::error::{Error, ErrorKind, Result};
use outcore_cost::{CostModel, DeviceProfile, MeasuredModel, MeasuredTable, RooflineModel};
use outcore_graph::builder::Optimizer;
use outcore_graph::{Graph, footprint, zoo};
use outcore_plan::{AllocatorSpec, Plan};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a graph comes from: a zoo model with its settings, or a graph file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GraphSource {
    Zoo {
        model: String,
        /// `None`: the model's default batch.
        batch: Option<u64>,
        knobs: BTreeMap<String, u64>,
        /// `sgd`, `adam`, `adamw` or `none`; `None`: the model's default.
        optimizer: Option<String>,
    },
    /// A `dnn-train-graph/1` or `outcore-graph/1` file.
    File { path: PathBuf },
}

impl GraphSource {
    /// A zoo model with its default batch, knobs and optimizer.
    pub fn zoo(model: &str) -> GraphSource {
        GraphSource::Zoo {
            model: model.to_string(),
            batch: None,
            knobs: BTreeMap::new(),
            optimizer: None,
        }
    }
}

/// A graph and where it came from (recorded in the plans made for it).
#[derive(Debug, Clone)]
pub struct LoadedGraph {
    pub graph: Graph,
    pub source: GraphSource,
}

impl LoadedGraph {
    /// Peak live bytes of the graph run in order with no swapping: what a
    /// percentage budget is a percentage of.
    pub fn footprint_bytes(&self) -> u64 {
        footprint(&self.graph).0
    }
}

/// Builds a zoo model or reads a graph file.
pub fn load_graph(source: &GraphSource) -> Result<LoadedGraph> {
    let graph = match source {
        GraphSource::Zoo {
            model,
            batch,
            knobs,
            optimizer,
        } => {
            let optimizer = optimizer.as_deref().map(parse_optimizer).transpose()?;
            zoo::build(model, *batch, knobs, optimizer)?
        }
        GraphSource::File { path } => outcore_graph::format::load_graph_file(path)?,
    };
    // A graph with no ops is valid as a data structure, but every number about
    // it (ideal time, loss, throughput) would be 0 or NaN.
    if graph.ops.is_empty() {
        let what = match source {
            GraphSource::Zoo { model, .. } => format!("model {model}"),
            GraphSource::File { path } => path.display().to_string(),
        };
        return Err(Error::invalid(
            "graph",
            what,
            "has no ops",
            "a training step with at least one op; export the model again (tools/export_train_graph.py or `outcore export`)",
        ));
    }
    Ok(LoadedGraph {
        graph,
        source: source.clone(),
    })
}

/// Records in `plan` how to rebuild the graph it was made for.
pub fn record_graph_source(plan: &mut Plan, loaded: &LoadedGraph) {
    plan.graph.batch = Some(loaded.graph.meta.batch);
    match &loaded.source {
        GraphSource::Zoo {
            model,
            knobs,
            optimizer,
            ..
        } => {
            plan.graph.zoo_model = Some(model.clone());
            plan.graph.knobs = knobs.clone();
            plan.graph.optimizer = optimizer.clone();
            plan.graph.file = None;
        }
        GraphSource::File { path } => {
            plan.graph.zoo_model = None;
            plan.graph.knobs = BTreeMap::new();
            plan.graph.optimizer = None;
            // Absolute, so that the plan still finds its graph from elsewhere.
            let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            plan.graph.file = Some(absolute.display().to_string());
        }
    }
}

/// Rebuilds the graph a plan names and checks the plan's fingerprint of it.
pub fn graph_of_plan(plan: &Plan) -> Result<Graph> {
    let source = if let Some(model) = &plan.graph.zoo_model {
        GraphSource::Zoo {
            model: model.clone(),
            batch: plan.graph.batch,
            knobs: plan.graph.knobs.clone(),
            optimizer: plan.graph.optimizer.clone(),
        }
    } else if let Some(file) = &plan.graph.file {
        GraphSource::File {
            path: PathBuf::from(file),
        }
    } else {
        return Err(ErrorKind::PlanNamesNoGraph.into());
    };
    let graph = load_graph(&source)?.graph;
    plan.check_graph(&graph)?;
    Ok(graph)
}

/// Reads a plan file: its format, its embedded device profile and budget are
/// checked (see [`Plan::from_json`]).
pub fn load_plan(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).map_err(|source| ErrorKind::Io {
        action: "read",
        path: path.display().to_string(),
        source,
    })?;
    Ok(Plan::from_json(
        strip_bom(&text),
        &path.display().to_string(),
    )?)
}

/// The text without a leading UTF-8 byte order mark, which some editors write
/// and JSON parsers reject as "expected value at line 1 column 1".
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Writes a plan as `outcore-plan/1` JSON.
pub fn write_plan(plan: &Plan, path: &Path) -> Result<()> {
    std::fs::write(path, plan.to_json()).map_err(|source| {
        ErrorKind::Io {
            action: "write",
            path: path.display().to_string(),
            source,
        }
        .into()
    })
}

/// The optimizer of a zoo model by name: `sgd` (with momentum), `adam`,
/// `adamw` or `none`.
pub fn parse_optimizer(name: &str) -> Result<Optimizer> {
    Ok(match name {
        "sgd" => Optimizer::sgd_momentum(),
        "adamw" => Optimizer::adamw(),
        "adam" => match Optimizer::adamw() {
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
                ..
            } => Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay: 0.0,
                decoupled: false,
            },
            other => other,
        },
        "none" => Optimizer::None,
        other => {
            return Err(ErrorKind::UnknownName {
                what: "optimizer",
                name: other.to_string(),
                known: "sgd, adam, adamw, none".into(),
            }
            .into());
        }
    })
}

/// Model knobs written `NAME=VALUE` (whole numbers).
pub fn parse_knobs(knobs: &[String]) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for k in knobs {
        let (name, value) = k.split_once('=').ok_or_else(|| {
            Error::invalid(
                "knob",
                k,
                "not NAME=VALUE",
                "NAME=VALUE with a whole number, e.g. depth=152",
            )
        })?;
        let value: u64 = value.parse().map_err(|_| {
            Error::invalid(
                format!("knob `{name}`"),
                value,
                "not a whole number",
                "a whole number, e.g. depth=152",
            )
        })?;
        if out.insert(name.to_string(), value).is_some() {
            return Err(Error::invalid(
                format!("knob `{name}`"),
                k,
                "given twice",
                "each knob once, e.g. depth=152",
            ));
        }
    }
    Ok(out)
}

const BUDGET_ACCEPTS: &str =
    "bytes, a size like 12GiB / 512MiB / 16GB, or a percentage in (0, 100000]% of the footprint";

/// A budget: plain bytes, a size with a unit, or a percentage of
/// `footprint_bytes`. The result is at least one byte.
pub fn parse_budget(text: &str, footprint_bytes: u64) -> Result<u64> {
    let t = text.trim();
    let Some(pct) = t.strip_suffix('%') else {
        return parse_size(t).map_err(|_| {
            Error::invalid("budget", text, "not a size or percentage", BUDGET_ACCEPTS)
        });
    };
    let p: f64 = pct
        .trim()
        .parse()
        .map_err(|_| Error::invalid("budget", text, "not a number", BUDGET_ACCEPTS))?;
    // A budget a thousand times the footprint is a typo, not a plan.
    if !(p.is_finite() && p > 0.0 && p <= 100_000.0) {
        return Err(Error::invalid(
            "budget",
            text,
            "out of range",
            BUDGET_ACCEPTS,
        ));
    }
    let exact = (footprint_bytes as f64 * p / 100.0).round();
    // `as u64` saturates: a share past 2^64 bytes is refused, not clamped.
    if exact >= u64::MAX as f64 {
        return Err(Error::invalid(
            "budget",
            text,
            format!("is more than 2^64 bytes of a {footprint_bytes}-byte footprint"),
            "a smaller percentage, or a size of at most the device's memory",
        ));
    }
    let bytes = exact as u64;
    if bytes == 0 {
        return Err(Error::invalid(
            "budget",
            text,
            format!("rounds to 0 bytes of a {footprint_bytes}-byte footprint"),
            BUDGET_ACCEPTS,
        ));
    }
    Ok(bytes)
}

const SIZE_ACCEPTS: &str = "a positive whole number of bytes, or a positive number with a unit (KB, MB, GB, TB, KiB, MiB, GiB, TiB), at most 16 EiB";

/// A size: plain bytes (`1048576`, `1048576B`) or a number with a unit
/// (`1.5GiB`, `512MB`). Positive, at most `u64::MAX` bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let units: [(&str, f64); 8] = [
        ("TiB", 1024f64.powi(4)),
        ("GiB", 1024f64.powi(3)),
        ("MiB", 1024f64.powi(2)),
        ("KiB", 1024.0),
        ("TB", 1e12),
        ("GB", 1e9),
        ("MB", 1e6),
        ("KB", 1e3),
    ];
    let bad = |problem: &str| Error::invalid("size", text, problem, SIZE_ACCEPTS);
    for (suffix, scale) in units {
        if let Some(num) = t.strip_suffix(suffix) {
            let v: f64 = num.trim().parse().map_err(|_| bad("not a number"))?;
            let bytes = (v * scale).round();
            if !(v.is_finite() && bytes >= 1.0 && bytes <= u64::MAX as f64) {
                return Err(bad("out of range"));
            }
            return Ok(bytes as u64);
        }
    }
    let bytes: u64 = t
        .trim_end_matches('B')
        .parse()
        .map_err(|_| bad("not a size"))?;
    if bytes == 0 {
        return Err(bad("must be positive"));
    }
    Ok(bytes)
}

/// A built-in device profile by name, or a profile JSON file (validated).
pub fn load_device(name_or_path: &str) -> Result<DeviceProfile> {
    Ok(DeviceProfile::load(name_or_path)?)
}

/// The one allocator vocabulary of every command; where one does not apply
/// (`perfect` places no addresses, so `alloc-replay` has nothing to replay
/// with it) the command says so.
pub const ALLOCATORS: &str =
    "perfect, best-fit, best-fit-paged, size-class, virtual-chunks, offsets";

/// An allocator by its command-line name, with default parameters. A
/// `size-class` pool is sized per plan by [`crate::plan`] from the plan's own
/// allocation trace.
pub fn parse_allocator(name: &str) -> Result<AllocatorSpec> {
    Ok(match name {
        "perfect" => AllocatorSpec::Perfect,
        "best-fit" => AllocatorSpec::BestFit(Default::default()),
        // Segments on any free 2 MiB pages, as cudaMalloc maps them.
        "best-fit-paged" => AllocatorSpec::BestFit(outcore_alloc::BestFitConfig {
            paged_segments: true,
            ..Default::default()
        }),
        "virtual-chunks" => AllocatorSpec::VirtualChunks(Default::default()),
        "size-class" => AllocatorSpec::SizeClass(Default::default()),
        // Empty: the plan is laid out once it is made (`planning::lay_out_plan`).
        "offsets" => AllocatorSpec::Offsets(Default::default()),
        other => {
            return Err(ErrorKind::UnknownName {
                what: "allocator",
                name: other.to_string(),
                known: ALLOCATORS.into(),
            }
            .into());
        }
    })
}

/// `virtual-chunks` over physical chunks of `chunk_kib` KiB; requests up to a
/// quarter chunk share chunks.
pub fn virtual_chunks_allocator(chunk_kib: u64) -> Result<AllocatorSpec> {
    let chunk_bytes = chunk_kib
        .checked_mul(1024)
        .filter(|b| *b >= 2048)
        .ok_or_else(|| {
            Error::invalid(
                "chunk size (KiB)",
                chunk_kib.to_string(),
                "out of range",
                "a whole number of KiB in [2, 2^54], e.g. 2048 (2 MiB, CUDA's granularity) or 64 for tiny models",
            )
        })?;
    // A quarter chunk: small tensors (biases, norms) share chunks instead of
    // wasting most of one each, while packed chunks that fragment stay a small
    // part of a chunk's worth.
    Ok(AllocatorSpec::VirtualChunks(
        outcore_alloc::VirtualChunksConfig {
            chunk_bytes,
            small_alloc_max_bytes: chunk_bytes / 4 / 512 * 512,
        },
    ))
}

/// The planners a comma-separated list names, or every planner for `all`.
/// A planner named twice is refused: it would be planned and printed twice
/// (`compare --planners window,window` did so).
pub fn parse_planner_list(list: &str) -> Result<Vec<String>> {
    if list.trim() == "all" {
        return Ok(outcore_planners::names()
            .into_iter()
            .map(String::from)
            .collect());
    }
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim) {
        check_planner(name)?;
        if names.iter().any(|n| n == name) {
            return Err(Error::invalid(
                "planner list (--planners)",
                list,
                format!("names `{name}` twice"),
                "each planner once, comma-separated, or `all`",
            ));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// The planner of that name.
pub(crate) fn planner_by_name(name: &str) -> Result<Box<dyn outcore_plan::Planner>> {
    outcore_planners::by_name(name).map_err(|_| {
        ErrorKind::UnknownName {
            what: "planner",
            name: name.to_string(),
            known: format!(
                "{}; by name only: {}",
                outcore_planners::names().join(", "),
                outcore_planners::ablations()
                    .iter()
                    .chain(&outcore_planners::references())
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
        .into()
    })
}

/// Whether the planner of that name draws its own progress on a terminal
/// ([`outcore_plan::Planner::draws_own_progress`]), so that a front end
/// shows no spinner of its own beside it; `false` for an unknown name
/// (planning it fails with the list of names).
pub fn planner_draws_own_progress(name: &str) -> bool {
    planner_by_name(name).is_ok_and(|p| p.draws_own_progress())
}

/// Whether the named planner's search can be bounded by a move count
/// ([`crate::PlanOptions::max_moves`]): `outcore`'s own, and its
/// recompute-only variant.
pub(crate) fn counts_moves(name: &str) -> bool {
    matches!(
        name,
        outcore_planners::joint::NAME | outcore_planners::joint::RECOMPUTE_NAME
    )
}

/// A move count ([`crate::PlanOptions::max_moves`]) is for `outcore`'s own
/// search: where none of `planners` counts moves, it is an error, not a
/// flag silently ignored.
pub(crate) fn check_moves_counted<S: AsRef<str>>(
    planners: &[S],
    options: &crate::PlanOptions,
) -> Result<()> {
    let Some(moves) = options.max_moves else {
        return Ok(());
    };
    if planners.iter().any(|p| counts_moves(p.as_ref())) {
        return Ok(());
    }
    let names = planners
        .iter()
        .map(|p| format!("`{}`", p.as_ref()))
        .collect::<Vec<_>>()
        .join(", ");
    let verb = if planners.len() == 1 { "has" } else { "have" };
    Err(Error::invalid(
        "moves",
        moves.to_string(),
        format!("{names} {verb} no move count: each ends at its own end or at the time limit"),
        "a move count with the planners outcore or outcore-recompute only; drop it, or add one of them",
    ))
}

/// The planner of that name as `options` ask for it: `outcore`'s own search
/// bounded by `options.max_moves` where given (the other planners as they
/// are).
pub(crate) fn planner_for(
    name: &str,
    options: &crate::PlanOptions,
) -> Result<Box<dyn outcore_plan::Planner>> {
    let planner = planner_by_name(name)?;
    let Some(moves) = options.max_moves else {
        return Ok(planner);
    };
    let moves = usize::try_from(check_counted_moves(moves)?)
        .map_err(|_| moves_out_of_range(moves.to_string()))?;
    Ok(match name {
        outcore_planners::joint::NAME => {
            Box::new(outcore_planners::Joint::default().bounded_by_moves(moves))
        }
        outcore_planners::joint::RECOMPUTE_NAME => {
            Box::new(outcore_planners::Joint::recompute_only().bounded_by_moves(moves))
        }
        _ => planner,
    })
}

/// Checks a move count (`--moves`, `moves=`): 0 to
/// [`outcore_planners::joint::MAX_COUNTED_MOVES`] scored moves per start.
pub fn check_moves(moves: i64) -> Result<u64> {
    u64::try_from(moves)
        .map_err(|_| moves_out_of_range(moves.to_string()))
        .and_then(check_counted_moves)
}

/// [`check_moves`] for a count already unsigned (a library caller's
/// [`crate::PlanOptions::max_moves`] or `Retry::max_moves`).
pub(crate) fn check_counted_moves(moves: u64) -> Result<u64> {
    if moves <= outcore_planners::joint::MAX_COUNTED_MOVES {
        Ok(moves)
    } else {
        Err(moves_out_of_range(moves.to_string()))
    }
}

fn moves_out_of_range(value: String) -> Error {
    Error::invalid(
        "moves",
        value,
        "out of range",
        format!(
            "0 to {} scored moves per start; 20000 is about a minute on the GPT-2 example on 2 cores",
            outcore_planners::joint::MAX_COUNTED_MOVES
        ),
    )
}

fn check_planner(name: &str) -> Result<()> {
    planner_by_name(name).map(|_| ())
}

/// Checks a planner time limit: a positive, finite number of seconds.
pub fn check_time_limit_s(time_limit_s: f64) -> Result<f64> {
    if time_limit_s.is_finite() && time_limit_s > 0.0 {
        Ok(time_limit_s)
    } else {
        Err(Error::invalid(
            "planner time limit (seconds)",
            time_limit_s.to_string(),
            "out of range",
            "a positive, finite number of seconds, e.g. 10",
        ))
    }
}

/// Reads a measured-latency table (`outcore-latency-table/1`, as `outcore run
/// --profile-out` writes it).
pub fn load_latency_table(path: &Path) -> Result<MeasuredTable> {
    Ok(MeasuredTable::from_json_file(path)?)
}

/// Refuses a latency table taken on another graph: one whose entries name
/// ops the graph does not have at those positions (another model, or knobs
/// that change the ops), which would otherwise be ignored in silence, leaving
/// a plan priced by the roofline model the user asked to replace. A table
/// from another device is accepted: it prices the ops, the device its memory
/// and link (`outcore run`'s CPU tables over a GPU profile, deliberately).
pub fn check_latency_table(table: Option<&MeasuredTable>, graph: &Graph) -> Result<()> {
    let Some(table) = table else { return Ok(()) };
    if table.entries.is_empty() {
        return Ok(());
    }
    let coverage = table.coverage(graph);
    if coverage.matched > 0
        && coverage.name_mismatches.is_empty()
        && coverage.out_of_range.is_empty()
    {
        return Ok(());
    }
    Err(Error::invalid(
        "latency table of",
        &table.graph_model,
        format!(
            "was taken on another graph than `{}` ({} entries): {coverage}",
            graph.meta.model,
            table.entries.len()
        ),
        "a table measured on this graph (`outcore run --profile-out`, or outcore.torch's profile()); drop the latency table to price ops by the roofline model",
    ))
}

/// The roofline model on `device`, with the measured latencies over it when given.
pub fn cost_model(
    device: DeviceProfile,
    latency_table: Option<&MeasuredTable>,
) -> Box<dyn CostModel> {
    let roofline = RooflineModel::new(device);
    match latency_table {
        None => Box::new(roofline),
        Some(table) => Box::new(MeasuredModel::new(table.clone(), roofline)),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_budget, parse_knobs};

    /// A share of the footprint past 2^64 bytes is refused by name, not
    /// clamped to `u64::MAX` (`as u64` saturates).
    #[test]
    fn a_budget_past_two_to_the_64_is_refused_not_clamped() {
        let e = parse_budget("2000%", 1 << 60).expect_err("2^64.3 bytes");
        assert!(e.to_string().contains("more than 2^64 bytes"), "{e}");
        assert_eq!(parse_budget("1000%", 1 << 60).expect("2^63.3"), 10 << 60);
    }

    #[test]
    fn a_knob_given_twice_is_refused_by_name() {
        let e = parse_knobs(&["depth=4".into(), "depth=3".into()]).expect_err("twice");
        assert!(e.to_string().contains("knob `depth`"), "{e}");
        assert!(e.to_string().contains("given twice"), "{e}");
    }
}
