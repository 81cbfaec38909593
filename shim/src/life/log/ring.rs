//! The event log's hand-off: one single-producer, single-consumer ring of events per event
//! sink (each device's allocator, each device's observed table, pinned host memory), and
//! the registry the log's writer reads them all from; the log's ring of NVTX range starts
//! and ends is one more of the same kind (its producers are serialized by the range
//! annotations' lock).
//!
//! Policy:
//! - Why one ring per sink and not one queue for all: a sink records only under its own
//!   allocator lock, so each ring has exactly one producer at a time. A push is then a copy
//!   of the event into its slot and one release store of the ring's head: no
//!   read-modify-write, no lock, no allocation, no system call. A shared multi-producer
//!   queue needs an atomic compare-exchange per event on a line every recording thread and
//!   the writer fight over.
//! - Only the consumer (the writer thread, or the crash path once it holds the writer's
//!   gate) advances a ring's tail, and only after the events are in the file: until then the
//!   events stay in their slots, so a crash path that takes the gate finds every event that
//!   is not yet written in the rings, and nothing else.
//! - The producer wakes the writer only each time a quarter of its ring was pushed (a wake of a writer that
//!   is awake costs one atomic swap; of a parked one, a futex call), so the writer works on
//!   batches of thousands of events; the writer also wakes on its own timer, which bounds
//!   how long an event waits when the program records few.
//! - A full ring makes its producer wait for room (see `sink.rs` for why a log must not
//!   have holes); memory is [`RING_EVENTS`] events per sink, allocated once at start-up and
//!   touched only as it fills.
//! - Rings live as long as the process (a sink dropped with events still in its ring leaves
//!   them for the writer).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use cushim::trace::event::TraceEvent;

/// Slots of one sink's ring (a power of two): 768 KiB of events.
pub const RING_EVENTS: u64 = 1 << 14;
/// The most rings: two per device and two for pinned host memory, for up to 127 devices.
pub const MAX_RINGS: usize = 256;

/// A counter on a cache line of its own, so the producer's stores and the consumer's do
/// not evict each other's.
#[repr(align(128))]
struct Padded(AtomicU64);

/// One ring (of events, or of range marks).
pub struct Ring<T: Copy = TraceEvent> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Slots - 1 (slots are a power of two).
    mask: u64,
    /// Records pushed so far (stored by the producer only).
    head: Padded,
    /// Records consumed so far: in the file (stored by the gate's holder only).
    tail: Padded,
}

// SAFETY: a slot is written by the producer only while it is at `head` and less than the
// ring's size past `tail` (no consumer reads it then), and read by the consumer only
// between `tail` and `head` (the producer does not write it then); `head` is stored with
// release after the slot's write and loaded with acquire before its read; `tail` is stored
// with release after the read and loaded with acquire before a write.
unsafe impl<T: Copy + Send> Sync for Ring<T> {}

static RINGS: [AtomicPtr<Ring>; MAX_RINGS] = [const { AtomicPtr::new(null_mut()) }; MAX_RINGS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// A new registered event ring, or `None` when [`MAX_RINGS`] are taken (at start-up).
pub fn register() -> Option<&'static Ring> {
    let i = COUNT.fetch_add(1, Ordering::AcqRel);
    if i >= MAX_RINGS {
        return None;
    }
    let ring = Ring::leaked(RING_EVENTS);
    RINGS[i].store(ring as *const Ring as *mut Ring, Ordering::Release);
    Some(ring)
}

/// Every registered event ring, in registration order.
pub fn each(mut f: impl FnMut(&'static Ring)) {
    let n = COUNT.load(Ordering::Acquire).min(MAX_RINGS);
    for slot in &RINGS[..n] {
        let p = slot.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: registered rings are leaked: they live as long as the process.
            f(unsafe { &*p });
        }
    }
}

/// The producer's side of a ring (owned by its sink, used under the sink's lock).
pub struct Producer<T: Copy + 'static = TraceEvent> {
    ring: &'static Ring<T>,
    /// Records pushed (the ring's head, kept here so a push does not load it).
    head: u64,
    /// The ring's tail as last loaded: room is known without loading it each push.
    tail_seen: u64,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// In the ring.
    Done,
    /// In the ring, and the writer should be woken (a quarter of the ring was pushed
    /// since the last wake).
    Wake,
    /// The ring is full: the caller waits for room (or drops), then pushes again.
    Full,
}

impl<T: Copy + 'static> Producer<T> {
    pub fn new(ring: &'static Ring<T>) -> Producer<T> {
        Producer {
            ring,
            head: ring.head(),
            tail_seen: ring.tail(),
        }
    }

    /// Push `v` when there is room.
    #[inline]
    pub fn push(&mut self, v: &T) -> Pushed {
        let head = self.head;
        if head - self.tail_seen > self.ring.mask {
            self.tail_seen = self.ring.tail();
            if head - self.tail_seen > self.ring.mask {
                return Pushed::Full;
            }
        }
        // SAFETY: this is the ring's only producer (its sink's lock), and there is room.
        unsafe { self.ring.put(head, v) };
        self.head = head + 1;
        self.ring.pushed(head + 1)
    }
}

impl<T: Copy> Ring<T> {
    /// A new ring of `slots` (a power of two, at least 4) that lives as long as the process.
    pub fn leaked(slots: u64) -> &'static Ring<T> {
        let mut v = Vec::with_capacity(slots as usize);
        // Uninitialized slots need no initialization; the pages are touched only as the
        // ring fills.
        v.resize_with(slots as usize, || UnsafeCell::new(MaybeUninit::uninit()));
        Box::leak(Box::new(Ring {
            slots: v.into_boxed_slice(),
            mask: slots - 1,
            head: Padded(AtomicU64::new(0)),
            tail: Padded(AtomicU64::new(0)),
        }))
    }

    /// Write slot `head`.
    ///
    /// # Safety
    /// The caller is the ring's only producer, `head` is the ring's head, and
    /// `head - tail()` is less than the ring's size.
    #[inline]
    unsafe fn put(&self, head: u64, v: &T) {
        let slot = &self.slots[(head & self.mask) as usize];
        // SAFETY: the caller's contract: the slot is at `head` and within the ring's size
        // of `tail`, so no consumer reads it (see `Ring`'s Sync).
        unsafe { (*slot.get()).write(*v) };
    }

    /// Publish the records before `head`.
    #[inline]
    fn pushed(&self, head: u64) -> Pushed {
        self.head.0.store(head, Ordering::Release);
        if head & (self.mask >> 2) == 0 {
            Pushed::Wake
        } else {
            Pushed::Done
        }
    }

    /// Push `v` when there is room, for a ring whose producers one lock serializes (the
    /// head and tail are loaded each time).
    ///
    /// # Safety
    /// Every producer of this ring holds the same lock while it pushes.
    #[inline]
    pub unsafe fn push_serialized(&self, v: &T) -> Pushed {
        let head = self.head.0.load(Ordering::Relaxed);
        if head - self.tail() > self.mask {
            return Pushed::Full;
        }
        // SAFETY: the lock makes this the only producer; there is room.
        unsafe { self.put(head, v) };
        self.pushed(head + 1)
    }

    /// Records pushed so far.
    #[inline]
    pub fn head(&self) -> u64 {
        self.head.0.load(Ordering::Acquire)
    }

    /// Records consumed so far.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.tail.0.load(Ordering::Acquire)
    }

    /// The record at `i`.
    ///
    /// # Safety
    /// The caller is the consumer (the writer's gate is its own) and `tail() <= i < head()`.
    #[inline]
    pub unsafe fn get(&self, i: u64) -> T {
        let slot = &self.slots[(i & self.mask) as usize];
        // SAFETY: the caller's contract: the producer wrote this slot before storing a head
        // past it, and does not write it again until the tail passes it.
        unsafe { (*slot.get()).assume_init() }
    }

    /// Ask the CPU to bring record `i`'s slot into this core's cache ahead of [`Ring::get`]
    /// (the producer wrote it on another core: each slot read is otherwise a wait for that
    /// core's cache). A hint, never a read: the consumer passes only `i < head()`, so it
    /// never pulls a line the producer is about to write away from it.
    #[inline(always)]
    pub fn prefetch(&self, i: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let slot = self.slots[(i & self.mask) as usize].get() as *const i8;
            // SAFETY: a prefetch is a hint: it never faults, reads nothing into the program
            // and writes nothing; SSE is part of every x86_64.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(slot) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }

    /// Mark the records before `to` as consumed (the consumer only, once they are written).
    #[inline]
    pub fn consumed(&self, to: u64) {
        self.tail.0.store(to, Ordering::Release);
    }

    /// In a fork child: the records still in the ring are the parent's (its writer writes
    /// them to its log); the child's log starts empty.
    pub fn forget(&self) {
        self.tail.0.store(self.head(), Ordering::Release);
    }
}
