//! Facts about a graph that the lowering, `verify()` and the simulator look up
//! for every step, computed once per graph: storage owners (views and in-place
//! updates resolved), each op's owners in operand order, in-place writers, and
//! per-tensor flags. A search scores thousands of schedules of one graph, so
//! these are built once and shared (read-only, `Sync`) by every scoring thread.

use outcore_graph::{Graph, OpId, TensorId};
use std::sync::atomic::{AtomicU64, Ordering};

/// Per-graph lookup tables; see the module docs.
#[derive(Debug, Clone)]
pub struct PreparedGraph {
    /// Unique to this construction (clones share it): the key under which
    /// the lowering caches what it derives from one op order of this graph
    /// (see `LowerScratch`). The tables are read-only once built; changing
    /// one in place would leave such a cache stale.
    id: u64,
    /// `graph.storage_owner(t)` for every tensor.
    pub owner: Vec<TensorId>,
    /// Per op: the storage owners of its inputs then outputs, each once, in
    /// first-appearance order (what `use_positions` counts as a use).
    op_owners: Csr<TensorId>,
    /// Per op: the storage owners it updates in place (through an output that
    /// is an `inplace_update_of`), in output order, repeats kept.
    op_written: Csr<TensorId>,
    /// Per storage owner: the ops that update it in place, ascending.
    writers: Csr<OpId>,
    /// Per op: the storage owners it reads (inputs not also written in place),
    /// each once, with the version graph order implies.
    op_reads: Csr<(TensorId, u32)>,
    /// Per op: the storage owners it writes in place (repeats kept), with the
    /// version graph order implies before the write.
    op_writes: Csr<(TensorId, u32)>,
    /// Per op: its outputs that own storage (what running it allocates), in
    /// output order. Kept here so that hot loops never touch the `Op` structs.
    op_allocated: Csr<TensorId>,
    /// Per op: `op_reads`, then `op_allocated`, then `op_writes`, as one list:
    /// the events of a `Compute` step in the order `verify()` checks them.
    op_accesses: Csr<(TensorId, Access)>,
    /// Per op: scratch bytes it holds while it runs.
    pub workspace_bytes: Vec<u64>,
    /// Per op: may be re-executed to rematerialise its outputs.
    pub recomputable: Vec<bool>,
    /// Per tensor: owns storage (neither a view nor an in-place update).
    pub allocates: Vec<bool>,
    /// Per tensor: a persistent graph input (parameter, buffer, optimizer state).
    pub persistent: Vec<bool>,
    /// Per tensor: an input or label of the step (no producer, not persistent):
    /// it arrives on the device with the batch and has a host copy.
    pub batch_input: Vec<bool>,
    /// Per tensor: the storage of a step output (never freed before the end).
    pub output_storage: Vec<bool>,
    /// Per tensor: bytes.
    pub size_bytes: Vec<u64>,
    /// Per tensor: the producing op.
    pub producer: Vec<Option<OpId>>,
    /// Persistent tensors, ascending.
    pub persistent_ids: Vec<TensorId>,
    /// Batch inputs that own storage, ascending: what each iteration
    /// allocates at its start.
    pub batch_input_ids: Vec<TensorId>,
    /// Per tensor: a non-persistent storage owner that some op uses and that
    /// is not a step output's storage: the lowering frees it after its last
    /// use (or after the recomputations it was brought back for).
    pub(crate) freed_after_use: Vec<bool>,
    /// The non-persistent storage owners freed at the end of the iteration
    /// whatever the schedule: step outputs' storage and owners no op uses.
    /// Ascending.
    pub(crate) freed_at_end: Vec<TensorId>,
    /// Every tensor's state at the start of `verify()`'s walk.
    pub(crate) verify_start: Vec<crate::verify::TensorState>,
}

/// How a step touches a storage owner: the events `verify()` checks (a
/// `Compute` step's are listed in [`PreparedGraph::op_accesses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A kernel reads it and needs this version (graph order implies it).
    Read(u32),
    /// A kernel allocates it: the producing op or a recomputation.
    Produce,
    /// A kernel updates it in place, expecting this version before the write.
    Write(u32),
    SwapIn,
    SwapOut,
    Free,
}

/// Compressed rows: row `i` is `items[start[i]..start[i + 1]]`.
#[derive(Debug, Clone, Default)]
struct Csr<T> {
    start: Vec<u32>,
    items: Vec<T>,
}

impl<T: Copy> Csr<T> {
    fn from_rows(rows: impl Iterator<Item = impl Iterator<Item = T>>) -> Self {
        let mut csr = Csr {
            start: vec![0],
            items: Vec::new(),
        };
        for row in rows {
            csr.items.extend(row);
            csr.start.push(csr.items.len() as u32);
        }
        csr
    }

    #[inline]
    fn row(&self, i: usize) -> &[T] {
        &self.items[self.start[i] as usize..self.start[i + 1] as usize]
    }
}

impl PreparedGraph {
    pub fn new(graph: &Graph) -> Self {
        let owner: Vec<TensorId> = graph
            .tensors
            .iter()
            .map(|t| graph.storage_owner(t.id))
            .collect();
        let op_owners = op_owner_rows(graph, &owner);
        let op_written = Csr::from_rows(graph.ops.iter().map(|op| {
            op.outputs
                .iter()
                .filter_map(|&o| graph.tensor(o).inplace_update_of)
                .map(|target| owner[target.index()])
                .collect::<Vec<_>>()
                .into_iter()
        }));
        let writers = writer_rows(graph, &op_written);
        let op_reads = read_rows(graph, &owner, &op_written, &writers);
        let op_writes = Csr::from_rows(graph.ops.iter().map(|op| {
            op_written
                .row(op.id.index())
                .iter()
                .map(|&o| (o, version(&writers, o, op.id)))
                .collect::<Vec<_>>()
                .into_iter()
        }));
        let persistent: Vec<bool> = graph.tensors.iter().map(|t| t.is_persistent()).collect();
        let op_allocated = Csr::from_rows(graph.ops.iter().map(|op| {
            op.outputs
                .iter()
                .copied()
                .filter(|&o| graph.tensor(o).allocates())
                .collect::<Vec<_>>()
                .into_iter()
        }));
        let op_accesses = Csr::from_rows((0..graph.ops.len()).map(|i| {
            let reads = op_reads.row(i).iter().map(|&(t, v)| (t, Access::Read(v)));
            let produces = op_allocated.row(i).iter().map(|&t| (t, Access::Produce));
            let writes = op_writes.row(i).iter().map(|&(t, v)| (t, Access::Write(v)));
            reads.chain(produces).chain(writes)
        }));
        let output_storage = graph.output_storage();
        let (freed_after_use, freed_at_end) =
            transient_frees(graph, &op_owners, &persistent, &output_storage);
        // Relaxed: only uniqueness matters, not ordering with other memory.
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let mut prepared = PreparedGraph {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            verify_start: Vec::new(),
            freed_after_use,
            freed_at_end,
            op_allocated,
            op_accesses,
            workspace_bytes: graph.ops.iter().map(|o| o.workspace_bytes).collect(),
            recomputable: graph.ops.iter().map(|o| o.recomputable).collect(),
            op_owners,
            op_written,
            writers,
            op_reads,
            op_writes,
            allocates: graph.tensors.iter().map(|t| t.allocates()).collect(),
            batch_input: graph
                .tensors
                .iter()
                .map(|t| t.producer.is_none() && !t.is_persistent())
                .collect(),
            output_storage,
            size_bytes: graph.tensors.iter().map(|t| t.size_bytes).collect(),
            producer: graph.tensors.iter().map(|t| t.producer).collect(),
            persistent_ids: graph
                .tensors
                .iter()
                .filter(|t| persistent[t.id.index()])
                .map(|t| t.id)
                .collect(),
            batch_input_ids: graph
                .tensors
                .iter()
                .filter(|t| t.producer.is_none() && !t.is_persistent() && t.allocates())
                .map(|t| t.id)
                .collect(),
            persistent,
            owner,
        };
        prepared.verify_start = crate::verify::initial_states(&prepared);
        prepared
    }

    pub fn n_tensors(&self) -> usize {
        self.owner.len()
    }

    /// This construction's unique id (see the field).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn n_ops(&self) -> usize {
        self.op_owners.start.len() - 1
    }

    /// The storage owners op `op` uses (see the field docs).
    #[inline]
    pub fn op_owners(&self, op: OpId) -> &[TensorId] {
        self.op_owners.row(op.index())
    }

    /// The outputs of `op` that own storage, in output order.
    #[inline]
    pub fn op_allocated(&self, op: OpId) -> &[TensorId] {
        self.op_allocated.row(op.index())
    }

    /// The events of a `Compute` step of `op`: its reads, allocations and
    /// in-place writes, in that order.
    #[inline]
    pub(crate) fn op_accesses(&self, op: OpId) -> &[(TensorId, Access)] {
        self.op_accesses.row(op.index())
    }

    /// The storage owners op `op` updates in place.
    #[inline]
    pub fn op_written(&self, op: OpId) -> &[TensorId] {
        self.op_written.row(op.index())
    }

    /// The storage owners op `op` reads (inputs it does not update in place),
    /// each once in input order, with the version it must see.
    #[inline]
    pub fn op_reads(&self, op: OpId) -> &[(TensorId, u32)] {
        self.op_reads.row(op.index())
    }

    /// The storage owners op `op` updates in place, with the version it must
    /// see before its write.
    #[inline]
    pub fn op_writes(&self, op: OpId) -> &[(TensorId, u32)] {
        self.op_writes.row(op.index())
    }

    /// The ops that update storage owner `t` in place, ascending.
    #[inline]
    pub fn writers(&self, t: TensorId) -> &[OpId] {
        self.writers.row(t.index())
    }
}

/// Per op, the distinct storage owners of its inputs and outputs, in operand
/// order.
fn op_owner_rows(graph: &Graph, owner: &[TensorId]) -> Csr<TensorId> {
    let mut row: Vec<TensorId> = Vec::new();
    Csr::from_rows(graph.ops.iter().map(|op| {
        row.clear();
        for &t in op.inputs.iter().chain(&op.outputs) {
            let o = owner[t.index()];
            if !row.contains(&o) {
                row.push(o);
            }
        }
        row.clone().into_iter()
    }))
}

/// Per storage owner, the ops that update it in place, in graph order.
fn writer_rows(graph: &Graph, op_written: &Csr<TensorId>) -> Csr<OpId> {
    let mut rows: Vec<Vec<OpId>> = vec![Vec::new(); graph.tensors.len()];
    for op in &graph.ops {
        for &w in op_written.row(op.id.index()) {
            rows[w.index()].push(op.id);
        }
    }
    Csr::from_rows(rows.into_iter().map(|r| r.into_iter()))
}

/// The version of owner `o` that op `op` sees: how many in-place updates
/// of it come before `op` in graph order.
fn version(writers: &Csr<OpId>, o: TensorId, op: OpId) -> u32 {
    writers.row(o.index()).partition_point(|w| *w < op) as u32
}

/// Per op, the distinct owners it reads without updating them, with the
/// version each read sees.
fn read_rows(
    graph: &Graph,
    owner: &[TensorId],
    op_written: &Csr<TensorId>,
    writers: &Csr<OpId>,
) -> Csr<(TensorId, u32)> {
    let mut reads: Vec<(TensorId, u32)> = Vec::new();
    Csr::from_rows(graph.ops.iter().map(|op| {
        let written = op_written.row(op.id.index());
        reads.clear();
        for &t in &op.inputs {
            let o = owner[t.index()];
            if !written.contains(&o) && !reads.iter().any(|r| r.0 == o) {
                reads.push((o, version(writers, o, op.id)));
            }
        }
        reads.clone().into_iter()
    }))
}

/// The transient tensors (allocated, not persistent) freed after their last
/// use (used by some op and not a graph output's storage), and the others,
/// freed at the iteration's end.
fn transient_frees(
    graph: &Graph,
    op_owners: &Csr<TensorId>,
    persistent: &[bool],
    output_storage: &[bool],
) -> (Vec<bool>, Vec<TensorId>) {
    let mut used = vec![false; graph.tensors.len()];
    for &o in &op_owners.items {
        used[o.index()] = true;
    }
    let transient = |t: &outcore_graph::Tensor| t.allocates() && !persistent[t.id.index()];
    let freed_after_use: Vec<bool> = graph
        .tensors
        .iter()
        .map(|t| transient(t) && used[t.id.index()] && !output_storage[t.id.index()])
        .collect();
    let freed_at_end = graph
        .tensors
        .iter()
        .filter(|t| transient(t) && !freed_after_use[t.id.index()])
        .map(|t| t.id)
        .collect();
    (freed_after_use, freed_at_end)
}
