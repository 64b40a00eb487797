//! outcore-sim.
