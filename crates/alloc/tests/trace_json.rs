//! Trace JSON: round trips through strings and files, and malformed traces
//! rejected with errors that say where and what.

use outcore_alloc::trace::{TRACE_FORMAT, read_trace, write_trace};
use outcore_alloc::{
    AllocId, AllocatorConfig, AllocatorKind, Trace, TraceErrorKind, TraceEvent, replay_with_config,
    synthetic_trace,
};

#[test]
fn documented_example_parses() {
    let text = r#"{"format":"outcore-alloc-trace/1","capacity_bytes":null,
        "events":[{"op":"alloc","id":3,"size_bytes":1024},{"op":"free","id":3}]}"#;
    let trace = Trace::from_json_str(text).expect("documented example");
    assert_eq!(trace.capacity_bytes, None);
    assert_eq!(
        trace.events,
        vec![
            TraceEvent::Alloc {
                id: AllocId(3),
                size_bytes: 1024
            },
            TraceEvent::Free { id: AllocId(3) }
        ]
    );
    // capacity_bytes may be left out.
    let trace = Trace::from_json_str(r#"{"format":"outcore-alloc-trace/1","events":[]}"#)
        .expect("no capacity");
    assert_eq!(trace.capacity_bytes, None);
}

#[test]
fn string_round_trip() {
    let mut trace = synthetic_trace(2_000, 7);
    trace.capacity_bytes = Some(1 << 30);
    let text = trace.to_json_string();
    assert!(text.contains(TRACE_FORMAT));
    assert_eq!(Trace::from_json_str(&text).expect("round trip"), trace);
}

#[test]
fn file_round_trip_and_io_errors() {
    let dir = std::env::temp_dir().join(format!("outcore-alloc-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("trace.json");
    let trace = synthetic_trace(500, 3);
    write_trace(&path, &trace).expect("write");
    assert_eq!(read_trace(&path).expect("read"), trace);
    let missing = dir.join("missing.json");
    let err = read_trace(&missing).expect_err("missing file");
    assert!(matches!(err.kind(), TraceErrorKind::Io { .. }));
    assert!(err.to_string().contains("missing.json"), "{err}");
    let err = write_trace(dir.join("no-such-dir").join("t.json"), &trace).expect_err("bad dir");
    assert!(
        err.to_string().starts_with("cannot write trace file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn malformed_traces_are_rejected_with_positions() {
    let cases: &[(&str, &str)] = &[
        ("", "line 1"),
        ("{", "line 1"),
        (
            r#"{"format":"outcore-alloc-trace/1"}"#,
            "missing field `events`",
        ),
        (
            r#"{"format":"outcore-alloc-trace/1","events":[{"op":"resize","id":1}]}"#,
            "unknown variant `resize`",
        ),
        (
            r#"{"format":"outcore-alloc-trace/1","events":[{"op":"alloc","id":1}]}"#,
            "missing field `size_bytes`",
        ),
        (
            r#"{"format":"outcore-alloc-trace/1","events":[{"op":"alloc","id":1,"size_bytes":-5}]}"#,
            "invalid value",
        ),
        (
            r#"{"format":"outcore-alloc-trace/1","events":[],"capacity":5}"#,
            "unknown field `capacity`",
        ),
        (
            "{\"format\":\"outcore-alloc-trace/1\",\n\"events\":[\n{\"op\":\"free\"}]}",
            "line 3",
        ),
    ];
    for (text, needle) in cases {
        let err = Trace::from_json_str(text).expect_err(text);
        assert!(
            matches!(err.kind(), TraceErrorKind::Parse { .. }),
            "{text}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(needle), "{text}: {msg}");
        assert!(msg.starts_with("malformed trace json at line"), "{msg}");
    }
}

#[test]
fn wrong_format_is_named() {
    for text in [
        r#"{"format":"outcore-alloc-trace/2","events":[]}"#,
        r#"{"format":"outcore-alloc-trace/2","events":[{"op":"new-op"}]}"#,
        r#"{"format":7,"events":[]}"#,
    ] {
        let err = Trace::from_json_str(text).expect_err(text);
        assert!(
            matches!(err.kind(), TraceErrorKind::UnsupportedFormat { .. }),
            "{text}: {err:?}"
        );
        assert!(err.to_string().contains("outcore-alloc-trace/1"), "{err}");
    }
}

#[test]
fn inconsistent_events_are_rejected_with_their_index() {
    let cases = [
        (
            r#"{"format":"outcore-alloc-trace/1","events":[{"op":"free","id":4}]}"#,
            0,
            "not live",
        ),
        (
            r#"{"format":"outcore-alloc-trace/1","events":[{"op":"alloc","id":1,"size_bytes":8},{"op":"alloc","id":1,"size_bytes":8}]}"#,
            1,
            "already live",
        ),
        (
            r#"{"format":"outcore-alloc-trace/1","events":[{"op":"alloc","id":1,"size_bytes":8},{"op":"free","id":1},{"op":"free","id":1}]}"#,
            2,
            "not live",
        ),
    ];
    for (text, index, needle) in cases {
        let err = Trace::from_json_str(text).expect_err(text);
        match err.kind() {
            TraceErrorKind::InvalidEvent { index: at, message } => {
                assert_eq!(*at, index, "{text}");
                assert!(message.contains(needle), "{message}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn unlimited_replay_measures_the_trace() {
    let trace = synthetic_trace(20_000, 11);
    for kind in AllocatorKind::ALL {
        if kind == AllocatorKind::SizeClass || kind == AllocatorKind::Offsets {
            // The pool needs classes from the trace's sizes (see below); an
            // offsets layout is made for one plan and has none for a trace.
            continue;
        }
        let report =
            replay_with_config(&trace, &AllocatorConfig::default_for(kind)).expect("build");
        assert_eq!(report.failures, 0, "{kind}");
        assert_eq!(report.ops, 20_000);
        assert!(
            report.peak_reserved_bytes >= report.peak_live_bytes,
            "{kind}"
        );
        assert!(report.fragmentation.unwrap_or(0.0) >= 1.0, "{kind}");
    }
    // A size-class pool with one class per distinct size and enough objects.
    let sizes = trace.events.iter().filter_map(|e| match *e {
        TraceEvent::Alloc { size_bytes, .. } => Some(size_bytes),
        TraceEvent::Free { .. } => None,
    });
    let encoding = outcore_alloc::SizeClassEncoding::one_class_per_size(sizes, 600);
    let config = AllocatorConfig::SizeClass(outcore_alloc::SizeClassConfig {
        classes: Vec::new(),
        encoding: Some(encoding),
    });
    let report = replay_with_config(&trace, &config).expect("build");
    assert_eq!(report.failures, 0);
}
