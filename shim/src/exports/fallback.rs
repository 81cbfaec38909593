//! Fail open's free path: a free that fails inside the shim (policy at the head of
//! `ffi/failopen.rs`) is served by the cache's plain free when the pointer is the cache's,
//! and by the real function otherwise.

use std::ffi::c_int;

use cushim::alloc::FreeError;

use crate::life::state::{self, Shim};

/// A free after a failure inside the shim: `cache_free` (the cache's plain free, no stack,
/// no capture or observing logic) serves the cache's own pointers; everything else, and
/// every call before the shim was built, goes to `real`.
pub fn free_fallback(
    ptr: u64,
    cache_free: impl FnOnce(&'static Shim) -> Result<(), FreeError>,
    real: impl FnOnce() -> c_int,
) -> c_int {
    if ptr != 0 {
        if let Some(s) = state::get_if_ready() {
            match cache_free(s) {
                Ok(()) => {
                    crate::ipc::freed(ptr);
                    return state::drained(s);
                }
                Err(FreeError::NotOurs) => {}
                Err(FreeError::InvalidValue) => return crate::ffi::ERR_INVALID_VALUE,
                Err(FreeError::InvalidHandle) => return crate::ffi::ERR_INVALID_HANDLE,
            }
        }
    }
    real()
}
