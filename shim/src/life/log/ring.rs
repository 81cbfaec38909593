//! The log's ring of NVTX range starts and ends: a single-producer, single-consumer ring of
//! plain records, whose producers the range annotations' lock serializes; and what it
//! shares with the rings of encoded events (`event_ring.rs`): the padded counters and what
//! a push did.
//!
//! Policy:
//! - A push is a copy of the record into its slot and one release store of the ring's head:
//!   no read-modify-write, no lock, no allocation, no system call.
//! - Only the consumer (the writer thread, or the crash path once it holds the writer's
//!   gate) advances the tail, and only after the records are in the file, so a crash path
//!   that takes the gate finds every record not yet written in the ring, and nothing else.
//! - The producer wakes the writer each time a quarter of the ring was pushed; a full ring
//!   makes it wait for room (or drop, when no writer will ever drain it: see `sink.rs`).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

/// A counter on a cache line of its own, so the producer's stores and the consumer's do
/// not evict each other's.
#[repr(align(128))]
#[derive(Default)]
pub struct Padded(pub AtomicU64);

/// One ring of records.
pub struct Ring<T: Copy> {
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
