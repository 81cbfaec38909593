//! The sleep-mode cache against `FakeDevice`: a tag's blocks are cached and split in that
//! tag's own virtual-memory segments (a cached pair makes no driver call, two tags never
//! share a segment), and a pause releases exactly the paused tag's segments, which a resume
//! maps again at the same addresses.

use std::sync::Arc;

use cushim::config::alloc::parse;
use cushim::sleep::{Mode, SleepArena};
use cushim_testsupport::fake_device::FakeDevice;

const MIB: u64 = 1 << 20;

fn arena() -> (Arc<FakeDevice>, SleepArena) {
    let dev = Arc::new(FakeDevice::new(1, 1 << 30));
    let (conf, errs) = parse("sleep_mode:True");
    assert!(errs.is_empty(), "{errs:?}");
    (dev.clone(), SleepArena::new(dev, conf))
}

#[test]
fn a_tags_blocks_share_its_segments_a_cached_pair_calls_no_driver_and_tags_never_share() {
    let (dev, a) = arena();
    let w1 = a.alloc_tagged(0, MIB, Some("weights")).expect("first");
    assert_eq!(
        w1.new_segment,
        Some((w1.ptr, 2 * MIB)),
        "small pool: a 2 MiB segment"
    );
    let w2 = a
        .alloc_tagged(0, 512 << 10, Some("weights"))
        .expect("second");
    assert_eq!(w2.new_segment, None, "split from the same segment");
    assert_eq!(w2.ptr, w1.ptr + MIB);
    let k = a
        .alloc_tagged(0, 4096, Some("kv_cache"))
        .expect("other tag");
    let (kbase, _) = k.new_segment.expect("another tag gets its own segment");
    assert!(kbase >= w1.ptr + 2 * MIB || kbase + 2 * MIB <= w1.ptr);
    let before = dev.counters();
    for _ in 0..100 {
        let g = a
            .alloc_tagged(0, 300 << 10, Some("weights"))
            .expect("cached");
        assert_eq!(g.new_segment, None);
        assert_eq!(a.free(g.ptr), Some(None));
    }
    let after = dev.counters();
    assert_eq!(
        (after.reserve, after.create_physical, after.map, after.unmap),
        (
            before.reserve,
            before.create_physical,
            before.map,
            before.unmap
        ),
        "cached pairs make no driver call"
    );
    let tags: Vec<String> = a.list().into_iter().map(|r| r.tag).collect();
    assert_eq!(tags.len(), 2);
    assert!(tags.contains(&"weights".to_string()) && tags.contains(&"kv_cache".to_string()));
    assert_eq!(a.free(w1.ptr + 4096), None, "not a block start: not ours");
}

#[test]
fn a_pause_releases_only_the_tags_segments_and_a_resume_maps_them_at_the_same_addresses() {
    let (dev, a) = arena();
    let w = a
        .alloc_tagged(0, 24 * MIB, Some("weights"))
        .expect("weights");
    let idle = a
        .alloc_tagged(0, 3 * MIB, Some("weights"))
        .expect("idle segment");
    assert!(idle.new_segment.is_some());
    assert_eq!(a.free(idle.ptr), Some(None), "cached, not released");
    let k = a.alloc_tagged(0, 3 * MIB, Some("kv_cache")).expect("kv");
    let mapped = dev.mapped_bytes(0);
    assert_eq!(mapped, 24 * MIB + 20 * MIB + 20 * MIB);
    let out = a.pause(Some("weights"), Mode::Discard).expect("pause");
    assert_eq!(out.bytes, 24 * MIB, "the segment in use is paused");
    assert_eq!(out.released.len(), 1, "the fully free segment went back");
    assert_eq!(dev.mapped_bytes(0), 20 * MIB, "the other tag stays mapped");
    assert_eq!(a.paused_bytes(Some("weights")), 24 * MIB);
    assert_eq!(a.paused_bytes(Some("kv_cache")), 0);
    // An allocation in the paused tag gets a new live segment, never a paused block.
    let more = a.alloc_tagged(0, MIB, Some("weights")).expect("more");
    assert!(more.new_segment.is_some());
    assert!(more.ptr < w.ptr || more.ptr >= w.ptr + 24 * MIB);
    let out = a.resume(None).expect("resume");
    assert_eq!(out.bytes, 24 * MIB);
    assert_eq!(
        out.changed,
        vec![(0, w.ptr)],
        "mapped again at the same address"
    );
    assert_eq!(a.paused_bytes(None), 0);
    assert_eq!(a.free(w.ptr), Some(None));
    assert_eq!(a.free(k.ptr), Some(None));
    assert_eq!(a.free(more.ptr), Some(None));
    assert_eq!(a.empty_cache().len(), 3);
    assert_eq!(dev.mapped_bytes(0), 0);
    let c = dev.counters();
    assert_eq!(c.reserve, c.release_reservation);
    assert_eq!(c.create_physical, c.release_physical);
}
