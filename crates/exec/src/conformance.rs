//! Backend conformance suite, written once over `&dyn Backend` so every backend
//! (the CPU one here, a CUDA one later) runs the same checks. Each check receives a
//! fresh backend with no region allocated and returns a description of the first
//! failure.

use crate::backend::{Backend, DeviceSegment, KernelCall, Operand, StreamKind, fnv1a};
use outcore_graph::{DType, OpId, OpKind, TensorId};

/// Result of one check: `Err(why)` on failure.
pub type CheckResult = Result<(), String>;

/// A conformance check over any backend.
pub type Check = fn(&dyn Backend) -> CheckResult;

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Host -> device -> host returns the same bytes, at non-zero offsets too.
pub fn copies_round_trip(b: &dyn Backend) -> CheckResult {
    b.alloc_region(1 << 16).map_err(err("alloc_region"))?;
    let data = pattern(4096, 7);
    let src = b.alloc_host(8192).map_err(err("alloc_host"))?;
    let dst = b.alloc_host(8192).map_err(err("alloc_host"))?;
    b.write_host(src, 100, &data).map_err(err("write_host"))?;
    let (h2d, d2h) = (b.stream(StreamKind::H2d), b.stream(StreamKind::D2h));
    b.copy_h2d(h2d, src, 100, 1024, 4096)
        .map_err(err("copy_h2d"))?;
    b.synchronize(h2d).map_err(err("synchronize"))?;
    b.copy_d2h(d2h, 1024, dst, 8, 4096)
        .map_err(err("copy_d2h"))?;
    b.synchronize(d2h).map_err(err("synchronize"))?;
    let back = b.read_host(dst, 8, 4096).map_err(err("read_host"))?;
    if back != data {
        return Err("bytes differ after a host->device->host round trip".into());
    }
    Ok(())
}

/// A copy on d2h that waits for an event recorded after an h2d copy sees its data.
pub fn events_order_streams(b: &dyn Backend) -> CheckResult {
    b.alloc_region(1 << 20).map_err(err("alloc_region"))?;
    let n = 1 << 19;
    let data = pattern(n, 3);
    let src = b.alloc_host(n as u64).map_err(err("alloc_host"))?;
    let dst = b.alloc_host(n as u64).map_err(err("alloc_host"))?;
    b.write_host(src, 0, &data).map_err(err("write_host"))?;
    let (h2d, d2h) = (b.stream(StreamKind::H2d), b.stream(StreamKind::D2h));
    b.copy_h2d(h2d, src, 0, 0, n as u64)
        .map_err(err("copy_h2d"))?;
    let ev = b.record_event(h2d).map_err(err("record_event"))?;
    b.wait_event(d2h, ev).map_err(err("wait_event"))?;
    b.copy_d2h(d2h, 0, dst, 0, n as u64)
        .map_err(err("copy_d2h"))?;
    b.synchronize(d2h).map_err(err("synchronize"))?;
    if !b.query_event(ev).map_err(err("query_event"))? {
        return Err(
            "the waited-for event is not complete after the waiting stream finished".into(),
        );
    }
    if b.read_host(dst, 0, n as u64).map_err(err("read_host"))? != data {
        return Err("a stream waiting on an event did not see the data written before it".into());
    }
    Ok(())
}

/// Elapsed time between two events recorded in order on one stream is >= 0.
pub fn event_elapsed_non_negative(b: &dyn Backend) -> CheckResult {
    b.alloc_region(1 << 16).map_err(err("alloc_region"))?;
    let s = b.stream(StreamKind::Compute);
    let a = b.record_event(s).map_err(err("record_event"))?;
    let host = b.alloc_host(4096).map_err(err("alloc_host"))?;
    b.copy_h2d(s, host, 0, 0, 4096).map_err(err("copy_h2d"))?;
    let z = b.record_event(s).map_err(err("record_event"))?;
    b.synchronize_event(z).map_err(err("synchronize_event"))?;
    let dt = b.event_elapsed_s(a, z).map_err(err("event_elapsed_s"))?;
    if dt.is_nan() || dt < 0.0 {
        return Err(format!("elapsed time {dt} s is negative"));
    }
    b.destroy_event(a).map_err(err("destroy_event"))?;
    b.destroy_event(z).map_err(err("destroy_event"))?;
    Ok(())
}

/// Work on one stream runs in issue order: the last of two copies to the same
/// device range wins, and a kernel sees the copy queued before it.
pub fn fifo_per_stream(b: &dyn Backend) -> CheckResult {
    b.alloc_region(1 << 16).map_err(err("alloc_region"))?;
    let s = b.stream(StreamKind::H2d);
    let (x, y) = (pattern(2048, 1), pattern(2048, 2));
    let hx = b.alloc_host(2048).map_err(err("alloc_host"))?;
    let hy = b.alloc_host(2048).map_err(err("alloc_host"))?;
    let out = b.alloc_host(2048).map_err(err("alloc_host"))?;
    b.write_host(hx, 0, &x).map_err(err("write_host"))?;
    b.write_host(hy, 0, &y).map_err(err("write_host"))?;
    for _ in 0..4 {
        b.copy_h2d(s, hx, 0, 0, 2048).map_err(err("copy_h2d"))?;
        b.copy_h2d(s, hy, 0, 0, 2048).map_err(err("copy_h2d"))?;
    }
    // A kernel on the same stream copies the range (as a `Copy` op) elsewhere.
    let operand = |off: u64, write: bool| Operand {
        tensor: TensorId(0),
        segments: vec![DeviceSegment::new(off, 2048)],
        shape: vec![512],
        dtype: DType::Float32,
        size_bytes: 2048,
        write,
        view: None,
    };
    b.launch(
        s,
        KernelCall {
            op: OpId(0),
            op_name: "conformance.copy".into(),
            kind: OpKind::Copy,
            inputs: vec![operand(0, false)],
            outputs: vec![operand(4096, true)],
            step: 1,
            synthetic_time_s: 0.0,
        },
    )
    .map_err(err("launch"))?;
    b.copy_d2h(s, 4096, out, 0, 2048).map_err(err("copy_d2h"))?;
    b.synchronize(s).map_err(err("synchronize"))?;
    if b.read_host(out, 0, 2048).map_err(err("read_host"))? != y {
        return Err("work on one stream did not run in issue order".into());
    }
    Ok(())
}

/// A copy outside the region or a host buffer is an error, not corruption.
pub fn out_of_range_copy_is_error(b: &dyn Backend) -> CheckResult {
    b.alloc_region(4096).map_err(err("alloc_region"))?;
    let h = b.alloc_host(1024).map_err(err("alloc_host"))?;
    let s = b.stream(StreamKind::H2d);
    let bad_device = b.copy_h2d(s, h, 0, 4000, 1024);
    let bad_host = b.copy_h2d(s, h, 512, 0, 1024);
    let d2h = b.copy_d2h(b.stream(StreamKind::D2h), 4096, h, 0, 1);
    let synced = b.synchronize(s);
    if bad_device.is_ok() && bad_host.is_ok() && d2h.is_ok() && synced.is_ok() {
        return Err("out-of-range copies were accepted".into());
    }
    if bad_device.is_ok() || bad_host.is_ok() || d2h.is_ok() {
        return Err("some out-of-range copy was accepted".into());
    }
    Ok(())
}

/// A kernel whose operands lie outside the region fails (at launch or at synchronize).
pub fn kernel_on_bad_offsets_is_error(b: &dyn Backend) -> CheckResult {
    b.alloc_region(4096).map_err(err("alloc_region"))?;
    let s = b.stream(StreamKind::Compute);
    let launched = b.launch(
        s,
        KernelCall {
            op: OpId(0),
            op_name: "conformance.fill".into(),
            kind: OpKind::Fill { value: 1.0 },
            inputs: vec![],
            outputs: vec![Operand {
                tensor: TensorId(0),
                segments: vec![DeviceSegment::new(1 << 20, 64)],
                shape: vec![16],
                dtype: DType::Float32,
                size_bytes: 64,
                write: true,
                view: None,
            }],
            step: 1,
            synthetic_time_s: 0.0,
        },
    );
    let synced = b.synchronize(s);
    if launched.is_ok() && synced.is_ok() {
        return Err("a kernel writing outside the device region was accepted".into());
    }
    Ok(())
}

/// A kernel reads and writes non-contiguous operands through their segments
/// (in segment order, not address order), and a segmented checksum covers their
/// concatenation.
pub fn segmented_operands(b: &dyn Backend) -> CheckResult {
    b.alloc_region(8192).map_err(err("alloc_region"))?;
    let s = b.stream(StreamKind::Compute);
    let x = pattern(2048, 7);
    let hx = b.alloc_host(2048).map_err(err("alloc_host"))?;
    let out = b.alloc_host(2048).map_err(err("alloc_host"))?;
    b.write_host(hx, 0, &x).map_err(err("write_host"))?;
    // The input's first half lives above its second half.
    let input = [
        DeviceSegment::new(6144, 1024),
        DeviceSegment::new(512, 1024),
    ];
    let output = [
        DeviceSegment::new(2048, 512),
        DeviceSegment::new(4096, 1536),
    ];
    let mut host_offset = 0;
    for seg in input {
        b.copy_h2d(s, hx, host_offset, seg.offset_bytes, seg.size_bytes)
            .map_err(err("copy_h2d"))?;
        host_offset += seg.size_bytes;
    }
    let operand = |segments: &[DeviceSegment], write: bool| Operand {
        tensor: TensorId(0),
        segments: segments.to_vec(),
        shape: vec![512],
        dtype: DType::Float32,
        size_bytes: 2048,
        write,
        view: None,
    };
    b.launch(
        s,
        KernelCall {
            op: OpId(0),
            op_name: "conformance.segmented-copy".into(),
            kind: OpKind::Copy,
            inputs: vec![operand(&input, false)],
            outputs: vec![operand(&output, true)],
            step: 1,
            synthetic_time_s: 0.0,
        },
    )
    .map_err(err("launch"))?;
    let sum = b
        .checksum_segments(s, &output)
        .map_err(err("checksum_segments"))?;
    let mut host_offset = 0;
    for seg in output {
        b.copy_d2h(s, seg.offset_bytes, out, host_offset, seg.size_bytes)
            .map_err(err("copy_d2h"))?;
        host_offset += seg.size_bytes;
    }
    b.synchronize(s).map_err(err("synchronize"))?;
    if b.read_host(out, 0, 2048).map_err(err("read_host"))? != x {
        return Err("a kernel did not gather / scatter its segments in order".into());
    }
    if b.checksum_value(sum).map_err(err("checksum_value"))? != Some(fnv1a(&x)) {
        return Err("a segmented checksum differs from the checksum of the bytes".into());
    }
    Ok(())
}

/// Every check by name.
pub fn checks() -> Vec<(&'static str, Check)> {
    vec![
        ("copies_round_trip", copies_round_trip),
        ("segmented_operands", segmented_operands),
        ("events_order_streams", events_order_streams),
        ("event_elapsed_non_negative", event_elapsed_non_negative),
        ("fifo_per_stream", fifo_per_stream),
        ("out_of_range_copy_is_error", out_of_range_copy_is_error),
        (
            "kernel_on_bad_offsets_is_error",
            kernel_on_bad_offsets_is_error,
        ),
    ]
}

/// Runs every check on a fresh backend from `make`; returns the failures.
pub fn run_all(make: &dyn Fn() -> Box<dyn Backend>) -> Vec<(&'static str, String)> {
    let mut failures = Vec::new();
    for (name, check) in checks() {
        let backend = make();
        if let Err(why) = check(backend.as_ref()) {
            failures.push((name, why));
        }
    }
    failures
}
