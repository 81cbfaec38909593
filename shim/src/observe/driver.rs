//! The driver hooks' observing-mode paths (`CUSHIM_MODE=observe`): the real driver function
//! with the program's arguments, then the record (`observe`); `None` when not observing, so
//! the hook takes its cache path.
//!
//! Invariant: the program sees exactly the real function's result. The device of a record is
//! the current context's (asked only when the process has more than one device).

use std::ffi::{c_int, c_uint, c_void};

use cushim::alloc::observed::Kind;

use crate::call_driver;
use crate::driver::entry::ctx_device;
use crate::ffi::types::*;
use crate::life::state::Shim;
use crate::observe::{self, observing, read_out, read_ptr, Call};
use crate::real::slots::*;

/// The device a driver-layer record belongs to: the current context's.
pub fn driver_device(s: &Shim) -> i32 {
    if s.alloc.device_count() == 1 {
        0
    } else {
        ctx_device().unwrap_or(0)
    }
}

#[inline(always)]
pub fn alloc(
    s: &Shim,
    out: *mut DevPtr,
    size: usize,
    stream: Option<(CuStream, bool)>,
) -> Option<c_int> {
    observe::with(s, |s| {
        let call = Call {
            kind: if stream.is_some() {
                Kind::MallocAsync
            } else {
                Kind::Malloc
            },
            device: driver_device(s),
            size: size as u64,
            flags: 0,
            stream: stream.map_or(0, |(h, _)| h as u64),
        };
        let real = || match stream {
            None => call_driver!(REAL_MEM_ALLOC, AllocFn, (out, size)),
            Some((h, false)) => call_driver!(REAL_MEM_ALLOC_ASYNC, AllocAsyncFn, (out, size, h)),
            Some((h, true)) => {
                call_driver!(REAL_MEM_ALLOC_ASYNC_PTSZ, AllocAsyncFn, (out, size, h))
            }
        };
        observe::alloc(s, call, real, || read_out(out))
    })
}

#[inline(always)]
pub fn free(s: &Shim, ptr: DevPtr, stream: Option<(CuStream, bool)>) -> Option<c_int> {
    observe::with(s, |s| {
        let real = || match stream {
            None => call_driver!(REAL_MEM_FREE, FreeFn, (ptr)),
            Some((h, false)) => call_driver!(REAL_MEM_FREE_ASYNC, FreeAsyncFn, (ptr, h)),
            Some((h, true)) => call_driver!(REAL_MEM_FREE_ASYNC_PTSZ, FreeAsyncFn, (ptr, h)),
        };
        observe::free(s, ptr, driver_device(s), real)
    })
}

/// Pinned memory: `flags` is `None` for `cuMemAllocHost_v2`.
#[inline(always)]
pub fn host_alloc(
    s: &Shim,
    pp: *mut *mut c_void,
    size: usize,
    flags: Option<c_uint>,
) -> Option<c_int> {
    observe::with(s, |s| {
        let call = Call {
            kind: Kind::Pinned,
            device: -1,
            size: size as u64,
            flags: u64::from(flags.unwrap_or(0)),
            stream: 0,
        };
        let real = || match flags {
            None => call_driver!(REAL_MEM_ALLOC_HOST, HostAllocFn, (pp, size)),
            Some(f) => call_driver!(REAL_MEM_HOST_ALLOC, HostAllocFlagsFn, (pp, size, f)),
        };
        observe::alloc(s, call, real, || read_ptr(pp))
    })
}

#[inline(always)]
pub fn free_host(s: &Shim, p: *mut c_void) -> Option<c_int> {
    observe::with(s, |s| {
        observe::host_free(s, p as u64, || {
            call_driver!(REAL_MEM_FREE_HOST, FreeHostFn, (p))
        })
    })
}

pub fn mem_get_info(free: *mut usize, total: *mut usize) -> Option<c_int> {
    if !observing() {
        return None;
    }
    Some(call_driver!(REAL_MEM_GET_INFO, MemInfoFn, (free, total)))
}
