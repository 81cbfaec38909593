//! The event log's hand-off: one single-producer, single-consumer ring of events per event
//! sink (each device's allocator, each device's observed table, pinned host memory), and
//! the registry the log's writer reads them all from.
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
//! - The producer wakes the writer only every [`WAKE_EVERY`] events (a wake of a writer that
//!   is awake costs one atomic swap; of a parked one, a futex call), so the writer works on
//!   batches of thousands of events; the writer also wakes on its own timer, which bounds
//!   how long an event waits when the program records few.
//! - A full ring makes its producer wait for room (see `log_writer` for why a log must not
//!   have holes); memory is [`RING_EVENTS`] events per sink, allocated once at start-up and
//!   touched only as it fills.
//! - Rings live as long as the process (a sink dropped with events still in its ring leaves
//!   them for the writer).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use cushim::trace::event::TraceEvent;

/// Slots of one ring (a power of two): 768 KiB of events.
pub const RING_EVENTS: u64 = 1 << 14;
/// The producer wakes the writer each time this many events were pushed (a power of two).
pub const WAKE_EVERY: u64 = 1 << 12;
/// The most rings: two per device and two for pinned host memory, for up to 127 devices.
pub const MAX_RINGS: usize = 256;

/// A counter on a cache line of its own, so the producer's stores and the consumer's do
/// not evict each other's.
#[repr(align(128))]
struct Padded(AtomicU64);

/// One sink's ring.
pub struct Ring {
    slots: Box<[UnsafeCell<MaybeUninit<TraceEvent>>]>,
    /// Events pushed so far (stored by the producer only).
    head: Padded,
    /// Events consumed so far: in the file (stored by the gate's holder only).
    tail: Padded,
}

// SAFETY: a slot is written by the producer only while it is between `tail` and
// `tail + RING_EVENTS` and at or past `head` (no consumer reads it then), and read by the
// consumer only between `tail` and `head` (the producer does not write it then); `head` is
// stored with release after the slot's write and loaded with acquire before its read.
unsafe impl Sync for Ring {}

static RINGS: [AtomicPtr<Ring>; MAX_RINGS] = [const { AtomicPtr::new(null_mut()) }; MAX_RINGS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// A new registered ring, or `None` when [`MAX_RINGS`] are taken (at start-up).
pub fn register() -> Option<&'static Ring> {
    let i = COUNT.fetch_add(1, Ordering::AcqRel);
    if i >= MAX_RINGS {
        return None;
    }
    let mut slots = Vec::with_capacity(RING_EVENTS as usize);
    // Uninitialized slots need no initialization; the pages are touched only as the ring
    // fills.
    slots.resize_with(RING_EVENTS as usize, || {
        UnsafeCell::new(MaybeUninit::uninit())
    });
    let ring: &'static Ring = Box::leak(Box::new(Ring {
        slots: slots.into_boxed_slice(),
        head: Padded(AtomicU64::new(0)),
        tail: Padded(AtomicU64::new(0)),
    }));
    RINGS[i].store(ring as *const Ring as *mut Ring, Ordering::Release);
    Some(ring)
}

/// Every registered ring, in registration order.
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
pub struct Producer {
    ring: &'static Ring,
    /// Events pushed (the ring's head, kept here so a push does not load it).
    head: u64,
    /// The ring's tail as last loaded: room is known without loading it each push.
    tail_seen: u64,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// In the ring.
    Done,
    /// In the ring, and the writer should be woken.
    Wake,
    /// The ring is full: the caller waits for room (or drops), then pushes again.
    Full,
}

impl Producer {
    pub fn new(ring: &'static Ring) -> Producer {
        let head = ring.head.0.load(Ordering::Acquire);
        Producer {
            ring,
            head,
            tail_seen: ring.tail.0.load(Ordering::Acquire),
        }
    }

    /// Push `ev` when there is room.
    #[inline]
    pub fn push(&mut self, ev: &TraceEvent) -> Pushed {
        let head = self.head;
        if head - self.tail_seen >= RING_EVENTS {
            self.tail_seen = self.ring.tail.0.load(Ordering::Acquire);
            if head - self.tail_seen >= RING_EVENTS {
                return Pushed::Full;
            }
        }
        let slot = &self.ring.slots[(head & (RING_EVENTS - 1)) as usize];
        // SAFETY: the slot is past `head` and within RING_EVENTS of `tail`: no consumer
        // reads it (see `Ring`'s Sync).
        unsafe { (*slot.get()).write(*ev) };
        self.head = head + 1;
        self.ring.head.0.store(head + 1, Ordering::Release);
        if (head + 1) & (WAKE_EVERY - 1) == 0 {
            Pushed::Wake
        } else {
            Pushed::Done
        }
    }
}

impl Ring {
    /// Events pushed so far.
    #[inline]
    pub fn head(&self) -> u64 {
        self.head.0.load(Ordering::Acquire)
    }

    /// Events consumed so far.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.tail.0.load(Ordering::Acquire)
    }

    /// The event at `i`.
    ///
    /// # Safety
    /// The caller is the consumer (the writer's gate is its own) and `tail() <= i < head()`.
    #[inline]
    pub unsafe fn get(&self, i: u64) -> TraceEvent {
        let slot = &self.slots[(i & (RING_EVENTS - 1)) as usize];
        // SAFETY: the caller's contract: the producer wrote this slot before storing a head
        // past it, and does not write it again until the tail passes it.
        unsafe { (*slot.get()).assume_init() }
    }

    /// Mark the events before `to` as consumed (the consumer only, once they are written).
    #[inline]
    pub fn consumed(&self, to: u64) {
        self.tail.0.store(to, Ordering::Release);
    }

    /// In a fork child: the events still in the ring are the parent's (its writer writes
    /// them to its log); the child's log starts empty.
    pub fn forget(&self) {
        self.tail.0.store(self.head(), Ordering::Release);
    }
}
