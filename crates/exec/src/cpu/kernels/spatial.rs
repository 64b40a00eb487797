//! NCHW convolution and pooling kernels with their gradients.

use super::{Args, Buf, Outputs, Wanted};
use outcore_graph::{Conv2dAttrs, Pool2dAttrs};

/// Conv geometry.
struct ConvDims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    g: usize,
}

fn conv_dims(xs: &[usize], ws: &[usize], a: &Conv2dAttrs, out: &[u64]) -> ConvDims {
    ConvDims {
        n: xs[0],
        c: xs[1],
        h: xs[2],
        w: xs[3],
        o: ws[0],
        kh: ws[2],
        kw: ws[3],
        ho: out[2] as usize,
        wo: out[3] as usize,
        g: a.groups.max(1) as usize,
    }
}

/// The error for operands that are not 4-D (NCHW).
fn not_four_d(op: &str) -> String {
    format!("{op} expects 4-D NCHW operands")
}

/// Calls `f(x_index, w_index, y_index)` for every multiply-add of a convolution, in a fixed order.
fn conv_visit(d: &ConvDims, a: &Conv2dAttrs, mut f: impl FnMut(usize, usize, usize)) {
    let (cg, og) = (d.c / d.g, d.o / d.g);
    let (sh, sw) = (a.stride[0] as isize, a.stride[1] as isize);
    let (ph, pw) = (a.padding[0] as isize, a.padding[1] as isize);
    let (dh, dw) = (a.dilation[0] as isize, a.dilation[1] as isize);
    for n in 0..d.n {
        for oc in 0..d.o {
            let grp = oc / og.max(1);
            for oy in 0..d.ho {
                for ox in 0..d.wo {
                    let yi = ((n * d.o + oc) * d.ho + oy) * d.wo + ox;
                    for ic in 0..cg {
                        let c = grp * cg + ic;
                        for ky in 0..d.kh {
                            let iy = oy as isize * sh - ph + ky as isize * dh;
                            if iy < 0 || iy >= d.h as isize {
                                continue;
                            }
                            for kx in 0..d.kw {
                                let ix = ox as isize * sw - pw + kx as isize * dw;
                                if ix < 0 || ix >= d.w as isize {
                                    continue;
                                }
                                let xi = ((n * d.c + c) * d.h + iy as usize) * d.w + ix as usize;
                                let wi = ((oc * cg + ic) * d.kh + ky) * d.kw + kx;
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A (grouped, strided, dilated) convolution: inputs `x, w (, b)`.
pub(super) fn conv2d(a: &Args<'_>, attrs: &Conv2dAttrs) -> Outputs {
    let (x, w) = (a.f32s(0), a.f32s(1));
    let (xs, ws, out) = (a.in_shape(0), a.in_shape(1), a.out_shape(0));
    if xs.len() != 4 || ws.len() != 4 || out.len() != 4 {
        return Err(not_four_d("conv2d"));
    }
    let d = conv_dims(&xs, &ws, attrs, out);
    let mut y = vec![0f32; d.n * d.o * d.ho * d.wo];
    conv_visit(&d, attrs, |xi, wi, yi| y[yi] += x[xi] * w[wi]);
    if attrs.bias {
        let b = a.f32s(2);
        let plane = d.ho * d.wo;
        for (k, v) in y.iter_mut().enumerate() {
            *v += b[(k / plane.max(1)) % d.o];
        }
    }
    Ok(vec![Buf::F32(y)])
}

/// The gradients of [`conv2d`]: inputs `g, x, w`.
pub(super) fn conv2d_backward(a: &Args<'_>, attrs: &Conv2dAttrs, want: &Wanted<'_>) -> Outputs {
    let (g, x, w) = (a.f32s(0), a.f32s(1), a.f32s(2));
    let (xs, ws) = (a.in_shape(1), a.in_shape(2));
    let gs = a.in_shape(0);
    if xs.len() != 4 || ws.len() != 4 || gs.len() != 4 {
        return Err(not_four_d("conv2d backward"));
    }
    let gs64: Vec<u64> = gs.iter().map(|&v| v as u64).collect();
    let d = conv_dims(&xs, &ws, attrs, &gs64);
    let mut dx = vec![0f32; x.len()];
    let mut dw = vec![0f32; w.len()];
    conv_visit(&d, attrs, |xi, wi, yi| {
        dx[xi] += g[yi] * w[wi];
        dw[wi] += g[yi] * x[xi];
    });
    let db = attrs.bias.then(|| {
        let plane = d.ho * d.wo;
        let mut db = vec![0f32; d.o];
        for (k, v) in g.iter().enumerate() {
            db[(k / plane.max(1)) % d.o] += v;
        }
        db
    });
    want.select(vec![Some(dx), Some(dw), db])
}

/// Pooling geometry: planes (`n c`), input and output height and width.
struct PoolDims {
    nc: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
}

impl PoolDims {
    /// From the input's and the output's NCHW shapes; `None` unless both are 4-D.
    fn new(xs: &[usize], out: &[usize]) -> Option<PoolDims> {
        (xs.len() == 4 && out.len() == 4).then(|| PoolDims {
            nc: xs[0] * xs[1],
            h: xs[2],
            w: xs[3],
            ho: out[2],
            wo: out[3],
        })
    }

    /// The input row (or column) `k` steps into the window of output row
    /// (or column) `o`, which may fall in the padding.
    fn tap(o: usize, stride: u32, padding: u32, k: isize) -> isize {
        (o * stride as usize) as isize - padding as isize + k
    }
}

fn out_dims(a: &Args<'_>) -> Vec<usize> {
    a.out_shape(0).iter().map(|&d| d as usize).collect()
}

/// Max pooling: the window's maximum and its index in the input plane
/// (`h w` positions; the first maximum, or the first NaN).
pub(super) fn maxpool(a: &Args<'_>, attrs: &Pool2dAttrs) -> Outputs {
    let x = a.f32s(0);
    let Some(PoolDims { nc, h, w, ho, wo }) = PoolDims::new(&a.in_shape(0), &out_dims(a)) else {
        return Err(not_four_d("max pool"));
    };
    let mut y = vec![0f32; nc * ho * wo];
    let mut idx = vec![0i64; nc * ho * wo];
    for p in 0..nc {
        for oy in 0..ho {
            for ox in 0..wo {
                let mut best = f32::NEG_INFINITY;
                let mut bi: i64 = -1;
                for ky in 0..attrs.kernel[0] as isize {
                    let iy = PoolDims::tap(oy, attrs.stride[0], attrs.padding[0], ky);
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for kx in 0..attrs.kernel[1] as isize {
                        let ix = PoolDims::tap(ox, attrs.stride[1], attrs.padding[1], kx);
                        if ix < 0 || ix >= w as isize {
                            continue;
                        }
                        let v = x[p * h * w + iy as usize * w + ix as usize];
                        if v > best || bi < 0 || v.is_nan() {
                            best = v;
                            bi = iy as i64 * w as i64 + ix as i64;
                        }
                    }
                }
                let o = (p * ho + oy) * wo + ox;
                y[o] = best;
                idx[o] = bi.max(0);
            }
        }
    }
    Ok(vec![Buf::F32(y), Buf::I64(idx)])
}

/// The gradient of [`maxpool`]: inputs `g, x, indices`; each gradient goes
/// to the position its window's maximum came from.
pub(super) fn maxpool_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let (g, idx) = (a.f32s(0), a.i64s(2));
    let xs = a.in_shape(1);
    if xs.len() != 4 {
        return Err(not_four_d("max pool backward"));
    }
    let (nc, hw) = (xs[0] * xs[1], xs[2] * xs[3]);
    let per = g.len() / nc.max(1);
    let mut dx = vec![0f32; nc * hw];
    for p in 0..nc {
        for k in 0..per {
            let at = idx[p * per + k].clamp(0, hw as i64 - 1) as usize;
            dx[p * hw + at] += g[p * per + k];
        }
    }
    want.select(vec![Some(dx)])
}

/// Calls `f(input_index, output_index)` for every input position inside
/// each output's window (padding skipped), in a fixed order.
fn avgpool_visit(d: &PoolDims, attrs: &Pool2dAttrs, mut f: impl FnMut(usize, usize)) {
    let PoolDims { nc, h, w, ho, wo } = *d;
    for p in 0..nc {
        for oy in 0..ho {
            for ox in 0..wo {
                let o = (p * ho + oy) * wo + ox;
                for ky in 0..attrs.kernel[0] as isize {
                    let iy = PoolDims::tap(oy, attrs.stride[0], attrs.padding[0], ky);
                    for kx in 0..attrs.kernel[1] as isize {
                        let ix = PoolDims::tap(ox, attrs.stride[1], attrs.padding[1], kx);
                        if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                            f(p * h * w + iy as usize * w + ix as usize, o);
                        }
                    }
                }
            }
        }
    }
}

/// Average pooling with padding counted (PyTorch's `count_include_pad=True`).
pub(super) fn avgpool(a: &Args<'_>, attrs: &Pool2dAttrs) -> Outputs {
    let x = a.f32s(0);
    let Some(d) = PoolDims::new(&a.in_shape(0), &out_dims(a)) else {
        return Err(not_four_d("average pool"));
    };
    let div = (attrs.kernel[0] * attrs.kernel[1]) as f32;
    let mut sums = vec![0f32; d.nc * d.ho * d.wo];
    avgpool_visit(&d, attrs, |xi, o| sums[o] += x[xi]);
    Ok(vec![Buf::F32(sums.into_iter().map(|s| s / div).collect())])
}

/// The gradient of [`avgpool`]: inputs `g, x`; each output's gradient
/// spread evenly over its window (padding included in the divisor).
pub(super) fn avgpool_backward(a: &Args<'_>, attrs: &Pool2dAttrs, want: &Wanted<'_>) -> Outputs {
    let g = a.f32s(0);
    let Some(d) = PoolDims::new(&a.in_shape(1), &a.in_shape(0)) else {
        return Err(not_four_d("average pool backward"));
    };
    let div = (attrs.kernel[0] * attrs.kernel[1]) as f32;
    let mut dx = vec![0f32; d.nc * d.h * d.w];
    avgpool_visit(&d, attrs, |xi, o| dx[xi] += g[o] / div);
    want.select(vec![Some(dx)])
}

/// The mean of each `h w` plane.
pub(super) fn global_avgpool(a: &Args<'_>) -> Outputs {
    let x = a.f32s(0);
    let s = a.in_shape(0);
    if s.len() != 4 {
        return Err(not_four_d("global average pool"));
    }
    let hw = s[2] * s[3];
    Ok(vec![Buf::F32(
        x.chunks(hw.max(1))
            .map(|p| p.iter().sum::<f32>() / hw as f32)
            .collect(),
    )])
}

/// The gradient of [`global_avgpool`]: inputs `g, x`.
pub(super) fn global_avgpool_backward(a: &Args<'_>, want: &Wanted<'_>) -> Outputs {
    let g = a.f32s(0);
    let xs = a.in_shape(1);
    if xs.len() != 4 {
        return Err(not_four_d("global average pool backward"));
    }
    let hw = xs[2] * xs[3];
    let dx = (0..xs.iter().product::<usize>())
        .map(|k| g[k / hw.max(1)] / hw as f32)
        .collect();
    want.select(vec![Some(dx)])
}
