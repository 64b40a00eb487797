//! The `Backend` trait: the device operations the executor needs, mapped one to one
//! onto CUDA concepts (a device allocation, pinned host memory, streams, events,
//! async copies, kernel launches). Nothing here assumes the device is the CPU.
//!
//! Every operation is asynchronous unless it says otherwise: it is queued on a
//! stream and its failure may be reported by that call or by a later
//! [`Backend::synchronize`] / [`Backend::synchronize_event`] (like CUDA's sticky errors).

use crate::ExecError;
use outcore_graph::{DType, OpId, OpKind, TensorId};

/// The three streams of a device (CUDA: three `cudaStream_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamKind {
    Compute,
    H2d,
    D2h,
}

impl StreamKind {
    pub const ALL: [StreamKind; 3] = [StreamKind::Compute, StreamKind::H2d, StreamKind::D2h];

    pub fn index(self) -> usize {
        match self {
            StreamKind::Compute => 0,
            StreamKind::H2d => 1,
            StreamKind::D2h => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Compute => "compute",
            StreamKind::H2d => "h2d",
            StreamKind::D2h => "d2h",
        }
    }
}

/// A stream handle (CUDA: `cudaStream_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(pub u64);

/// A recorded event (CUDA: `cudaEvent_t` after `cudaEventRecord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(pub u64);

/// A pinned host buffer (CUDA: `cudaHostAlloc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostBuffer(pub u64);

/// The result slot of an asynchronous device checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChecksumHandle(pub u64);

/// A contiguous byte range `[offset_bytes, offset_bytes + size_bytes)` of the
/// device region.
///
/// A device tensor occupies one or more segments, in order: its bytes are the
/// concatenation of its segments. Contiguous allocators give one segment; a
/// virtual-address allocator (`virtual-chunks`) gives one per run of physically
/// adjacent chunks. The segments are plain device offsets and lengths: a CUDA
/// backend realises them by reserving one virtual range per tensor
/// (`cuMemAddressReserve`) and `cuMemMap`-ping each segment's chunks into it in
/// order, so its kernels and copies see one contiguous pointer; the CPU backend
/// gathers and scatters instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceSegment {
    pub offset_bytes: u64,
    pub size_bytes: u64,
}

impl DeviceSegment {
    pub fn new(offset_bytes: u64, size_bytes: u64) -> Self {
        DeviceSegment {
            offset_bytes,
            size_bytes,
        }
    }

    /// Total bytes of a segment list.
    pub fn total_bytes(segments: &[DeviceSegment]) -> u64 {
        segments.iter().map(|s| s.size_bytes).sum()
    }

    /// The segments holding the first `size_bytes` bytes of `segments` (the
    /// last one shortened; fewer bytes if `segments` hold fewer).
    pub fn prefix(segments: &[DeviceSegment], size_bytes: u64) -> Vec<DeviceSegment> {
        let mut out = Vec::new();
        let mut remaining = size_bytes;
        for s in segments {
            if remaining == 0 {
                break;
            }
            let len = s.size_bytes.min(remaining);
            out.push(DeviceSegment::new(s.offset_bytes, len));
            remaining -= len;
        }
        out
    }
}

/// One operand of a kernel: where it lives in the device region and its layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    pub tensor: TensorId,
    /// The device bytes of the operand (of its owner, for a view), in order; they
    /// total `size_bytes` (the owner's size for a view).
    pub segments: Vec<DeviceSegment>,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub size_bytes: u64,
    /// Whether the kernel writes this output (false for views, which alias storage
    /// the kernel must not touch).
    pub write: bool,
    /// For a view: how its contents derive from the owner's bytes in `segments`.
    pub view: Option<crate::view::ViewMap>,
}

/// A kernel launch: which op kind to run and the device addresses of its operands.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelCall {
    pub op: OpId,
    /// The op's name, for error messages.
    pub op_name: String,
    pub kind: OpKind,
    pub inputs: Vec<Operand>,
    pub outputs: Vec<Operand>,
    /// 1-based optimizer step (Adam's bias correction needs it).
    pub step: u64,
    /// How long a synthetic stand-in kernel should take (op kinds without a real kernel).
    pub synthetic_time_s: f64,
}

/// A device: one memory region, pinned host buffers, three streams, events,
/// async copies and kernels. Object safe; the executor uses `&dyn Backend`.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Short device name for reports, e.g. `cpu`.
    fn device_name(&self) -> String;

    /// Allocates the device region (CUDA: one `cudaMalloc` of the budget) that all
    /// device offsets refer to. Called once; a second call is an error.
    fn alloc_region(&self, size_bytes: u64) -> Result<(), ExecError>;

    /// Size of the device region (0 before [`Backend::alloc_region`]).
    fn region_size_bytes(&self) -> u64;

    /// Maps physical memory under `[offset, offset + size)` of the region
    /// (CUDA: `cuMemMap`), for virtual-address allocators. Optional.
    fn map_chunk(&self, offset_bytes: u64, size_bytes: u64) -> Result<(), ExecError> {
        let _ = (offset_bytes, size_bytes);
        Err(ExecError::new(crate::ExecErrorKind::Unsupported {
            feature: "virtual memory mapping (map_chunk)".into(),
        }))
    }

    /// Allocates a pinned host buffer, zero-filled.
    fn alloc_host(&self, size_bytes: u64) -> Result<HostBuffer, ExecError>;

    /// Releases a host buffer. No copy may be in flight on it.
    fn free_host(&self, buf: HostBuffer) -> Result<(), ExecError>;

    /// Writes host memory directly (synchronous; pinned memory is host-visible).
    /// No copy may be in flight on the range.
    fn write_host(&self, buf: HostBuffer, offset_bytes: u64, data: &[u8]) -> Result<(), ExecError>;

    /// Reads host memory directly (synchronous).
    fn read_host(
        &self,
        buf: HostBuffer,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<Vec<u8>, ExecError>;

    /// The stream of a kind.
    fn stream(&self, kind: StreamKind) -> StreamHandle;

    /// Records an event on a stream: it completes when all work queued before it does.
    fn record_event(&self, stream: StreamHandle) -> Result<EventHandle, ExecError>;

    /// Makes later work on `stream` wait until `event` completes (CUDA: `cudaStreamWaitEvent`).
    fn wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<(), ExecError>;

    /// Whether the event has completed (non-blocking).
    fn query_event(&self, event: EventHandle) -> Result<bool, ExecError>;

    /// Blocks the host until the event completes; reports a sticky error if one occurred.
    fn synchronize_event(&self, event: EventHandle) -> Result<(), ExecError>;

    /// Seconds between two completed events (non-negative when `end` follows `start`).
    fn event_elapsed_s(&self, start: EventHandle, end: EventHandle) -> Result<f64, ExecError>;

    /// Releases an event handle.
    fn destroy_event(&self, event: EventHandle) -> Result<(), ExecError>;

    /// Copies `size_bytes` from a host buffer to the device region, asynchronously.
    fn copy_h2d(
        &self,
        stream: StreamHandle,
        src: HostBuffer,
        src_offset_bytes: u64,
        dst_offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<(), ExecError>;

    /// Copies `size_bytes` from the device region to a host buffer, asynchronously.
    fn copy_d2h(
        &self,
        stream: StreamHandle,
        src_offset_bytes: u64,
        dst: HostBuffer,
        dst_offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<(), ExecError>;

    /// Launches a kernel, asynchronously.
    fn launch(&self, stream: StreamHandle, kernel: KernelCall) -> Result<(), ExecError>;

    /// Queues a 64-bit FNV-1a checksum of a device range (a small reduction kernel
    /// on a GPU); read it with [`Backend::checksum_value`] once the stream passed it.
    fn checksum(
        &self,
        stream: StreamHandle,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<ChecksumHandle, ExecError>;

    /// Queues the FNV-1a checksum of the concatenation of `segments` (a tensor
    /// that is not contiguous in the region). The default handles at most one
    /// segment through [`Backend::checksum`]; a backend that runs
    /// virtual-address allocators overrides it.
    fn checksum_segments(
        &self,
        stream: StreamHandle,
        segments: &[DeviceSegment],
    ) -> Result<ChecksumHandle, ExecError> {
        match segments {
            [] => self.checksum(stream, 0, 0),
            [one] => self.checksum(stream, one.offset_bytes, one.size_bytes),
            _ => Err(ExecError::new(crate::ExecErrorKind::Unsupported {
                feature: "checksums of non-contiguous tensors (checksum_segments)".into(),
            })),
        }
    }

    /// The checksum's value, `None` while it is still queued.
    fn checksum_value(&self, handle: ChecksumHandle) -> Result<Option<u64>, ExecError>;

    /// Blocks until all work queued on the stream completed; reports sticky errors.
    fn synchronize(&self, stream: StreamHandle) -> Result<(), ExecError>;
}

/// Starting state of [`fnv1a`], for checksumming in pieces with [`fnv1a_update`].
pub const FNV1A_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a, the checksum every backend must compute.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_update(FNV1A_OFFSET_BASIS, bytes)
}

/// Continues an FNV-1a checksum over `bytes`: folding the segments of a tensor
/// in order gives the checksum of their concatenation.
pub fn fnv1a_update(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
