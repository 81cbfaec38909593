//! The caching allocator's core rules against `FakeDevice`: rounding, pools, split and
//! coalesce, oversize, the out-of-memory sequence, garbage collection, the memory fraction,
//! free errors, statistics and trace events.

use crate::common::engine_support;
use engine_support::{setup, stat, VecSink};
use std::sync::Arc;

use cushim::alloc::info::BlockState;
use cushim::alloc::{AllocError, CachingAllocator, FreeError};
use cushim::trace::event::{Action, EventSink, NullSink, TraceEvent};
use cushim_testsupport::fake_device::FakeDevice;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn seed_fragmentation_scenario_reserves_256_then_128_mib() {
    // 8 x 16 MiB, free all, 4 x 32 MiB: the 16 MiB blocks cannot serve 32 MiB requests.
    let (dev, a) = setup("", 8 * GIB);
    let ps: Vec<u64> = (0..8)
        .map(|_| a.malloc(0, 16 * MIB, 0, 0).unwrap())
        .collect();
    assert_eq!(
        dev.counters().malloc,
        8,
        "8 cudaMalloc of 16 MiB cost 8 device allocations"
    );
    for p in &ps {
        a.free(*p, 0, 0).unwrap();
    }
    let p = a.malloc(0, 16 * MIB, 0, 0).unwrap();
    assert_eq!(
        dev.counters().malloc,
        8,
        "a cached 16 MiB block serves a new request"
    );
    a.free(p, 0, 0).unwrap();
    for _ in 0..4 {
        a.malloc(0, 32 * MIB, 0, 0).unwrap();
    }
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 256 * MIB as i64);
    assert_eq!(dev.used(0), 256 * MIB);

    // The reverse order: 32 MiB blocks split into 16 MiB halves.
    let (dev, a) = setup("", 8 * GIB);
    let ps: Vec<u64> = (0..4)
        .map(|_| a.malloc(0, 32 * MIB, 0, 0).unwrap())
        .collect();
    for p in &ps {
        a.free(*p, 0, 0).unwrap();
    }
    for _ in 0..8 {
        a.malloc(0, 16 * MIB, 0, 0).unwrap();
    }
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 128 * MIB as i64);
    assert_eq!(dev.used(0), 128 * MIB);
}

#[test]
fn requests_are_rounded_and_pools_chosen_by_size() {
    let (dev, a) = setup("", GIB);
    let p = a.malloc(0, 1, 0, 0).unwrap();
    assert_ne!(p, 0);
    assert_eq!(stat(&a, "allocated_bytes.small_pool.current"), 512);
    assert_eq!(
        stat(&a, "reserved_bytes.small_pool.current"),
        2 * MIB as i64
    );
    assert_eq!(stat(&a, "requested_bytes.small_pool.current"), 1);
    let q = a.malloc(0, MIB, 0, 0).unwrap();
    assert_eq!(
        stat(&a, "segment.small_pool.current"),
        1,
        "1 MiB still fits the small segment"
    );
    assert_eq!(q, p + 512, "the split tail serves the next small request");
    a.malloc(0, MIB + 1, 0, 0).unwrap();
    assert_eq!(
        stat(&a, "reserved_bytes.large_pool.current"),
        20 * MIB as i64
    );
    a.malloc(0, 21 * MIB + 1, 0, 0).unwrap();
    assert_eq!(
        stat(&a, "reserved_bytes.large_pool.current"),
        42 * MIB as i64,
        "22 MiB segment"
    );
    assert_eq!(dev.counters().malloc, 3);
    assert_eq!(a.malloc(0, 0, 0, 0), Ok(0));
}

#[test]
fn power2_divisions_change_the_block_size() {
    let (_dev, a) = setup("roundup_power2_divisions:4", GIB);
    a.malloc(0, 5 * MIB + 7, 0, 0).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 6 * MIB as i64);
}

#[test]
fn large_blocks_split_only_when_more_than_1_mib_remains() {
    let (_dev, a) = setup("", GIB);
    // 19.5 MiB takes a 20 MiB segment whole (0.5 MiB would remain).
    a.malloc(0, 19 * MIB + MIB / 2, 0, 0).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 20 * MIB as i64);
    assert_eq!(stat(&a, "inactive_split.all.current"), 0);
    // 5 MiB in a 20 MiB segment: 15 MiB split off.
    a.malloc(0, 5 * MIB, 0, 0).unwrap();
    assert_eq!(stat(&a, "inactive_split.large_pool.current"), 1);
    assert_eq!(
        stat(&a, "inactive_split_bytes.large_pool.current"),
        15 * MIB as i64
    );
}

#[test]
fn freed_blocks_coalesce_with_free_neighbours_of_their_segment() {
    let (_dev, a) = setup("", GIB);
    let x = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    let y = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    let z = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    assert_eq!((y - x, z - y), (4 * MIB, 4 * MIB));
    a.free(y, 0, 0).unwrap();
    a.free(x, 0, 0).unwrap();
    let seg = &a.segments(0)[0];
    let shape: Vec<(u64, BlockState)> = seg.blocks.iter().map(|b| (b.size, b.state)).collect();
    assert_eq!(
        shape,
        vec![
            (8 * MIB, BlockState::Inactive),
            (4 * MIB, BlockState::ActiveAllocated),
            (8 * MIB, BlockState::Inactive)
        ]
    );
    a.free(z, 0, 0).unwrap();
    let seg = &a.segments(0)[0];
    assert_eq!(seg.blocks.len(), 1);
    assert_eq!(seg.blocks[0].size, 20 * MIB);
    assert_eq!(stat(&a, "inactive_split.all.current"), 0);
}

#[test]
fn blocks_are_reused_only_by_their_own_stream() {
    let (dev, a) = setup("", GIB);
    let p = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let q = a.malloc_async(0, 4 * MIB, 7, 0).unwrap();
    assert_eq!(
        dev.counters().malloc,
        2,
        "stream 7 cannot take stream 0's block"
    );
    a.free_async(q, 7, 0, 0).unwrap();
    assert_eq!(a.malloc_async(0, 4 * MIB, 7, 0).unwrap(), q);
    assert_eq!(a.malloc(0, 4 * MIB, 0, 0).unwrap(), p);
}

#[test]
fn oversize_blocks_serve_only_requests_within_20_mib() {
    let (dev, a) = setup("max_split_size_mb:100", 4 * GIB);
    let big = a.malloc(0, 200 * MIB, 0, 0).unwrap();
    assert_eq!(stat(&a, "oversize_allocations.current"), 1);
    assert_eq!(stat(&a, "oversize_segments.current"), 1);
    a.free(big, 0, 0).unwrap();
    assert_eq!(stat(&a, "oversize_allocations.current"), 0);
    // A small request never takes the oversize block.
    a.malloc(0, 50 * MIB, 0, 0).unwrap();
    assert_eq!(dev.counters().malloc, 2);
    // 150 MiB would waste 50 MiB (>= 20): a new segment.
    a.malloc(0, 150 * MIB, 0, 0).unwrap();
    assert_eq!(dev.counters().malloc, 3);
    // 190 MiB wastes 10 MiB: takes the 200 MiB block whole, unsplit.
    let r = a.malloc(0, 190 * MIB, 0, 0).unwrap();
    assert_eq!(r, big);
    assert_eq!(dev.counters().malloc, 3);
    let seg = a
        .segments(0)
        .into_iter()
        .find(|s| s.address == big)
        .unwrap();
    assert_eq!(seg.blocks.len(), 1);
}

#[test]
fn oom_sequence_releases_the_cache_then_fails_and_recovers() {
    let dev = Arc::new(FakeDevice::new(1, GIB));
    let sink = VecSink::default();
    let s2 = sink.clone();
    let a = CachingAllocator::new(dev.clone(), Default::default(), &move |_| {
        Box::new(s2.clone())
    });
    let p = a.malloc(0, 600 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let q = a.malloc(0, 700 * MIB, 0, 0).unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 700 * MIB as i64);
    assert_eq!(a.malloc(0, 2 * GIB, 0, 0), Err(AllocError::OutOfMemory));
    assert_eq!(stat(&a, "num_ooms"), 1);
    let oom: Vec<TraceEvent> = sink
        .events()
        .into_iter()
        .filter(|e| e.action == Action::Oom)
        .collect();
    assert_eq!(oom.len(), 1);
    assert_eq!(oom[0].size, 2 * GIB);
    assert_eq!(oom[0].device_free, GIB - 700 * MIB);
    // Allocation goes on normally.
    a.free(q, 0, 0).unwrap();
    let r = a.malloc(0, 100 * MIB, 0, 0).unwrap();
    assert_ne!(r, 0);
    a.free(r, 0, 0).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 0);
}

#[test]
fn oversize_cached_blocks_are_released_before_everything_else() {
    let (dev, a) = setup("max_split_size_mb:100", GIB);
    let p = a.malloc(0, 800 * MIB, 0, 0).unwrap();
    let small = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    a.free(small, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    a.malloc(0, 700 * MIB, 0, 0).unwrap();
    assert_eq!(
        stat(&a, "num_alloc_retries"),
        0,
        "the oversize release sufficed"
    );
    assert_eq!(
        dev.counters().free,
        1,
        "only the oversize segment went back"
    );
    assert_eq!(stat(&a, "segment.all.current"), 2);
}

#[test]
fn garbage_collection_releases_old_cached_segments_above_the_threshold() {
    let (dev, a) = setup("garbage_collection_threshold:0.5", GIB);
    let x = a.malloc(0, 300 * MIB, 0, 0).unwrap();
    let y = a.malloc(0, 300 * MIB, 0, 0).unwrap();
    a.free(x, 0, 0).unwrap();
    a.free(y, 0, 0).unwrap();
    a.malloc(0, 350 * MIB, 0, 0).unwrap();
    // Without collection 950 MiB would be reserved (it fits the device).
    assert!(stat(&a, "reserved_bytes.all.current") <= 650 * MIB as i64);
    assert!(dev.counters().free >= 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);

    let (dev, a) = setup("", GIB);
    let x = a.malloc(0, 300 * MIB, 0, 0).unwrap();
    let y = a.malloc(0, 300 * MIB, 0, 0).unwrap();
    a.free(x, 0, 0).unwrap();
    a.free(y, 0, 0).unwrap();
    a.malloc(0, 350 * MIB, 0, 0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 950 * MIB as i64);
    assert_eq!(dev.counters().free, 0);
}

#[test]
fn memory_fraction_limits_reservation_without_a_device_call() {
    let (dev, a) = setup("per_process_memory_fraction:0.5", GIB);
    assert_eq!(a.malloc(0, 600 * MIB, 0, 0), Err(AllocError::OutOfMemory));
    assert_eq!(dev.counters().malloc, 0);
    assert!(a.malloc(0, 400 * MIB, 0, 0).is_ok());
}

#[test]
fn free_reports_foreign_double_and_interior_pointers() {
    let (_dev, a) = setup("", GIB);
    let p = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    assert_eq!(a.free(0xdead_0000, 0, 0), Err(FreeError::NotOurs));
    assert_eq!(a.free(p + 512, 0, 0), Err(FreeError::InvalidValue));
    assert_eq!(a.owner(p), Some(0));
    a.free(p, 0, 0).unwrap();
    assert_eq!(a.free(p, 0, 0), Err(FreeError::InvalidValue));
    assert_eq!(a.owner(0xdead_0000), None);
}

#[test]
fn frees_find_their_device_whatever_the_hint() {
    let dev = Arc::new(FakeDevice::new(2, GIB));
    let a = CachingAllocator::new(dev.clone(), Default::default(), &|_| Box::new(NullSink));
    let p = a.malloc(1, 4 * MIB, 0, 0).unwrap();
    assert_eq!(a.owner(p), Some(1));
    a.free(p, 0, 0).unwrap();
    assert_eq!(a.stats(1)["allocated_bytes.all.current"], 0);
    assert_eq!(a.stats(0)["segment.all.current"], 0);
}

#[test]
fn stats_count_allocations_and_peaks_reset() {
    let (_dev, a) = setup("", GIB);
    let p = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    let q = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let s = a.stats(0);
    assert_eq!(s["allocation.all.current"], 1);
    assert_eq!(s["allocation.all.peak"], 2);
    assert_eq!(s["allocation.all.allocated"], 2);
    assert_eq!(s["allocation.all.freed"], 1);
    assert_eq!(s["active_bytes.large_pool.current"], 4 * MIB as i64);
    assert_eq!(s["segment.all.current"], 1);
    assert_eq!(s["num_device_alloc"], 1);
    a.reset_peak_stats();
    assert_eq!(a.stats(0)["allocation.all.peak"], 1);
    a.free(q, 0, 0).unwrap();
    a.empty_cache();
    let s = a.stats(0);
    assert_eq!(s["reserved_bytes.all.current"], 0);
    assert_eq!(s["num_device_free"], 1);
    assert_eq!(s["reserved_bytes.all.peak"], 20 * MIB as i64);
}

#[test]
fn events_describe_every_state_change_and_the_snapshot_matches() {
    let dev = Arc::new(FakeDevice::new(1, GIB));
    let sink = VecSink::default();
    let s2 = sink.clone();
    let a = CachingAllocator::new(dev.clone(), Default::default(), &move |d| {
        assert!(d == 0 || d == -1);
        Box::new(s2.clone())
    });
    let p = a.malloc(0, 1000, 0, 42).unwrap();
    a.free(p, 0, 43).unwrap();
    let q = a.malloc(0, 3 * MIB, 0, 44).unwrap();
    let acts: Vec<Action> = sink.events().iter().map(|e| e.action).collect();
    assert_eq!(
        acts,
        vec![
            Action::SegmentAlloc,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::SegmentAlloc,
            Action::Alloc
        ]
    );
    let evs = sink.events();
    assert_eq!((evs[1].addr, evs[1].size, evs[1].stack), (p, 1000, 42));
    // Frees carry the requested size, as PyTorch records them.
    assert_eq!((evs[2].size, evs[2].stack), (1000, 43));
    assert_eq!(evs[3].size, 1000);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 2);
    assert_eq!(snap[1].device, -1);
    let segs = &snap[0].segments;
    assert_eq!(segs.len(), 2);
    let large = segs.iter().find(|s| s.is_large).unwrap();
    assert_eq!(large.stack, 44);
    assert_eq!(large.blocks[0].address, q);
    assert_eq!(large.blocks[0].requested_size, 3 * MIB);
    assert_eq!(large.allocated_size(), 3 * MIB);
    assert_eq!(snap[0].events.last().unwrap().action, Action::Snapshot);
}

#[test]
fn device_reset_forgets_live_blocks_and_releases_everything() {
    let (dev, a) = setup("", GIB);
    let _p = a.malloc(0, 4 * MIB, 0, 0).unwrap();
    let q = a.malloc(0, 1000, 0, 0).unwrap();
    a.free(q, 0, 0).unwrap();
    a.device_reset(0);
    assert_eq!(dev.used(0), 0);
    assert_eq!(dev.live_segments(), 0);
    let s = a.stats(0);
    assert_eq!(s["allocated_bytes.all.current"], 0);
    assert_eq!(s["reserved_bytes.all.current"], 0);
    assert!(a.segments(0).is_empty());
    assert!(a.malloc(0, 4 * MIB, 0, 0).is_ok());
}

#[test]
fn mem_get_info_can_count_cached_bytes_as_free() {
    let (_dev, a) = setup("", GIB);
    let p = a.malloc(0, 100 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(a.mem_get_info(0).unwrap(), (GIB - 100 * MIB, GIB));
    let (_dev, a) = setup("free_includes_cache:True", GIB);
    let p = a.malloc(0, 100 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(a.mem_get_info(0).unwrap(), (GIB, GIB));
}

#[test]
fn device_errors_other_than_oom_are_reported_as_such() {
    let (dev, a) = setup("", GIB);
    dev.fail_nth(cushim_testsupport::fake_device::Op::Malloc, 1);
    // The fake reports an injected malloc fault as out of memory: the retry succeeds.
    assert!(a.malloc(0, 4 * MIB, 0, 0).is_ok());
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert!(matches!(
        a.malloc(5, 4 * MIB, 0, 0),
        Err(AllocError::Device(_))
    ));
}

#[test]
fn absurd_sizes_fail_cleanly_with_out_of_memory() {
    for conf in ["", "expandable_segments:True", "roundup_power2_divisions:8"] {
        let (_dev, a) = setup(conf, GIB);
        for size in [u64::MAX, u64::MAX / 2 + 3, 1 << 62] {
            assert_eq!(
                a.malloc(0, size, 0, 0),
                Err(AllocError::OutOfMemory),
                "{conf} {size}"
            );
        }
        assert!(a.malloc(0, 4 * MIB, 0, 0).is_ok());
        assert!(a.host_alloc(u64::MAX, 0, 0).is_err());
    }
}

#[test]
fn the_allocator_can_live_in_a_static_shared_by_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<CachingAllocator>();
    shared::<FakeDevice>();
}
