//! The DWARF unwinder. On x86_64 a cached walk over the loaded modules' `.eh_frame_hdr`
//! tables ([`fast`], built on framehop); where that cannot start (other architectures, a
//! thread whose state is being torn down, a stack outside the thread's known bounds), libgcc's
//! `_Unwind_Backtrace` through `backtrace::trace_unsynchronized`.
//!
//! Invariant: writes at most `buf.len()` return addresses, skipping leading frames inside
//! the skip range; after a thread's first capture allocates nothing and takes no lock of
//! ours on the fast path (see [`fast`] for the rare exceptions).

use crate::trace::stack::SkipRange;

#[cfg(target_arch = "x86_64")]
mod fast;
#[cfg(target_arch = "x86_64")]
mod modules;

/// The unwinder's own lock (its module list), held around `fork`; dropping it releases it.
pub struct ForkHold {
    #[cfg(target_arch = "x86_64")]
    _modules: modules::ModulesHold,
}

/// Take the unwinder's lock (before `fork`).
pub fn hold_for_fork() -> ForkHold {
    ForkHold {
        #[cfg(target_arch = "x86_64")]
        _modules: modules::hold_for_fork(),
    }
}

/// See [`crate::trace::stack::capture`].
#[inline(never)]
pub fn capture(buf: &mut [u64], skip: &SkipRange) -> usize {
    #[cfg(target_arch = "x86_64")]
    if let Some(n) = fast::capture(buf, skip) {
        return n;
    }
    capture_libgcc(buf, skip)
}

/// The general (slow) path: libgcc's unwinder, which looks each frame up afresh.
#[inline(never)]
pub fn capture_libgcc(buf: &mut [u64], skip: &SkipRange) -> usize {
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
