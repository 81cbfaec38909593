//! A physical handle whose release fails is kept and released later, at
//! the engine level over the fake device: never leaked, never released twice.
use crate::common::engine_support;

use cushim_testsupport::fake_device::Op;
use engine_support::{setup, stat};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[test]
fn a_release_that_fails_three_times_in_a_row_is_done_at_the_next_empty_cache() {
    let (dev, a) = setup("expandable_segments:True", GIB);
    let p = a.malloc(0, 18 * MIB, 0, 0).expect("malloc");
    a.free(p, 0, 0).expect("free");
    assert_eq!(dev.live_handles(), 1);
    // The three immediate tries of this pass fail: the handle is kept, unmapped.
    dev.fail_calls(Op::ReleasePhysical, 1, 3);
    a.empty_cache();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(dev.mapped_bytes(0), 0);
    assert_eq!(dev.live_handles(), 1, "kept for a retry, not dropped");
    // The fault has stopped: one more release of cached memory releases it.
    a.empty_cache();
    assert_eq!((dev.live_handles(), dev.used(0)), (0, 0));
}

#[test]
fn a_persistent_failure_keeps_the_handle_until_the_driver_takes_it() {
    let (dev, a) = setup("expandable_segments:True", GIB);
    let p = a.malloc(0, 40 * MIB, 0, 0).expect("malloc");
    a.free(p, 0, 0).expect("free");
    let pages = dev.live_handles();
    assert!(pages >= 2, "{pages} pages");
    dev.fail_calls(Op::ReleasePhysical, 1, 1000);
    for _ in 0..3 {
        a.empty_cache();
        assert_eq!(dev.live_handles(), pages);
    }
    // The allocator still works meanwhile (growth creates new pages).
    let q = a
        .malloc(0, 4 * MIB, 0, 0)
        .expect("malloc while releases fail");
    a.free(q, 0, 0).expect("free");
    // Stop the fault (the next failure would be a million calls away).
    dev.fail_calls(Op::ReleasePhysical, 1_000_000, 1);
    a.empty_cache();
    assert_eq!((dev.live_handles(), dev.used(0)), (0, 0));
}
