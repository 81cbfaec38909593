//! One sink's ring of events, encoded by the recording thread in the log's own records
//! (`cushim::trace::log::codec`), in blocks that are each a chunk's payload as the file
//! holds it, which the writer thread copies to the file as they are.
//!
//! Policy:
//! - Why the recording thread encodes: an event is 56 bytes in memory and about 5 encoded.
//!   Copying it whole into a slot meant a cache line the writer's core had just read for
//!   almost every event (the push waited for it), and the writer then read all 56 bytes
//!   from the other core and encoded them. Encoding where the event is made costs a few
//!   stores into a line that stays in the recording core's cache for a dozen events, and
//!   leaves the writer a tenth of the bytes to move, and nothing to encode.
//! - The ring is cut into blocks of [`BLOCK_BYTES`]. Each block starts from a zero delta
//!   base, as a chunk of the file does, so a finished block is a chunk's payload: the
//!   writer copies it whole. The producer leaves a block when [`MAX_EVENT_BYTES`] no longer
//!   fit in it, noting its length and event count, and enters the next one only when that
//!   whole block is free: within a block a push checks no room at all, and a block's note
//!   is never rewritten while a consumer may still read it.
//! - A block not yet finished is written only when a round finds no finished block to
//!   write (so at a high rate every chunk is a copy, and at a low one an event still waits
//!   at most two rounds). Its events are decoded to re-encode the first from a zero base
//!   and to learn the base after the last, which is kept with the tail (`tail_base`) for
//!   whoever consumes next: the writer's next round, or the crash path.
//! - Only the writer, or the crash path once it holds the writer's gate, consumes: it reads
//!   bytes before the head it loaded and moves the tail only once they are in the file, so
//!   a crash path holding the gate finds exactly the events not yet written.
//! - The producer wakes the writer each time its head passes a quarter of the ring.
//! - A full ring makes its producer wait (see `sink.rs`); rings live as long as the
//!   process, allocated once at start-up and touched as they fill.

use std::cell::UnsafeCell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use cushim::trace::event::TraceEvent;
use cushim::trace::log::codec::EventEncoder;
use cushim::trace::log::format::MAX_EVENT_BYTES;

use super::ring::{Padded, Pushed};

/// Bytes of one sink's ring: about 50 000 events of the usual 5 bytes.
pub const RING_BYTES: usize = 1 << 18;
/// Bytes of one block: one chunk's payload at most.
pub const BLOCK_BYTES: usize = 1 << 15;
const BLOCKS: usize = RING_BYTES / BLOCK_BYTES;
const MASK: u64 = RING_BYTES as u64 - 1;
/// The producer wakes the writer each time its head passes a multiple of this.
const WAKE_BYTES: u64 = RING_BYTES as u64 / 4;
/// The most rings: two per device and two for pinned host memory, for up to 127 devices.
pub const MAX_RINGS: usize = 256;

/// The producer's own state, on a line of its own (only the producer touches it, and the
/// fork handler, while every producer's lock is held across the fork).
#[repr(align(128))]
struct ProducerSide {
    /// Bytes pushed (the ring's head, kept here so a push does not load it).
    head: u64,
    /// Where the block being filled starts.
    block: u64,
    /// Events in that block.
    events: u32,
    /// The ring's tail as last loaded.
    tail_seen: u64,
    /// The delta base: the block's last event.
    enc: EventEncoder,
}

/// A finished block's length and events (stored by the producer as it leaves the block,
/// before the head that passes its end).
#[derive(Default)]
struct BlockNote {
    bytes: AtomicU32,
    events: AtomicU32,
}

/// One sink's ring.
pub struct EventRing {
    bytes: Box<[UnsafeCell<u8>]>,
    /// Bytes pushed so far (stored by the producer only, with release, after the records
    /// and the notes of the blocks it left).
    head: Padded,
    /// Bytes consumed so far: in the file (stored by the gate's holder only).
    tail: Padded,
    notes: [BlockNote; BLOCKS],
    producer: UnsafeCell<ProducerSide>,
    /// The delta base at `tail` (written by the gate's holder, before `tail`).
    tail_base: UnsafeCell<EventEncoder>,
}

// SAFETY: the producer writes only within its block, which it entered once the consumer's
// tail had passed all of it (so no consumer reads there until the head it stores next, with
// release, after the bytes), and notes a block before the head passes its end; the consumer
// reads bytes and notes only before a head it loaded with acquire, and stores a tail past
// them (release) only once done. `producer` is touched only by the one producer (its sink's
// lock; the fork handler holds that lock), `tail_base` only by the consumer holding the
// writer's gate.
unsafe impl Sync for EventRing {}

static RINGS: [AtomicPtr<EventRing>; MAX_RINGS] = [const { AtomicPtr::new(null_mut()) }; MAX_RINGS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// A new registered ring and its one producer, or `None` when [`MAX_RINGS`] are taken.
pub fn register() -> Option<Producer> {
    let i = COUNT.fetch_add(1, Ordering::AcqRel);
    if i >= MAX_RINGS {
        return None;
    }
    let ring = EventRing::leaked();
    RINGS[i].store(
        ring as *const EventRing as *mut EventRing,
        Ordering::Release,
    );
    Some(Producer { ring })
}

/// Every registered ring, in registration order.
pub fn each(mut f: impl FnMut(&'static EventRing)) {
    let n = COUNT.load(Ordering::Acquire).min(MAX_RINGS);
    for slot in &RINGS[..n] {
        let p = slot.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: registered rings are leaked: they live as long as the process.
            f(unsafe { &*p });
        }
    }
}

/// The producer's side of a ring: one per ring, owned by its sink, used under its lock.
pub struct Producer {
    ring: &'static EventRing,
}

impl Producer {
    /// The ring this producer fills.
    #[cfg(test)]
    pub fn ring(&self) -> &'static EventRing {
        self.ring
    }

    /// Encode `ev` into the ring when there is room.
    #[inline]
    pub fn push(&mut self, ev: &TraceEvent) -> Pushed {
        let ring = self.ring;
        // SAFETY: this is the ring's only producer (`&mut self`, one per ring).
        let p = unsafe { &mut *ring.producer.get() };
        if p.head - p.block > (BLOCK_BYTES - MAX_EVENT_BYTES) as u64 && !next_block(ring, p) {
            return Pushed::Full;
        }
        let at = (p.head & MASK) as usize;
        // SAFETY: [head, head + MAX_EVENT_BYTES) lies in the producer's block (the check
        // above), all free since it entered the block.
        let out = unsafe { ring.free_bytes(at, MAX_EVENT_BYTES) };
        let Some(len) = p.enc.put(ev, out, 0) else {
            return Pushed::Full; // never: MAX_EVENT_BYTES are free
        };
        let (old, new) = (p.head, p.head + len as u64);
        p.head = new;
        p.events += 1;
        ring.head.0.store(new, Ordering::Release);
        if (old ^ new) >= WAKE_BYTES {
            Pushed::Wake
        } else {
            Pushed::Done
        }
    }
}

/// Leave the producer's block for the next one, when the consumer has freed all of it.
#[cold]
fn next_block(ring: &EventRing, p: &mut ProducerSide) -> bool {
    let next = p.block + BLOCK_BYTES as u64;
    if next + BLOCK_BYTES as u64 - p.tail_seen > RING_BYTES as u64 {
        p.tail_seen = ring.tail.0.load(Ordering::Acquire);
        if next + BLOCK_BYTES as u64 - p.tail_seen > RING_BYTES as u64 {
            return false;
        }
    }
    let note = &ring.notes[block_index(p.block)];
    note.bytes
        .store((p.head - p.block) as u32, Ordering::Relaxed);
    note.events.store(p.events, Ordering::Relaxed);
    p.block = next;
    p.head = next;
    p.events = 0;
    p.enc = EventEncoder::new();
    true
}

fn block_index(start: u64) -> usize {
    ((start & MASK) / BLOCK_BYTES as u64) as usize
}

fn block_start(pos: u64) -> u64 {
    pos & !(BLOCK_BYTES as u64 - 1)
}

impl EventRing {
    fn leaked() -> &'static EventRing {
        // Zeroed memory from the allocator (`calloc`: fresh pages for a buffer this size),
        // so the pages are touched only as the ring fills, not all at start-up.
        let zeroed: Box<[u8]> = vec![0u8; RING_BYTES].into_boxed_slice();
        // SAFETY: `UnsafeCell<u8>` is `repr(transparent)` over `u8`: the same layout, so the
        // box's allocation is the slice's.
        let bytes = unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [UnsafeCell<u8>]) };
        Box::leak(Box::new(EventRing {
            bytes,
            head: Padded::default(),
            tail: Padded::default(),
            notes: Default::default(),
            producer: UnsafeCell::new(ProducerSide {
                head: 0,
                block: 0,
                events: 0,
                tail_seen: 0,
                enc: EventEncoder::new(),
            }),
            tail_base: UnsafeCell::new(EventEncoder::new()),
        }))
    }

    /// The producer's bytes `[at, at + len)` of the buffer.
    ///
    /// # Safety
    /// The caller is the producer and the bytes are free (no consumer reads them).
    #[allow(clippy::mut_from_ref)]
    unsafe fn free_bytes(&self, at: usize, len: usize) -> &mut [u8] {
        debug_assert!(at + len <= RING_BYTES);
        // SAFETY: in bounds; `UnsafeCell<u8>` has u8's layout; the caller's contract makes
        // this the only access to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.bytes[at].get(), len) }
    }

    /// Published bytes `[from, to)` (within one block), for the consumer.
    ///
    /// # Safety
    /// The caller holds the gate and the bytes lie between the tail and a head it loaded.
    unsafe fn published(&self, from: u64, to: u64) -> &[u8] {
        let at = (from & MASK) as usize;
        let len = (to - from) as usize;
        debug_assert!(at + len <= RING_BYTES);
        // SAFETY: in bounds; the producer does not write published, unconsumed bytes.
        unsafe { std::slice::from_raw_parts(self.bytes[at].get() as *const u8, len) }
    }

    /// Bytes consumed so far.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.tail.0.load(Ordering::Acquire)
    }

    /// The events waiting now, from the tail to the head.
    ///
    /// # Safety
    /// The caller consumes: it holds the writer's gate (or is the crash path).
    pub unsafe fn span(&'static self) -> Span {
        Span {
            ring: self,
            pos: self.tail(),
            // SAFETY: the caller's contract: `tail_base` is the gate holder's.
            base: unsafe { *self.tail_base.get() },
            based: true,
            end: self.head.0.load(Ordering::Acquire),
        }
    }

    /// The events waiting now, up to the head, for a consumer that does not hold the gate
    /// yet: where they start, and from which base, is read by [`Span::catch_up`] once it
    /// does.
    pub fn span_to_head(&'static self) -> Span {
        Span {
            ring: self,
            pos: self.tail(),
            base: EventEncoder::new(),
            based: false,
            end: self.head.0.load(Ordering::Acquire),
        }
    }

    /// Mark the bytes before `span.pos` consumed, with the base there.
    ///
    /// # Safety
    /// The caller holds the writer's gate and the span's events are in the file.
    pub unsafe fn consumed(&self, span: &Span) {
        // SAFETY: the caller's contract.
        unsafe { *self.tail_base.get() = span.base };
        self.tail.0.store(span.pos, Ordering::Release);
    }

    /// In a fork child: the events still in the ring are the parent's (its writer writes
    /// them to its log); the child's log starts empty, from the producer's base.
    ///
    /// # Safety
    /// Called from the fork handler: every producer's lock is held across the fork, so no
    /// push is under way, and no consumer exists in the child.
    pub unsafe fn forget(&self) {
        // SAFETY: the caller's contract.
        let p = unsafe { &*self.producer.get() };
        // SAFETY: as above.
        unsafe { *self.tail_base.get() = p.enc };
        self.tail.0.store(p.head, Ordering::Release);
    }
}

/// A consumer's view of a ring's waiting events: from `pos` (base `base`) to `end`.
#[derive(Clone, Copy)]
pub struct Span {
    ring: &'static EventRing,
    pub pos: u64,
    pub base: EventEncoder,
    /// Whether `pos` and `base` were read holding the gate.
    based: bool,
    pub end: u64,
}

/// Where a span's next event waits: its record's place, the base it was encoded after,
/// and, when its block is finished, the block's length and event count.
struct Next {
    at: u64,
    base: EventEncoder,
    note: Option<(u64, u32)>,
}

/// An event decoded and not yet taken: its record is at `at` (`len` bytes).
#[derive(Clone, Copy)]
pub struct Peeked {
    pub ev: TraceEvent,
    at: u64,
    len: u64,
}

impl Span {
    /// Whether the block `pos` is in is finished (the head passed its end): its length and
    /// event count, from its note.
    fn finished(&self, pos: u64) -> Option<(u64, u32)> {
        let start = block_start(pos);
        if self.end <= start + BLOCK_BYTES as u64 {
            return None;
        }
        let note = &self.ring.notes[block_index(start)];
        Some((
            u64::from(note.bytes.load(Ordering::Relaxed)),
            note.events.load(Ordering::Relaxed),
        ))
    }

    /// Where the next event waits: past a finished block's end, at the next block's start.
    /// `None` when no event waits.
    fn next(&self) -> Option<Next> {
        let mut at = self.pos;
        let mut note = self.finished(at);
        if let Some((bytes, _)) = note {
            if at >= block_start(at) + bytes {
                at = block_start(at) + BLOCK_BYTES as u64;
                note = self.finished(at);
            }
        }
        // Every block's first record is encoded from a zero base.
        let base = if at == block_start(at) {
            EventEncoder::new()
        } else {
            self.base
        };
        (at < self.end).then_some(Next { at, base, note })
    }

    /// The next event, not taken; `None` at the end (or on a record that does not decode,
    /// which only memory corruption makes: the span then ends there).
    #[inline]
    pub fn peek(&self) -> Option<Peeked> {
        let Next { at, base, note } = self.next()?;
        // The block's records end at its note's length when it is finished, else at the
        // head loaded.
        let data_end = note.map_or(self.end, |(bytes, _)| block_start(at) + bytes);
        let to = data_end.min(at + MAX_EVENT_BYTES as u64);
        // SAFETY: the span's consumer holds the gate; [at, to) is within one block, before
        // the head it loaded and after the tail.
        let (ev, len) = base.decode_next(unsafe { self.ring.published(at, to) })?;
        Some(Peeked {
            ev,
            at,
            len: len as u64,
        })
    }

    /// Take the event [`Span::peek`] gave.
    #[inline]
    pub fn take(&mut self, p: &Peeked) {
        self.pos = p.at + p.len;
        self.base = EventEncoder::after(&p.ev);
    }

    /// The next event, taken.
    #[inline]
    pub fn next_event(&mut self) -> Option<TraceEvent> {
        let p = self.peek()?;
        self.take(&p);
        Some(p.ev)
    }

    /// Whether the next event waiting is in a finished block.
    pub fn next_is_finished(&self) -> bool {
        self.next().is_some_and(|n| n.note.is_some())
    }

    /// Start where the tail is (the crash path may have moved it since this span was made),
    /// with its base.
    ///
    /// # Safety
    /// The caller holds the writer's gate.
    pub unsafe fn catch_up(&mut self) {
        let tail = self.ring.tail();
        if !self.based || tail > self.pos {
            self.based = true;
            self.pos = tail;
            // SAFETY: the caller's contract.
            self.base = unsafe { *self.ring.tail_base.get() };
        }
    }

    /// Whether an event waits.
    pub fn waiting(&self) -> bool {
        self.next().is_some()
    }

    /// The ring this span is of.
    pub fn ring(&self) -> &'static EventRing {
        self.ring
    }
}

/// Fill a chunk's payload in `out` from one span, within one block: a finished block not
/// yet begun is copied whole; otherwise the first event is re-encoded from a zero base and
/// the records after it, to the block's end, copied as they are (each is relative to the
/// one before), as long as [`MAX_EVENT_BYTES`] are left before each (the rule
/// `EventEncoder::put` follows). Returns the payload's length and the events in it.
pub fn fill_from_one(span: &mut Span, out: &mut [u8]) -> (usize, u64) {
    let Some(Next { at, note, .. }) = span.next() else {
        return (0, 0);
    };
    if at == block_start(at) {
        if let Some((bytes, events)) = note {
            if (bytes as usize) <= out.len() {
                // SAFETY: the span's consumer holds the gate; a finished block's bytes are
                // before the head it loaded.
                out[..bytes as usize]
                    .copy_from_slice(unsafe { span.ring.published(at, at + bytes) });
                span.pos = at + BLOCK_BYTES as u64;
                span.base = EventEncoder::new();
                return (bytes as usize, u64::from(events));
            }
        }
    }
    let Some(first) = span.peek() else {
        return (0, 0);
    };
    let Some(mut len) = EventEncoder::new().put(&first.ev, out, 0) else {
        return (0, 0);
    };
    span.take(&first);
    let start = span.pos;
    let mut n = 1u64;
    let room = out.len().saturating_sub(MAX_EVENT_BYTES);
    while len + (span.pos - start) as usize <= room {
        let Some(p) = span.peek() else { break };
        if p.at != span.pos {
            break; // the next block: another base
        }
        span.take(&p);
        n += 1;
    }
    let copied = (span.pos - start) as usize;
    if copied > 0 {
        // SAFETY: as above: [start, pos) is within one block, before the head loaded.
        out[len..len + copied].copy_from_slice(unsafe { span.ring.published(start, span.pos) });
        len += copied;
    }
    (len, n)
}

/// Fill a chunk's payload in `out` from several spans, oldest event first, with a fresh
/// encoder (the events of different rings interleave, so nothing is copied as it is).
pub fn fill_merged(spans: &mut [Span], out: &mut [u8]) -> (usize, u64) {
    let mut enc = EventEncoder::new();
    let mut len = 0;
    let mut n = 0u64;
    let mut peeked: [Option<Peeked>; MAX_RINGS] = [None; MAX_RINGS];
    for (s, p) in spans.iter().zip(peeked.iter_mut()) {
        *p = s.peek();
    }
    loop {
        let mut best: Option<(usize, Peeked)> = None;
        for (i, p) in peeked[..spans.len()].iter().enumerate() {
            if let Some(p) = p {
                if best.map_or(true, |(_, b)| p.ev.time_us < b.ev.time_us) {
                    best = Some((i, *p));
                }
            }
        }
        let Some((i, p)) = best else { break };
        match enc.put(&p.ev, out, len) {
            Some(l) => len = l,
            None => break,
        }
        spans[i].take(&p);
        peeked[i] = spans[i].peek();
        n += 1;
    }
    (len, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cushim::trace::event::Action;
    use cushim::trace::log::codec::decode_events;
    use cushim::trace::log::format::VERSION;

    fn event(i: u64) -> TraceEvent {
        TraceEvent {
            action: Action::ALL[(i % 9) as usize],
            device: (i % 7 / 5) as i32,
            // Address deltas from one byte to nine: records of every length.
            addr: i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (i % 40),
            size: (i % 13) * 4096 + i % 3,
            stream: i % 3 / 2,
            time_us: 1_700_000_000_000_000 + (i as i64) * 17,
            stack: (i % 5) as u32,
            device_free: if i % 9 == Action::Oom as u64 { i } else { 0 },
            range: (i % 11 / 10) as u32,
        }
    }

    /// Consume everything waiting as the writer does, chunk by chunk; returns the events.
    fn drain(ring: &'static EventRing, one: bool) -> Vec<TraceEvent> {
        let mut got = Vec::new();
        // SAFETY: the test is the only consumer.
        let mut span = unsafe { ring.span() };
        let mut out = vec![0u8; 64 << 10];
        loop {
            let (len, n) = if one {
                fill_from_one(&mut span, &mut out)
            } else {
                fill_merged(std::slice::from_mut(&mut span), &mut out)
            };
            if n == 0 {
                break;
            }
            let back = decode_events(&out[..len], VERSION, |e| got.push(e)).expect("decodes");
            assert_eq!(back, n);
        }
        // SAFETY: as above; the events are "written".
        unsafe { ring.consumed(&span) };
        got
    }

    /// The longest record there is after `base`: every field differs as far as it can.
    fn longest_after(base: &TraceEvent) -> TraceEvent {
        TraceEvent {
            action: Action::Oom,
            device: if base.device == i32::MIN { 0 } else { i32::MIN },
            addr: base.addr.wrapping_add(1 << 63),
            size: u64::MAX >> 1,
            stream: if base.stream == u64::MAX { 0 } else { u64::MAX },
            time_us: base.time_us.wrapping_add(i64::MIN),
            stack: u32::MAX,
            device_free: u64::MAX,
            range: if base.range == u32::MAX { 1 } else { u32::MAX },
        }
    }

    #[test]
    fn events_come_out_as_pushed_across_many_wraps_in_chunks_that_start_from_zero() {
        for one in [true, false] {
            let mut prod = register().expect("a ring");
            let ring = prod.ring;
            let mut want = Vec::new();
            let mut got = Vec::new();
            let mut i = 0u64;
            // Ten laps of the ring, drained whenever it is full.
            while ring.head.0.load(Ordering::Relaxed) < 10 * RING_BYTES as u64 {
                let ev = event(i);
                match prod.push(&ev) {
                    Pushed::Full => got.extend(drain(ring, one)),
                    _ => {
                        want.push(ev);
                        i += 1;
                    }
                }
            }
            got.extend(drain(ring, one));
            assert_eq!(got.len(), want.len());
            assert!(got == want, "the events differ (one span: {one})");
        }
    }

    #[test]
    fn a_full_ring_refuses_until_the_consumer_moves_its_tail() {
        let mut prod = register().expect("a ring");
        let ring = prod.ring;
        let mut pushed = 0;
        while prod.push(&event(pushed)) != Pushed::Full {
            pushed += 1;
        }
        let head = ring.head.0.load(Ordering::Relaxed);
        assert!(head + MAX_EVENT_BYTES as u64 > RING_BYTES as u64);
        assert_eq!(drain(ring, true).len() as u64, pushed);
        assert_ne!(prod.push(&event(pushed)), Pushed::Full);
    }

    #[test]
    fn a_record_ending_exactly_at_a_blocks_end_is_followed_by_a_block_from_a_zero_base() {
        let mut prod = register().expect("a ring");
        let ring = prod.ring;
        let mut want = Vec::new();
        let mut last = event(0);
        let push = |prod: &mut Producer, ev: TraceEvent, want: &mut Vec<TraceEvent>| {
            assert_ne!(prod.push(&ev), Pushed::Full);
            want.push(ev);
            ev
        };
        last = push(&mut prod, last, &mut want);
        // Small records (the same event but its size: 4 to 13 bytes) until exactly
        // MAX_EVENT_BYTES are left in the block.
        let in_block = |ring: &EventRing| {
            // SAFETY: the test is the producer and pushes nothing meanwhile.
            let p = unsafe { &*ring.producer.get() };
            (BLOCK_BYTES - MAX_EVENT_BYTES) - (p.head - p.block) as usize
        };
        loop {
            let left = in_block(ring);
            if left == 0 {
                break;
            }
            let digits = if left <= 13 {
                left - 3
            } else {
                (left - 4).min(10)
            };
            let size = if digits == 1 {
                1
            } else {
                (1u64 << (7 * (digits - 1))) >> 1 | 1
            };
            last = push(&mut prod, TraceEvent { size, ..last }, &mut want);
            assert_eq!(in_block(ring), left - digits - 3, "a {digits}-digit size");
        }
        // The longest record: it ends exactly at the block's end.
        push(&mut prod, longest_after(&last), &mut want);
        // SAFETY: as above.
        let head = unsafe { (*ring.producer.get()).head };
        assert_eq!(
            head % BLOCK_BYTES as u64,
            0,
            "the block is full to its last byte"
        );
        // Consumed before the producer leaves the block: read as a block being filled.
        let mut got = drain(ring, true);
        for i in 1..1000 {
            push(&mut prod, event(i), &mut want);
        }
        got.extend(drain(ring, true));
        assert!(got == want);
    }

    #[test]
    fn a_forgotten_ring_starts_from_the_producers_base() {
        let mut prod = register().expect("a ring");
        let ring = prod.ring;
        for i in 0..100 {
            prod.push(&event(i));
        }
        // SAFETY: no push runs and no consumer exists while the test forgets.
        unsafe { ring.forget() };
        assert_eq!(ring.tail(), ring.head.0.load(Ordering::Relaxed));
        for i in 100..200 {
            prod.push(&event(i));
        }
        assert_eq!(drain(ring, true), (100..200).map(event).collect::<Vec<_>>());
    }
}
