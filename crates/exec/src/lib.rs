//! outcore-exec.
