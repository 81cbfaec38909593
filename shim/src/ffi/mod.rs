//! The C boundary's error codes and the panic guard every export runs inside.
//!
//! Invariant: no panic unwinds out of an exported function: [`guard`] catches it, logs one
//! line and returns `cudaErrorUnknown`.

pub mod callsite;
pub mod failopen;
pub mod intercept;
pub mod types;

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const SUCCESS: c_int = 0;
pub const ERR_INVALID_VALUE: c_int = 1;
/// `CUDA_ERROR_INVALID_HANDLE` / `cudaErrorInvalidResourceHandle` (400 in both APIs).
pub const ERR_INVALID_HANDLE: c_int = 400;
pub const ERR_MEMORY_ALLOCATION: c_int = 2;
/// `CUDA_ERROR_INVALID_CONTEXT` / `cudaErrorDeviceUninitialized` (201 in both APIs).
pub const ERR_INVALID_CONTEXT: c_int = 201;
pub const ERR_CAPTURE_UNSUPPORTED: c_int = 900;
/// `CUDA_ERROR_NOT_SUPPORTED` / `cudaErrorNotSupported` (801 in both APIs).
pub const ERR_NOT_SUPPORTED: c_int = 801;
pub const ERR_UNKNOWN: c_int = 999;

/// Run `f`, turning a panic into `cudaErrorUnknown`.
///
/// The guard itself touches no thread-local state (a cached pair pays nothing for it): the
/// one thing in a runtime export that can reach the driver hooks is a call into the real
/// runtime, and `call_real!` marks the thread inside the shim around exactly that call, so
/// the real runtime's driver calls are intercepted once, by the runtime export. The engine's
/// own driver calls never reach the hooks (`driver/device.rs`).
#[inline]
pub fn guard(what: &str, f: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(_) => internal_error(what),
    }
}

#[cold]
fn internal_error(what: &str) -> c_int {
    crate::ffi::failopen::failed(what);
    eprintln!("cushim: internal error in {what}; returning cudaErrorUnknown");
    ERR_UNKNOWN
}
