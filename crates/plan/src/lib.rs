//! outcore-plan.
