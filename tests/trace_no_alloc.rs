//! The hot path allocates nothing after warm-up: capturing, interning a known stack and
//! recording into a full ring make no heap allocation (counted by a global allocator that
//! counts this thread's allocations).

use cushim::config::history::{parse, Unwinder};
use cushim::trace::event::{Action, EventSink, TraceEvent};
use cushim::trace::intern::StackTable;
use cushim::trace::ring::TraceRing;
use cushim::trace::stack::{capture, capture_id, SkipRange};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocations() -> u64 {
    COUNT.with(Cell::get)
}

#[inline(never)]
fn site() -> u32 {
    let id = capture_id(64, Unwinder::Dwarf, &SkipRange::NONE);
    std::hint::black_box(id)
}

#[test]
fn capture_intern_and_record_allocate_nothing_after_warm_up() {
    let conf = parse("enabled=all,max_entries=1000").unwrap();
    let mut ring = TraceRing::for_device(&conf);
    let ev = |i: u64, stack| TraceEvent {
        action: Action::Alloc,
        device: 0,
        addr: i,
        size: 512,
        stream: 0,
        time_us: 0,
        stack,
        device_free: 0,
        range: 0,
    };
    // Round 0 warms up (fills the ring, interns the stacks, looks up this thread's stack
    // bounds); round 1 is counted. Same call sites in both, so the same stacks.
    let table = StackTable::global();
    let other = [1u64, 2, 3];
    let mut buf = [0u64; 64];
    let mut ids = Vec::with_capacity(2);
    let mut counted = 0;
    for round in 0..std::hint::black_box(2) {
        let before = allocations();
        let mut id = 0;
        for i in 0..10_000 {
            id = site();
            // Alternate with another stack so lookups miss the per-thread cache.
            let _ = table.intern(&other);
            ring.record(ev(i, id));
            // Frame-pointer walks (whatever this build's frame-pointer setting yields).
            let _ = capture(&mut buf, Unwinder::Fp, &SkipRange::NONE);
        }
        ids.push(id);
        counted = allocations() - before;
        if round == 0 {
            assert!(counted > 0, "the counter sees warm-up allocations");
        }
    }
    if ids[0] != ids[1] {
        let a = table.get(ids[0]).unwrap();
        let b = table.get(ids[1]).unwrap();
        let diff: Vec<usize> = (0..a.len().max(b.len()))
            .filter(|&i| a.get(i) != b.get(i))
            .collect();
        panic!(
            "{} vs {} frames, differing at {diff:?}: {a:x?} {b:x?}",
            a.len(),
            b.len()
        );
    }
    assert_eq!(counted, 0, "allocations on the hot path after warm-up");
    assert_eq!(ring.len(), 1000);
}
