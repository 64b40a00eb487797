//! The order of the copy-outs on the d2h stream: earliest deadline first.
//!
//! The lowering issues a swap-out right after the victim's last use, so the
//! d2h stream copies in order of last use, one copy at a time. A large copy
//! whose object is needed late, issued first, then holds up a small copy
//! whose object an op is about to wait for: on WResNet-152-10 at 16 GiB the
//! best plan of a 30 s search (25.87 s, 1.59 s of compute stalls) had, in
//! each of 17 backward blocks, a 3x3 convolution's weight and its momentum
//! (two 23.5 ms copies) leave after the update, then the next 1x1
//! convolution's weight and momentum (0.9 ms each), whose object the
//! following convolution's gradient waited for: 33 ms stalls; the backward
//! pass's stalls on copy-outs came to 0.52 s (the trace's stalls charged to
//! the copy-out that ended at the op's start).
//!
//! The paper (Sec. 4.2) places each swap-out right after the last use and
//! leaves the order on the stream to the dataflow engine. Our choice, as on
//! the h2d stream ([`super::h2d_order`]): estimate the stream at the compute
//! rate (a copy-out is released when the op of its last use is done; its
//! deadline is when compute reaches its reclaim point, the op that waits for
//! its object, or the iteration's end where none does), and whenever the
//! stream is free let the released copy due first go next (earliest
//! deadline first, without preemption; equal deadlines: the shorter copy
//! first, which ends the wait at that op no later and frees one object
//! sooner). Realised in the lowering's terms by delaying a copy-out
//! ([`outcore_plan::Gap::copy_out_after`] past the gap's start) to the
//! latest issue point of the copies before it in that sequence, never to or
//! past its reclaim point, its gap's end or its swap-in's trigger. A delay
//! only keeps a victim resident longer inside the object it already holds:
//! the object passes to the next holder at the same reclaim point, so the
//! pool's and `verify()`'s guarantees are those of the plan before. The
//! estimate ignores stalls and swap-ins; where it is wrong the order is
//! still safe, only slower.

use super::edf;

/// One copy-out: the position of the last use it follows, the position
/// whose op waits for its object (`n` for none: the iteration's end), the
/// last position it may be issued after, and how long it copies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CopyOut {
    pub after: usize,
    pub due: usize,
    pub latest: usize,
    pub d2h_s: f64,
}

/// The order in which the stream should copy `copies` (indices into it):
/// whenever the stream is free, the released copy due first (then the
/// shorter, then by index); when none is released, the stream waits for the
/// next release. `prefix_s[p]` is the compute time of positions `0..p`.
pub(crate) fn edf_sequence(copies: &[CopyOut], prefix_s: &[f64]) -> Vec<usize> {
    let last = prefix_s.len() - 1;
    let released: Vec<f64> = copies
        .iter()
        .map(|c| prefix_s[(c.after + 1).min(last)])
        .collect();
    let dur: Vec<f64> = copies.iter().map(|c| c.d2h_s).collect();
    // Durations are non-negative, so their bit patterns order as the numbers do.
    edf::sequence(&released, &dur, |i| {
        (copies[i].due, copies[i].d2h_s.max(0.0).to_bits())
    })
}

/// Where each copy of `copies` is issued (after that position) so that the
/// stream copies them in `sequence`'s order: no earlier than the copies
/// before it in the sequence, never past its `latest`. Returns the position
/// of each copy, by index; a copy that keeps its own has `after`. Copies
/// left at one position go in the lowering's order there (the gaps that
/// start there by tensor, then the delayed ones by reclaim point), which
/// may differ from the sequence's: a copy is only ever delayed, so two
/// released by the same op cannot be swapped without idling the stream for
/// the next op.
pub(crate) fn realise(copies: &[CopyOut], sequence: &[usize]) -> Vec<usize> {
    let mut issue: Vec<usize> = copies.iter().map(|c| c.after).collect();
    let mut latest_issued = 0usize;
    for &i in sequence {
        let c = copies[i];
        issue[i] = latest_issued.clamp(c.after, c.latest.max(c.after));
        latest_issued = latest_issued.max(issue[i]);
    }
    issue
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit times: op `p` runs in `[p, p + 1)`, so `prefix_s[p] = p`.
    fn unit_prefix(n: usize) -> Vec<f64> {
        (0..=n).map(|p| p as f64).collect()
    }

    /// The WResNet-152-10 case in small. A: a large copy (3 long) after op
    /// 0, due at op 9; B: a small one (1 long) after op 1, due at op 3. In
    /// issue order A runs 1..4 and B 4..5, two units past op 3's start. At
    /// time 1 only A is released, and the stream is free, so A goes first
    /// even by deadline (no idling). C: as B but after op 0 with A: both are
    /// released at 1 and C is due first: C runs 1..2 and A 2..5 (due at 9).
    #[test]
    fn the_released_copy_due_first_goes_next() {
        let p = unit_prefix(10);
        let a = CopyOut {
            after: 0,
            due: 9,
            latest: 8,
            d2h_s: 3.0,
        };
        let b = CopyOut {
            after: 1,
            due: 3,
            latest: 2,
            d2h_s: 1.0,
        };
        assert_eq!(edf_sequence(&[a, b], &p), vec![0, 1]);
        let c = CopyOut { after: 0, ..b };
        assert_eq!(edf_sequence(&[a, c], &p), vec![1, 0]);
        // Realised: both stay after op 0 (a delay is to a later op only),
        // where the lowering orders the two gaps' copies by tensor.
        assert_eq!(realise(&[a, c], &[1, 0]), vec![0, 0]);
    }

    /// A (3 long, after op 0, due at 9) keeps the stream busy from 1 to 4.
    /// B (2 long, after op 1, due at 8) and C (1 long, after op 2, due at 5)
    /// are both released by 4: C goes next (4..5, on time) and B after it
    /// (5..7). B moves to C's issue point; A keeps its own.
    #[test]
    fn a_copy_due_later_is_issued_behind_one_due_first() {
        let p = unit_prefix(10);
        let copies = [
            CopyOut {
                after: 0,
                due: 9,
                latest: 8,
                d2h_s: 3.0,
            },
            CopyOut {
                after: 1,
                due: 8,
                latest: 7,
                d2h_s: 2.0,
            },
            CopyOut {
                after: 2,
                due: 5,
                latest: 4,
                d2h_s: 1.0,
            },
        ];
        let sequence = edf_sequence(&copies, &p);
        assert_eq!(sequence, vec![0, 2, 1]);
        assert_eq!(realise(&copies, &sequence), vec![0, 2, 2]);
    }

    /// Equal deadlines: the shorter copy first (both released at 1, due at
    /// op 6: 1..2 then 2..5, rather than 1..4 then 4..5).
    #[test]
    fn equal_deadlines_go_shortest_first() {
        let p = unit_prefix(8);
        let long = CopyOut {
            after: 0,
            due: 6,
            latest: 5,
            d2h_s: 3.0,
        };
        let short = CopyOut { d2h_s: 1.0, ..long };
        assert_eq!(edf_sequence(&[long, short], &p), vec![1, 0]);
    }

    /// A copy is never issued past its `latest`, even when that breaks the
    /// sequence's order (the lowering then copies it earlier than planned).
    #[test]
    fn an_issue_point_stays_within_its_latest() {
        let copies = [
            CopyOut {
                after: 5,
                due: 9,
                latest: 8,
                d2h_s: 1.0,
            },
            CopyOut {
                after: 1,
                due: 4,
                latest: 3,
                d2h_s: 1.0,
            },
        ];
        assert_eq!(realise(&copies, &[0, 1]), vec![5, 3]);
        // A latest before the copy's own position (no room to delay) keeps it.
        let stuck = CopyOut {
            latest: 0,
            ..copies[1]
        };
        assert_eq!(realise(&[copies[0], stuck], &[0, 1]), vec![5, 1]);
    }
}
