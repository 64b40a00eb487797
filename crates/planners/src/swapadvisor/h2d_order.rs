//! The order of the swap-ins on the h2d stream: earliest deadline first.
//!
//! The lowering issues swap-ins on the one h2d stream in order of their
//! triggers (then of need, for one trigger position), and a copy runs once
//! it is triggered and the copies before it are done. So a copy triggered
//! early but needed late goes ahead of one triggered a little later and
//! needed first: on WResNet-152-10 at 16 GiB the best plan of a 30 s search
//! had a 1 MB weight's swap-in triggered 36 ms before its use and started
//! 1 ms before it, behind 49 ms of copies (a 236 MB weight and two
//! activations) needed 14 ms after it. With the order below, the best plan
//! of the same 30 s search had 1.6 s of stalls on swap-ins against 3.0 s
//! (RESULTS.md).
//!
//! The paper (Sec. 4.2) places each swap-in "as early as possible" after
//! the swap-out that frees its object and leaves the order of the copies on
//! the stream to the dataflow engine. Our choice: estimate the link at the
//! compute rate (a trigger at position `q` fires when the ops before and at
//! `q` are done, a use at `b` needs its copy when the ops before `b` are),
//! and whenever the link is free let the triggered copy needed first go
//! next (earliest deadline first, without preemption). Realised in the
//! lowering's terms by moving a copy's trigger to the latest trigger of the
//! copies before it in that sequence: a later trigger only shortens the time
//! the copy's buffer is held, so the pool's and `verify()`'s guarantees are
//! those of the plan before (the sweep for `verify()`'s bound runs after
//! this). The estimate ignores stalls; where it is wrong the order is still
//! safe, only slower.

use super::edf;

/// One swap-in: where it is triggered (`None`: the iteration start), the
/// position whose op needs it, and how long it copies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SwapIn {
    pub trigger: Option<usize>,
    pub before: usize,
    pub h2d_s: f64,
}

/// When a trigger fires, in compute time from the iteration start.
/// `prefix_s[p]` is the compute time of positions `0..p`.
fn fire_s(trigger: Option<usize>, prefix_s: &[f64]) -> f64 {
    trigger.map_or(0.0, |q| prefix_s[(q + 1).min(prefix_s.len() - 1)])
}

/// The order in which the link should copy `copies` (indices into it):
/// whenever the link is free, the triggered copy needed first, ties by
/// index; when none is triggered, the link waits for the next trigger.
pub(crate) fn edf_sequence(copies: &[SwapIn], prefix_s: &[f64]) -> Vec<usize> {
    let fire: Vec<f64> = copies.iter().map(|c| fire_s(c.trigger, prefix_s)).collect();
    let dur: Vec<f64> = copies.iter().map(|c| c.h2d_s).collect();
    edf::sequence(&fire, &dur, |i| copies[i].before)
}

/// New triggers that make the lowering issue `copies` in `sequence`'s
/// order: each copy is triggered no earlier than the copies before it in
/// the sequence (then, at one position, the lowering's order of need keeps
/// the earlier need first), and never at or after its use. Returns the
/// trigger of each copy, by index; a copy whose trigger does not move keeps
/// its own.
pub(crate) fn realise(copies: &[SwapIn], sequence: &[usize]) -> Vec<Option<usize>> {
    let mut triggers: Vec<Option<usize>> = copies.iter().map(|c| c.trigger).collect();
    let mut latest: Option<usize> = None;
    for &i in sequence {
        let c = copies[i];
        // A trigger must precede the use: a copy needed at position 0 stays
        // at the iteration start.
        if latest > c.trigger
            && let Some(last_before_use) = c.before.checked_sub(1)
        {
            let moved = latest.map(|l| l.min(last_before_use));
            if moved > c.trigger {
                triggers[i] = moved;
            }
        }
        latest = latest.max(triggers[i]);
    }
    triggers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit times: op `p` runs in `[p, p + 1)`, so `prefix_s[p] = p`.
    fn unit_prefix(n: usize) -> Vec<f64> {
        (0..=n).map(|p| p as f64).collect()
    }

    /// A: triggered after op 0 (fires at 1), needed at op 6 (time 6), 3 long.
    /// B: triggered after op 1 (fires at 2), needed at op 3 (time 3), 1 long.
    /// In trigger order A runs 1..4 and B 4..5, two units after its need;
    /// at time 1 only A is triggered, so earliest deadline first also starts
    /// A (no preemption, no idling): the sequence is A, B.
    /// C: as B but triggered with A (after op 0): both are ready at 1 and C is
    /// needed first, so C goes first (1..2) and A after it (2..5, before 6).
    #[test]
    fn the_triggered_copy_needed_first_goes_next() {
        let p = unit_prefix(8);
        let a = SwapIn {
            trigger: Some(0),
            before: 6,
            h2d_s: 3.0,
        };
        let b = SwapIn {
            trigger: Some(1),
            before: 3,
            h2d_s: 1.0,
        };
        assert_eq!(edf_sequence(&[a, b], &p), vec![0, 1]);
        let c = SwapIn {
            trigger: Some(0),
            ..b
        };
        assert_eq!(edf_sequence(&[a, c], &p), vec![1, 0]);
    }

    /// A (5 long, needed at op 11) and B (1 long, needed at op 4) are both
    /// triggered after op 2 (fire at 3); C (1 long, needed at op 5) after op
    /// 3 (fires at 4). B goes first (3..4); at 4 C is triggered and needed
    /// before A, so C goes next (4..5) and A last (5..10, before 11). In
    /// trigger order A would have gone second (4..9) and made C four units
    /// late.
    #[test]
    fn a_copy_needed_later_is_triggered_behind_those_needed_first() {
        let p = unit_prefix(12);
        let copies = [
            SwapIn {
                trigger: Some(2),
                before: 11,
                h2d_s: 5.0,
            },
            SwapIn {
                trigger: Some(2),
                before: 4,
                h2d_s: 1.0,
            },
            SwapIn {
                trigger: Some(3),
                before: 5,
                h2d_s: 1.0,
            },
        ];
        let sequence = edf_sequence(&copies, &p);
        assert_eq!(sequence, vec![1, 2, 0]);
        // B keeps its trigger; C keeps its own (later than B's); A moves to
        // C's, where the lowering's order of need puts it after C.
        assert_eq!(realise(&copies, &sequence), vec![Some(3), Some(2), Some(3)]);
    }

    /// A copy from the iteration start (no trigger) that should follow a
    /// triggered one is triggered there; a copy is never triggered at or
    /// after its use.
    #[test]
    fn moved_triggers_stay_before_the_use() {
        let copies = [
            SwapIn {
                trigger: Some(4),
                before: 6,
                h2d_s: 1.0,
            },
            SwapIn {
                trigger: None,
                before: 9,
                h2d_s: 1.0,
            },
            SwapIn {
                trigger: Some(1),
                before: 3,
                h2d_s: 1.0,
            },
        ];
        // An order that puts the start's copy and a copy used at 3 behind a
        // trigger at 4.
        assert_eq!(
            realise(&copies, &[0, 1, 2]),
            vec![Some(4), Some(4), Some(2)]
        );
        // A copy needed by the first op keeps the iteration start.
        let first = SwapIn {
            trigger: None,
            before: 0,
            h2d_s: 1.0,
        };
        assert_eq!(realise(&[copies[0], first], &[0, 1]), vec![Some(4), None]);
        // The simulation itself starts with what is ready first.
        assert_eq!(edf_sequence(&copies, &unit_prefix(10)), vec![1, 2, 0]);
    }
}
