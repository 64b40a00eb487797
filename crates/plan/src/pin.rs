//! Waits that pin a plan's frees to its predicted timeline, so that an exact
//! layout ([`crate::lay_out`]) may reuse the bytes they release.
//!
//! A plan orders its streams only where it must: a swap-out's free on the
//! d2h stream, say, is often never waited for by the compute stream. A layout
//! that must hold for every timing then keeps that buffer's bytes apart from
//! everything the compute stream allocates until the iteration's end, even
//! though, as predicted, the free happens long before. On swap-heavy plans
//! (BERT-base and GPT-2 at a quarter of the footprint) this left layouts
//! 16-35% above the plan's memory bound (RESULTS.md).
//!
//! [`pin_frees`] adds, before each allocating step, a wait on the latest
//! step of each other stream that the predicted timeline has already
//! finished when the allocating step starts, where that orders a free not
//! ordered before. Each added wait is satisfied at the moment the predicted
//! timeline starts the step, so the prediction is unchanged (the timing the
//! plan was chosen for); what changes is that a slower copy than predicted
//! now delays the compute stream instead of overlapping with memory the
//! layout gave away. That is the contract a fixed layout needs anyway: a
//! caching allocator gets the same effect by making a stream wait for
//! another's use of a block before reusing it (PyTorch's `record_stream`).
//!
//! Waits are added only on steps the timeline started before the
//! allocating step, so no cycle can appear; only before allocating steps
//! (compute, recompute, swap-in), since only an allocation reuses bytes; and
//! only where a free on the other stream is not already ordered before the
//! step (vector clocks over the plan with the waits added so far), so a
//! plan whose frees are all ordered gets none.

use crate::plan::{Instr, Plan, StepRef, Stream};
use std::fmt;

/// One step of a predicted iteration: when it started and finished, in
/// seconds from the iteration's start. A timeline lists every step of the
/// plan once, in the order the steps started (ties as the simulator took
/// them), as `outcore_sim::simulate` records it on request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedStep {
    pub at: StepRef,
    pub start_s: f64,
    pub end_s: f64,
}

/// Why a timeline cannot pin a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinError {
    pub message: String,
}

impl fmt::Display for PinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot pin the plan to its timeline: {}", self.message)
    }
}

impl std::error::Error for PinError {}

/// Adds the waits of the module docs to `plan`, from `timeline` (its
/// predicted iteration); returns how many were added.
pub fn pin_frees(plan: &mut Plan, timeline: &[TimedStep]) -> Result<usize, PinError> {
    let len = Stream::ALL.map(|s| plan.stream(s).len());
    check_timeline(&len, timeline)?;
    // Per stream, how many frees are at or before each index (prefix sums),
    // to tell whether a range of another stream's steps holds a free.
    let frees_through: [Vec<u32>; 3] = Stream::ALL.map(|s| {
        let mut n = 0u32;
        plan.stream(s)
            .iter()
            .map(|step| {
                n += u32::from(matches!(step.instr, Instr::Free(_)));
                n
            })
            .collect()
    });
    // Per step: for each stream, the highest index known to happen before
    // or be it (-1: none), with the waits added so far.
    let mut clock: [Vec<[i64; 3]>; 3] = len.map(|n| vec![[-1; 3]; n]);
    // Per stream, in index order: each step's end and its position in the
    // timeline; and the first step not yet seen to have finished.
    let mut end_and_position: [Vec<(f64, usize)>; 3] = len.map(Vec::with_capacity);
    for (pos, t) in timeline.iter().enumerate() {
        end_and_position[t.at.stream.index()].push((t.end_s, pos));
    }
    let mut finished_below = [0usize; 3];
    let mut added = 0;
    for (pos, t) in timeline.iter().enumerate() {
        let (s, i) = (t.at.stream.index(), t.at.index as usize);
        let mut c = if i > 0 { clock[s][i - 1] } else { [-1; 3] };
        for w in &plan.streams[s][i].waits {
            let Some(theirs) = clock[w.stream.index()].get(w.index as usize) else {
                return Err(PinError {
                    message: format!(
                        "step {} waits for {w}, which the plan lacks; verify the plan first",
                        t.at
                    ),
                });
            };
            merge(&mut c, theirs);
        }
        c[s] = i as i64;
        if allocates(&plan.streams[s][i].instr) {
            for other in (0..3).filter(|&o| o != s) {
                let done = &end_and_position[other];
                let below = &mut finished_below[other];
                // Steps of a stream finish in index order and the timeline's
                // start times never decrease, so this pointer only advances.
                while *below < done.len() && done[*below].0 <= t.start_s && done[*below].1 < pos {
                    *below += 1;
                }
                let Some(latest) = below.checked_sub(1) else {
                    continue;
                };
                let known = c[other];
                let frees = &frees_through[other];
                let known_frees = if known < 0 { 0 } else { frees[known as usize] };
                if (latest as i64) > known && frees[latest] > known_frees {
                    let at = StepRef {
                        stream: Stream::ALL[other],
                        index: latest as u32,
                    };
                    plan.streams[s][i].waits.push(at);
                    let theirs = clock[other][latest];
                    merge(&mut c, &theirs);
                    added += 1;
                }
            }
        }
        clock[s][i] = c;
    }
    Ok(added)
}

/// Whether a step allocates device memory as it starts (a compute step may
/// allocate nothing, an in-place update; counted anyway, at the cost of a
/// wait that orders nothing the layout uses).
fn allocates(instr: &Instr) -> bool {
    matches!(
        instr,
        Instr::Compute(_) | Instr::Recompute { .. } | Instr::SwapIn(_)
    )
}

fn merge(into: &mut [i64; 3], from: &[i64; 3]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}

/// Checks that `timeline` lists every step of a plan with streams of `len`
/// steps exactly once, each stream in index order, with finite times that do
/// not run backwards.
fn check_timeline(len: &[usize; 3], timeline: &[TimedStep]) -> Result<(), PinError> {
    let refit =
        "; it is not this plan's: simulate this plan with `record_timeline` and pin with that";
    let total: usize = len.iter().sum();
    if timeline.len() != total {
        return Err(PinError {
            message: format!(
                "it lists {} steps where the plan has {total}{refit}",
                timeline.len()
            ),
        });
    }
    let mut seen = [0usize; 3];
    let mut last_start_s = f64::NEG_INFINITY;
    for t in timeline {
        let s = t.at.stream.index();
        if t.at.index as usize != seen[s] {
            return Err(PinError {
                message: format!(
                    "step {} comes where {}#{} was expected{refit}",
                    t.at, t.at.stream, seen[s]
                ),
            });
        }
        if !(t.start_s.is_finite() && t.end_s.is_finite())
            || t.end_s < t.start_s
            || t.start_s < last_start_s
        {
            return Err(PinError {
                message: format!(
                    "step {} has times {} s to {} s after a start at {} s{refit}",
                    t.at, t.start_s, t.end_s, last_start_s
                ),
            });
        }
        last_start_s = t.start_s;
        seen[s] += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlannerInfo, Step};
    use outcore_graph::{OpId, TensorId, zoo};

    /// compute: c0 Compute, c1 Compute; d2h: d0 SwapOut (waits c0), d1 Free.
    /// Only the plan's shape matters to pinning, not what the ops are.
    fn plan() -> Plan {
        let g = zoo::build("tiny-cnn", Some(2), &Default::default(), None).expect("zoo");
        let info = PlannerInfo {
            name: "test".into(),
            seed: None,
            settings: serde_json::Value::Null,
        };
        let mut p = Plan::new(&g, info, 1 << 30);
        let c0 = p.push(Stream::Compute, Instr::Compute(OpId(0)), vec![]);
        p.push(Stream::Compute, Instr::Compute(OpId(1)), vec![]);
        p.push(Stream::D2h, Instr::SwapOut(TensorId(1)), vec![c0]);
        p.push(Stream::D2h, Instr::Free(TensorId(1)), vec![]);
        p
    }

    fn at(stream: Stream, index: u32) -> StepRef {
        StepRef { stream, index }
    }

    fn timed(stream: Stream, index: u32, start_s: f64, end_s: f64) -> TimedStep {
        TimedStep {
            at: at(stream, index),
            start_s,
            end_s,
        }
    }

    /// c0 [0, 1], the copy [1, 2], its free at 2, c1 from 3.
    fn free_then_c1() -> [TimedStep; 4] {
        [
            timed(Stream::Compute, 0, 0.0, 1.0),
            timed(Stream::D2h, 0, 1.0, 2.0),
            timed(Stream::D2h, 1, 2.0, 2.0),
            timed(Stream::Compute, 1, 3.0, 4.0),
        ]
    }

    #[test]
    fn an_allocation_after_a_predicted_free_waits_for_it() {
        // c0 [0, 1], the copy [1, 2], its free at 2, c1 from 3: as predicted
        // the free comes first, so c1 waits for it (satisfied at 3 already).
        let mut p = plan();
        let timeline = free_then_c1();
        assert_eq!(pin_frees(&mut p, &timeline), Ok(1));
        assert_eq!(p.stream(Stream::Compute)[1].waits, vec![at(Stream::D2h, 1)]);
        // Pinning again adds nothing: the free is now ordered.
        assert_eq!(pin_frees(&mut p, &timeline), Ok(0));
    }

    #[test]
    fn an_allocation_before_the_free_ends_gets_no_wait() {
        // c1 starts at 1.5, while the copy runs (it ends at 2): no wait, as
        // one would delay the prediction; nor on the copy started before c1,
        // which has not finished either.
        let mut p = plan();
        let timeline = [
            timed(Stream::Compute, 0, 0.0, 1.0),
            timed(Stream::D2h, 0, 1.0, 2.0),
            timed(Stream::Compute, 1, 1.5, 2.5),
            timed(Stream::D2h, 1, 2.0, 2.0),
        ];
        assert_eq!(pin_frees(&mut p, &timeline), Ok(0));
        assert!(p.stream(Stream::Compute)[1].waits.is_empty());
    }

    #[test]
    fn a_free_that_starts_later_at_the_same_instant_is_not_waited_for() {
        // The free and c1 both at 2, the free taken after c1: waiting for it
        // could make a cycle in general, so it is left alone.
        let mut p = plan();
        let timeline = [
            timed(Stream::Compute, 0, 0.0, 1.0),
            timed(Stream::D2h, 0, 1.0, 2.0),
            timed(Stream::Compute, 1, 2.0, 3.0),
            timed(Stream::D2h, 1, 2.0, 2.0),
        ];
        assert_eq!(pin_frees(&mut p, &timeline), Ok(0));
    }

    #[test]
    fn a_step_that_allocates_nothing_or_a_free_already_ordered_gets_no_wait() {
        let mut p = plan();
        // c1 already waits for the free.
        p.streams[0][1] = Step {
            instr: Instr::Compute(OpId(1)),
            waits: vec![at(Stream::D2h, 1)],
        };
        let timeline = free_then_c1();
        assert_eq!(pin_frees(&mut p, &timeline), Ok(0));
        // A free on the compute stream allocates nothing.
        let mut p = plan();
        p.streams[0][1].instr = Instr::Free(TensorId(2));
        assert_eq!(pin_frees(&mut p, &timeline), Ok(0));
    }

    #[test]
    fn a_timeline_of_another_plan_is_refused() {
        let mut p = plan();
        let short = [timed(Stream::Compute, 0, 0.0, 1.0)];
        let e = pin_frees(&mut p, &short).expect_err("too short");
        assert!(
            e.to_string().contains("lists 1 steps where the plan has 4"),
            "{e}"
        );
        let out_of_order = [
            timed(Stream::Compute, 1, 0.0, 1.0),
            timed(Stream::Compute, 0, 1.0, 2.0),
            timed(Stream::D2h, 0, 2.0, 3.0),
            timed(Stream::D2h, 1, 3.0, 3.0),
        ];
        let e = pin_frees(&mut p, &out_of_order).expect_err("out of order");
        assert!(
            e.to_string().contains("compute#1 comes where compute#0"),
            "{e}"
        );
        let backwards = [
            timed(Stream::Compute, 0, 1.0, 2.0),
            timed(Stream::D2h, 0, 0.5, 3.0),
            timed(Stream::D2h, 1, 3.0, 3.0),
            timed(Stream::Compute, 1, 3.0, 4.0),
        ];
        let e = pin_frees(&mut p, &backwards).expect_err("backwards");
        assert!(e.to_string().contains("d2h#0"), "{e}");
        assert!(p.stream(Stream::Compute)[1].waits.is_empty(), "unchanged");
        // A plan whose wait names a step it lacks.
        let mut bad = plan();
        bad.streams[0][1].waits.push(at(Stream::H2d, 7));
        let timeline = free_then_c1();
        let e = pin_frees(&mut bad, &timeline).expect_err("bad wait");
        assert!(e.to_string().contains("waits for h2d#7"), "{e}");
    }
}
