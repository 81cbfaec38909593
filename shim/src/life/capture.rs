//! The program's stream captures, as the shim must honour them.
//!
//! Policy (CUDA's documented rules, which the cache must not change): while a thread's
//! capture interaction mode forbids "potentially unsafe" calls (global mode while any
//! global-mode capture runs, or while the thread itself captures in a mode other than
//! relaxed; thread-local mode while the thread itself captures in such a mode), `cudaMalloc`
//! and `cudaFree` fail with `cudaErrorStreamCaptureUnsupported` (900) and invalidate the
//! offending captures, so that `cudaStreamEndCapture` returns 901. The shim does not
//! invalidate captures itself: when its mirror says a call is forbidden it lets the driver
//! decide, by passing an allocation to the real function (a free of a cached block probes
//! with a real one-block allocation, which fails and invalidates exactly as the free would;
//! if the driver allows it after all, the probe is freed and the cached free goes on).
//! A stream-ordered allocation on a capturing stream is a graph allocation: it goes to the
//! driver, so its address is never one the cache hands to anyone else.
//!
//! Invariant: `CAPTURES` lists the captures begun through the shim's hooks and not yet
//! ended or destroyed; `ACTIVE` is its length. With no capture the check costs one atomic
//! load. The mirror may hold a capture the driver already ended another way (a wrong guess
//! only costs a probe; the driver still decides).

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys as cu;

use crate::driver::entry as drv;
use parking_lot::Mutex;

/// `cudaStreamCaptureModeGlobal` / `CU_STREAM_CAPTURE_MODE_GLOBAL`.
pub const MODE_GLOBAL: u32 = 0;
/// `cudaStreamCaptureModeRelaxed`.
pub const MODE_RELAXED: u32 = 2;
/// `cudaErrorStreamCaptureWrongThread`: the capture goes on.
const WRONG_THREAD: c_int = 908;
/// The per-thread default stream handle (each thread has its own).
pub const PER_THREAD: u64 = 2;

/// The stream a `_ptsz` entry point means by `stream`: its null is the per-thread stream.
pub fn ptsz(stream: u64) -> u64 {
    if stream == 0 {
        PER_THREAD
    } else {
        stream
    }
}

struct Cap {
    stream: u64,
    mode: u32,
    thread: usize,
}

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static CAPTURES: Mutex<Vec<Cap>> = Mutex::new(Vec::new());

thread_local! {
    static TOKEN: u8 = const { 0 };
}

fn thread_token() -> usize {
    TOKEN.with(|t| t as *const u8 as usize)
}

/// Whether `c` is the capture of `stream` as named by the calling thread.
fn same(c: &Cap, stream: u64, me: usize) -> bool {
    c.stream == stream && (stream != PER_THREAD || c.thread == me)
}

/// The program began capturing `stream` in `mode` (after the real call returned `rc`).
pub fn begun(stream: u64, mode: u32, rc: c_int) {
    if rc != 0 {
        return;
    }
    let me = thread_token();
    let mut caps = CAPTURES.lock();
    caps.retain(|c| !same(c, stream, me));
    caps.push(Cap {
        stream,
        mode,
        thread: me,
    });
    ACTIVE.store(caps.len(), Ordering::Release);
}

/// The program ended the capture of `stream` (the real call returned `rc`), or destroyed
/// the stream (`rc` 0).
pub fn ended(stream: u64, rc: c_int) {
    if rc == WRONG_THREAD || ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let me = thread_token();
    let mut caps = CAPTURES.lock();
    caps.retain(|c| !same(c, stream, me));
    ACTIVE.store(caps.len(), Ordering::Release);
}

/// A free of a cached block while a capture forbids it: a real allocation (`alloc(512)`
/// gives its result and address), refused by the driver with the error the free must
/// return (and invalidating the captures the free would), or `None` if the driver allows it
/// after all (then `free` gives the probe back).
pub fn forbidden_free(
    alloc: impl FnOnce(usize) -> (c_int, u64),
    free: impl FnOnce(u64),
) -> Option<c_int> {
    let (rc, p) = alloc(512);
    if rc == crate::ffi::SUCCESS {
        free(p);
        None
    } else {
        Some(rc)
    }
}

/// Whether any capture may be running.
#[inline]
pub fn any() -> bool {
    ACTIVE.load(Ordering::Acquire) > 0
}

/// Whether the calling thread is forbidden potentially unsafe calls (allocation, free) now.
#[inline]
pub fn forbidden() -> bool {
    any() && forbidden_slow()
}

#[cold]
fn forbidden_slow() -> bool {
    let mode = thread_mode();
    let me = thread_token();
    let caps = CAPTURES.lock();
    let own_strict = caps
        .iter()
        .any(|c| c.thread == me && c.mode != MODE_RELAXED);
    match mode {
        MODE_GLOBAL => own_strict || caps.iter().any(|c| c.mode == MODE_GLOBAL),
        MODE_RELAXED => false,
        _ => own_strict,
    }
}

/// The calling thread's capture interaction mode (read from the driver and put back).
fn thread_mode() -> u32 {
    let mut m: std::ffi::c_uint = MODE_RELAXED;
    // SAFETY: valid pointer to a mode; the second call puts back what the first returned.
    unsafe {
        if drv::cuThreadExchangeStreamCaptureMode(&mut m) != drv::SUCCESS {
            return MODE_GLOBAL;
        }
        let old = m;
        let _ = drv::cuThreadExchangeStreamCaptureMode(&mut m);
        old
    }
}

/// Whether `stream` is capturing (or its status cannot be read, e.g. the legacy stream
/// while a blocking stream captures). Asked of the driver only while [`any`] capture runs.
#[inline]
pub fn stream_capturing(stream: u64) -> bool {
    any() && stream_capturing_slow(stream)
}

#[cold]
fn stream_capturing_slow(stream: u64) -> bool {
    let mut st: std::ffi::c_uint = 0;
    // SAFETY: valid out-pointer; the handle is the program's own stream argument.
    let r = unsafe { drv::cuStreamIsCapturing(stream as cu::CUstream, &mut st) };
    r != drv::SUCCESS || st != 0
}
