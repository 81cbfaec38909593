//! Fail open's free path: a free that fails inside the shim (policy at the head of
//! `ffi/failopen.rs`) is served by the cache's plain free when the pointer is the cache's,
//! and by the real function otherwise.

use std::ffi::c_int;

use cushim::alloc::FreeError;

use crate::life::state::{self, Shim};

/// A free after a failure inside the shim: `cache_free` (the cache's plain free, no stack,
/// no capture or observing logic) serves the cache's own pointers; everything else, and
/// every call before the shim was built, goes to `real`.
#[inline]
pub fn free_fallback(
    ptr: u64,
    cache_free: impl FnOnce(&'static Shim) -> Result<(), FreeError>,
    real: impl FnOnce() -> c_int,
) -> c_int {
    crate::ffi::failopen::free_fallback(
        ptr,
        state::get_if_ready,
        cache_free,
        |s| {
            crate::ipc::freed(ptr);
            state::drained(s)
        },
        real,
    )
}
