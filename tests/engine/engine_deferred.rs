//! The deferred merge (`src/alloc/deferred.rs`) changes nothing anyone can observe: the same
//! random programs run on two allocators, one deferring merges and one merging every free at
//! once, get the same pointers and errors, and the same statistics (peaks and sums
//! included), segment listings and events whenever they are compared.

use crate::common::engine_support;
use engine_support::VecSink;
use std::sync::Arc;

use cushim::alloc::CachingAllocator;
use cushim::config::alloc::parse;
use cushim::trace::event::{EventSink, TraceEvent};
use cushim_testsupport::fake_device::FakeDevice;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Side {
    dev: Arc<FakeDevice>,
    alloc: CachingAllocator,
    sink: VecSink,
}

fn side(conf: &str, capacity: u64) -> Side {
    let dev = Arc::new(FakeDevice::new(1, capacity));
    let (c, errs) = parse(conf);
    assert!(errs.is_empty(), "{errs:?}");
    let sink = VecSink::default();
    let s2 = sink.clone();
    let alloc = CachingAllocator::new(dev.clone(), c, &move |d| {
        if d == 0 {
            Box::new(s2.clone()) as Box<dyn EventSink>
        } else {
            Box::new(cushim::trace::event::NullSink)
        }
    });
    Side { dev, alloc, sink }
}

/// Events without their timestamps (which differ between the two runs).
fn events(s: &Side) -> Vec<TraceEvent> {
    s.sink
        .events()
        .into_iter()
        .map(|mut e| {
            e.time_us = 0;
            e
        })
        .collect()
}

fn compare(a: &Side, b: &Side, step: usize) {
    assert_eq!(
        a.alloc.stats(0),
        b.alloc.stats(0),
        "stats differ at step {step}"
    );
    assert_eq!(
        a.alloc.segments(0),
        b.alloc.segments(0),
        "segments differ at step {step}"
    );
    assert_eq!(events(a), events(b), "events differ at step {step}");
}

/// Sizes that recur (so frees are followed by mallocs of their own size) and some that
/// don't, small and large.
fn size(rng: &mut fastrand::Rng) -> u64 {
    const RECUR: [u64; 8] = [
        512,
        4096,
        100_000,
        MIB,
        MIB + 512,
        3 * MIB,
        12 * MIB,
        45 * MIB,
    ];
    match rng.u8(..) {
        0..=170 => RECUR[rng.usize(..RECUR.len())],
        171..=230 => rng.u64(1..=2 * MIB),
        _ => rng.u64(MIB..64 * MIB),
    }
}

/// Run `ops` random operations on both sides; returns the deferred side's fast-path hits.
/// With `told_streams` the allocator knows a stream was created, so under `free_sync:auto`
/// a plain free waits for the streams and only `cudaFreeAsync` on the block's own stream
/// frees at once.
fn run(conf: &str, capacity: u64, ops: usize, seed: u64, told_streams: bool) -> u64 {
    let a = side(conf, capacity);
    let b = side(conf, capacity);
    b.alloc.merge_frees_at_once();
    let streams = [0u64, 0x1000, 0x2000];
    if told_streams {
        for s in &[&a, &b] {
            s.alloc.stream_created(0, 0x2000, true);
        }
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    // (pointer, stream, size) of live blocks, newest last.
    let mut live: Vec<(u64, u64, u64)> = Vec::new();
    // A malloc of this (size, stream) comes next: a temporary reallocated after its free.
    let mut again: Option<(u64, u64)> = None;
    for step in 0..ops {
        let r = rng.u16(0..1000);
        if let Some((sz, stream)) = again.take() {
            let got = [&a, &b].map(|s| s.alloc.malloc_async(0, sz, stream, 8));
            assert_eq!(
                got[0], got[1],
                "malloc({sz}) again on stream {stream} at step {step}"
            );
            if let Ok(p) = got[0] {
                live.push((p, stream, sz));
            }
        } else if r < 470 && live.len() < 300 || live.is_empty() {
            let sz = size(&mut rng);
            let n = if rng.u8(..) < 200 { 1 } else { 3 };
            let stream = streams[rng.usize(..n)];
            let got = [&a, &b].map(|s| {
                if stream == 0 {
                    s.alloc.malloc(0, sz, 0, 7)
                } else {
                    s.alloc.malloc_async(0, sz, stream, 7)
                }
            });
            assert_eq!(
                got[0], got[1],
                "malloc({sz}) on stream {stream} at step {step}"
            );
            if let Ok(p) = got[0] {
                if p != 0 {
                    live.push((p, stream, sz));
                }
            }
        } else if r < 960 {
            // Mostly the newest block (the pattern the deferral serves), else any.
            let i = if rng.u8(..) < 170 {
                live.len() - 1
            } else {
                rng.usize(..live.len())
            };
            let (p, own, sz) = live.swap_remove(i);
            if rng.bool() {
                again = Some((sz, own));
            }
            let how = rng.u8(..);
            let got = [&a, &b].map(|s| match how {
                0..=199 => s.alloc.free(p, 0, 9),
                200..=239 => s.alloc.free_async(p, own, 0, 9),
                _ => s.alloc.free_async(p, streams[(how % 3) as usize], 0, 9),
            });
            assert_eq!(got[0], got[1], "free({p:#x}) at step {step}");
        } else if r < 975 {
            compare(&a, &b, step);
        } else if r < 980 {
            for s in [&a, &b] {
                s.alloc.empty_cache();
            }
        } else if r < 985 {
            for s in [&a, &b] {
                s.alloc.reset_peak_stats();
            }
        } else if r < 990 {
            // A double free and an interior pointer are refused alike.
            if let Some(&(p, _, _)) = live.last() {
                let got = [&a, &b].map(|s| s.alloc.free(p + 256, 0, 0));
                assert_eq!(got[0], got[1], "interior free at step {step}");
            }
        } else {
            let got = [&a, &b].map(|s| s.alloc.mem_get_info(0));
            assert_eq!(got[0], got[1], "mem_get_info at step {step}");
        }
        if rng.u16(..1000) == 0 {
            for s in [&a, &b] {
                s.dev.complete_events();
            }
        }
    }
    compare(&a, &b, ops);
    for (p, _, _) in live {
        let got = [&a, &b].map(|s| s.alloc.free(p, 0, 0));
        assert_eq!(got[0], got[1]);
    }
    for s in [&a, &b] {
        s.alloc.empty_cache();
    }
    compare(&a, &b, ops + 1);
    assert_eq!(a.dev.used(0), 0);
    assert_eq!(
        b.alloc.deferred_hits(0),
        0,
        "the reference side never defers"
    );
    a.alloc.deferred_hits(0)
}

#[test]
fn deferring_merges_gives_the_same_results_as_merging_at_once() {
    for (i, (conf, told_streams, min_hits)) in [
        ("", false, 1000),
        ("", true, 50),
        ("max_split_size_mb:40", false, 1000),
        (
            "max_split_size_mb:24,max_non_split_rounding_mb:0",
            false,
            1000,
        ),
        ("expandable_segments:True", false, 1000),
        ("expandable_segments:True", true, 50),
        ("roundup_power2_divisions:4", false, 1000),
        ("garbage_collection_threshold:0.6", false, 1000),
        ("free_sync:event", false, 50),
        (
            "free_sync:none,max_split_size_mb:64,expandable_segments:True",
            true,
            1000,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        // A small device so out-of-memory, retries and garbage collection happen too.
        let hits = run(conf, 2 * GIB, 20_000, 40 + i as u64, told_streams);
        eprintln!("{conf:?} (streams told: {told_streams}): {hits} mallocs answered from a deferred merge");
        assert!(
            hits >= min_hits,
            "{conf:?}: the deferral was hardly exercised ({hits} hits)"
        );
    }
}

/// A cached pair of one size keeps coming back to the same block without a merge, and what
/// it leaves is exactly what merging at once leaves.
#[test]
fn a_cached_pair_is_answered_from_the_deferred_block() {
    let a = side("", 8 * GIB);
    let first = a.alloc.malloc(0, 512, 0, 0).unwrap();
    a.alloc.free(first, 0, 0).unwrap();
    for _ in 0..1000 {
        let p = a.alloc.malloc(0, 512, 0, 0).unwrap();
        assert_eq!(p, first);
        a.alloc.free(p, 0, 0).unwrap();
    }
    assert_eq!(a.alloc.deferred_hits(0), 1000);
    let s = a.alloc.stats(0);
    assert_eq!(s["segment.all.current"], 1);
    assert_eq!(s["inactive_split.all.current"], 0);
    assert_eq!(s["allocation.all.allocated"], 1001);
    // Every pair merged the tail out and split it back in, as PyTorch's allocator does.
    assert_eq!(s["inactive_split.all.allocated"], 1001);
    assert_eq!(s["inactive_split.all.freed"], 1001);
}
