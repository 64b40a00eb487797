//! Tensor access sequences (TENSILE Sec. III and IV-A): every access of every
//! storage owner, grouped by tensor and sorted by time (the paper's TAT), on the
//! compute-only timeline of the request's order.
//!
//! The paper times accesses with predicted or measured kernel latencies; here
//! the latencies are the cost model's op times (a single job planned before it
//! runs, so the model is the prediction). Access `i` of a tensor happens at the
//! op in position `uses[i]`; it starts at the op's start and ends at its end.

use crate::framework::Ctx;
use outcore_graph::TensorId;

/// The access timeline of one job.
#[derive(Debug)]
pub struct AccessSequence<'c, 'g> {
    pub ctx: &'c Ctx<'g>,
}

impl<'c, 'g> AccessSequence<'c, 'g> {
    pub fn new(ctx: &'c Ctx<'g>) -> Self {
        AccessSequence { ctx }
    }

    /// When the op at `position` starts, in seconds from the iteration start.
    pub fn start_s(&self, position: usize) -> f64 {
        self.ctx.prefix_time_s[position.min(self.ctx.n)]
    }

    /// When the op at `position` ends.
    pub fn end_s(&self, position: usize) -> f64 {
        self.start_s(position + 1)
    }

    /// The compute time of one iteration.
    pub fn iteration_s(&self) -> f64 {
        self.start_s(self.ctx.n)
    }

    /// Positions of a tensor's accesses, ascending (the paper's `TAT[tensor]`).
    pub fn accesses(&self, t: TensorId) -> &[usize] {
        &self.ctx.uses[t.index()]
    }

    /// The accesses just before and just after `q` (exclusive).
    pub fn around(&self, t: TensorId, q: usize) -> (Option<usize>, Option<usize>) {
        self.ctx.neighbours(t, q)
    }

    /// A persistent tensor the optimizer writes in place: its last access is
    /// the update, and its next access is the first use of the next iteration
    /// (Alg. 2 lines 8-9).
    pub fn updated_parameter(&self, t: TensorId) -> bool {
        self.ctx.persistent(t) && !self.ctx.writes[t.index()].is_empty()
    }

    /// The first position that starts at or after `time_s` (`n` when none).
    pub fn first_starting_at(&self, time_s: f64) -> usize {
        let p = &self.ctx.prefix_time_s[..self.ctx.n];
        p.partition_point(|&s| s < time_s - TIME_EPS_S)
    }

    /// The last position that ends at or before `time_s`, if any.
    pub fn last_ending_by(&self, time_s: f64) -> Option<usize> {
        let ends = &self.ctx.prefix_time_s[1..=self.ctx.n];
        ends.partition_point(|&e| e <= time_s + TIME_EPS_S)
            .checked_sub(1)
    }
}

/// Slack for comparing sums of op times (rounding only).
pub const TIME_EPS_S: f64 = 1e-12;
