//! A `fork` child's event log. The child writes a log of its own, from its first recorded
//! event on, when the template has `%p` (the child's pid makes a new name); without `%p` its
//! log would be its parent's file, so it does not log and its first event says so on
//! stderr, once.
//!
//! Invariant: nothing the child does touches the parent's file or writer state. Why the
//! log starts at the first event and not in the fork handler: the handler runs inside
//! `fork`, where only async-signal-safe calls are allowed, and a log needs a file and a
//! writer thread; so the handler only resets atomics (the rings' unwritten events are the
//! parent's, which its writer writes to its log, so the child's rings start empty). The
//! event is recorded after `fork` returned, where the child runs ordinary code as any
//! program that forks without exec does (Python's multiprocessing: POSIX promises only
//! async-signal-safe calls there, glibc makes `malloc` and thread creation work by
//! resetting its own locks at the fork, and the shim's locks are held across the fork by
//! `life/fork.rs`); the event's thread then opens the child's file, writes its header (the
//! parent's, with the child's pid, `parent_pid` and a new clock origin) and starts a new
//! writer thread with a new writer state.

use std::sync::atomic::Ordering;

use super::event_ring;
use super::open::{open_log, say};
use super::shared::{
    template, CHILD, CHILD_NONE, CHILD_PENDING, CHILD_STARTING, DRAINING, DROPPED, FATAL_BUSY, FD,
    GATE, HEADER, IDLE, IN_CHILD, MARKS, ON, RANGES_DONE, STACKS_DONE, THREAD, WAITING, WRITER_TID,
};

/// In a `fork` child (its fork handler: async-signal-safe, atomics only): the writer
/// thread does not exist and the file is the parent's; the unwritten events in the rings
/// are the parent's. The child's first recorded event starts its own log
/// ([`start_in_child`]).
pub fn after_fork_in_child() {
    let was_on = ON.swap(false, Ordering::AcqRel);
    DRAINING.store(false, Ordering::Release);
    IN_CHILD.store(true, Ordering::Release);
    if !was_on {
        CHILD.store(CHILD_NONE, Ordering::Release);
        return;
    }
    // SAFETY: the fork handler: every sink's lock is held across the fork (`life/fork.rs`),
    // so no push is under way, and the child has no writer.
    event_ring::each(|r| unsafe { r.forget() });
    if let Some(m) = MARKS.get() {
        m.forget();
    }
    THREAD.store(std::ptr::null_mut(), Ordering::Release);
    WRITER_TID.store(0, Ordering::Release);
    GATE.store(IDLE, Ordering::Release);
    FATAL_BUSY.store(false, Ordering::Release);
    STACKS_DONE.store(0, Ordering::Release);
    RANGES_DONE.store(0, Ordering::Release);
    DROPPED.store(0, Ordering::Release);
    WAITING.store(0, Ordering::Release);
    CHILD.store(CHILD_PENDING, Ordering::Release);
}

/// From a fork child's recorded event: start the child's own log (once; a thread that
/// records meanwhile waits for it). Returns whether the log is on.
#[cold]
pub(super) fn start_in_child() -> bool {
    match CHILD.compare_exchange(
        CHILD_PENDING,
        CHILD_STARTING,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            let on = std::panic::catch_unwind(open_child_log).unwrap_or(false);
            CHILD.store(CHILD_NONE, Ordering::Release);
            on
        }
        Err(CHILD_STARTING) => {
            while CHILD.load(Ordering::Acquire) == CHILD_STARTING {
                std::thread::yield_now();
            }
            ON.load(Ordering::Acquire)
        }
        Err(_) => ON.load(Ordering::Acquire),
    }
}

/// The fork child's own log: a new file (the template's `%p`), the parent's header with the
/// child's pid, a new writer thread.
pub(super) fn open_child_log() -> bool {
    let (Some(template), Some(parent)) = (template(), HEADER.get()) else {
        return false;
    };
    let pid = std::process::id();
    if !template.contains("%p") {
        say(&format!(
            "cushim: pid {pid} is a fork child: it does not write an event log, because CUSHIM_LOG has no %p (its log would be its parent's file); its parent's log goes on\n"
        ));
        return false;
    }
    // The parent's descriptor: the parent writes it, the child has no use for it.
    // SAFETY: closing this process's copy of a descriptor it owns.
    unsafe { libc::close(FD.swap(-1, Ordering::AcqRel)) };
    let mut header = parent.clone();
    header["parent_pid"] = header["pid"].clone();
    header["pid"] = pid.into();
    header["clock_origin_us"] = cushim::trace::event::now_us().into();
    match open_log(template, &header) {
        Ok(()) => {
            IN_CHILD.store(false, Ordering::Release);
            true
        }
        Err(e) => {
            say(&format!(
                "cushim: pid {pid} is a fork child: no event log of its own: {e}\n"
            ));
            false
        }
    }
}
