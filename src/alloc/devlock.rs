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
//! # Protocol
//!
//! `word`: 0 free, 1 held. `sleepers`: how many threads are registered to sleep.
//!
//! * lock, fast: `word.cas(0 -> 1, Acquire)`.
//! * unlock (heavy-barrier mode): `S: word.store(0, Release)`; compiler fence;
//!   `L: sleepers.load(Relaxed)`; if non-zero, `futex_wake(word, 1)`.
//! * lock, slow (cold): spin a bounded number of times on a relaxed load + CAS, then
//!   `I: sleepers.fetch_add(1, SeqCst)`; `M: membarrier(PRIVATE_EXPEDITED)`; loop
//!   { `R: word.cas(0 -> 1, SeqCst)` succeeds: break; `futex_wait(word, 1)` (any return:
//!   retry) }; `sleepers.fetch_sub(1)`.
//!
//! # Why no wakeup is lost
//!
//! The danger is Dekker's: the unlocker stores S then loads L; the waiter writes I then reads
//! R. Nothing in the unlocker orders S before L, and x86-64 TSO permits exactly that one
//! reordering (S waits in the store buffer while L reads `sleepers == 0`); meanwhile the waiter
//! increments and reads `word == 1`, and both sides miss each other: the unlocker wakes nobody,
//! the waiter sleeps on a free lock forever.
//!
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every thread of the process that is
//! running execute a full memory barrier (an IPI whose handler does `smp_mb`) before the call
//! returns; a thread that is not running has passed through the scheduler, which is a full
//! barrier too. So M places, for each other thread X, a full fence `F_X` *somewhere* in X's
//! instruction stream, bracketed by the full barriers at the waiter's syscall entry and exit.
//! Two cases for an unlocker X:
//!
//! * `F_X` lies before L: I is globally visible before M starts (a locked `xadd`), so L reads
//!   the incremented count and X wakes.
//! * `F_X` lies after L, hence after S: S has left X's store buffer before M returns, so every
//!   R (and every kernel read in `futex_wait`), all of which come after M, sees S or a later
//!   value of `word`.
//!
//! (An IPI between S and L is the first case with S drained as well.) In the C++/Rust memory
//! model this is P1202's asymmetric fence: the compiler fence in the unlock is a signal fence,
//! which orders S and L with respect to anything that interrupts the thread between them, and
//! the heavy barrier behaves as a `SeqCst` fence executed in every thread at a point of its
//! program order, ordered in the single total order S between the fences at M's entry and exit.
//! The fence rule (`A` sb `F1`, `F1 <S F2`, `F2` sb `B` ⇒ `B` reads `A` or a later write) gives
//! the two cases above as `I; F_W <S F_X; L` and `S; F_X <S F_W; R`. The compiler fence is what
//! keeps the compiler from hoisting L above the release store S (release alone does not).
//!
//! **Lemma.** Let W be registered (I done, M done, not yet deregistered) and let `futex_wait`
//! in W read `word == 1` as value `v`. Then every unlock X whose store S is after `v` in
//! `word`'s modification order reads `sleepers >= 1` at L and wakes one waiter. *Proof*: by the
//! case split, if L missed I then S is visible to every read of W after M, in particular to the
//! one that read `v`, which therefore is not older than S. The count is `>= 1` because
//! `sleepers` is only changed by RMWs (a single modification order) and W's decrement comes
//! after W has taken the lock. Note one barrier per registration suffices: every later retry's
//! reads are also after M. The same holds for several unlocks by the same thread (each is
//! either before or after its single `F_X`) and for threads that did not exist yet (spawning
//! synchronises with the spawner).
//!
//! **No lost wakeup.** Suppose threads sleep forever on a lock that stays free. Take the last
//! unlock `S*` of `word`; every stuck sleeper read a `1` older than `S*`, so by the lemma the
//! unlocker calls `futex_wake(word, 1)` after `S*`. The futex guarantee (the waiter checks the
//! value under the hash-bucket lock after announcing itself; the waker looks for waiters after
//! its store) gives: the wake dequeues one sleeper, or every sleeper enqueued later reads `0`
//! and returns. Either way some sleeper retries its CAS on a word whose last write is `0`: it
//! takes the lock, contradicting "stays free". The other interleavings are instances of this:
//! a third thread barging in between the wake and the woken thread's retry makes that retry
//! fail and sleep again on the barger's `1`, and by the lemma the barger's unlock wakes again;
//! with several sleepers, `wake(1)` picks one, which either takes the lock (and its own unlock
//! wakes the next, by the lemma, since the others' values are older) or sleeps again on a newer
//! holder's `1`. The lock is not fair (a sleeper can be overtaken repeatedly), but it never
//! sleeps on a free lock. A sleeper treats every return from `futex_wait` (woken, `EAGAIN`,
//! `EINTR`) the same way, by retrying, so a wake consumed by a thread interrupted by a signal is
//! not lost either.
//!
//! # Conventional (RMW) mode
//!
//! The membarrier command must be registered once per process (`REGISTER_PRIVATE_EXPEDITED`)
//! and may be missing (kernel < 4.14, seccomp, not Linux). One probe per process decides; if it
//! fails, every `DevLock` releases with `word.swap(0, SeqCst)` then `sleepers.load(SeqCst)`
//! (`xchg` + plain `mov` on x86-64). Then: if L misses I, `L <S I` (L reads before I), so
//! `S <S L <S I <S R` and R, a `SeqCst` CAS, reads S or later; the kernel's read after R reads no
//! older value (coherence). The lemma and the rest of the argument are unchanged. The mode is a
//! plain field fixed at construction, so the release branch is perfectly predictable.
//!
//! A sleeper whose `membarrier` call fails after a successful probe (should not happen: the
//! registration is inherited across `fork` and reset only by `exec`) first re-registers; if
//! that fails too, that one acquisition waits with a 1 ms futex timeout and re-checks, so it
//! still makes progress without relying on the barrier it could not issue.
//!
//! Poisoning: none (as in `parking_lot`); a panic while holding the guard releases the lock when
//! the guard is dropped during unwinding.

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{compiler_fence, AtomicU32, Ordering};

/// Spins (each a `spin_loop` hint plus a relaxed load) before registering to sleep: critical
/// sections are normally tens of nanoseconds, but may contain a device call of milliseconds.
const SPIN_LIMIT: u32 = 100;

/// A mutex whose uncontended lock+unlock costs one atomic RMW (see the module documentation).
pub struct DevLock<T> {
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

/// Test-only counters of the slow path, per lock so that parallel tests do not mix.
#[cfg(test)]
#[derive(Default)]
struct TestStats {
    registrations: AtomicU64,
    futex_waits: AtomicU64,
}

// SAFETY: the lock hands out access to `T` to one thread at a time, so it can be shared between
// threads (and sent) whenever `T` itself may be sent; this is `Mutex<T>`'s contract.
unsafe impl<T: Send> Send for DevLock<T> {}
// SAFETY: as above: `&DevLock<T>` only yields `&mut T` under mutual exclusion.
unsafe impl<T: Send> Sync for DevLock<T> {}

impl<T> DevLock<T> {
    /// A lock in heavy-barrier mode if this process can use `membarrier` (probed once per
    /// process), otherwise in conventional RMW-release mode.
    pub fn new(value: T) -> DevLock<T> {
        Self::new_with_mode(value, true)
    }

    /// A lock in the requested release mode. `heavy_barrier: true` is honoured only if the
    /// per-process membarrier probe succeeded; otherwise the lock falls back to RMW mode.
    #[doc(hidden)]
    pub fn new_with_mode(value: T, heavy_barrier: bool) -> DevLock<T> {
        DevLock {
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            heavy_barrier: heavy_barrier && sys::membarrier_available(),
            #[cfg(test)]
            stats: TestStats::default(),
            value: UnsafeCell::new(value),
        }
    }

    /// Acquires the lock, sleeping if it is held for longer than a short spin.
    #[inline]
    pub fn lock(&self) -> DevLockGuard<'_, T> {
        if self
            .word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        DevLockGuard {
            lock: self,
            _not_send: PhantomData,
        }
    }

    /// Acquires the lock if it is free, without waiting.
    #[inline]
    fn try_lock(&self) -> Option<DevLockGuard<'_, T>> {
        self.word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| DevLockGuard {
                lock: self,
                _not_send: PhantomData,
            })
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
        for _ in 0..SPIN_LIMIT {
            std::hint::spin_loop();
            if self.word.load(Ordering::Relaxed) == 0
                && self
                    .word
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }

        // I: register. SeqCst: in RMW mode this is half of the SeqCst Dekker pair.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        #[cfg(test)]
        self.stats.registrations.fetch_add(1, Ordering::Relaxed);
        // M: make every unlocker's store-then-load ordered with respect to I (module docs).
        let fenced = !self.heavy_barrier || sys::heavy_barrier();
        loop {
            // R: SeqCst for RMW mode; implies Acquire for the critical section.
            if self
                .word
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                break;
            }
            #[cfg(test)]
            self.stats.futex_waits.fetch_add(1, Ordering::Relaxed);
            sys::futex_wait(&self.word, 1, !fenced);
        }
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
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
        self.lock.unlock();
    }
}

impl<T: fmt::Debug> fmt::Debug for DevLockGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

    // From <linux/membarrier.h>; libc does not export these.
    const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
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
    pub(super) fn membarrier_available() -> bool {
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
    pub(super) fn heavy_barrier() -> bool {
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0
            || (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
                && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    }

    /// Sleeps while `*word == expected`; returns on wake, value mismatch, signal, or (if
    /// `bounded`) after 1 ms. The caller re-checks in every case.
    pub(super) fn futex_wait(word: &AtomicU32, expected: u32, bounded: bool) {
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

    pub(super) fn futex_wake_one(word: &AtomicU32) {
        // SAFETY: FUTEX_WAKE only uses the address as a key (no access); `word` is live.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1i32,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::sync::atomic::AtomicU32;

    pub(super) fn membarrier_available() -> bool {
        false
    }

    pub(super) fn heavy_barrier() -> bool {
        false
    }

    pub(super) fn futex_wait(_word: &AtomicU32, _expected: u32, _bounded: bool) {
        std::thread::yield_now();
    }

    pub(super) fn futex_wake_one(_word: &AtomicU32) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    /// A counter that is deliberately not atomic: only the lock makes its increments exact.
    struct Counter(u64);

    fn modes() -> [bool; 2] {
        [true, false]
    }

    #[test]
    fn mutual_exclusion_gives_exact_total_in_both_modes() {
        for heavy in modes() {
            let lock = Arc::new(DevLock::new_with_mode(Counter(0), heavy));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let lock = Arc::clone(&lock);
                    thread::spawn(move || {
                        for _ in 0..200_000 {
                            let mut g = lock.lock();
                            // Read-modify-write in two steps to widen any race window.
                            let v = std::hint::black_box(g.0);
                            g.0 = v + 1;
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("worker panicked");
            }
            assert_eq!(
                lock.lock().0,
                800_000,
                "heavy_barrier = {}",
                lock.heavy_barrier
            );
        }
    }

    #[test]
    fn sleepers_blocked_behind_a_long_holder_reach_the_futex_and_are_woken() {
        for heavy in modes() {
            let lock = Arc::new(DevLock::new_with_mode(Counter(0), heavy));
            let guard = lock.lock();
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let lock = Arc::clone(&lock);
                    thread::spawn(move || lock.lock().0 += 1)
                })
                .collect();
            // Wait until all three are registered sleepers, then hold a further 20 ms.
            let deadline = Instant::now() + Duration::from_secs(10);
            while lock.stats.registrations.load(Ordering::Relaxed) < 3 {
                assert!(Instant::now() < deadline, "waiters never registered");
                thread::sleep(Duration::from_millis(1));
            }
            thread::sleep(Duration::from_millis(20));
            assert_eq!(guard.0, 0, "a waiter got in while the holder held the lock");
            drop(guard);
            for t in threads {
                t.join().expect("waiter panicked");
            }
            assert_eq!(lock.lock().0, 3);
            assert_eq!(lock.stats.registrations.load(Ordering::Relaxed), 3);
            let waits = lock.stats.futex_waits.load(Ordering::Relaxed);
            assert!(waits >= 3, "only {waits} futex waits for 3 sleepers");
            assert_eq!(lock.sleepers.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn no_lost_wakeup_under_churn_with_sleeping_holders_in_both_modes() {
        const THREADS: u64 = 3;
        const ITERS: u64 = 20_000;
        for heavy in modes() {
            let lock = Arc::new(DevLock::new_with_mode(Counter(0), heavy));
            let (done_tx, done_rx) = mpsc::channel();
            for seed in 0..THREADS {
                let lock = Arc::clone(&lock);
                let done_tx = done_tx.clone();
                thread::spawn(move || {
                    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for _ in 0..ITERS {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let mut g = lock.lock();
                        let v = std::hint::black_box(g.0);
                        if rng % 128 == 0 {
                            thread::sleep(Duration::from_micros(50));
                        } else {
                            for _ in 0..(rng % 32) {
                                std::hint::spin_loop();
                            }
                        }
                        g.0 = v + 1;
                    }
                    let _ = done_tx.send(());
                });
            }
            drop(done_tx);
            for _ in 0..THREADS {
                done_rx
                    .recv_timeout(Duration::from_secs(60))
                    .expect("a thread is stuck (lost wakeup?) or panicked");
            }
            assert_eq!(lock.lock().0, THREADS * ITERS);
            eprintln!(
                "churn (heavy_barrier = {}): {} registrations, {} futex waits",
                lock.heavy_barrier,
                lock.stats.registrations.load(Ordering::Relaxed),
                lock.stats.futex_waits.load(Ordering::Relaxed),
            );
        }
    }

    /// Spins briefly, then yields (so that a descheduled peer is not starved on 2 cores),
    /// until `counter` reaches `target`; false after 10 s.
    fn wait_for(counter: &AtomicU64, target: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut spins = 0u32;
        while counter.load(Ordering::Acquire) < target {
            spins += 1;
            if spins < 1_000 {
                std::hint::spin_loop();
            } else if Instant::now() < deadline {
                thread::yield_now();
            } else {
                return false;
            }
        }
        true
    }

    /// Each round, the main thread holds the lock until the other thread is about to call
    /// `lock`, releases at a random moment around the one at which that thread gives up
    /// spinning and registers to sleep, then leaves the lock alone until that thread reports it
    /// got in: a single lost wakeup is a hang here (nobody else unlocks to heal it), which the
    /// deadline turns into a failure.
    #[test]
    fn no_lost_wakeup_when_the_release_races_the_sleeper_registration() {
        const ROUNDS: u64 = 20_000;
        for heavy in modes() {
            let lock = Arc::new(DevLock::new_with_mode(Counter(0), heavy));
            let arrived = Arc::new(AtomicU64::new(0));
            let done = Arc::new(AtomicU64::new(0));
            let waiter = {
                let (lock, arrived, done) =
                    (Arc::clone(&lock), Arc::clone(&arrived), Arc::clone(&done));
                thread::spawn(move || {
                    for round in 1..=ROUNDS {
                        // The main thread takes the lock for this round once `done` says the
                        // previous one is over; wait for that before arriving.
                        while lock.try_lock().is_some() {
                            thread::yield_now();
                        }
                        arrived.store(round, Ordering::Release);
                        lock.lock().0 += 1;
                        done.store(round, Ordering::Release);
                    }
                })
            };
            let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
            for round in 1..=ROUNDS {
                let mut g = lock.lock();
                g.0 += 1;
                assert!(
                    wait_for(&arrived, round),
                    "round {round}: waiter never arrived"
                );
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Around the waiter's spin budget (SPIN_LIMIT spin_loops), sometimes longer.
                for _ in 0..(rng % (4 * u64::from(SPIN_LIMIT))) {
                    std::hint::spin_loop();
                }
                drop(g);
                assert!(
                    wait_for(&done, round),
                    "round {round}: waiter never woke (heavy_barrier = {})",
                    lock.heavy_barrier
                );
            }
            waiter.join().expect("waiter panicked");
            assert_eq!(lock.lock().0, 2 * ROUNDS);
            let registrations = lock.stats.registrations.load(Ordering::Relaxed);
            eprintln!(
                "release-vs-registration race (heavy_barrier = {}): {registrations} \
                 registrations, {} futex waits in {ROUNDS} rounds",
                lock.heavy_barrier,
                lock.stats.futex_waits.load(Ordering::Relaxed),
            );
            assert!(registrations > 0, "the race was never exercised");
        }
    }

    #[test]
    fn new_picks_heavy_barrier_mode_exactly_when_the_membarrier_probe_succeeds() {
        let supported = sys::membarrier_available();
        let lock = DevLock::new(());
        eprintln!(
            "devlock: membarrier PRIVATE_EXPEDITED probe {}; DevLock::new picked {} mode",
            if supported { "succeeded" } else { "failed" },
            if lock.heavy_barrier {
                "heavy-barrier (plain-store release)"
            } else {
                "RMW-release"
            },
        );
        assert_eq!(lock.heavy_barrier, supported);
        assert_eq!(DevLock::new_with_mode((), true).heavy_barrier, supported);
        assert!(!DevLock::new_with_mode((), false).heavy_barrier);
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        if supported {
            assert!(sys::heavy_barrier(), "registered membarrier failed");
        }
    }

    #[test]
    fn panic_inside_the_guard_releases_the_lock() {
        for heavy in modes() {
            let lock = DevLock::new_with_mode(Counter(0), heavy);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut g = lock.lock();
                g.0 += 1;
                panic!("boom while holding the lock");
            }));
            assert!(result.is_err());
            let mut g = lock.try_lock().expect("the panic left the lock held");
            g.0 += 1;
            drop(g);
            assert_eq!(lock.lock().0, 2);
        }
    }

    #[test]
    fn debug_does_not_block_on_a_held_lock() {
        let lock = DevLock::new(5u32);
        assert_eq!(format!("{lock:?}"), "DevLock { data: 5 }");
        let g = lock.lock();
        assert_eq!(format!("{lock:?}"), "DevLock { data: <locked> }");
        drop(g);
    }

    #[test]
    fn into_inner_and_get_mut_reach_the_value() {
        let mut lock = DevLock::new(vec![1u32]);
        lock.get_mut().push(2);
        assert_eq!(*lock.lock(), [1, 2]);
        assert_eq!(lock.into_inner(), [1, 2]);
    }

    #[test]
    #[ignore = "measurement: run with --release --ignored --nocapture"]
    fn measure_uncontended_lock_unlock() {
        const N: u64 = 20_000_000;
        fn per_op(mut f: impl FnMut()) -> f64 {
            for _ in 0..N / 20 {
                f();
            }
            let t = Instant::now();
            for _ in 0..N {
                f();
            }
            t.elapsed().as_nanos() as f64 / N as f64
        }
        for round in 0..2 {
            let heavy = DevLock::new_with_mode(0u64, true);
            let rmw = DevLock::new_with_mode(0u64, false);
            let pl = parking_lot::Mutex::new(0u64);
            let std_m = std::sync::Mutex::new(0u64);
            let h = per_op(|| *std::hint::black_box(&heavy).lock() += 1);
            let r = per_op(|| *std::hint::black_box(&rmw).lock() += 1);
            let p = per_op(|| *std::hint::black_box(&pl).lock() += 1);
            let s = per_op(|| {
                if let Ok(mut g) = std::hint::black_box(&std_m).lock() {
                    *g += 1;
                }
            });
            eprintln!(
                "round {round}: ns per lock+unlock over {N}: DevLock heavy-barrier mode \
                 (active: {}) {h:.2}, DevLock RMW mode {r:.2}, parking_lot::Mutex {p:.2}, \
                 std::sync::Mutex {s:.2}",
                heavy.heavy_barrier
            );
        }
    }
}
