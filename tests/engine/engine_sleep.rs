//! The sleep-mode cache against `FakeDevice`: a tag's blocks are cached and split in that
//! tag's own virtual-memory segments (a cached pair makes no driver call, two tags never
//! share a segment), and a pause releases exactly the paused tag's segments, which a resume
//! maps again at the same addresses.

use std::sync::Arc;

use cushim::alloc::CachingAllocator;
use cushim::config::alloc::parse;
use cushim::sleep::{Mode, SleepArena};
use cushim::trace::event::{Action, EventSink, NullSink, NO_STACK};
use cushim_testsupport::fake_device::FakeDevice;

use crate::common::engine_support::VecSink;

const MIB: u64 = 1 << 20;

/// The sleep cache on a fake device, beside the main cache whose stream ordering it follows,
/// both recording into `sink` when given.
fn arena_with(sink: Option<VecSink>) -> (Arc<FakeDevice>, SleepArena, CachingAllocator) {
    let dev = Arc::new(FakeDevice::new(1, 1 << 30));
    let (conf, errs) = parse("sleep_mode:True");
    assert!(errs.is_empty(), "{errs:?}");
    let make = move |_| -> Box<dyn EventSink> {
        match &sink {
            Some(s) => Box::new(s.clone()),
            None => Box::new(NullSink),
        }
    };
    let main = CachingAllocator::new(dev.clone(), conf.clone(), &make);
    (dev.clone(), SleepArena::new(dev, conf, &make), main)
}

fn arena() -> (Arc<FakeDevice>, SleepArena, CachingAllocator) {
    arena_with(None)
}

#[test]
fn a_tags_blocks_share_its_segments_a_cached_pair_calls_no_driver_and_tags_never_share() {
    let (dev, a, main) = arena();
    let w1 = a
        .alloc_tagged(0, MIB, Some("weights"), NO_STACK, &main)
        .expect("first");
    assert_eq!(
        w1.new_segment,
        Some((w1.ptr, 2 * MIB)),
        "small pool: a 2 MiB segment"
    );
    let w2 = a
        .alloc_tagged(0, 512 << 10, Some("weights"), NO_STACK, &main)
        .expect("second");
    assert_eq!(w2.new_segment, None, "split from the same segment");
    assert_eq!(w2.ptr, w1.ptr + MIB);
    let k = a
        .alloc_tagged(0, 4096, Some("kv_cache"), NO_STACK, &main)
        .expect("other tag");
    let (kbase, _) = k.new_segment.expect("another tag gets its own segment");
    assert!(kbase >= w1.ptr + 2 * MIB || kbase + 2 * MIB <= w1.ptr);
    let before = dev.counters();
    for _ in 0..100 {
        let g = a
            .alloc_tagged(0, 300 << 10, Some("weights"), NO_STACK, &main)
            .expect("cached");
        assert_eq!(g.new_segment, None);
        assert_eq!(a.free(g.ptr, NO_STACK, &main), Some(None));
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
    assert_eq!(
        a.free(w1.ptr + 4096, NO_STACK, &main),
        None,
        "not a block start: not ours"
    );
}

#[test]
fn a_pause_releases_only_the_tags_segments_and_a_resume_maps_them_at_the_same_addresses() {
    let (dev, a, main) = arena();
    let w = a
        .alloc_tagged(0, 24 * MIB, Some("weights"), NO_STACK, &main)
        .expect("weights");
    let idle = a
        .alloc_tagged(0, 3 * MIB, Some("weights"), NO_STACK, &main)
        .expect("idle segment");
    assert!(idle.new_segment.is_some());
    assert_eq!(
        a.free(idle.ptr, NO_STACK, &main),
        Some(None),
        "cached, not released"
    );
    let k = a
        .alloc_tagged(0, 3 * MIB, Some("kv_cache"), NO_STACK, &main)
        .expect("kv");
    let mapped = dev.mapped_bytes(0);
    assert_eq!(mapped, 24 * MIB + 20 * MIB + 20 * MIB);
    let out = a.pause(Some("weights"), Mode::Discard).expect("pause");
    assert_eq!(out.bytes, 24 * MIB, "the segment in use is paused");
    assert_eq!(out.released.len(), 1, "the fully free segment went back");
    assert_eq!(dev.mapped_bytes(0), 20 * MIB, "the other tag stays mapped");
    assert_eq!(a.paused_bytes(Some("weights")), 24 * MIB);
    assert_eq!(a.paused_bytes(Some("kv_cache")), 0);
    // An allocation in the paused tag gets a new live segment, never a paused block.
    let more = a
        .alloc_tagged(0, MIB, Some("weights"), NO_STACK, &main)
        .expect("more");
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
    assert_eq!(a.free(w.ptr, NO_STACK, &main), Some(None));
    assert_eq!(a.free(k.ptr, NO_STACK, &main), Some(None));
    assert_eq!(a.free(more.ptr, NO_STACK, &main), Some(None));
    assert_eq!(a.empty_cache().len(), 3);
    assert_eq!(dev.mapped_bytes(0), 0);
    let c = dev.counters();
    assert_eq!(c.reserve, c.release_reservation);
    assert_eq!(c.create_physical, c.release_physical);
}

#[test]
fn with_a_non_blocking_stream_a_freed_block_is_reused_only_after_the_main_caches_barrier() {
    let (dev, a, main) = arena();
    // 12 MiB in a 20 MiB segment: the tail cannot serve a second one. The fake GPU lags: no stream is ever idle and no event completes by itself.
    dev.set_auto_complete(false);
    let g = a
        .alloc_tagged(0, 12 * MIB, Some("w"), NO_STACK, &main)
        .expect("first");
    // The stream's appearance orders the work queued so far (one barrier).
    main.stream_created(0, 0x77, true);
    let issued = main.barriers(0).0;
    assert_eq!(a.free(g.ptr, NO_STACK, &main), Some(None));
    assert_eq!(main.barriers(0).0, issued, "a free issues nothing");
    let (records, waits) = {
        let c = dev.counters();
        (c.record_event, c.stream_wait_event)
    };
    let h = a
        .alloc_tagged(0, 12 * MIB, Some("w"), NO_STACK, &main)
        .expect("again");
    assert_eq!(h.new_segment, None, "served from the cache");
    assert_eq!(h.ptr, g.ptr, "the freed block, once ordered");
    assert_eq!(
        main.barriers(0).0,
        issued + 1,
        "one barrier before the block was handed out again"
    );
    let c = dev.counters();
    assert_eq!(
        (c.record_event - records, c.stream_wait_event - waits),
        (2, 2),
        "the barrier over the stream: 3n + 1 calls for n = 1"
    );
    // Freed and asked for again while a stream captures: no barrier can be recorded, so
    // the waiting block is never handed out; a new segment serves the request.
    assert_eq!(a.free(h.ptr, NO_STACK, &main), Some(None));
    dev.set_capturing(0x77, true);
    let k = a
        .alloc_tagged(0, 12 * MIB, Some("w"), NO_STACK, &main)
        .expect("while capturing");
    assert_ne!(
        k.ptr, g.ptr,
        "a waiting block is not reused without ordering"
    );
    assert!(k.new_segment.is_some());
}

#[test]
fn without_streams_a_freed_block_is_reused_at_once_in_the_legacy_streams_order() {
    let (dev, a, main) = arena();
    dev.set_auto_complete(false);
    let g = a
        .alloc_tagged(0, 12 * MIB, Some("w"), NO_STACK, &main)
        .expect("first");
    assert_eq!(a.free(g.ptr, NO_STACK, &main), Some(None));
    let h = a
        .alloc_tagged(0, 12 * MIB, Some("w"), NO_STACK, &main)
        .expect("again");
    assert_eq!(h.ptr, g.ptr);
    assert_eq!(main.barriers(0).0, 0, "nothing to order");
    assert_eq!(dev.counters().record_event, 0);
}

#[test]
fn each_malloc_and_free_is_recorded_with_its_stack_and_the_snapshot_lists_blocks_in_segments() {
    let sink = VecSink::default();
    let (_dev, a, main) = arena_with(Some(sink.clone()));
    let p = a
        .alloc_tagged(0, 4096, Some("w"), 11, &main)
        .expect("first")
        .ptr;
    let q = a
        .alloc_tagged(0, 8192, Some("w"), 12, &main)
        .expect("cached")
        .ptr;
    assert_eq!(a.free(p, 13, &main), Some(None));
    let r = a
        .alloc_tagged(0, 4096, Some("w"), 14, &main)
        .expect("cached again");
    assert_eq!(r.ptr, p, "served from the cache, no driver call");
    let evs: Vec<(Action, u64, u64, u32)> = sink
        .0
        .lock()
        .expect("sink")
        .iter()
        .map(|e| (e.action, e.addr, e.size, e.stack))
        .collect();
    let seg = r.ptr;
    assert_eq!(
        evs,
        vec![
            (Action::SegmentAlloc, seg, 2 * MIB, 11),
            (Action::Alloc, p, 4096, 11),
            (Action::Alloc, q, 8192, 12),
            (Action::FreeRequested, p, 4096, 13),
            (Action::FreeCompleted, p, 4096, 11),
            (Action::Alloc, p, 4096, 14),
        ]
    );
    assert_eq!(a.events(0).len(), evs.len(), "kept for snapshots");
    let segs = a.segment_blocks(0);
    assert_eq!(segs.len(), 1);
    let (base, stack, blocks) = &segs[0];
    assert_eq!((*base, *stack), (seg, 11));
    let used: Vec<(u64, u64, u32)> = blocks
        .iter()
        .filter(|b| b.state.name() == "active_allocated")
        .map(|b| (b.address, b.requested_size, b.stack))
        .collect();
    assert_eq!(used, vec![(p, 4096, 14), (q, 8192, 12)]);
}
