//! One direction of the host link as a timeline of busy intervals: TENSILE
//! (Sec. IV-C) lets one tensor at a time use the PCIe channel in each
//! direction, so a swap event is placed only in a free slot.
//!
//! The plan repeats every iteration, so the timeline is one iteration long and
//! a slot must fit inside it; a cross-iteration swap-in is placed in the next
//! iteration's copy of the same timeline.

use super::access::TIME_EPS_S;

/// Busy intervals `[start_s, end_s)`, sorted and disjoint.
#[derive(Debug, Clone, Default)]
pub struct Link {
    busy: Vec<(f64, f64)>,
}

impl Link {
    /// The earliest start `s >= lo_s` with `[s, s + duration_s]` free and
    /// ending by `hi_s` (swap-outs go as early as possible).
    pub fn earliest_slot(&self, lo_s: f64, hi_s: f64, duration_s: f64) -> Option<f64> {
        let mut s = lo_s;
        for &(b0, b1) in &self.busy {
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

    /// The latest start `s` with `[s, s + duration_s]` free, `s >= lo_s` and
    /// `s + duration_s <= hi_s` (swap-ins go as late as possible).
    pub fn latest_slot(&self, lo_s: f64, hi_s: f64, duration_s: f64) -> Option<f64> {
        let mut e = hi_s;
        for &(b0, b1) in self.busy.iter().rev() {
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

    /// Marks `[start_s, start_s + duration_s)` busy.
    pub fn reserve(&mut self, start_s: f64, duration_s: f64) {
        let at = self.busy.partition_point(|&(b0, _)| b0 < start_s);
        self.busy.insert(at, (start_s, start_s + duration_s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_avoid_busy_intervals_from_the_right_side() {
        let mut link = Link::default();
        link.reserve(2.0, 1.0); // busy [2, 3)
        // Earliest 1.5 s slot from 0: [0, 1.5] fits before 2.
        assert_eq!(link.earliest_slot(0.0, 10.0, 1.5), Some(0.0));
        // Earliest 1.5 s slot from 1: [1, 2.5] overlaps, so after the busy one: 3.
        assert_eq!(link.earliest_slot(1.0, 10.0, 1.5), Some(3.0));
        // ... but not if it must end by 4.
        assert_eq!(link.earliest_slot(1.0, 4.0, 1.5), None);
        // Latest 1.5 s slot ending by 3.2: [1.7, 3.2] overlaps, so before 2: 0.5.
        assert_eq!(link.latest_slot(0.0, 3.2, 1.5), Some(0.5));
        // ... but not if it must start at 1 or later.
        assert_eq!(link.latest_slot(1.0, 3.2, 1.5), None);
        // Latest slot ending by 10: [8.5, 10].
        assert_eq!(link.latest_slot(0.0, 10.0, 1.5), Some(8.5));
    }
}
