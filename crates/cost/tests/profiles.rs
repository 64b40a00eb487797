//! Device profiles: the built-ins, user profile files, and their error messages.

use outcore_cost::{CostErrorKind, DeviceProfile};
use std::path::PathBuf;

/// A fresh scratch directory under the system temp dir, unique to this test.
fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outcore-cost-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

#[test]
fn every_builtin_loads_with_positive_rates() {
    assert_eq!(DeviceProfile::builtin_names().len(), 7);
    for name in DeviceProfile::builtin_names() {
        let p = DeviceProfile::builtin(name).expect("builtin");
        assert_eq!(&p.name, name);
        assert_eq!(DeviceProfile::load(name).expect("load"), p);
        for rate in [
            p.peak_flops_f32,
            p.peak_flops_f16,
            p.memory_bandwidth_bytes_per_s,
            p.h2d_bytes_per_s,
            p.d2h_bytes_per_s,
            p.duplex_bytes_per_s,
            p.copy_latency_s,
            p.kernel_launch_s,
        ] {
            assert!(rate.is_finite() && rate > 0.0, "{name}: {rate}");
        }
        assert!(p.peak_flops_tf32 >= 0.0);
        assert!(p.memory_bytes >= 11 << 30);
        assert!(p.h2d_duplex_bytes_per_s() <= p.h2d_bytes_per_s);
        assert!(p.d2h_duplex_bytes_per_s() <= p.d2h_bytes_per_s);
    }
}

#[test]
fn paper_testbed_numbers() {
    let p = DeviceProfile::builtin("v100-16gb-pcie3").unwrap();
    assert_eq!(
        (p.h2d_bytes_per_s, p.d2h_bytes_per_s, p.duplex_bytes_per_s),
        (12e9, 12e9, 20e9)
    );
    let p = DeviceProfile::builtin("v100-16gb-nvlink").unwrap();
    assert_eq!((p.h2d_bytes_per_s, p.duplex_bytes_per_s), (50e9, 100e9));
    let p = DeviceProfile::builtin("a6000-48gb").unwrap();
    assert_eq!((p.peak_flops_f32, p.memory_bytes), (38.7e12, 48 << 30));
    let p = DeviceProfile::builtin("rtx2080ti-11gb").unwrap();
    assert_eq!((p.peak_flops_f32, p.memory_bytes), (13.4e12, 11 << 30));
}

#[test]
fn user_profile_file_round_trip() {
    let dir = scratch_dir("round-trip");
    let mut p = DeviceProfile::builtin("a100-40gb").unwrap();
    p.name = "my-a100".into();
    p.h2d_bytes_per_s = 23.5e9;
    let path = dir.join("my-a100.json");
    std::fs::write(&path, p.to_json_string()).unwrap();
    assert_eq!(DeviceProfile::from_json_file(&path).unwrap(), p);
    // `load` takes a path when the string is no built-in name.
    assert_eq!(DeviceProfile::load(path.to_str().unwrap()).unwrap(), p);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_field_is_named() {
    let dir = scratch_dir("missing-field");
    let p = DeviceProfile::builtin("a100-40gb").unwrap();
    let mut value = serde_json::to_value(&p).unwrap();
    value.as_object_mut().unwrap().remove("duplex_bytes_per_s");
    let path = dir.join("p.json");
    std::fs::write(&path, value.to_string()).unwrap();
    let err = DeviceProfile::from_json_file(&path).unwrap_err();
    assert!(matches!(err.kind, CostErrorKind::Parse { .. }));
    let msg = err.to_string();
    assert!(msg.contains("missing field `duplex_bytes_per_s`"), "{msg}");
    assert!(msg.contains("p.json"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn negative_rate_is_named() {
    let dir = scratch_dir("negative-rate");
    let mut p = DeviceProfile::builtin("h100-80gb").unwrap();
    p.memory_bandwidth_bytes_per_s = -3.35e12;
    let path = dir.join("p.json");
    std::fs::write(&path, p.to_json_string()).unwrap();
    let err = DeviceProfile::from_json_file(&path).unwrap_err();
    assert!(matches!(
        err.kind,
        CostErrorKind::InvalidProfile {
            field: "memory_bandwidth_bytes_per_s",
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("`memory_bandwidth_bytes_per_s` must be a positive"),
        "{msg}"
    );
    assert!(msg.contains("-3350000000000"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn not_json_and_missing_file() {
    let dir = scratch_dir("not-json");
    let path = dir.join("p.json");
    std::fs::write(&path, "name = 'toml?'").unwrap();
    let msg = DeviceProfile::from_json_file(&path)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("is not a valid device profile"), "{msg}");

    let missing = dir.join("nope.json");
    let err = DeviceProfile::load(missing.to_str().unwrap()).unwrap_err();
    assert!(matches!(err.kind, CostErrorKind::Read { .. }));
    assert!(err.to_string().starts_with("cannot read"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unknown_name_error_lists_names() {
    let err = DeviceProfile::load("a100").unwrap_err();
    assert!(matches!(err.kind, CostErrorKind::UnknownDevice { .. }));
    let msg = err.to_string();
    assert!(msg.contains("a100-40gb, h100-80gb"), "{msg}");
    assert!(msg.contains("path to a device profile JSON file"), "{msg}");
}
