//! outcore-planners: every planning strategy, each lowering to the one Plan, and
//! the registry the command line uses.

mod baseline;
mod capuchin;
mod checkmate;
mod checkpoint;
mod dtr;
pub mod framework;
mod lms;
mod odswap;
mod range_tree;
mod remat;
mod superneurons;
mod vdnn;
mod window;

pub use baseline::{Ideal, NoSwap};
pub use capuchin::Capuchin;
pub use checkmate::{
    CheckmateMilp, MAX_OPS as MILP_MAX_OPS, MilpAnswer, MilpSolution, MilpStats,
    solve as solve_recompute_milp,
};
pub use checkpoint::{Checkpoint, CheckpointDecision, Segments};
pub use dtr::Dtr;
pub use lms::{Lms, LmsKnobs};
pub use odswap::{LOOKAHEAD_OPS, OdSwap};
use outcore_plan::Planner;
pub use superneurons::{SuperNeurons, SuperNeuronsDecision, is_cheap};
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
        Box::new(SuperNeurons),
        Box::new(Lms),
        Box::new(Window),
        Box::new(Capuchin),
        Box::new(OdSwap),
        Box::new(Dtr),
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

/// Looks a planner (or a reference) up by name; the error lists the names.
pub fn by_name(name: &str) -> Result<Box<dyn Planner>, String> {
    all()
        .into_iter()
        .chain(references())
        .find(|p| p.name() == name)
        .ok_or_else(|| {
            let references: Vec<&str> = references().iter().map(|p| p.name()).collect();
            format!(
                "unknown planner `{name}`; the planners are: {}, and the references: {}",
                names().join(", "),
                references.join(", ")
            )
        })
}
