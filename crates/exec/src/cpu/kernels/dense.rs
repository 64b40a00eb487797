//! Matrix kernels: `Linear` (`y = x w^T + b`), batched `MatMul` and the
//! embedding lookup, with their gradients.

use super::{Args, Buf, Outputs, Wanted};

/// `y = x w^T (+ b)`, `x` of `rows x in`, `w` of `out x in`.
pub(super) fn linear(a: &Args<'_>, bias: bool) -> Outputs {
    let x = a.f32s(0);
    let w = a.f32s(1);
    let b = bias.then(|| a.f32s(2));
    let ws = a.in_shape(1);
    let (o_f, i_f) = (ws[0], ws[1]);
    let rows = x.len() / i_f.max(1);
    let mut y = vec![0f32; rows * o_f];
    for r in 0..rows {
        for o in 0..o_f {
            let mut acc = b.as_ref().map_or(0.0, |b| b[o]);
            let xr = &x[r * i_f..(r + 1) * i_f];
            let wr = &w[o * i_f..(o + 1) * i_f];
            for k in 0..i_f {
                acc += xr[k] * wr[k];
            }
            y[r * o_f + o] = acc;
        }
    }
    Ok(vec![Buf::F32(y)])
}

/// The gradients of [`linear`]: inputs `g, x, w`.
pub(super) fn linear_backward(a: &Args<'_>, bias: bool, want: &Wanted<'_>) -> Outputs {
    let (g, x, w) = (a.f32s(0), a.f32s(1), a.f32s(2));
    let ws = a.in_shape(2);
    let (o_f, i_f) = (ws[0], ws[1]);
    let rows = x.len() / i_f.max(1);
    let dx = want.at(0).then(|| {
        let mut dx = vec![0f32; rows * i_f];
        for r in 0..rows {
            for o in 0..o_f {
                let gv = g[r * o_f + o];
                let wr = &w[o * i_f..(o + 1) * i_f];
                let dr = &mut dx[r * i_f..(r + 1) * i_f];
                for k in 0..i_f {
                    dr[k] += gv * wr[k];
                }
            }
        }
        dx
    });
    let dw = want.at(1).then(|| {
        let mut dw = vec![0f32; o_f * i_f];
        for r in 0..rows {
            let xr = &x[r * i_f..(r + 1) * i_f];
            for o in 0..o_f {
                let gv = g[r * o_f + o];
                let dr = &mut dw[o * i_f..(o + 1) * i_f];
                for k in 0..i_f {
                    dr[k] += gv * xr[k];
                }
            }
        }
        dw
    });
    let db = (bias && want.at(2)).then(|| {
        let mut db = vec![0f32; o_f];
        for r in 0..rows {
            for o in 0..o_f {
                db[o] += g[r * o_f + o];
            }
        }
        db
    });
    want.select(vec![dx, dw, db])
}

/// The shapes of a batched `a b` (or `a b^T`): `(m, k, n)`, from `a`'s and
/// `b`'s shapes.
fn matmul_dims(sa: &[usize], sb: &[usize], transpose_b: bool) -> (usize, usize, usize) {
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let n = if transpose_b {
        sb[sb.len() - 2]
    } else {
        sb[sb.len() - 1]
    };
    (m, k, n)
}

/// `scale * a b` (or `a b^T`) over a batch of `m x k` matrices `a`; `b` is
/// one matrix shared by the batch or one per batch element.
pub(super) fn matmul(a: &Args<'_>, transpose_b: bool, scale: f32) -> Outputs {
    let (x, b) = (a.f32s(0), a.f32s(1));
    let (m, k, n) = matmul_dims(&a.in_shape(0), &a.in_shape(1), transpose_b);
    let batch = x.len() / (m * k).max(1);
    let b_batch = b.len() / (k * n).max(1);
    let mut y = vec![0f32; batch * m * n];
    for bi in 0..batch {
        let bo = if b_batch == 1 { 0 } else { bi } * k * n;
        for r in 0..m {
            for c in 0..n {
                let mut acc = 0f32;
                for q in 0..k {
                    let bv = if transpose_b {
                        b[bo + c * k + q]
                    } else {
                        b[bo + q * n + c]
                    };
                    acc += x[bi * m * k + r * k + q] * bv;
                }
                y[bi * m * n + r * n + c] = acc * scale;
            }
        }
    }
    Ok(vec![Buf::F32(y)])
}

/// The gradients of [`matmul`]: inputs `g, a, b`; both factors' gradients
/// are computed (the builder always asks for both).
pub(super) fn matmul_backward(
    a: &Args<'_>,
    transpose_b: bool,
    scale: f32,
    want: &Wanted<'_>,
) -> Outputs {
    let (g, x, b) = (a.f32s(0), a.f32s(1), a.f32s(2));
    let (m, k, n) = matmul_dims(&a.in_shape(1), &a.in_shape(2), transpose_b);
    let batch = x.len() / (m * k).max(1);
    let b_batch = b.len() / (k * n).max(1);
    let bidx = |bo: usize, q: usize, c: usize| {
        if transpose_b {
            bo + c * k + q
        } else {
            bo + q * n + c
        }
    };
    let mut dx = vec![0f32; x.len()];
    let mut db = vec![0f32; b.len()];
    for bi in 0..batch {
        let bo = if b_batch == 1 { 0 } else { bi } * k * n;
        for r in 0..m {
            for c in 0..n {
                let gv = g[bi * m * n + r * n + c] * scale;
                for q in 0..k {
                    dx[bi * m * k + r * k + q] += gv * b[bidx(bo, q, c)];
                    db[bidx(bo, q, c)] += gv * x[bi * m * k + r * k + q];
                }
            }
        }
    }
    want.select(vec![Some(dx), Some(db)])
}

/// Rows of the table (input 1, `num x d`) at the indices (input 0); an
/// index outside the table is an error naming it and the table's range.
pub(super) fn embedding(a: &Args<'_>) -> Outputs {
    let idx = a.i64s(0);
    let table = a.f32s(1);
    let ts = a.in_shape(1);
    let (num, d) = (ts[0], ts[1]);
    let mut y = Vec::with_capacity(idx.len() * d);
    for &t in &idx {
        let t = usize::try_from(t)
            .ok()
            .filter(|&t| t < num)
            .ok_or_else(|| format!("embedding index {t} out of range 0..{num}"))?;
        y.extend_from_slice(&table[t * d..(t + 1) * d]);
    }
    Ok(vec![Buf::F32(y)])
}

/// The table's gradient: inputs `g, indices`; each row of `g` added to the
/// row its index picked. Indices (input 0) never require a gradient.
pub(super) fn embedding_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, idx) = (a.f32s(0), a.i64s(1));
    let Some(out) = a.call.outputs.first() else {
        return Err("embedding backward has no output".into());
    };
    let ts = super::shape(out);
    let (num, d) = (ts[0], ts[1]);
    let mut dt = vec![0f32; num * d];
    for (r, &t) in idx.iter().enumerate() {
        let t = t.clamp(0, num as i64 - 1) as usize;
        for k in 0..d {
            dt[t * d + k] += g[r * d + k];
        }
    }
    want.select(vec![None, Some(dt)])
}
