//! The one Plan type: an instruction program per stream with explicit cross-stream
//! waits, the initial residency of persistent tensors, and who made it.

use outcore_alloc::AllocatorConfig;
use outcore_cost::{CostError, DeviceProfile};
use outcore_graph::{Graph, OpId, TensorId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The version tag of serialised plans.
pub const PLAN_FORMAT: &str = "outcore-plan/1";

/// The three streams of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Kernels: `Compute` and `Recompute`.
    Compute,
    /// Host-to-device copies: `SwapIn`.
    H2d,
    /// Device-to-host copies: `SwapOut`.
    D2h,
}

impl Stream {
    pub const ALL: [Stream; 3] = [Stream::Compute, Stream::H2d, Stream::D2h];

    /// Position in [`Plan::streams`].
    pub fn index(self) -> usize {
        match self {
            Stream::Compute => 0,
            Stream::H2d => 1,
            Stream::D2h => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::H2d => "h2d",
            Stream::D2h => "d2h",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One instruction. Memory effects happen at the start of the step (allocations)
/// or at the step itself (`Free`, which takes no time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instr {
    /// Runs a graph op (compute stream). Allocates its storage-owning outputs;
    /// an in-place update writes its target's storage.
    Compute(OpId),
    /// Re-runs a recomputable forward op (compute stream) to re-materialise the
    /// listed outputs; its other outputs use scratch memory for the step only.
    Recompute { op: OpId, outputs: Vec<TensorId> },
    /// Copies a tensor's host copy to newly allocated device memory (h2d stream).
    SwapIn(TensorId),
    /// Copies a device-resident tensor to host memory (d2h stream); the device copy stays.
    SwapOut(TensorId),
    /// Releases a tensor's device memory (any stream, no duration).
    Free(TensorId),
}

impl Instr {
    /// The stream an instruction must be on (`None`: any stream).
    pub fn required_stream(&self) -> Option<Stream> {
        match self {
            Instr::Compute(_) | Instr::Recompute { .. } => Some(Stream::Compute),
            Instr::SwapIn(_) => Some(Stream::H2d),
            Instr::SwapOut(_) => Some(Stream::D2h),
            Instr::Free(_) => None,
        }
    }
}

impl fmt::Display for Instr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::program::StepInstr::from(self).fmt(f)
    }
}

/// A reference to a step: its stream and position in that stream's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepRef {
    pub stream: Stream,
    pub index: u32,
}

impl fmt::Display for StepRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.stream, self.index)
    }
}

/// An instruction and the steps of other streams that must complete before it starts.
/// (The previous step of its own stream always completes first.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub instr: Instr,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<StepRef>,
}

/// Where a persistent tensor is at the start (and so at the end) of an iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    /// On the device only.
    Device,
    /// On the device, with a current host copy (may be freed without a copy-out
    /// until it is written).
    DeviceAndHost,
    /// On the host only; must be swapped in before use.
    Host,
}

/// Which planner made a plan, with which settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannerInfo {
    pub name: String,
    #[serde(default)]
    pub seed: Option<u64>,
    /// Planner-specific settings and findings (window size, knobs chosen, ...).
    #[serde(default)]
    pub settings: serde_json::Value,
}

/// How to rebuild the graph a plan was made for, and a fingerprint to check it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphRef {
    /// Zoo model name, or `None` for a graph file.
    #[serde(default)]
    pub zoo_model: Option<String>,
    #[serde(default)]
    pub batch: Option<u64>,
    #[serde(default)]
    pub knobs: std::collections::BTreeMap<String, u64>,
    /// Graph file path, when the graph came from a file.
    #[serde(default)]
    pub file: Option<String>,
    /// Optimizer override used to build a zoo model (`None`: the model's default).
    #[serde(default)]
    pub optimizer: Option<String>,
    /// [`graph_fingerprint`] of the graph.
    pub fingerprint: String,
    pub n_ops: usize,
    pub n_tensors: usize,
}

/// A 64-bit FNV-1a hash of the graph's native JSON, as 16 hex digits.
pub fn graph_fingerprint(graph: &Graph) -> String {
    let text = outcore_graph::format::native::to_string(graph);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The allocator a plan is made for: the perfect allocator (bytes only, no
/// addresses, so no fragmentation) or one of `outcore_alloc`'s algorithms with its
/// parameters. Serialised as `{"kind": "perfect"}`, `{"kind": "best-fit"}`,
/// `{"kind": "size-class", "classes": [...]}`,
/// `{"kind": "virtual-chunks", "chunk_bytes": ...}` or
/// `{"kind": "offsets", "height_bytes": ..., "owners": [...]}` (the same JSON
/// as [`AllocatorConfig`] plus `perfect`). An `offsets` request without
/// owners asks the planner to lay the plan out ([`crate::layout`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AllocatorSpec {
    /// Bytes only: an allocation succeeds whenever live bytes fit.
    #[default]
    Perfect,
    SizeClass(outcore_alloc::SizeClassConfig),
    BestFit(outcore_alloc::BestFitConfig),
    VirtualChunks(outcore_alloc::VirtualChunksConfig),
    Offsets(outcore_alloc::OffsetsConfig),
}

impl AllocatorSpec {
    /// The real allocator's configuration, `None` for the perfect allocator.
    pub fn config(&self) -> Option<AllocatorConfig> {
        match self {
            AllocatorSpec::Perfect => None,
            AllocatorSpec::SizeClass(c) => Some(AllocatorConfig::SizeClass(c.clone())),
            AllocatorSpec::BestFit(c) => Some(AllocatorConfig::BestFit(c.clone())),
            AllocatorSpec::VirtualChunks(c) => Some(AllocatorConfig::VirtualChunks(c.clone())),
            AllocatorSpec::Offsets(c) => Some(AllocatorConfig::Offsets(c.clone())),
        }
    }

    /// The name used on the command line: `perfect`, `best-fit`,
    /// `best-fit-paged`, `size-class`, `virtual-chunks`, `offsets`.
    pub fn name(&self) -> &'static str {
        match self {
            AllocatorSpec::Perfect => "perfect",
            AllocatorSpec::SizeClass(_) => "size-class",
            AllocatorSpec::BestFit(c) if c.paged_segments => "best-fit-paged",
            AllocatorSpec::BestFit(_) => "best-fit",
            AllocatorSpec::VirtualChunks(_) => "virtual-chunks",
            AllocatorSpec::Offsets(_) => "offsets",
        }
    }
}

impl From<AllocatorConfig> for AllocatorSpec {
    fn from(config: AllocatorConfig) -> Self {
        match config {
            AllocatorConfig::SizeClass(c) => AllocatorSpec::SizeClass(c),
            AllocatorConfig::BestFit(c) => AllocatorSpec::BestFit(c),
            AllocatorConfig::VirtualChunks(c) => AllocatorSpec::VirtualChunks(c),
            AllocatorConfig::Offsets(c) => AllocatorSpec::Offsets(c),
        }
    }
}

/// A complete execution plan for one training iteration, repeated every iteration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub format: String,
    pub planner: PlannerInfo,
    pub graph: GraphRef,
    /// The device the plan was made for, so that the plan is self-contained;
    /// `None` (JSON `null`) for plans made outside a target (tests, lowering
    /// helpers). Validated, and checked to hold the budget, on load.
    #[serde(default)]
    pub device: Option<DeviceProfile>,
    /// Device memory the plan may use.
    pub budget_bytes: u64,
    /// The device allocator the plan was made for and is simulated / run with.
    #[serde(default)]
    pub allocator: AllocatorSpec,
    /// Initial residency of every persistent tensor.
    pub initial_residency: Vec<(TensorId, Residency)>,
    /// Programs of the compute, h2d and d2h streams, in [`Stream::index`] order.
    pub streams: [Vec<Step>; 3],
    /// The schedule this plan was lowered from ([`crate::lower_schedule`] sets
    /// it), so that a search can start from another planner's decisions
    /// instead of re-deriving them from the programs. Provenance held in
    /// memory only: never written to a plan file, and not part of equality
    /// (two plans with the same programs are the same plan).
    #[serde(skip)]
    pub lowered_from: Option<std::sync::Arc<crate::Schedule>>,
}

impl PartialEq for Plan {
    fn eq(&self, other: &Plan) -> bool {
        // Every field but `lowered_from` (see its doc).
        self.format == other.format
            && self.planner == other.planner
            && self.graph == other.graph
            && self.device == other.device
            && self.budget_bytes == other.budget_bytes
            && self.allocator == other.allocator
            && self.initial_residency == other.initial_residency
            && self.streams == other.streams
    }
}

impl Plan {
    /// An empty plan with every persistent tensor resident on the device.
    pub fn new(graph: &Graph, planner: PlannerInfo, budget_bytes: u64) -> Plan {
        Plan::with_fingerprint(graph, planner, budget_bytes, graph_fingerprint(graph))
    }

    /// [`Plan::new`] with the graph's [`graph_fingerprint`] already computed (it
    /// serialises the whole graph: a search computes it once, not per plan).
    pub fn with_fingerprint(
        graph: &Graph,
        planner: PlannerInfo,
        budget_bytes: u64,
        fingerprint: String,
    ) -> Plan {
        Plan {
            format: PLAN_FORMAT.to_string(),
            planner,
            graph: GraphRef {
                zoo_model: None,
                batch: Some(graph.meta.batch),
                knobs: Default::default(),
                file: None,
                optimizer: None,
                fingerprint,
                n_ops: graph.ops.len(),
                n_tensors: graph.tensors.len(),
            },
            device: None,
            budget_bytes,
            allocator: AllocatorSpec::Perfect,
            initial_residency: graph
                .persistent_tensors()
                .map(|t| (t.id, Residency::Device))
                .collect(),
            streams: [Vec::new(), Vec::new(), Vec::new()],
            lowered_from: None,
        }
    }

    /// The program of one stream.
    pub fn stream(&self, stream: Stream) -> &[Step] {
        &self.streams[stream.index()]
    }

    /// Appends a step to a stream and returns its reference.
    pub fn push(&mut self, stream: Stream, instr: Instr, waits: Vec<StepRef>) -> StepRef {
        let program = &mut self.streams[stream.index()];
        program.push(Step { instr, waits });
        StepRef {
            stream,
            index: (program.len() - 1) as u32,
        }
    }

    /// The step at a reference, if it exists.
    pub fn step(&self, at: StepRef) -> Option<&Step> {
        self.streams[at.stream.index()].get(at.index as usize)
    }

    /// Total number of steps.
    pub fn n_steps(&self) -> usize {
        self.streams.iter().map(Vec::len).sum()
    }

    /// Serialises as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses a plan and checks its device profile (see [`Plan::check_device`]);
    /// `path` names the source in errors.
    pub fn from_json(text: &str, path: &str) -> Result<Plan, PlanError> {
        let plan: Plan = serde_json::from_str(text).map_err(|e| PlanError {
            kind: match other_outcore_file(text) {
                Some(what) => PlanErrorKind::NotAPlan {
                    path: path.to_string(),
                    what,
                },
                None => PlanErrorKind::Parse {
                    path: path.to_string(),
                    detail: e.to_string(),
                },
            },
        })?;
        if plan.format != PLAN_FORMAT {
            return Err(PlanError {
                kind: PlanErrorKind::UnsupportedFormat {
                    path: path.to_string(),
                    found: plan.format,
                },
            });
        }
        plan.check_device(path)?;
        Ok(plan)
    }

    /// Checks the embedded device profile: every field in range (see
    /// [`DeviceProfile::validate`]) and enough memory for the plan's budget.
    /// `origin` names the plan in errors.
    pub fn check_device(&self, origin: &str) -> Result<(), PlanError> {
        let Some(device) = &self.device else {
            return Ok(());
        };
        device
            .validate_as(&format!("the device of plan {origin}"))
            .map_err(|source| PlanError {
                kind: PlanErrorKind::InvalidDevice {
                    path: origin.to_string(),
                    source: Box::new(source),
                },
            })?;
        if self.budget_bytes > device.memory_bytes {
            return Err(PlanError {
                kind: PlanErrorKind::BudgetOverDevice {
                    path: origin.to_string(),
                    budget_bytes: self.budget_bytes,
                    device: device.name.clone(),
                    memory_bytes: device.memory_bytes,
                },
            });
        }
        Ok(())
    }

    /// Checks that the plan was made for `graph`.
    pub fn check_graph(&self, graph: &Graph) -> Result<(), PlanError> {
        let fingerprint = graph_fingerprint(graph);
        if fingerprint != self.graph.fingerprint {
            return Err(PlanError {
                kind: PlanErrorKind::GraphMismatch {
                    expected: self.graph.fingerprint.clone(),
                    found: fingerprint,
                },
            });
        }
        Ok(())
    }
}

/// What a JSON file that does not parse as a plan is instead, where it is
/// another of outcore's files (by its `format` field, or by the keys of
/// `outcore compare --json` output, which has none): a serde message about
/// a missing or mistyped field would name the symptom, not the mix-up.
fn other_outcore_file(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let object = value.as_object()?;
    let what = match object.get("format").and_then(|f| f.as_str()) {
        Some(PLAN_FORMAT) => return None,
        Some("outcore-graph/1") => {
            "a graph file (`outcore-graph/1`); plan it with `outcore plan --graph FILE ... -o plan.json`"
        }
        Some("outcore-jobs/1") => "a job list (`outcore-jobs/1`) for `outcore colocate`",
        Some("outcore-alloc-trace/1") => {
            "an allocation trace (`outcore-alloc-trace/1`) for `outcore alloc-replay`"
        }
        Some("outcore-latency-table/1") => {
            "a latency table (`outcore-latency-table/1`) for `--latency-table`"
        }
        Some(_) => return None,
        None if object.contains_key("results") && object.contains_key("lower_bound") => {
            "the output of `outcore compare --json`; write one planner's plan with `outcore plan --planner NAME ... -o plan.json`"
        }
        None => return None,
    };
    Some(what.to_string())
}

/// An error reading or matching a plan.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct PlanError {
    pub kind: PlanErrorKind,
}

/// What went wrong with a plan file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanErrorKind {
    #[error("{path} is not a valid outcore plan: {detail}")]
    Parse { path: String, detail: String },
    /// The file is another of outcore's files (`what` says which, and
    /// what to do).
    #[error("{path} is not an outcore plan (`outcore-plan/1`) but {what}")]
    NotAPlan { path: String, what: String },
    #[error("{path}: unsupported plan format `{found}` (expected `outcore-plan/1`)")]
    UnsupportedFormat { path: String, found: String },
    #[error(
        "the plan was made for another graph (fingerprint {expected}, this graph {found}); re-run `outcore plan` for this graph"
    )]
    GraphMismatch { expected: String, found: String },
    /// The embedded device profile has a field out of range.
    #[error("{path}: {source}; fix the plan's `device` or re-run `outcore plan`")]
    InvalidDevice {
        path: String,
        // Boxed: a profile error is large and rare, plan errors are returned often.
        #[source]
        source: Box<CostError>,
    },
    /// The plan's budget is more memory than its device has.
    #[error(
        "{path}: the budget of {budget_bytes} bytes is larger than the memory of its device `{device}` ({memory_bytes} bytes); the budget must lie in [1, {memory_bytes}] bytes: re-plan with a smaller --budget or for a larger device"
    )]
    BudgetOverDevice {
        path: String,
        budget_bytes: u64,
        device: String,
        memory_bytes: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};

    fn plan_on(device: DeviceProfile, budget_bytes: u64) -> Plan {
        let mut b = GraphBuilder::new("t", 2, DType::Float32);
        let x = b.input("x", &[2, 4]);
        let y = b.label("y", &[2]);
        let h = b.linear("fc", x, 3, true);
        let loss = b.softmax_cross_entropy(h, y);
        let graph = b.finish(loss, Optimizer::None).expect("graph");
        let info = PlannerInfo {
            name: "test".into(),
            seed: None,
            settings: serde_json::Value::Null,
        };
        let mut plan = Plan::new(&graph, info, budget_bytes);
        plan.device = Some(device);
        plan
    }

    fn a100() -> DeviceProfile {
        DeviceProfile::builtin("a100-40gb").expect("built in")
    }

    #[test]
    fn another_outcore_file_is_named_instead_of_a_missing_field() {
        let graph = r#"{"format": "outcore-graph/1", "meta": {}, "tensors": [], "ops": []}"#;
        let err = Plan::from_json(graph, "g.json").expect_err("a graph is not a plan");
        assert!(matches!(err.kind, PlanErrorKind::NotAPlan { .. }), "{err}");
        assert!(err.to_string().contains("outcore plan --graph"), "{err}");
        let compare =
            r#"{"model": "mlp", "lower_bound": {"Time": {"time_s": 1.0}}, "results": []}"#;
        let err = Plan::from_json(compare, "c.json").expect_err("compare output is not a plan");
        assert!(err.to_string().contains("outcore compare --json"), "{err}");
        // Anything else keeps serde's message, which names the field.
        let err =
            Plan::from_json(r#"{"format": "outcore-plan/1"}"#, "p.json").expect_err("no fields");
        assert!(matches!(err.kind, PlanErrorKind::Parse { .. }), "{err}");
        let err = Plan::from_json("[1, 2]", "p.json").expect_err("not an object");
        assert!(matches!(err.kind, PlanErrorKind::Parse { .. }), "{err}");
    }

    #[test]
    fn a_typed_device_round_trips() {
        let plan = plan_on(a100(), 1 << 20);
        let back = Plan::from_json(&plan.to_json(), "p.json").expect("loads");
        assert_eq!(back, plan);
        // Plans without a device (`null`, or no field at all) still load.
        let mut doc: serde_json::Value = serde_json::from_str(&plan.to_json()).expect("json");
        doc["device"] = serde_json::Value::Null;
        let none = Plan::from_json(&doc.to_string(), "p.json").expect("loads");
        assert_eq!(none.device, None);
        doc.as_object_mut().expect("object").remove("device");
        assert!(Plan::from_json(&doc.to_string(), "p.json").is_ok());
    }

    #[test]
    fn a_bad_device_is_refused_on_load() {
        let mut doc: serde_json::Value =
            serde_json::from_str(&plan_on(a100(), 1 << 20).to_json()).expect("json");
        doc["device"]["h2d_bytes_per_s"] = serde_json::json!(-1e9);
        let msg = Plan::from_json(&doc.to_string(), "p.json")
            .expect_err("negative rate")
            .to_string();
        assert!(msg.contains("p.json"), "{msg}");
        assert!(msg.contains("`h2d_bytes_per_s`"), "{msg}");
        assert!(msg.contains("-1000000000"), "{msg}");

        doc["device"]["h2d_bytes_per_s"] = serde_json::json!(2.5e10);
        doc["device"]["kernel_launch_s"] = serde_json::json!(1e308);
        let msg = Plan::from_json(&doc.to_string(), "p.json")
            .expect_err("absurd launch time")
            .to_string();
        assert!(msg.contains("`kernel_launch_s`"), "{msg}");
        assert!(msg.contains("[0, 1] seconds"), "{msg}");
    }

    #[test]
    fn a_budget_over_the_device_memory_is_refused_on_load() {
        let mut small = a100();
        small.memory_bytes = 1000;
        let plan = plan_on(small, 1001);
        let err = Plan::from_json(&plan.to_json(), "p.json").expect_err("over memory");
        assert!(matches!(err.kind, PlanErrorKind::BudgetOverDevice { .. }));
        let msg = err.to_string();
        assert!(msg.contains("1001 bytes"), "{msg}");
        assert!(msg.contains("[1, 1000]"), "{msg}");
    }
}
