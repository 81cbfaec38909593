//! The allocation exports' sleep-mode path: with sleep mode on, `cudaMalloc`/`cuMemAlloc`
//! are served by the sleep-mode cache (`cushim::sleep::arena`, through `life/sleep.rs`) and
//! their frees go back to it. Each malloc and free is recorded by the cache, with the call's
//! stack captured here first (outside its lock), as the main cache records its own: the
//! trace, the event log and the snapshot's blocks show each one. Each segment the cache takes
//! from the device is also an observed allocation of kind `sleep` (`paused` while paused),
//! for the figures of explained memory and the pause and resume events.
//!
//! Invariant: reached only after [`crate::life::sleep::on`] said yes (one relaxed load on
//! the cache's path); a pointer the sleep cache does not own goes on to the cache's free.

use std::ffi::c_int;

use cushim::device::DevPtr;

use crate::ffi::SUCCESS;
use crate::life::shim::Shim;
use crate::life::sleep;

/// Serve an allocation of `size` (> 0) bytes on `dev`: the address, or a CUDA code.
/// Cold, as is [`free`]: they are the exports' branch for sleep mode, which is off by
/// default, and a cold callee keeps the default cached pair's code as it was (without it,
/// 669 instructions per 512 B pair against 656); sleep mode's pair pays the cold call.
#[cold]
#[inline(never)]
pub fn malloc(s: &Shim, dev: i32, size: u64) -> Result<DevPtr, c_int> {
    let arena = sleep::arena().ok_or(sleep::OFF)?;
    let stack = s.history.alloc_stack();
    sleep::alloc(s, arena, dev, size, stack)
}

/// Free `ptr` when the sleep cache owns it: `None` when it does not.
#[cold]
#[inline(never)]
pub fn free(s: &Shim, ptr: DevPtr, _dev: i32) -> Option<c_int> {
    let arena = sleep::arena()?;
    // Captured before the cache's one lock; a pointer it does not own (a stream-ordered
    // allocation's, rare in sleep mode) pays the capture twice.
    let stack = s.history.free_stack();
    let released = arena.free(ptr, stack, &s.alloc)?;
    if let Some(seg) = released {
        sleep::segments_released(s, &[seg]);
    }
    Some(SUCCESS)
}
