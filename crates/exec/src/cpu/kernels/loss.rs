//! Softmax cross-entropy (mean over rows) and its gradient.

use super::{Args, Buf, Outputs, Wanted};

/// Inputs `logits (rows x c), labels`; outputs the mean loss and the
/// log-probabilities (saved for the backward pass). A label outside `0..c`
/// is an error naming it.
pub(super) fn softmax_cross_entropy(a: &Args<'_>) -> Outputs {
    let x = a.f32s(0);
    let labels = a.i64s(1);
    let c = a.in_last_dim(0);
    let rows = x.len() / c.max(1);
    let mut logp = vec![0f32; x.len()];
    let mut loss = 0f32;
    for r in 0..rows {
        let xr = &x[r * c..(r + 1) * c];
        let mx = xr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let lse = mx + xr.iter().map(|v| (v - mx).exp()).sum::<f32>().ln();
        for k in 0..c {
            logp[r * c + k] = xr[k] - lse;
        }
        let l = labels.get(r).copied().unwrap_or(0);
        match usize::try_from(l).ok().filter(|&l| l < c) {
            Some(l) => loss -= logp[r * c + l],
            None => return Err(format!("label {l} out of range 0..{c}")),
        }
    }
    Ok(vec![
        Buf::F32(vec![loss / rows.max(1) as f32]),
        Buf::F32(logp),
    ])
}

/// The logits' gradient: inputs `g (the loss's), logp, labels`;
/// `(softmax - onehot) g / rows`.
pub(super) fn softmax_cross_entropy_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, logp, labels) = (a.f32s(0), a.f32s(1), a.i64s(2));
    let c = a.in_last_dim(1);
    let rows = logp.len() / c.max(1);
    let scale = g.first().copied().unwrap_or(1.0) / rows.max(1) as f32;
    let mut dx: Vec<f32> = logp.iter().map(|l| l.exp() * scale).collect();
    for r in 0..rows {
        let l = labels.get(r).copied().unwrap_or(0).clamp(0, c as i64 - 1) as usize;
        dx[r * c + l] -= scale;
    }
    want.select(vec![Some(dx)])
}
