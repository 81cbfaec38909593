//! GPU-side ordering barriers (`free_sync:auto` once streams exist, `free_sync:barrier`):
//! freed blocks are reused as soon as a barrier is issued, with no CPU wait, one barrier per
//! burst of reuse, `3n + 1` driver calls for `n` non-blocking streams; never on a capturing
//! stream; new and dying streams are tied in. The fake device's events never complete in
//! these tests unless a test says so: reuse must not depend on the GPU having caught up.

use crate::common::engine_support;
use engine_support::{freed_behind_a_stream, pending_blocks, setup};

use cushim_testsupport::fake_device::{FakeDevice, Op};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Ordering calls made so far: (event records, stream waits).
fn ordering_calls(dev: &FakeDevice) -> (u64, u64) {
    let c = dev.counters();
    (c.record_event, c.stream_wait_event)
}

#[test]
fn auto_with_a_stream_reuses_a_freed_block_at_once_behind_a_barrier_without_cpu_waits() {
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    let base = dev.counters();
    a.free(p, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 1, "the free itself waits");
    assert_eq!(dev.counters(), base, "a free makes no driver call");
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_eq!(q, p, "reused although the GPU has not caught up");
    let c = dev.counters();
    assert_eq!(
        (
            c.record_event - base.record_event,
            c.stream_wait_event - base.stream_wait_event
        ),
        (2, 2),
        "records on the stream and the legacy stream, waits in both directions"
    );
    assert_eq!(
        c.event_query + c.event_sync + c.sync_device + c.sync_stream,
        0
    );
    assert_eq!(c.malloc, 1);
    assert_eq!(a.barriers(0).0, 1);
}

#[test]
fn a_barrier_costs_three_calls_per_non_blocking_stream_plus_one() {
    for n in [0u64, 1, 4, 16] {
        // `barrier` always issues one; `auto` synchronizes over more than two busy streams.
        let (dev, a) = setup("free_sync:barrier", GIB);
        dev.set_auto_complete(false);
        a.stream_created(0, 0x500, false); // blocking: the legacy record covers it
        for i in 0..n {
            a.stream_created(0, 0x1000 + i, true);
        }
        let (issued0, calls0) = a.barriers(0);
        let (r0, w0) = ordering_calls(&dev);
        for _ in 0..10 {
            let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
            a.free(p, 0, 0).unwrap();
        }
        let c = dev.counters();
        assert_eq!(c.malloc, 1, "{n} streams");
        // The first pair finds nothing pending; each of the 9 others issues one barrier.
        let (issued, calls) = a.barriers(0);
        assert_eq!(
            (issued - issued0, calls - calls0),
            (9, 9 * (3 * n + 1)),
            "{n} streams"
        );
        assert_eq!(
            c.record_event + c.stream_wait_event - r0 - w0,
            9 * (3 * n + 1)
        );
        assert_eq!(c.event_query + c.event_sync + c.sync_device, 0);
    }
}

#[test]
fn one_barrier_serves_every_block_freed_before_it() {
    let (dev, a) = setup("free_sync:barrier", 4 * GIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    let ps: Vec<u64> = (0..8)
        .map(|_| a.malloc(0, 16 * MIB, 0, 0).unwrap())
        .collect();
    for p in &ps {
        a.free(*p, 0, 0).unwrap();
    }
    let again: Vec<u64> = (0..8)
        .map(|_| a.malloc(0, 16 * MIB, 0, 0).unwrap())
        .collect();
    let mut x = ps.clone();
    let mut y = again.clone();
    x.sort_unstable();
    y.sort_unstable();
    assert_eq!(x, y, "every freed block was handed out again");
    assert_eq!(a.barriers(0).0, 1, "one barrier for the burst");
    assert_eq!(dev.counters().malloc, 8);
}

#[test]
fn a_gpu_lagging_forever_never_grows_the_cache_over_fifty_steps() {
    // Events never complete: every free is still in flight at the next malloc, as on a GPU
    // that runs behind the CPU. Reserved memory must follow the working set.
    let (dev, a) = setup("", 16 * GIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    a.stream_created(0, 0x78, true);
    for _ in 0..50 {
        let ps: Vec<u64> = (0..8)
            .map(|_| a.malloc(0, 16 * MIB, 0, 0).unwrap())
            .collect();
        for p in ps {
            a.free(p, 0, 0).unwrap();
        }
    }
    let s = a.stats(0);
    assert_eq!(s["allocated_bytes.all.peak"], 128 * MIB as i64);
    assert_eq!(s["reserved_bytes.all.peak"], 128 * MIB as i64);
    assert_eq!(a.barriers(0).0, 49);
}

#[test]
fn no_barrier_while_a_stream_captures_and_the_block_keeps_waiting() {
    let (dev, a, p) = freed_behind_a_stream("");
    dev.set_capturing(0x77, true);
    let before = ordering_calls(&dev);
    let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    assert_ne!(q, p);
    assert_eq!(ordering_calls(&dev), before, "nothing recorded or waited");
    assert_eq!(pending_blocks(&a), 1);
    dev.set_capturing(0x77, false);
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
}

#[test]
fn a_stream_created_later_waits_for_everything_queued_before_it() {
    // A block freed before any stream existed was reused at once; a non-blocking stream
    // created afterwards has no implicit ordering with its old work, so it waits for a
    // fresh legacy-stream record when it appears.
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    assert_eq!(
        a.malloc(0, 12 * MIB, 0, 0).unwrap(),
        p,
        "no stream: at once"
    );
    assert_eq!(ordering_calls(&dev), (0, 0));
    a.stream_created(0, 0x78, true);
    // The first stream: one barrier over what was freed so far (a legacy record), then the
    // new stream waits for a legacy record.
    assert_eq!(ordering_calls(&dev), (2, 1));
    a.stream_created(0, 0x79, false);
    assert_eq!(
        ordering_calls(&dev),
        (2, 1),
        "a blocking stream follows the legacy stream by itself"
    );
    a.stream_created(0, 0x7a, true);
    assert_eq!(ordering_calls(&dev), (3, 2));
}

#[test]
fn a_stream_destroyed_while_blocks_wait_is_tied_into_the_legacy_stream_first() {
    let (dev, a, p) = freed_behind_a_stream("");
    let (r, w) = ordering_calls(&dev);
    a.stream_destroyed(0, 0x77);
    assert_eq!(ordering_calls(&dev), (r + 1, w + 1));
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    assert_eq!(
        ordering_calls(&dev),
        (r + 2, w + 1),
        "the barrier no longer names the destroyed stream"
    );
}

#[test]
fn a_free_on_another_stream_is_covered_by_the_next_barrier() {
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    let p = a.malloc_async(0, 12 * MIB, 0x77, 0).unwrap();
    // 0x99 is not tracked (made before the shim saw it): the barrier names it once.
    a.free_async(p, 0x99, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 1);
    let (issued, calls) = a.barriers(0);
    assert_eq!(a.malloc_async(0, 12 * MIB, 0x77, 0).unwrap(), p);
    assert_eq!(
        a.barriers(0),
        (issued + 1, calls + 7),
        "two streams: 3 x 2 + 1"
    );
}

#[test]
fn a_failing_barrier_falls_back_to_synchronizing_the_device() {
    let (dev, a, p) = freed_behind_a_stream("");
    dev.fail_nth(Op::WaitEvent, 1);
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    assert_eq!(dev.counters().sync_device, 1);
}

#[test]
fn auto_reuses_at_once_across_threads_without_per_thread_default_streams() {
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // The block the first thread freed: every thread's work is on the legacy stream.
            let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
            assert_eq!(q, p);
            a.free(q, 0, 0).unwrap();
        });
    });
    assert_eq!(
        pending_blocks(&a),
        0,
        "no stream, no per-thread stream: immediate"
    );
    assert_eq!(ordering_calls(&dev), (0, 0));
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    assert_eq!(ordering_calls(&dev), (0, 0));
}

#[test]
fn auto_counts_a_second_thread_as_a_stream_once_a_per_thread_default_stream_was_used() {
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    a.per_thread_streams_used();
    assert_eq!(
        pending_blocks(&a),
        0,
        "one thread, its own default stream: immediate"
    );
    assert_eq!(ordering_calls(&dev), (0, 0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
            a.free(q, 0, 0).unwrap();
        });
    });
    assert_eq!(
        pending_blocks(&a),
        1,
        "the other thread may have used its per-thread default stream"
    );
    assert_eq!(
        ordering_calls(&dev),
        (1, 0),
        "the second thread ordered what the first had freed: one legacy record"
    );
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    assert_eq!(
        ordering_calls(&dev),
        (2, 0),
        "blocking default streams only: one legacy record per barrier"
    );
}

#[test]
fn a_per_thread_default_stream_used_after_a_second_thread_came_orders_at_once() {
    let (dev, a) = setup("", GIB);
    dev.set_auto_complete(false);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let q = a.malloc(0, 12 * MIB, 0, 0).unwrap();
            a.free(q, 0, 0).unwrap();
        });
    });
    assert_eq!(ordering_calls(&dev), (0, 0));
    a.per_thread_streams_used();
    assert_eq!(
        ordering_calls(&dev),
        (1, 0),
        "what the threads freed until now is ordered before the per-thread stream's work"
    );
    a.free(p, 0, 0).unwrap();
    assert_eq!(pending_blocks(&a), 1, "from now on frees wait");
}

#[test]
fn a_reuse_needs_no_barrier_when_every_stream_reports_an_empty_queue() {
    let (dev, a) = setup("", GIB);
    a.stream_created(0, 0x77, true);
    a.stream_created(0, 0x78, false);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let base = dev.counters();
    let (issued, _) = a.barriers(0);
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p, "reused at once");
    let c = dev.counters();
    assert_eq!(
        (
            c.record_event - base.record_event,
            c.stream_wait_event - base.stream_wait_event
        ),
        (0, 0),
        "nothing queued on any stream"
    );
    assert_eq!(
        c.stream_query - base.stream_query,
        3,
        "the legacy stream, the non-blocking one and the blocking one were asked"
    );
    assert_eq!(a.barriers(0).0, issued, "no barrier issued");
    assert_eq!(a.quiet_checks(0), 1);
}

#[test]
fn a_busy_stream_still_gets_the_barrier() {
    let (dev, a) = setup("", GIB);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    dev.set_auto_complete(false);
    let before = ordering_calls(&dev);
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    let after = ordering_calls(&dev);
    assert_eq!((after.0 - before.0, after.1 - before.1), (2, 2));
    assert_eq!(a.quiet_checks(0), 0);
}

#[test]
fn no_quiet_check_once_a_per_thread_default_stream_was_used() {
    let (dev, a) = setup("", GIB);
    a.stream_created(0, 0x77, true);
    a.per_thread_streams_used();
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    let before = ordering_calls(&dev);
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p);
    let after = ordering_calls(&dev);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (2, 2),
        "another thread's per-thread stream cannot be asked: the barrier orders it"
    );
    assert_eq!(a.quiet_checks(0), 0);
}

#[test]
fn auto_synchronizes_like_cudas_free_instead_of_a_barrier_over_more_than_two_busy_streams() {
    let (dev, a) = setup("", GIB);
    for i in 0..3 {
        a.stream_created(0, 0x1000 + i, true);
    }
    let p = a.malloc(0, 12 * MIB, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    dev.set_auto_complete(false);
    let before = ordering_calls(&dev);
    let syncs = dev.counters().sync_device;
    assert_eq!(a.malloc(0, 12 * MIB, 0, 0).unwrap(), p, "reused");
    assert_eq!(ordering_calls(&dev), before, "no barrier queued");
    assert_eq!(
        dev.counters().sync_device - syncs,
        1,
        "one device synchronization"
    );
}
