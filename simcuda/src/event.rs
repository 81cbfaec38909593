//! Events: a recorded event is a position (stream, sequence number); it is complete once the
//! stream's worker passed that position. Invariant: handles in `EVENTS` are live events; an
//! event never recorded counts as complete, as in CUDA.

use crate::error::*;
use crate::stream::Stream;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// `CU_EVENT_BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS`.
const VALID_FLAGS: u32 = 0x7;
const DISABLE_TIMING: u32 = 0x2;
const INTERPROCESS: u32 = 0x4;

/// One event.
pub struct Event {
    pub flags: u32,
    position: Mutex<Option<(Arc<Stream>, u64)>>,
    /// Recording generation, and (generation, time) of the last completed recording.
    generation: AtomicU64,
    done_at: Mutex<Option<(u64, Instant)>>,
}

static EVENTS: Lazy<Mutex<HashMap<usize, Arc<Event>>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// `cuEventCreate`.
pub fn create(flags: u32) -> Result<usize, CUresult> {
    if flags & !VALID_FLAGS != 0 || (flags & INTERPROCESS != 0 && flags & DISABLE_TIMING == 0) {
        return Err(INVALID_VALUE);
    }
    let e = Arc::new(Event {
        flags,
        position: Mutex::new(None),
        generation: AtomicU64::new(0),
        done_at: Mutex::new(None),
    });
    let h = Arc::as_ptr(&e) as usize;
    EVENTS.lock().insert(h, e);
    Ok(h)
}

fn get(handle: usize) -> Result<Arc<Event>, CUresult> {
    EVENTS.lock().get(&handle).cloned().ok_or(INVALID_HANDLE)
}

/// `cuEventDestroy_v2`.
pub fn destroy(handle: usize) -> Result<(), CUresult> {
    EVENTS
        .lock()
        .remove(&handle)
        .map(|_| ())
        .ok_or(INVALID_HANDLE)
}

/// `cuEventRecord`: the event marks everything queued on `s` so far (on the legacy stream,
/// that includes earlier work on blocking streams).
pub fn record(handle: usize, s: &Arc<Stream>) -> Result<(), CUresult> {
    let e = get(handle)?;
    let gen = e.generation.fetch_add(1, Ordering::AcqRel) + 1;
    let weak = Arc::downgrade(&e);
    let stamp: crate::stream::Job = Box::new(move || {
        if let Some(e) = weak.upgrade() {
            *e.done_at.lock() = Some((gen, Instant::now()));
        }
    });
    let seq = s.enqueue(Some(stamp))?;
    if seq > 0 {
        *e.position.lock() = Some((Arc::clone(s), seq));
    }
    Ok(())
}

/// `cuEventQuery`.
pub fn query(handle: usize) -> Result<(), CUresult> {
    let e = get(handle)?;
    crate::capture::check_unsafe_call()?;
    let pos = e.position.lock().clone();
    match pos {
        Some((s, seq)) if s.position().1 < seq => Err(NOT_READY),
        _ => Ok(()),
    }
}

/// `cuEventSynchronize`.
pub fn synchronize(handle: usize) -> Result<(), CUresult> {
    let e = get(handle)?;
    crate::capture::check_unsafe_call()?;
    let pos = e.position.lock().clone();
    if let Some((s, seq)) = pos {
        s.wait_for(seq);
    }
    Ok(())
}

/// `cuStreamWaitEvent`: later work on `s` waits for the event's position.
pub fn stream_wait(s: &Arc<Stream>, handle: usize, flags: u32) -> Result<(), CUresult> {
    if flags & !1 != 0 {
        return Err(INVALID_VALUE);
    }
    let e = get(handle)?;
    let pos = e.position.lock().clone();
    s.enqueue_after(None, pos).map(|_| ())
}

/// `cuEventElapsedTime`: milliseconds between two completed recordings.
pub fn elapsed(start: usize, end: usize) -> Result<f32, CUresult> {
    let (a, b) = (get(start)?, get(end)?);
    if (a.flags | b.flags) & DISABLE_TIMING != 0 {
        return Err(INVALID_HANDLE);
    }
    let time = |e: &Event| -> Result<Instant, CUresult> {
        let gen = e.generation.load(Ordering::Acquire);
        if gen == 0 {
            return Err(INVALID_HANDLE);
        }
        match *e.done_at.lock() {
            Some((g, t)) if g == gen => Ok(t),
            _ => Err(NOT_READY),
        }
    };
    let (ta, tb) = (time(&a)?, time(&b)?);
    let ms = if tb >= ta {
        (tb - ta).as_secs_f64() * 1e3
    } else {
        -((ta - tb).as_secs_f64() * 1e3)
    };
    Ok(ms as f32)
}
