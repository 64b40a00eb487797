//! `execute()`: runs a Plan on a Backend for N iterations with real buffers.
//!
//! The host issues the three stream programs in a topological order of the plan
//! (a step is issued once every step it waits for has been issued), turning waits
//! into event waits, so the device runs the streams concurrently exactly as the
//! plan orders them. Device memory is allocated on the host at issue time; a `Free`
//! only returns memory to the allocator once the event recorded after it has
//! completed, so memory is never reused while a copy or kernel may still touch it.
//! When an allocation does not fit, the executor drains in-flight frees (waits for
//! their events) and retries before failing with `OutOfDeviceMemory`.
//!
//! [`execute_swapping`] takes new plans of the same graph at iteration
//! boundaries (TENSILE's Executor "checks whether the scheduling plan has been
//! updated each time before a new round of calculation", Sec. III). At a swap the
//! device is quiet (every stream synchronised, every free reclaimed), so the
//! switch is a full hand-over rather than a diff of two plans' residencies:
//! every device-resident persistent tensor (parameters, buffers, optimizer
//! state) is copied to its host buffer, the arena allocator is rebuilt from the
//! new plan's allocator and budget, and the tensors the new plan starts with on
//! the device are copied back in, exactly as a fresh run of that plan places
//! them. The host copies are checksummed, so with `check` a later swap-in of any
//! of them is verified against the value carried over.

use crate::arena::ArenaAllocator;
use crate::backend::{
    Backend, ChecksumHandle, DeviceSegment, EventHandle, HostBuffer, KernelCall, Operand,
    StreamHandle, StreamKind, fnv1a,
};
use crate::{ExecError, ExecErrorKind};
use outcore_cost::{
    CopyDirection, MeasuredCopies, MeasuredCopyEntry, MeasuredEntry, MeasuredTable,
};
use outcore_graph::{DType, Graph, OpId, OpKind, TensorId, TensorKind};
use outcore_plan::{Instr, Plan, Residency, Step, StepRef, Stream};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How to run a plan.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Training iterations to run.
    pub iters: u32,
    /// Checksum tensors at swap-out and verify them at swap-in; compare recomputed
    /// tensors with the originals.
    pub check: bool,
    /// Seed of parameter initialisation and input generation.
    pub seed: u64,
    /// Number of distinct input batches cycled through (1: the same batch every
    /// iteration, so the loss of a working run decreases).
    pub distinct_batches: u64,
    /// Speed assumed for synthetic stand-in kernels: they sleep `flops / rate`.
    pub synthetic_flops_per_s: f64,
    /// Record a Chrome trace of every step.
    pub trace: bool,
    /// Run every op on the synthetic stand-in kernel (for graphs too large for the
    /// CPU's reference kernels, e.g. ResNet-50 at batch 32).
    pub synthetic_kernels: bool,
    /// Seconds each op's synthetic kernel takes, indexed by op id (e.g. the cost
    /// model's prediction, so measured and simulated times price ops alike);
    /// `None`: `flops / synthetic_flops_per_s`.
    pub op_time_s: Option<Vec<f64>>,
    /// The order in which to issue the plan's steps (every step exactly once,
    /// each stream's steps in their own order), e.g. the simulator's start
    /// order (`SimOutput::start_order`). A real allocator (size classes,
    /// best-fit) is only known to fit the plan for the sequence of allocations
    /// and frees it was simulated with; issuing in that order, each
    /// allocation after the frees issued before it have been applied (the
    /// executor waits for them), hands it the same sequence. `None`:
    /// greedily, compute first, frees applied as they complete.
    pub issue_order: Option<Vec<StepRef>>,
    /// Told after each iteration; returning `false` stops the run before the
    /// next one with [`ExecErrorKind::Interrupted`] (a Ctrl-C, say).
    pub on_iteration: Option<IterationHook>,
    /// Device bytes counted together with other runs (jobs sharing one
    /// arena): this run adds its allocations and removes its frees, and its
    /// remaining bytes when it ends.
    pub shared_usage: Option<std::sync::Arc<SharedUsage>>,
}

/// Device bytes allocated by several runs together; its peak is their
/// measured global peak (requested sizes, including frees still in flight,
/// as [`RunReport::peak_device_bytes`] counts one run's).
#[derive(Debug, Default)]
pub struct SharedUsage {
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
}

impl SharedUsage {
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::SeqCst)
    }

    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes.load(Ordering::SeqCst)
    }

    fn add(&self, bytes: u64) {
        let now = self.live_bytes.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak_bytes.fetch_max(now, Ordering::SeqCst);
    }

    fn sub(&self, bytes: u64) {
        self.live_bytes.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// A plan to switch to at an iteration boundary (see [`execute_swapping`]).
#[derive(Debug, Clone)]
pub struct PlanSwap<'p> {
    /// Iterations run before the switch (1 to the run's iterations - 1).
    pub after_iteration: u32,
    /// The new plan, for the same graph.
    pub plan: &'p Plan,
    /// Its issue order (see [`ExecOptions::issue_order`]); `None`: greedily.
    pub issue_order: Option<Vec<StepRef>>,
}

/// Called with (iterations done, iterations asked for) after each iteration;
/// `false` stops the run.
#[derive(Clone)]
pub struct IterationHook(pub std::sync::Arc<dyn Fn(u32, u32) -> bool + Send + Sync>);

impl std::fmt::Debug for IterationHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IterationHook")
    }
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            iters: 1,
            check: false,
            seed: 0,
            distinct_batches: 1,
            synthetic_flops_per_s: 1e10,
            trace: true,
            synthetic_kernels: false,
            op_time_s: None,
            issue_order: None,
            on_iteration: None,
            shared_usage: None,
        }
    }
}

/// What a run did and measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub planner: String,
    pub graph_model: String,
    pub device: String,
    pub iters: u32,
    /// Wall time of each iteration, issue to completion.
    pub iter_times_s: Vec<f64>,
    /// Median of `iter_times_s` after the first iteration (the first if only one).
    pub measured_iter_time_s: f64,
    /// Highest device bytes allocated at once (requested sizes, including memory
    /// whose free was still in flight).
    pub peak_device_bytes: u64,
    /// Bytes copied host-to-device by swap-ins, per iteration.
    pub swap_in_bytes: u64,
    /// Bytes copied device-to-host by swap-outs, per iteration.
    pub swap_out_bytes: u64,
    /// Recomputations per iteration.
    pub recomputes: u64,
    /// `Some(true)` when `check` was on and every comparison matched (a mismatch
    /// stops the run with `CheckFailed`), `None` without `check`.
    pub checks_passed: Option<bool>,
    /// Checksum comparisons made over the whole run.
    pub checks_run: u64,
    /// The loss of each iteration (NaN when the graph has no f32 scalar loss).
    pub losses: Vec<f32>,
    /// Median op and copy times of the iterations after the first, in the
    /// format `--latency-table` reads (`outcore-latency-table/1`).
    pub latency_table: MeasuredTable,
    /// Chrome trace (Trace Event JSON), one track per stream; `Null` without `trace`.
    pub trace: serde_json::Value,
    final_state: BTreeMap<String, Vec<u8>>,
}

impl RunReport {
    /// Final bytes of every persistent tensor (parameters, buffers, optimizer
    /// state) by name.
    pub fn final_state(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.final_state
    }

    /// Final value of a persistent f32 tensor by name.
    pub fn final_f32(&self, name: &str) -> Option<Vec<f32>> {
        self.final_state.get(name).map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

/// A checksum that is known or still being computed on the device.
#[derive(Debug, Clone, Copy)]
enum Expected {
    Known(u64),
    Pending(ChecksumHandle),
}

/// A recomputation's scratch slot under an `offsets` layout: where it starts
/// in the region, and each unkept output's offset inside it.
#[derive(Debug)]
struct Scratch {
    offset_bytes: u64,
    pieces: Vec<(TensorId, u64)>,
}

impl Scratch {
    /// Where output `t` (of `size_bytes`) lies, if the slot holds it.
    fn segment_of(&self, t: TensorId, size_bytes: u64) -> Option<DeviceSegment> {
        let &(_, at) = self.pieces.iter().find(|(p, _)| *p == t)?;
        Some(DeviceSegment::new(self.offset_bytes + at, size_bytes))
    }
}

/// A tensor's device allocation: its allocator key and the region segments
/// holding its bytes in order (one unless the allocator maps chunks).
#[derive(Debug, Clone)]
struct Resident {
    key: u64,
    segments: Vec<DeviceSegment>,
}

#[derive(Debug)]
struct Comparison {
    tensor: TensorId,
    stage: &'static str,
    expected: Option<Expected>,
    found: ChecksumHandle,
}

/// Measured durations of one run's steps: per op (its compute steps) and per
/// tensor and direction (its copies).
#[derive(Debug, Default)]
struct Samples {
    ops: BTreeMap<OpId, Vec<f64>>,
    copies: BTreeMap<(TensorId, CopyDirection), Vec<f64>>,
}

impl Samples {
    /// One step's duration, where it is a compute step or a copy.
    fn add(&mut self, instr: &Instr, dur_s: f64) {
        match instr {
            Instr::Compute(op) => self.ops.entry(*op).or_default().push(dur_s),
            Instr::SwapIn(t) => self
                .copies
                .entry((*t, CopyDirection::H2d))
                .or_default()
                .push(dur_s),
            Instr::SwapOut(t) => self
                .copies
                .entry((*t, CopyDirection::D2h))
                .or_default()
                .push(dur_s),
            _ => {}
        }
    }
}

/// A Chrome trace (`traceEvents`): one named thread per stream, then `events`.
fn chrome_trace(events: Vec<serde_json::Value>) -> serde_json::Value {
    let mut all: Vec<serde_json::Value> = StreamKind::ALL
        .iter()
        .map(|k| {
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 0,
                "tid": k.index(), "args": {"name": k.as_str()}})
        })
        .collect();
    all.extend(events);
    serde_json::json!({"traceEvents": all, "displayTimeUnit": "ms"})
}

#[derive(Debug)]
struct StepTiming {
    stream: usize,
    instr: Instr,
    start: EventHandle,
    end: EventHandle,
}

fn stream_kind(s: Stream) -> StreamKind {
    match s {
        Stream::Compute => StreamKind::Compute,
        Stream::H2d => StreamKind::H2d,
        Stream::D2h => StreamKind::D2h,
    }
}

fn bad_plan(detail: impl Into<String>) -> ExecError {
    ExecError::new(ExecErrorKind::BadPlan {
        detail: detail.into(),
    })
}

/// Runs `plan` on `backend` for `options.iters` iterations. The device region is
/// allocated with exactly `plan.budget_bytes`.
pub fn execute(
    graph: &Graph,
    plan: &Plan,
    backend: &dyn Backend,
    options: &ExecOptions,
) -> Result<RunReport, ExecError> {
    execute_swapping(graph, plan, &[], backend, options)
}

/// Runs `plan` and switches to each of `swaps` after its iteration, carrying
/// the persistent state over (see the module docs). The device region is
/// allocated with the largest budget of all the plans. `options.issue_order`
/// belongs to `plan`.
pub fn execute_swapping(
    graph: &Graph,
    plan: &Plan,
    swaps: &[PlanSwap<'_>],
    backend: &dyn Backend,
    options: &ExecOptions,
) -> Result<RunReport, ExecError> {
    check_swaps(graph, swaps, options.iters)?;
    let mut ex = Executor::new(graph, plan, backend, options)?;
    ex.swaps = swaps;
    ex.run()
}

/// Swaps must come in increasing order strictly inside the run, each with a
/// plan of this graph.
pub(crate) fn check_swaps(
    graph: &Graph,
    swaps: &[PlanSwap<'_>],
    iters: u32,
) -> Result<(), ExecError> {
    let mut previous = 0u32;
    for (i, swap) in swaps.iter().enumerate() {
        if swap.after_iteration <= previous || swap.after_iteration >= iters {
            return Err(ExecError::invalid(format!(
                "plan swap {i} is after iteration {}, accepted: {} to {} (after the previous swap, before the last of {iters} iterations); order the swaps by iteration and keep them inside the run",
                swap.after_iteration,
                previous + 1,
                iters.saturating_sub(1)
            )));
        }
        check_plan_fits_graph(swap.plan, graph)?;
        previous = swap.after_iteration;
    }
    Ok(())
}

fn check_plan_fits_graph(plan: &Plan, graph: &Graph) -> Result<(), ExecError> {
    if plan.graph.n_ops != graph.ops.len() || plan.graph.n_tensors != graph.tensors.len() {
        return Err(bad_plan(format!(
            "`{}`'s plan was made for a graph of {} ops and {} tensors, this one has {} and {}",
            plan.planner.name,
            plan.graph.n_ops,
            plan.graph.n_tensors,
            graph.ops.len(),
            graph.tensors.len()
        )));
    }
    Ok(())
}

/// Tensors the plan recomputes (their first computation is checksummed).
fn recompute_targets(plan: &Plan, n_tensors: usize) -> Vec<bool> {
    let mut targets = vec![false; n_tensors];
    for step in plan.stream(Stream::Compute) {
        if let Instr::Recompute { outputs, .. } = &step.instr {
            for t in outputs {
                if let Some(flag) = targets.get_mut(t.index()) {
                    *flag = true;
                }
            }
        }
    }
    targets
}

struct Executor<'a> {
    graph: &'a Graph,
    /// The plan of the current iteration.
    plan: &'a Plan,
    /// The plan the run started with.
    first_plan: &'a Plan,
    /// Its issue order.
    issue_order: Option<&'a [StepRef]>,
    /// Plans to switch to, by iteration.
    swaps: &'a [PlanSwap<'a>],
    be: &'a dyn Backend,
    opts: &'a ExecOptions,
    streams: [StreamHandle; 3],
    alloc: ArenaAllocator,
    next_key: u64,
    owner: Vec<TensorId>,
    dev: Vec<Option<Resident>>,
    sizes: BTreeMap<u64, u64>,
    live_bytes: u64,
    peak_bytes: u64,
    pending_frees: VecDeque<(EventHandle, u64)>,
    host: Vec<Option<HostBuffer>>,
    host_sum: Vec<Option<Expected>>,
    orig_sum: Vec<Option<Expected>>,
    recompute_target: Vec<bool>,
    comparisons: Vec<Comparison>,
    checks_run: u64,
    loss_host: Option<HostBuffer>,
    loss_copied: bool,
    iteration: u64,
    swap_in_bytes: u64,
    swap_out_bytes: u64,
    recomputes: u64,
    timings: Vec<StepTiming>,
}

impl<'a> Executor<'a> {
    fn new(
        graph: &'a Graph,
        plan: &'a Plan,
        be: &'a dyn Backend,
        opts: &'a ExecOptions,
    ) -> Result<Self, ExecError> {
        check_plan_fits_graph(plan, graph)?;
        let alloc = ArenaAllocator::from_spec(&plan.allocator, plan.budget_bytes)?;
        let n = graph.tensors.len();
        let recompute_target = recompute_targets(plan, n);
        Ok(Executor {
            graph,
            plan,
            first_plan: plan,
            issue_order: opts.issue_order.as_deref(),
            swaps: &[],
            be,
            opts,
            streams: StreamKind::ALL.map(|k| be.stream(k)),
            alloc,
            next_key: 1,
            owner: graph
                .tensors
                .iter()
                .map(|t| graph.storage_owner(t.id))
                .collect(),
            dev: vec![None; n],
            sizes: BTreeMap::new(),
            live_bytes: 0,
            peak_bytes: 0,
            pending_frees: VecDeque::new(),
            host: vec![None; n],
            host_sum: vec![None; n],
            orig_sum: vec![None; n],
            recompute_target,
            comparisons: Vec::new(),
            checks_run: 0,
            loss_host: None,
            loss_copied: false,
            iteration: 0,
            swap_in_bytes: 0,
            swap_out_bytes: 0,
            recomputes: 0,
            timings: Vec::new(),
        })
    }

    fn stream(&self, s: StreamKind) -> StreamHandle {
        self.streams[s.index()]
    }

    fn sync_all(&self) -> Result<(), ExecError> {
        for s in self.streams {
            self.be.synchronize(s)?;
        }
        Ok(())
    }

    // ----- memory -----

    /// Returns completed frees to the allocator; with `wait`, blocks on the oldest first.
    fn reclaim(&mut self, wait_for_one: bool) -> Result<bool, ExecError> {
        let mut any = false;
        if wait_for_one && let Some(&(ev, _)) = self.pending_frees.front() {
            self.be.synchronize_event(ev)?;
        }
        let mut keep = VecDeque::with_capacity(self.pending_frees.len());
        while let Some((ev, key)) = self.pending_frees.pop_front() {
            if self.be.query_event(ev)? {
                self.alloc.free(key)?;
                self.release_bytes(key);
                any = true;
            } else {
                keep.push_back((ev, key));
            }
        }
        self.pending_frees = keep;
        Ok(any)
    }

    /// Stops counting the allocation `key` (its allocator block was freed).
    fn release_bytes(&mut self, key: u64) {
        let size_bytes = self.sizes.remove(&key).unwrap_or(0);
        self.live_bytes -= size_bytes;
        if let Some(usage) = &self.opts.shared_usage {
            usage.sub(size_bytes);
        }
    }

    /// Allocates `size_bytes` for `tensor` (a name for errors), draining in-flight
    /// frees when it does not fit.
    fn allocate(&mut self, tensor: TensorId, size_bytes: u64) -> Result<Resident, ExecError> {
        self.allocate_as(tensor, tensor.0 as u64, size_bytes)
    }

    /// [`Self::allocate`] of the bytes an `offsets` layout places as `owner`'s
    /// (the tensor itself, or a step's scratch slot).
    fn allocate_as(
        &mut self,
        tensor: TensorId,
        owner: u64,
        size_bytes: u64,
    ) -> Result<Resident, ExecError> {
        if self.issue_order.is_some() {
            // Replaying an issue order: every free issued before this
            // allocation reaches the allocator first, in the order issued,
            // so the allocator sees the sequence the order was simulated
            // with. Taking only the frees done by now (below) made the
            // sequence depend on the copy threads' timing: the tiny-cnn
            // `odswap` plan of `planners_at_40` under 64 KiB virtual chunks
            // ran out of memory in one CI rehearsal in several (128 KiB
            // asked, 236 KiB free in 64 KiB blocks).
            while !self.pending_frees.is_empty() {
                self.reclaim(true)?;
            }
        } else {
            self.reclaim(false)?;
        }
        let key = self.next_key;
        self.next_key += 1;
        // Persistent tensors and parameter gradients (alive from backward to the
        // optimizer step) go to the top of the arena, away from short-lived ones.
        let kind = self.graph.tensor(tensor).kind;
        let long_lived =
            kind.is_persistent() || kind == outcore_graph::TensorKind::ParameterGradient;
        loop {
            match self.alloc.allocate(key, owner, size_bytes, long_lived) {
                Ok(segments) => {
                    self.sizes.insert(key, size_bytes);
                    self.live_bytes += size_bytes;
                    self.peak_bytes = self.peak_bytes.max(self.live_bytes);
                    if let Some(usage) = &self.opts.shared_usage {
                        usage.add(size_bytes);
                    }
                    return Ok(Resident { key, segments });
                }
                Err(no_fit) => {
                    if self.pending_frees.is_empty() {
                        return Err(ExecError::new(ExecErrorKind::OutOfDeviceMemory {
                            tensor: self.graph.tensor(tensor).name.clone(),
                            bytes: size_bytes,
                            free_bytes: no_fit.free_bytes,
                            largest_free_block: no_fit.largest_free_block,
                        }));
                    }
                    self.reclaim(true)?;
                }
            }
        }
    }

    fn materialise(&mut self, t: TensorId) -> Result<Resident, ExecError> {
        if self.dev[t.index()].is_some() {
            return Err(bad_plan(format!(
                "`{}` is materialised while already resident",
                self.graph.tensor(t).name
            )));
        }
        let r = self.allocate(t, self.graph.tensor(t).size_bytes)?;
        self.dev[t.index()] = Some(r.clone());
        Ok(r)
    }

    fn resident(&self, t: TensorId) -> Result<Resident, ExecError> {
        let owner = self.owner[t.index()];
        self.dev[owner.index()].clone().ok_or_else(|| {
            bad_plan(format!(
                "`{}` is used while not resident on the device",
                self.graph.tensor(t).name
            ))
        })
    }

    fn host_buffer(&mut self, t: TensorId) -> Result<HostBuffer, ExecError> {
        if let Some(b) = self.host[t.index()] {
            return Ok(b);
        }
        let b = self.be.alloc_host(self.graph.tensor(t).size_bytes)?;
        self.host[t.index()] = Some(b);
        Ok(b)
    }

    /// Copies `size_bytes` from the start of a host buffer into `segments`, one
    /// copy per segment with the host offset advancing.
    fn copy_in(
        &self,
        stream: StreamHandle,
        host: HostBuffer,
        segments: &[DeviceSegment],
        size_bytes: u64,
    ) -> Result<(), ExecError> {
        let mut host_offset = 0;
        for seg in DeviceSegment::prefix(segments, size_bytes) {
            self.be
                .copy_h2d(stream, host, host_offset, seg.offset_bytes, seg.size_bytes)?;
            host_offset += seg.size_bytes;
        }
        Ok(())
    }

    /// Copies the first `size_bytes` of `segments` to the start of a host buffer.
    fn copy_out(
        &self,
        stream: StreamHandle,
        segments: &[DeviceSegment],
        host: HostBuffer,
        size_bytes: u64,
    ) -> Result<(), ExecError> {
        let mut host_offset = 0;
        for seg in DeviceSegment::prefix(segments, size_bytes) {
            self.be
                .copy_d2h(stream, seg.offset_bytes, host, host_offset, seg.size_bytes)?;
            host_offset += seg.size_bytes;
        }
        Ok(())
    }

    /// Queues the checksum of the first `size_bytes` of `segments`.
    fn checksum(
        &self,
        stream: StreamHandle,
        segments: &[DeviceSegment],
        size_bytes: u64,
    ) -> Result<ChecksumHandle, ExecError> {
        self.be
            .checksum_segments(stream, &DeviceSegment::prefix(segments, size_bytes))
    }

    // ----- data -----

    fn init_bytes(&self, t: TensorId, batch: u64) -> Vec<u8> {
        let tensor = self.graph.tensor(t);
        let n = tensor.numel() as usize;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
            self.opts.seed ^ fnv1a(tensor.name.as_bytes()) ^ batch.wrapping_mul(0x9e37_79b9),
        );
        match (tensor.kind, tensor.dtype) {
            (TensorKind::Parameter, DType::Float32) => {
                let vals: Vec<f32> = if tensor.shape.len() >= 2 {
                    let fan_in = (tensor.numel() / tensor.shape[0].max(1)).max(1) as f32;
                    let bound = 1.0 / fan_in.sqrt();
                    (0..n).map(|_| rng.random_range(-bound..bound)).collect()
                } else if tensor.name.ends_with("weight") {
                    vec![1.0; n]
                } else {
                    vec![0.0; n]
                };
                f32_bytes(&vals)
            }
            (TensorKind::Buffer, DType::Float32) if tensor.name.ends_with("running_var") => {
                f32_bytes(&vec![1.0; n])
            }
            (TensorKind::Input, DType::Float32) => {
                let vals: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                f32_bytes(&vals)
            }
            (TensorKind::Input | TensorKind::Label, DType::Int64) => {
                let range = self.index_range(t).max(1);
                (0..n)
                    .flat_map(|_| (rng.random_range(0..range) as i64).to_le_bytes())
                    .collect()
            }
            _ => vec![0u8; tensor.size_bytes as usize],
        }
    }

    /// Valid values of an integer input: the class count of a loss that reads it,
    /// or the row count of an embedding table it indexes.
    fn index_range(&self, t: TensorId) -> u64 {
        for op in &self.graph.ops {
            match op.kind {
                OpKind::SoftmaxCrossEntropy if op.inputs.get(1) == Some(&t) => {
                    if let Some(&c) = op
                        .inputs
                        .first()
                        .and_then(|l| self.graph.tensor(*l).shape.last())
                    {
                        return c;
                    }
                }
                OpKind::Embedding if op.inputs.first() == Some(&t) => {
                    if let Some(&rows) = op
                        .inputs
                        .get(1)
                        .and_then(|w| self.graph.tensor(*w).shape.first())
                    {
                        return rows;
                    }
                }
                _ => {}
            }
        }
        2
    }

    // ----- run -----

    fn run(&mut self) -> Result<RunReport, ExecError> {
        let (persistent, base) = self.set_up()?;
        let mut iter_times_s = Vec::new();
        let mut losses = Vec::new();
        let mut samples = Samples::default();
        let mut trace_events: Vec<serde_json::Value> = Vec::new();
        for iter in 0..self.opts.iters {
            let swaps = self.swaps;
            if let Some(swap) = swaps.iter().find(|s| s.after_iteration == iter) {
                self.switch_plan(swap, &persistent)?;
            }
            iter_times_s.push(self.run_iteration(iter)?);
            losses.push(self.read_loss()?);
            let done = iter + 1;
            if let Some(hook) = &self.opts.on_iteration
                && !(hook.0)(done, self.opts.iters)
                && done < self.opts.iters
            {
                return Err(ExecError::new(ExecErrorKind::Interrupted {
                    done,
                    asked: self.opts.iters,
                }));
            }
            self.collect_timings(iter, base, &mut samples, &mut trace_events)?;
        }
        let final_state = self.read_final_state(&persistent)?;
        let device = self.be.device_name();
        let table = self.latency_table(&device, samples.ops, samples.copies);
        let trace = if self.opts.trace {
            chrome_trace(trace_events)
        } else {
            serde_json::Value::Null
        };
        let after_first: Vec<f64> = iter_times_s.iter().skip(1).copied().collect();
        let planners: Vec<&str> = std::iter::once(self.first_plan_name())
            .chain(self.swaps.iter().map(|s| s.plan.planner.name.as_str()))
            .collect();
        Ok(RunReport {
            planner: planners.join(" -> "),
            graph_model: self.graph.meta.model.clone(),
            device,
            iters: self.opts.iters,
            measured_iter_time_s: if after_first.is_empty() {
                median(&iter_times_s)
            } else {
                median(&after_first)
            },
            iter_times_s,
            peak_device_bytes: self.peak_bytes,
            swap_in_bytes: self.swap_in_bytes,
            swap_out_bytes: self.swap_out_bytes,
            recomputes: self.recomputes,
            checks_passed: self.opts.check.then_some(true),
            checks_run: self.checks_run,
            losses,
            latency_table: table,
            trace,
            final_state,
        })
    }

    /// The device region (the largest budget of the plans the run uses),
    /// the persistent tensors' initial values placed where the first plan
    /// starts them, the loss's host buffer, and the event every trace time
    /// counts from. Returns the persistent tensors and that event.
    fn set_up(&mut self) -> Result<(Vec<TensorId>, EventHandle), ExecError> {
        let region_bytes = self
            .swaps
            .iter()
            .map(|s| s.plan.budget_bytes)
            .fold(self.plan.budget_bytes, u64::max);
        self.be.alloc_region(region_bytes)?;
        let persistent: Vec<TensorId> = self.graph.persistent_tensors().map(|t| t.id).collect();
        for &t in &persistent {
            let bytes = self.init_bytes(t, 0);
            let host = self.host_buffer(t)?;
            self.be.write_host(host, 0, &bytes)?;
        }
        self.place_persistent(&persistent)?;
        self.loss_host = Some(self.be.alloc_host(4)?);
        let base = self.be.record_event(self.stream(StreamKind::Compute))?;
        self.be.synchronize_event(base)?;
        Ok((persistent, base))
    }

    /// Iteration `iter`: its batch loaded, every step issued and finished,
    /// memory reclaimed and the checks closed. Returns its wall time (the
    /// issue and the wait, not the batch's load or the checks).
    fn run_iteration(&mut self, iter: u32) -> Result<f64, ExecError> {
        self.iteration = iter as u64;
        self.swap_in_bytes = 0;
        self.swap_out_bytes = 0;
        self.recomputes = 0;
        self.loss_copied = false;
        self.load_batch()?;
        let started = Instant::now();
        self.issue_iteration()?;
        self.sync_all()?;
        let time_s = started.elapsed().as_secs_f64();
        while !self.pending_frees.is_empty() {
            self.reclaim(true)?;
        }
        self.finish_checks()?;
        self.release_leftovers()?;
        Ok(time_s)
    }

    /// Latencies and trace events from the step events of iteration `iter`
    /// (latencies from the second iteration on, or from the only one), each
    /// event destroyed once read.
    fn collect_timings(
        &mut self,
        iter: u32,
        base: EventHandle,
        samples: &mut Samples,
        trace_events: &mut Vec<serde_json::Value>,
    ) -> Result<(), ExecError> {
        let measured = iter >= 1 || self.opts.iters == 1;
        for st in std::mem::take(&mut self.timings) {
            let dur = self.be.event_elapsed_s(st.start, st.end)?.max(0.0);
            if measured {
                samples.add(&st.instr, dur);
            }
            if self.opts.trace && !matches!(st.instr, Instr::Free(_)) {
                let ts = self.be.event_elapsed_s(base, st.start)?.max(0.0);
                let name = match &st.instr {
                    Instr::Compute(op) => self.graph.op(*op).name.clone(),
                    Instr::Recompute { op, .. } => {
                        format!("recompute {}", self.graph.op(*op).name)
                    }
                    other => format!("{other} ({})", self.tensor_of(other)),
                };
                trace_events.push(serde_json::json!({
                    "name": name, "cat": StreamKind::ALL[st.stream].as_str(), "ph": "X",
                    "ts": ts * 1e6, "dur": dur * 1e6, "pid": 0, "tid": st.stream,
                    "args": {"iter": iter, "instr": st.instr.to_string()}
                }));
            }
            self.be.destroy_event(st.start)?;
            self.be.destroy_event(st.end)?;
        }
        Ok(())
    }

    fn first_plan_name(&self) -> &'a str {
        self.first_plan.planner.name.as_str()
    }

    /// Puts every persistent tensor where the current plan starts it, from its
    /// host buffer (which holds its value): on the device, on the host, or both.
    fn place_persistent(&mut self, persistent: &[TensorId]) -> Result<(), ExecError> {
        let residency: BTreeMap<TensorId, Residency> =
            self.plan.initial_residency.iter().copied().collect();
        let h2d = self.stream(StreamKind::H2d);
        for &t in persistent {
            let host = self.host_buffer(t)?;
            let size = self.graph.tensor(t).size_bytes;
            let r = residency.get(&t).copied().unwrap_or(Residency::Device);
            self.host_sum[t.index()] = match r {
                Residency::DeviceAndHost | Residency::Host => {
                    Some(Expected::Known(fnv1a(&self.be.read_host(host, 0, size)?)))
                }
                Residency::Device => None,
            };
            if matches!(r, Residency::Device | Residency::DeviceAndHost) {
                let res = self.materialise(t)?;
                self.copy_in(h2d, host, &res.segments, size)?;
            }
        }
        self.be.synchronize(h2d)
    }

    /// Hands the device over from the current plan to `swap.plan` between two
    /// iterations (see the module docs). The streams are idle and every free
    /// has been reclaimed when this runs.
    fn switch_plan(
        &mut self,
        swap: &'a PlanSwap<'a>,
        persistent: &[TensorId],
    ) -> Result<(), ExecError> {
        let d2h = self.stream(StreamKind::D2h);
        for &t in persistent {
            if let Some(r) = self.dev[t.index()].clone() {
                let host = self.host_buffer(t)?;
                self.copy_out(d2h, &r.segments, host, self.graph.tensor(t).size_bytes)?;
            }
        }
        self.be.synchronize(d2h)?;
        for &t in persistent {
            if let Some(r) = self.dev[t.index()].take() {
                self.alloc.free(r.key)?;
                self.release_bytes(r.key);
            }
        }
        if self.live_bytes != 0 {
            return Err(bad_plan(format!(
                "{} device bytes are still allocated at the switch to `{}`'s plan after iteration {}",
                self.live_bytes, swap.plan.planner.name, swap.after_iteration
            )));
        }
        self.alloc = ArenaAllocator::from_spec(&swap.plan.allocator, swap.plan.budget_bytes)?;
        self.plan = swap.plan;
        self.issue_order = swap.issue_order.as_deref();
        self.recompute_target = recompute_targets(swap.plan, self.graph.tensors.len());
        self.place_persistent(persistent)
    }

    /// The measured table: each op's and each copy's median time, and one-way
    /// copy rates fitted to the copies.
    fn latency_table(
        &self,
        device: &str,
        op_samples: BTreeMap<OpId, Vec<f64>>,
        copy_samples: BTreeMap<(TensorId, CopyDirection), Vec<f64>>,
    ) -> MeasuredTable {
        let mut table = MeasuredTable::new(device, &self.graph.meta.model);
        table.entries = op_samples
            .into_iter()
            .map(|(op, s)| MeasuredEntry {
                op: op.0,
                name: self.graph.op(op).name.clone(),
                kind: Some(self.graph.op(op).kind.label()),
                time_s: median(&s),
                samples: s.len() as u64,
            })
            .collect();
        table.copy_entries = copy_samples
            .into_iter()
            .map(|((t, direction), s)| MeasuredCopyEntry {
                tensor: t.0,
                name: self.graph.tensor(t).name.clone(),
                direction,
                size_bytes: self.graph.tensor(t).size_bytes,
                time_s: median(&s),
                samples: s.len() as u64,
            })
            .collect();
        table.copies = MeasuredCopies::fit(&table.copy_entries);
        table
    }

    fn tensor_of(&self, instr: &Instr) -> String {
        match instr {
            Instr::SwapIn(t) | Instr::SwapOut(t) | Instr::Free(t) => self
                .graph
                .tensors
                .get(t.index())
                .map(|x| x.name.clone())
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// Inputs and labels arrive on the device at iteration start, with a host copy.
    fn load_batch(&mut self) -> Result<(), ExecError> {
        let h2d = self.stream(StreamKind::H2d);
        let batch = self.iteration % self.opts.distinct_batches.max(1);
        let inputs: Vec<TensorId> = self
            .graph
            .tensors
            .iter()
            .filter(|t| t.producer.is_none() && !t.is_persistent() && t.allocates())
            .filter(|t| !t.kind.is_persistent())
            .map(|t| t.id)
            .collect();
        for t in inputs {
            let bytes = self.init_bytes(t, batch);
            let host = self.host_buffer(t)?;
            self.be.write_host(host, 0, &bytes)?;
            self.host_sum[t.index()] = Some(Expected::Known(fnv1a(&bytes)));
            let r = self.materialise(t)?;
            self.copy_in(h2d, host, &r.segments, bytes.len() as u64)?;
        }
        self.be.synchronize(h2d)
    }

    fn issue_iteration(&mut self) -> Result<(), ExecError> {
        if let Some(order) = self.issue_order {
            return self.issue_in_order(order);
        }
        let plan = self.plan;
        let mut ends: [Vec<Option<EventHandle>>; 3] = [
            vec![None; plan.streams[0].len()],
            vec![None; plan.streams[1].len()],
            vec![None; plan.streams[2].len()],
        ];
        let mut cursor = [0usize; 3];
        let total: usize = plan.n_steps();
        let mut issued = 0usize;
        // Compute first, then d2h (frees there unblock memory), then h2d.
        let order = [Stream::Compute, Stream::D2h, Stream::H2d];
        while issued < total {
            let mut progressed = false;
            for s in order {
                let si = s.index();
                while let Some(step) = plan.streams[si].get(cursor[si]) {
                    let mut waits = Vec::with_capacity(step.waits.len());
                    let mut ready = true;
                    for w in &step.waits {
                        match ends[w.stream.index()].get(w.index as usize) {
                            Some(Some(ev)) => waits.push(*ev),
                            Some(None) => ready = false,
                            None => {
                                return Err(bad_plan(format!(
                                    "{s}#{} waits for {w}, which does not exist",
                                    cursor[si]
                                )));
                            }
                        }
                    }
                    if !ready {
                        break;
                    }
                    let end = self.issue_step(s, cursor[si], step, &waits)?;
                    ends[si][cursor[si]] = Some(end);
                    cursor[si] += 1;
                    issued += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return Err(bad_plan(
                    "its waits form a cycle, so some steps can never be issued",
                ));
            }
        }
        Ok(())
    }

    /// Issues every step in `order`, which must list each step once and each
    /// stream's steps in their own order, with every step after the steps it
    /// waits for.
    fn issue_in_order(&mut self, order: &[StepRef]) -> Result<(), ExecError> {
        let plan = self.plan;
        if order.len() != plan.n_steps() {
            return Err(bad_plan(format!(
                "its issue order lists {} steps, the plan has {}",
                order.len(),
                plan.n_steps()
            )));
        }
        let mut ends: [Vec<EventHandle>; 3] = Default::default();
        for at in order {
            let si = at.stream.index();
            let index = at.index as usize;
            let Some(step) = plan.streams[si]
                .get(index)
                .filter(|_| index == ends[si].len())
            else {
                return Err(bad_plan(format!(
                    "its issue order names {at} out of its stream's order (next is #{})",
                    ends[si].len()
                )));
            };
            let mut waits = Vec::with_capacity(step.waits.len());
            for w in &step.waits {
                match ends[w.stream.index()].get(w.index as usize) {
                    Some(ev) => waits.push(*ev),
                    None => {
                        return Err(bad_plan(format!(
                            "its issue order puts {at} before {w}, which it waits for"
                        )));
                    }
                }
            }
            let end = self.issue_step(at.stream, at.index as usize, step, &waits)?;
            ends[si].push(end);
        }
        Ok(())
    }

    /// Issues `step`, the `index`-th of stream `s`.
    fn issue_step(
        &mut self,
        s: Stream,
        index: usize,
        step: &Step,
        waits: &[EventHandle],
    ) -> Result<EventHandle, ExecError> {
        let kind = stream_kind(s);
        let stream = self.stream(kind);
        for &w in waits {
            self.be.wait_event(stream, w)?;
        }
        let start = self.be.record_event(stream)?;
        let mut free_after: Vec<u64> = Vec::new();
        match &step.instr {
            Instr::Compute(op) => self.compute(stream, *op, None, None, &mut free_after)?,
            Instr::Recompute { op, outputs } => {
                self.recomputes += 1;
                let slot = self.scratch(index, *op, outputs, &mut free_after)?;
                self.compute(stream, *op, Some(outputs), slot, &mut free_after)?
            }
            Instr::SwapIn(t) => {
                let t = *t;
                let host = self.host[t.index()].ok_or_else(|| {
                    bad_plan(format!(
                        "`{}` is swapped in but has no host copy",
                        self.graph.tensor(t).name
                    ))
                })?;
                let size = self.graph.tensor(t).size_bytes;
                let r = self.materialise(t)?;
                self.copy_in(stream, host, &r.segments, size)?;
                self.swap_in_bytes += size;
                if self.opts.check {
                    let found = self.checksum(stream, &r.segments, size)?;
                    self.comparisons.push(Comparison {
                        tensor: t,
                        stage: "swap-in",
                        expected: self.host_sum[t.index()],
                        found,
                    });
                }
            }
            Instr::SwapOut(t) => {
                let t = *t;
                let r = self.resident(t)?;
                let size = self.graph.tensor(t).size_bytes;
                let host = self.host_buffer(t)?;
                if self.opts.check {
                    let sum = self.checksum(stream, &r.segments, size)?;
                    self.host_sum[t.index()] = Some(Expected::Pending(sum));
                }
                self.copy_out(stream, &r.segments, host, size)?;
                self.swap_out_bytes += size;
            }
            Instr::Free(t) => {
                let t = *t;
                let r = self.dev[t.index()].clone().ok_or_else(|| {
                    bad_plan(format!(
                        "`{}` is freed while not resident",
                        self.graph.tensor(t).name
                    ))
                })?;
                let tensor = self.graph.tensor(t);
                if tensor.kind == TensorKind::Loss
                    && tensor.dtype == DType::Float32
                    && tensor.size_bytes == 4
                    && let Some(buf) = self.loss_host
                {
                    self.copy_out(stream, &r.segments, buf, 4)?;
                    self.loss_copied = true;
                }
                self.dev[t.index()] = None;
                free_after.push(r.key);
            }
        }
        let end = self.be.record_event(stream)?;
        for key in free_after {
            self.pending_frees.push_back((end, key));
        }
        self.timings.push(StepTiming {
            stream: s.index(),
            instr: step.instr.clone(),
            start,
            end,
        });
        Ok(end)
    }

    /// Under an `offsets` layout, the scratch slot of the recomputation of
    /// `op` at compute-stream index `step` (compute-stream steps come first in
    /// the global numbering), freed after the step, and where each output
    /// that `listed` does not keep lies in it ([`outcore_plan::scratch_pieces`]).
    /// `None` otherwise: then each such output is allocated on its own.
    fn scratch(
        &mut self,
        step: usize,
        op: OpId,
        listed: &[TensorId],
        free_after: &mut Vec<u64>,
    ) -> Result<Option<Scratch>, ExecError> {
        if !self.alloc.is_laid_out() || op.index() >= self.graph.ops.len() {
            return Ok(None);
        }
        let (slot_bytes, pieces) = outcore_plan::scratch_pieces(self.graph, op, Some(listed));
        let Some(&(first, _)) = pieces.first() else {
            return Ok(None);
        };
        let owner = self.graph.tensors.len() as u64 + step as u64;
        let r = self.allocate_as(first, owner, slot_bytes)?;
        free_after.push(r.key);
        Ok(Some(Scratch {
            offset_bytes: r.segments.first().map_or(0, |seg| seg.offset_bytes),
            pieces,
        }))
    }

    /// Launches an op; with `recompute`, re-materialises the listed outputs and puts
    /// the others in scratch memory freed after the step.
    fn compute(
        &mut self,
        stream: StreamHandle,
        op_id: OpId,
        recompute: Option<&Vec<TensorId>>,
        slot: Option<Scratch>,
        free_after: &mut Vec<u64>,
    ) -> Result<(), ExecError> {
        let graph = self.graph;
        let op = graph
            .ops
            .get(op_id.index())
            .ok_or_else(|| bad_plan(format!("op {op_id} does not exist")))?;
        let mut inputs = Vec::with_capacity(op.inputs.len());
        for &t in &op.inputs {
            let r = self.resident(t)?;
            inputs.push(operand(graph, t, r.segments, false));
        }
        let mut outputs = Vec::with_capacity(op.outputs.len());
        for &o in &op.outputs {
            let t = graph.tensor(o);
            let op_ref = match recompute {
                None => {
                    if t.allocates() {
                        self.materialise(o)?;
                    }
                    let r = self.resident(o)?;
                    operand(graph, o, r.segments, t.view_of.is_none())
                }
                Some(listed) if listed.contains(&o) => {
                    let r = self.materialise(o)?;
                    operand(graph, o, r.segments, true)
                }
                Some(_) => {
                    // Scratch for outputs the recomputation does not keep: in
                    // the step's slot under a layout, else on its own.
                    let placed = slot.as_ref().and_then(|s| s.segment_of(o, t.size_bytes));
                    let segments = match placed {
                        Some(segment) => vec![segment],
                        None => {
                            let r = self.allocate(o, t.size_bytes)?;
                            free_after.push(r.key);
                            r.segments
                        }
                    };
                    operand(graph, o, segments, true)
                }
            };
            outputs.push(op_ref);
        }
        let check_outputs: Vec<(TensorId, Vec<DeviceSegment>, u64)> = if self.opts.check {
            outputs
                .iter()
                .filter(|o| match recompute {
                    None => self.recompute_target[o.tensor.index()],
                    Some(listed) => listed.contains(&o.tensor),
                })
                .map(|o| (o.tensor, o.segments.clone(), o.size_bytes))
                .collect()
        } else {
            Vec::new()
        };
        self.be.launch(
            stream,
            KernelCall {
                op: op.id,
                op_name: op.name.clone(),
                // An op known only by name runs the synthetic kernel.
                kind: if self.opts.synthetic_kernels {
                    OpKind::Named {
                        name: op.kind.label(),
                    }
                } else {
                    op.kind.clone()
                },
                inputs,
                outputs,
                step: self.iteration + 1,
                synthetic_time_s: match &self.opts.op_time_s {
                    Some(times) => times.get(op.id.index()).copied().unwrap_or(0.0),
                    None => op.flops as f64 / self.opts.synthetic_flops_per_s.max(1.0),
                },
            },
        )?;
        for (t, segments, size) in check_outputs {
            let sum = self.checksum(stream, &segments, size)?;
            if recompute.is_some() {
                self.comparisons.push(Comparison {
                    tensor: t,
                    stage: "recompute",
                    expected: self.orig_sum[t.index()],
                    found: sum,
                });
            } else {
                self.orig_sum[t.index()] = Some(Expected::Pending(sum));
            }
        }
        Ok(())
    }

    fn resolve(&self, e: Expected) -> Result<u64, ExecError> {
        match e {
            Expected::Known(v) => Ok(v),
            Expected::Pending(h) => self.be.checksum_value(h)?.ok_or_else(|| {
                ExecError::new(ExecErrorKind::Backend {
                    detail: "a checksum did not complete after synchronize".into(),
                })
            }),
        }
    }

    fn finish_checks(&mut self) -> Result<(), ExecError> {
        for c in std::mem::take(&mut self.comparisons) {
            let name = self.graph.tensor(c.tensor).name.clone();
            let Some(expected) = c.expected else {
                return Err(bad_plan(format!(
                    "`{name}` has no reference checksum at {}",
                    c.stage
                )));
            };
            let expected = self.resolve(expected)?;
            let found = self.resolve(Expected::Pending(c.found))?;
            self.checks_run += 1;
            if expected != found {
                return Err(ExecError::new(ExecErrorKind::CheckFailed {
                    tensor: name,
                    stage: c.stage.to_string(),
                    expected,
                    found,
                }));
            }
        }
        Ok(())
    }

    /// Frees non-persistent tensors a plan left resident (a plan that verify()
    /// accepts leaves none), so the next iteration starts clean.
    fn release_leftovers(&mut self) -> Result<(), ExecError> {
        for t in &self.graph.tensors {
            if t.is_persistent() {
                continue;
            }
            if let Some(r) = self.dev[t.id.index()].take() {
                self.alloc.free(r.key)?;
                self.release_bytes(r.key);
            }
        }
        Ok(())
    }

    fn read_loss(&mut self) -> Result<f32, ExecError> {
        match (self.loss_copied, self.loss_host) {
            (true, Some(buf)) => {
                let b = self.be.read_host(buf, 0, 4)?;
                Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            _ => Ok(f32::NAN),
        }
    }

    fn read_final_state(
        &mut self,
        persistent: &[TensorId],
    ) -> Result<BTreeMap<String, Vec<u8>>, ExecError> {
        let compute = self.stream(StreamKind::Compute);
        for &t in persistent {
            if let Some(r) = self.dev[t.index()].clone() {
                let host = self.host_buffer(t)?;
                let size = self.graph.tensor(t).size_bytes;
                self.copy_out(compute, &r.segments, host, size)?;
            }
        }
        self.be.synchronize(compute)?;
        let mut out = BTreeMap::new();
        for &t in persistent {
            let tensor = self.graph.tensor(t);
            let bytes = match self.host[t.index()] {
                Some(h) => self.be.read_host(h, 0, tensor.size_bytes)?,
                None => Vec::new(),
            };
            out.insert(tensor.name.clone(), bytes);
        }
        Ok(out)
    }
}

impl Drop for Executor<'_> {
    /// A run that ends, finished or failed, no longer holds its device bytes.
    fn drop(&mut self) {
        if let Some(usage) = &self.opts.shared_usage {
            usage.sub(self.live_bytes);
        }
    }
}

/// A kernel operand of `t` held in `segments` (its owner's, for a view).
fn operand(graph: &Graph, t: TensorId, segments: Vec<DeviceSegment>, write: bool) -> Operand {
    let tensor = graph.tensor(t);
    Operand {
        tensor: t,
        segments,
        shape: tensor.shape.clone(),
        dtype: tensor.dtype,
        size_bytes: tensor.size_bytes,
        write,
        view: crate::view::view_map(graph, t),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}
