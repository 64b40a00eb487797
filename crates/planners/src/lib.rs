//! outcore-planners: every planning strategy, each lowering to the one Plan, and
//! the registry the command line uses.

mod baseline;
mod capuchin;
mod checkmate;
pub mod checkpoint;
mod dtr;
pub mod framework;
pub mod home;
pub mod joint;
pub mod layout;
mod lms;
mod odswap;
mod range_tree;
mod remat;
mod superneurons;
pub mod swapadvisor;
pub mod tensile;
mod vdnn;
mod window;

pub use baseline::{Ideal, NoSwap};
pub use capuchin::Capuchin;
pub use checkmate::{
    CheckmateMilp, MAX_OPS as MILP_MAX_OPS, MilpAnswer, MilpSolution, MilpStats,
    solve as solve_recompute_milp,
};
pub use checkpoint::{Checkpoint, Segments};
pub use dtr::Dtr;
pub use home::{Home, Scoring};
pub use joint::Joint;
pub use lms::{Lms, LmsKnobs};
pub use odswap::{LOOKAHEAD_OPS, OdSwap};
use outcore_plan::Planner;
pub use superneurons::{SuperNeurons, SuperNeuronsDecision, is_cheap};
pub use swapadvisor::SwapAdvisor;
pub use tensile::Tensile;
pub use vdnn::{Vdnn, VdnnScope};
pub use window::Window;

/// Every planner, in listing order.
pub fn all() -> Vec<Box<dyn Planner>> {
    vec![
        Box::new(Ideal),
        Box::new(NoSwap),
        Box::new(Vdnn {
            scope: VdnnScope::All,
            overlapped: true,
        }),
        Box::new(Vdnn {
            scope: VdnnScope::Conv,
            overlapped: true,
        }),
        Box::new(Vdnn {
            scope: VdnnScope::All,
            overlapped: false,
        }),
        Box::new(Vdnn {
            scope: VdnnScope::Conv,
            overlapped: false,
        }),
        Box::new(Checkpoint {
            segments: Segments::All,
        }),
        Box::new(Checkpoint {
            segments: Segments::Sqrt,
        }),
        Box::new(Checkpoint {
            segments: Segments::Greedy,
        }),
        Box::new(SuperNeurons),
        Box::new(Lms),
        Box::new(Window),
        Box::new(Capuchin),
        Box::new(OdSwap),
        Box::new(Tensile),
        // Before SwapAdvisor: inside `outcore`, SwapAdvisor's search takes
        // whatever HOME's restarts leave of the seeds' time.
        Box::new(Home::default()),
        Box::new(SwapAdvisor::new(swapadvisor::SearchSpace::Joint)),
        Box::new(Dtr),
        // Last: it runs every planner above as a seed.
        Box::new(Joint::default()),
    ]
}

/// Planners reachable by name but left out of [`all`]: SwapAdvisor's
/// ablations (Sec. 6.4), each a search as long as the full one, and
/// `outcore-recompute`, outcore's search restricted to recomputation (a
/// ruler for the recompute-only planners, measured against `checkmate-milp`).
/// (`tensile` was here while it found few plans below the footprint; it
/// joined [`all`] once its peak analysis stopped adding the swap-in window
/// that `verify` no longer sums, RESULTS.md, 2026-12-02.)
pub fn ablations() -> Vec<Box<dyn Planner>> {
    vec![
        Box::new(SwapAdvisor::new(swapadvisor::SearchSpace::OrderOnly)),
        Box::new(SwapAdvisor::new(swapadvisor::SearchSpace::AllocationOnly)),
        Box::new(joint::Joint::recompute_only()),
    ]
}

/// Planners reachable by name but left out of [`all`]: exact references
/// that only solve small graphs (`checkmate-milp` refuses more than
/// [`MILP_MAX_OPS`] ops), so that `--planners all` stays fast on any model.
pub fn references() -> Vec<Box<dyn Planner>> {
    vec![Box::new(CheckmateMilp)]
}

/// The names of every planner.
pub fn names() -> Vec<&'static str> {
    all().iter().map(|p| p.name()).collect()
}

/// Looks a planner up by name (in [`all`], then [`ablations`], then
/// [`references`]); the error lists the names.
pub fn by_name(name: &str) -> Result<Box<dyn Planner>, String> {
    all()
        .into_iter()
        .chain(ablations())
        .chain(references())
        .find(|p| p.name() == name)
        .ok_or_else(|| {
            let ablation_names: Vec<&str> = ablations().iter().map(|p| p.name()).collect();
            let references: Vec<&str> = references().iter().map(|p| p.name()).collect();
            format!(
                "unknown planner `{name}`; the planners are: {}, by name only: {}, and the references: {}",
                names().join(", "),
                ablation_names.join(", "),
                references.join(", ")
            )
        })
}
