//! The stream clock both event loops share (this crate's and the multi-job
//! simulator of `outcore-colocate`): what runs on the compute stream and the
//! two link directions, when each ends, and how a copy progresses. A kernel
//! has a fixed end; a copy pays its latency, then moves its bytes at a rate
//! that depends on whether the other direction is copying too. Kept in one
//! place so that one job in the multi-job simulator runs the very
//! floating-point operations `simulate` runs.

use outcore_cost::CopyRates;

/// Work in flight on one stream (index 0: compute, 1: host-to-device, 2:
/// device-to-host).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InFlight {
    /// Kernels: end time. Copies: unused (infinite).
    pub end_s: f64,
    pub latency_left_s: f64,
    pub bytes_left: f64,
}

impl InFlight {
    /// A kernel started at `now_s` that runs `time_s`.
    pub fn kernel(now_s: f64, time_s: f64) -> Self {
        InFlight {
            end_s: now_s + time_s,
            latency_left_s: 0.0,
            bytes_left: 0.0,
        }
    }

    /// A copy of `bytes` that first pays `latency_s`.
    pub fn copy(latency_s: f64, bytes: u64) -> Self {
        InFlight {
            end_s: f64::INFINITY,
            latency_left_s: latency_s,
            bytes_left: bytes as f64,
        }
    }
}

/// When each stream's work ends if the rates stay as they are from `now_s`
/// (infinite where nothing runs). The rates are those of the moment: the
/// duplex rate while both directions copy.
#[inline]
pub fn ends_s(copy: &CopyRates, now_s: f64, flights: [Option<&InFlight>; 3]) -> [f64; 3] {
    let both_copying = flights[1].is_some() && flights[2].is_some();
    let mut ends = [f64::INFINITY; 3];
    for (s, f) in flights.iter().enumerate() {
        if let Some(f) = f {
            ends[s] = if s == 0 {
                f.end_s
            } else {
                now_s + f.latency_left_s + f.bytes_left / rate_bytes_per_s(copy, s, both_copying)
            };
        }
    }
    ends
}

/// Moves every stream's work from `now_s` to `t_next_s` (copies: latency
/// first, then bytes) and returns which streams' work ends then. `ends` are
/// [`ends_s`]'s answers from `now_s`: completion is decided from them, so that
/// rounding in the remaining bytes cannot end a copy early or late.
#[inline]
pub fn advance_to(
    copy: &CopyRates,
    now_s: f64,
    t_next_s: f64,
    ends: &[f64; 3],
    flights: [Option<&mut InFlight>; 3],
) -> [bool; 3] {
    let both_copying = flights[1].is_some() && flights[2].is_some();
    let dt_s = t_next_s - now_s;
    let mut finished = [false; 3];
    for (s, f) in flights.into_iter().enumerate() {
        let Some(f) = f else {
            continue;
        };
        finished[s] = if s == 0 {
            f.end_s <= t_next_s
        } else {
            let rate = rate_bytes_per_s(copy, s, both_copying);
            let lat = f.latency_left_s.min(dt_s);
            f.latency_left_s -= lat;
            f.bytes_left = (f.bytes_left - (dt_s - lat) * rate).max(0.0);
            ends[s] <= t_next_s + 1e-12 * t_next_s.abs().max(1.0)
        };
    }
    finished
}

/// The rate of a copy on link stream `s` (1 or 2) while `both_copying` says
/// whether the other direction is busy too.
#[inline]
fn rate_bytes_per_s(copy: &CopyRates, s: usize, both_copying: bool) -> f64 {
    if both_copying {
        copy.duplex_bytes_per_s[s - 1]
    } else {
        copy.one_way_bytes_per_s[s - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates() -> CopyRates {
        CopyRates {
            one_way_bytes_per_s: [10.0, 20.0],
            duplex_bytes_per_s: [5.0, 8.0],
            latency_s: 1.0,
        }
    }

    #[test]
    fn the_rate_depends_on_the_other_direction() {
        let c = rates();
        let up = InFlight::copy(0.0, 40);
        // Alone: 40 B at 10 B/s ends at 4 s; with a d2h copy beside it, at
        // 5 B/s, at 8 s (and the d2h's 40 B at 8 B/s at 5 s).
        assert_eq!(ends_s(&c, 0.0, [None, Some(&up), None])[1], 4.0);
        let down = InFlight::copy(0.0, 40);
        assert_eq!(
            ends_s(&c, 0.0, [None, Some(&up), Some(&down)]),
            [f64::INFINITY, 8.0, 5.0]
        );
    }

    #[test]
    fn latency_is_paid_before_bytes_move_and_kernels_end_on_time() {
        let c = rates();
        // A kernel from 0 s for 6 s; a copy with 1 s of latency and 100 B at
        // 10 B/s: ends at 0 + 1 + 10 = 11 s.
        let mut k = InFlight::kernel(0.0, 6.0);
        let mut up = InFlight {
            latency_left_s: 1.0,
            ..InFlight::copy(0.0, 100)
        };
        let ends = ends_s(&c, 0.0, [Some(&k), Some(&up), None]);
        assert_eq!(ends, [6.0, 11.0, f64::INFINITY]);
        // To 6 s: the kernel ends; the copy paid 1 s of latency and moved
        // 5 s x 10 B/s = 50 B.
        let done = advance_to(&c, 0.0, 6.0, &ends, [Some(&mut k), Some(&mut up), None]);
        assert_eq!(done, [true, false, false]);
        assert_eq!((up.latency_left_s, up.bytes_left), (0.0, 50.0));
        // The remaining 5 s end it exactly at its end.
        let ends = ends_s(&c, 6.0, [None, Some(&up), None]);
        assert_eq!(ends[1], 11.0);
        let done = advance_to(&c, 6.0, 11.0, &ends, [None, Some(&mut up), None]);
        assert_eq!(done, [false, true, false]);
        assert_eq!(up.bytes_left, 0.0);
    }
}
