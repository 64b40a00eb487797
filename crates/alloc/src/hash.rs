//! A fast hasher for `u64`-like keys (ids, addresses); the maps are internal,
//! keys are not attacker controlled, so SipHash's DoS resistance buys nothing
//! and costs a large share of the per-operation time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative (Fx-style) hasher.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        // murmur3's fmix64: addresses are multiples of 512, so the low bits
        // of the raw product would be constant and all keys would share a
        // bucket; the finaliser spreads every input bit over the output.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        // Rotate-xor-multiply as in rustc's FxHasher.
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<U64Hasher>>;
