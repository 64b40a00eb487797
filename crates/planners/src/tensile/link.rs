//! One direction of the host link as a timeline of busy intervals: TENSILE
//! (Sec. IV-C) lets one tensor at a time use the PCIe channel in each
//! direction, so a swap event is placed only in a free slot.
//!
//! The plan repeats every iteration, so the timeline is one iteration long and
//! a slot must fit inside it; a cross-iteration swap-in is placed in the next
//! iteration's copy of the same timeline.
//!
//! The two directions share the device's duplex bandwidth: a copy moves at its
//! one-way rate while the other direction is idle and at the slower duplex
//! rate while it copies too (the simulator's link). The paper prices a copy as
//! if the channel were its own. Choice: each busy interval records how it was
//! priced. A copy priced one way may only take a slot where the other
//! direction is idle; a copy priced at the duplex rate may share time with the
//! other direction's duplex-priced copies only. [`Link::place`] tries both
//! prices and keeps the better slot. The slots choose the trigger ops; whether
//! the copies, as issued, end in time is checked by [`super::replay`]
//! (measured 2026-11-23, `tensile_table -- protocol`, with the replay: this
//! pricing gives MSR 0.216 / 0.250 / 0.156 on Inception v3 / v4 /
//! DenseNet-121 where one-way pricing gives 0.208 / 0.245 / 0.151, all at EOR
//! 1.0000).

use super::access::TIME_EPS_S;

/// Busy intervals `[start_s, end_s)`, sorted and disjoint, each with whether
/// it was priced at the duplex rate.
#[derive(Debug, Clone, Default)]
pub struct Link {
    busy: Vec<(f64, f64, bool)>,
}

/// Where a copy goes: as early as possible (swap-outs) or as late as possible
/// (swap-ins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Earliest,
    Latest,
}

/// A placed copy: its start, its duration and whether it was priced duplex.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slot {
    pub start_s: f64,
    pub duration_s: f64,
    pub duplex: bool,
}

impl Slot {
    pub fn end_s(&self) -> f64 {
        self.start_s + self.duration_s
    }
}

impl Link {
    /// The best slot in `[lo_s, hi_s]` for a copy that takes `one_way_s` alone
    /// and `duplex_s` beside the other direction's copies (see the module
    /// docs), given the other direction's timeline `other`. Earliest: the slot
    /// that ends first; latest: the one that starts last (ties: one way).
    pub fn place(
        &self,
        other: &Link,
        side: Side,
        (lo_s, hi_s): (f64, f64),
        one_way_s: f64,
        duplex_s: f64,
    ) -> Option<Slot> {
        let find = |duplex: bool, duration_s: f64| {
            let blocked = self.blocked_with(other, duplex);
            let start_s = match side {
                Side::Earliest => earliest_slot(&blocked, lo_s, hi_s, duration_s),
                Side::Latest => latest_slot(&blocked, lo_s, hi_s, duration_s),
            }?;
            Some(Slot {
                start_s,
                duration_s,
                duplex,
            })
        };
        match (find(false, one_way_s), find(true, duplex_s)) {
            (Some(a), Some(b)) => {
                let duplex_better = match side {
                    Side::Earliest => b.end_s() < a.end_s() - TIME_EPS_S,
                    Side::Latest => b.start_s > a.start_s + TIME_EPS_S,
                };
                Some(if duplex_better { b } else { a })
            }
            (a, b) => a.or(b),
        }
    }

    /// Marks a slot busy.
    pub fn reserve(&mut self, slot: Slot) {
        let at = self.busy.partition_point(|&(b0, _, _)| b0 < slot.start_s);
        self.busy
            .insert(at, (slot.start_s, slot.end_s(), slot.duplex));
    }

    /// This direction's busy intervals merged with the other direction's that
    /// a copy priced `duplex` (or one way) may not overlap; sorted, disjoint.
    fn blocked_with(&self, other: &Link, duplex: bool) -> Vec<(f64, f64)> {
        let all: Vec<(f64, f64)> = self
            .busy
            .iter()
            .map(|&(s, e, _)| (s, e))
            .chain(
                other
                    .busy
                    .iter()
                    .filter(|&&(_, _, d)| !(duplex && d))
                    .map(|&(s, e, _)| (s, e)),
            )
            .collect();
        merged(all)
    }
}

/// `busy` (any order, possibly overlapping) as sorted, disjoint intervals.
pub(crate) fn merged(mut busy: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    busy.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(busy.len());
    for (s, e) in busy {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The earliest start `s >= lo_s` with `[s, s + duration_s]` clear of `busy`
/// (sorted, disjoint) and ending by `hi_s`.
pub(crate) fn earliest_slot(
    busy: &[(f64, f64)],
    lo_s: f64,
    hi_s: f64,
    duration_s: f64,
) -> Option<f64> {
    let mut s = lo_s;
    for &(b0, b1) in busy {
        if b1 <= s + TIME_EPS_S {
            continue;
        }
        if s + duration_s <= b0 + TIME_EPS_S {
            break;
        }
        s = s.max(b1);
    }
    (s + duration_s <= hi_s + TIME_EPS_S).then_some(s)
}

/// The latest start `s` with `[s, s + duration_s]` clear of `busy`, `s >=
/// lo_s` and `s + duration_s <= hi_s`.
pub(crate) fn latest_slot(
    busy: &[(f64, f64)],
    lo_s: f64,
    hi_s: f64,
    duration_s: f64,
) -> Option<f64> {
    let mut e = hi_s;
    for &(b0, b1) in busy.iter().rev() {
        if b0 + TIME_EPS_S >= e {
            continue;
        }
        if b1 <= e - duration_s + TIME_EPS_S {
            break;
        }
        e = e.min(b0);
    }
    let s = e - duration_s;
    (s + TIME_EPS_S >= lo_s).then_some(s.max(lo_s))
}

/// Busy time of `busy` (sorted, disjoint) inside `[s, e]`.
fn busy_within(busy: &[(f64, f64)], s: f64, e: f64) -> f64 {
    let from = busy.partition_point(|&(_, b1)| b1 <= s);
    busy[from..]
        .iter()
        .take_while(|&&(b0, _)| b0 < e)
        .map(|&(b0, b1)| (b1.min(e) - b0.max(s)).max(0.0))
        .sum()
}

/// The start `s` in `[lo_s, hi_s - duration_s]` whose stretch `[s, s +
/// duration_s]` overlaps the least busy time of `busy` (sorted, disjoint),
/// the earliest of equals, with that overlap; `None` when the range is
/// shorter than `duration_s` (or either is NaN). Where [`earliest_slot`]
/// finds no clear stretch (a long copy among many short ones), this is
/// where it shares the least busy time with them. The overlap is
/// piecewise linear in `s`, so its
/// least value is at a bend: `lo_s`, the range's last start, an
/// interval's end, or where the stretch's end meets an interval's start.
pub(crate) fn least_busy_slot(
    busy: &[(f64, f64)],
    lo_s: f64,
    hi_s: f64,
    duration_s: f64,
) -> Option<(f64, f64)> {
    let last_s = hi_s - duration_s;
    // A NaN anywhere makes the comparison `None`: no slot.
    let fits = (last_s + TIME_EPS_S).partial_cmp(&lo_s);
    if !fits.is_some_and(std::cmp::Ordering::is_ge) {
        return None;
    }
    let last_s = last_s.max(lo_s);
    let bends = busy
        .iter()
        .flat_map(|&(b0, b1)| [b1, b0 - duration_s])
        .filter(|&s| s > lo_s && s < last_s);
    let mut best: Option<(f64, f64)> = None;
    for s in [lo_s, last_s].into_iter().chain(bends) {
        let overlap_s = busy_within(busy, s, s + duration_s);
        let better = best.is_none_or(|(b, o)| {
            overlap_s < o - TIME_EPS_S || (overlap_s <= o + TIME_EPS_S && s < b)
        });
        if better {
            best = Some((s, overlap_s));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_way(start_s: f64, duration_s: f64) -> Slot {
        Slot {
            start_s,
            duration_s,
            duplex: false,
        }
    }

    #[test]
    fn slots_avoid_busy_intervals_from_the_right_side() {
        let busy = [(2.0, 3.0)];
        // Earliest 1.5 s slot from 0: [0, 1.5] fits before 2.
        assert_eq!(earliest_slot(&busy, 0.0, 10.0, 1.5), Some(0.0));
        // Earliest 1.5 s slot from 1: [1, 2.5] overlaps, so after the busy one: 3.
        assert_eq!(earliest_slot(&busy, 1.0, 10.0, 1.5), Some(3.0));
        // ... but not if it must end by 4.
        assert_eq!(earliest_slot(&busy, 1.0, 4.0, 1.5), None);
        // Latest 1.5 s slot ending by 3.2: [1.7, 3.2] overlaps, so before 2: 0.5.
        assert_eq!(latest_slot(&busy, 0.0, 3.2, 1.5), Some(0.5));
        // ... but not if it must start at 1 or later.
        assert_eq!(latest_slot(&busy, 1.0, 3.2, 1.5), None);
        // Latest slot ending by 10: [8.5, 10].
        assert_eq!(latest_slot(&busy, 0.0, 10.0, 1.5), Some(8.5));
    }

    #[test]
    fn the_least_busy_slot_overlaps_the_fewest_copies() {
        // Busy [1, 2), [2.5, 3), [4, 4.2), [5, 6): no clear 1.5 s stretch
        // in [0, 6].
        let busy = [(1.0, 2.0), (2.5, 3.0), (4.0, 4.2), (5.0, 6.0)];
        assert_eq!(earliest_slot(&busy, 0.0, 6.0, 1.5), None);
        // Stretches from the bends: 0 ([0, 1.5]) 0.5 busy; 1 ([1, 2.5])
        // 1.0; 2 0.5; 2.5 0.5; 3 ([3, 4.5]) 0.2; 3.5 ([3.5, 5]) 0.2; 4.2
        // 0.7; 4.5 (the last start) 1.0. The least is 0.2, first from 3.
        let (s, overlap_s) = least_busy_slot(&busy, 0.0, 6.0, 1.5).expect("a slot");
        assert!((s - 3.0).abs() < 1e-9, "{s}");
        assert!((overlap_s - 0.2).abs() < 1e-9, "{overlap_s}");
        // Where a clear stretch exists it is found with no overlap (the
        // earliest such: [6, 7.5] here, the range's last start).
        let (s, overlap_s) = least_busy_slot(&busy, 0.0, 7.5, 1.5).expect("a slot");
        assert_eq!((s, overlap_s), (6.0, 0.0));
        // A range shorter than the copy has none, nor a NaN duration.
        assert_eq!(least_busy_slot(&busy, 0.0, 1.0, 1.5), None);
        assert_eq!(least_busy_slot(&busy, 0.0, 6.0, f64::NAN), None);
    }

    #[test]
    fn a_copy_beside_the_other_direction_is_priced_duplex_or_moved() {
        let mut d2h = Link::default();
        let h2d = Link::default();
        d2h.reserve(one_way(2.0, 1.0)); // swap-out [2, 3), priced one way
        let mut h2d_dup = h2d.clone();
        // A 1 s swap-in (1.2 s duplex) as late as possible by 3: the other
        // direction is busy one way at [2, 3), so it cannot overlap it at
        // either price: [1, 2] one way.
        let slot = h2d
            .place(&d2h, Side::Latest, (0.0, 3.0), 1.0, 1.2)
            .expect("slot");
        assert_eq!(slot, one_way(1.0, 1.0));
        // With the swap-out priced duplex, the swap-in may share its time at
        // the duplex price: [1.8, 3.0], later than [1, 2].
        let mut d2h_dup = Link::default();
        d2h_dup.reserve(Slot {
            start_s: 2.0,
            duration_s: 1.0,
            duplex: true,
        });
        let slot = h2d_dup
            .place(&d2h_dup, Side::Latest, (0.0, 3.0), 1.0, 1.2)
            .expect("slot");
        assert!(slot.duplex && (slot.start_s - 1.8).abs() < 1e-9, "{slot:?}");
        h2d_dup.reserve(slot);
        // The same direction never overlaps itself: a second swap-in by 3 ends
        // by 1.8.
        let next = h2d_dup
            .place(&d2h_dup, Side::Latest, (0.0, 3.0), 1.0, 1.2)
            .expect("slot");
        assert!(next.end_s() <= 1.8 + 1e-9, "{next:?}");
        // Earliest: a swap-out from 0 with the other direction idle goes one way.
        let free = Link::default()
            .place(&Link::default(), Side::Earliest, (0.0, 5.0), 1.0, 1.2)
            .expect("slot");
        assert_eq!(free, one_way(0.0, 1.0));
    }
}
