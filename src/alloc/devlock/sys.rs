//! What `DevLock` needs from the operating system: `membarrier(2)` (probed once per process),
//! futex wait and wake, and a cheap per-thread token. Off Linux: no membarrier (so no biasing
//! and RMW releases), and waiting is a yield.

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

    // From <linux/membarrier.h>; libc does not export these.
    const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
    const MEMBARRIER_CMD_GLOBAL: libc::c_int = 1 << 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    const UNKNOWN: u8 = 0;
    const UNAVAILABLE: u8 = 1;
    const AVAILABLE: u8 = 2;
    static MEMBARRIER: AtomicU8 = AtomicU8::new(UNKNOWN);

    fn membarrier(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier(cmd, flags = 0, cpu_id = 0) takes no pointers; an unknown or
        // forbidden command just returns -1 with errno set.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        }
    }

    /// Whether `MEMBARRIER_CMD_PRIVATE_EXPEDITED` is supported, registered for this process and
    /// works; probed on first use (a racing second probe is harmless: registering is idempotent).
    #[inline]
    pub(crate) fn membarrier_available() -> bool {
        match MEMBARRIER.load(Ordering::Acquire) {
            AVAILABLE => true,
            UNAVAILABLE => false,
            _ => probe(),
        }
    }

    #[cold]
    #[inline(never)]
    fn probe() -> bool {
        let supported = membarrier(MEMBARRIER_CMD_QUERY);
        let ok = supported >= 0
            && supported & libc::c_long::from(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
            && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
            && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
        MEMBARRIER.store(if ok { AVAILABLE } else { UNAVAILABLE }, Ordering::Release);
        ok
    }

    /// The heavy barrier; false if it could not be issued (then the caller must not rely on it).
    #[cold]
    pub(crate) fn heavy_barrier() -> bool {
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0
            || (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
                && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    }

    /// The barrier a revoker issues: `PRIVATE_EXPEDITED` (re-registering if needed), else
    /// `GLOBAL` (RCU-based, slow, needs no registration); false if neither could be issued.
    #[cold]
    pub(crate) fn revocation_barrier() -> bool {
        heavy_barrier() || membarrier(MEMBARRIER_CMD_GLOBAL) == 0
    }

    /// This thread's token for biasing: the thread pointer. The x86-64 psABI requires `%fs:0`
    /// to hold the TCB's own address, so it is non-zero and distinct between live threads.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) fn thread_token() -> usize {
        let tp: usize;
        // SAFETY: reads the 8 bytes at `%fs:0`, which glibc and musl keep mapped and pointing to
        // the TCB for every thread's whole life; no other effect. `pure`: within one function
        // activation the thread (hence the value) does not change.
        unsafe {
            std::arch::asm!(
                "mov {}, qword ptr fs:[0]",
                out(reg) tp,
                options(nostack, preserves_flags, readonly, pure)
            );
        }
        tp
    }

    /// This thread's token for biasing: `pthread_self()` (the TCB address in glibc and musl).
    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    pub(crate) fn thread_token() -> usize {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() as usize }
    }

    /// Sleeps while `*word == expected`; returns on wake, value mismatch, signal, or (if
    /// `bounded`) after 1 ms. The caller re-checks in every case.
    pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, bounded: bool) {
        let timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        let timeout_ptr: *const libc::timespec = if bounded { &timeout } else { std::ptr::null() };
        // SAFETY: `word` is a live, aligned u32 for the duration of the call; the kernel only
        // reads it and `timeout_ptr` (null or a live local). Errors (EAGAIN, EINTR, ETIMEDOUT)
        // are all handled by the caller's re-check.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                timeout_ptr,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    pub(crate) fn futex_wake_one(word: &AtomicU32) {
        futex_wake(word, 1)
    }

    /// Wake up to `n` waiters on `word`.
    pub(crate) fn futex_wake(word: &AtomicU32, n: i32) {
        // SAFETY: FUTEX_WAKE only uses the address as a key (no access); `word` is live.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                n,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::sync::atomic::AtomicU32;

    pub(crate) fn membarrier_available() -> bool {
        false
    }

    pub(crate) fn heavy_barrier() -> bool {
        false
    }

    pub(crate) fn revocation_barrier() -> bool {
        false
    }

    /// Unused in practice: without membarrier no lock is ever biased.
    pub(crate) fn thread_token() -> usize {
        1
    }

    pub(crate) fn futex_wait(_word: &AtomicU32, _expected: u32, _bounded: bool) {
        std::thread::yield_now();
    }

    pub(crate) fn futex_wake_one(_word: &AtomicU32) {}

    pub(crate) fn futex_wake(_word: &AtomicU32, _n: i32) {}
}

pub(super) use imp::*;
