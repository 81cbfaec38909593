//! The allocation exports' sleep-mode path: with sleep mode on, `cudaMalloc`/`cuMemAlloc`
//! are served by the sleep-mode cache (`cushim::sleep::arena`, through `life/sleep.rs`) and
//! their frees go back to it. Each segment the cache takes from the device is recorded as an
//! observed allocation of kind `sleep` (with the stack of the call that made it), so
//! snapshots show it; a cached malloc or free records nothing here.
//!
//! Invariant: reached only after [`crate::life::sleep::on`] said yes (one relaxed load on
//! the cache's path); a pointer the sleep cache does not own goes on to the cache's free.

use std::ffi::c_int;

use cushim::device::DevPtr;

use crate::ffi::SUCCESS;
use crate::life::shim::Shim;
use crate::life::sleep;

/// Serve an allocation of `size` (> 0) bytes on `dev`: the address, or a CUDA code.
#[inline(never)]
pub fn malloc(s: &Shim, dev: i32, size: u64) -> Result<DevPtr, c_int> {
    let arena = sleep::arena().ok_or(sleep::OFF)?;
    sleep::alloc(s, arena, dev, size)
}

/// Free `ptr` when the sleep cache owns it: `None` when it does not.
#[inline(never)]
pub fn free(s: &Shim, ptr: DevPtr, _dev: i32) -> Option<c_int> {
    let arena = sleep::arena()?;
    let released = arena.free(ptr)?;
    if let Some(seg) = released {
        sleep::segments_released(s, &[seg]);
    }
    Some(SUCCESS)
}
