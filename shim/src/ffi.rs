//! The C boundary's error codes and the panic guard every export runs inside.
//!
//! Invariant: no panic unwinds out of an exported function: [`guard`] catches it, logs one
//! line and returns `cudaErrorUnknown`.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const SUCCESS: c_int = 0;
pub const ERR_INVALID_VALUE: c_int = 1;
pub const ERR_MEMORY_ALLOCATION: c_int = 2;
pub const ERR_CAPTURE_UNSUPPORTED: c_int = 900;
pub const ERR_UNKNOWN: c_int = 999;

/// Run `f`, turning a panic into `cudaErrorUnknown`.
pub fn guard(what: &str, f: impl FnOnce() -> c_int) -> c_int {
    // Driver hooks reached from inside a runtime export pass through (intercepted once).
    let _inside = crate::intercept::Inside::enter_runtime();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(_) => {
            eprintln!("cushim: internal error in {what}; returning cudaErrorUnknown");
            ERR_UNKNOWN
        }
    }
}
