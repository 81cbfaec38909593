//! Sizes near the limits of the engine's arithmetic: requests up to `u64::MAX`, and devices
//! of up to 2^62 bytes (whose expandable reservation is 1.125 times that). Every request
//! answers with a block or an out-of-memory error, never an arithmetic overflow, and the
//! statistics stay consistent.

use crate::common::engine_support;
use engine_support::{setup, stat};

const TIB: u64 = 1 << 40;

/// Sizes the device cannot hold: answered before any page is mapped.
const BEYOND: [u64; 5] = [
    (1 << 62) + 1,
    1 << 63,
    u64::MAX / 2,
    u64::MAX - (1 << 21),
    u64::MAX,
];

/// Allocate each of `sizes` on a `capacity`-byte device and free it. While a block is live the
/// statistics count it: its requested bytes exactly, at least its size allocated and at least
/// that reserved (cached segments of earlier sizes included); with `exact` (sizes the
/// configuration does not round) allocated equals the size.
fn probe(conf: &str, capacity: u64, sizes: &[u64], exact: bool) {
    let (_dev, a) = setup(conf, capacity);
    for &size in sizes {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.malloc(0, size, 0, 0)));
        match r {
            Ok(Ok(p)) => {
                // Every size that fits a device here is below 2^63.
                let size = size as i64;
                assert_eq!(stat(&a, "requested_bytes.all.current"), size, "{conf}");
                assert_eq!(stat(&a, "allocation.all.current"), 1, "{conf}");
                let allocated = stat(&a, "allocated_bytes.all.current");
                let reserved = stat(&a, "reserved_bytes.all.current");
                assert!(
                    allocated >= size && reserved >= allocated,
                    "{conf}: {size} bytes live, {allocated} allocated, {reserved} reserved"
                );
                if exact {
                    assert_eq!(allocated, size, "{conf}: {size} bytes");
                }
                a.free(p, 0, 0).expect("free of a block just allocated");
            }
            Ok(Err(_)) => assert!(
                size > capacity,
                "{conf}: {size} bytes fit a {capacity}-byte device"
            ),
            Err(_) => panic!("{conf}: malloc of {size} bytes on a {capacity}-byte device panicked"),
        }
    }
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 0);
    a.empty_cache();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
}

#[test]
fn requests_beyond_any_device_return_out_of_memory_in_every_configuration() {
    for conf in [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
        "expandable_segments:True,roundup_power2_divisions:8",
        "garbage_collection_threshold:0.5",
    ] {
        for capacity in [64 * TIB, 1 << 62] {
            // An expandable growth maps 20 MiB pages until the device refuses one: a request
            // inside the 1.125x reservation of a 2^62-byte device would map billions of
            // (fake) pages first. Those sizes are left to the ordinary configurations.
            let sizes: Vec<u64> = BEYOND
                .iter()
                .copied()
                .filter(|&s| !conf.contains("expandable") || s > capacity + capacity / 8)
                .collect();
            probe(conf, capacity, &sizes, false);
        }
    }
}

#[test]
fn ordinary_segments_of_tens_of_tib_are_counted_exactly() {
    probe("", 64 * TIB, &[38 * TIB, 63 * TIB, 64 * TIB], true);
    probe(
        "max_split_size_mb:128",
        1 << 62,
        &[38 * TIB, 1 << 61, 1 << 62],
        true,
    );
}
