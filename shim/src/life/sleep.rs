//! Sleep mode's process state: the arena (`cushim::sleep`) when `sleep_mode:True` and the
//! device supports virtual memory management, and the pause and resume requests with their
//! CUDA error codes and their one line on stderr.
//!
//! Policy: the cache's hot path never looks here; the allocation exports test one relaxed
//! atomic ([`on`]) and only then reach the arena. A request never aborts the program: every
//! failure is a code (documented in `docs/SLEEP-MODE.md`) and the tag is left whole (all
//! paused or all live). A pause first releases the cache's free segments (so its memory goes
//! back too) and is refused while a CUDA graph capture runs: a captured graph may use the
//! memory whenever it is launched, so pausing it cannot be made safe.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cushim::action::Action;
use cushim::alloc::observed::{Kind, Record};
use cushim::config::alloc::AllocConf;
use cushim::device::{DevPtr, DeviceError};
use cushim::sleep::{Grant, GrowError, Mode, SleepArena, SleepError, SleepOutcome};
use cushim::trace::event::{StackId, NO_STACK};
use once_cell::sync::OnceCell;

use crate::life::shim::Shim;

static ARENA: OnceCell<SleepArena> = OnceCell::new();
static ON: AtomicBool = AtomicBool::new(false);

/// `CUDA_ERROR_NOT_SUPPORTED`: sleep mode is off (or the device has no virtual memory).
pub const OFF: c_int = 801;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const INVALID_VALUE: c_int = 1;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: a graph capture is running.
pub const CAPTURING: c_int = 900;
/// `CUDA_ERROR_ECC_UNCORRECTABLE`: a host backup no longer matches its checksum.
pub const CORRUPT: c_int = 214;

/// Start sleep mode at start-up when configured (`device` is the shim's device).
/// `make_sink(d)` gives device `d`'s event sink, as for the main cache.
pub fn start(
    conf: &AllocConf,
    device: Arc<dyn cushim::device::Device>,
    make_sink: &dyn Fn(i32) -> Box<dyn cushim::trace::event::EventSink>,
) {
    if !conf.sleep_mode {
        return;
    }
    if !device.vmm_supported(0) {
        eprintln!(
            "cushim: sleep_mode:True needs virtual memory management, which device 0 lacks; \
             sleep mode is off"
        );
        return;
    }
    if ARENA
        .set(SleepArena::new(device, conf.clone(), make_sink))
        .is_ok()
    {
        ON.store(true, Ordering::Release);
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(release_at_exit) };
    }
}

/// At exit, the sleep cache's fully free segments go back to the device, as the program's
/// own frees would have given them (registered after the CUDA library's own handlers, so
/// it runs before them).
extern "C" fn release_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let (Some(a), Some(s)) = (arena(), crate::life::shim::get_if_ready()) {
            let gone = a.empty_cache();
            segments_released(s, &gone);
        }
    });
}

/// Give the sleep cache's fully free segments back (`cushim_empty_cache`).
pub fn empty_cache(s: &Shim) {
    if let Some(a) = arena() {
        let gone = a.empty_cache();
        segments_released(s, &gone);
    }
}

/// Forget segments the sleep cache gave back to the device (it recorded their
/// `segment_free`; the observed records go, silently).
#[cold]
pub fn segments_released(s: &Shim, segs: &[(i32, DevPtr)]) {
    for &(dev, addr) in segs {
        s.observed.free(addr, dev, NO_STACK);
    }
}

/// Whether sleep mode serves allocations (one relaxed load).
#[inline(always)]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The arena, when sleep mode is on.
pub fn arena() -> Option<&'static SleepArena> {
    if on() {
        ARENA.get()
    } else {
        None
    }
}

/// The CUDA code of a device error.
pub fn code(e: DeviceError) -> c_int {
    match e {
        DeviceError::OutOfMemory => 2,
        DeviceError::Capturing => CAPTURING,
        DeviceError::NotSupported => OFF,
        DeviceError::Driver(c) => c,
    }
}

fn sleep_code(e: &SleepError) -> c_int {
    match e {
        SleepError::Device(d) => code(*d),
        SleepError::Corrupt(_) => CORRUPT,
    }
}

/// Allocate `size` bytes on `dev` in the sleep cache, tagged by the calling thread's tag or
/// range path; on lack of memory the main cache's free segments are released and it tries
/// once more. The address, or a CUDA code.
#[inline]
pub fn alloc(
    s: &Shim,
    arena: &SleepArena,
    dev: i32,
    size: u64,
    stack: StackId,
) -> Result<DevPtr, c_int> {
    match arena.alloc(dev, size, stack, &s.alloc) {
        Ok(g) if g.new_segment.is_none() && g.released.is_empty() => Ok(g.ptr),
        Ok(g) => Ok(granted(s, dev, g, stack)),
        Err(e) => alloc_again(s, arena, dev, size, stack, e),
    }
}

#[cold]
#[inline(never)]
fn alloc_again(
    s: &Shim,
    arena: &SleepArena,
    dev: i32,
    size: u64,
    stack: StackId,
    e: GrowError,
) -> Result<DevPtr, c_int> {
    segments_released(s, &e.released);
    if e.error != DeviceError::OutOfMemory {
        return Err(code(e.error));
    }
    s.alloc.empty_cache();
    match arena.alloc(dev, size, stack, &s.alloc) {
        Ok(g) => Ok(granted(s, dev, g, stack)),
        Err(e) => {
            segments_released(s, &e.released);
            Err(code(e.error))
        }
    }
}

/// Record what an allocation changed in the sleep cache's segments: the address.
#[cold]
#[inline(never)]
fn granted(s: &Shim, dev: i32, g: Grant, stack: StackId) -> DevPtr {
    segments_released(s, &g.released);
    if let Some((base, bytes)) = g.new_segment {
        s.observed.alloc(
            dev,
            base,
            Record {
                size: bytes,
                kind: Kind::Sleep,
                flags: 0,
                stream: 0,
                stack,
            },
        );
    }
    g.ptr
}

fn tag_name(tag: Option<&str>) -> String {
    tag.map_or_else(|| "every tag".to_string(), |t| format!("tag '{t}'"))
}

/// `cushim_pause`: the outcome, or a CUDA code (after one line on stderr).
pub fn pause(s: &Shim, tag: Option<&str>, mode: Mode) -> Result<SleepOutcome, c_int> {
    let Some(arena) = arena() else {
        eprintln!(
            "cushim: pause of {} refused: sleep mode is off (set sleep_mode:True in CUSHIM_ALLOC_CONF)",
            tag_name(tag)
        );
        return Err(OFF);
    };
    if crate::life::capture::any() {
        eprintln!(
            "cushim: pause of {} refused: a CUDA graph capture is running, and a captured \
             graph may use its memory whenever it is launched",
            tag_name(tag)
        );
        return Err(CAPTURING);
    }
    s.alloc.empty_cache();
    match arena.pause(tag, mode) {
        Ok(o) => {
            segments_released(s, &o.released);
            for &(dev, addr) in &o.changed {
                s.observed
                    .set_kind(dev, addr, Kind::Paused, Action::Pause, NO_STACK);
            }
            Ok(o)
        }
        Err(e) => {
            eprintln!(
                "cushim: pause of {} failed: {e}; nothing was paused",
                tag_name(tag)
            );
            Err(sleep_code(&e))
        }
    }
}

/// `cushim_resume`: the outcome, or a CUDA code (after one line on stderr).
pub fn resume(s: &Shim, tag: Option<&str>) -> Result<SleepOutcome, c_int> {
    let Some(arena) = arena() else {
        eprintln!(
            "cushim: resume of {} refused: sleep mode is off (set sleep_mode:True in CUSHIM_ALLOC_CONF)",
            tag_name(tag)
        );
        return Err(OFF);
    };
    match arena.resume(tag) {
        Ok(o) => {
            for &(dev, addr) in &o.changed {
                s.observed
                    .set_kind(dev, addr, Kind::Sleep, Action::Resume, NO_STACK);
            }
            Ok(o)
        }
        Err(e) => {
            eprintln!(
                "cushim: resume of {} failed: {e}; it stays paused and can be resumed later",
                tag_name(tag)
            );
            Err(sleep_code(&e))
        }
    }
}
