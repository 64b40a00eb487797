//! outcore-planners: every planning strategy, each lowering to the one Plan, and
//! the registry the command line uses.

mod baseline;

pub use baseline::{Ideal, NoSwap};
use outcore_plan::Planner;

/// Every planner, in listing order.
pub fn all() -> Vec<Box<dyn Planner>> {
    vec![Box::new(Ideal), Box::new(NoSwap)]
}

/// The names of every planner.
pub fn names() -> Vec<&'static str> {
    all().iter().map(|p| p.name()).collect()
}

/// Looks a planner up by name; the error lists the names.
pub fn by_name(name: &str) -> Result<Box<dyn Planner>, String> {
    all().into_iter().find(|p| p.name() == name).ok_or_else(|| {
        format!(
            "unknown planner `{name}`; the planners are: {}",
            names().join(", ")
        )
    })
}
