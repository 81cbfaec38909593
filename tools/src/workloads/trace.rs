//! Per-event recording cost: what the allocator does per trace event with history on.
//!
//! Invariant: each workload records real events into a real [`TraceRing`] that is already
//! full (the steady state, where `record` never allocates); stacks are captured for real by
//! cushim's unwinders at a recursion depth built here, from two alternating call sites so
//! the interner's last-stack shortcut does not hide the lookup.

use cushim::config::history::{parse, Unwinder};
use cushim::trace::event::{now_us, Action, EventSink, NullSink, StackId, TraceEvent};
use cushim::trace::ring::TraceRing;
use cushim::trace::stack::{capture, capture_id, SkipRange, CAPTURE_MAX};
use std::hint::black_box;

/// One event, stamped now, as the allocator makes it.
#[inline(always)]
pub fn event(i: u64, stack: StackId) -> TraceEvent {
    TraceEvent {
        action: if i & 1 == 0 {
            Action::Alloc
        } else {
            Action::FreeRequested
        },
        device: 0,
        addr: 0x7f00_0000_0000 + (i & 0xffff) * 512,
        size: 512,
        stream: 0,
        time_us: now_us(),
        stack,
        device_free: 0,
        range: 0,
    }
}

/// A ring of `max` entries with native stacks on, filled to capacity.
pub fn full_ring(max: usize) -> TraceRing {
    let conf = parse(&format!("enabled=all,stacks=native,max_entries={max}"))
        .unwrap_or_else(|_| cushim::config::history::HistoryConf::off());
    let mut r = TraceRing::for_device(&conf);
    for i in 0..max as u64 {
        r.record(event(i, 0));
    }
    r
}

/// Baseline: history off. The allocator asks the sink whether it is enabled and skips.
pub fn record_off(iters: u64) {
    let mut sink = NullSink;
    for i in 0..iters {
        if black_box(&sink).enabled() {
            sink.record(event(i, 0));
        }
        black_box(i);
    }
}

/// History on, no stacks: timestamp + ring record.
pub fn record_no_stack(ring: &mut TraceRing, iters: u64) {
    for i in 0..iters {
        if ring.enabled() {
            ring.record(event(black_box(i), 0));
        }
    }
}

/// Run `f` below `depth` frames of recursion.
#[inline(never)]
pub fn at_depth(depth: usize, f: &mut dyn FnMut()) {
    if depth <= 1 {
        f();
    } else {
        at_depth(black_box(depth - 1), f);
    }
    black_box(depth); // keeps the call from becoming a tail call
}

#[inline(never)]
fn site_a(max_frames: usize, u: Unwinder) -> StackId {
    black_box(capture_id(max_frames, u, &SkipRange::NONE))
}

#[inline(never)]
fn site_b(max_frames: usize, u: Unwinder) -> StackId {
    black_box(capture_id(max_frames, u, &SkipRange::NONE))
}

/// History on with native stacks of `depth` frames through `u`: capture, intern, record.
/// The recursion is built once; the `iters` events are recorded at its bottom.
pub fn record_with_stack(ring: &mut TraceRing, u: Unwinder, depth: usize, iters: u64) {
    at_depth(depth, &mut || {
        for i in 0..iters {
            let id = if i & 1 == 0 {
                site_a(depth, u)
            } else {
                site_b(depth, u)
            };
            ring.record(event(i, id));
        }
    });
}

/// How many frames `u` captures at the bottom of `depth` frames of recursion with
/// `max_frames = depth` (should be `depth`: the benchmark's own frames lie below).
pub fn captured_frames(u: Unwinder, depth: usize) -> usize {
    let mut n = 0;
    at_depth(depth, &mut || {
        let mut buf = [0u64; CAPTURE_MAX];
        n = capture(&mut buf[..depth.min(CAPTURE_MAX)], u, &SkipRange::NONE);
    });
    n
}

/// The unwinder alone (no interning, no ring): `iters` captures of `depth` frames.
pub fn capture_only(u: Unwinder, depth: usize, iters: u64) {
    at_depth(depth, &mut || {
        let mut buf = [0u64; CAPTURE_MAX];
        for _ in 0..iters {
            black_box(capture(
                &mut buf[..depth.min(CAPTURE_MAX)],
                u,
                &SkipRange::NONE,
            ));
        }
    });
}

/// `iters` timestamps as the allocator takes them for each event.
pub fn timestamps(iters: u64) {
    for _ in 0..iters {
        black_box(now_us());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recursion_gives_the_unwinders_the_requested_depth() {
        for u in [Unwinder::Dwarf, Unwinder::Fp] {
            assert_eq!(captured_frames(u, 8), 8, "{u:?}");
            assert_eq!(captured_frames(u, 32), 32, "{u:?}");
        }
    }

    #[test]
    fn recording_with_stacks_fills_the_ring_with_two_distinct_stacks() {
        let mut ring = full_ring(16);
        record_with_stack(&mut ring, Unwinder::Fp, 8, 16);
        let ids: std::collections::HashSet<_> = ring.events().iter().map(|e| e.stack).collect();
        assert_eq!(ids.len(), 2, "{ids:?}");
        assert!(!ids.contains(&0));
    }
}
