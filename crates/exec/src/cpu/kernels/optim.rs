//! Optimizer updates: SGD (momentum, L2 weight decay) and Adam / AdamW,
//! each returning the updated parameter and state in the op's output order.

use super::{Args, Buf, Outputs};

/// Inputs `p, g (, momentum buffer)`; outputs `p (, buffer)`. PyTorch's
/// SGD: `d = g + wd p`, `buf = momentum buf + d`, `p -= lr buf`.
pub(super) fn sgd(a: &Args<'_>, lr: f32, momentum: f32, weight_decay: f32) -> Outputs {
    let (mut p, g) = (a.f32s(0), a.f32s(1));
    let mut buf = if momentum > 0.0 {
        Some(a.f32s(2))
    } else {
        None
    };
    for k in 0..p.len() {
        let d = g[k] + weight_decay * p[k];
        let step = match buf.as_mut() {
            Some(b) => {
                b[k] = momentum * b[k] + d;
                b[k]
            }
            None => d,
        };
        p[k] -= lr * step;
    }
    let mut out = vec![Buf::F32(p)];
    out.extend(buf.map(Buf::F32));
    Ok(out)
}

/// Adam's hyper-parameters as the op carries them.
pub(super) struct Adam {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// AdamW: the decay applied to the parameter, not added to the gradient.
    pub decoupled: bool,
}

/// Inputs `p, g, m, v`; outputs `p, m, v`, bias-corrected at the call's
/// 1-based step.
pub(super) fn adam(a: &Args<'_>, h: &Adam) -> Outputs {
    let (mut p, g, mut m, mut v) = (a.f32s(0), a.f32s(1), a.f32s(2), a.f32s(3));
    let t = a.call.step.max(1) as i32;
    let bc1 = 1.0 - h.beta1.powi(t);
    let bc2 = 1.0 - h.beta2.powi(t);
    for k in 0..p.len() {
        let mut gk = g[k];
        if h.decoupled {
            p[k] -= h.lr * h.weight_decay * p[k];
        } else {
            gk += h.weight_decay * p[k];
        }
        m[k] = h.beta1 * m[k] + (1.0 - h.beta1) * gk;
        v[k] = h.beta2 * v[k] + (1.0 - h.beta2) * gk * gk;
        let mh = m[k] / bc1;
        let vh = v[k] / bc2;
        p[k] -= h.lr * mh / (vh.sqrt() + h.eps);
    }
    Ok(vec![Buf::F32(p), Buf::F32(m), Buf::F32(v)])
}
