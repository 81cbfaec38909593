//! The checksum of a host backup: computed when the bytes reach host memory, checked before
//! they go back to the device, so a backup changed in between (a stray write, a bad page) is
//! an error at resume, never silently restored.
//!
//! Policy: four independent multiply-rotate lanes over 8-byte words (the lanes let the CPU
//! overlap the multiplies, so the sum runs near memory speed), then the tail bytes and the
//! length. Not cryptographic: it detects corruption, not an adversary.

const K: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
];

#[inline(always)]
fn mix(h: u64, w: u64, k: u64) -> u64 {
    (h ^ w).wrapping_mul(k).rotate_left(29)
}

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut lanes = K;
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&c[i * 8..i * 8 + 8]);
            *lane = mix(*lane, u64::from_le_bytes(w), K[i]);
        }
    }
    let mut h = bytes.len() as u64;
    for (i, lane) in lanes.iter().enumerate() {
        h = mix(h, *lane, K[i]);
    }
    for (i, b) in chunks.remainder().iter().enumerate() {
        h = mix(h, u64::from(*b) | ((i as u64) << 8), K[i % 4]);
    }
    h
}

/// Bytes per piece of a streamed checksum: a copy moves one piece, and the piece is summed
/// while it is still in the CPU's cache.
pub const PIECE: usize = 4 << 20;

/// The checksum of a buffer summed piece by piece ([`PIECE`] bytes each, in order): the
/// same whether computed at once ([`checksum_pieces`]) or as the pieces arrive ([`fold`]).
pub fn fold(acc: u64, piece: &[u8]) -> u64 {
    mix(acc, checksum(piece), K[0])
}

/// [`fold`] over every piece of `bytes`, from 0.
pub fn checksum_pieces(bytes: &[u8]) -> u64 {
    bytes.chunks(PIECE).fold(0, fold)
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn any_changed_byte_or_length_changes_the_checksum() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let base = checksum(&data);
        for at in [0, 31, 32, 500, 999] {
            let mut d = data.clone();
            d[at] ^= 1;
            assert_ne!(checksum(&d), base, "byte {at}");
        }
        assert_ne!(checksum(&data[..999]), base);
        assert_eq!(checksum(&data), base);
    }
}
