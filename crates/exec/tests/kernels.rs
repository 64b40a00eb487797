//! CPU kernels: backward kernels agree with finite differences of their forward
//! kernels, and the synthetic stand-in is deterministic.

use outcore_exec::cpu::run_kernel;
use outcore_exec::{DeviceSegment, KernelCall, Operand};
use outcore_graph::{Conv2dAttrs, DType, OpId, OpKind, Pool2dAttrs, TensorId};

fn operand(shape: &[u64], dtype: DType) -> Operand {
    let n: u64 = shape.iter().product();
    Operand {
        tensor: TensorId(0),
        segments: vec![DeviceSegment::new(0, n * 4)],
        shape: shape.to_vec(),
        dtype,
        size_bytes: n * 4,
        write: true,
        view: None,
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn call(kind: OpKind, ins: &[&[u64]], outs: &[&[u64]]) -> KernelCall {
    KernelCall {
        op: OpId(0),
        op_name: "test".into(),
        kind,
        inputs: ins.iter().map(|s| operand(s, DType::Float32)).collect(),
        outputs: outs.iter().map(|s| operand(s, DType::Float32)).collect(),
        step: 1,
        synthetic_time_s: 0.0,
    }
}

fn values(n: usize, salt: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(salt) >> 8) % 1000) as f32 / 500.0
                - 1.0
        })
        .collect()
}

/// Checks d(sum(r * y0))/d(input k) of a forward kind against its backward kernel.
/// `saved(inputs, outputs)` builds the backward's saved tensors.
fn grad_check(
    kind: OpKind,
    in_shapes: &[&[u64]],
    out_shapes: &[&[u64]],
    saved: impl Fn(&[Vec<f32>], &[Vec<f32>]) -> Vec<(Vec<f32>, Vec<u64>)>,
) {
    let inputs: Vec<Vec<f32>> = in_shapes
        .iter()
        .enumerate()
        .map(|(k, s)| values(s.iter().product::<u64>() as usize, k as u32 * 7 + 1))
        .collect();
    let fwd = call(kind.clone(), in_shapes, out_shapes);
    let run_fwd = |ins: &[Vec<f32>]| -> Vec<Vec<f32>> {
        let raw: Vec<Vec<u8>> = ins.iter().map(|v| bytes(v)).collect();
        let (outs, synthetic) = run_kernel(&fwd, &raw).expect("forward runs");
        assert!(!synthetic);
        outs.iter().map(|b| floats(b)).collect()
    };
    let outs = run_fwd(&inputs);
    let r = values(outs[0].len(), 99);
    let objective = |ins: &[Vec<f32>]| -> f64 {
        run_fwd(ins)[0]
            .iter()
            .zip(&r)
            .map(|(y, r)| (*y as f64) * (*r as f64))
            .sum()
    };
    let saved = saved(&inputs, &outs);
    let mut bwd_in: Vec<(Vec<f32>, Vec<u64>)> = vec![(r.clone(), out_shapes[0].to_vec())];
    bwd_in.extend(saved);
    let bwd = KernelCall {
        kind: OpKind::Backward {
            forward: Box::new(kind),
            grads_for: vec![true; in_shapes.len()],
        },
        inputs: bwd_in
            .iter()
            .map(|(_, s)| operand(s, DType::Float32))
            .collect(),
        outputs: in_shapes
            .iter()
            .map(|s| operand(s, DType::Float32))
            .collect(),
        ..fwd.clone()
    };
    let raw: Vec<Vec<u8>> = bwd_in.iter().map(|(v, _)| bytes(v)).collect();
    let (grads, _) = run_kernel(&bwd, &raw).expect("backward runs");
    for (k, g) in grads.iter().enumerate() {
        let g = floats(g);
        for idx in [0, g.len() / 3, g.len() - 1] {
            let h = 1e-2f32;
            let mut plus = inputs.clone();
            plus[k][idx] += h;
            let mut minus = inputs.clone();
            minus[k][idx] -= h;
            let numeric = (objective(&plus) - objective(&minus)) / (2.0 * h as f64);
            let err = (numeric - g[idx] as f64).abs();
            assert!(
                err <= 2e-2 * (1.0 + numeric.abs()),
                "input {k} element {idx}: analytic {} numeric {numeric}",
                g[idx]
            );
        }
    }
}

#[test]
fn linear_backward_matches_finite_differences() {
    grad_check(
        OpKind::Linear { bias: true },
        &[&[3, 5], &[4, 5], &[4]],
        &[&[3, 4]],
        |ins, _| vec![(ins[0].clone(), vec![3, 5]), (ins[1].clone(), vec![4, 5])],
    );
}

#[test]
fn conv2d_backward_matches_finite_differences() {
    let attrs = Conv2dAttrs {
        kernel: [3, 3],
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
        bias: true,
    };
    grad_check(
        OpKind::Conv2d(attrs),
        &[&[2, 3, 5, 4], &[4, 3, 3, 3], &[4]],
        &[&[2, 4, 3, 4]],
        |ins, _| {
            vec![
                (ins[0].clone(), vec![2, 3, 5, 4]),
                (ins[1].clone(), vec![4, 3, 3, 3]),
            ]
        },
    );
}

#[test]
fn batch_norm_backward_matches_finite_differences() {
    grad_check(
        OpKind::BatchNorm { eps: 1e-5 },
        &[&[4, 3, 2, 2], &[3], &[3]],
        &[&[4, 3, 2, 2], &[3], &[3]],
        |ins, outs| {
            vec![
                (ins[0].clone(), vec![4, 3, 2, 2]),
                (ins[1].clone(), vec![3]),
                (outs[1].clone(), vec![3]),
                (outs[2].clone(), vec![3]),
            ]
        },
    );
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    grad_check(
        OpKind::LayerNorm { eps: 1e-5 },
        &[&[3, 6], &[6], &[6]],
        &[&[3, 6], &[3, 1], &[3, 1]],
        |ins, outs| {
            vec![
                (ins[0].clone(), vec![3, 6]),
                (ins[1].clone(), vec![6]),
                (ins[2].clone(), vec![6]),
                (outs[1].clone(), vec![3, 1]),
                (outs[2].clone(), vec![3, 1]),
            ]
        },
    );
}

#[test]
fn matmul_backward_matches_finite_differences() {
    grad_check(
        OpKind::MatMul {
            transpose_b: true,
            scale: 0.5,
        },
        &[&[2, 3, 4], &[2, 5, 4]],
        &[&[2, 3, 5]],
        |ins, _| {
            vec![
                (ins[0].clone(), vec![2, 3, 4]),
                (ins[1].clone(), vec![2, 5, 4]),
            ]
        },
    );
}

#[test]
fn softmax_and_gelu_backward_match_finite_differences() {
    grad_check(OpKind::Softmax, &[&[3, 5]], &[&[3, 5]], |_, outs| {
        vec![(outs[0].clone(), vec![3, 5])]
    });
    grad_check(OpKind::Gelu, &[&[7]], &[&[7]], |ins, _| {
        vec![(ins[0].clone(), vec![7])]
    });
}

#[test]
fn silu_and_broadcast_mul_backward_match_finite_differences() {
    grad_check(OpKind::Silu, &[&[7]], &[&[7]], |ins, _| {
        vec![(ins[0].clone(), vec![7])]
    });
    // Squeeze-and-excitation's scale: [n, c, h, w] * [n, c, 1, 1].
    grad_check(
        OpKind::Mul,
        &[&[2, 3, 2, 2], &[2, 3, 1, 1]],
        &[&[2, 3, 2, 2]],
        |ins, _| {
            vec![
                (ins[0].clone(), vec![2, 3, 2, 2]),
                (ins[1].clone(), vec![2, 3, 1, 1]),
            ]
        },
    );
    // Same shapes still multiply element by element.
    grad_check(OpKind::Mul, &[&[5], &[5]], &[&[5]], |ins, _| {
        vec![(ins[0].clone(), vec![5]), (ins[1].clone(), vec![5])]
    });
}

#[test]
fn pooling_backward_matches_finite_differences() {
    // A 3x3 window with stride 2 and padding 1: windows overlap and some
    // fall partly in the padding, which the divisor still counts.
    let pool = Pool2dAttrs {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        ceil_mode: false,
    };
    grad_check(
        OpKind::AvgPool2d(pool),
        &[&[2, 3, 5, 5]],
        &[&[2, 3, 3, 3]],
        |ins, _| vec![(ins[0].clone(), vec![2, 3, 5, 5])],
    );
    grad_check(
        OpKind::GlobalAvgPool,
        &[&[2, 3, 4, 4]],
        &[&[2, 3, 1, 1]],
        |ins, _| vec![(ins[0].clone(), vec![2, 3, 4, 4])],
    );
}

#[test]
fn operands_of_the_wrong_rank_are_errors_not_panics() {
    let pool = Pool2dAttrs {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
        ceil_mode: false,
    };
    let input = vec![bytes(&values(16, 1))];
    for kind in [
        OpKind::AvgPool2d(pool),
        OpKind::GlobalAvgPool,
        OpKind::Conv2d(Conv2dAttrs {
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: false,
        }),
    ] {
        let ins: &[&[u64]] = if matches!(kind, OpKind::Conv2d(_)) {
            &[&[4, 4], &[1, 1]]
        } else {
            &[&[4, 4]]
        };
        let raw: Vec<Vec<u8>> = ins
            .iter()
            .map(|s| bytes(&values(s.iter().product::<u64>() as usize, 1)))
            .collect();
        let err = run_kernel(&call(kind.clone(), ins, &[&[2, 2]]), &raw)
            .expect_err("a 2-D operand is refused");
        assert!(err.contains("4-D"), "{kind:?}: {err}");
    }
    let max = call(OpKind::MaxPool2d(pool), &[&[4, 4]], &[&[2, 2], &[2, 2]]);
    let err = run_kernel(&max, &input).expect_err("a 2-D max pool is refused");
    assert!(err.contains("4-D"), "{err}");
    // Concatenation along an axis the operands do not have.
    let cat = call(OpKind::Concat { axis: 3 }, &[&[4, 4]], &[&[4, 4]]);
    let err = run_kernel(&cat, &input).expect_err("axis 3 of 2-D operands is refused");
    assert!(err.contains("axis 3"), "{err}");
}

#[test]
fn synthetic_kernel_is_deterministic() {
    let c = call(
        OpKind::Named {
            name: "aten.weird_op.default".into(),
        },
        &[&[8]],
        &[&[4], &[2]],
    );
    let input = vec![bytes(&values(8, 3))];
    let (a, synthetic) = run_kernel(&c, &input).expect("runs");
    let (b, _) = run_kernel(&c, &input).expect("runs");
    assert!(synthetic);
    assert_eq!(a, b);
    assert_eq!(a[0].len(), 16);
    let other = vec![bytes(&values(8, 100_000))];
    assert_ne!(run_kernel(&c, &other).expect("runs").0, a);
}
