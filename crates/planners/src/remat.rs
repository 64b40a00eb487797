//! Static facts shared by the recompute-only planners that reason about every
//! position themselves (`dtr` and the `checkmate-milp` reference): which
//! storage owners may leave the device and be rematerialised, where the others
//! are resident, what each position reads and allocates, and how long a
//! recomputation may be deferred before an in-place write changes what it reads.
//!
//! Both planners model memory exactly as the shared lowering and `verify()`
//! count it when a schedule holds only recompute gaps (one compute stream):
//! - before the first step of position `k`, everything freed after position
//!   `k - 1` is gone; the recomputations at `k` run first, in producer order,
//!   each holding the recomputed tensor plus scratch for its producer's other
//!   allocated outputs and workspace; then op `k` runs with its allocated
//!   outputs and workspace; frees follow op `k`;
//! - a persistent tensor is always resident (nothing is swapped);
//! - a [`Residence::Pinned`] owner (no recomputable producer, a step output,
//!   or never read after it is made) is resident from its production (or the
//!   iteration start) through its last use (or the end);
//! - a [`Residence::Rematerialisable`] owner is resident from production and
//!   may be freed after any position that uses it and recomputed before a later
//!   one. The lowering frees a gap's tensor only after a compute step at the
//!   gap's start (a use of it, or where its previous gap ended), which is why
//!   the planners treat a tensor recomputed at `k` as resident through op `k`.

use crate::framework::Ctx;
use outcore_graph::TensorId;

/// Where a storage owner lives when the planners do not move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Residence {
    /// Not a storage owner (a view or an in-place update): allocates nothing.
    NotOwner,
    /// A persistent graph input: resident for the whole iteration.
    Persistent,
    /// Resident over `[from, to]` (positions; `from == None`: from the start).
    Pinned { from: Option<usize>, to: usize },
    /// May be freed after a use and recomputed by its producer later.
    Rematerialisable,
}

/// Per-position and per-owner facts; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct RematFacts {
    pub n: usize,
    pub residence: Vec<Residence>,
    /// Position of the producer (`usize::MAX`: none).
    pub made_at: Vec<usize>,
    /// Compute time of the producer (what one recomputation costs).
    pub recompute_s: Vec<f64>,
    /// Last position that uses the owner (`made_at` when nothing reads it).
    pub last_use: Vec<usize>,
    /// Non-persistent storage owners the producer reads, deduplicated.
    pub parents: Vec<Vec<TensorId>>,
    /// Storage owners allocated by ops that read the owner, deduplicated.
    pub children: Vec<Vec<TensorId>>,
    /// Bytes a recomputation holds besides its tensor: the producer's
    /// workspace and its other allocated outputs (verify's scratch).
    pub scratch_bytes: Vec<u64>,
    /// The last position at which a recomputation still reads what the
    /// producer read: before the first in-place write, after production, to
    /// the owner itself or to any storage its producer reads (a write at `w`
    /// runs in op `w`, after the recomputations at `w`).
    pub version_horizon: Vec<usize>,
    /// Per position: the storage owners op `k` reads or writes in place
    /// (not the outputs it allocates).
    pub needs_at: Vec<Vec<TensorId>>,
    /// Per position: the storage owners op `k` allocates.
    pub outputs_at: Vec<Vec<TensorId>>,
    /// Per position: op `k`'s workspace.
    pub workspace_at: Vec<u64>,
    pub size_bytes: Vec<u64>,
    /// Bytes of every persistent tensor together.
    pub persistent_bytes: u64,
}

impl RematFacts {
    pub fn new(ctx: &Ctx<'_>) -> Self {
        let graph = ctx.graph;
        let n = ctx.n;
        let nt = graph.tensors.len();
        let output_storage = graph.output_storage();
        let size_bytes: Vec<u64> = graph.tensors.iter().map(|t| t.size_bytes).collect();
        let mut made_at = vec![usize::MAX; nt];
        let mut outputs_at: Vec<Vec<TensorId>> = vec![Vec::new(); n];
        let mut workspace_at = vec![0u64; n];
        for (k, &op_id) in ctx.order.iter().enumerate() {
            let op = graph.op(op_id);
            workspace_at[k] = op.workspace_bytes;
            for &o in &op.outputs {
                if graph.tensor(o).allocates() {
                    made_at[o.index()] = k;
                    outputs_at[k].push(o);
                }
            }
        }
        let needs_at: Vec<Vec<TensorId>> = (0..n)
            .map(|k| {
                ctx.owners_at[k]
                    .iter()
                    .copied()
                    .filter(|t| !outputs_at[k].contains(t))
                    .collect()
            })
            .collect();
        let mut parents: Vec<Vec<TensorId>> = vec![Vec::new(); nt];
        let mut children: Vec<Vec<TensorId>> = vec![Vec::new(); nt];
        let mut recompute_s = vec![0.0; nt];
        let mut scratch_bytes = vec![0u64; nt];
        for (k, outputs) in outputs_at.iter().enumerate() {
            let op = ctx.op_at(k);
            let mut read: Vec<TensorId> = op
                .inputs
                .iter()
                .map(|&i| graph.storage_owner(i))
                .filter(|&o| !graph.tensor(o).is_persistent())
                .collect();
            read.sort_unstable();
            read.dedup();
            let allocated_bytes: u64 = outputs.iter().map(|o| size_bytes[o.index()]).sum();
            for &o in outputs {
                parents[o.index()] = read.clone();
                recompute_s[o.index()] = ctx.op_time_s[k];
                scratch_bytes[o.index()] =
                    op.workspace_bytes + allocated_bytes - size_bytes[o.index()];
                for &r in &read {
                    if !children[r.index()].contains(&o) {
                        children[r.index()].push(o);
                    }
                }
            }
        }
        let last_use: Vec<usize> = (0..nt)
            .map(|i| ctx.uses[i].last().copied().unwrap_or(made_at[i]))
            .collect();
        let version_horizon = version_horizons(ctx, &made_at);
        let residence = (0..nt)
            .map(|i| {
                let t = graph.tensor(TensorId(i as u32));
                if !t.allocates() {
                    return Residence::NotOwner;
                }
                if t.is_persistent() {
                    return Residence::Persistent;
                }
                let uses = &ctx.uses[i];
                let rematerialisable = t.producer.is_some_and(|p| {
                    let op = graph.op(p);
                    op.recomputable && op.outputs.iter().all(|&o| graph.tensor(o).allocates())
                }) && !output_storage[i]
                    && size_bytes[i] > 0
                    && uses.len() > 1;
                if rematerialisable {
                    return Residence::Rematerialisable;
                }
                let to_end = output_storage[i] || uses.is_empty();
                Residence::Pinned {
                    from: t.producer.map(|_| made_at[i]),
                    to: if to_end {
                        n.saturating_sub(1)
                    } else {
                        last_use[i]
                    },
                }
            })
            .collect();
        let persistent_bytes = graph
            .tensors
            .iter()
            .filter(|t| t.is_persistent())
            .map(|t| t.size_bytes)
            .sum();
        RematFacts {
            n,
            residence,
            made_at,
            recompute_s,
            last_use,
            parents,
            children,
            scratch_bytes,
            version_horizon,
            needs_at,
            outputs_at,
            workspace_at,
            size_bytes,
            persistent_bytes,
        }
    }

    pub fn size(&self, t: TensorId) -> u64 {
        self.size_bytes[t.index()]
    }

    pub fn is_rematerialisable(&self, t: TensorId) -> bool {
        self.residence[t.index()] == Residence::Rematerialisable
    }

    /// Bytes op `k` allocates while it runs: its outputs and workspace.
    pub fn op_bytes(&self, k: usize) -> u64 {
        self.outputs_at[k]
            .iter()
            .map(|o| self.size_bytes[o.index()])
            .sum::<u64>()
            + self.workspace_at[k]
    }
}

/// See [`RematFacts::version_horizon`].
fn version_horizons(ctx: &Ctx<'_>, made_at: &[usize]) -> Vec<usize> {
    let graph = ctx.graph;
    let last_pos = ctx.n.saturating_sub(1);
    let first_write_after = |owner: TensorId, p: usize| -> usize {
        ctx.writes[owner.index()]
            .iter()
            .copied()
            .find(|&w| w > p)
            .unwrap_or(last_pos)
    };
    graph
        .tensors
        .iter()
        .map(|t| {
            let p = made_at[t.id.index()];
            let Some(producer) = t.producer.filter(|_| p != usize::MAX) else {
                return last_pos;
            };
            let mut h = first_write_after(t.id, p);
            for &i in &graph.op(producer).inputs {
                h = h.min(first_write_after(graph.storage_owner(i), p));
            }
            h
        })
        .collect()
}
