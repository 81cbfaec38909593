//! The shim's process-wide state once built, and what reads it without building it (exit,
//! signal and fork paths, the event log, snapshots). Building it, and the accessors that
//! build it on the first intercepted call, are `state.rs`.

use std::ffi::c_int;

use cushim::alloc::observed::ObservedTable;
use cushim::alloc::CachingAllocator;
use once_cell::sync::OnceCell;

use crate::life::history::History;

/// Everything an export needs.
pub struct Shim {
    pub alloc: CachingAllocator,
    pub history: History,
    /// Allocations recorded as made (observing mode, and families the cache does not serve).
    pub observed: ObservedTable,
}

/// The state: unset until the first intercepted call builds it (`state.rs`); `None` when
/// every call passes through.
pub(crate) static STATE: OnceCell<Option<Shim>> = OnceCell::new();

/// The state if it was already built (never initializes; for exit and signal paths).
pub fn get_if_ready() -> Option<&'static Shim> {
    STATE.get().and_then(|s| s.as_ref())
}

/// The device a cudaMalloc/cudaFree of the calling thread works on: its current device, or
/// 0 without asking when the allocator has a single device.
///
/// Why the shortcut is exact: with one device the runtime's current device can only be 0,
/// and [`current_device`] maps a failing `cudaGetDevice` to 0 as well, so the answer is
/// the same; a free's device is only a hint (the allocator tries every device). It saves a
/// real `cudaGetDevice` per call, a noticeable share of a cached cudaMalloc+cudaFree pair
/// through the shim (BENCHMARKS.md, "Measurements behind design choices").
#[inline]
pub fn alloc_device(s: &Shim) -> c_int {
    if s.alloc.device_count() == 1 {
        0
    } else {
        current_device()
    }
}

/// The calling thread's current device, as the real runtime sees it.
pub fn current_device() -> c_int {
    let mut d: c_int = 0;
    let out: *mut c_int = &mut d;
    if crate::call_real!(cudaGetDevice(out)) != crate::ffi::SUCCESS {
        return 0;
    }
    d
}

/// The device an NVTX range start or end is recorded on: the one the shim allocates on for
/// the calling thread (0 before the shim's state exists).
pub fn annotation_device() -> i32 {
    get_if_ready().map_or(0, alloc_device)
}
