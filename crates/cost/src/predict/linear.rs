//! The baseline predictor: per op kind, least squares of `ln(time_s)` on
//! `ln(1 + FLOPs)` and `ln(1 + bytes moved)` (a power law in each, the shape
//! of a roofline on either side of its ridge).
//!
//! A kind with fewer than [`MIN_ROWS_PER_FIT`] training rows uses its class's
//! fit, and a class with too few the fit over all rows, so an op of a kind
//! never seen still gets a time. A small ridge penalty (not on the intercept)
//! keeps the 3x3 normal equations solvable when a column is constant (every
//! op of a kind with zero FLOPs).

use super::{LatencyPredictor, OpFeatures, PredictError, Sample};
use outcore_graph::OpClass;
use std::collections::BTreeMap;

/// Rows a kind (or class) needs for a fit of its own.
pub const MIN_ROWS_PER_FIT: usize = 4;

/// Ridge penalty on the two slopes (features are O(10), so this is tiny).
const RIDGE: f64 = 1e-6;

/// `ln(time_s) = c[0] + c[1] ln(1 + flops) + c[2] ln(1 + bytes moved)`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fit([f64; 3]);

impl Fit {
    fn eval(&self, f: &OpFeatures) -> f64 {
        self.0[0] + self.0[1] * f.ln_flops + self.0[2] * f.ln_bytes_moved
    }
}

/// Least squares over `rows` (features, ln time); `None` if the system is singular.
fn least_squares<'a>(rows: impl Iterator<Item = (&'a OpFeatures, f64)>) -> Option<Fit> {
    let mut a = [[0.0f64; 3]; 3];
    let mut b = [0.0f64; 3];
    for (f, y) in rows {
        let x = [1.0, f.ln_flops, f.ln_bytes_moved];
        for i in 0..3 {
            for j in 0..3 {
                a[i][j] += x[i] * x[j];
            }
            b[i] += x[i] * y;
        }
    }
    a[1][1] += RIDGE * (1.0 + a[0][0]);
    a[2][2] += RIDGE * (1.0 + a[0][0]);
    solve3(a, b).map(Fit)
}

/// Gaussian elimination with partial pivoting.
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..3 {
            let k = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (dst, src) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *dst -= k * src;
            }
            b[row] -= k * b[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let rest: f64 = (row + 1..3).map(|c| a[row][c] * x[c]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Per-kind log-log least squares with class and global fallbacks.
#[derive(Debug, Clone, PartialEq)]
pub struct PerKindLeastSquares {
    by_kind: BTreeMap<String, Fit>,
    by_class: BTreeMap<OpClass, Fit>,
    global: Fit,
}

impl PerKindLeastSquares {
    /// Fits every kind and class with enough rows, and all rows together.
    pub fn fit(samples: &[Sample]) -> Result<PerKindLeastSquares, PredictError> {
        let rows = || samples.iter().map(|s| (&s.features, s.ln_time_s()));
        let global = least_squares(rows()).ok_or_else(|| PredictError::EmptyTrainingSet {
            detail: format!(
                "{} rows give a singular least-squares system (need at least 3 distinct ops)",
                samples.len()
            ),
        })?;
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        let mut classes: BTreeMap<OpClass, usize> = BTreeMap::new();
        for s in samples {
            *kinds.entry(&s.features.kind).or_default() += 1;
            *classes.entry(s.features.class).or_default() += 1;
        }
        let by_kind = kinds
            .into_iter()
            .filter(|&(_, n)| n >= MIN_ROWS_PER_FIT)
            .filter_map(|(k, _)| {
                least_squares(rows().filter(|(f, _)| f.kind == k)).map(|fit| (k.to_string(), fit))
            })
            .collect();
        let by_class = classes
            .into_iter()
            .filter(|&(_, n)| n >= MIN_ROWS_PER_FIT)
            .filter_map(|(c, _)| {
                least_squares(rows().filter(|(f, _)| f.class == c)).map(|fit| (c, fit))
            })
            .collect();
        Ok(PerKindLeastSquares {
            by_kind,
            by_class,
            global,
        })
    }
}

impl LatencyPredictor for PerKindLeastSquares {
    fn predict_ln_time_s(&self, f: &OpFeatures) -> f64 {
        let fit = self
            .by_kind
            .get(&f.kind)
            .or_else(|| self.by_class.get(&f.class))
            .unwrap_or(&self.global);
        fit.eval(f)
    }

    fn name(&self) -> String {
        "per-kind-least-squares".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solve3_solves_a_known_system() {
        // x = (1, 2, 3).
        let a = [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]];
        let b = [4.0, 10.0, 14.0];
        let x = solve3(a, b).unwrap();
        for (got, want) in x.iter().zip([1.0, 2.0, 3.0]) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
        assert_eq!(solve3([[0.0; 3]; 3], b), None);
    }
}
