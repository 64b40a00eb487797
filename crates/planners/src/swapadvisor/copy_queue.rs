//! The swap planner's estimate of the d2h stream: copy-outs in the order
//! the lowering issues them, each released when its tensor's last use is
//! done, and when each is done.
//!
//! The lowering issues a swap-out right after the victim's last use, so the
//! d2h stream copies in order of last use, while the scan chooses victims
//! in order of need. A victim chosen later in the scan with an earlier last
//! use is copied *before* victims chosen already. Counting the copies as a
//! queue in the scan's order (a single "the d2h stream is free at" time)
//! put an old victim's copy behind every copy placed before it, where the
//! stream copies it first; this queue keeps the copies by last-use position
//! with release, length and estimated finish, all at the compute rate, and
//! moves the finishes of the copies behind a new one when it delays them.
//!
//! Tried and dropped: refusing a victim whose copy would push a copy placed
//! before past the op that waits for it. The victims left were often none,
//! and the fallback then (the least recently used candidate, whose copy goes
//! earliest in the stream; Belady's choice since 2026-11-30) made plans
//! slower: on BRNN-4-8K the best of five generations (the
//! `swapadvisor_search` example) went from 28.8 s to 42.1 s per iteration.
//!
//! A walk over the copies behind a new one stops where its delay is
//! absorbed (a copy that started at its release starts there still) or
//! after [`WALK_LIMIT`] copies, where the estimate stops following the
//! delay: a bound on the planner's time on copy-bound graphs, whose d2h
//! stream never idles. The plan is as safe either way; only its estimate is
//! rougher.

/// Copies followed behind a new one before a walk gives up (module doc).
const WALK_LIMIT: usize = 256;

/// Below this many seconds two estimates are the same.
const EPS_S: f64 = 1e-12;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The last-use position it is released after.
    position: u32,
    release_s: f64,
    dur_s: f64,
    finish_s: f64,
}

/// Copy-outs by last-use position, those at one position in the order they
/// were placed: a vector kept sorted, not a map, since the scan places most
/// copies at or near the end (an insert there moves little) and looks the
/// queue up far more often than it places (the lookups took two fifths of a
/// NasNet-25 search as `BTreeMap` range queries).
#[derive(Debug, Default)]
pub(crate) struct CopyQueue {
    entries: Vec<Entry>,
    /// The latest finish of any copy (finishes only grow).
    tail_s: f64,
}

impl CopyQueue {
    /// The index of the first copy released after a position past
    /// `position`.
    fn after(&self, position: u32) -> usize {
        self.entries.partition_point(|e| e.position <= position)
    }

    /// When the copies released at positions up to and including
    /// `position` are estimated done (0 when there are none); the tests'
    /// view of the queue.
    #[cfg(test)]
    fn done_through_s(&self, position: u32) -> f64 {
        self.after(position)
            .checked_sub(1)
            .map_or(0.0, |i| self.entries[i].finish_s)
    }

    /// When every copy placed so far is estimated done.
    pub(crate) fn tail_s(&self) -> f64 {
        self.tail_s
    }

    /// When a copy of `dur_s` released after `position` at `release_s` would
    /// be estimated done if placed now: it starts at its release or once the
    /// copies at and before `position` are done, whichever is later.
    pub(crate) fn finish_if_placed_s(&self, position: u32, release_s: f64, dur_s: f64) -> f64 {
        self.finish_if_placed_at_s(self.after(position), release_s, dur_s)
    }

    /// [`Self::finish_if_placed_s`] for a copy that would go at index `at`.
    fn finish_if_placed_at_s(&self, at: usize, release_s: f64, dur_s: f64) -> f64 {
        let ahead_s = at.checked_sub(1).map_or(0.0, |i| self.entries[i].finish_s);
        release_s.max(ahead_s) + dur_s
    }

    /// Places a copy of `dur_s` released after `position` at `release_s`,
    /// behind the copies at `position` and before those after it; returns
    /// when it is estimated done ([`Self::finish_if_placed_s`]).
    pub(crate) fn place(&mut self, position: u32, release_s: f64, dur_s: f64) -> f64 {
        let at = self.after(position);
        let finish_s = self.finish_if_placed_at_s(at, release_s, dur_s);
        let mut prev_s = finish_s;
        let mut tail_s = self.tail_s.max(finish_s);
        for e in self.entries[at..].iter_mut().take(WALK_LIMIT) {
            let f = e.release_s.max(prev_s) + e.dur_s;
            if f <= e.finish_s + EPS_S {
                break;
            }
            e.finish_s = f;
            tail_s = tail_s.max(f);
            prev_s = f;
        }
        self.tail_s = tail_s;
        self.entries.insert(
            at,
            Entry {
                position,
                release_s,
                dur_s,
                finish_s,
            },
        );
        finish_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two copies placed in position order queue like a FIFO: 0..2 and 2..3
    /// (the second, released at 1, waits for the first).
    #[test]
    fn copies_in_position_order_queue() {
        let mut q = CopyQueue::default();
        assert_eq!(q.place(0, 0.0, 2.0), 2.0);
        assert_eq!(q.done_through_s(0), 2.0);
        assert_eq!(q.place(1, 1.0, 1.0), 3.0);
        assert_eq!(q.tail_s(), 3.0);
        // Nothing released at or before a position before the first.
        assert_eq!(CopyQueue::default().done_through_s(7), 0.0);
    }

    /// A copy at position 4 (release 4, 1 long) is done at 5. A copy placed
    /// later at position 2 (release 2, 3 long) goes before it in the stream:
    /// it is done at 5, not behind the first at 8, and pushes the first to
    /// 6, so a copy released at 5 after position 4 is done at 7.
    #[test]
    fn an_earlier_last_use_goes_first_and_delays_the_copies_behind() {
        let mut q = CopyQueue::default();
        assert_eq!(q.place(4, 4.0, 1.0), 5.0);
        assert_eq!(q.place(2, 2.0, 3.0), 5.0);
        assert_eq!(q.done_through_s(2), 5.0);
        assert_eq!(q.done_through_s(4), 6.0);
        assert_eq!(q.tail_s(), 6.0);
        assert_eq!(q.place(5, 5.0, 1.0), 7.0);
    }

    /// A delay that idle time absorbs stops there: copies at 4 (release 4,
    /// 1 long) and 9 (release 9, 1 long); a copy of 2 at position 3
    /// (release 3) pushes the first to 6, and the second still starts at 9.
    #[test]
    fn idle_time_absorbs_a_delay() {
        let mut q = CopyQueue::default();
        q.place(4, 4.0, 1.0);
        q.place(9, 9.0, 1.0);
        assert_eq!(q.place(3, 3.0, 2.0), 5.0);
        assert_eq!(q.done_through_s(4), 6.0);
        assert_eq!(q.done_through_s(9), 10.0);
        assert_eq!(q.tail_s(), 10.0);
    }
}
