//! The allocating threads' side of the event log: the sink that hands each recorded event
//! to its ring, and the NVTX range annotations' hook that hands each range start and end to
//! the marks' ring.
//!
//! Invariant: a push encodes the event into its ring's bytes and stores the ring's head: no
//! I/O, no allocation, no lock and no read-modify-write of its own (a new stack or range id raises
//! `MAX_STACK`/`MAX_RANGE` once). A full ring makes the pushing thread wait for the writer
//! (a log with a hole cannot be replayed); only when no writer can ever drain the rings
//! (`DRAINING` off) is the event counted in `DROPPED` instead. In a fork child the first
//! event starts the child's own log (`child.rs`).

use std::sync::atomic::{fence, Ordering};

use cushim::trace::annotations::Annotation;
use cushim::trace::event::{EventSink, TraceEvent, NO_STACK};
use cushim::trace::log::codec::RangeMark;
use cushim::trace::range::NO_RANGE;

use super::child::start_in_child;
use super::event_ring::{self, Producer};
use super::ring::Pushed;
use super::shared::{
    requested, CHILD, CHILD_NONE, DRAINING, DROPPED, MARKS, MAX_RANGE, MAX_STACK, ON, ROOM, THREAD,
    WAITING,
};

/// The range annotations' hook (called under their lock): the start or end into the
/// marks' ring.
pub(super) fn push_mark(a: &Annotation) {
    if !logging() {
        return;
    }
    let Some(ring) = MARKS.get() else { return };
    if a.path != NO_RANGE && a.path > MAX_RANGE.load(Ordering::Relaxed) {
        MAX_RANGE.fetch_max(a.path, Ordering::AcqRel);
    }
    let m = RangeMark {
        start: a.start,
        device: a.device,
        path: a.path,
        time_us: a.time_us,
    };
    loop {
        // SAFETY: the annotations' lock serializes every call of this hook, its only
        // producer.
        match unsafe { ring.push_serialized(&m) } {
            Pushed::Done => return,
            Pushed::Wake => return wake_writer(),
            Pushed::Full => {
                if !DRAINING.load(Ordering::Acquire) {
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                wake_writer();
                std::thread::yield_now();
            }
        }
    }
}

/// The sink that logs every event, then records it in `inner` as before.
pub struct LogSink {
    inner: Box<dyn EventSink>,
    /// This sink's ring (`None`: every ring is taken; its events count as dropped).
    ring: Option<Producer>,
}

/// Wrap a device's sink when a log is asked for.
pub fn wrap(inner: Box<dyn EventSink>) -> Box<dyn EventSink> {
    if !requested() {
        return inner;
    }
    let ring = event_ring::register();
    Box::new(LogSink { inner, ring })
}

impl EventSink for LogSink {
    fn enabled(&self) -> bool {
        true
    }

    #[inline]
    fn record(&mut self, mut ev: TraceEvent) {
        // The recording thread's NVTX range path (one thread-local read), as the ring takes it.
        if ev.range == NO_RANGE {
            ev.range = cushim::trace::range::current();
        }
        // A load of a line that is written only when a new id appears.
        if ev.stack != NO_STACK && ev.stack > MAX_STACK.load(Ordering::Relaxed) {
            MAX_STACK.fetch_max(ev.stack, Ordering::AcqRel);
        }
        if ev.range != NO_RANGE && ev.range > MAX_RANGE.load(Ordering::Relaxed) {
            MAX_RANGE.fetch_max(ev.range, Ordering::AcqRel);
        }
        self.push(&ev);
        self.inner.record(ev);
    }

    fn events(&self) -> Vec<TraceEvent> {
        self.inner.events()
    }
}

impl LogSink {
    #[inline]
    fn push(&mut self, ev: &TraceEvent) {
        if !logging() {
            return;
        }
        let Some(ring) = self.ring.as_mut() else {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match ring.push(ev) {
            Pushed::Done => {}
            Pushed::Wake => wake_writer(),
            Pushed::Full => wait_and_push(ring, ev),
        }
    }
}

/// Whether events go to the log now (in a fork child, the first one starts its own log).
#[inline]
fn logging() -> bool {
    ON.load(Ordering::Relaxed) || (CHILD.load(Ordering::Relaxed) != CHILD_NONE && start_in_child())
}

/// Wake the writer thread (an atomic swap when it is awake, a futex call when it sleeps).
#[inline]
fn wake_writer() {
    let t = THREAD.load(Ordering::Acquire);
    if !t.is_null() {
        // SAFETY: thread handles stored here are leaked boxes: they live for ever.
        unsafe { (*t).unpark() };
    }
}

/// A full ring: wait for the writer to make room, or count the event dropped when no
/// writer will.
///
/// Why a sleep and not a yield: the writer may take long (its first stacks load debug
/// information to symbolize them), and a thread that yields in a loop burns its core for
/// all that time. The wait is for `ROOM` to change, which the writer raises after each
/// chunk it writes while a thread is `WAITING`; registering, then trying again, then
/// sleeping only while `ROOM` is what it was before, cannot miss that wake-up (both sides
/// fence between their store and their load). A sleep lasts 1 ms at most, so a writer that
/// stopped (`DRAINING` off) is noticed.
#[cold]
fn wait_and_push(ring: &mut Producer, ev: &TraceEvent) {
    loop {
        if !DRAINING.load(Ordering::Acquire) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        wake_writer();
        let seen = ROOM.load(Ordering::Acquire);
        WAITING.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let pushed = ring.push(ev);
        if pushed == Pushed::Full {
            cushim::alloc::devlock::wait_while(&ROOM, seen);
        }
        WAITING.fetch_sub(1, Ordering::Release);
        match pushed {
            Pushed::Full => {}
            Pushed::Wake => return wake_writer(),
            Pushed::Done => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cushim::trace::event::Action;

    #[test]
    fn a_push_into_a_full_ring_waits_until_the_writer_frees_room_then_lands() {
        DRAINING.store(true, Ordering::Release);
        let mut prod = event_ring::register().expect("a ring");
        let ring = prod.ring();
        let ev = |i: u64| TraceEvent::now(Action::Alloc, 0, 4096 * i, 512, 0, NO_STACK);
        let mut pushed = 0;
        while prod.push(&ev(pushed)) != Pushed::Full {
            pushed += 1;
        }
        let last = ev(pushed);
        let pusher = std::thread::spawn(move || {
            wait_and_push(&mut prod, &last);
            prod
        });
        // The pusher registers as waiting (the ring stays full until this thread consumes).
        while WAITING.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        // Room, as the writer makes it: every event consumed, then the waiting woken.
        // SAFETY: this test is the ring's only consumer.
        let mut span = unsafe { ring.span() };
        let mut taken = 0;
        while span.next_event().is_some() {
            taken += 1;
        }
        assert_eq!(taken, pushed);
        // SAFETY: as above.
        unsafe { ring.consumed(&span) };
        super::super::writer::wake_waiting();
        let _prod = pusher.join().expect("the pusher returns");
        // SAFETY: as above.
        let mut span = unsafe { ring.span() };
        assert_eq!(span.next_event(), Some(last), "the waiting event landed");
        assert_eq!(span.next_event(), None);
        assert_eq!(DROPPED.load(Ordering::Relaxed), 0, "nothing dropped");
    }
}
