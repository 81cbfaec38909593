//! The DWARF unwinder: `backtrace::trace_unsynchronized` (libgcc's `_Unwind_Backtrace`).
//!
//! Invariant: writes at most `buf.len()` return addresses, skipping leading frames inside
//! the skip range; allocates nothing and takes no lock of ours.

use crate::trace::stack::SkipRange;

/// See [`crate::trace::stack::capture`].
#[inline(never)]
pub fn capture(buf: &mut [u64], skip: &SkipRange) -> usize {
    let mut n = 0;
    let mut leading = true;
    let mut visit = |frame: &backtrace::Frame| {
        let ip = frame.ip() as usize;
        if ip == 0 {
            return false;
        }
        if leading && skip.contains(ip) {
            return true;
        }
        leading = false;
        if n == buf.len() {
            return false;
        }
        buf[n] = ip as u64;
        n += 1;
        true
    };
    // SAFETY: on Linux the backend is libgcc's unwinder, which is thread-safe; the crate's
    // "unsynchronized" caveat concerns backends (dbghelp) that are not. Skipping the
    // crate's global lock keeps capture to the allocator's one lock.
    unsafe { backtrace::trace_unsynchronized(&mut visit) };
    n
}
