//! Runs the backend conformance suite on the CPU backend, with and without a
//! throttled link (so that ordering is checked while copies really take time).

use outcore_exec::{Backend, CpuBackend, CpuBackendOptions, conformance};

#[test]
fn cpu_backend_passes_conformance() {
    let failures = conformance::run_all(&|| {
        Box::new(CpuBackend::new(CpuBackendOptions::default())) as Box<dyn Backend>
    });
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn cpu_backend_passes_conformance_on_a_slow_link() {
    let failures = conformance::run_all(&|| {
        Box::new(CpuBackend::new(CpuBackendOptions {
            link_bytes_per_s: Some(2e9),
            ..Default::default()
        })) as Box<dyn Backend>
    });
    assert!(failures.is_empty(), "{failures:?}");
}
