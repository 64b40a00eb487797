//! Elementwise kernels (activations, arithmetic, dropout), the row softmax,
//! and the kernels that only move elements (views, copies, concatenation),
//! with their gradients.

use super::{Args, Buf, Outputs, Wanted, numel};
use outcore_graph::DType;

/// `f` applied to each element of input 0.
pub(super) fn map(a: &Args<'_>, f: impl Fn(f32) -> f32) -> Outputs {
    Ok(vec![Buf::F32(a.f32s(0).iter().map(|&x| f(x)).collect())])
}

/// An elementwise op's gradient: `f(g, s)` for each output gradient `g`
/// (input 0) and the saved tensor `s` (input 1, the op's input or output).
pub(super) fn map_grad(a: &Args<'_>, want: &Wanted<'_>, f: impl Fn(f32, f32) -> f32) -> Outputs {
    want.select(vec![Some(
        a.f32s(0)
            .iter()
            .zip(a.f32s(1))
            .map(|(&g, s)| f(g, s))
            .collect(),
    )])
}

/// SiLU and its derivative: `x s` and `s (1 + x (1 - s))`, `s = sigmoid(x)`.
pub(super) fn silu(x: f32) -> (f32, f32) {
    let s = 1.0 / (1.0 + (-x).exp());
    (x * s, s * (1.0 + x * (1.0 - s)))
}

/// GELU and its derivative: the exact form `x Φ(x)`, `Φ(x) + x φ(x)` (`Φ`
/// the standard normal's distribution function, `φ` its density), which is
/// what [`OpKind::Gelu`](outcore_graph::OpKind::Gelu) means and what
/// PyTorch's `nn.GELU()` computes by default (BERT's and ViT's GELU). The
/// tanh approximation is not this kind: the builder spells it out op by op
/// (`gelu_tanh_eager`, GPT-2's `gelu_new`). Computed in f64 and rounded once,
/// so it lies within f32 rounding of PyTorch's f32 result
/// (`tests/torch_reference.rs`).
pub(super) fn gelu(x: f32) -> (f32, f32) {
    let x = f64::from(x);
    let cdf = 0.5 * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    ((x * cdf) as f32, (cdf + x * pdf) as f32)
}

/// The error function to about 1e-14: its Taylor series below 2.5, and
/// above it `1 - erfc` with `erfc` from its continued fraction (60 terms,
/// evaluated from the tail). Rust's standard library has no `erf`, and one
/// function does not justify a maths crate.
pub(super) fn erf(x: f64) -> f64 {
    let z = x.abs();
    let value = if z < 2.5 {
        // 2/sqrt(pi) sum (-1)^n z^(2n+1) / (n! (2n+1)); the largest term at
        // z = 2.5 is about 16, so about 1e-14 is left after cancellation.
        let (mut power, mut sum) = (z, z);
        for n in 1..200 {
            power *= -z * z / f64::from(n);
            let term = power / f64::from(2 * n + 1);
            sum += term;
            if term.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(z) = exp(-z^2) / sqrt(pi) / (z + (1/2) / (z + 1 / (z + (3/2) / ...))).
        let mut tail = z;
        for k in (1..=60).rev() {
            tail = z + f64::from(k) / 2.0 / tail;
        }
        1.0 - (-z * z).exp() * std::f64::consts::FRAC_2_SQRT_PI / 2.0 / tail
    };
    value.copysign(x)
}

/// The sum of every input, added in input order.
pub(super) fn sum(a: &Args<'_>) -> Outputs {
    let mut y = a.f32s(0);
    for k in 1..a.call.inputs.len() {
        for (acc, v) in y.iter_mut().zip(a.f32s(k)) {
            *acc += v;
        }
    }
    Ok(vec![Buf::F32(y)])
}

/// How `small` broadcasts over `big` in [`outcore_graph::OpKind::Mul`]: the
/// number of consecutive elements of `big` that one element of `small`
/// multiplies (its shape is `big`'s with trailing dimensions of 1), or an
/// error naming both lengths.
fn broadcast_block(big: usize, small: usize) -> Result<usize, String> {
    if small == 0 || !big.is_multiple_of(small) {
        return Err(format!(
            "mul of {big} and {small} elements: one factor must have the other's shape, or that shape with trailing dimensions of 1"
        ));
    }
    Ok(big / small)
}

/// `a * b`, the smaller factor broadcast over the larger's trailing dimensions.
pub(super) fn mul(a: &Args<'_>) -> Outputs {
    let (x, y) = (a.f32s(0), a.f32s(1));
    let (big, small) = if x.len() >= y.len() {
        (&x, &y)
    } else {
        (&y, &x)
    };
    let block = broadcast_block(big.len(), small.len())?;
    Ok(vec![Buf::F32(
        big.iter()
            .enumerate()
            .map(|(i, v)| v * small[i / block])
            .collect(),
    )])
}

/// The gradients of `a * b` (as [`mul`] broadcasts): inputs `g, a, b`; the
/// larger factor's is `g` times the other, broadcast; the smaller's sums `g`
/// times the larger over each block it multiplied.
pub(super) fn mul_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, x, y) = (a.f32s(0), a.f32s(1), a.f32s(2));
    let x_big = x.len() >= y.len();
    let (big, small) = if x_big { (&x, &y) } else { (&y, &x) };
    let block = broadcast_block(big.len(), small.len())?;
    let d_big: Vec<f32> = g
        .iter()
        .enumerate()
        .map(|(i, g)| g * small[i / block])
        .collect();
    let mut d_small = vec![0f32; small.len()];
    for (i, (g, v)) in g.iter().zip(big.iter()).enumerate() {
        d_small[i / block] += g * v;
    }
    let (dx, dy) = if x_big {
        (d_big, d_small)
    } else {
        (d_small, d_big)
    };
    want.select(vec![Some(dx), Some(dy)])
}

/// Every output filled with `value` (f32 outputs) or zeros (the others).
pub(super) fn fill(a: &Args<'_>, value: f32) -> Outputs {
    Ok(a.call
        .outputs
        .iter()
        .map(|o| match o.dtype {
            DType::Float32 => Buf::F32(vec![value; numel(o)]),
            _ => Buf::U8(vec![0; o.size_bytes as usize]),
        })
        .collect())
}

/// `x`'s first `len` bytes, zero-padded to `len`.
fn resize(x: &[u8], len: usize) -> Vec<u8> {
    let mut v = x[..len.min(x.len())].to_vec();
    v.resize(len, 0);
    v
}

/// A view or copy: the same elements in row-major order (a reshape) in
/// each output; views are not written. Also the gradient of a view, copy or
/// concatenation (views of the gradient, or a reshaping copy).
pub(super) fn reshape(a: &Args<'_>) -> Outputs {
    let x = a.bytes(0);
    Ok(a.call
        .outputs
        .iter()
        .map(|o| Buf::U8(resize(&x, o.size_bytes as usize)))
        .collect())
}

/// The inputs joined along `axis` (row-major: for each index of the outer
/// dimensions, each input's inner block in turn).
pub(super) fn concat(a: &Args<'_>, axis: usize) -> Outputs {
    let Some(out) = a.call.outputs.first() else {
        return Err("concat has no output".into());
    };
    if axis > out.shape.len() || a.call.inputs.iter().any(|o| axis > o.shape.len()) {
        return Err(format!(
            "concat along axis {axis} of operands with fewer dimensions"
        ));
    }
    let outer: usize = out.shape[..axis].iter().product::<u64>() as usize;
    let mut y = Vec::with_capacity(numel(out));
    let parts: Vec<(Vec<f32>, usize)> = a
        .call
        .inputs
        .iter()
        .enumerate()
        .map(|(k, o)| {
            let inner: usize = o.shape[axis..].iter().product::<u64>() as usize;
            (a.f32s(k), inner)
        })
        .collect();
    for r in 0..outer {
        for (p, inner) in &parts {
            y.extend_from_slice(&p[r * inner..(r + 1) * inner]);
        }
    }
    Ok(vec![Buf::F32(y)])
}

/// Softmax over each row of `d` elements (the innermost dimension).
pub(super) fn softmax_rows(x: &[f32], d: usize) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (xr, yr) in x.chunks(d.max(1)).zip(y.chunks_mut(d.max(1))) {
        let mx = xr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut s = 0f32;
        for (a, &b) in yr.iter_mut().zip(xr) {
            *a = (b - mx).exp();
            s += *a;
        }
        for a in yr.iter_mut() {
            *a /= s;
        }
    }
    y
}

/// Softmax over the innermost dimension.
pub(super) fn softmax(a: &Args<'_>) -> Outputs {
    Ok(vec![Buf::F32(softmax_rows(&a.f32s(0), a.in_last_dim(0)))])
}

/// The gradient of [`softmax`]: inputs `g, y` (the saved output);
/// `dx = y (g - sum(g y))` per row.
pub(super) fn softmax_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, y) = (a.f32s(0), a.f32s(1));
    let d = a.in_last_dim(1);
    let mut dx = vec![0f32; y.len()];
    for r in 0..y.len() / d.max(1) {
        let s: f32 = (0..d).map(|k| g[r * d + k] * y[r * d + k]).sum();
        for k in 0..d {
            dx[r * d + k] = y[r * d + k] * (g[r * d + k] - s);
        }
    }
    want.select(vec![Some(dx)])
}

/// Dropout keep decision for element `i`: a counter-based hash of the seed and the
/// index, so recomputation reproduces the mask.
fn dropout_keep(seed: u64, i: usize, p: f32) -> bool {
    use super::synthetic::splitmix;
    let u = (splitmix(seed ^ splitmix(i as u64)) >> 40) as f32 / (1u64 << 24) as f32;
    u >= p
}

/// The factor kept elements are scaled by, `1 / (1 - p)` (0 when all drop).
fn dropout_scale(p: f32) -> f32 {
    if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 }
}

/// Inverted dropout: outputs the scaled kept elements and the keep mask
/// (one byte per element).
pub(super) fn dropout(a: &Args<'_>, p: f32, seed: u64) -> Outputs {
    let x = a.f32s(0);
    let scale = dropout_scale(p);
    let mask: Vec<u8> = (0..x.len())
        .map(|k| dropout_keep(seed, k, p) as u8)
        .collect();
    let y = x
        .iter()
        .zip(&mask)
        .map(|(v, &m)| if m == 1 { v * scale } else { 0.0 })
        .collect();
    Ok(vec![Buf::F32(y), Buf::U8(mask)])
}

/// The gradient of [`dropout`]: inputs `g, mask`.
pub(super) fn dropout_backward(a: &Args<'_>, p: f32, want: &Wanted<'_>) -> Outputs {
    let (g, mask) = (a.f32s(0), a.bytes(1));
    let scale = dropout_scale(p);
    want.select(vec![Some(
        g.iter()
            .zip(&mask)
            .map(|(g, &m)| if m != 0 { g * scale } else { 0.0 })
            .collect(),
    )])
}

#[cfg(test)]
mod tests {
    use super::{erf, gelu};

    /// Values from tables of the error function (Abramowitz and Stegun
    /// 7.1; the digits as Python's `math.erf` prints them), on both sides
    /// of the switch at 2.5 and in the tail where `erfc` carries the digits.
    #[test]
    fn erf_matches_tabulated_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-1.0, -0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.499, 0.999_590_864_244_255_4),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
            (4.0, 0.999_999_984_582_742_1),
            (6.0, 1.0),
        ] {
            assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {}", erf(x));
        }
    }

    /// `x Φ(x)`: 0 at 0, `x` far right, 0 far left; `Φ(1) = 0.841344746`.
    #[test]
    fn gelu_is_the_exact_form() {
        assert_eq!(gelu(0.0), (0.0, 0.5));
        assert!((f64::from(gelu(1.0).0) - 0.841_344_746).abs() < 1e-7);
        assert_eq!(gelu(10.0).0, 10.0);
        assert!(gelu(-10.0).0.abs() < 1e-20);
    }
}
