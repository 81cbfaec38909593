//! The event clock behind [`super::now_us`]: Unix-epoch microseconds, read from the CPU's
//! time-stamp counter where the kernel itself trusts it, else from `clock_gettime`.
//!
//! Invariant: the value is `CLOCK_MONOTONIC` plus one offset to `CLOCK_REALTIME` taken once
//! per process, so it is Unix-epoch microseconds at start and never goes backwards within
//! the process (a wall-clock step after start does not move it). The TSC path is a fixed
//! line through two (TSC, `CLOCK_MONOTONIC`) points taken at least [`CALIBRATE_NS`] apart:
//! it passes through the second point, where the `clock_gettime` path hands over to it, and
//! its slope is positive, so it is non-decreasing in the counter.
//!
//! Why: `clock_gettime` through the vDSO cost about 40-45 ns on the VM this was measured on,
//! most of the cost of recording an event; `rdtsc` costs about 18 ns. The TSC is used only
//! where the kernel's current clocksource is `tsc` (the kernel checked that it is invariant
//! and synchronized across CPUs), on x86-64. The rate error of a 50 ms calibration is about
//! a few parts per million (a few ms per hour against the system clock), well inside what a
//! memory-history timeline needs; the ordering within the process is exact.

use std::sync::OnceLock;

/// Minimum distance between the two calibration points.
const CALIBRATE_NS: i64 = 50_000_000;
/// A (TSC, clock) reading whose two TSC reads around the clock read are further apart than
/// this was interrupted and is not used as a calibration point.
const MAX_BRACKET_TICKS: u64 = 20_000;

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

#[cfg(target_arch = "x86_64")]
fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64; it only reads the counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc() -> u64 {
    0
}

/// Whether the kernel's current clocksource is the TSC (read once, without allocating).
fn kernel_uses_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let path = c"/sys/devices/system/clocksource/clocksource0/current_clocksource";
    // SAFETY: `path` is a NUL-terminated string; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 16];
    // SAFETY: reads at most `buf.len()` bytes into `buf`, which we own.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    n >= 3 && buf[..n as usize].trim_ascii_end() == b"tsc"
}

/// A (TSC, `CLOCK_MONOTONIC` ns) pair read close together, or `None` if interrupted.
fn point() -> Option<(u64, i64)> {
    let t1 = tsc();
    let ns = clock_ns(libc::CLOCK_MONOTONIC);
    let t2 = tsc();
    (t2 >= t1 && t2 - t1 <= MAX_BRACKET_TICKS).then_some((t1 + (t2 - t1) / 2, ns))
}

struct Start {
    /// `CLOCK_REALTIME - CLOCK_MONOTONIC` at start, in ns.
    offset_ns: i64,
    /// First calibration point, when the TSC may be used.
    first: Option<(u64, i64)>,
}

/// The TSC line: `ns = ns0 + (tsc - tsc0) * ns_per_tick_q32 >> 32` (`CLOCK_MONOTONIC` ns).
struct Line {
    tsc0: u64,
    ns0: i64,
    ns_per_tick_q32: u64,
    offset_ns: i64,
}

static START: OnceLock<Start> = OnceLock::new();
static LINE: OnceLock<Line> = OnceLock::new();

fn start() -> &'static Start {
    START.get_or_init(|| {
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        let real = clock_ns(libc::CLOCK_REALTIME);
        let first = if kernel_uses_tsc() {
            (0..8).find_map(|_| point())
        } else {
            None
        };
        Start {
            offset_ns: real - mono,
            first,
        }
    })
}

/// Microseconds since the Unix epoch (see the module invariant).
#[inline]
pub fn now_us() -> i64 {
    if let Some(l) = LINE.get() {
        let t = tsc();
        if t >= l.tsc0 {
            let dns = ((u128::from(t - l.tsc0) * u128::from(l.ns_per_tick_q32)) >> 32) as i64;
            return (l.ns0 + dns + l.offset_ns) / 1000;
        }
    }
    slow_now_us()
}

#[cold]
fn slow_now_us() -> i64 {
    let s = start();
    if let Some((tsc0, ns0)) = s.first {
        if let Some((t, ns)) = point() {
            if ns - ns0 >= CALIBRATE_NS && t > tsc0 {
                let q = ((((ns - ns0) as u128) << 32) / u128::from(t - tsc0)) as u64;
                if q > 0 {
                    // The line through the second point: from here on the TSC path gives
                    // `ns` at `t`, as this call does.
                    let _ = LINE.set(Line {
                        tsc0: t,
                        ns0: ns,
                        ns_per_tick_q32: q,
                        offset_ns: s.offset_ns,
                    });
                }
            }
            return (ns + s.offset_ns) / 1000;
        }
    }
    (clock_ns(libc::CLOCK_MONOTONIC) + s.offset_ns) / 1000
}

/// Whether [`now_us`] reads the TSC now (for tests and benchmarks).
pub fn uses_tsc() -> bool {
    LINE.get().is_some()
}

/// Whether the TSC path can be used in this process (after calibration).
pub fn tsc_usable() -> bool {
    start().first.is_some()
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
    fn clock_is_unix_microseconds_and_calibrates_where_the_kernel_uses_the_tsc() {
        let before = system_us();
        let a = now_us();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let _ = now_us();
        let b = now_us();
        let after = system_us();
        // The offset to the wall clock is taken once; allow for a clock slew meanwhile.
        assert!(
            a >= before - 2_000 && b <= after + 2_000,
            "{before} {a} {b} {after}"
        );
        assert!(b - a >= 60_000, "60 ms sleep measured as {} us", b - a);
        if tsc_usable() {
            assert!(uses_tsc(), "TSC usable but not calibrated after 60 ms");
        }
    }

    #[test]
    fn clock_never_goes_backwards_across_threads_and_the_handover() {
        let last = std::sync::Mutex::new(0i64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let end = std::time::Instant::now() + std::time::Duration::from_millis(120);
                    while std::time::Instant::now() < end {
                        // Under one lock, as events are recorded under the device's lock.
                        let mut g = last.lock().unwrap();
                        let t = now_us();
                        assert!(t >= *g, "clock went back from {} to {t}", *g);
                        *g = t;
                    }
                });
            }
        });
    }
}
