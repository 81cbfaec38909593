//! The event log on a crash (SIGSEGV, SIGBUS, SIGABRT): what the rings still hold is
//! written with `write(2)` from a static buffer, then the signal's action proceeds.
//!
//! Invariant: async-signal-safe throughout: atomics, `gettid`, `nanosleep` and `write(2)`,
//! no lock, no allocation (the codec's event and mark encoders write into the static
//! buffer). The crash path takes the gate (`GATE`) from the writer thread, waiting out a
//! chunk being written, so it writes exactly the events not yet in the file; the stacks and
//! range paths those events name are written first, by the writer thread, which the crash
//! path only waits for, bounded (see [`wait_for_tables`]).

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use cushim::trace::event::TraceEvent;
use cushim::trace::log::codec::{EventEncoder, MarkEncoder, RangeMark};
use cushim::trace::log::format::{self, kind, CHUNK_HEAD};

use super::event_ring;
use super::shared::{
    CHUNK_BYTES, DRAINING, FATAL_BUSY, FD, GATE, IDLE, MARKS, MAX_RANGE, MAX_STACK, ON,
    RANGES_DONE, STACKS_DONE, STOLEN, WRITER_TID,
};

/// The fatal path's chunk buffer (head, then payload), used only while `FATAL_BUSY` is held.
static mut FATAL_CHUNK: [u8; CHUNK_HEAD + CHUNK_BYTES] = [0; CHUNK_HEAD + CHUNK_BYTES];

/// From a SIGSEGV/SIGBUS/SIGABRT handler: write what the rings hold, with `write(2)` only.
pub fn flush_from_signal() {
    if !ON.load(Ordering::Acquire) {
        return;
    }
    if FATAL_BUSY
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let fd = FD.load(Ordering::Acquire);
    wait_for_tables();
    // Take the gate, waiting out a chunk the writer is writing; not on the writer thread
    // itself (it cannot finish its chunk while it is here: its tails are not advanced, so
    // the chunk's events are still in the rings), and bounded, in case the writer is stuck.
    // SAFETY: gettid has no preconditions; async-signal-safe.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut stolen = false;
    if WRITER_TID.load(Ordering::Acquire) != me {
        for _ in 0..50_000_000u64 {
            match GATE.compare_exchange(IDLE, STOLEN, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    stolen = true;
                    break;
                }
                Err(STOLEN) => break,
                Err(_) => std::hint::spin_loop(),
            }
        }
    }
    if let Some(ring) = MARKS.get() {
        let (mut i, end) = (ring.tail(), ring.head());
        write_marks_from_signal(fd, &mut || {
            // SAFETY: with the gate STOLEN (or the writer stopped) nobody else consumes,
            // and tail <= i < head.
            (i < end).then(|| {
                i += 1;
                unsafe { ring.get(i - 1) }
            })
        });
        if stolen {
            ring.consumed(end);
        }
    }
    event_ring::each(|ring| {
        // SAFETY: with the gate STOLEN (or the writer stopped) nobody else consumes.
        let mut span = unsafe { ring.span() };
        write_from_signal(fd, &mut || span.next_event());
        if stolen {
            // SAFETY: this thread holds the gate and the span's events are written.
            unsafe { ring.consumed(&span) };
        }
    });
    if stolen {
        GATE.store(IDLE, Ordering::Release);
    }
    FATAL_BUSY.store(false, Ordering::Release);
}

/// The longest the crash path waits for the writer thread to write the stack and range
/// tables (it symbolizes: the first stacks load debug information).
const TABLES_WAIT_MS: u64 = 10_000;

/// From the crash path, before it writes the queued events: wait until the writer thread
/// has written every stack and range path recorded so far, so the events written next have
/// their stacks in the file.
///
/// Why this is sound in a signal handler: this thread only loads atomics, calls
/// `syscall(gettid)` and `nanosleep` (both async-signal-safe) and takes no lock; the
/// symbolizing, allocating and locking happen on the writer thread, which keeps running
/// while this one waits. The wait is bounded: if the crashed thread holds a lock the writer
/// needs (the stack table's, or malloc's after heap corruption), the writer stalls and the
/// events are written after [`TABLES_WAIT_MS`] without those stacks. A crash on the writer
/// thread itself does not wait (it cannot write while it is here).
fn wait_for_tables() {
    // SAFETY: gettid has no preconditions; async-signal-safe.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    if !DRAINING.load(Ordering::Acquire) || WRITER_TID.load(Ordering::Acquire) == me {
        return;
    }
    let stacks = MAX_STACK.load(Ordering::Acquire);
    let ranges = MAX_RANGE.load(Ordering::Acquire);
    let nap = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    for _ in 0..TABLES_WAIT_MS {
        if STACKS_DONE.load(Ordering::Acquire) >= stacks
            && RANGES_DONE.load(Ordering::Acquire) >= ranges
        {
            return;
        }
        // SAFETY: nanosleep with a valid request and no remainder; async-signal-safe.
        unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
    }
}

/// Encode the events `next` gives into chunks in the static buffer and `write(2)` them.
fn write_from_signal(fd: c_int, next: &mut dyn FnMut() -> Option<TraceEvent>) {
    // SAFETY: FATAL_BUSY gives this thread sole use of the static buffer.
    let buf = unsafe { &mut *std::ptr::addr_of_mut!(FATAL_CHUNK) };
    loop {
        let (head, payload) = buf.split_at_mut(CHUNK_HEAD);
        let mut enc = EventEncoder::new();
        let mut pos = 0;
        // MAX_EVENT_BYTES is far below the 4096 bytes left: `put` always succeeds.
        while pos < CHUNK_BYTES - 4096 {
            let Some(ev) = next() else { break };
            if let Some(p) = enc.put(&ev, payload, pos) {
                pos = p;
            }
        }
        if pos == 0 {
            break;
        }
        let mut h = [0u8; CHUNK_HEAD];
        format::chunk_head(kind::EVENTS, &payload[..pos], &mut h);
        head.copy_from_slice(&h);
        write_from_static(fd, &buf[..CHUNK_HEAD + pos]);
    }
}

/// Encode the marks `next` gives into `MARKS` chunks in the static buffer and `write(2)`
/// them (the fatal-signal path).
fn write_marks_from_signal(fd: c_int, next: &mut dyn FnMut() -> Option<RangeMark>) {
    // SAFETY: FATAL_BUSY gives this thread sole use of the static buffer.
    let buf = unsafe { &mut *std::ptr::addr_of_mut!(FATAL_CHUNK) };
    loop {
        let (head, payload) = buf.split_at_mut(CHUNK_HEAD);
        let mut enc = MarkEncoder::default();
        let mut pos = 0;
        while pos < CHUNK_BYTES - 4096 {
            let Some(m) = next() else { break };
            if let Some(p) = enc.put(&m, payload, pos) {
                pos = p;
            }
        }
        if pos == 0 {
            break;
        }
        let mut h = [0u8; CHUNK_HEAD];
        format::chunk_head(kind::MARKS, &payload[..pos], &mut h);
        head.copy_from_slice(&h);
        write_from_static(fd, &buf[..CHUNK_HEAD + pos]);
    }
}

/// `write(2)` all of `bytes` (async-signal-safe; gives up on an error).
fn write_from_static(fd: c_int, bytes: &[u8]) {
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: write(2) from a valid slice: async-signal safe.
        let n = unsafe {
            libc::write(
                fd,
                bytes[off..].as_ptr() as *const c_void,
                bytes.len() - off,
            )
        };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}
