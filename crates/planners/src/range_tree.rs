//! Two small range structures the sweeps use to stay near-linear on graphs of
//! tens of thousands of ops: a segment tree with range add, range maximum
//! (the most bytes any op in a range would hold) and the last index of a
//! range above a threshold, and a Fenwick tree of point
//! values with prefix sums (bytes still counted in a queue prefix).

/// Range add, range maximum over `i128` values, `O(log n)` per call.
#[derive(Debug, Clone)]
pub(crate) struct RangeMax {
    n: usize,
    /// `max[node]`: the maximum of the node's range, its own pending add included.
    max: Vec<i128>,
    /// `add[node]`: an add applied to the whole range, not yet pushed to children.
    add: Vec<i128>,
}

impl RangeMax {
    pub(crate) fn new(values: &[i128]) -> Self {
        let n = values.len().max(1);
        let mut t = RangeMax {
            n,
            max: vec![i128::MIN; 4 * n],
            add: vec![0; 4 * n],
        };
        if !values.is_empty() {
            t.build(1, 0, n, values);
        }
        t
    }

    fn build(&mut self, node: usize, lo: usize, hi: usize, values: &[i128]) {
        if hi - lo == 1 {
            self.max[node] = values[lo];
            return;
        }
        let mid = (lo + hi) / 2;
        self.build(2 * node, lo, mid, values);
        self.build(2 * node + 1, mid, hi, values);
        self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]);
    }

    /// Adds `delta` to every value in `lo..hi`.
    pub(crate) fn add(&mut self, lo: usize, hi: usize, delta: i128) {
        let hi = hi.min(self.n);
        if lo < hi {
            self.add_in(1, 0, self.n, lo, hi, delta);
        }
    }

    fn add_in(&mut self, node: usize, nlo: usize, nhi: usize, lo: usize, hi: usize, d: i128) {
        if hi <= nlo || nhi <= lo {
            return;
        }
        if lo <= nlo && nhi <= hi {
            self.max[node] += d;
            self.add[node] += d;
            return;
        }
        let mid = (nlo + nhi) / 2;
        self.add_in(2 * node, nlo, mid, lo, hi, d);
        self.add_in(2 * node + 1, mid, nhi, lo, hi, d);
        self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]) + self.add[node];
    }

    /// The maximum of `lo..hi`, `None` for an empty range.
    pub(crate) fn max(&self, lo: usize, hi: usize) -> Option<i128> {
        let hi = hi.min(self.n);
        (lo < hi).then(|| self.max_in(1, 0, self.n, lo, hi))
    }

    fn max_in(&self, node: usize, nlo: usize, nhi: usize, lo: usize, hi: usize) -> i128 {
        if hi <= nlo || nhi <= lo {
            return i128::MIN;
        }
        if lo <= nlo && nhi <= hi {
            return self.max[node];
        }
        let mid = (nlo + nhi) / 2;
        let m = self.max_in(2 * node, nlo, mid, lo, hi).max(self.max_in(
            2 * node + 1,
            mid,
            nhi,
            lo,
            hi,
        ));
        m + self.add[node]
    }

    /// The last index in `lo..hi` whose value is above `threshold`, `None`
    /// where there is none, in `O(log n)`: it descends right child first
    /// and leaves every subtree whose maximum is at most `threshold`, so
    /// the first subtree of the range it enters that holds one is the one
    /// it returns from.
    pub(crate) fn last_above(&self, lo: usize, hi: usize, threshold: i128) -> Option<usize> {
        let hi = hi.min(self.n);
        if lo >= hi {
            return None;
        }
        self.last_above_in(1, 0, self.n, lo, hi, threshold, 0)
    }

    /// `last_above` within node `node` (range `nlo..nhi`), `above` the sum
    /// of its ancestors' pending adds.
    #[allow(clippy::too_many_arguments)]
    fn last_above_in(
        &self,
        node: usize,
        nlo: usize,
        nhi: usize,
        lo: usize,
        hi: usize,
        threshold: i128,
        above: i128,
    ) -> Option<usize> {
        if hi <= nlo || nhi <= lo || self.max[node] + above <= threshold {
            return None;
        }
        if nhi - nlo == 1 {
            return Some(nlo);
        }
        let mid = (nlo + nhi) / 2;
        let above = above + self.add[node];
        self.last_above_in(2 * node + 1, mid, nhi, lo, hi, threshold, above)
            .or_else(|| self.last_above_in(2 * node, nlo, mid, lo, hi, threshold, above))
    }
}

/// Point add, prefix sum over `i128` values, `O(log n)` per call.
#[derive(Debug, Clone)]
pub(crate) struct PrefixSums {
    tree: Vec<i128>,
}

impl PrefixSums {
    pub(crate) fn new(n: usize) -> Self {
        PrefixSums {
            tree: vec![0; n + 1],
        }
    }

    pub(crate) fn add(&mut self, i: usize, delta: i128) {
        let mut k = i + 1;
        while k < self.tree.len() {
            self.tree[k] += delta;
            k += k & k.wrapping_neg();
        }
    }

    /// The sum of values `0..i`.
    pub(crate) fn prefix(&self, i: usize) -> i128 {
        let mut k = i.min(self.tree.len() - 1);
        let mut sum = 0;
        while k > 0 {
            sum += self.tree[k];
            k -= k & k.wrapping_neg();
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random operations against a plain vector.
    #[test]
    fn both_trees_agree_with_a_plain_vector() {
        let mut state: u64 = 12345;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        for n in [1usize, 2, 5, 17, 64] {
            let mut plain: Vec<i128> = (0..n).map(|_| next(100) as i128 - 50).collect();
            let mut tree = RangeMax::new(&plain);
            let mut sums = PrefixSums::new(n);
            let mut points = vec![0i128; n];
            for _ in 0..300 {
                let (a, b) = (next(n as u64 + 1) as usize, next(n as u64 + 1) as usize);
                let (lo, hi) = (a.min(b), a.max(b));
                let d = next(21) as i128 - 10;
                match next(3) {
                    0 => {
                        tree.add(lo, hi, d);
                        for v in &mut plain[lo..hi] {
                            *v += d;
                        }
                    }
                    1 => {
                        assert_eq!(tree.max(lo, hi), plain[lo..hi].iter().copied().max());
                        let threshold = next(41) as i128 - 20;
                        let last = (lo..hi).rev().find(|&i| plain[i] > threshold);
                        assert_eq!(tree.last_above(lo, hi, threshold), last);
                    }
                    _ => {
                        let i = lo.min(n - 1);
                        sums.add(i, d);
                        points[i] += d;
                        assert_eq!(sums.prefix(hi), points[..hi].iter().sum::<i128>());
                    }
                }
            }
        }
    }
}
