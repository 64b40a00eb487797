//! Real f32 kernels for the ops the tiny models use, and a deterministic synthetic
//! stand-in for every other op kind. Every reduction sums in a fixed order, so
//! results are bit-identical whatever the plan.

use crate::backend::{KernelCall, Operand, fnv1a};
use outcore_graph::{Conv2dAttrs, DType, OpKind, Pool2dAttrs};

/// Runs a kernel on its input bytes; returns one byte vector per output and whether
/// the synthetic stand-in ran (so the caller can sleep its cost).
pub fn run_kernel(call: &KernelCall, inputs: &[Vec<u8>]) -> Result<(Vec<Vec<u8>>, bool), String> {
    if inputs.len() != call.inputs.len() {
        return Err(format!(
            "{} input buffers for {} operands",
            inputs.len(),
            call.inputs.len()
        ));
    }
    match real(call, inputs) {
        Some(result) => {
            let outs = result?;
            if outs.len() != call.outputs.len() {
                return Err(format!(
                    "kernel produced {} outputs, the op has {}",
                    outs.len(),
                    call.outputs.len()
                ));
            }
            let mut bytes = Vec::with_capacity(outs.len());
            for (o, v) in call.outputs.iter().zip(outs) {
                let b = v.into_bytes();
                if (b.len() as u64) != o.size_bytes {
                    return Err(format!(
                        "output {} has {} bytes, expected {}",
                        o.tensor,
                        b.len(),
                        o.size_bytes
                    ));
                }
                bytes.push(b);
            }
            Ok((bytes, false))
        }
        None => Ok((synthetic(call, inputs), true)),
    }
}

/// Typed tensor data.
#[derive(Debug, Clone)]
enum Buf {
    F32(Vec<f32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

impl Buf {
    fn into_bytes(self) -> Vec<u8> {
        match self {
            Buf::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buf::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buf::U8(v) => v,
        }
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

fn numel(o: &Operand) -> usize {
    o.shape.iter().product::<u64>() as usize
}

/// Bytes of each end of an input that the synthetic kernel hashes.
pub const SYNTHETIC_SAMPLE_BYTES: usize = 4096;

/// Deterministic bytes for outputs of op kinds without a real kernel. The seed
/// hashes the op id and, per input, its length and up to
/// [`SYNTHETIC_SAMPLE_BYTES`] from each end (hashing every byte would cost far more
/// than the op's modelled time on large graphs; `--check` still checksums whole
/// tensors). Outputs tile one generated 64 KiB block of small floats (never NaN);
/// integer outputs are zeros.
fn synthetic(call: &KernelCall, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut seed = call.op.0 as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for b in inputs {
        let head = &b[..b.len().min(SYNTHETIC_SAMPLE_BYTES)];
        let tail = &b[b.len().saturating_sub(SYNTHETIC_SAMPLE_BYTES)..];
        seed = seed.rotate_left(13) ^ fnv1a(head) ^ fnv1a(tail).rotate_left(7) ^ b.len() as u64;
    }
    const BLOCK_FLOATS: usize = 16 * 1024;
    call.outputs
        .iter()
        .enumerate()
        .map(|(k, o)| match o.dtype {
            DType::Float32 => {
                let block: Vec<u8> = (0..BLOCK_FLOATS)
                    .flat_map(|i| {
                        let h = splitmix(seed ^ ((k as u64) << 48) ^ i as u64);
                        (((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.01).to_le_bytes()
                    })
                    .collect();
                let len = o.size_bytes as usize;
                let mut out = Vec::with_capacity(len);
                while out.len() < len {
                    let take = (len - out.len()).min(block.len());
                    out.extend_from_slice(&block[..take]);
                }
                out
            }
            _ => vec![0u8; o.size_bytes as usize],
        })
        .collect()
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Dropout keep decision for element `i`: a counter-based hash of the seed and the
/// index, so recomputation reproduces the mask.
fn dropout_keep(seed: u64, i: usize, p: f32) -> bool {
    let u = (splitmix(seed ^ splitmix(i as u64)) >> 40) as f32 / (1u64 << 24) as f32;
    u >= p
}

/// The real kernel, or `None` when the kind (or its dtypes) has none.
fn real(call: &KernelCall, raw: &[Vec<u8>]) -> Option<Result<Vec<Buf>, String>> {
    // Real kernels handle f32 data with int64 indices and bool masks.
    let typed_ok = call.inputs.iter().chain(&call.outputs).all(|o| {
        matches!(
            o.dtype,
            DType::Float32 | DType::Int64 | DType::Bool | DType::Uint8
        )
    });
    if !typed_ok {
        return None;
    }
    let f = |k: usize| -> Vec<f32> { raw.get(k).map(|b| f32s(b)).unwrap_or_default() };
    let i = |k: usize| -> Vec<i64> { raw.get(k).map(|b| i64s(b)).unwrap_or_default() };
    let ins = &call.inputs;
    let outs = &call.outputs;
    let in_shape = |k: usize| -> Vec<usize> {
        ins.get(k)
            .map(|o| o.shape.iter().map(|&d| d as usize).collect())
            .unwrap_or_default()
    };
    let out_n = |k: usize| outs.get(k).map(numel).unwrap_or(0);
    let r: Result<Vec<Buf>, String> = match &call.kind {
        OpKind::Linear { bias } => {
            let x = f(0);
            let w = f(1);
            let ws = in_shape(1);
            let (o_f, i_f) = (ws[0], ws[1]);
            let rows = x.len() / i_f.max(1);
            let mut y = vec![0f32; rows * o_f];
            for r in 0..rows {
                for o in 0..o_f {
                    let mut acc = if *bias { f(2)[o] } else { 0.0 };
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
        OpKind::MatMul { transpose_b, scale } => {
            let (a, b) = (f(0), f(1));
            let (sa, sb) = (in_shape(0), in_shape(1));
            let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
            let n = if *transpose_b {
                sb[sb.len() - 2]
            } else {
                sb[sb.len() - 1]
            };
            let batch = a.len() / (m * k).max(1);
            let b_batch = b.len() / (k * n).max(1);
            let mut y = vec![0f32; batch * m * n];
            for bi in 0..batch {
                let bo = if b_batch == 1 { 0 } else { bi } * k * n;
                for r in 0..m {
                    for c in 0..n {
                        let mut acc = 0f32;
                        for q in 0..k {
                            let bv = if *transpose_b {
                                b[bo + c * k + q]
                            } else {
                                b[bo + q * n + c]
                            };
                            acc += a[bi * m * k + r * k + q] * bv;
                        }
                        y[bi * m * n + r * n + c] = acc * scale;
                    }
                }
            }
            Ok(vec![Buf::F32(y)])
        }
        OpKind::Conv2d(attrs) => conv2d(
            &f(0),
            &in_shape(0),
            &f(1),
            &in_shape(1),
            attrs,
            if attrs.bias { Some(f(2)) } else { None },
            &outs[0].shape,
        ),
        OpKind::Relu => Ok(vec![Buf::F32(
            f(0).iter()
                .map(|&x| if x > 0.0 { x } else { 0.0 })
                .collect(),
        )]),
        OpKind::Relu6 => Ok(vec![Buf::F32(
            f(0).iter().map(|&x| x.clamp(0.0, 6.0)).collect(),
        )]),
        OpKind::Tanh => Ok(vec![Buf::F32(f(0).iter().map(|&x| x.tanh()).collect())]),
        OpKind::Sigmoid => Ok(vec![Buf::F32(
            f(0).iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
        )]),
        OpKind::Gelu => Ok(vec![Buf::F32(f(0).iter().map(|&x| gelu(x).0).collect())]),
        OpKind::Silu => Ok(vec![Buf::F32(f(0).iter().map(|&x| silu(x).0).collect())]),
        OpKind::Scale { factor } => Ok(vec![Buf::F32(f(0).iter().map(|&x| x * factor).collect())]),
        OpKind::AddScalar { value } => {
            Ok(vec![Buf::F32(f(0).iter().map(|&x| x + value).collect())])
        }
        OpKind::PowScalar { exponent } => Ok(vec![Buf::F32(
            f(0).iter().map(|&x| x.powf(*exponent)).collect(),
        )]),
        OpKind::Add | OpKind::GradAccumulate => {
            let mut y = f(0);
            for k in 1..ins.len() {
                for (a, b) in y.iter_mut().zip(f(k)) {
                    *a += b;
                }
            }
            Ok(vec![Buf::F32(y)])
        }
        OpKind::Mul => mul_forward(&f(0), &f(1)).map(|y| vec![Buf::F32(y)]),
        OpKind::Fill { value } => Ok(outs
            .iter()
            .map(|o| match o.dtype {
                DType::Float32 => Buf::F32(vec![*value; numel(o)]),
                _ => Buf::U8(vec![0; o.size_bytes as usize]),
            })
            .collect()),
        OpKind::View | OpKind::Copy => {
            // Same elements in row-major order (a reshape); views are not written.
            let x = raw.first().cloned().unwrap_or_default();
            Ok(outs
                .iter()
                .map(|o| Buf::U8(resize(&x, o.size_bytes as usize)))
                .collect())
        }
        OpKind::Concat { axis } => Ok(vec![Buf::F32(concat(call, raw, *axis as usize))]),
        OpKind::Softmax => {
            let x = f(0);
            let d = *in_shape(0).last().unwrap_or(&1);
            Ok(vec![Buf::F32(softmax_rows(&x, d))])
        }
        OpKind::Dropout { p, seed } => {
            let x = f(0);
            let scale = if *p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
            let mask: Vec<u8> = (0..x.len())
                .map(|k| dropout_keep(*seed, k, *p) as u8)
                .collect();
            let y = x
                .iter()
                .zip(&mask)
                .map(|(v, &m)| if m == 1 { v * scale } else { 0.0 })
                .collect();
            Ok(vec![Buf::F32(y), Buf::U8(mask)])
        }
        OpKind::MaxPool2d(attrs) => maxpool(&f(0), &in_shape(0), attrs, &outs[0].shape),
        OpKind::AvgPool2d(attrs) => Ok(vec![Buf::F32(avgpool(
            &f(0),
            &in_shape(0),
            attrs,
            &outs[0].shape,
        ))]),
        OpKind::GlobalAvgPool => {
            let x = f(0);
            let s = in_shape(0);
            let hw = s[2] * s[3];
            Ok(vec![Buf::F32(
                x.chunks(hw.max(1))
                    .map(|p| p.iter().sum::<f32>() / hw as f32)
                    .collect(),
            )])
        }
        OpKind::BatchNorm { eps } => Ok(batchnorm(&f(0), &in_shape(0), &f(1), &f(2), *eps)),
        OpKind::BatchNormStats { momentum, count } => {
            let (rm, rv, mean, invstd) = (f(0), f(1), f(2), f(3));
            let m = *momentum;
            let n = *count as f32;
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
        OpKind::LayerNorm { eps } => {
            let (x, g, b) = (f(0), f(1), f(2));
            let d = *in_shape(0).last().unwrap_or(&1);
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
        OpKind::Embedding => {
            let idx = i(0);
            let table = f(1);
            let d = in_shape(1)[1];
            let num = in_shape(1)[0];
            let mut y = Vec::with_capacity(idx.len() * d);
            for &t in &idx {
                let t = usize::try_from(t)
                    .ok()
                    .filter(|&t| t < num)
                    .ok_or_else(|| format!("embedding index {t} out of range 0..{num}"));
                match t {
                    Ok(t) => y.extend_from_slice(&table[t * d..(t + 1) * d]),
                    Err(e) => return Some(Err(e)),
                }
            }
            Ok(vec![Buf::F32(y)])
        }
        OpKind::SoftmaxCrossEntropy => {
            let x = f(0);
            let labels = i(1);
            let c = *in_shape(0).last().unwrap_or(&1);
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
                    None => return Some(Err(format!("label {l} out of range 0..{c}"))),
                }
            }
            Ok(vec![
                Buf::F32(vec![loss / rows.max(1) as f32]),
                Buf::F32(logp),
            ])
        }
        OpKind::SgdUpdate {
            lr,
            momentum,
            weight_decay,
        } => {
            let (mut p, g) = (f(0), f(1));
            let mut buf = if *momentum > 0.0 { Some(f(2)) } else { None };
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
        OpKind::AdamUpdate {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        } => {
            let (mut p, g, mut m, mut v) = (f(0), f(1), f(2), f(3));
            let t = call.step.max(1) as i32;
            let bc1 = 1.0 - beta1.powi(t);
            let bc2 = 1.0 - beta2.powi(t);
            for k in 0..p.len() {
                let mut gk = g[k];
                if *decoupled {
                    p[k] -= lr * weight_decay * p[k];
                } else {
                    gk += weight_decay * p[k];
                }
                m[k] = beta1 * m[k] + (1.0 - beta1) * gk;
                v[k] = beta2 * v[k] + (1.0 - beta2) * gk * gk;
                let mh = m[k] / bc1;
                let vh = v[k] / bc2;
                p[k] -= lr * mh / (vh.sqrt() + eps);
            }
            Ok(vec![Buf::F32(p), Buf::F32(m), Buf::F32(v)])
        }
        OpKind::Backward { forward, grads_for } => return backward(call, raw, forward, grads_for),
        _ => return None,
    };
    let _ = out_n;
    Some(r)
}

fn resize(x: &[u8], len: usize) -> Vec<u8> {
    let mut v = x[..len.min(x.len())].to_vec();
    v.resize(len, 0);
    v
}

/// SiLU and its derivative: `x s` and `s (1 + x (1 - s))`, `s = sigmoid(x)`.
fn silu(x: f32) -> (f32, f32) {
    let s = 1.0 / (1.0 + (-x).exp());
    (x * s, s * (1.0 + x * (1.0 - s)))
}

/// How `small` broadcasts over `big` in [`OpKind::Mul`]: the number of
/// consecutive elements of `big` that one element of `small` multiplies (its
/// shape is `big`'s with trailing dimensions of 1), or an error naming both
/// lengths.
fn broadcast_block(big: usize, small: usize) -> Result<usize, String> {
    if small == 0 || !big.is_multiple_of(small) {
        return Err(format!(
            "mul of {big} and {small} elements: one factor must have the other's shape, or that shape with trailing dimensions of 1"
        ));
    }
    Ok(big / small)
}

/// `a * b`, the smaller factor broadcast over the larger's trailing dimensions.
fn mul_forward(a: &[f32], b: &[f32]) -> Result<Vec<f32>, String> {
    let (big, small) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let block = broadcast_block(big.len(), small.len())?;
    Ok(big
        .iter()
        .enumerate()
        .map(|(i, x)| x * small[i / block])
        .collect())
}

/// The gradients of `a * b` (as [`mul_forward`] broadcasts): the larger
/// factor's is `g` times the other, broadcast; the smaller's sums `g` times
/// the larger over each block it multiplied.
fn mul_backward(g: &[f32], a: &[f32], b: &[f32]) -> Result<(Vec<f32>, Vec<f32>), String> {
    let a_big = a.len() >= b.len();
    let (big, small) = if a_big { (a, b) } else { (b, a) };
    let block = broadcast_block(big.len(), small.len())?;
    let d_big: Vec<f32> = g
        .iter()
        .enumerate()
        .map(|(i, g)| g * small[i / block])
        .collect();
    let mut d_small = vec![0f32; small.len()];
    for (i, (g, x)) in g.iter().zip(big).enumerate() {
        d_small[i / block] += g * x;
    }
    Ok(if a_big {
        (d_big, d_small)
    } else {
        (d_small, d_big)
    })
}

fn gelu(x: f32) -> (f32, f32) {
    // tanh approximation; returns value and derivative.
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    let u = c * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    let du = c * (1.0 + 3.0 * 0.044715 * x * x);
    (
        0.5 * x * (1.0 + t),
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du,
    )
}

fn softmax_rows(x: &[f32], d: usize) -> Vec<f32> {
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

fn concat(call: &KernelCall, raw: &[Vec<u8>], axis: usize) -> Vec<f32> {
    let out = &call.outputs[0].shape;
    let outer: usize = out[..axis].iter().product::<u64>() as usize;
    let mut y = Vec::with_capacity(numel(&call.outputs[0]));
    let parts: Vec<(Vec<f32>, usize)> = call
        .inputs
        .iter()
        .zip(raw)
        .map(|(o, b)| {
            let inner: usize = o.shape[axis..].iter().product::<u64>() as usize;
            (f32s(b), inner)
        })
        .collect();
    for r in 0..outer {
        for (p, inner) in &parts {
            y.extend_from_slice(&p[r * inner..(r + 1) * inner]);
        }
    }
    y
}

/// Conv geometry: (n, c, h, w, o, kh, kw, ho, wo, groups).
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

fn conv2d(
    x: &[f32],
    xs: &[usize],
    w: &[f32],
    ws: &[usize],
    a: &Conv2dAttrs,
    b: Option<Vec<f32>>,
    out: &[u64],
) -> Result<Vec<Buf>, String> {
    if xs.len() != 4 || ws.len() != 4 || out.len() != 4 {
        return Err("conv2d expects 4-D NCHW operands".into());
    }
    let d = conv_dims(xs, ws, a, out);
    let mut y = vec![0f32; d.n * d.o * d.ho * d.wo];
    conv_visit(&d, a, |xi, wi, yi| y[yi] += x[xi] * w[wi]);
    if let Some(b) = b {
        let plane = d.ho * d.wo;
        for (k, v) in y.iter_mut().enumerate() {
            *v += b[(k / plane.max(1)) % d.o];
        }
    }
    Ok(vec![Buf::F32(y)])
}

fn maxpool(x: &[f32], xs: &[usize], a: &Pool2dAttrs, out: &[u64]) -> Result<Vec<Buf>, String> {
    let (nc, h, w) = (xs[0] * xs[1], xs[2], xs[3]);
    let (ho, wo) = (out[2] as usize, out[3] as usize);
    let mut y = vec![0f32; nc * ho * wo];
    let mut idx = vec![0i64; nc * ho * wo];
    for p in 0..nc {
        for oy in 0..ho {
            for ox in 0..wo {
                let mut best = f32::NEG_INFINITY;
                let mut bi: i64 = -1;
                for ky in 0..a.kernel[0] as isize {
                    let iy = (oy * a.stride[0] as usize) as isize - a.padding[0] as isize + ky;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for kx in 0..a.kernel[1] as isize {
                        let ix = (ox * a.stride[1] as usize) as isize - a.padding[1] as isize + kx;
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

/// Average pooling with padding counted (PyTorch's `count_include_pad=True`).
fn avgpool(x: &[f32], xs: &[usize], a: &Pool2dAttrs, out: &[u64]) -> Vec<f32> {
    let (nc, h, w) = (xs[0] * xs[1], xs[2], xs[3]);
    let (ho, wo) = (out[2] as usize, out[3] as usize);
    let div = (a.kernel[0] * a.kernel[1]) as f32;
    let mut y = vec![0f32; nc * ho * wo];
    for p in 0..nc {
        for oy in 0..ho {
            for ox in 0..wo {
                let mut s = 0f32;
                for ky in 0..a.kernel[0] as isize {
                    let iy = (oy * a.stride[0] as usize) as isize - a.padding[0] as isize + ky;
                    for kx in 0..a.kernel[1] as isize {
                        let ix = (ox * a.stride[1] as usize) as isize - a.padding[1] as isize + kx;
                        if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                            s += x[p * h * w + iy as usize * w + ix as usize];
                        }
                    }
                }
                y[(p * ho + oy) * wo + ox] = s / div;
            }
        }
    }
    y
}

fn avgpool_backward(g: &[f32], xs: &[usize], a: &Pool2dAttrs, gs: &[usize]) -> Vec<f32> {
    let (nc, h, w) = (xs[0] * xs[1], xs[2], xs[3]);
    let (ho, wo) = (gs[2], gs[3]);
    let div = (a.kernel[0] * a.kernel[1]) as f32;
    let mut dx = vec![0f32; nc * h * w];
    for p in 0..nc {
        for oy in 0..ho {
            for ox in 0..wo {
                let gv = g[(p * ho + oy) * wo + ox] / div;
                for ky in 0..a.kernel[0] as isize {
                    let iy = (oy * a.stride[0] as usize) as isize - a.padding[0] as isize + ky;
                    for kx in 0..a.kernel[1] as isize {
                        let ix = (ox * a.stride[1] as usize) as isize - a.padding[1] as isize + kx;
                        if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                            dx[p * h * w + iy as usize * w + ix as usize] += gv;
                        }
                    }
                }
            }
        }
    }
    dx
}

/// Per-channel index helper for `[n, c, rest...]` tensors.
fn bn_geometry(xs: &[usize]) -> (usize, usize, usize) {
    let n = xs[0];
    let c = xs.get(1).copied().unwrap_or(1);
    let inner: usize = xs.iter().skip(2).product();
    (n, c, inner)
}

fn batchnorm(x: &[f32], xs: &[usize], gamma: &[f32], beta: &[f32], eps: f32) -> Vec<Buf> {
    let (n, c, inner) = bn_geometry(xs);
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
    vec![Buf::F32(y), Buf::F32(mean), Buf::F32(invstd)]
}

/// Backward kernels. Inputs: output gradients, then saved tensors (see the builder);
/// outputs: one gradient per forward input whose `grads_for` is true.
fn backward(
    call: &KernelCall,
    raw: &[Vec<u8>],
    forward: &OpKind,
    grads_for: &[bool],
) -> Option<Result<Vec<Buf>, String>> {
    let f = |k: usize| -> Vec<f32> { raw.get(k).map(|b| f32s(b)).unwrap_or_default() };
    let i = |k: usize| -> Vec<i64> { raw.get(k).map(|b| i64s(b)).unwrap_or_default() };
    let shape = |o: &Operand| -> Vec<usize> { o.shape.iter().map(|&d| d as usize).collect() };
    let in_shape = |k: usize| call.inputs.get(k).map(shape).unwrap_or_default();
    // Keeps the gradients the op outputs, in forward-input order.
    let select = |all: Vec<Option<Vec<f32>>>| -> Result<Vec<Buf>, String> {
        let mut out = Vec::new();
        for (k, wanted) in grads_for.iter().enumerate() {
            if *wanted {
                match all.get(k).cloned().flatten() {
                    Some(v) => out.push(Buf::F32(v)),
                    None => return Err(format!("no gradient for forward input {k}")),
                }
            }
        }
        Ok(out)
    };
    let want = |k: usize| grads_for.get(k).copied().unwrap_or(false);
    let r = match forward {
        OpKind::Linear { bias } => {
            let (g, x, w) = (f(0), f(1), f(2));
            let ws = in_shape(2);
            let (o_f, i_f) = (ws[0], ws[1]);
            let rows = x.len() / i_f.max(1);
            let dx = want(0).then(|| {
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
            let dw = want(1).then(|| {
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
            let db = (*bias && want(2)).then(|| {
                let mut db = vec![0f32; o_f];
                for r in 0..rows {
                    for o in 0..o_f {
                        db[o] += g[r * o_f + o];
                    }
                }
                db
            });
            select(vec![dx, dw, db])
        }
        OpKind::MatMul { transpose_b, scale } => {
            let (g, a, b) = (f(0), f(1), f(2));
            let (sa, sb) = (in_shape(1), in_shape(2));
            let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
            let n = if *transpose_b {
                sb[sb.len() - 2]
            } else {
                sb[sb.len() - 1]
            };
            let batch = a.len() / (m * k).max(1);
            let b_batch = b.len() / (k * n).max(1);
            let bidx = |bo: usize, q: usize, c: usize| {
                if *transpose_b {
                    bo + c * k + q
                } else {
                    bo + q * n + c
                }
            };
            let mut da = vec![0f32; a.len()];
            let mut db = vec![0f32; b.len()];
            for bi in 0..batch {
                let bo = if b_batch == 1 { 0 } else { bi } * k * n;
                for r in 0..m {
                    for c in 0..n {
                        let gv = g[bi * m * n + r * n + c] * scale;
                        for q in 0..k {
                            da[bi * m * k + r * k + q] += gv * b[bidx(bo, q, c)];
                            db[bidx(bo, q, c)] += gv * a[bi * m * k + r * k + q];
                        }
                    }
                }
            }
            select(vec![Some(da), Some(db)])
        }
        OpKind::Conv2d(attrs) => {
            let (g, x, w) = (f(0), f(1), f(2));
            let (xs, ws) = (in_shape(1), in_shape(2));
            let gs = in_shape(0);
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
            select(vec![Some(dx), Some(dw), db])
        }
        OpKind::Relu => select(vec![Some(
            f(0).iter()
                .zip(f(1))
                .map(|(g, y)| if y > 0.0 { *g } else { 0.0 })
                .collect(),
        )]),
        OpKind::Relu6 => select(vec![Some(
            f(0).iter()
                .zip(f(1))
                .map(|(g, x)| if x > 0.0 && x < 6.0 { *g } else { 0.0 })
                .collect(),
        )]),
        OpKind::Tanh => select(vec![Some(
            f(0).iter()
                .zip(f(1))
                .map(|(g, y)| g * (1.0 - y * y))
                .collect(),
        )]),
        OpKind::Sigmoid => select(vec![Some(
            f(0).iter()
                .zip(f(1))
                .map(|(g, y)| g * y * (1.0 - y))
                .collect(),
        )]),
        OpKind::Gelu => select(vec![Some(
            f(0).iter().zip(f(1)).map(|(g, x)| g * gelu(x).1).collect(),
        )]),
        OpKind::Silu => select(vec![Some(
            f(0).iter().zip(f(1)).map(|(g, x)| g * silu(x).1).collect(),
        )]),
        OpKind::Scale { factor } => select(vec![Some(f(0).iter().map(|g| g * factor).collect())]),
        OpKind::PowScalar { exponent } => select(vec![Some(
            f(0).iter()
                .zip(f(1))
                .map(|(g, x)| g * exponent * x.powf(exponent - 1.0))
                .collect(),
        )]),
        OpKind::Mul => match mul_backward(&f(0), &f(1), &f(2)) {
            Ok((da, db)) => select(vec![Some(da), Some(db)]),
            Err(e) => Err(e),
        },
        OpKind::Softmax => {
            let (g, y) = (f(0), f(1));
            let d = *in_shape(1).last().unwrap_or(&1);
            let mut dx = vec![0f32; y.len()];
            for r in 0..y.len() / d.max(1) {
                let s: f32 = (0..d).map(|k| g[r * d + k] * y[r * d + k]).sum();
                for k in 0..d {
                    dx[r * d + k] = y[r * d + k] * (g[r * d + k] - s);
                }
            }
            select(vec![Some(dx)])
        }
        OpKind::Dropout { p, .. } => {
            let (g, mask) = (f(0), raw.get(1).cloned().unwrap_or_default());
            let scale = if *p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
            select(vec![Some(
                g.iter()
                    .zip(&mask)
                    .map(|(g, &m)| if m != 0 { g * scale } else { 0.0 })
                    .collect(),
            )])
        }
        OpKind::MaxPool2d(_) => {
            let (g, idx) = (f(0), i(2));
            let xs = in_shape(1);
            let (nc, hw) = (xs[0] * xs[1], xs[2] * xs[3]);
            let per = g.len() / nc.max(1);
            let mut dx = vec![0f32; nc * hw];
            for p in 0..nc {
                for k in 0..per {
                    let at = idx[p * per + k].clamp(0, hw as i64 - 1) as usize;
                    dx[p * hw + at] += g[p * per + k];
                }
            }
            select(vec![Some(dx)])
        }
        OpKind::AvgPool2d(attrs) => select(vec![Some(avgpool_backward(
            &f(0),
            &in_shape(1),
            attrs,
            &in_shape(0),
        ))]),
        OpKind::GlobalAvgPool => {
            let g = f(0);
            let xs = in_shape(1);
            let hw = xs[2] * xs[3];
            let dx = (0..xs.iter().product::<usize>())
                .map(|k| g[k / hw.max(1)] / hw as f32)
                .collect();
            select(vec![Some(dx)])
        }
        OpKind::BatchNorm { .. } => {
            let (g, x, gamma, mean, invstd) = (f(0), f(1), f(2), f(3), f(4));
            let (n, c, inner) = bn_geometry(&in_shape(1));
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
            select(vec![Some(dx), Some(dgamma), Some(dbeta)])
        }
        OpKind::LayerNorm { .. } => {
            let (g, x, gamma, mean, rstd) = (f(0), f(1), f(2), f(4), f(5));
            let d = *in_shape(1).last().unwrap_or(&1);
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
            select(vec![Some(dx), Some(dgamma), Some(dbeta)])
        }
        OpKind::Embedding => {
            let (g, idx) = (f(0), i(1));
            let Some(out) = call.outputs.first() else {
                return Some(Err("embedding backward has no output".into()));
            };
            let ts = shape(out);
            let (num, d) = (ts[0], ts[1]);
            let mut dt = vec![0f32; num * d];
            for (r, &t) in idx.iter().enumerate() {
                let t = t.clamp(0, num as i64 - 1) as usize;
                for k in 0..d {
                    dt[t * d + k] += g[r * d + k];
                }
            }
            // Indices (input 0) never require a gradient.
            select(vec![None, Some(dt)])
        }
        OpKind::SoftmaxCrossEntropy => {
            let (g, logp, labels) = (f(0), f(1), i(2));
            let c = *in_shape(1).last().unwrap_or(&1);
            let rows = logp.len() / c.max(1);
            let scale = g.first().copied().unwrap_or(1.0) / rows.max(1) as f32;
            let mut dx: Vec<f32> = logp.iter().map(|l| l.exp() * scale).collect();
            for r in 0..rows {
                let l = labels.get(r).copied().unwrap_or(0).clamp(0, c as i64 - 1) as usize;
                dx[r * c + l] -= scale;
            }
            select(vec![Some(dx)])
        }
        OpKind::View | OpKind::Copy | OpKind::Concat { .. } => {
            // Views of the gradient (not written) or a reshaping copy.
            let g = raw.first().cloned().unwrap_or_default();
            Ok(call
                .outputs
                .iter()
                .map(|o| Buf::U8(resize(&g, o.size_bytes as usize)))
                .collect())
        }
        _ => return None,
    };
    Some(r)
}
