//! The four smallest sequences on which the engine once decided differently from current
//! PyTorch (`c10/cuda/CUDACachingAllocator.cpp`, `c10/core/AllocatorConfig.cpp`), each with
//! PyTorch's result. `a ID BYTES` is a cudaMalloc, `f ID` a cudaFree.

use crate::common::engine_support;
use engine_support::{setup, setup_recorded, stat};

use cushim::trace::event::Action;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// `[256:1,512:2,>:8]`, `a 1 600000000`: `>` fills from the interval after 512 MiB, so the
/// 572 MiB request keeps 2 divisions and rounds to 768 MiB (576 MiB with 8 divisions).
#[test]
fn roundup_list_gt_entry_starts_after_the_last_named_interval() {
    let (_dev, a) = setup("roundup_power2_divisions:[256:1,512:2,>:8]", 4 * GIB);
    let p = a.malloc(0, 600_000_000, 0, 0).unwrap();
    assert_ne!(p, 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 768 * MIB);
    assert_eq!(stat(&a, "allocated_bytes.all.current") as u64, 768 * MIB);
    // A request of 1 GiB and more does get 8 divisions: 1.1 GiB rounds to 1.125 GiB.
    let q = a.malloc(0, 1100 * MIB, 0, 0).unwrap();
    a.free(q, 0, 0).unwrap();
    assert_eq!(
        stat(&a, "reserved_bytes.all.current") as u64,
        (768 + 1152) * MIB
    );
}

/// GC with threshold 0.6 of half a 4 GiB device. At the last malloc the two cached 400 MiB
/// segments have ages 2 and 1 (pool lookups); PyTorch's average is 1.5, so only the older
/// one goes: 1500 MiB reserved at the end (1100 MiB if both went).
#[test]
fn gc_age_threshold_is_the_real_average() {
    let (_dev, a) = setup(
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
        4 * GIB,
    );
    let p1 = a.malloc(0, 419_430_400, 0, 0).unwrap();
    let p2 = a.malloc(0, 419_430_400, 0, 0).unwrap();
    a.free(p1, 0, 0).unwrap();
    let _p3 = a.malloc(0, 524_288_000, 0, 0).unwrap();
    a.free(p2, 0, 0).unwrap();
    let _p4 = a.malloc(0, 629_145_600, 0, 0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 1500 * MIB);
    assert_eq!(stat(&a, "num_device_free"), 1);
}

/// 2 GiB device; the 2000 MiB request fails until all cached memory goes back, and it goes
/// back large pool first: the 100 MiB segment's `segment_free` precedes the 2 MiB one's.
#[test]
fn release_of_all_cached_memory_frees_the_large_pool_first() {
    let (_dev, a, sink) = setup_recorded("", 2 * GIB);
    let p1 = a.malloc(0, 1000, 0, 0).unwrap();
    let p2 = a.malloc(0, 104_857_600, 0, 0).unwrap();
    a.free(p1, 0, 0).unwrap();
    a.free(p2, 0, 0).unwrap();
    let p3 = a.malloc(0, 2_097_152_000, 0, 0).unwrap();
    assert_ne!(p3, 0);
    let freed: Vec<u64> = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.action == Action::SegmentFree)
        .map(|e| e.size)
        .collect();
    assert_eq!(freed, vec![100 * MIB, 2 * MIB]);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 2000 * MIB);
}

/// `max_split_size_mb:20` is accepted (PyTorch's minimum), so the cached 30 MiB block is
/// oversize and the 12 MiB request gets a segment of its own instead of splitting it.
#[test]
fn max_split_size_of_20_mb_is_accepted_and_applied() {
    let (_dev, a) = setup("max_split_size_mb:20", 4 * GIB);
    let p1 = a.malloc(0, 31_457_280, 0, 0).unwrap();
    a.free(p1, 0, 0).unwrap();
    let p2 = a.malloc(0, 12_582_912, 0, 0).unwrap();
    assert_ne!(p2, p1);
    assert_eq!(stat(&a, "segment.all.current"), 2);
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 42 * MIB);
    assert_eq!(stat(&a, "oversize_segments.current"), 1);
}
