//! `outcore._native`: the Python binding of the outcore facade (`crates/outcore`).
//!
//! Thin by design: every function parses its arguments with the facade's own
//! parsers, calls the facade, and hands the result back either as a small
//! class (`Graph`, `Plan`, which stay in Rust so that large graphs are not
//! re-parsed) or as the facade's serde JSON, which the pure-Python layer
//! (`python/outcore/__init__.py`) turns into typed result objects. Errors
//! become instances of the exception classes of `outcore.errors`, chosen by
//! the facade's `ErrorKind`, carrying the facade's message unchanged.
//!
//! `unsafe_code` is denied as in the main workspace: pyo3's attribute macros
//! allow their own FFI glue locally, so this crate needs no exemption.

use outcore::{
    ErrorKind, GraphSource, LoadedGraph, MeasuredTable, Plan, PlanOptions, SimulateOptions, Target,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The name of the `outcore.errors` class an error kind is raised as.
fn error_class(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidValue { .. }
        | ErrorKind::UnknownName { .. }
        | ErrorKind::BudgetOverDevice { .. } => "InvalidValueError",
        ErrorKind::Graph(_) => "GraphError",
        ErrorKind::Infeasible { .. } => "InfeasibleError",
        ErrorKind::VerificationFailed { .. } | ErrorKind::NotRunnable { .. } => "PlanError",
        ErrorKind::Plan(_) | ErrorKind::PlanNamesNoGraph | ErrorKind::PlanNamesNoDevice => {
            "PlanError"
        }
        ErrorKind::Io { .. } => "OutcoreIOError",
        ErrorKind::Cost(_) => "InvalidValueError",
        _ => "OutcoreError",
    }
}

/// The facade's error as a Python exception of the matching `outcore.errors` class.
fn to_py(err: outcore::Error) -> PyErr {
    let message = err.to_string();
    let class = error_class(&err.kind);
    Python::attach(|py| {
        let cls = py
            .import("outcore.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| Ok(c.cast_into::<PyType>()?));
        match cls {
            Ok(cls) => PyErr::from_type(cls, message),
            // The package is always installed with its `errors` module; a
            // missing one still reports the facade's message.
            Err(_) => PyRuntimeError::new_err(message),
        }
    })
}

type PyRes<T> = Result<T, PyErr>;

fn json<T: serde::Serialize>(value: &T) -> PyRes<String> {
    serde_json::to_string(value)
        .map_err(|e| PyRuntimeError::new_err(format!("cannot serialise a result: {e}")))
}

/// A training graph (forward, backward and optimizer ops) and where it came from.
#[pyclass(module = "outcore._native", frozen)]
#[derive(Debug)]
struct Graph {
    loaded: LoadedGraph,
}

#[pymethods]
impl Graph {
    /// The model's name.
    #[getter]
    fn model(&self) -> String {
        self.loaded.graph.meta.model.clone()
    }
    /// The batch size.
    #[getter]
    fn batch(&self) -> u64 {
        self.loaded.graph.meta.batch
    }
    #[getter]
    fn n_ops(&self) -> usize {
        self.loaded.graph.ops.len()
    }
    #[getter]
    fn n_tensors(&self) -> usize {
        self.loaded.graph.tensors.len()
    }
    /// Peak live bytes run in graph order with nothing swapped: what a
    /// percentage budget is a percentage of.
    #[getter]
    fn footprint_bytes(&self) -> u64 {
        self.loaded.footprint_bytes()
    }
    /// Where the graph came from, as JSON.
    fn source_json(&self) -> PyRes<String> {
        json(&self.loaded.source)
    }
    /// The graph as `outcore-graph/1` JSON.
    fn to_json(&self) -> String {
        outcore_graph::format::native::to_string(&self.loaded.graph)
    }
    /// Op names, in graph order.
    fn op_names(&self) -> Vec<String> {
        self.loaded
            .graph
            .ops
            .iter()
            .map(|o| o.name.clone())
            .collect()
    }
    fn __repr__(&self) -> String {
        let g = &self.loaded.graph;
        format!(
            "Graph(model={:?}, batch={}, ops={}, tensors={}, footprint_bytes={})",
            g.meta.model,
            g.meta.batch,
            g.ops.len(),
            g.tensors.len(),
            self.loaded.footprint_bytes()
        )
    }
}

/// An `outcore-plan/1` plan: per-stream programs with waits.
#[pyclass(module = "outcore._native", name = "Plan", frozen)]
#[derive(Debug)]
struct PyPlan {
    plan: Plan,
}

#[pymethods]
impl PyPlan {
    /// Parses and checks plan JSON; `origin` names it in errors.
    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>"))]
    fn from_json(text: &str, origin: &str) -> PyRes<Self> {
        let plan = Plan::from_json(outcore::strip_bom(text), origin)
            .map_err(|e| to_py(outcore::Error::new(ErrorKind::Plan(e))))?;
        Ok(PyPlan { plan })
    }
    fn to_json(&self) -> String {
        self.plan.to_json()
    }
    #[getter]
    fn planner(&self) -> String {
        self.plan.planner.name.clone()
    }
    #[getter]
    fn budget_bytes(&self) -> u64 {
        self.plan.budget_bytes
    }
    #[getter]
    fn n_steps(&self) -> usize {
        self.plan.n_steps()
    }
    fn __repr__(&self) -> String {
        format!(
            "Plan(planner={:?}, budget_bytes={}, steps={})",
            self.plan.planner.name,
            self.plan.budget_bytes,
            self.plan.n_steps()
        )
    }
}

/// Zoo models as JSON: name, description, source, default batch, knobs.
#[pyfunction]
fn zoo_models() -> PyRes<String> {
    let models: Vec<serde_json::Value> = outcore_graph::zoo::models()
        .iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "description": m.description,
                "source": m.source,
                "default_batch": m.default_batch,
                "knobs": m.knobs.iter().map(|k| serde_json::json!(
                    {"name": k.name, "default": k.default, "help": k.help})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json(&models)
}

/// The planners' names (those `--planners all` runs).
#[pyfunction]
fn planners() -> Vec<String> {
    outcore_planners::names()
        .into_iter()
        .map(String::from)
        .collect()
}

/// The names of the planners reachable by name only: SwapAdvisor's
/// ablations, `outcore-recompute` and the exact references.
#[pyfunction]
fn planners_by_name_only() -> Vec<String> {
    outcore_planners::ablations()
        .iter()
        .chain(outcore_planners::references().iter())
        .map(|p| p.name().to_string())
        .collect()
}

/// The built-in device profiles' names.
#[pyfunction]
fn devices() -> Vec<String> {
    outcore::DeviceProfile::builtin_names()
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A device profile (built-in name or JSON file) as JSON, validated.
#[pyfunction]
fn device_json(name_or_path: &str) -> PyRes<String> {
    let device = outcore::load_device(name_or_path).map_err(to_py)?;
    Ok(device.to_json_string())
}

/// Builds a zoo model or reads a graph file (`dnn-train-graph/1` or `outcore-graph/1`).
#[pyfunction]
#[pyo3(signature = (model = None, path = None, batch = None, knobs = None, optimizer = None))]
fn load_graph(
    py: Python<'_>,
    model: Option<String>,
    path: Option<PathBuf>,
    batch: Option<u64>,
    knobs: Option<BTreeMap<String, u64>>,
    optimizer: Option<String>,
) -> PyRes<Graph> {
    let source = match (model, path) {
        (Some(model), None) => GraphSource::Zoo {
            model,
            batch,
            knobs: knobs.unwrap_or_default(),
            optimizer,
        },
        (None, Some(path)) => {
            if batch.is_some() || knobs.is_some() || optimizer.is_some() {
                return Err(to_py(outcore::Error::invalid(
                    "graph file options",
                    "batch / knobs / optimizer",
                    "given with a graph file, which fixes them",
                    "give them only with a zoo model",
                )));
            }
            GraphSource::File { path }
        }
        _ => {
            return Err(to_py(outcore::Error::invalid(
                "graph",
                "model and path",
                "exactly one of them must be given",
                "model=NAME (a zoo model) or path=FILE (a graph file)",
            )));
        }
    };
    let loaded = py.detach(|| outcore::load_graph(&source)).map_err(to_py)?;
    Ok(Graph { loaded })
}

/// Reads a plan file.
#[pyfunction]
fn load_plan(path: PathBuf) -> PyRes<PyPlan> {
    Ok(PyPlan {
        plan: outcore::load_plan(&path).map_err(to_py)?,
    })
}

fn options(
    seed: u64,
    time_limit_s: f64,
    latency_table: Option<PathBuf>,
    moves: Option<i64>,
) -> PyRes<PlanOptions> {
    outcore::check_time_limit_s(time_limit_s).map_err(to_py)?;
    let max_moves = moves.map(outcore::check_moves).transpose().map_err(to_py)?;
    let latency_table = latency_table
        .map(|p| outcore::load_latency_table(&p))
        .transpose()
        .map_err(to_py)?;
    Ok(PlanOptions {
        seed,
        time_limit_s,
        max_moves,
        latency_table,
        ..PlanOptions::default()
    })
}

/// Plans `graph` with one planner; returns the plan and the rest of the result as JSON.
#[pyfunction]
#[pyo3(signature = (graph, planner, device, budget, allocator, seed = 0, time_limit_s = 10.0, latency_table = None, moves = None))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    graph: &Graph,
    planner: &str,
    device: &str,
    budget: &str,
    allocator: &str,
    seed: u64,
    time_limit_s: f64,
    latency_table: Option<PathBuf>,
    moves: Option<i64>,
) -> PyRes<(PyPlan, String)> {
    let options = options(seed, time_limit_s, latency_table, moves)?;
    let loaded = &graph.loaded;
    let result = py
        .detach(|| {
            let target = Target::parse(loaded, device, budget, allocator)?;
            outcore::plan(loaded, planner, &target, &options)
        })
        .map_err(to_py)?;
    let rest = serde_json::json!({
        "planner": result.planner,
        "verification": result.verification,
        "report": result.report,
        "planner_time_s": result.planner_time_s,
        "simulate_time_s": result.simulate_time_s,
        "budget_bytes": result.plan.budget_bytes,
    });
    Ok((PyPlan { plan: result.plan }, json(&rest)?))
}

/// Every named planner on one target, judged alike; JSON.
#[pyfunction]
#[pyo3(signature = (graph, planners, device, budget, allocator, seed = 0, time_limit_s = 10.0, latency_table = None, moves = None))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    graph: &Graph,
    planners: &str,
    device: &str,
    budget: &str,
    allocator: &str,
    seed: u64,
    time_limit_s: f64,
    latency_table: Option<PathBuf>,
    moves: Option<i64>,
) -> PyRes<String> {
    let options = options(seed, time_limit_s, latency_table, moves)?;
    let loaded = &graph.loaded;
    let comparison = py
        .detach(|| {
            let names = outcore::parse_planner_list(planners)?;
            let target = Target::parse(loaded, device, budget, allocator)?;
            outcore::compare(loaded, &names, &target, &options)
        })
        .map_err(to_py)?;
    json(&comparison)
}

/// A budget, the one given or above it, under which `dtr`, `window` or
/// `outcore` has a plan ([`outcore::budget_hint`]); JSON of it, or `null`.
#[pyfunction]
#[pyo3(signature = (graph, device, budget, allocator, seed = 0, time_limit_s = 10.0, latency_table = None))]
#[allow(clippy::too_many_arguments)]
fn budget_hint(
    py: Python<'_>,
    graph: &Graph,
    device: &str,
    budget: &str,
    allocator: &str,
    seed: u64,
    time_limit_s: f64,
    latency_table: Option<PathBuf>,
) -> PyRes<String> {
    let options = options(seed, time_limit_s, latency_table, None)?;
    let loaded = &graph.loaded;
    let hint = py
        .detach(|| {
            let target = Target::parse(loaded, device, budget, allocator)?;
            Ok::<_, outcore::Error>(outcore::budget_hint(loaded, &target, &options))
        })
        .map_err(to_py)?;
    json(&hint)
}

/// Proves or refutes a plan on the graph it was made for; JSON of the
/// verification. A plan for another graph (another model, batch or knob) is
/// an error naming both fingerprints, not a list of violations that would
/// not say why.
#[pyfunction]
fn verify(plan: &PyPlan, graph: &Graph) -> PyRes<String> {
    plan.plan
        .check_graph(&graph.loaded.graph)
        .map_err(|e| to_py(e.into()))?;
    json(&outcore::verify_plan(&plan.plan, &graph.loaded.graph))
}

/// Simulates a plan on its own device and allocator (the graph is rebuilt
/// from what the plan records and checked against its fingerprint); JSON.
#[pyfunction]
#[pyo3(signature = (plan, iterations = 2, latency_table = None, record_trace = false))]
fn simulate(
    py: Python<'_>,
    plan: &PyPlan,
    iterations: usize,
    latency_table: Option<PathBuf>,
    record_trace: bool,
) -> PyRes<String> {
    let latency_table: Option<MeasuredTable> = latency_table
        .map(|p| outcore::load_latency_table(&p))
        .transpose()
        .map_err(to_py)?;
    let options = SimulateOptions {
        iterations,
        record_trace,
        record_alloc_trace: false,
        latency_table,
    };
    let p = &plan.plan;
    let result = py
        .detach(|| outcore::simulate_plan(p, &options))
        .map_err(to_py)?;
    json(&result)
}

/// The plan pinned to its predicted iteration ([`outcore::pin_to_timeline`])
/// and that iteration's steps in the order they start, as JSON rows
/// `[stream, index, start_s, end_s]` (stream 0 compute, 1 h2d, 2 d2h): the
/// order `outcore.torch` issues them in.
#[pyfunction]
#[pyo3(signature = (plan, latency_table = None))]
fn pin_to_timeline(
    py: Python<'_>,
    plan: &PyPlan,
    latency_table: Option<PathBuf>,
) -> PyRes<(PyPlan, String)> {
    let latency_table: Option<MeasuredTable> = latency_table
        .map(|p| outcore::load_latency_table(&p))
        .transpose()
        .map_err(to_py)?;
    let p = &plan.plan;
    let pinned = py
        .detach(|| outcore::pin_to_timeline(p, latency_table.as_ref()))
        .map_err(to_py)?;
    let rows: Vec<(usize, u32, f64, f64)> = pinned
        .timeline
        .iter()
        .map(|t| (t.at.stream.index(), t.at.index, t.start_s, t.end_s))
        .collect();
    Ok((PyPlan { plan: pinned.plan }, json(&rows)?))
}

/// A size (`12GiB`, `512MB`, bytes) in bytes.
#[pyfunction]
fn parse_size(text: &str) -> PyRes<u64> {
    outcore::parse_size(text).map_err(to_py)
}

/// A budget (bytes, a size, or a percentage of `footprint_bytes`) in bytes.
#[pyfunction]
fn parse_budget(text: &str, footprint_bytes: u64) -> PyRes<u64> {
    outcore::parse_budget(text, footprint_bytes).map_err(to_py)
}

/// Checks a latency table file (`outcore-latency-table/1`); returns it as JSON.
#[pyfunction]
fn load_latency_table(path: PathBuf) -> PyRes<String> {
    let table = outcore::load_latency_table(&path).map_err(to_py)?;
    Ok(table.to_json_string())
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Graph>()?;
    m.add_class::<PyPlan>()?;
    m.add_function(wrap_pyfunction!(zoo_models, m)?)?;
    m.add_function(wrap_pyfunction!(planners, m)?)?;
    m.add_function(wrap_pyfunction!(planners_by_name_only, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(device_json, m)?)?;
    m.add_function(wrap_pyfunction!(load_graph, m)?)?;
    m.add_function(wrap_pyfunction!(load_plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(budget_hint, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(pin_to_timeline, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(parse_budget, m)?)?;
    m.add_function(wrap_pyfunction!(load_latency_table, m)?)?;
    Ok(())
}
