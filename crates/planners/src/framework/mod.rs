//! The one planner framework every strategy is built on:
//! - [`ctx`]: the one context ([`Ctx`]), built from a compute order, with use
//!   positions, owners per position, op times and prefix sums, in-place
//!   writes, the backward start and the op -> position table;
//! - [`decisions`]: keep / swap / recompute decisions to gaps, with
//!   recomputation chains ([`materialise`]);
//! - [`pressure`]: the live-bytes model, planning margins and the on-demand
//!   eviction loop ([`evict_on_demand`]), another producer of gaps;
//! - [`score`]: the one scoring path ([`Search::score`]), the parallel choice
//!   among candidates ([`Search::best`]) and the proof of the returned plan.

pub mod ctx;
pub mod decisions;
pub mod pressure;
pub mod score;

pub use ctx::{Ctx, eager_order_if_other, graph_order, initial_residency};
pub use decisions::{
    Decision, Decisions, Materialised, SwapTiming, bytes, count, flatten, materialise, swap_gap,
};
pub use outcore_eval::Scratch;
pub use pressure::{
    Choice, Evictable, MARGINS, absent_bytes, evict_on_demand, live_bytes, margin_budget,
};
pub use score::{PeakAt, Pick, Score, Scored, Screen, Search, Shortfall, describe_peak};

/// Small hand graphs and a cost model for the planners' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use outcore_cost::{DeviceProfile, RooflineModel};
    use outcore_graph::DType;
    use outcore_graph::Graph;
    use outcore_graph::builder::{GraphBuilder, Optimizer};

    /// A chain of `layers` linear + relu layers of width `width` on batch `batch`,
    /// trained without an optimizer (so only activations and gradients move).
    pub fn mlp_chain(layers: usize, width: u64, batch: u64) -> Graph {
        mlp_chain_with(layers, width, batch, Optimizer::None)
    }

    /// [`mlp_chain`] trained with `optimizer`.
    pub fn mlp_chain_with(layers: usize, width: u64, batch: u64, optimizer: Optimizer) -> Graph {
        let mut b = GraphBuilder::new("hand-mlp", batch, DType::Float32);
        let mut x = b.input("x", &[batch, width]);
        for i in 0..layers {
            let y = b.linear(&format!("fc{i}"), x, width, false);
            x = b.relu(y);
        }
        let labels = b.label("labels", &[batch]);
        let loss = b.softmax_cross_entropy(x, labels);
        match b.finish(loss, optimizer) {
            Ok(g) => g,
            Err(e) => panic!("hand graph: {e}"),
        }
    }

    /// The planner info of a plan a test lowers by hand.
    pub fn info() -> outcore_plan::PlannerInfo {
        outcore_plan::PlannerInfo {
            name: "test".into(),
            seed: None,
            settings: serde_json::Value::Null,
        }
    }

    pub fn v100() -> RooflineModel {
        match DeviceProfile::builtin("v100-16gb-pcie3") {
            Ok(d) => RooflineModel::new(d),
            Err(e) => panic!("builtin device: {e}"),
        }
    }
}
