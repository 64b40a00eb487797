//! Normalization kernels: batch norm (training mode) and its running
//! statistics update, layer norm, and their gradients.

use super::{Args, Buf, Outputs, Wanted};

/// `(n, c, inner)` of an `[n, c, rest...]` tensor: the batch, the channels
/// and the elements per channel and sample.
fn bn_geometry(xs: &[usize]) -> (usize, usize, usize) {
    let n = xs.first().copied().unwrap_or(1);
    let c = xs.get(1).copied().unwrap_or(1);
    let inner: usize = xs.iter().skip(2).product();
    (n, c, inner)
}

/// Batch norm over the batch and spatial positions of each channel: inputs
/// `x, gamma, beta`; outputs `y`, the batch mean and the inverse standard
/// deviation (biased variance), saved for the backward pass.
pub(super) fn batchnorm(a: &Args<'_>, eps: f32) -> Outputs {
    let (x, gamma, beta) = (a.f32s(0), a.f32s(1), a.f32s(2));
    let (n, c, inner) = bn_geometry(&a.in_shape(0));
    let m = (n * inner) as f32;
    let mut mean = vec![0f32; c];
    let mut invstd = vec![0f32; c];
    for ch in 0..c {
        let mut s = 0f32;
        for b in 0..n {
            for k in 0..inner {
                s += x[(b * c + ch) * inner + k];
            }
        }
        let mu = s / m;
        let mut v = 0f32;
        for b in 0..n {
            for k in 0..inner {
                let d = x[(b * c + ch) * inner + k] - mu;
                v += d * d;
            }
        }
        mean[ch] = mu;
        invstd[ch] = 1.0 / (v / m + eps).sqrt();
    }
    let mut y = vec![0f32; x.len()];
    for (k, v) in y.iter_mut().enumerate() {
        let ch = (k / inner.max(1)) % c;
        *v = (x[k] - mean[ch]) * invstd[ch] * gamma[ch] + beta[ch];
    }
    Ok(vec![Buf::F32(y), Buf::F32(mean), Buf::F32(invstd)])
}

/// The running statistics' update: inputs `running_mean, running_var,
/// mean, invstd`; the running variance takes the unbiased batch variance
/// (over `count` elements per channel), as PyTorch does.
pub(super) fn batchnorm_stats(a: &Args<'_>, momentum: f32, count: u64) -> Outputs {
    let (rm, rv, mean, invstd) = (a.f32s(0), a.f32s(1), a.f32s(2), a.f32s(3));
    let m = momentum;
    let n = count as f32;
    let nrm = rm
        .iter()
        .zip(&mean)
        .map(|(r, x)| (1.0 - m) * r + m * x)
        .collect();
    let nrv = rv
        .iter()
        .zip(&invstd)
        .map(|(r, s)| {
            let var = 1.0 / (s * s);
            let unbiased = if n > 1.0 { var * n / (n - 1.0) } else { var };
            (1.0 - m) * r + m * unbiased
        })
        .collect();
    Ok(vec![Buf::F32(nrm), Buf::F32(nrv)])
}

/// The gradients of [`batchnorm`]: inputs `g, x, gamma, mean, invstd`.
pub(super) fn batchnorm_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, x, gamma, mean, invstd) = (a.f32s(0), a.f32s(1), a.f32s(2), a.f32s(3), a.f32s(4));
    let (n, c, inner) = bn_geometry(&a.in_shape(1));
    let m = (n * inner) as f32;
    let mut dgamma = vec![0f32; c];
    let mut dbeta = vec![0f32; c];
    for b in 0..n {
        for ch in 0..c {
            for k in 0..inner {
                let at = (b * c + ch) * inner + k;
                let xhat = (x[at] - mean[ch]) * invstd[ch];
                dbeta[ch] += g[at];
                dgamma[ch] += g[at] * xhat;
            }
        }
    }
    let mut dx = vec![0f32; x.len()];
    for (at, v) in dx.iter_mut().enumerate() {
        let ch = (at / inner.max(1)) % c;
        let xhat = (x[at] - mean[ch]) * invstd[ch];
        *v = gamma[ch] * invstd[ch] / m * (m * g[at] - dbeta[ch] - xhat * dgamma[ch]);
    }
    want.select(vec![Some(dx), Some(dgamma), Some(dbeta)])
}

/// Layer norm over the innermost dimension: inputs `x, gamma, beta`;
/// outputs `y`, each row's mean and inverse standard deviation.
pub(super) fn layernorm(a: &Args<'_>, eps: f32) -> Outputs {
    let (x, g, b) = (a.f32s(0), a.f32s(1), a.f32s(2));
    let d = a.in_last_dim(0);
    let rows = x.len() / d.max(1);
    let mut y = vec![0f32; x.len()];
    let mut mean = vec![0f32; rows];
    let mut rstd = vec![0f32; rows];
    for r in 0..rows {
        let xr = &x[r * d..(r + 1) * d];
        let mu = xr.iter().sum::<f32>() / d as f32;
        let var = xr.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / d as f32;
        let rs = 1.0 / (var + eps).sqrt();
        for k in 0..d {
            y[r * d + k] = (xr[k] - mu) * rs * g[k] + b[k];
        }
        mean[r] = mu;
        rstd[r] = rs;
    }
    Ok(vec![Buf::F32(y), Buf::F32(mean), Buf::F32(rstd)])
}

/// The gradients of [`layernorm`]: inputs `g, x, gamma, beta, mean, rstd`.
pub(super) fn layernorm_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, x, gamma, mean, rstd) = (a.f32s(0), a.f32s(1), a.f32s(2), a.f32s(4), a.f32s(5));
    let d = a.in_last_dim(1);
    let rows = x.len() / d.max(1);
    let mut dx = vec![0f32; x.len()];
    let mut dgamma = vec![0f32; d];
    let mut dbeta = vec![0f32; d];
    for r in 0..rows {
        let mut s1 = 0f32;
        let mut s2 = 0f32;
        for k in 0..d {
            let xhat = (x[r * d + k] - mean[r]) * rstd[r];
            let dxh = g[r * d + k] * gamma[k];
            dgamma[k] += g[r * d + k] * xhat;
            dbeta[k] += g[r * d + k];
            s1 += dxh;
            s2 += dxh * xhat;
        }
        for k in 0..d {
            let xhat = (x[r * d + k] - mean[r]) * rstd[r];
            let dxh = g[r * d + k] * gamma[k];
            dx[r * d + k] = rstd[r] * (dxh - s1 / d as f32 - xhat * s2 / d as f32);
        }
    }
    want.select(vec![Some(dx), Some(dgamma), Some(dbeta)])
}
