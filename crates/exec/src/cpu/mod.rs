//! `CpuBackend`: a device simulated with real memory and real concurrency. Device
//! memory is one arena of exactly the region's size, streams are worker threads
//! with FIFO queues, events are cross-thread signals, copies are memcpy (optionally
//! throttled to a link rate), and kernels are real f32 implementations.
//!
//! Operands may be non-contiguous ([`DeviceSegment`] lists, from a
//! virtual-address allocator): kernels gather their inputs from the segments
//! into contiguous buffers and scatter their outputs back, and checksums fold
//! over the segments in order. (A CUDA backend would map the chunks into one
//! virtual range instead; see [`DeviceSegment`].)
//!
//! Several jobs can share one device arena: [`CpuDevice`] owns the arena and
//! leases disjoint windows of it, each to its own [`CpuBackend`]
//! ([`CpuDevice::backend_in_window`]). A windowed backend has its own stream
//! workers, events, host buffers and sticky error (like one CUDA context per
//! job, as TENSILE runs each job's executor in its own process), and every device
//! offset it is given is checked against its window and then shifted by the
//! window's base, so no copy, kernel or checksum of one job can reach another
//! job's bytes, and one job's failure does not stop the others.

mod kernels;

use crate::backend::{
    Backend, ChecksumHandle, DeviceSegment, EventHandle, HostBuffer, KernelCall, StreamHandle,
    StreamKind, fnv1a_update,
};
use crate::{ExecError, ExecErrorKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use kernels::run_kernel;

/// Settings of a [`CpuBackend`].
#[derive(Debug, Clone, Default)]
pub struct CpuBackendOptions {
    /// Throttle copies so that `n` bytes take `n / rate` seconds (`None`: memcpy speed).
    pub link_bytes_per_s: Option<f64>,
    /// Test hooks that inject faults.
    pub faults: CpuFaults,
}

/// Fault injection for tests.
#[derive(Debug, Clone, Default)]
pub struct CpuFaults {
    /// The kernel of the op with this name returns an error.
    pub fail_kernel_named: Option<String>,
    /// After the device-to-host copy with this 0-based index completes, one byte of
    /// its destination host buffer is flipped (a corrupted host copy).
    pub flip_byte_after_d2h_copy: Option<u64>,
    /// With `fail_kernel_named`: the kernel fails only at this 1-based optimizer
    /// step (iteration), so a run fails part-way; `None`: at every step.
    pub fail_kernel_at_step: Option<u64>,
}

impl CpuFaults {
    fn kernel_fails(&self, call: &KernelCall) -> bool {
        self.fail_kernel_named.as_deref() == Some(call.op_name.as_str())
            && self.fail_kernel_at_step.is_none_or(|s| s == call.step)
    }
}

type HostMem = Arc<Mutex<Vec<u8>>>;
/// The device arena: one byte vector, shared by every backend leasing a window.
type DeviceMem = Arc<Mutex<Vec<u8>>>;

/// A cross-thread event: completion time, or `None` while pending.
#[derive(Debug, Default)]
struct Event {
    done_at: Mutex<Option<Instant>>,
    cv: Condvar,
}

impl Event {
    fn signal(&self) {
        let mut done = lock(&self.done_at);
        *done = Some(Instant::now());
        self.cv.notify_all();
    }

    fn wait(&self) -> Instant {
        let mut done = lock(&self.done_at);
        loop {
            if let Some(at) = *done {
                return at;
            }
            done = match self.cv.wait(done) {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
    }
}

/// Locks a mutex, recovering from poisoning (a panicked worker must not hide data).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

enum Command {
    H2d {
        src: HostMem,
        src_off: usize,
        dst_off: usize,
        len: usize,
    },
    D2h {
        src_off: usize,
        dst: HostMem,
        dst_off: usize,
        len: usize,
    },
    Kernel(Box<KernelCall>),
    Checksum {
        segments: Vec<DeviceSegment>,
        slot: Arc<Mutex<Option<u64>>>,
    },
    Record(Arc<Event>),
    Wait(Arc<Event>),
    Shutdown,
}

/// `len` zero bytes, or `None` where the allocation fails: an error to report,
/// not the process abort of `vec![0; len]`.
fn zeroed_bytes(len: usize) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).ok()?;
    bytes.resize(len, 0);
    Some(bytes)
}

/// State shared by the host side and the stream workers.
#[derive(Debug)]
struct Shared {
    arena: DeviceMem,
    /// The first asynchronous error; later work is skipped but events still fire,
    /// so nothing waits forever.
    sticky_error: Mutex<Option<ExecError>>,
    link_bytes_per_s: Option<f64>,
    faults: CpuFaults,
    d2h_copies: AtomicU64,
}

impl Shared {
    fn failed(&self) -> bool {
        lock(&self.sticky_error).is_some()
    }

    fn fail(&self, e: ExecError) {
        let mut slot = lock(&self.sticky_error);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// Sleeps so that a copy of `len` bytes that started at `start` lasts `len / rate`.
    fn throttle(&self, start: Instant, len: usize) {
        if let Some(rate) = self.link_bytes_per_s.filter(|r| *r > 0.0) {
            let target = Duration::from_secs_f64(len as f64 / rate);
            let spent = start.elapsed();
            if target > spent {
                std::thread::sleep(target - spent);
            }
        }
    }

    fn execute(&self, cmd: Command) {
        match cmd {
            Command::Record(ev) => ev.signal(),
            Command::Wait(ev) => {
                ev.wait();
            }
            Command::Shutdown => {}
            _ if self.failed() => {}
            Command::H2d {
                src,
                src_off,
                dst_off,
                len,
            } => {
                let start = Instant::now();
                {
                    let host = lock(&src);
                    let mut arena = lock(&self.arena);
                    arena[dst_off..dst_off + len].copy_from_slice(&host[src_off..src_off + len]);
                }
                self.throttle(start, len);
            }
            Command::D2h {
                src_off,
                dst,
                dst_off,
                len,
            } => self.copy_d2h(src_off, &dst, dst_off, len),
            Command::Checksum { segments, slot } => {
                let sum = {
                    let arena = lock(&self.arena);
                    segments
                        .iter()
                        .fold(crate::backend::FNV1A_OFFSET_BASIS, |h, seg| {
                            let off = seg.offset_bytes as usize;
                            fnv1a_update(h, &arena[off..off + seg.size_bytes as usize])
                        })
                };
                *lock(&slot) = Some(sum);
            }
            Command::Kernel(call) => self.kernel(&call),
        }
    }

    /// A device-to-host copy, with the injected fault that flips a byte of
    /// the chosen copy's destination.
    fn copy_d2h(&self, src_off: usize, dst: &HostMem, dst_off: usize, len: usize) {
        let start = Instant::now();
        {
            let arena = lock(&self.arena);
            let mut host = lock(dst);
            host[dst_off..dst_off + len].copy_from_slice(&arena[src_off..src_off + len]);
            let index = self.d2h_copies.fetch_add(1, Ordering::SeqCst);
            if self.faults.flip_byte_after_d2h_copy == Some(index) && len > 0 {
                host[dst_off + len / 2] ^= 0x5a;
            }
        }
        self.throttle(start, len);
    }

    /// A kernel: its inputs read, computed without holding the arena (copies
    /// on other streams may proceed), its outputs written; a stand-in lasts
    /// its modelled time. A failure (injected, an error, or a panic) is the
    /// backend's sticky error, never the stream worker's death.
    fn kernel(&self, call: &KernelCall) {
        if self.faults.kernel_fails(call) {
            self.fail(ExecError::new(ExecErrorKind::KernelFailed {
                op: call.op_name.clone(),
                detail: "injected fault".into(),
            }));
            return;
        }
        // A kernel's time covers reading its inputs and writing its outputs.
        let start = Instant::now();
        let inputs = self.read_inputs(call);
        // A kernel that panics (e.g. on shapes it cannot handle) must not kill
        // the stream worker, or every later event would hang the host.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_kernel(call, &inputs)))
                .unwrap_or_else(|_| Err("the kernel panicked on its operands".to_string()));
        match result {
            Ok((outputs, synthetic)) => {
                {
                    let mut arena = lock(&self.arena);
                    for (o, bytes) in call.outputs.iter().zip(outputs) {
                        if !o.write {
                            continue;
                        }
                        let n = (o.size_bytes as usize).min(bytes.len());
                        scatter(&mut arena, &o.segments, &bytes[..n]);
                    }
                }
                // A stand-in kernel lasts its modelled time in all (the work
                // above included), so the stream runs as the simulator assumes.
                if synthetic && call.synthetic_time_s > 0.0 {
                    let target = Duration::from_secs_f64(call.synthetic_time_s);
                    let spent = start.elapsed();
                    if target > spent {
                        std::thread::sleep(target - spent);
                    }
                }
            }
            Err(detail) => self.fail(ExecError::new(ExecErrorKind::KernelFailed {
                op: call.op_name.clone(),
                detail,
            })),
        }
    }

    /// A kernel's input bytes: each operand gathered from its segments, a
    /// view derived from its owner's bytes. Ops known only by name run the
    /// synthetic kernel, which hashes just the ends of each input: only those
    /// are read.
    fn read_inputs(&self, call: &KernelCall) -> Vec<Vec<u8>> {
        let sample_only = matches!(call.kind, outcore_graph::OpKind::Named { .. });
        let arena = lock(&self.arena);
        call.inputs
            .iter()
            .map(|o| {
                let span = o.view.as_ref().map_or(o.size_bytes, |m| m.owner_size_bytes) as usize;
                if sample_only {
                    let n = span.min(kernels::SYNTHETIC_SAMPLE_BYTES);
                    let mut sample = gather(&arena, &o.segments, 0, n);
                    sample.extend(gather(&arena, &o.segments, span - n, n));
                    return sample;
                }
                let bytes = gather(&arena, &o.segments, 0, span);
                match &o.view {
                    // A view reads its owner and derives its own contents.
                    Some(map) => crate::view::materialise(&bytes, map),
                    None => bytes,
                }
            })
            .collect()
    }
}

/// Bytes `[start, start + len)` of the concatenation of `segments` (bytes past
/// the segments' end are left out). Launch checked the segments lie in the arena.
fn gather(arena: &[u8], segments: &[DeviceSegment], start: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    // Logical position of the current segment's first byte.
    let mut logical = 0usize;
    let end = start + len;
    for seg in segments {
        let seg_len = seg.size_bytes as usize;
        let (lo, hi) = (start.max(logical), end.min(logical + seg_len));
        if lo < hi {
            let off = seg.offset_bytes as usize + (lo - logical);
            out.extend_from_slice(&arena[off..off + (hi - lo)]);
        }
        logical += seg_len;
        if logical >= end {
            break;
        }
    }
    out
}

/// Writes `bytes` over the start of the concatenation of `segments`.
fn scatter(arena: &mut [u8], segments: &[DeviceSegment], bytes: &[u8]) {
    let mut rest = bytes;
    for seg in segments {
        if rest.is_empty() {
            break;
        }
        let n = (seg.size_bytes as usize).min(rest.len());
        let off = seg.offset_bytes as usize;
        arena[off..off + n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

#[derive(Debug)]
struct Worker {
    tx: mpsc::Sender<Command>,
    handle: Option<JoinHandle<()>>,
}

/// A CPU-simulated device. See the module docs.
#[derive(Debug)]
pub struct CpuBackend {
    shared: Arc<Shared>,
    workers: Vec<Mutex<Worker>>,
    /// The region's size once [`Backend::alloc_region`] ran.
    region_bytes: Mutex<Option<u64>>,
    /// Where this backend's region lies in a shared [`CpuDevice`]; `None`: the
    /// backend owns its arena and the region is all of it.
    window: Option<Window>,
    events: Mutex<HashMap<u64, Arc<Event>>>,
    hosts: Mutex<HashMap<u64, HostMem>>,
    checksums: Mutex<HashMap<u64, Arc<Mutex<Option<u64>>>>>,
    next_id: AtomicU64,
}

impl CpuBackend {
    /// A backend with three stream workers and no region yet.
    pub fn new(options: CpuBackendOptions) -> Self {
        Self::with_memory(options, Arc::new(Mutex::new(Vec::new())), None)
    }

    fn with_memory(options: CpuBackendOptions, arena: DeviceMem, window: Option<Window>) -> Self {
        let shared = Arc::new(Shared {
            arena,
            sticky_error: Mutex::new(None),
            link_bytes_per_s: options.link_bytes_per_s,
            faults: options.faults,
            d2h_copies: AtomicU64::new(0),
        });
        let workers = StreamKind::ALL
            .iter()
            .map(|kind| {
                let (tx, rx) = mpsc::channel::<Command>();
                let shared = Arc::clone(&shared);
                let handle = std::thread::Builder::new()
                    .name(format!("outcore-cpu-{}", kind.as_str()))
                    .spawn(move || {
                        while let Ok(cmd) = rx.recv() {
                            if matches!(cmd, Command::Shutdown) {
                                break;
                            }
                            shared.execute(cmd);
                        }
                    })
                    .ok();
                Mutex::new(Worker { tx, handle })
            })
            .collect();
        CpuBackend {
            shared,
            workers,
            region_bytes: Mutex::new(None),
            window,
            events: Mutex::new(HashMap::new()),
            hosts: Mutex::new(HashMap::new()),
            checksums: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn send(&self, stream: StreamHandle, cmd: Command) -> Result<(), ExecError> {
        let worker = self
            .workers
            .get(stream.0 as usize)
            .ok_or_else(|| unknown("stream", stream.0))?;
        let w = lock(worker);
        if w.handle.is_none() {
            return Err(ExecError::new(ExecErrorKind::Backend {
                detail: "a stream worker thread could not be started".into(),
            }));
        }
        w.tx.send(cmd).map_err(|_| {
            ExecError::new(ExecErrorKind::Backend {
                detail: "a stream worker thread has stopped".into(),
            })
        })
    }

    fn event(&self, e: EventHandle) -> Result<Arc<Event>, ExecError> {
        lock(&self.events)
            .get(&e.0)
            .cloned()
            .ok_or_else(|| unknown("event", e.0))
    }

    fn host(&self, b: HostBuffer) -> Result<HostMem, ExecError> {
        lock(&self.hosts)
            .get(&b.0)
            .cloned()
            .ok_or_else(|| unknown("host buffer", b.0))
    }

    fn sticky(&self) -> Result<(), ExecError> {
        match lock(&self.shared.sticky_error).clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Checks `[off, off + len)` lies in the region and returns where it lies in
    /// the arena (shifted by the window's base).
    fn device_range(&self, what: &str, off: u64, len: u64) -> Result<u64, ExecError> {
        let size = self.region_size_bytes();
        if off.checked_add(len).is_none_or(|end| end > size) {
            return Err(ExecError::new(ExecErrorKind::OutOfRange {
                what: what.to_string(),
                detail: format!(
                    "device range [{off}, {off}+{len}) exceeds the {size}-byte device region"
                ),
            }));
        }
        Ok(off + self.window.as_ref().map_or(0, |w| w.base_bytes))
    }

    /// Checks and shifts every segment (see [`CpuBackend::device_range`]).
    fn device_segments(
        &self,
        what: &str,
        segments: &[DeviceSegment],
    ) -> Result<Vec<DeviceSegment>, ExecError> {
        segments
            .iter()
            .map(|s| {
                let at = self.device_range(what, s.offset_bytes, s.size_bytes)?;
                Ok(DeviceSegment::new(at, s.size_bytes))
            })
            .collect()
    }

    fn check_host_range(
        &self,
        what: &str,
        buf: &HostMem,
        off: u64,
        len: u64,
    ) -> Result<(), ExecError> {
        let size = lock(buf).len() as u64;
        if off.checked_add(len).is_none_or(|end| end > size) {
            return Err(ExecError::new(ExecErrorKind::OutOfRange {
                what: what.to_string(),
                detail: format!(
                    "host range [{off}, {off}+{len}) exceeds the {size}-byte host buffer"
                ),
            }));
        }
        Ok(())
    }
}

fn unknown(what: &str, id: u64) -> ExecError {
    ExecError::new(ExecErrorKind::UnknownHandle {
        what: what.to_string(),
        id,
    })
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        for w in &self.workers {
            let mut w = lock(w);
            let _ = w.tx.send(Command::Shutdown);
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
        // The workers are gone, so nothing touches the window any more: give it back.
        if let Some(w) = &self.window {
            lock(&w.leases).remove(&w.base_bytes);
        }
    }
}

/// A backend's window of a shared [`CpuDevice`]: `[base_bytes, base_bytes +
/// limit_bytes)` of the arena, leased until the backend is dropped.
#[derive(Debug)]
struct Window {
    base_bytes: u64,
    limit_bytes: u64,
    leases: Leases,
}

/// The windows leased out of a device: base -> size.
type Leases = Arc<Mutex<std::collections::BTreeMap<u64, u64>>>;

/// One device arena shared by several jobs, each running on its own
/// [`CpuBackend`] over a disjoint window of it (see the module docs).
#[derive(Debug, Clone)]
pub struct CpuDevice {
    arena: DeviceMem,
    capacity_bytes: u64,
    leases: Leases,
}

impl CpuDevice {
    /// A zero-filled arena of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Result<Self, ExecError> {
        let bytes = usize::try_from(capacity_bytes)
            .ok()
            .and_then(zeroed_bytes)
            .ok_or_else(|| {
                ExecError::invalid(format!(
                    "cannot allocate a shared device arena of {capacity_bytes} bytes in host memory; give a smaller capacity"
                ))
            })?;
        Ok(CpuDevice {
            arena: Arc::new(Mutex::new(bytes)),
            capacity_bytes,
            leases: Arc::default(),
        })
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// A backend whose device region is `[base_bytes, base_bytes + size_bytes)`
    /// of this arena (its `alloc_region` may ask for at most `size_bytes`). The
    /// window must lie in the arena and overlap no window leased to a backend
    /// that is still alive.
    pub fn backend_in_window(
        &self,
        base_bytes: u64,
        size_bytes: u64,
        options: CpuBackendOptions,
    ) -> Result<CpuBackend, ExecError> {
        let end = base_bytes.checked_add(size_bytes);
        if end.is_none_or(|e| e > self.capacity_bytes) {
            return Err(ExecError::invalid(format!(
                "window [{base_bytes}, {base_bytes}+{size_bytes}) exceeds the {}-byte shared arena; give a window inside it",
                self.capacity_bytes
            )));
        }
        let end = base_bytes + size_bytes;
        {
            let mut leases = lock(&self.leases);
            if let Some((b, s)) = leases
                .iter()
                .find(|&(&b, &s)| b < end && base_bytes < b + s && size_bytes > 0 && s > 0)
            {
                return Err(ExecError::invalid(format!(
                    "window [{base_bytes}, {base_bytes}+{size_bytes}) overlaps the window [{b}, {b}+{s}) leased to another backend; give disjoint windows"
                )));
            }
            leases.insert(base_bytes, size_bytes);
        }
        let window = Window {
            base_bytes,
            limit_bytes: size_bytes,
            leases: Arc::clone(&self.leases),
        };
        Ok(CpuBackend::with_memory(
            options,
            Arc::clone(&self.arena),
            Some(window),
        ))
    }

    /// A copy of `[offset_bytes, offset_bytes + size_bytes)` of the arena (for
    /// inspection; take it while no backend is writing there).
    pub fn read(&self, offset_bytes: u64, size_bytes: u64) -> Result<Vec<u8>, ExecError> {
        let arena = lock(&self.arena);
        offset_bytes
            .checked_add(size_bytes)
            .filter(|&e| e <= arena.len() as u64)
            .map(|e| arena[offset_bytes as usize..e as usize].to_vec())
            .ok_or_else(|| {
                ExecError::invalid(format!(
                    "range [{offset_bytes}, {offset_bytes}+{size_bytes}) exceeds the {}-byte shared arena",
                    arena.len()
                ))
            })
    }
}

impl Backend for CpuBackend {
    fn device_name(&self) -> String {
        "cpu".to_string()
    }

    fn alloc_region(&self, size_bytes: u64) -> Result<(), ExecError> {
        let mut region = lock(&self.region_bytes);
        if region.is_some() {
            return Err(ExecError::invalid(
                "the device region is already allocated; create a new backend for another region",
            ));
        }
        match &self.window {
            // A window of a shared arena: zero the part asked for, so a job sees
            // the same fresh memory as on a backend of its own.
            Some(w) => {
                if size_bytes > w.limit_bytes {
                    return Err(ExecError::invalid(format!(
                        "a region of {size_bytes} bytes does not fit this backend's {}-byte window of the shared arena; give the job a window of at least {size_bytes} bytes",
                        w.limit_bytes
                    )));
                }
                let (lo, hi) = (w.base_bytes as usize, (w.base_bytes + size_bytes) as usize);
                lock(&self.shared.arena)[lo..hi].fill(0);
            }
            None => {
                let len = usize::try_from(size_bytes).map_err(|_| {
                    ExecError::invalid(format!("region of {size_bytes} bytes is too large"))
                })?;
                *lock(&self.shared.arena) = zeroed_bytes(len).ok_or_else(|| {
                    ExecError::invalid(format!(
                        "cannot allocate a device arena of {size_bytes} bytes in host memory; give a smaller budget"
                    ))
                })?;
            }
        }
        *region = Some(size_bytes);
        Ok(())
    }

    fn region_size_bytes(&self) -> u64 {
        lock(&self.region_bytes).unwrap_or(0)
    }

    fn alloc_host(&self, size_bytes: u64) -> Result<HostBuffer, ExecError> {
        let len = usize::try_from(size_bytes).map_err(|_| {
            ExecError::invalid(format!("host buffer of {size_bytes} bytes is too large"))
        })?;
        let id = self.id();
        let buf = zeroed_bytes(len).ok_or_else(|| {
            ExecError::invalid(format!(
                "cannot allocate a host buffer of {size_bytes} bytes; give a smaller graph or batch"
            ))
        })?;
        lock(&self.hosts).insert(id, Arc::new(Mutex::new(buf)));
        Ok(HostBuffer(id))
    }

    fn free_host(&self, buf: HostBuffer) -> Result<(), ExecError> {
        lock(&self.hosts)
            .remove(&buf.0)
            .map(|_| ())
            .ok_or_else(|| unknown("host buffer", buf.0))
    }

    fn write_host(&self, buf: HostBuffer, offset_bytes: u64, data: &[u8]) -> Result<(), ExecError> {
        let mem = self.host(buf)?;
        self.check_host_range("host write", &mem, offset_bytes, data.len() as u64)?;
        let off = offset_bytes as usize;
        lock(&mem)[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read_host(
        &self,
        buf: HostBuffer,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<Vec<u8>, ExecError> {
        let mem = self.host(buf)?;
        self.check_host_range("host read", &mem, offset_bytes, size_bytes)?;
        let off = offset_bytes as usize;
        Ok(lock(&mem)[off..off + size_bytes as usize].to_vec())
    }

    fn stream(&self, kind: StreamKind) -> StreamHandle {
        StreamHandle(kind.index() as u64)
    }

    fn record_event(&self, stream: StreamHandle) -> Result<EventHandle, ExecError> {
        let ev = Arc::new(Event::default());
        let id = self.id();
        self.send(stream, Command::Record(Arc::clone(&ev)))?;
        lock(&self.events).insert(id, ev);
        Ok(EventHandle(id))
    }

    fn wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<(), ExecError> {
        let ev = self.event(event)?;
        self.send(stream, Command::Wait(ev))
    }

    fn query_event(&self, event: EventHandle) -> Result<bool, ExecError> {
        let ev = self.event(event)?;
        let done = lock(&ev.done_at).is_some();
        Ok(done)
    }

    fn synchronize_event(&self, event: EventHandle) -> Result<(), ExecError> {
        self.event(event)?.wait();
        self.sticky()
    }

    fn event_elapsed_s(&self, start: EventHandle, end: EventHandle) -> Result<f64, ExecError> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        let (a, b) = (*lock(&a.done_at), *lock(&b.done_at));
        match (a, b) {
            (Some(a), Some(b)) => Ok(if b >= a {
                (b - a).as_secs_f64()
            } else {
                -(a - b).as_secs_f64()
            }),
            _ => Err(ExecError::invalid(
                "event_elapsed_s on an event that has not completed; synchronize first",
            )),
        }
    }

    fn destroy_event(&self, event: EventHandle) -> Result<(), ExecError> {
        lock(&self.events)
            .remove(&event.0)
            .map(|_| ())
            .ok_or_else(|| unknown("event", event.0))
    }

    fn copy_h2d(
        &self,
        stream: StreamHandle,
        src: HostBuffer,
        src_offset_bytes: u64,
        dst_offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<(), ExecError> {
        let mem = self.host(src)?;
        self.check_host_range(
            "host-to-device copy source",
            &mem,
            src_offset_bytes,
            size_bytes,
        )?;
        let dst_at = self.device_range(
            "host-to-device copy destination",
            dst_offset_bytes,
            size_bytes,
        )?;
        self.send(
            stream,
            Command::H2d {
                src: mem,
                src_off: src_offset_bytes as usize,
                dst_off: dst_at as usize,
                len: size_bytes as usize,
            },
        )
    }

    fn copy_d2h(
        &self,
        stream: StreamHandle,
        src_offset_bytes: u64,
        dst: HostBuffer,
        dst_offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<(), ExecError> {
        let mem = self.host(dst)?;
        let src_at =
            self.device_range("device-to-host copy source", src_offset_bytes, size_bytes)?;
        self.check_host_range(
            "device-to-host copy destination",
            &mem,
            dst_offset_bytes,
            size_bytes,
        )?;
        self.send(
            stream,
            Command::D2h {
                src_off: src_at as usize,
                dst: mem,
                dst_off: dst_offset_bytes as usize,
                len: size_bytes as usize,
            },
        )
    }

    fn launch(&self, stream: StreamHandle, mut kernel: KernelCall) -> Result<(), ExecError> {
        for o in kernel.inputs.iter_mut().chain(kernel.outputs.iter_mut()) {
            // A view spans its owner's bytes, not its own logical size.
            let span = o.view.as_ref().map_or(o.size_bytes, |m| m.owner_size_bytes);
            let what = format!("operand {} of kernel `{}`", o.tensor, kernel.op_name);
            let covered = DeviceSegment::total_bytes(&o.segments);
            if covered < span {
                return Err(ExecError::new(ExecErrorKind::OutOfRange {
                    what,
                    detail: format!("its segments hold {covered} bytes, it spans {span}"),
                }));
            }
            o.segments = self.device_segments(&what, &o.segments)?;
        }
        self.send(stream, Command::Kernel(Box::new(kernel)))
    }

    fn checksum(
        &self,
        stream: StreamHandle,
        offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<ChecksumHandle, ExecError> {
        self.checksum_segments(stream, &[DeviceSegment::new(offset_bytes, size_bytes)])
    }

    fn checksum_segments(
        &self,
        stream: StreamHandle,
        segments: &[DeviceSegment],
    ) -> Result<ChecksumHandle, ExecError> {
        let segments = self.device_segments("checksum range", segments)?;
        let slot = Arc::new(Mutex::new(None));
        let id = self.id();
        self.send(
            stream,
            Command::Checksum {
                segments,
                slot: Arc::clone(&slot),
            },
        )?;
        lock(&self.checksums).insert(id, slot);
        Ok(ChecksumHandle(id))
    }

    fn checksum_value(&self, handle: ChecksumHandle) -> Result<Option<u64>, ExecError> {
        let slot = lock(&self.checksums)
            .get(&handle.0)
            .cloned()
            .ok_or_else(|| unknown("checksum", handle.0))?;
        let v = *lock(&slot);
        Ok(v)
    }

    fn synchronize(&self, stream: StreamHandle) -> Result<(), ExecError> {
        let ev = Arc::new(Event::default());
        self.send(stream, Command::Record(Arc::clone(&ev)))?;
        ev.wait();
        self.sticky()
    }
}

/// The device the CPU backend presents to planners and the simulator: its arena is
/// the budget, stand-in kernels run at `synthetic_flops_per_s`, and copies at the
/// throttled link rate (or about memcpy speed without one).
pub fn device_profile(
    budget_bytes: u64,
    link_gbps: Option<f64>,
    synthetic_flops_per_s: f64,
) -> outcore_cost::DeviceProfile {
    let link = link_gbps.map_or(10e9, |g| g * 1e9);
    outcore_cost::DeviceProfile {
        name: "cpu-reference".into(),
        description:
            "outcore's CPU reference backend (arena of the budget's size, worker-thread streams)"
                .into(),
        memory_bytes: budget_bytes.max(1),
        peak_flops_f32: synthetic_flops_per_s,
        peak_flops_tf32: 0.0,
        peak_flops_f16: synthetic_flops_per_s,
        memory_bandwidth_bytes_per_s: 10e9,
        h2d_bytes_per_s: link,
        d2h_bytes_per_s: link,
        // Independent worker threads: each direction keeps its rate when both run.
        duplex_bytes_per_s: 2.0 * link,
        copy_latency_s: 0.0,
        kernel_launch_s: 0.0,
        tf32: outcore_cost::Tf32::Off,
    }
}
