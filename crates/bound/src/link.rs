//! The host link as the bound sees it: the fastest rate of each direction,
//! and what copying in the other direction at the same time costs it.
//!
//! # Derivation
//!
//! A direction moves `o` bytes/s while the other is idle and `d` bytes/s
//! while the other copies too (`CopyRates`: `one_way` and `duplex`; on
//! `v100-16gb-pcie3` `o = 12` and `d = 10` GB/s each way). Take any interval
//! of length `L` in which `X` bytes move host-to-device and `Y` bytes
//! device-to-host, and split it into the time `a` both directions copy, `b`
//! only the host-to-device one does and `c` only the other one (latency
//! counts as copying and moves nothing, which only helps the inequality).
//! Then `X <= d_in a + o_in b` and `Y <= d_out a + o_out c`. With `r_in =
//! max(o_in, d_in)`:
//!
//! `r_in L = r_in (a + b + c) >= X + (r_in - d_in) a + r_in c`,
//!
//! and for `κ_in = min((r_in - d_in) / d_out, r_in / o_out)`, `κ_in Y <=
//! κ_in d_out a + κ_in o_out c <= (r_in - d_in) a + r_in c`. So
//!
//! `L >= (X + κ_in Y) / r_in`, and the same with the directions swapped.
//!
//! On `v100-16gb-pcie3` `κ_in = κ_out = 0.2`: a second of copying out,
//! overlapped or not, leaves the link at least 0.2 s less for copying in.
//! Where both directions keep their one-way rate together (`d = o`, as on
//! links whose duplex total is twice a direction's), `κ = 0` and the two
//! directions are independent.
//!
//! **Latency.** A direction runs one copy at a time, and a copy first pays
//! the latency `λ` and moves nothing meanwhile (the simulator's stream
//! clock). If `n` copies host-to-device pay their latency within the
//! interval, `ℓ_a + ℓ_b = n λ` of the time `a + b` that direction copies
//! moves nothing, so `X <= d_in (a - ℓ_a) + o_in (b - ℓ_b)` and the sum
//! above gains `d_in ℓ_a + o_in ℓ_b >= min(d_in, o_in) n λ`:
//!
//! `L >= (X + n λ_in + κ_in Y) / r_in`, with `λ_in = min(d_in, o_in) λ`
//! bytes ([`Link::in_copy_bytes`]): each copy moves as if it were that many
//! bytes larger. (The other direction's latencies would add to `Y`'s side
//! too; they are left out, which only lowers the bound.)

use outcore_cost::CopyRates;

/// The link's rates for the bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// The fastest host-to-device rate, bytes/s (`r_in`).
    pub in_bytes_per_s: f64,
    /// The fastest device-to-host rate, bytes/s (`r_out`).
    pub out_bytes_per_s: f64,
    /// `κ_in`: host-to-device bytes' worth of link time each device-to-host
    /// byte in the same interval takes.
    pub out_cost_in: f64,
    /// `κ_out`: the same for host-to-device bytes on the other direction.
    pub in_cost_out: f64,
    /// `λ_in`: the bytes' worth of link time each host-to-device copy's
    /// latency takes (module doc).
    pub in_copy_bytes: f64,
    /// `λ_out`: the same for each device-to-host copy.
    pub out_copy_bytes: f64,
}

impl Link {
    /// The link that `rates` describe, each copy's latency as `λ` bytes
    /// more per copy ([`Link::without_latency`] leaves it out).
    pub fn of(rates: &CopyRates) -> Link {
        let [o_in, o_out] = rates.one_way_bytes_per_s;
        let [d_in, d_out] = rates.duplex_bytes_per_s;
        let r_in = o_in.max(d_in);
        let r_out = o_out.max(d_out);
        Link {
            in_bytes_per_s: r_in,
            out_bytes_per_s: r_out,
            out_cost_in: kappa(r_in, d_in, d_out, o_out),
            in_cost_out: kappa(r_out, d_out, d_in, o_in),
            in_copy_bytes: copy_bytes(rates.latency_s, o_in, d_in),
            out_copy_bytes: copy_bytes(rates.latency_s, o_out, d_out),
        }
    }

    /// Both rates times `factor` (the shares are unchanged; a latency's
    /// bytes scale with them, so its time does not). Any factor but 1 makes
    /// a program priced with it a heuristic, not a bound.
    pub fn scaled(self, factor: f64) -> Link {
        Link {
            in_bytes_per_s: self.in_bytes_per_s * factor,
            out_bytes_per_s: self.out_bytes_per_s * factor,
            in_copy_bytes: self.in_copy_bytes * factor,
            out_copy_bytes: self.out_copy_bytes * factor,
            ..self
        }
    }

    /// The same link with copies' latency left out (still a bound, a lower
    /// one).
    pub fn without_latency(self) -> Link {
        Link {
            in_copy_bytes: 0.0,
            out_copy_bytes: 0.0,
            ..self
        }
    }

    /// No interval moving `in_bytes` in and `out_bytes` out is shorter.
    pub fn min_time_s(&self, in_bytes: f64, out_bytes: f64) -> f64 {
        ((in_bytes + self.out_cost_in * out_bytes) / self.in_bytes_per_s)
            .max((out_bytes + self.in_cost_out * in_bytes) / self.out_bytes_per_s)
    }
}

/// `min(o, d) λ`: the bytes a direction could have moved during one copy's
/// latency at its slower rate; zero where a value is not a positive finite
/// number (nothing is claimed then).
fn copy_bytes(latency_s: f64, one_way: f64, duplex: f64) -> f64 {
    let bytes = latency_s * one_way.min(duplex);
    if bytes.is_finite() && bytes > 0.0 {
        bytes
    } else {
        0.0
    }
}

/// `min((r - d) / d_other, r / o_other)`, zero where a rate is not positive
/// (no share is then claimed).
fn kappa(r: f64, d: f64, d_other: f64, o_other: f64) -> f64 {
    if !(d_other > 0.0 && o_other > 0.0 && r.is_finite()) {
        return 0.0;
    }
    ((r - d) / d_other).min(r / o_other).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outcore_cost::DeviceProfile;

    /// `v100-16gb-pcie3`: 12 GB/s one way, 20 GB/s both ways (10 each).
    /// `κ = (12 - 10) / 10 = 0.2` either way.
    #[test]
    fn a_pcie3_link_charges_a_fifth_of_the_other_direction() {
        let p = DeviceProfile::builtin("v100-16gb-pcie3").expect("builtin");
        let link = Link::of(&CopyRates::of_device(&p));
        assert_eq!(link.in_bytes_per_s, 12e9);
        assert_eq!(link.out_bytes_per_s, 12e9);
        assert!((link.out_cost_in - 0.2).abs() < 1e-12, "{link:?}");
        assert!((link.in_cost_out - 0.2).abs() < 1e-12, "{link:?}");
        // 1.2 GB in and 0.6 GB out: 0.1 s + 0.2 * 0.05 s.
        assert!((link.min_time_s(1.2e9, 0.6e9) - 0.11).abs() < 1e-12);
    }

    /// The simulator's own schedule of the copies meets the bound: both
    /// directions at 10 GB/s until the 0.6 GB out are done (0.06 s, 0.6 GB
    /// in), then 0.6 GB in alone at 12 GB/s (0.05 s): 0.11 s.
    #[test]
    fn the_bound_is_the_time_of_overlapping_the_copies() {
        let rates = CopyRates {
            latency_s: 0.0,
            one_way_bytes_per_s: [12e9, 12e9],
            duplex_bytes_per_s: [10e9, 10e9],
        };
        let overlapped_s = 0.6e9 / 10e9 + (1.2e9 - 0.6e9) / 12e9;
        let bound_s = Link::of(&rates).min_time_s(1.2e9, 0.6e9);
        assert!(
            (overlapped_s - bound_s).abs() < 1e-12,
            "{overlapped_s} vs {bound_s}"
        );
        // One after the other is slower.
        assert!(1.8e9 / 12e9 > bound_s);
    }

    /// Where the duplex rate is each direction's one-way rate, the
    /// directions do not share: `κ = 0`.
    #[test]
    fn independent_directions_share_nothing() {
        let rates = CopyRates {
            latency_s: 0.0,
            one_way_bytes_per_s: [4.0, 2.0],
            duplex_bytes_per_s: [4.0, 2.0],
        };
        let link = Link::of(&rates);
        assert_eq!((link.out_cost_in, link.in_cost_out), (0.0, 0.0));
        assert_eq!(link.min_time_s(8.0, 2.0), 2.0);
        // A scaled link keeps its shares.
        let fast = Link::of(&CopyRates {
            duplex_bytes_per_s: [2.0, 1.0],
            ..rates
        })
        .scaled(10.0);
        assert_eq!(fast.in_bytes_per_s, 40.0);
        assert!(fast.out_cost_in > 0.0);
    }
}
