//! Stream capture: `cuStreamBeginCapture_v2` puts a stream in capture (work queued on it is
//! recorded, not run); per-thread capture interaction modes decide which "potentially unsafe"
//! calls (allocation, free, synchronisation, event query) are refused with
//! `STREAM_CAPTURE_UNSUPPORTED`, which also invalidates the offending captures, as CUDA does.
//! Invariant: `ACTIVE_ANY` / `ACTIVE_GLOBAL` count the streams now capturing (in any mode / in
//! global mode) and `CAPTURING` lists them; a thread's `OWN_STRICT` counts the non-relaxed
//! captures it began and has not ended.

use crate::error::*;
use crate::stream::{Kind, Stream};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub const MODE_GLOBAL: u32 = 0;
pub const MODE_THREAD_LOCAL: u32 = 1;
pub const MODE_RELAXED: u32 = 2;

/// `CU_STREAM_CAPTURE_STATUS_*`.
pub const STATUS_NONE: u32 = 0;
pub const STATUS_ACTIVE: u32 = 1;
pub const STATUS_INVALIDATED: u32 = 2;

/// The capture state of one stream.
#[derive(Debug)]
pub struct Capture {
    pub mode: u32,
    /// The capturing thread (`pthread_self`, valid also while the thread exits).
    pub thread: usize,
    pub invalidated: bool,
    pub nodes: u64,
}

/// What `cuStreamEndCapture` hands back: an opaque graph of the captured work. simcuda
/// records how many operations were captured; it cannot launch graphs.
pub struct Graph {
    pub nodes: u64,
}

static ACTIVE_ANY: AtomicUsize = AtomicUsize::new(0);
static ACTIVE_GLOBAL: AtomicUsize = AtomicUsize::new(0);
static CAPTURING: Lazy<Mutex<Vec<Arc<Stream>>>> = Lazy::new(|| Mutex::new(Vec::new()));

/// The calling thread's identity. `pthread_self` rather than `std::thread::current`, which
/// is unavailable from thread-exit destructors and exit handlers.
fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions and always succeeds.
    unsafe { libc::pthread_self() as usize }
}

thread_local! {
    static MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
    static OWN_STRICT: Cell<usize> = const { Cell::new(0) };
}

/// Whether any stream is capturing.
pub fn any_active() -> bool {
    ACTIVE_ANY.load(Ordering::Acquire) > 0
}

/// `cuThreadExchangeStreamCaptureMode`.
pub fn exchange_mode(mode: *mut u32) -> Result<(), CUresult> {
    if mode.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL pointer to the caller's mode variable, read and written once.
    let new = unsafe { *mode };
    if new > MODE_RELAXED {
        return Err(INVALID_VALUE);
    }
    let old = MODE.with(|m| m.replace(new));
    // SAFETY: as above.
    unsafe { *mode = old };
    Ok(())
}

/// `cuStreamBeginCapture_v2`.
pub fn begin(s: &Arc<Stream>, mode: u32) -> Result<(), CUresult> {
    if mode > MODE_RELAXED {
        return Err(INVALID_VALUE);
    }
    if s.kind == Kind::Legacy {
        return Err(STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut g = s.inner.lock();
    if g.capture.is_some() {
        return Err(ILLEGAL_STATE);
    }
    g.capture = Some(Capture {
        mode,
        thread: this_thread(),
        invalidated: false,
        nodes: 0,
    });
    drop(g);
    ACTIVE_ANY.fetch_add(1, Ordering::AcqRel);
    if mode == MODE_GLOBAL {
        ACTIVE_GLOBAL.fetch_add(1, Ordering::AcqRel);
    }
    if mode != MODE_RELAXED {
        OWN_STRICT.with(|c| c.set(c.get() + 1));
    }
    CAPTURING.lock().push(Arc::clone(s));
    Ok(())
}

/// Drop the counters of a capture that ended (or whose stream was destroyed).
pub fn forget(c: &Capture) {
    ACTIVE_ANY.fetch_sub(1, Ordering::AcqRel);
    if c.mode == MODE_GLOBAL {
        ACTIVE_GLOBAL.fetch_sub(1, Ordering::AcqRel);
    }
    if c.mode != MODE_RELAXED && c.thread == this_thread() {
        OWN_STRICT.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// `cuStreamEndCapture`: the graph handle, NULL with `STREAM_CAPTURE_INVALIDATED` if the
/// capture was invalidated.
pub fn end(s: &Arc<Stream>) -> Result<*mut Graph, (CUresult, bool)> {
    let mut g = s.inner.lock();
    let Some(c) = g.capture.as_ref() else {
        return Err((ILLEGAL_STATE, false));
    };
    if c.mode != MODE_RELAXED && c.thread != this_thread() {
        return Err((STREAM_CAPTURE_WRONG_THREAD, false));
    }
    let c = g.capture.take().ok_or((ILLEGAL_STATE, false))?;
    drop(g);
    CAPTURING.lock().retain(|x| !Arc::ptr_eq(x, s));
    forget(&c);
    if c.invalidated {
        return Err((STREAM_CAPTURE_INVALIDATED, true));
    }
    Ok(Box::into_raw(Box::new(Graph { nodes: c.nodes })))
}

/// `cuStreamIsCapturing`: a status; the legacy stream used while a blocking stream captures
/// is `STREAM_CAPTURE_IMPLICIT`.
pub fn status(s: &Arc<Stream>) -> Result<u32, CUresult> {
    if s.kind == Kind::Legacy && any_active() {
        let blocking_capture = CAPTURING
            .lock()
            .iter()
            .any(|x| x.device == s.device && x.is_blocking());
        if blocking_capture {
            return Err(STREAM_CAPTURE_IMPLICIT);
        }
    }
    let g = s.inner.lock();
    Ok(match &g.capture {
        None => STATUS_NONE,
        Some(c) if c.invalidated => STATUS_INVALIDATED,
        Some(_) => STATUS_ACTIVE,
    })
}

fn invalidate(pred: impl Fn(&Capture) -> bool) {
    for s in CAPTURING.lock().iter() {
        if let Some(c) = s.inner.lock().capture.as_mut() {
            if pred(c) {
                c.invalidated = true;
            }
        }
    }
}

/// Refuse a potentially unsafe call (allocation, free, synchronisation, event query) when
/// this thread's capture mode forbids it, invalidating the captures that forbid it.
pub fn check_unsafe_call() -> Result<(), CUresult> {
    if !any_active() {
        return Ok(());
    }
    let mode = MODE.with(Cell::get);
    let own = OWN_STRICT.with(Cell::get);
    let me = this_thread();
    let prohibited = match mode {
        MODE_GLOBAL => ACTIVE_GLOBAL.load(Ordering::Acquire) > 0 || own > 0,
        MODE_THREAD_LOCAL => own > 0,
        _ => false,
    };
    if !prohibited {
        return Ok(());
    }
    invalidate(|c| {
        (mode == MODE_GLOBAL && c.mode == MODE_GLOBAL) || (c.thread == me && c.mode != MODE_RELAXED)
    });
    Err(STREAM_CAPTURE_UNSUPPORTED)
}

/// Synchronising with or querying a capturing stream is refused and invalidates it; other
/// streams follow the unsafe-call rule.
pub fn check_stream_sync(s: &Arc<Stream>) -> Result<(), CUresult> {
    if !any_active() {
        return Ok(());
    }
    {
        let mut g = s.inner.lock();
        if let Some(c) = g.capture.as_mut() {
            c.invalidated = true;
            return Err(STREAM_CAPTURE_UNSUPPORTED);
        }
    }
    if s.kind == Kind::Legacy {
        status(s)?;
    }
    check_unsafe_call()
}
