//! Exported IPC entry points (`cudaIpc*Mem*`, `cuIpc*Mem*`, also handed out by the `dlsym`
//! override and `cuGetProcAddress`): decode the C arguments and apply [`crate::ipc`]'s policy;
//! everything the policy leaves to the driver is forwarded unchanged. A driver hook handles a
//! call only when the driver layer is intercepted and the thread is not inside the shim; a
//! runtime export only when the runtime layer is.
#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

use crate::call_driver;
use crate::call_real;
use crate::exports::lasterror;
use crate::ffi::guard;
use crate::ffi::intercept::{enabled, inside, Inside, Layer};
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

#[no_mangle]
pub extern "C" fn cuIpcGetMemHandle(h: *mut IpcHandle, dptr: u64) -> c_int {
    guard("cuIpcGetMemHandle", || {
        let real = |p: u64, out: *mut IpcHandle| {
            let _inside = Inside::enter();
            call_driver!(REAL_GET, GetFn, (out, p))
        };
        if driver_layer() {
            if let Some(s) = crate::life::state::driver_state() {
                if let Some(code) = ipc::export(s, dptr, h, real) {
                    return code;
                }
            }
        }
        real(dptr, h)
    })
}

fn open_driver(
    what: &str,
    real: &'static RealFn,
    p: *mut u64,
    h: IpcHandle,
    flags: c_uint,
) -> c_int {
    guard(what, || {
        let real_open = |out: *mut u64, handle: IpcHandle| {
            let _inside = Inside::enter();
            call_driver!(real, OpenFn, (out, handle, flags))
        };
        if driver_layer() {
            if let Some(code) = ipc::open(&h, p, real_open) {
                return code;
            }
        }
        let _inside = Inside::enter();
        call_driver!(real, OpenFn, (p, h, flags))
    })
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
    guard("cuIpcCloseMemHandle", || {
        let real = |p: u64| {
            let _inside = Inside::enter();
            call_driver!(REAL_CLOSE, CloseFn, (p))
        };
        if driver_layer() {
            if let Some(code) = ipc::close(dptr, real) {
                return code;
            }
        }
        real(dptr)
    })
}

#[no_mangle]
pub extern "C" fn cudaIpcGetMemHandle(h: *mut IpcHandle, ptr: *mut c_void) -> c_int {
    guard("cudaIpcGetMemHandle", || {
        let real = |p: u64, out: *mut IpcHandle| {
            let seg = p as *mut c_void;
            call_real!(cudaIpcGetMemHandle(out, seg))
        };
        if let Some(s) = crate::life::state::runtime_state() {
            if let Some(code) = ipc::export(s, ptr as u64, h, real) {
                return lasterror::set(code);
            }
        }
        call_real!(cudaIpcGetMemHandle(h, ptr))
    })
}

#[no_mangle]
pub extern "C" fn cudaIpcOpenMemHandle(p: *mut *mut c_void, h: IpcHandle, flags: c_uint) -> c_int {
    guard("cudaIpcOpenMemHandle", || {
        let real_open = |out: *mut u64, handle: IpcHandle| {
            let out = out as *mut *mut c_void;
            call_real!(cudaIpcOpenMemHandle(out, handle, flags))
        };
        if enabled(Layer::Runtime) {
            if crate::ipc::expandable::is_handle(&h) {
                // The runtime makes its device's primary context current on this thread, as
                // the real open would before mapping.
                let null = std::ptr::null_mut();
                let _ = call_real!(cudaFree(null));
            }
            if let Some(code) = ipc::open(&h, p as *mut u64, real_open) {
                return lasterror::set(code);
            }
        }
        call_real!(cudaIpcOpenMemHandle(p, h, flags))
    })
}

#[no_mangle]
pub extern "C" fn cudaIpcCloseMemHandle(ptr: *mut c_void) -> c_int {
    guard("cudaIpcCloseMemHandle", || {
        let real = |base: u64| {
            let b = base as *mut c_void;
            call_real!(cudaIpcCloseMemHandle(b))
        };
        if enabled(Layer::Runtime) {
            if let Some(code) = ipc::close(ptr as u64, real) {
                return lasterror::set(code);
            }
        }
        call_real!(cudaIpcCloseMemHandle(ptr))
    })
}
