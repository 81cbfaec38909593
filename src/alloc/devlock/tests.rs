//! `DevLock`'s tests: mutual exclusion, sleeping and waking, revocation of the bias, in
//! every mode.

use super::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A counter that is deliberately not atomic: only the lock makes its increments exact.
#[derive(Debug)]
struct Counter(u64);

/// (heavy_barrier, biased): biased, heavy-barrier unbiased, RMW.
fn modes() -> [(bool, bool); 3] {
    [(true, true), (true, false), (false, false)]
}

/// Which mode a lock ended up in (the request is downgraded without membarrier).
fn mode_name<T>(lock: &DevLock<T>) -> &'static str {
    match (
        lock.heavy_barrier,
        lock.stats.biased.load(Ordering::Relaxed) > 0,
    ) {
        (true, true) => "biased",
        (true, false) => "heavy-barrier",
        (false, _) => "RMW",
    }
}

/// Makes the current thread the bias owner (if biasing is on), then revokes the bias from
/// another thread, so that the rest of a test exercises the plain `word` protocol.
fn revoke_bias<T: Send>(lock: &DevLock<T>) {
    drop(lock.lock());
    thread::scope(|s| {
        s.spawn(|| drop(lock.lock()));
    });
    assert_eq!(lock.bias.load(Ordering::Relaxed), NO_BIAS);
}

#[test]
fn mutual_exclusion_gives_exact_total_in_both_modes() {
    for (heavy, biased) in modes() {
        let lock = Arc::new(DevLock::new_with_modes(Counter(0), heavy, biased));
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
        assert_eq!(lock.lock().0, 800_000, "mode {}", mode_name(&lock));
    }
}

#[test]
fn sleepers_blocked_behind_a_long_holder_reach_the_futex_and_are_woken() {
    for (heavy, biased) in modes() {
        let lock = Arc::new(DevLock::new_with_modes(Counter(0), heavy, biased));
        // Revokers wait on `owner_in`, not on the futex: start from the revoked state.
        revoke_bias(&lock);
        let guard = lock.lock();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let lock = Arc::clone(&lock);
                thread::spawn(move || lock.lock().0 += 1)
            })
            .collect();
        // Wait until all three registered and found the lock held at their last check before
        // sleeping (the holder holds until then, however slowly they are scheduled).
        let deadline = Instant::now() + Duration::from_secs(60);
        while lock.stats.futex_waits.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "waiters never went to sleep");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(guard.0, 0, "a waiter got in while the holder held the lock");
        drop(guard);
        for t in threads {
            t.join().expect("waiter panicked");
        }
        assert_eq!(lock.lock().0, 3);
        // A spurious return from futex_wait may make a waiter register again.
        assert!(lock.stats.registrations.load(Ordering::Relaxed) >= 3);
        let waits = lock.stats.futex_waits.load(Ordering::Relaxed);
        assert!(waits >= 3, "only {waits} futex waits for 3 sleepers");
        assert_eq!(lock.sleepers.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn no_lost_wakeup_under_churn_with_sleeping_holders_in_both_modes() {
    const THREADS: u64 = 3;
    const ITERS: u64 = 20_000;
    for (heavy, biased) in modes() {
        let lock = Arc::new(DevLock::new_with_modes(Counter(0), heavy, biased));
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
            "churn ({} mode): {} registrations, {} futex waits",
            mode_name(&lock),
            lock.stats.registrations.load(Ordering::Relaxed),
            lock.stats.futex_waits.load(Ordering::Relaxed),
        );
    }
}

/// Spins briefly, then yields (so that a descheduled peer is not starved on 2 cores),
/// until `counter` reaches `target`; false after 60 s.
fn wait_for(counter: &AtomicU64, target: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
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
/// `lock`, releases at a pseudo-random moment around the one at which that thread gives up
/// spinning and registers to sleep, then leaves the lock alone until that thread reports it
/// got in: a single lost wakeup is a hang here (nobody else unlocks to heal it), which the
/// deadline turns into a failure. A stress loop: how often the release actually lands in
/// the registration window depends on scheduling, so it is reported, never asserted (the
/// forced interleavings are `a_release_at_each_step_of_the_sleeper_registration_...`).
#[test]
fn no_lost_wakeup_when_the_release_races_the_sleeper_registration() {
    const ROUNDS: u64 = 10_000;
    for (heavy, biased) in modes() {
        let lock = Arc::new(DevLock::new_with_modes(Counter(0), heavy, biased));
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
            // Around the waiter's spin budget, sometimes longer.
            for _ in 0..(rng % (4 * WAITER_SPIN_PAUSES)) {
                std::hint::spin_loop();
            }
            drop(g);
            assert!(
                wait_for(&done, round),
                "round {round}: waiter never woke ({} mode)",
                mode_name(&lock)
            );
        }
        waiter.join().expect("waiter panicked");
        assert_eq!(lock.lock().0, 2 * ROUNDS);
        eprintln!(
            "release-vs-registration stress ({} mode): {} registrations, {} futex waits in \
             {ROUNDS} rounds",
            mode_name(&lock),
            lock.stats.registrations.load(Ordering::Relaxed),
            lock.stats.futex_waits.load(Ordering::Relaxed),
        );
    }
}

/// The release lands at each step of a sleeper's registration, forced rather than hoped
/// for: the waiter parks at the step (registered; registered and fenced; its CAS failed
/// and it is about to sleep), the holder releases there, and the waiter must get in with
/// no further unlock to wake it.
#[test]
fn a_release_at_each_step_of_the_sleeper_registration_never_loses_the_wakeup() {
    for (heavy, biased) in modes() {
        for point in [
            GatePoint::AfterRegister,
            GatePoint::AfterBarrier,
            GatePoint::BeforeFutexWait,
        ] {
            let lock = Arc::new(DevLock::new_with_modes(Counter(0), heavy, biased));
            // Revokers wait on `owner_in`, not on the futex: start from the revoked state.
            revoke_bias(&lock);
            lock.stats.gate.at.store(point as u32, Ordering::Release);
            let mut g = lock.lock();
            let waiter = {
                let lock = Arc::clone(&lock);
                thread::spawn(move || lock.lock().0 += 1)
            };
            assert!(
                wait_for_flag(&lock.stats.gate.reached),
                "waiter never reached {point:?}"
            );
            g.0 += 1;
            drop(g);
            lock.stats.gate.open.store(1, Ordering::Release);
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || {
                let _ = tx.send(waiter.join().is_ok());
            });
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(ok) => assert!(ok, "waiter panicked"),
                Err(_) => panic!(
                    "lost wakeup: release at {point:?} ({} mode) left the waiter asleep",
                    mode_name(&lock)
                ),
            }
            assert_eq!(lock.lock().0, 2);
            assert_eq!(lock.sleepers.load(Ordering::Relaxed), 0);
            assert!(lock.stats.registrations.load(Ordering::Relaxed) >= 1);
        }
    }
}

/// Waits (yielding) until `flag` is set; false after 60 s.
fn wait_for_flag(flag: &AtomicU32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while flag.load(Ordering::Acquire) == 0 {
        if Instant::now() >= deadline {
            return false;
        }
        thread::yield_now();
    }
    true
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
    // Biasing exactly when heavy-barrier mode is active and not turned off.
    let unbiased_if_supported = if supported { UNBIASED } else { NO_BIAS };
    assert_eq!(lock.bias.load(Ordering::Relaxed), unbiased_if_supported);
    let heavy_biased = DevLock::new_with_modes((), true, true);
    assert_eq!(
        heavy_biased.bias.load(Ordering::Relaxed),
        unbiased_if_supported
    );
    let heavy_unbiased = DevLock::new_with_modes((), true, false);
    assert_eq!(heavy_unbiased.bias.load(Ordering::Relaxed), NO_BIAS);
    assert_eq!(heavy_unbiased.heavy_barrier, supported);
    let rmw = DevLock::new_with_modes((), false, true);
    assert_eq!(rmw.bias.load(Ordering::Relaxed), NO_BIAS);
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    if supported {
        assert!(sys::heavy_barrier(), "registered membarrier failed");
    }
}

#[test]
fn panic_inside_the_guard_releases_the_lock() {
    for (heavy, biased) in modes() {
        let lock = DevLock::new_with_modes(Counter(0), heavy, biased);
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

/// Runs `f` on a fresh thread; a hang past 60 s (or a panic) fails the test.
fn with_watchdog(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => worker.join().expect("worker panicked after finishing"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let e = worker
                .join()
                .expect_err("the worker exited without reporting");
            std::panic::resume_unwind(e);
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: stuck for 60 s"),
    }
}

#[test]
fn single_thread_takes_the_biased_path_and_never_touches_word() {
    const N: u64 = 1_000_000;
    let lock = DevLock::new(Counter(0));
    for _ in 0..N {
        let mut g = lock.lock();
        g.0 += 1;
        // Held through the biased path: `word` stays free.
        assert_eq!(lock.word.load(Ordering::Relaxed), 0);
    }
    assert_eq!(lock.lock().0, N);
    let (biased, word) = (
        lock.stats.biased.load(Ordering::Relaxed),
        lock.stats.word.load(Ordering::Relaxed),
    );
    if !sys::membarrier_available() {
        eprintln!("membarrier unavailable: no biasing; all {word} acquisitions via word");
        assert_eq!((biased, word), (0, N + 1));
        return;
    }
    assert_eq!(biased, N + 1, "biased acquisitions");
    assert_eq!(word, 0, "acquisitions through word");
    assert_eq!(lock.bias.load(Ordering::Relaxed), sys::thread_token());
    assert_eq!(lock.owner_in.load(Ordering::Relaxed), 0);
    assert_eq!(lock.revoked.load(Ordering::Relaxed), 0);
}

/// Data that only the lock protects: `in_cs` is set for the whole critical section, so a
/// second thread inside at the same time sees it set.
struct Shared {
    count: u64,
    in_cs: bool,
}

fn hammer(lock: &DevLock<Shared>, iters: u64) {
    for _ in 0..iters {
        let mut g = lock.lock();
        assert!(!g.in_cs, "two threads inside the critical section");
        g.in_cs = true;
        let g = std::hint::black_box(&mut g);
        let v = std::hint::black_box(g.count);
        g.count = v + 1;
        std::hint::black_box(&mut *g);
        g.in_cs = false;
    }
}

#[test]
fn mutual_exclusion_holds_across_the_revocation_of_a_busy_owner() {
    // Fresh locks each round, so every round races a revocation against the owner's loop.
    let rounds: u64 = if cfg!(debug_assertions) { 20 } else { 200 };
    const ITERS: u64 = 5_000;
    const OTHERS: u64 = 3;
    with_watchdog("revocation under load", move || {
        let (mut revoked_by_revoker, mut revoked_by_owner) = (0, 0);
        for round in 0..rounds {
            let lock = DevLock::new(Shared {
                count: 0,
                in_cs: false,
            });
            let biased = std::sync::Barrier::new(OTHERS as usize + 1);
            thread::scope(|s| {
                s.spawn(|| {
                    hammer(&lock, 1);
                    biased.wait();
                    hammer(&lock, ITERS);
                });
                for _ in 0..OTHERS {
                    s.spawn(|| {
                        biased.wait();
                        hammer(&lock, ITERS);
                    });
                }
            });
            let g = lock.lock();
            assert_eq!(g.count, 1 + (OTHERS + 1) * ITERS, "round {round}");
            assert!(!g.in_cs);
            drop(g);
            if sys::membarrier_available() {
                assert_eq!(lock.bias.load(Ordering::Relaxed), NO_BIAS, "round {round}");
                assert!(lock.stats.biased.load(Ordering::Relaxed) >= 1);
                match lock.stats.revocations.load(Ordering::Relaxed) {
                    0 => revoked_by_owner += 1,
                    _ => revoked_by_revoker += 1,
                }
            }
        }
        eprintln!(
            "{rounds} rounds: revocation completed by a revoker in {revoked_by_revoker}, \
             by the owner's bail-out only in {revoked_by_owner}"
        );
    });
}

#[test]
fn revoker_waits_for_the_owner_to_leave_a_long_biased_critical_section() {
    with_watchdog("revoker behind a long owner", || {
        let lock = DevLock::new(Shared {
            count: 0,
            in_cs: false,
        });
        let inside = std::sync::Barrier::new(2);
        thread::scope(|s| {
            s.spawn(|| {
                let mut g = lock.lock();
                g.in_cs = true;
                inside.wait();
                thread::sleep(Duration::from_millis(20));
                g.count += 1;
                g.in_cs = false;
            });
            s.spawn(|| {
                inside.wait();
                let t = Instant::now();
                let mut g = lock.lock();
                let waited = t.elapsed();
                assert!(!g.in_cs, "got in while the owner was inside");
                assert_eq!(g.count, 1, "the owner's critical section is not visible");
                g.count += 1;
                if sys::membarrier_available() {
                    assert!(!g.biased && lock.stats.revocations.load(Ordering::Relaxed) == 1);
                }
                // That it waited is proven by `count` above, not by the clock (a revoker
                // descheduled after the barrier may find the owner already gone).
                eprintln!("revoker waited {waited:?} for a 20 ms owner");
            });
        });
        assert_eq!(lock.lock().count, 2);
    });
}

#[test]
fn locking_after_the_owner_thread_exits_inherits_or_revokes_the_bias() {
    with_watchdog("lock after owner exit", || {
        let lock = Arc::new(DevLock::new(Counter(0)));
        let owner_token = {
            let lock = Arc::clone(&lock);
            thread::spawn(move || {
                lock.lock().0 += 1;
                sys::thread_token()
            })
            .join()
            .expect("owner panicked")
        };
        // A new thread: glibc's stack cache usually gives it the dead owner's TCB, hence its
        // token (inheritance); otherwise it revokes.
        let (heir_token, heir_biased) = {
            let lock = Arc::clone(&lock);
            thread::spawn(move || {
                let mut g = lock.lock();
                g.0 += 1;
                (sys::thread_token(), g.biased)
            })
            .join()
            .expect("heir panicked")
        };
        // And the main thread, alive all along, certainly revokes if still biased.
        lock.lock().0 += 1;
        assert_eq!(lock.lock().0, 3);
        if sys::membarrier_available() {
            assert_eq!(heir_biased, heir_token == owner_token);
            assert_eq!(lock.bias.load(Ordering::Relaxed), NO_BIAS);
            assert_eq!(lock.stats.revocations.load(Ordering::Relaxed), 1);
        }
        eprintln!(
            "heir {} the dead owner's token",
            if heir_token == owner_token {
                "reused (inherited the bias)"
            } else {
                "did not reuse (revoked the bias)"
            }
        );
    });
}

#[test]
fn the_owner_cannot_get_a_second_guard_while_it_holds_one() {
    let lock = DevLock::new(Counter(0));
    let g = lock.lock();
    assert!(
        lock.try_lock().is_none(),
        "re-entry handed out a second guard"
    );
    assert_eq!(format!("{lock:?}"), "DevLock { data: <locked> }");
    drop(g);
    assert!(lock.try_lock().is_some());
    if sys::membarrier_available() {
        // Still biased, never revoked by the refused re-entry.
        assert_eq!(lock.bias.load(Ordering::Relaxed), sys::thread_token());
        assert_eq!(lock.revoked.load(Ordering::Relaxed), 0);
    }
}

/// The owner's fast path in isolation, for disassembly (`objdump -d` the test binary and
/// look for `probe_biased_lock_unlock`).
#[inline(never)]
fn probe_biased_lock_unlock(lock: &DevLock<u64>) {
    *lock.lock() += 1;
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
    let probe: fn(&DevLock<u64>) = std::hint::black_box(probe_biased_lock_unlock);
    for round in 0..3 {
        let biased = DevLock::new_with_modes(0u64, true, true);
        let heavy = DevLock::new_with_modes(0u64, true, false);
        let rmw = DevLock::new_with_mode(0u64, false);
        let pl = parking_lot::Mutex::new(0u64);
        let std_m = std::sync::Mutex::new(0u64);
        let b = per_op(|| *std::hint::black_box(&biased).lock() += 1);
        let bp = per_op(|| probe(std::hint::black_box(&biased)));
        let h = per_op(|| *std::hint::black_box(&heavy).lock() += 1);
        let r = per_op(|| *std::hint::black_box(&rmw).lock() += 1);
        let p = per_op(|| *std::hint::black_box(&pl).lock() += 1);
        let s = per_op(|| {
            if let Ok(mut g) = std::hint::black_box(&std_m).lock() {
                *g += 1;
            }
        });
        assert_eq!(biased.stats.word.load(Ordering::Relaxed), 0);
        eprintln!(
            "round {round}: ns per lock+unlock over {N}: DevLock biased owner (active: {}) \
             {b:.2} (through the out-of-line probe {bp:.2}), DevLock heavy-barrier mode \
             unbiased (active: {}) {h:.2}, DevLock RMW mode {r:.2}, parking_lot::Mutex \
             {p:.2}, std::sync::Mutex {s:.2}",
            biased.stats.biased.load(Ordering::Relaxed) > 0,
            heavy.heavy_barrier
        );
    }
}
