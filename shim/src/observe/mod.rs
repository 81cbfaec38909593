//! Observing mode (`CUSHIM_MODE=observe`; default `cache`) and the recording of every
//! allocation the cache does not serve.
//!
//! Policy: in observing mode every allocation call goes to the real function with the
//! program's own arguments, and its result (pointer, error, out-values) reaches the program
//! unchanged; a success is then recorded in the engine's `ObservedTable` (one segment of one
//! block, with the call's stack). A free is forgotten *before* the real free runs, so an
//! address the driver hands out again on another thread is never confused with the old one;
//! when the real free fails the record is put back (its free events stay in the trace). In
//! cache mode the same recording covers the families the cache never serves, and frees of
//! pointers the cache does not own. Why observe: the program's memory behaviour stays the
//! driver's (a production job, a framework with its own cache), and the snapshot still shows
//! every byte; why cache: the cache's own speed and policy are what is being tried.
//!
//! The mode itself is read in `life/mode.rs` (start-up and dumps need it too). The observing path of a call costs one stack capture (only with
//! history) and one lock with one address-map operation.

pub mod driver;
pub mod runtime;

use std::ffi::c_int;

use cushim::alloc::observed::{Kind, Record};
use cushim::trace::event::NO_STACK;

use crate::ffi::SUCCESS;
pub use crate::life::mode::{mode_name, observing, parse_mode};
use crate::life::state::Shim;

/// `Some(f(shim))` for a runtime export in observing mode, `None` otherwise (or when the
/// shim cannot run: the export then calls the real function itself).
///
/// Only the mode test is inlined into the export; `f`, the observing path, stays out of
/// line. When the observing paths were ordinary functions the compiler kept them out of
/// line whole, and the cache path paid a call into each, with its prologue, per export
/// (BENCHMARKS.md, "Measurements behind design choices").
#[inline(always)]
pub fn runtime_call(f: impl FnOnce(&'static Shim) -> c_int) -> Option<c_int> {
    if !observing() {
        return None;
    }
    out_of_line(|| Some(f(crate::life::state::runtime_state()?)))
}

/// [`runtime_call`] for a hook that already holds the shim (the driver layer).
#[inline(always)]
pub fn with<'a>(s: &'a Shim, f: impl FnOnce(&'a Shim) -> c_int) -> Option<c_int> {
    if !observing() {
        return None;
    }
    out_of_line(|| Some(f(s)))
}

#[cold]
#[inline(never)]
fn out_of_line<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// What an allocation call is, for its record.
#[derive(Clone, Copy)]
pub struct Call {
    pub kind: Kind,
    /// Device ordinal, `-1` for host memory.
    pub device: i32,
    pub size: u64,
    pub flags: u64,
    pub stream: u64,
}

impl Call {
    pub fn new(kind: Kind, device: i32, size: u64, flags: u64, stream: u64) -> Call {
        Call {
            kind,
            device,
            size,
            flags,
            stream,
        }
    }
}

/// Run the real allocation `real`; on success record what `addr()` then reads (the out-
/// pointer's value; 0 records nothing). The real result is returned unchanged.
pub fn alloc(
    s: &Shim,
    call: Call,
    real: impl FnOnce() -> c_int,
    addr: impl FnOnce() -> u64,
) -> c_int {
    let size = call.size;
    alloc_sized(s, call, real, || (addr(), size))
}

/// [`alloc`] for a call whose size is known only once it ran (pitched, 3D): `addr_size()`
/// reads the address and the size on success (`call.size` is not used).
pub fn alloc_sized(
    s: &Shim,
    call: Call,
    real: impl FnOnce() -> c_int,
    addr_size: impl FnOnce() -> (u64, u64),
) -> c_int {
    crate::ffi::failopen::inject(crate::ffi::failopen::Point::Observe);
    let stack = s.history.alloc_stack();
    let rc = real();
    if rc == SUCCESS {
        let (a, size) = addr_size();
        if a != 0 {
            let r = Record {
                size,
                kind: call.kind,
                flags: call.flags,
                stream: call.stream,
                stack,
            };
            s.observed.alloc(call.device, a, r);
        }
    }
    rc
}

/// Forget the device allocation at `ptr` (device `hint` searched first), then run the real
/// free; put the record back if the real free fails.
pub fn free(s: &Shim, ptr: u64, hint: i32, real: impl FnOnce() -> c_int) -> c_int {
    if ptr == 0 {
        return real();
    }
    crate::ffi::failopen::inject(crate::ffi::failopen::Point::Observe);
    // A pointer nothing recorded (a free the cache passed on, or the runtime's own call into
    // a hooked driver free after this one already forgot it) costs no stack capture.
    let stack = if s.observed.holds(ptr, hint) {
        s.history.free_stack()
    } else {
        NO_STACK
    };
    let taken = s.observed.free(ptr, hint, stack);
    let rc = real();
    if rc != SUCCESS {
        if let Some((dev, r)) = taken {
            s.observed.restore(dev, ptr, r);
        }
    }
    rc
}

/// [`free`] for host memory (pinned or registered).
pub fn host_free(s: &Shim, ptr: u64, real: impl FnOnce() -> c_int) -> c_int {
    if ptr == 0 {
        return real();
    }
    let stack = if s.observed.holds_host(ptr) {
        s.history.free_stack()
    } else {
        NO_STACK
    };
    let taken = s.observed.host_free(ptr, stack);
    let rc = real();
    if rc != SUCCESS {
        if let Some(r) = taken {
            s.observed.restore(-1, ptr, r);
        }
    }
    rc
}

/// A free the shim passes to the real driver without handling it (not observing, a pointer
/// the cache does not own, a call from inside the shim): forget its record first, if any.
pub fn forget_then(ptr: u64, real: impl FnOnce() -> c_int) -> c_int {
    match crate::life::state::get_if_ready() {
        Some(s) if ptr != 0 => free(s, ptr, 0, real),
        _ => real(),
    }
}

/// [`forget_then`] for host memory.
pub fn forget_host_then(ptr: u64, real: impl FnOnce() -> c_int) -> c_int {
    match crate::life::state::get_if_ready() {
        Some(s) if ptr != 0 => host_free(s, ptr, real),
        _ => real(),
    }
}

/// Read an out-pointer the real function just wrote (0 when it is NULL).
pub fn read_out<T: Copy + Into<u64>>(out: *const T) -> u64 {
    if out.is_null() {
        return 0;
    }
    // SAFETY: non-null, and the real function wrote it on success.
    unsafe { *out }.into()
}

/// Read a `void**` out-pointer the real function just wrote (0 when it is NULL).
pub fn read_ptr(out: *const *mut std::ffi::c_void) -> u64 {
    if out.is_null() {
        return 0;
    }
    // SAFETY: non-null, and the real function wrote it on success.
    unsafe { *out as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_values_parse_and_garbage_is_refused() {
        assert_eq!(parse_mode(b"observe"), Some(true));
        assert_eq!(parse_mode(b" cache\n"), Some(false));
        assert_eq!(parse_mode(b""), Some(false));
        assert_eq!(parse_mode(b"Observe"), None);
        assert_eq!(parse_mode(b"observing"), None);
    }
}
