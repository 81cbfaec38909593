//! The state the event log's parts share, named in one place: the switches the allocating
//! threads read (`ON`, `DRAINING`, `CHILD`), the file (`FD`), the writer thread's identity
//! (`THREAD`, `WRITER_TID`), the ids published to it and those it has written
//! (`MAX_STACK`/`MAX_RANGE`, `STACKS_DONE`/`RANGES_DONE`), the marks' ring, the gate
//! between the writer and the crash path, and a fork child's state.
//!
//! Invariant: every one is an atomic or a set-once cell, so any part may read it from any
//! thread, from the fork handler and from a fatal-signal handler, without a lock. Who
//! writes what: the log's opening sets `FD`, `ON`, `DRAINING`, `HEADER` and `MARKS`; the
//! allocating threads only raise `MAX_STACK`/`MAX_RANGE` and count `DROPPED`; the writer
//! thread advances `STACKS_DONE`/`RANGES_DONE`; the writer and the crash path take `GATE`
//! in turn; the fork handler resets them all in a child. A static only one part uses stays
//! in that part: the writer state (`writer.rs`), the crash path's buffer (`crash.rs`).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8};

use cushim::trace::log::codec::RangeMark;
use once_cell::sync::OnceCell;

use super::ring::Ring;

/// How often the writer wakes while the program records little. An event waits at most
/// two rounds (`event_ring.rs`: a block still being filled may wait one round more).
pub const FLUSH_MS: u64 = 10;
/// One events chunk's payload.
pub(super) const CHUNK_BYTES: usize = 64 << 10;

/// `CUSHIM_LOG`, read once (`None`: no log asked for).
pub(super) static TEMPLATE: OnceCell<Option<String>> = OnceCell::new();
/// Whether events go to the rings (set once the file is open; cleared in a fork child).
pub(super) static ON: AtomicBool = AtomicBool::new(false);
/// Whether a writer drains the rings (else a full ring drops).
pub(super) static DRAINING: AtomicBool = AtomicBool::new(false);
/// Events dropped because no writer could take them (written in a `DROPPED` chunk).
pub(super) static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The log's descriptor (-1 before it opens; a fork child closes its parent's copy).
pub(super) static FD: AtomicI32 = AtomicI32::new(-1);
/// The writer thread's handle (a leaked box, replaced in a fork child that logs).
pub(super) static THREAD: AtomicPtr<std::thread::Thread> = AtomicPtr::new(std::ptr::null_mut());
/// The parent's header, which a fork child's log starts from.
pub(super) static HEADER: OnceCell<serde_json::Value> = OnceCell::new();
/// The writer thread's kernel thread id (0 until it runs).
pub(super) static WRITER_TID: AtomicI32 = AtomicI32::new(0);
/// The largest stack id and NVTX range id recorded so far (ids are handed out in order, so
/// every id an event in a ring names is at most these).
pub(super) static MAX_STACK: AtomicU32 = AtomicU32::new(0);
pub(super) static MAX_RANGE: AtomicU32 = AtomicU32::new(0);
/// Recording threads waiting for room in a full ring, and the count the writer raises
/// (then wakes them on it) each time it frees room while one waits.
pub(super) static WAITING: AtomicU32 = AtomicU32::new(0);
pub(super) static ROOM: AtomicU32 = AtomicU32::new(0);
/// Every stack (range) id up to this one is in the file.
pub(super) static STACKS_DONE: AtomicU32 = AtomicU32::new(0);
pub(super) static RANGES_DONE: AtomicU32 = AtomicU32::new(0);

/// The log's path template, when one is asked for.
pub(super) fn template() -> Option<&'static str> {
    TEMPLATE
        .get_or_init(|| std::env::var("CUSHIM_LOG").ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Whether `CUSHIM_LOG` asks for a log.
pub fn requested() -> bool {
    template().is_some()
}

/// Slots of the range marks' ring.
pub(super) const MARK_SLOTS: u64 = 1 << 12;
/// The range marks' ring (made when the log starts).
pub(super) static MARKS: OnceCell<&'static Ring<RangeMark>> = OnceCell::new();

/// Set in a fork child until it has a log of its own: the file and writer are the parent's.
pub(super) static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// A fork child of a logging process: its own log is not started (`CHILD_PENDING`), is
/// being started by one of its threads (`CHILD_STARTING`), or there is nothing to do.
pub(super) static CHILD: AtomicU8 = AtomicU8::new(CHILD_NONE);
pub(super) const CHILD_NONE: u8 = 0;
pub(super) const CHILD_PENDING: u8 = 1;
pub(super) const CHILD_STARTING: u8 = 2;

/// The gate between the writer thread and the crash path over the rings' unwritten events:
/// IDLE (nobody consumes), WRITING (the writer is encoding and writing one chunk; it
/// advances the rings' tails once the chunk is written), STOLEN (the crash path writes
/// what the rings hold itself). The crash path waits out WRITING (the writer runs on, on
/// its own thread, and leaves it within one chunk's write), takes the gate from IDLE, and
/// opens it again when done (a handler of the program's may keep the program running).
pub(super) const IDLE: u8 = 0;
pub(super) const WRITING: u8 = 1;
pub(super) const STOLEN: u8 = 2;
pub(super) static GATE: AtomicU8 = AtomicU8::new(IDLE);

/// Serializes the fatal-signal flushes (taken with a compare-exchange: a second crashing
/// thread does not wait in its handler).
pub(super) static FATAL_BUSY: AtomicBool = AtomicBool::new(false);
