//! outcore-planners: every planning strategy, each lowering to the one Plan, and
//! the registry the command line uses.

mod baseline;
mod capuchin;
mod pressure;
mod odswap;
mod ondemand;
mod window;

pub use baseline::{Ideal, NoSwap};
pub use capuchin::Capuchin;
pub use odswap::{LOOKAHEAD_OPS, OdSwap};
use outcore_plan::Planner;
pub use window::Window;

/// Every planner, in listing order.
pub fn all() -> Vec<Box<dyn Planner>> {
    vec![
        Box::new(Ideal),
        Box::new(NoSwap),
        Box::new(Window),
        Box::new(Capuchin),
        Box::new(OdSwap),
    ]
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
