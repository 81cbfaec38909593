//! `DevLock<T>`: the allocator's mutex, one atomic read-modify-write per uncontended
//! lock+unlock, sleeping (futex) waiters.
//!
//! # Why
//!
//! The allocator takes one lock per `cudaMalloc` and one per `cudaFree`. A conventional
//! futex mutex (`parking_lot::Mutex`, `std::sync::Mutex`) pays an RMW to lock and another to
//! unlock: the unlock must atomically clear the word *and* learn whether anyone is asleep.
//! Here the unlock is a plain release store followed by a plain load of a separate sleeper
//! count; the ordering those two accesses lack is supplied, only when somebody actually goes
//! to sleep, by a process-wide heavy barrier on the sleeper's side (`membarrier(2)`), the
//! "asymmetric Dekker" used by folly (`asymmetric_thread_fence_light/heavy`), liburcu and
//! HotSpot.
//!
//! The protocol, the proof that no wakeup is lost and the two other modes are in
//! `devlock.md` next to this file (included in the rendered documentation).
#![doc = include_str!("devlock.md")]

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{compiler_fence, AtomicU32, AtomicUsize, Ordering};

/// Spins (each a `spin_loop` hint plus a relaxed load) a revoker makes before it yields and
/// then sleeps with backoff. Critical sections are normally tens of nanoseconds, but may
/// contain a device call of milliseconds.
const SPIN_LIMIT: u32 = 100;
/// Rounds of `spin_for_word` before a waiter registers to sleep: pauses doubling from 1 to
/// [`MAX_PAUSES`] between reads, the last [`YIELD_ROUNDS`] a `sched_yield` instead (a few
/// microseconds of spinning in all, like parking_lot's spin-then-park).
const SPIN_ROUNDS: u32 = 14;
const YIELD_ROUNDS: u32 = 4;
const MAX_PAUSES: u32 = 64;

/// The `spin_loop` hints a waiter makes before its yields (for the race test).
#[cfg(test)]
const WAITER_SPIN_PAUSES: u64 = {
    let (mut total, mut pauses, mut round) = (0u64, 1u64, 0);
    while round < SPIN_ROUNDS - YIELD_ROUNDS {
        total += pauses;
        pauses = if pauses * 2 < MAX_PAUSES as u64 {
            pauses * 2
        } else {
            MAX_PAUSES as u64
        };
        round += 1;
    }
    total
};

/// `bias` value: not biased, use `word` (never biased, or revocation complete).
const NO_BIAS: usize = usize::MAX;
/// `bias` value: biasing enabled, nobody has locked yet.
const UNBIASED: usize = 0;

/// A mutex whose uncontended lock+unlock costs one atomic RMW, or none at all for the thread the
/// lock is biased to (see the module documentation).
pub struct DevLock<T> {
    /// `UNBIASED`, the owner's thread token, or `NO_BIAS`; moves only in that order.
    bias: AtomicUsize,
    /// 1 while the bias owner is inside (or entering) through the biased path; owner-written.
    owner_in: AtomicU32,
    /// 1 once some thread asked for the bias to be revoked; never reset.
    revoked: AtomicU32,
    /// 0 free, 1 held.
    word: AtomicU32,
    /// Threads registered to sleep (between their `fetch_add` and `fetch_sub`).
    sleepers: AtomicU32,
    /// Release with a plain store (sleepers issue `membarrier`), or with an RMW.
    heavy_barrier: bool,
    #[cfg(test)]
    stats: TestStats,
    value: UnsafeCell<T>,
}

/// Test-only counters, per lock so that parallel tests do not mix.
#[cfg(test)]
#[derive(Default)]
struct TestStats {
    registrations: AtomicU64,
    futex_waits: AtomicU64,
    /// Acquisitions through the biased path; incremented inside the critical section with a
    /// plain load and store (exact: the lock orders them), so the fast path stays RMW-free.
    biased: AtomicU64,
    /// Acquisitions through `word` (any CAS that took it), counted the same way.
    word: AtomicU64,
    /// Revocations completed by a revoker (not by the owner's bail-out), counted the same way.
    revocations: AtomicU64,
    /// Forces one interleaving of the sleeper's registration with a release (tests only).
    gate: TestGate,
}

/// A point in `lock_slow` where a test can park the registering waiter once, so that the
/// test's release lands exactly there instead of only by luck.
#[cfg(test)]
#[derive(Default)]
struct TestGate {
    /// The [`GatePoint`] to park at (0: none).
    at: AtomicU32,
    /// Set by the waiter when it has parked.
    reached: AtomicU32,
    /// Set by the test to let the parked waiter go on.
    open: AtomicU32,
}

/// Where [`TestGate`] parks the waiter.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum GatePoint {
    /// After `I` (registered), before `M` (the barrier).
    AfterRegister = 1,
    /// After `M`, before `R` (the CAS).
    AfterBarrier = 2,
    /// After `R` failed, before `futex_wait`.
    BeforeFutexWait = 3,
}

#[cfg(test)]
impl TestGate {
    fn pass(&self, here: GatePoint) {
        if self.at.load(Ordering::Acquire) != here as u32
            || self.reached.swap(1, Ordering::AcqRel) != 0
        {
            return;
        }
        while self.open.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

// SAFETY: the lock hands out access to `T` to one thread at a time, so it can be shared between
// threads (and sent) whenever `T` itself may be sent; this is `Mutex<T>`'s contract.
unsafe impl<T: Send> Send for DevLock<T> {}
// SAFETY: as above: `&DevLock<T>` only yields `&mut T` under mutual exclusion.
unsafe impl<T: Send> Sync for DevLock<T> {}

impl<T> DevLock<T> {
    /// A lock in heavy-barrier mode, biased to its first user, if this process can use
    /// `membarrier` (probed once per process), otherwise in conventional RMW-release mode.
    pub fn new(value: T) -> DevLock<T> {
        Self::new_with_mode(value, true)
    }

    /// A lock in the requested release mode, biased whenever heavy-barrier mode is active.
    /// `heavy_barrier: true` is honoured only if the per-process membarrier probe succeeded;
    /// otherwise the lock falls back to RMW mode.
    #[doc(hidden)]
    pub fn new_with_mode(value: T, heavy_barrier: bool) -> DevLock<T> {
        Self::new_with_modes(value, heavy_barrier, true)
    }

    /// As [`DevLock::new_with_mode`]; `biased: false` turns biasing off. Biasing needs the
    /// heavy barrier, so it is active only if heavy-barrier mode is.
    #[doc(hidden)]
    pub fn new_with_modes(value: T, heavy_barrier: bool, biased: bool) -> DevLock<T> {
        let heavy_barrier = heavy_barrier && sys::membarrier_available();
        DevLock {
            bias: AtomicUsize::new(if heavy_barrier && biased {
                UNBIASED
            } else {
                NO_BIAS
            }),
            owner_in: AtomicU32::new(0),
            revoked: AtomicU32::new(0),
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            heavy_barrier,
            #[cfg(test)]
            stats: TestStats::default(),
            value: UnsafeCell::new(value),
        }
    }

    /// Acquires the lock, sleeping if it is held for longer than a short spin.
    #[inline]
    pub fn lock(&self) -> DevLockGuard<'_, T> {
        // Acquire: reading `NO_BIAS` must order the biased critical sections before ours.
        let bias = self.bias.load(Ordering::Acquire);
        if bias == NO_BIAS {
            return self.lock_word();
        }
        if bias == sys::thread_token() {
            if let Some(guard) = self.try_enter_biased() {
                return guard;
            }
        }
        self.lock_bias_contended()
    }

    /// The owner's entry: `Z`, `A`, compiler fence, `B` (module docs). `None` if the owner is
    /// already inside (re-entry) or the bias has been revoked (after completing the revocation).
    #[inline]
    fn try_enter_biased(&self) -> Option<DevLockGuard<'_, T>> {
        // Z: only the owner writes `owner_in`, so this reads our own latest store.
        if self.owner_in.load(Ordering::Relaxed) != 0 {
            return None;
        }
        // A, then B; the revoker's membarrier orders them (module docs).
        self.owner_in.store(1, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        if self.revoked.load(Ordering::Relaxed) != 0 {
            self.owner_saw_revocation();
            return None;
        }
        #[cfg(test)]
        bump(&self.stats.biased);
        Some(DevLockGuard {
            lock: self,
            biased: true,
            _not_send: PhantomData,
        })
    }

    /// The owner read `revoked == 1`: it leaves, will never enter through the biased path again,
    /// and publishes that (with its past critical sections) by completing the revocation.
    #[cold]
    #[inline(never)]
    fn owner_saw_revocation(&self) {
        self.owner_in.store(0, Ordering::Release);
        self.bias.store(NO_BIAS, Ordering::Release);
    }

    #[inline]
    fn word_guard(&self) -> DevLockGuard<'_, T> {
        #[cfg(test)]
        bump(&self.stats.word);
        DevLockGuard {
            lock: self,
            biased: false,
            _not_send: PhantomData,
        }
    }

    /// Everything but the two fast paths: first lock (bias it), another thread's bias (revoke),
    /// our bias after a revocation or on re-entry.
    /// Acquires through `word` (the lock is not biased).
    #[inline]
    fn lock_word(&self) -> DevLockGuard<'_, T> {
        if self
            .word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        self.word_guard()
    }

    #[cold]
    #[inline(never)]
    fn lock_bias_contended(&self) -> DevLockGuard<'_, T> {
        let me = sys::thread_token();
        loop {
            match self.bias.load(Ordering::Acquire) {
                NO_BIAS => return self.lock_word(),
                UNBIASED => {
                    // Success or not, the next round sees our token or the winner's.
                    let _ = self.bias.compare_exchange(
                        UNBIASED,
                        me,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    );
                }
                bias => {
                    if bias == me {
                        if let Some(guard) = self.try_enter_biased() {
                            return guard;
                        }
                        if self.owner_in.load(Ordering::Relaxed) == 0 {
                            // Bailed out on `revoked`: `bias` is `NO_BIAS` now.
                            continue;
                        }
                        // Re-entry (or an heir of a leaked guard): wait like any other thread,
                        // i.e. forever, as a plain mutex would; never a second guard.
                    }
                    self.revoke();
                }
            }
        }
    }

    /// Revokes another thread's bias; returns once `bias == NO_BIAS`, i.e. when the owner is out
    /// of the biased path for good and its critical sections happen-before ours.
    #[cold]
    #[inline(never)]
    fn revoke(&self) {
        // C, then M, then poll E (module docs).
        self.revoked.store(1, Ordering::SeqCst);
        let mut fenced = sys::revocation_barrier();
        let mut round = 0u32;
        loop {
            if self.bias.load(Ordering::Acquire) == NO_BIAS {
                return;
            }
            if fenced && self.owner_in.load(Ordering::Acquire) == 0 {
                self.bias.store(NO_BIAS, Ordering::Release);
                #[cfg(test)]
                {
                    // Not under the lock: a test-only RMW is fine here (cold, once per lock).
                    self.stats.revocations.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            round = round.saturating_add(1);
            if round <= SPIN_LIMIT {
                std::hint::spin_loop();
            } else if round <= SPIN_LIMIT + 20 {
                std::thread::yield_now();
            } else {
                // 16 us doubling to 1 ms: the owner may be in a device call of milliseconds.
                let shift = (round - SPIN_LIMIT - 20).min(6);
                std::thread::sleep(std::time::Duration::from_micros(16 << shift));
                if !fenced {
                    fenced = sys::revocation_barrier();
                }
            }
        }
    }

    /// Acquires the lock if it is free, without waiting. A lock biased to another thread
    /// reports itself as held (taking it would mean revoking, which may wait).
    #[inline]
    fn try_lock(&self) -> Option<DevLockGuard<'_, T>> {
        let me = sys::thread_token();
        loop {
            match self.bias.load(Ordering::Acquire) {
                NO_BIAS => {
                    return self
                        .word
                        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                        .ok()
                        .map(|_| self.word_guard());
                }
                UNBIASED => {
                    let _ = self.bias.compare_exchange(
                        UNBIASED,
                        me,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    );
                }
                bias if bias == me => {
                    if let Some(guard) = self.try_enter_biased() {
                        return Some(guard);
                    }
                    if self.owner_in.load(Ordering::Relaxed) != 0 {
                        return None;
                    }
                    // Bailed out on `revoked`: retry through `word`.
                }
                _ => return None,
            }
        }
    }

    /// Only in a `fork` child, on the one thread it has, through a guard that thread holds:
    /// forget the sleepers that the parent's other threads had registered. They do not exist
    /// in the child, so without this every unlock there would issue a futex wake for nobody
    /// (harmless, but a system call per unlock). Sound: no other thread exists to register or
    /// deregister, and the caller holds the lock, so nothing reads `sleepers` meanwhile.
    pub fn forget_sleepers_after_fork(guard: &DevLockGuard<'_, T>) {
        guard.lock.sleepers.store(0, Ordering::Relaxed);
    }

    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        loop {
            if self.spin_for_word() {
                return;
            }
            // I: register. SeqCst: in RMW mode this is half of the SeqCst Dekker pair.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            #[cfg(test)]
            self.stats.registrations.fetch_add(1, Ordering::Relaxed);
            #[cfg(test)]
            self.stats.gate.pass(GatePoint::AfterRegister);
            // M: make every unlocker's store-then-load ordered with respect to I (module docs).
            let fenced = !self.heavy_barrier || sys::heavy_barrier();
            #[cfg(test)]
            self.stats.gate.pass(GatePoint::AfterBarrier);
            // R: SeqCst for RMW mode; implies Acquire for the critical section.
            let mut got = self
                .word
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok();
            if !got {
                #[cfg(test)]
                self.stats.futex_waits.fetch_add(1, Ordering::Relaxed);
                #[cfg(test)]
                self.stats.gate.pass(GatePoint::BeforeFutexWait);
                sys::futex_wait(&self.word, 1, !fenced);
                got = self
                    .word
                    .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
            }
            // Deregister whether or not the lock was taken: while this thread spins again,
            // unlockers pay no wake-up (a holder that relocks at once would otherwise make a
            // futex call per unlock for as long as a barged-past sleeper stays registered).
            // The next sleep registers and fences anew, so the argument above holds for it.
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            if got {
                return;
            }
        }
    }

    /// Try for `word` with exponentially growing pauses between relaxed reads (fewer reads
    /// of the holder's cache line than a tight loop), then a few yields. True when taken.
    fn spin_for_word(&self) -> bool {
        let mut pauses = 1u32;
        for round in 0..SPIN_ROUNDS {
            if round < SPIN_ROUNDS - YIELD_ROUNDS {
                for _ in 0..pauses {
                    std::hint::spin_loop();
                }
                pauses = (pauses * 2).min(MAX_PAUSES);
            } else {
                std::thread::yield_now();
            }
            if self.word.load(Ordering::Relaxed) == 0
                && self
                    .word
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
        }
        false
    }

    #[inline]
    fn unlock(&self) {
        let sleepers = if self.heavy_barrier {
            // S, then L; the sleeper's membarrier orders them (module docs).
            self.word.store(0, Ordering::Release);
            compiler_fence(Ordering::SeqCst);
            self.sleepers.load(Ordering::Relaxed)
        } else {
            self.word.swap(0, Ordering::SeqCst);
            self.sleepers.load(Ordering::SeqCst)
        };
        if sleepers != 0 {
            self.wake_one();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        sys::futex_wake_one(&self.word);
    }
}

impl<T: fmt::Debug> fmt::Debug for DevLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DevLock");
        match self.try_lock() {
            Some(guard) => d.field("data", &&*guard),
            None => d.field("data", &LockedPlaceholder),
        };
        d.finish()
    }
}

struct LockedPlaceholder;

impl fmt::Debug for LockedPlaceholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<locked>")
    }
}

/// Exclusive access to the value of a [`DevLock`]; dropping it releases the lock.
#[must_use = "if unused the DevLock will immediately unlock"]
pub struct DevLockGuard<'a, T> {
    lock: &'a DevLock<T>,
    /// Taken through the biased path (release: `U`), or through `word`.
    biased: bool,
    /// `!Send`: the guard is released on the thread that took it.
    _not_send: PhantomData<*const ()>,
}

// SAFETY: sharing `&DevLockGuard` only shares `&T`, which is fine when `T: Sync`.
unsafe impl<T: Sync> Sync for DevLockGuard<'_, T> {}

impl<T> Deref for DevLockGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock, so no `&mut T` to the
        // value exists elsewhere; the borrow is tied to the guard.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for DevLockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for DevLockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.biased {
            // U: the revoker's Acquire poll of `owner_in` synchronises with this.
            self.lock.owner_in.store(0, Ordering::Release);
        } else {
            self.lock.unlock();
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for DevLockGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

mod sys;

/// Sleep while `word` holds `expected`, for 1 ms at most (a futex wait; off Linux a yield).
/// For the shim's other sleepers: a recording thread waiting for room in the event log.
pub fn wait_while(word: &AtomicU32, expected: u32) {
    sys::futex_wait(word, expected, true)
}

/// Wake every thread sleeping in [`wait_while`] on `word`.
pub fn wake_all(word: &AtomicU32) {
    sys::futex_wake(word, i32::MAX)
}

/// A number unique to the calling thread while it lives (the thread pointer on x86-64),
/// cheap enough for a hot path.
#[inline(always)]
pub(crate) fn thread_token() -> usize {
    sys::thread_token()
}

#[cfg(test)]
mod tests;
