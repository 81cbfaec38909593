//! The cache cap (`max_cached_mb`, `max_cached_fraction`; `alloc/cap.rs`): after a free (and
//! a malloc) the cached bytes are within the cap unless no whole free segment or page is
//! left, the
//! segments cached longest go first, each release is counted and recorded as a
//! `segment_free`, pending frees are never released, and the seed scenario keeps working.

use crate::common::engine_support;
use engine_support::{setup, setup_recorded, stat, VecSink};

use cushim::alloc::info::BlockState;
use cushim::alloc::CachingAllocator;
use cushim::trace::event::Action;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn cached(a: &CachingAllocator) -> u64 {
    (stat(a, "reserved_bytes.all.current") - stat(a, "active_bytes.all.current")) as u64
}

/// Free bytes in segments (or mapped ranges) that hold no active block: what the cap can
/// still release.
fn whole_free_bytes(a: &CachingAllocator) -> u64 {
    a.segments(0)
        .iter()
        .filter(|s| s.blocks.iter().all(|b| b.state == BlockState::Inactive))
        .map(|s| s.total_size)
        .sum()
}

fn segment_frees(sink: &VecSink) -> Vec<u64> {
    sink.0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.action == Action::SegmentFree)
        .map(|e| e.addr)
        .collect()
}

/// Sizes of 20 MiB and more with `max_split_size_mb:20`: every block is a whole segment, so
/// the cap can always be met and the cached bytes never exceed it after a free.
#[test]
fn cached_bytes_never_exceed_the_cap_after_a_free() {
    let (_dev, a) = setup("max_split_size_mb:20,max_cached_mb:100", 8 * GIB);
    let mut rng = fastrand::Rng::with_seed(11);
    let mut live = Vec::new();
    let mut over_before_cap = 0;
    for _ in 0..3_000 {
        if live.is_empty() || (live.len() < 24 && rng.bool()) {
            let n = rng.u64(20 * MIB..=120 * MIB);
            live.push(a.malloc(0, n, 0, 0).unwrap());
        } else {
            let p = live.swap_remove(rng.usize(..live.len()));
            a.free(p, 0, 0).unwrap();
            let c = cached(&a);
            assert!(c <= 100 * MIB, "{c} cached bytes after a free");
            over_before_cap += u64::from(c + 20 * MIB > 100 * MIB);
        }
    }
    assert!(stat(&a, "num_cache_cap_releases") > 0);
    assert!(over_before_cap > 0, "the cache never came near the cap");
}

/// Mixed sizes, split segments: after a free the cache is within the cap, or every whole
/// free segment is gone (what is left is free space in segments still in use).
#[test]
fn over_the_cap_only_free_space_of_segments_in_use_remains() {
    for conf in [
        "max_cached_mb:48",
        "max_cached_fraction:0.02",
        "max_cached_mb:48,expandable_segments:True",
    ] {
        let (_dev, a) = setup(conf, 2 * GIB);
        let cap = if conf.contains("fraction") {
            (2.0 * GIB as f64 * 0.02) as u64
        } else {
            48 * MIB
        };
        let mut rng = fastrand::Rng::with_seed(12);
        let mut live = Vec::new();
        for step in 0..1_500 {
            if live.is_empty() || (live.len() < 40 && rng.u8(..) < 140) {
                let n = if rng.u8(..) < 180 {
                    rng.u64(1..=MIB)
                } else {
                    rng.u64(MIB..=40 * MIB)
                };
                live.push(a.malloc(0, n, 0, 0).unwrap());
            } else {
                let p = live.swap_remove(rng.usize(..live.len()));
                a.free(p, 0, 0).unwrap();
                let c = cached(&a);
                if c > cap {
                    assert_eq!(
                        whole_free_bytes(&a),
                        0,
                        "{conf}: step {step}: {c} cached with whole free memory left"
                    );
                }
            }
        }
        assert!(stat(&a, "num_cache_cap_releases") > 0, "{conf}");
    }
}

/// Three 20 MiB segments freed in the order B, A, C with a 20 MiB cap: the free of A
/// releases B (cached longest), the free of C releases A; C stays cached.
#[test]
fn the_segments_cached_longest_go_first() {
    let (_dev, a, sink) = setup_recorded("max_cached_mb:20", 4 * GIB);
    let pa = a.malloc(0, 20 * MIB, 0, 0).unwrap();
    let pb = a.malloc(0, 20 * MIB, 0, 0).unwrap();
    let pc = a.malloc(0, 20 * MIB, 0, 0).unwrap();
    a.free(pb, 0, 0).unwrap();
    assert!(
        segment_frees(&sink).is_empty(),
        "20 MiB cached is within the cap"
    );
    a.free(pa, 0, 0).unwrap();
    assert_eq!(segment_frees(&sink), vec![pb]);
    a.free(pc, 0, 0).unwrap();
    assert_eq!(segment_frees(&sink), vec![pb, pa]);
    assert_eq!(cached(&a), 20 * MIB);
    assert_eq!(stat(&a, "num_cache_cap_releases"), 2);
    assert_eq!(stat(&a, "num_device_free"), 2);
    // The block still cached serves the next request without a device call.
    assert_eq!(a.malloc(0, 20 * MIB, 0, 0).unwrap(), pc);
    assert_eq!(stat(&a, "num_device_alloc"), 3);
}

/// Expandable segments: whole free pages are unmapped to meet the cap.
#[test]
fn free_expandable_pages_are_released_to_meet_the_cap() {
    let (_dev, a) = setup("expandable_segments:True,max_cached_mb:0", 4 * GIB);
    let ps: Vec<_> = (0..3)
        .map(|_| a.malloc(0, 20 * MIB, 0, 0).unwrap())
        .collect();
    let mapped = stat(&a, "reserved_bytes.all.current") as u64;
    assert!(mapped >= 60 * MIB);
    for p in ps {
        a.free(p, 0, 0).unwrap();
    }
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert!(stat(&a, "num_cache_cap_releases") > 0);
}

/// A block whose free waits on queued work is not cached memory: the cap never releases it.
#[test]
fn pending_frees_are_never_released_by_the_cap() {
    let (dev, a) = setup("free_sync:event,max_cached_mb:0", 4 * GIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 20 * MIB, 0x77, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 20 * MIB);
    assert_eq!(stat(&a, "num_cache_cap_releases"), 0);
    assert_eq!(dev.counters().free, 0);
    // Once its free completed (the next malloc that finds nothing covers it with an event,
    // which now completes, and returns it to the pool), it is cached memory: the cap
    // releases it right after that malloc, and the malloc's own block once it is freed.
    dev.set_auto_complete(true);
    let q = a.malloc(0, 4096, 0x77, 0).unwrap();
    assert_eq!(
        dev.counters().free,
        1,
        "the completed block goes back after the malloc"
    );
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 2 * MIB);
    a.free_async(q, 0x77, 0, 0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(stat(&a, "num_cache_cap_releases"), 2);
}

/// The seed scenario (8 x 16 MiB, free all, 4 x 32 MiB) with the cap on: without it
/// 256 MiB stay reserved; a 64 MiB cap keeps the 4 segments freed last (192 MiB); a cap of 0
/// caches nothing (128 MiB).
#[test]
fn seed_scenario_with_the_cap_reserves_what_the_cap_keeps() {
    for (conf, reserved, releases) in [
        ("", 256, 0),
        ("max_cached_mb:64", 192, 4),
        ("max_cached_mb:0", 128, 8),
    ] {
        let (_dev, a, sink) = setup_recorded(conf, 4 * GIB);
        let first: Vec<_> = (0..8)
            .map(|_| a.malloc(0, 16 * MIB, 0, 0).unwrap())
            .collect();
        for &p in &first {
            a.free(p, 0, 0).unwrap();
            assert!(conf.is_empty() || cached(&a) <= 64 * MIB, "{conf}");
        }
        // Oldest first: the segments freed first are the ones released.
        let expected: Vec<u64> = first.iter().copied().take(releases).collect();
        assert_eq!(segment_frees(&sink), expected, "{conf}");
        for _ in 0..4 {
            a.malloc(0, 32 * MIB, 0, 0).unwrap();
        }
        assert_eq!(
            stat(&a, "reserved_bytes.all.current") as u64,
            reserved * MIB,
            "{conf}"
        );
        assert_eq!(
            stat(&a, "num_cache_cap_releases"),
            releases as i64,
            "{conf}"
        );
    }
}
