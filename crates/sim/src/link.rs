//! The host link model both event loops share (this crate's and the
//! multi-job simulator of `outcore-colocate`): a copy pays its latency, then
//! moves its bytes at a rate that depends on whether the other direction is
//! copying too. Kept in one place so that one job in the multi-job simulator
//! runs the very floating-point operations `simulate` runs.

use outcore_cost::CopyRates;

/// The rate of a copy on link stream `s` (1: host-to-device, 2:
/// device-to-host) while `both_copying` says whether the other direction is
/// busy too.
#[inline]
pub fn copy_rate_bytes_per_s(copy: &CopyRates, s: usize, both_copying: bool) -> f64 {
    if both_copying {
        copy.duplex_bytes_per_s[s - 1]
    } else {
        copy.one_way_bytes_per_s[s - 1]
    }
}

/// When a copy with `latency_left_s` and `bytes_left` ends if the rate stays
/// `rate_bytes_per_s` from `now_s`.
#[inline]
pub fn copy_end_s(now_s: f64, latency_left_s: f64, bytes_left: f64, rate_bytes_per_s: f64) -> f64 {
    now_s + latency_left_s + bytes_left / rate_bytes_per_s
}

/// Moves a copy on by `dt_s` at `rate_bytes_per_s`: latency first, then bytes.
/// Returns whether it ends by `t_next_s`, decided from `end_s` (its end
/// computed before advancing), so that rounding in the remaining bytes cannot
/// end a copy early or late.
#[inline]
pub fn advance_copy(
    latency_left_s: &mut f64,
    bytes_left: &mut f64,
    dt_s: f64,
    rate_bytes_per_s: f64,
    end_s: f64,
    t_next_s: f64,
) -> bool {
    let lat = latency_left_s.min(dt_s);
    *latency_left_s -= lat;
    *bytes_left = (*bytes_left - (dt_s - lat) * rate_bytes_per_s).max(0.0);
    end_s <= t_next_s + 1e-12 * t_next_s.abs().max(1.0)
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
        assert_eq!(copy_rate_bytes_per_s(&c, 1, false), 10.0);
        assert_eq!(copy_rate_bytes_per_s(&c, 2, false), 20.0);
        assert_eq!(copy_rate_bytes_per_s(&c, 1, true), 5.0);
        assert_eq!(copy_rate_bytes_per_s(&c, 2, true), 8.0);
    }

    #[test]
    fn latency_is_paid_before_bytes_move() {
        // 1 s of latency, 100 B at 10 B/s: ends at 0 + 1 + 10 = 11 s.
        let (mut lat, mut bytes) = (1.0, 100.0);
        let end = copy_end_s(0.0, lat, bytes, 10.0);
        assert_eq!(end, 11.0);
        // After 3 s: 1 s of latency, then 2 s x 10 B/s = 20 B moved.
        assert!(!advance_copy(&mut lat, &mut bytes, 3.0, 10.0, end, 3.0));
        assert_eq!((lat, bytes), (0.0, 80.0));
        // The remaining 8 s end it exactly at its end.
        assert!(advance_copy(&mut lat, &mut bytes, 8.0, 10.0, end, 11.0));
        assert_eq!(bytes, 0.0);
    }
}
