//! The exact device-memory peak of a plan over every timing, by enumeration:
//! the reference that verify()'s memory bound is tested against.
//!
//! verify() bounds memory in O((steps + buffers) log steps) and may
//! over-count; this module instead visits every state the three streams can
//! be in at once and sums the buffers resident in it. It is far slower
//! (O(h2d steps × d2h steps × (compute steps + buffers))) and meant for tests
//! and small plans.
//!
//! A stream's state is a half-position `q`: `2i` means its steps before `i`
//! are complete and `i` has not started, `2i + 1` that step `i` is running.
//! A state of the three streams is reachable in some timing iff every started
//! step's waits (its vector clock) are complete. A buffer is resident in a
//! state iff its allocating step has started and its freeing step has not
//! completed, the model verify() uses. The peak is the largest sum over
//! reachable states.

use crate::plan::{Plan, StepRef, Stream};
use crate::prepared::PreparedGraph;
use crate::verify::{VerifyScratch, verify_program};
use outcore_graph::Graph;

/// The most device bytes `plan` may hold at once in any timing its streams
/// and waits allow (the budget aside). Errors with the first violation other
/// than the budget when the plan is not safe.
pub fn peak_over_all_timings(plan: &Plan, graph: &Graph) -> Result<u64, String> {
    let prepared = PreparedGraph::new(graph);
    // Every buffer listed, those resident all along included.
    let mut scratch = VerifyScratch::recording_resident();
    let mut probe = plan.clone();
    probe.budget_bytes = u64::MAX;
    let mut violations = Vec::new();
    verify_program(graph, &prepared, &probe, &mut scratch, &mut violations);
    if let Some(v) = violations.first() {
        return Err(v.to_string());
    }
    Ok(States::of(&scratch).peak_bytes())
}

/// What the enumeration reads from a verified program.
struct States<'s> {
    scratch: &'s VerifyScratch,
    len: [usize; 3],
    /// Per stream, per step: its vector clock.
    clocks: [Vec<[i32; 3]>; 3],
}

/// Where a buffer's allocation or free is: stream and index.
type At = Option<(usize, usize)>;

impl<'s> States<'s> {
    fn of(scratch: &'s VerifyScratch) -> States<'s> {
        let len = Stream::ALL.map(|s| scratch.stream_len(s));
        let clocks = Stream::ALL.map(|s| {
            (0..len[s.index()] as u32)
                .map(|index| {
                    let id = scratch.step_id(StepRef { stream: s, index });
                    scratch.clock(id.expect("an index below the stream's length"))
                })
                .collect()
        });
        States {
            scratch,
            len,
            clocks,
        }
    }

    /// The stream and index of global step `id`.
    fn locate(&self, id: usize) -> (usize, usize) {
        let at = self.scratch.step_ref(id);
        (at.stream.index(), at.index as usize)
    }

    /// Whether, with stream `k` at half-position `q`, the steps it has
    /// started only wait for steps complete at half-positions `at`
    /// (entries for `k` itself and for the compute stream are not checked:
    /// the caller bounds the compute stream's position from them).
    fn started_ready(&self, k: usize, q: usize, at: [usize; 3]) -> bool {
        if q == 0 {
            return true;
        }
        // The last started step; the clocks grow along the stream.
        let clock = self.clocks[k][(q - 1) / 2];
        (0..3)
            .filter(|&m| m != k && m != 0)
            .all(|m| clock[m] < (at[m] / 2) as i32)
    }

    fn peak_bytes(&self) -> u64 {
        let n0 = self.len[0];
        let buffers: Vec<(At, At, u64)> = self
            .scratch
            .buffers()
            .iter()
            .map(|b| {
                let alloc = (b.alloc != crate::verify::NONE).then(|| self.locate(b.alloc as usize));
                let free = self.scratch.free_id(b).map(|id| self.locate(id));
                (alloc, free, b.size_bytes)
            })
            .collect();
        let mut delta = vec![0i128; 2 * n0 + 2];
        let mut peak = 0i128;
        for q1 in 0..=2 * self.len[1] {
            for q2 in 0..=2 * self.len[2] {
                let at = [0, q1, q2];
                // Streams 1 and 2 against each other (compute is checked below).
                if !self.started_ready(1, q1, at) || !self.started_ready(2, q2, at) {
                    continue;
                }
                // Compute must have completed what h2d and d2h started after ...
                let mut q_lo = 0;
                for (k, q) in [(1, q1), (2, q2)] {
                    if q > 0 {
                        let c = self.clocks[k][(q - 1) / 2][0];
                        q_lo = q_lo.max(2 * (c + 1) as usize);
                    }
                }
                // ... and may only have started steps whose waits on h2d and
                // d2h are complete.
                let mut q_hi = 2 * n0;
                for (i, clock) in self.clocks[0].iter().enumerate() {
                    if clock[1] >= (q1 / 2) as i32 || clock[2] >= (q2 / 2) as i32 {
                        q_hi = 2 * i;
                        break;
                    }
                }
                if q_lo > q_hi {
                    continue;
                }
                delta.fill(0);
                for &(alloc, free, size_bytes) in &buffers {
                    let mut lo = 0;
                    match alloc {
                        Some((0, i)) => lo = 2 * i + 1,
                        Some((k, i)) if at[k] < 2 * i + 1 => continue,
                        _ => {}
                    }
                    let mut hi = 2 * n0;
                    match free {
                        Some((0, i)) => hi = hi.min(2 * i + 1),
                        Some((k, i)) if at[k] >= 2 * i + 2 => continue,
                        _ => {}
                    }
                    if lo <= hi {
                        delta[lo] += size_bytes as i128;
                        delta[hi + 1] -= size_bytes as i128;
                    }
                }
                let mut cur = 0i128;
                for (q0, &d) in delta[..=q_hi].iter().enumerate() {
                    cur += d;
                    if q0 >= q_lo {
                        peak = peak.max(cur);
                    }
                }
            }
        }
        peak.clamp(0, u64::MAX as i128) as u64
    }
}
