//! Earliest deadline first on one copy stream, without preemption: the
//! sequence both of the swap planner's stream orders ([`super::h2d_order`],
//! [`super::d2h_order`]) realise.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The order in which one stream should copy items `0..release_s.len()`:
/// whenever the stream is free, the released item with the smallest
/// `key(i)` goes next (equal keys by index); when none
/// is released, the stream waits for the next release. Item `i` is released
/// at `release_s[i]` and copies for `dur_s[i]` (negative counts as 0).
pub(crate) fn sequence<K: Ord>(
    release_s: &[f64],
    dur_s: &[f64],
    key: impl Fn(usize) -> K,
) -> Vec<usize> {
    let mut by_release: Vec<(f64, usize)> = release_s
        .iter()
        .copied()
        .enumerate()
        .map(|(i, r)| (r, i))
        .collect();
    by_release.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut ready: BinaryHeap<Reverse<(K, usize)>> = BinaryHeap::new();
    let mut sequence = Vec::with_capacity(release_s.len());
    let mut stream_s = 0.0f64;
    let mut next = 0;
    while sequence.len() < release_s.len() {
        if ready.is_empty() {
            stream_s = stream_s.max(by_release[next].0);
        }
        while let Some(&(at, i)) = by_release.get(next)
            && at <= stream_s
        {
            ready.push(Reverse((key(i), i)));
            next += 1;
        }
        let Some(Reverse((_, i))) = ready.pop() else {
            break; // unreachable: the stream waited for a release above
        };
        stream_s += dur_s[i].max(0.0);
        sequence.push(i);
    }
    sequence
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Released at 0, 0 and 5; keys 3, 1, 0; all 2 long. At 0 items 0 and 1
    /// are released: 1 (key 1) runs 0..2, then 0 (key 3) 2..4; the stream
    /// idles to 5 for item 2, whose smaller key came too late to matter.
    #[test]
    fn the_released_item_with_the_smallest_key_goes_next() {
        let release = [0.0, 0.0, 5.0];
        let keys = [3, 1, 0];
        assert_eq!(sequence(&release, &[2.0; 3], |i| keys[i]), vec![1, 0, 2]);
        // Released at 1 instead, item 2 waits for item 0 no longer: 1 runs
        // 0..2, and at 2 both 0 and 2 are ready, 2 first.
        let release = [0.0, 0.0, 1.0];
        assert_eq!(sequence(&release, &[2.0; 3], |i| keys[i]), vec![1, 2, 0]);
        assert!(sequence(&[], &[], |i| i).is_empty());
    }
}
