//! The event clock behind [`super::now_us`]: Unix-epoch microseconds from `CLOCK_MONOTONIC`.
//!
//! Invariant: the value is `CLOCK_MONOTONIC` plus one offset to `CLOCK_REALTIME` taken once
//! per process, so it is Unix-epoch microseconds at start and never goes backwards within
//! the process: the kernel guarantees that `CLOCK_MONOTONIC` read on any CPU, by any thread,
//! is never less than a read that happened before it, and the offset is a constant. A
//! wall-clock step after start does not move it.
//!
//! Why this and not the TSC: an earlier version read the time-stamp counter through a line
//! calibrated against `CLOCK_MONOTONIC`, a little cheaper than the vDSO call. The line and
//! the clock disagree by rounding at the hand-over and wherever a thread fell back to the
//! clock, so under CPU load the recorded time could go backwards. A clock that must never
//! go backwards is worth the few nanoseconds (BENCHMARKS.md, "Measurements behind design
//! choices"); the vDSO read allocates nothing and takes no lock.

use std::sync::OnceLock;

fn clock_ns(id: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes it.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}

/// `CLOCK_REALTIME - CLOCK_MONOTONIC` at the first read, in ns.
static OFFSET_NS: OnceLock<i64> = OnceLock::new();

fn offset_ns() -> i64 {
    *OFFSET_NS.get_or_init(|| {
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        let real = clock_ns(libc::CLOCK_REALTIME);
        real - mono
    })
}

/// Microseconds since the Unix epoch (see the module invariant).
#[inline]
pub fn now_us() -> i64 {
    let off = offset_ns();
    (clock_ns(libc::CLOCK_MONOTONIC) + off).div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system_us() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0)
    }

    #[test]
    fn clock_is_unix_microseconds_and_measures_a_sleep() {
        let before = system_us();
        let a = now_us();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now_us();
        let after = system_us();
        // The offset to the wall clock is taken once; allow for a clock slew meanwhile.
        assert!(
            a >= before - 2_000 && b <= after + 2_000,
            "{before} {a} {b} {after}"
        );
        // A sleep lasts at least as long as asked; a loaded machine only makes it longer.
        assert!(b - a >= 20_000, "20 ms sleep measured as {} us", b - a);
    }

    #[test]
    fn clock_never_goes_backwards_across_threads() {
        // Reads ordered by a lock (as events are recorded under the device's lock) must be
        // non-decreasing whatever thread or CPU makes them. A fixed number of reads, not a
        // time budget, so a loaded machine only makes the test slower.
        let last = std::sync::Mutex::new(0i64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..50_000u32 {
                        let mut g = last.lock().unwrap_or_else(|e| e.into_inner());
                        let t = now_us();
                        assert!(t >= *g, "clock went back from {} to {t}", *g);
                        *g = t;
                        drop(g);
                        if i % 1024 == 0 {
                            std::thread::yield_now();
                        }
                    }
                });
            }
        });
    }
}
