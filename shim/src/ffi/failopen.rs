//! Fail open: an internal failure of the shim never becomes an error the program would not
//! have seen without it.
//!
//! Policy, and why: a program that works without the shim must work with it. When an
//! export fails inside the shim (a panic, an injected fault, an initialization that cannot
//! finish), that call goes to the next definition of the function with the program's own
//! arguments, and caching is turned off for new allocations for the rest of the process,
//! with one `cushim:` line: state that failed once is not trusted to serve more. What the
//! cache holds unused goes back to CUDA then, and each block freed later as soon as its
//! segment is empty, so the program has the memory it would have without the shim. Pointers
//! the cache already handed out keep being served by it (a free of one never reaches the
//! driver, which does not know it as an allocation of its own). A free that fails inside
//! the shim therefore falls back to the cache's plain free for the cache's pointers and to
//! the real function for everything else.
//!
//! Fault injection (tests only): `CUSHIM_TEST_FAULT=point[@n][,point[@n]...]` makes the
//! shim fail at the n-th time (default the first) a point is passed, process-wide, once per
//! point. Points: `init` (start-up), `runtime` (cached runtime allocations and frees),
//! `driver` (cached driver allocations and frees), `pinned` (pinned host allocations and
//! frees, both layers), `vmm` (the program's own VMM calls, recorded), `observe` (observing
//! mode's records), `stream` (stream creation and destruction, capture: the first hit of a
//! creation fails after the real call, a destruction before it), `ipc` (the IPC exports: on
//! entry to the cache's handling of an export, an open or a close, and again right after a
//! real call it made with arguments of its own), `peer` (the peer-access exports: before
//! the real call, and in carrying its result onto the cache's mappings after it). The
//! variable is read once; without it a point costs one relaxed load of a static and a
//! branch that is never taken.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cushim::alloc::FreeError;
use once_cell::sync::OnceCell;

/// A place where a fault can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    Init = 0,
    Runtime = 1,
    Driver = 2,
    Pinned = 3,
    Vmm = 4,
    Observe = 5,
    Stream = 6,
    Ipc = 7,
    Peer = 8,
}

/// How many points there are.
const N: usize = 9;

const POINTS: [(&str, Point); N] = [
    ("init", Point::Init),
    ("runtime", Point::Runtime),
    ("driver", Point::Driver),
    ("pinned", Point::Pinned),
    ("vmm", Point::Vmm),
    ("observe", Point::Observe),
    ("stream", Point::Stream),
    ("ipc", Point::Ipc),
    ("peer", Point::Peer),
];

/// One word for the hot paths: a bit per armed point, [`OFF`] once caching is off, and
/// [`UNREAD`] until the variable was read (so the first pass takes the slow path once).
/// Zero in a healthy process without the test switch: each point costs one relaxed load and
/// a branch that is never taken.
static HOT: AtomicU32 = AtomicU32::new(UNREAD);
const UNREAD: u32 = 1 << 31;
const OFF: u32 = 1 << 30;
const ARMED_MASK: u32 = (1 << N) - 1;
/// The hit at which each point fails (1-based).
static AT: [AtomicU64; N] = [const { AtomicU64::new(1) }; N];
/// Hits so far per point.
static HITS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

/// The payload of an injected fault's unwind.
pub struct InjectedFault;

/// Parse `CUSHIM_TEST_FAULT`: the armed bits and each point's hit number; `Err` names the
/// first item that is not `point[@n]` with n >= 1.
pub fn parse(v: &str) -> Result<(u32, [u64; N]), String> {
    let mut bits = 0u32;
    let mut at = [1u64; N];
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, n) = match item.split_once('@') {
            Some((name, n)) => match n.parse::<u64>() {
                Ok(n) if n >= 1 => (name, n),
                _ => return Err(item.to_string()),
            },
            None => (item, 1),
        };
        let (_, p) = POINTS
            .iter()
            .find(|(pn, _)| *pn == name)
            .ok_or_else(|| item.to_string())?;
        bits |= 1 << *p as u32;
        at[*p as usize] = n;
    }
    Ok((bits, at))
}

#[cold]
fn read_armed() -> u32 {
    let bits = match std::env::var("CUSHIM_TEST_FAULT") {
        Err(_) => 0,
        Ok(v) => match parse(&v) {
            Ok((bits, at)) => {
                for (slot, n) in AT.iter().zip(at) {
                    slot.store(n, Ordering::Relaxed);
                }
                bits
            }
            Err(item) => {
                let names: Vec<&str> = POINTS.iter().map(|(n, _)| *n).collect();
                eprintln!(
                    "cushim: CUSHIM_TEST_FAULT: {item:?} is not point[@n] with a point of {}; no fault injected",
                    names.join(", ")
                );
                0
            }
        },
    };
    // Two threads may race here; both store the same bits, and an OFF set meanwhile stays.
    let _ = HOT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some((v & OFF) | bits)
    });
    bits
}

/// Fail here if the test switch says so (unwinds with [`InjectedFault`], without running
/// the panic hook, into the export's guard).
#[inline]
pub fn inject(p: Point) {
    if HOT.load(Ordering::Relaxed) != 0 {
        inject_slow(p);
    }
}

/// For an allocation path: `true` when caching is off (the call goes to CUDA), else fail
/// here if the test switch says so. One relaxed load and an untaken branch when healthy.
#[inline]
pub fn pass_through(p: Point) -> bool {
    if HOT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    pass_through_slow(p)
}

#[cold]
fn pass_through_slow(p: Point) -> bool {
    inject_slow(p);
    caching_off()
}

#[cold]
fn inject_slow(p: Point) {
    let mut hot = HOT.load(Ordering::Acquire);
    if hot & UNREAD != 0 {
        read_armed();
        hot = HOT.load(Ordering::Acquire);
    }
    let i = p as usize;
    if hot & ARMED_MASK & (1 << i) == 0 {
        return;
    }
    if HITS[i].fetch_add(1, Ordering::AcqRel) + 1 == AT[i].load(Ordering::Relaxed) {
        std::panic::resume_unwind(Box::new(InjectedFault));
    }
}

/// Whether caching is off for new allocations (after an internal failure).
#[inline]
pub fn caching_off() -> bool {
    HOT.load(Ordering::Relaxed) & OFF != 0
}

/// What the first failure does to the shim's state: give what the cache holds unused back to
/// CUDA. Registered when the state is built (`life/state.rs`), before it is published, so a
/// failure that finds no drain here finds no state either.
static ON_FAILURE: OnceCell<fn()> = OnceCell::new();

/// Register what the first failure does to the shim's state (once; later calls are ignored).
pub fn on_failure(drain: fn()) {
    let _ = ON_FAILURE.set(drain);
}

/// Record an internal failure in `what`: caching off for new allocations (what the cache
/// holds unused goes back to CUDA), one line.
#[cold]
pub fn failed(what: &str) {
    if HOT.fetch_or(OFF, Ordering::AcqRel) & OFF == 0 {
        if let Some(drain) = ON_FAILURE.get() {
            drain();
        }
        eprintln!(
            "cushim: internal error in {what}; the call went to CUDA unchanged, and new allocations do from now on (the cache keeps serving what it handed out)"
        );
    }
}

/// Run `f`; if it fails inside the shim, record the failure and run `fallback` instead
/// (the next definition with the program's arguments, or the free fallback). A failure
/// of the fallback itself is `unknown`.
#[inline]
pub fn guard_or(
    what: &str,
    unknown: c_int,
    f: impl FnOnce() -> c_int,
    fallback: impl FnOnce() -> c_int,
) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(_) => fell(what, unknown, fallback),
    }
}

#[cold]
fn fell(what: &str, unknown: c_int, fallback: impl FnOnce() -> c_int) -> c_int {
    failed(what);
    catch_unwind(AssertUnwindSafe(fallback)).unwrap_or(unknown)
}

/// Run `f`, an export that calls the next definition (`real`, with the program's own
/// arguments) at most once through the function it is given. If `f` fails inside the shim
/// before that call, the call goes to `real` now; after it, the real call's result stands
/// (a call is never made twice: a stream created once, a capture begun once). Either way
/// the failure is recorded ([`failed`]). A failure of the fallback itself is
/// `cudaErrorUnknown`.
#[inline]
pub fn around(
    what: &str,
    real: impl Fn() -> c_int,
    f: impl FnOnce(&dyn Fn() -> c_int) -> c_int,
) -> c_int {
    let entered = std::cell::Cell::new(false);
    let made = std::cell::Cell::new(None);
    let once = || {
        entered.set(true);
        let rc = real();
        made.set(Some(rc));
        rc
    };
    match catch_unwind(AssertUnwindSafe(|| f(&once))) {
        Ok(code) => code,
        Err(_) => around_failed(what, entered.get(), made.get(), &real),
    }
}

#[cold]
fn around_failed(
    what: &str,
    entered: bool,
    made: Option<c_int>,
    real: &dyn Fn() -> c_int,
) -> c_int {
    failed(what);
    match made {
        Some(rc) => rc,
        None if entered => crate::ffi::ERR_UNKNOWN,
        None => catch_unwind(AssertUnwindSafe(real)).unwrap_or(crate::ffi::ERR_UNKNOWN),
    }
}

/// Run `note` (recording what a real call that already happened did); a failure there is
/// recorded and otherwise ignored, so the real call's result stands and the call is never
/// made twice.
pub fn note(what: &str, note: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(note)).is_err() {
        failed(what);
    }
}

/// A free after a failure inside the shim: `cache_free` (the cache's plain free, no stack,
/// no capture or observing logic) serves the cache's own pointers, then `freed` follows its
/// success; everything else, and every call before the shim was built (`state` is `None`),
/// goes to `real`. The shim's state comes in as a value so this layer names nothing above
/// it (`exports/fallback.rs` passes it).
#[inline]
pub fn free_fallback<S: 'static>(
    ptr: u64,
    state: impl FnOnce() -> Option<&'static S>,
    cache_free: impl FnOnce(&'static S) -> Result<(), FreeError>,
    freed: impl FnOnce(&'static S) -> c_int,
    real: impl FnOnce() -> c_int,
) -> c_int {
    if ptr != 0 {
        if let Some(s) = state() {
            match cache_free(s) {
                Ok(()) => return freed(s),
                Err(FreeError::NotOurs) => {}
                Err(FreeError::InvalidValue) => return crate::ffi::ERR_INVALID_VALUE,
                Err(FreeError::InvalidHandle) => return crate::ffi::ERR_INVALID_HANDLE,
            }
        }
    }
    real()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse_with_their_hit_numbers_and_garbage_is_refused() {
        let (bits, at) = parse("runtime@3, driver").expect("valid");
        assert_eq!(
            bits,
            (1 << Point::Runtime as u32) | (1 << Point::Driver as u32)
        );
        assert_eq!(at[Point::Runtime as usize], 3);
        assert_eq!(at[Point::Driver as usize], 1);
        assert_eq!(parse("").map(|p| p.0), Ok(0));
        assert!(parse("runtime@0").is_err());
        assert!(parse("kernel").is_err());
        assert!(parse("vmm@x").is_err());
    }

    #[test]
    fn a_failure_runs_the_fallback_and_turns_caching_off() {
        let rc = guard_or(
            "test",
            999,
            || std::panic::resume_unwind(Box::new(InjectedFault)),
            || 7,
        );
        assert_eq!(rc, 7);
        assert!(caching_off());
        assert_eq!(guard_or("test", 999, || 3, || 7), 3);
    }

    #[test]
    fn around_forwards_a_failure_before_the_real_call_and_keeps_a_real_result_after_it() {
        use std::cell::Cell;
        let calls = Cell::new(0);
        let real = || {
            calls.set(calls.get() + 1);
            5
        };
        let before = around("test", real, |_| {
            std::panic::resume_unwind(Box::new(InjectedFault))
        });
        assert_eq!((before, calls.get()), (5, 1), "forwarded once");
        let after = around("test", real, |r| {
            r();
            std::panic::resume_unwind(Box::new(InjectedFault))
        });
        assert_eq!(
            (after, calls.get()),
            (5, 2),
            "the real call made once, its result kept"
        );
        assert_eq!(around("test", real, |r| r() + 1), 6);
        assert!(caching_off());
    }
}
