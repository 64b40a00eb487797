//! The deterministic stand-in for op kinds without a real kernel.

use crate::backend::{KernelCall, fnv1a};
use outcore_graph::DType;

/// Bytes of each end of an input that the synthetic kernel hashes.
pub const SYNTHETIC_SAMPLE_BYTES: usize = 4096;

/// Deterministic bytes for outputs of op kinds without a real kernel. The seed
/// hashes the op id and, per input, its length and up to
/// [`SYNTHETIC_SAMPLE_BYTES`] from each end (hashing every byte would cost far more
/// than the op's modelled time on large graphs; `--check` still checksums whole
/// tensors). Outputs tile one generated 64 KiB block of small floats (never NaN);
/// integer outputs are zeros.
pub(super) fn outputs(call: &KernelCall, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
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

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
pub(super) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
