//! outcore-plan: the one Plan type every planner lowers to, verify() which proves a
//! plan safe for every timing, and analyses shared by planners.

pub mod layout;
mod lower;
mod order;
mod peak;
mod pin;
mod plan;
mod planner;
mod prepared;
mod program;
mod schedule;
mod verify;

pub use layout::{Layout, LayoutError, lay_out, lay_out_timed, scratch_pieces};
pub use lower::{frees_after_op, frees_at_end, lower_in_order, uses_by_owner};
pub use order::{
    check_order, defer_ops, eager_update_order, framework_default_order, order_predecessors,
    random_topological_order,
};
pub use peak::peak_over_all_timings;
pub use pin::{PinError, TimedStep, pin_frees};
pub use plan::{
    AllocatorSpec, GraphRef, Instr, PLAN_FORMAT, Plan, PlanError, PlanErrorKind, PlannerInfo,
    Residency, Step, StepRef, Stream, graph_fingerprint,
};
pub use planner::{
    Infeasible, InfeasibleKind, PlanOutcome, PlanRequest, Planner, PlannerError, PlannerErrorKind,
    fmt_bytes,
};
pub use prepared::PreparedGraph;
pub use program::{CompactProgram, Program, ProgramSink, StepInstr};
pub use schedule::{
    Gap, LowerScratch, Restore, Schedule, ScheduleError, lower_into, lower_schedule,
    lower_schedule_prepared, use_positions,
};
pub use verify::{MemoryBound, VerifyScratch, Violation, ViolationKind, verify, verify_program};
