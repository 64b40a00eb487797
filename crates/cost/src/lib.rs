//! outcore-cost.
