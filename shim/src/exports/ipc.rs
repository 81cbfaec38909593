//! Exported IPC entry points (`cudaIpc*Mem*`, `cuIpc*Mem*`, also handed out by the `dlsym`
//! override and `cuGetProcAddress`): decode the C arguments and apply [`crate::ipc`]'s policy;
//! everything the policy leaves to the driver is forwarded unchanged. A driver hook handles a
//! call only when the driver layer is intercepted and the thread is not inside the shim; a
//! runtime export only when the runtime layer is.
//!
//! Fail open, per function (the general policy is at the head of `ffi/failopen.rs`). These
//! exports may call the real function with arguments of the shim's own (a segment's base, a
//! driver handle read from a record), so "forward the program's call" is right only where
//! the driver's answer to the program's own arguments is the right answer. In every case the
//! real function is called at most once, and the failure turns caching off for new
//! allocations with one `cushim:` line (new blocks are then the driver's own allocations,
//! whose driver handles are exact).
//! - Get a handle, failure before the real call: when the pointer is not the cache's, or is a
//!   cached block at its segment's base (not expandable), the driver's handle of the
//!   program's pointer is exact, so the call is forwarded. For a block inside a segment the
//!   driver's handle would name the whole segment and an importer would map its base,
//!   another block's bytes: the call answers `cudaErrorNotSupported` /
//!   `CUDA_ERROR_NOT_SUPPORTED` instead (as when the record directory fails its checks), and
//!   so does a pointer the cache cannot place after the failure. Wrong bytes silently
//!   shared are worse than a refused export, which a program can handle.
//! - Get a handle, failure after the real call: a call made with the program's pointer keeps
//!   its result; the segment's handle (the shim's own call) is not the block's, so the call
//!   answers not-supported as above (a handle needs no release).
//! - Open, failure before the real call: forwarded with the program's handle. A driver
//!   handle opens as without the shim; a cushim handle is refused by the driver (invalid
//!   value), as in a process without cushim: never another block's memory.
//! - Open, failure after the real call: a call made with the program's handle keeps its
//!   result. A segment the shim opened for a cushim handle is closed again (its pointer was
//!   never handed out) and the call answers invalid value, as a process without cushim gets.
//! - Close, failure before the real call: forwarded with the program's pointer (a driver
//!   import closes as without the shim; an interior pointer of a cushim import is refused by
//!   the driver, and its segment stays mapped until the process ends). After the real call:
//!   its result stands.
//! - Expandable blocks' handles ([`crate::ipc::expandable`]) are served without a call to the
//!   real IPC function. A failure inside the export of such a block answers not-supported
//!   (the driver has no handle for virtual memory); inside the open or close of such a
//!   handle, the program's call is forwarded (the driver refuses the handle; a partial
//!   import of the failed call is not undone).
#![allow(non_snake_case)]

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::call_driver;
use crate::call_real;
use crate::exports::lasterror;
use crate::ffi::failopen;
use crate::ffi::intercept::{enabled, inside, Inside, Layer};
use crate::ffi::{ERR_INVALID_VALUE, ERR_NOT_SUPPORTED, ERR_UNKNOWN, SUCCESS};
use crate::ipc::{self, IpcHandle};
use crate::real::driver::RealFn;

pub static REAL_GET: RealFn = RealFn::new(c"cuIpcGetMemHandle");
pub static REAL_OPEN: RealFn = RealFn::new(c"cuIpcOpenMemHandle");
pub static REAL_OPEN_V2: RealFn = RealFn::new(c"cuIpcOpenMemHandle_v2");
pub static REAL_CLOSE: RealFn = RealFn::new(c"cuIpcCloseMemHandle");

type GetFn = unsafe extern "C" fn(*mut IpcHandle, u64) -> c_int;
type OpenFn = unsafe extern "C" fn(*mut u64, IpcHandle, c_uint) -> c_int;
type CloseFn = unsafe extern "C" fn(u64) -> c_int;

/// Whether a driver hook may apply the policy on this thread.
fn driver_layer() -> bool {
    enabled(Layer::Driver) && !inside()
}

/// The real call an export made, if any: the argument it was made with and its result.
#[derive(Clone, Copy)]
enum Made<A: Copy> {
    None,
    /// Entered, no result (it cannot unwind: a C function; kept for soundness).
    Entered,
    Done(A, c_int),
}

/// Run `f`, an IPC export that makes at most one real call through the function it is
/// given (with any argument); on a failure inside the shim, `fallback(made)` answers (it
/// calls the real function only when `made` is [`Made::None`]). `finish` maps a code the
/// shim makes itself (the runtime's last error).
fn failing_open<A: Copy, R>(
    what: &str,
    real: R,
    f: impl FnOnce(&dyn Fn(A) -> c_int) -> c_int,
    fallback: impl FnOnce(Made<A>, &R) -> c_int,
) -> c_int
where
    R: Fn(A) -> c_int,
{
    let made = Cell::new(Made::None);
    let once = |a: A| {
        made.set(Made::Entered);
        let rc = real(a);
        made.set(Made::Done(a, rc));
        rc
    };
    match catch_unwind(AssertUnwindSafe(|| f(&once))) {
        Ok(code) => code,
        Err(_) => {
            failopen::failed(what);
            let made = made.get();
            catch_unwind(AssertUnwindSafe(|| fallback(made, &real))).unwrap_or(ERR_UNKNOWN)
        }
    }
}

/// Get a handle of `ptr` into `out` (`real(p, out)` is the real get of pointer `p`).
fn get(
    what: &str,
    ptr: u64,
    out: *mut IpcHandle,
    policy: bool,
    state: fn() -> Option<&'static crate::life::state::Shim>,
    finish: Finish,
    real: impl Fn((u64, *mut IpcHandle)) -> c_int,
) -> c_int {
    failing_open(
        what,
        real,
        |real| {
            if policy {
                if let Some(s) = state() {
                    if let Some(code) = ipc::export(s, ptr, out, |p, o| real((p, o))) {
                        return finish(code);
                    }
                }
            }
            real((ptr, out))
        },
        |made, real| match made {
            Made::Done((p, _), rc) if p == ptr => rc,
            Made::Done(_, rc) if rc != SUCCESS => finish(rc),
            Made::Done(..) => finish(ERR_NOT_SUPPORTED),
            Made::Entered => finish(ERR_UNKNOWN),
            Made::None => {
                let exact = catch_unwind(|| {
                    crate::life::state::get_if_ready()
                        .map_or(true, |s| ipc::driver_handle_is_exact(s, ptr))
                });
                if matches!(exact, Ok(true)) {
                    real((ptr, out))
                } else {
                    finish(ERR_NOT_SUPPORTED)
                }
            }
        },
    )
}

/// What a runtime open does before the policy (the runtime's context).
type Prepare = fn(&IpcHandle);
/// How a code the shim makes itself reaches the program (the runtime's last error).
type Finish = fn(c_int) -> c_int;

/// Open `h` into `out` (`real(out, h)` is the real open, `close(base)` the real close).
fn open(
    what: &str,
    h: IpcHandle,
    out: *mut u64,
    policy: bool,
    (prepare, finish): (Prepare, Finish),
    real: impl Fn((*mut u64, IpcHandle)) -> c_int,
    close: impl FnOnce(u64) -> c_int,
) -> c_int {
    failing_open(
        what,
        real,
        |real| {
            if policy {
                prepare(&h);
                if let Some(code) = ipc::open(&h, out, |o, hh| real((o, hh))) {
                    return finish(code);
                }
            }
            real((out, h))
        },
        |made, real| match made {
            Made::Done((o, hh), rc) if o == out && hh == h => rc,
            Made::Done(_, rc) if rc != SUCCESS => finish(rc),
            Made::Done((o, _), _) => {
                // SAFETY: the shim's own out-pointer, which the successful open just wrote.
                let base = unsafe { *o };
                let _ = close(base);
                finish(ERR_INVALID_VALUE)
            }
            Made::Entered => finish(ERR_UNKNOWN),
            Made::None => real((out, h)),
        },
    )
}

/// Close `ptr` (`real(p)` is the real close of `p`).
fn close(what: &str, ptr: u64, policy: bool, finish: Finish, real: impl Fn(u64) -> c_int) -> c_int {
    failing_open(
        what,
        real,
        |real| {
            if policy {
                if let Some(code) = ipc::close(ptr, real) {
                    return finish(code);
                }
            }
            real(ptr)
        },
        |made, real| match made {
            Made::Done(p, rc) if p == ptr => rc,
            Made::Done(_, rc) => finish(rc),
            Made::Entered => finish(ERR_UNKNOWN),
            Made::None => real(ptr),
        },
    )
}

fn same(code: c_int) -> c_int {
    code
}

fn no_preparation(_: &IpcHandle) {}

/// The runtime makes its device's primary context current on this thread before mapping an
/// expandable block's pages, as the real open would.
fn runtime_context(h: &IpcHandle) {
    if crate::ipc::expandable::is_handle(h) {
        let null = std::ptr::null_mut();
        let _ = call_real!(cudaFree(null));
    }
}

fn driver_get(p: u64, out: *mut IpcHandle) -> c_int {
    let _inside = Inside::enter();
    call_driver!(REAL_GET, GetFn, (out, p))
}

fn driver_close(p: u64) -> c_int {
    let _inside = Inside::enter();
    call_driver!(REAL_CLOSE, CloseFn, (p))
}

#[no_mangle]
pub extern "C" fn cuIpcGetMemHandle(h: *mut IpcHandle, dptr: u64) -> c_int {
    get(
        "cuIpcGetMemHandle",
        dptr,
        h,
        driver_layer(),
        crate::life::state::driver_state,
        same,
        |(p, out)| driver_get(p, out),
    )
}

fn open_driver(
    what: &str,
    real: &'static RealFn,
    p: *mut u64,
    h: IpcHandle,
    flags: c_uint,
) -> c_int {
    open(
        what,
        h,
        p,
        driver_layer(),
        (no_preparation, same),
        |(out, handle)| {
            let _inside = Inside::enter();
            call_driver!(real, OpenFn, (out, handle, flags))
        },
        driver_close,
    )
}

#[no_mangle]
pub extern "C" fn cuIpcOpenMemHandle(p: *mut u64, h: IpcHandle, flags: c_uint) -> c_int {
    open_driver("cuIpcOpenMemHandle", &REAL_OPEN, p, h, flags)
}

#[no_mangle]
pub extern "C" fn cuIpcOpenMemHandle_v2(p: *mut u64, h: IpcHandle, flags: c_uint) -> c_int {
    open_driver("cuIpcOpenMemHandle_v2", &REAL_OPEN_V2, p, h, flags)
}

#[no_mangle]
pub extern "C" fn cuIpcCloseMemHandle(dptr: u64) -> c_int {
    close(
        "cuIpcCloseMemHandle",
        dptr,
        driver_layer(),
        same,
        driver_close,
    )
}

fn runtime_close(base: u64) -> c_int {
    let b = base as *mut c_void;
    call_real!(cudaIpcCloseMemHandle(b))
}

#[no_mangle]
pub extern "C" fn cudaIpcGetMemHandle(h: *mut IpcHandle, ptr: *mut c_void) -> c_int {
    get(
        "cudaIpcGetMemHandle",
        ptr as u64,
        h,
        true,
        crate::life::state::runtime_state,
        lasterror::set,
        |(p, out)| {
            let seg = p as *mut c_void;
            call_real!(cudaIpcGetMemHandle(out, seg))
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaIpcOpenMemHandle(p: *mut *mut c_void, h: IpcHandle, flags: c_uint) -> c_int {
    open(
        "cudaIpcOpenMemHandle",
        h,
        p as *mut u64,
        enabled(Layer::Runtime),
        (runtime_context, lasterror::set),
        |(out, handle)| {
            let out = out as *mut *mut c_void;
            call_real!(cudaIpcOpenMemHandle(out, handle, flags))
        },
        runtime_close,
    )
}

#[no_mangle]
pub extern "C" fn cudaIpcCloseMemHandle(ptr: *mut c_void) -> c_int {
    close(
        "cudaIpcCloseMemHandle",
        ptr as u64,
        enabled(Layer::Runtime),
        lasterror::set,
        runtime_close,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::failopen::InjectedFault;
    use std::panic::resume_unwind;

    #[test]
    fn a_failure_forwards_once_before_the_real_call_and_never_calls_again_after_it() {
        let calls = Cell::new(0);
        let real = |a: u64| {
            calls.set(calls.get() + 1);
            a as c_int
        };
        // Before: the fallback makes the program's call, once.
        let rc = failing_open(
            "test",
            real,
            |_| resume_unwind(Box::new(InjectedFault)),
            |made, real| match made {
                Made::None => real(3),
                _ => -1,
            },
        );
        assert_eq!((rc, calls.get()), (3, 1));
        // After a call with the shim's own argument: the fallback sees it and its result.
        let rc = failing_open(
            "test",
            real,
            |r| {
                r(7);
                resume_unwind(Box::new(InjectedFault))
            },
            |made, _| match made {
                Made::Done(7, rc) => rc + 100,
                _ => -1,
            },
        );
        assert_eq!((rc, calls.get()), (107, 2), "the real call made once");
        // No failure: the export's own answer.
        assert_eq!(failing_open("test", real, |r| r(5), |_, _| -1), 5);
    }
}
