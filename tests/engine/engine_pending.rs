//! Stream safety of freed blocks (`free_sync`): immediate reuse without streams, GPU-side
//! barriers with streams (`auto`, `barrier`), lazy event batches (`event`), device
//! synchronization, capture, stream-ordered frees.

use crate::common::engine_support;
use cushim::alloc::info::BlockState;
use engine_support::{freed_behind_a_stream, pending_blocks, setup};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn auto_without_streams_reuses_at_once_with_no_event_calls() {
    let (dev, a) = setup("", GIB);
    for _ in 0..100 {
        let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
        a.free(p, 0, 0).unwrap();
    }
    assert_eq!(dev.counters().malloc, 1);
    assert_eq!(dev.counters().event_calls(), 0);
    assert_eq!(dev.counters().sync_device, 0);
}

#[test]
fn event_mode_keeps_freed_blocks_pending_until_the_batch_completes() {
    let (dev, a, p) = freed_behind_a_stream("free_sync:event");
    assert_eq!(pending_blocks(&a), 1);
    assert_eq!(
        dev.counters().event_calls(),
        0,
        "a free makes no driver call"
    );
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_ne!(q, p, "the pending block is not handed out");
    assert_eq!(
        a.pending_events_recorded(0),
        2,
        "one event for legacy, one for the stream"
    );
    dev.complete_events();
    let r = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_eq!(r, p, "the completed batch made the block reusable");
    assert_eq!(pending_blocks(&a), 0);
}

#[test]
fn one_batch_covers_every_block_freed_since_the_last_one() {
    let (dev, a) = setup("free_sync:event", 4 * GIB);
    a.stream_created(0, 0x77, true);
    a.stream_created(0, 0x78, false); // blocking: covered by the legacy stream
    let ps: Vec<u64> = (0..50)
        .map(|_| a.malloc(0, 12 * MIB, 0, 0).unwrap())
        .collect();
    for p in &ps {
        a.free(*p, 0, 0).unwrap();
    }
    assert_eq!(dev.counters().record_event, 0);
    // A miss: the 20 MiB segments' tails are free, so ask for something bigger.
    a.malloc(0, 30 * MIB, 0, 0).unwrap();
    assert_eq!(dev.counters().record_event, 2);
    assert_eq!(
        pending_blocks(&a),
        0,
        "events completed at once: all 50 blocks are back"
    );
    // Events come back to the pool: a second round creates none.
    let created = dev.counters().create_event;
    let ps: Vec<u64> = (0..5)
        .map(|_| a.malloc(0, 12 * MIB, 0, 0).unwrap())
        .collect();
    for p in &ps {
        a.free(*p, 0, 0).unwrap();
    }
    a.malloc(0, 300 * MIB, 0, 0).unwrap();
    assert_eq!(dev.counters().record_event, 4);
    assert_eq!(dev.counters().create_event, created);
}

#[test]
fn destroyed_streams_are_no_longer_covered() {
    let (dev, a) = setup("free_sync:event", GIB);
    a.stream_created(0, 0x77, true);
    a.stream_destroyed(0, 0x77);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    a.malloc(0, 30 * MIB, 0, 0).unwrap();
    assert_eq!(dev.counters().record_event, 1);
}

#[test]
fn event_mode_batches_from_the_first_free() {
    let (dev, a) = setup("free_sync:event", GIB);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 1);
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_eq!(dev.counters().record_event, 1, "legacy stream only");
    assert_eq!(q, p, "the event completed at once, so the block was reused");
}

#[test]
fn device_mode_synchronizes_instead_of_recording_events() {
    let (dev, a) = setup("free_sync:device", GIB);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 1);
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_eq!(q, p);
    assert_eq!(dev.counters().sync_device, 1);
    assert_eq!(dev.counters().event_calls(), 0);
}

#[test]
fn none_mode_reuses_at_once_even_with_streams() {
    let (dev, a) = setup("free_sync:none", GIB);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    assert_eq!(dev.counters().event_calls(), 0);
}

#[test]
fn no_event_is_recorded_while_a_stream_captures() {
    let (dev, a) = setup("", GIB);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    dev.set_capturing(0x77, true);
    // (Creating the stream recorded one event on the legacy stream, to order it.)
    let recorded = dev.counters().record_event;
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_ne!(q, p);
    assert_eq!(dev.counters().record_event, recorded);
    assert_eq!(pending_blocks(&a), 1);
    dev.set_capturing(0x77, false);
    let r = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_eq!(r, p);
}

#[test]
fn out_of_memory_waits_for_pending_batches_before_releasing_the_cache() {
    let (dev, a) = setup("free_sync:event", 100 * MIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 80 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let q = a.malloc(0, 80 * MIB, 0, 0).unwrap();
    assert_eq!(q, p);
    assert!(dev.counters().event_sync >= 1);
    assert_eq!(a.stats(0)["num_alloc_retries"], 0);
    assert_eq!(a.stats(0)["num_ooms"], 0);
    assert_eq!(dev.counters().free, 0, "nothing was released");
}

#[test]
fn stream_ordered_free_is_reusable_at_once_on_its_own_stream_only() {
    let (dev, a) = setup("free_sync:event", GIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    a.stream_created(0, 0x78, true);
    let p = a.malloc_async(0, 12 * MIB, 0x77, 0).unwrap();
    a.free_async(p, 0x77, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 0);
    assert_eq!(a.malloc_async(0, 12 * MIB, 0x77, 0).unwrap(), p);
    // Freed on another stream: pending until an event on that stream completes.
    a.free_async(p, 0x78, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 1);
    let q = a.malloc_async(0, 12 * MIB, 0x77, 0).unwrap();
    assert_ne!(q, p);
    dev.complete_events();
    assert_eq!(a.malloc_async(0, 12 * MIB, 0x77, 0).unwrap(), p);
}

#[test]
fn empty_cache_waits_for_pending_frees_and_releases_everything() {
    let (dev, a, _) = freed_behind_a_stream("free_sync:event");
    a.empty_cache();
    assert_eq!(dev.used(0), 0);
    assert_eq!(a.stats(0)["active_bytes.all.current"], 0);
    assert!(a.segments(0).is_empty());
}

#[test]
fn a_batch_that_completes_moments_after_it_is_recorded_serves_the_miss_without_growing() {
    // Work finishes a little after the events are recorded (the third query sees them done):
    // the miss polls the fresh batch briefly and reuses the freed block. (12 MiB: a
    // segment of exactly the request, so no remainder could serve the next round.)
    let (dev, a) = setup("free_sync:event", GIB);
    a.stream_created(0, 7, true);
    dev.set_auto_complete(false);
    dev.set_complete_after_queries(3);
    for _ in 0..100 {
        let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
        a.free(p, 0, 0).unwrap();
    }
    assert_eq!(dev.counters().malloc, 1, "one segment serves every round");
    assert_eq!(dev.counters().sync_device, 0, "polled, never synchronized");
}

#[test]
fn a_batch_that_stays_busy_makes_the_miss_grow_after_a_bounded_poll() {
    let (dev, a) = setup("free_sync:event", GIB);
    a.stream_created(0, 7, true);
    dev.set_auto_complete(false);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let t = std::time::Instant::now();
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_ne!(p, q, "the pending block is not handed out");
    assert_eq!(
        dev.counters().malloc,
        2,
        "the cache grew instead of waiting"
    );
    assert_eq!(dev.counters().sync_device, 0);
    // A hang detector, not a speed bound: the batch never completes, so an unbounded poll
    // would never return (the grace is 100 us; a loaded machine only stretches it).
    assert!(
        t.elapsed() < std::time::Duration::from_secs(120),
        "the poll is bounded"
    );
    assert_eq!(pending_blocks(&a), 1);
}

#[test]
fn a_miss_does_not_poll_when_no_waiting_block_could_serve_it() {
    let (dev, a) = setup("free_sync:event", GIB);
    a.stream_created(0, 7, true);
    dev.set_auto_complete(false);
    dev.set_complete_after_queries(1_000_000);
    let p = a.malloc(0, 2 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let before = dev.counters().event_query;
    let _q = a.malloc(0, 64 * MIB, 0, 0).unwrap();
    // One poll of the batch at the start of the malloc and one after recording it, none
    // in a loop: the 2 MiB block could never serve 64 MiB.
    assert!(
        dev.counters().event_query - before <= 2,
        "{}",
        dev.counters().event_query - before
    );
}

#[test]
fn a_snapshot_shows_frees_whose_work_is_done_as_free_not_pending() {
    let (dev, a, p) = freed_behind_a_stream("free_sync:event");
    let state = |a: &cushim::alloc::CachingAllocator| {
        a.snapshot()
            .into_iter()
            .find(|d| d.device == 0)
            .and_then(|d| {
                d.segments
                    .into_iter()
                    .flat_map(|s| s.blocks)
                    .find(|b| b.address == p)
            })
            .map(|b| b.state)
    };
    assert_eq!(
        state(&a),
        Some(BlockState::ActivePendingFree),
        "work still queued"
    );
    dev.complete_events(); // the program synchronized: the free's work is done
    assert_eq!(
        state(&a),
        Some(BlockState::Inactive),
        "done work is not pending"
    );
    assert_eq!(pending_blocks(&a), 0);
}
