//! The allocation exports' sleep-mode path: with sleep mode on, `cudaMalloc`/`cuMemAlloc`
//! are served by the sleep arena (`life/sleep.rs`) and their frees go back to it. Each is
//! recorded as an observed allocation, so snapshots show it (with its call's stack).
//!
//! Invariant: reached only after [`crate::life::sleep::on`] said yes (one relaxed load on
//! the cache's path); a pointer the arena does not own goes on to the cache's free.

use std::ffi::c_int;

use cushim::alloc::observed::{Kind, Record};
use cushim::device::DevPtr;

use crate::ffi::SUCCESS;
use crate::life::shim::Shim;
use crate::life::sleep;

/// Serve an allocation of `size` (> 0) bytes on `dev`: the address, or a CUDA code.
#[cold]
#[inline(never)]
pub fn malloc(s: &Shim, dev: i32, size: u64) -> Result<DevPtr, c_int> {
    let arena = sleep::arena().ok_or(sleep::OFF)?;
    let stack = s.history.alloc_stack();
    let p = sleep::alloc(s, arena, dev, size)?;
    s.observed.alloc(
        dev,
        p,
        Record {
            size,
            kind: Kind::Sleep,
            flags: 0,
            stream: 0,
            stack,
        },
    );
    Ok(p)
}

/// Free `ptr` when the arena owns it (after the device's work): `None` when it does not.
#[cold]
#[inline(never)]
pub fn free(s: &Shim, ptr: DevPtr, dev: i32) -> Option<c_int> {
    let arena = sleep::arena()?;
    if !arena.owns(ptr) {
        return None;
    }
    let stack = s.history.free_stack();
    Some(match arena.free(ptr)? {
        Ok(()) => {
            s.observed.free(ptr, dev, stack);
            SUCCESS
        }
        Err(e) => sleep::code(e),
    })
}
