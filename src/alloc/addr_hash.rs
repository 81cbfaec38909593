//! A fast hasher for the live-block map, whose keys are device addresses (`u64`).
//!
//! Invariant: hashing is deterministic and every bit of the key reaches both the low bits
//! (hashbrown's bucket index) and the high bits (its 7-bit tag) of the hash.
//!
//! Why not the standard `RandomState` (SipHash-1-3): the map is looked up two or three times
//! per cached malloc+free pair, and SipHash was a large share of the pair's instructions
//! (BENCHMARKS.md, "Measurements behind design choices"). Its protection against chosen-key flooding buys nothing here: the keys are
//! addresses handed out by the driver, not input an attacker chooses. Why not a plain
//! Fx-style multiply: device addresses are multiples of 512, and a single multiply leaves
//! the low 9 bits of the product zero, which would put every block in 1/512 of the buckets.
//! The folded multiply (high half XOR low half of the 128-bit product) mixes both ways.

use std::hash::{BuildHasherDefault, Hasher};

/// An odd 64-bit constant with well-spread bits (from the golden ratio).
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Hasher state: the folded product of the key written last (keys are single `u64`s).
#[derive(Debug, Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Generic fallback (not used by `u64` keys): fold 8 bytes at a time.
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(buf));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n) * u128::from(K);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `BuildHasher` for maps keyed by device address.
pub type AddrBuild = BuildHasherDefault<AddrHasher>;

/// A `HashMap` keyed by device address with [`AddrHasher`].
pub type AddrMap<V> = std::collections::HashMap<crate::device::DevPtr, V, AddrBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_low_and_high_bits() {
        let b = AddrBuild::default();
        let mut low = std::collections::HashSet::new();
        let mut high = std::collections::HashSet::new();
        for i in 0..1024u64 {
            let h = b.hash_one(0x7f00_0000_0000 + i * 512);
            low.insert(h & 1023);
            high.insert(h >> 57);
        }
        // 1024 keys into 1024 low-bit buckets: a good mix fills well over half of them;
        // an unmixed multiply of 512-aligned keys would fill at most 2.
        assert!(low.len() > 600, "low-bit buckets used: {}", low.len());
        assert!(high.len() > 100, "tags used: {}", high.len());
    }

    #[test]
    fn equal_keys_hash_equal() {
        let b = AddrBuild::default();
        assert_eq!(b.hash_one(4096u64), b.hash_one(4096u64));
        assert_ne!(b.hash_one(4096u64), b.hash_one(4608u64));
    }
}
