//! Size arithmetic of the caching allocator: request rounding, pool choice, segment sizes.
//!
//! Invariant: every size returned here is a multiple of [`MIN_BLOCK`], and a rounded size is
//! never smaller than the request.

use crate::config::alloc::AllocConf;

/// Smallest block and the rounding unit (512 B).
pub const MIN_BLOCK: u64 = 512;
/// Largest request served from the small pool (1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for large requests below [`MIN_LARGE_ALLOC`], and the oversize window (20 MiB).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests at least this large get a segment of their own size (10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Large segments are rounded up to this (2 MiB).
pub const ROUND_LARGE: u64 = 2 << 20;

/// Round `n` up to a multiple of `unit` (saturating).
#[inline]
pub fn round_up(n: u64, unit: u64) -> u64 {
    n.div_ceil(unit).saturating_mul(unit)
}

/// Next 1/`divisions` step of `size`'s power-of-two interval (divisions rounded down to a
/// power of two); powers of two stay as they are.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let low = size & !(step - 1);
    if low == size {
        size
    } else {
        low.saturating_add(step)
    }
}

/// The block size the allocator hands out for a request of `size` bytes.
#[inline]
pub fn round_size(size: u64, conf: &AllocConf) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let divisions = conf.divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
        // The division step is a multiple of 512 here, so the result is too.
        round_up(next_division(size, divisions), MIN_BLOCK)
    } else {
        round_up(size, MIN_BLOCK)
    }
}

/// Whether a rounded size is served from the small pool.
#[inline]
pub fn is_small(rounded: u64) -> bool {
    rounded <= SMALL_SIZE
}

/// Size of a new segment for a rounded request.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        round_up(rounded, ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::alloc::parse;

    #[test]
    fn requests_round_to_512_bytes() {
        let c = AllocConf::default();
        assert_eq!(round_size(0, &c), 512);
        assert_eq!(round_size(1, &c), 512);
        assert_eq!(round_size(512, &c), 512);
        assert_eq!(round_size(513, &c), 1024);
        assert_eq!(round_size(3 << 20, &c), 3 << 20);
    }

    #[test]
    fn power2_divisions_round_to_the_next_step() {
        let (c, _) = parse("roundup_power2_divisions:4");
        // 1 MiB + 1: interval [1 MiB, 2 MiB) in 4 steps of 256 KiB.
        assert_eq!(round_size((1 << 20) + 1, &c), (1 << 20) + (256 << 10));
        // A power of two stays.
        assert_eq!(round_size(1 << 22, &c), 1 << 22);
        // Small sizes (<= 512 * divisions) use plain rounding.
        assert_eq!(round_size(1500, &c), 1536);
        // 5 MiB: interval [4, 8) in 1 MiB steps.
        assert_eq!(round_size((5 << 20) + 7, &c), 6 << 20);
    }

    #[test]
    fn segment_sizes_follow_the_three_classes() {
        assert_eq!(segment_size(512), 2 << 20);
        assert_eq!(segment_size(1 << 20), 2 << 20);
        assert_eq!(segment_size((1 << 20) + 512), 20 << 20);
        assert_eq!(segment_size((10 << 20) - 512), 20 << 20);
        assert_eq!(segment_size(10 << 20), 10 << 20);
        assert_eq!(segment_size((11 << 20) + 1), 12 << 20);
        assert!(is_small(1 << 20));
        assert!(!is_small((1 << 20) + 512));
    }
}
