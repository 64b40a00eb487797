//! outcore-planners.
