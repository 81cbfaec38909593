//! The runtime exports' observing-mode paths (`CUSHIM_MODE=observe`): each calls the real
//! function with the program's arguments and records the result (`observe`), or answers
//! `None` when not observing so the export takes its cache path.
//!
//! Invariant: the program sees exactly the real function's result; `cudaMemGetInfo` is the
//! real one.

use std::ffi::{c_int, c_uint, c_void};

use cushim::alloc::observed::Kind;

use crate::call_real;
use crate::life::state;
use crate::observe::{self, read_ptr, runtime_call, Call};

#[inline(always)]
pub fn malloc(p: *mut *mut c_void, size: usize) -> Option<c_int> {
    runtime_call(|s| {
        let call = Call::new(Kind::Malloc, state::alloc_device(s), size as u64, 0, 0);
        observe::alloc(s, call, || call_real!(cudaMalloc(p, size)), || read_ptr(p))
    })
}

#[inline(always)]
/// `stream`: the stream the call means (a `_ptsz` entry point's null is the per-thread
/// stream); `real`: the real function the program called, with its arguments.
pub fn malloc_async(
    p: *mut *mut c_void,
    size: usize,
    stream: u64,
    real: impl FnOnce() -> c_int,
) -> Option<c_int> {
    runtime_call(|s| {
        let call = Call::new(
            Kind::MallocAsync,
            state::alloc_device(s),
            size as u64,
            0,
            stream,
        );
        observe::alloc(s, call, real, || read_ptr(p))
    })
}

#[inline(always)]
pub fn free(ptr: *mut c_void) -> Option<c_int> {
    runtime_call(|s| {
        let hint = state::alloc_device(s);
        observe::free(s, ptr as u64, hint, || call_real!(cudaFree(ptr)))
    })
}

#[inline(always)]
/// `real`: the real function the program called, with its arguments.
pub fn free_async(ptr: *mut c_void, real: impl FnOnce() -> c_int) -> Option<c_int> {
    runtime_call(|s| {
        let hint = state::alloc_device(s);
        observe::free(s, ptr as u64, hint, real)
    })
}

#[inline(always)]
pub fn host_alloc(p: *mut *mut c_void, size: usize, flags: Option<c_uint>) -> Option<c_int> {
    runtime_call(|s| {
        let call = Call::new(
            Kind::Pinned,
            -1,
            size as u64,
            u64::from(flags.unwrap_or(0)),
            0,
        );
        observe::alloc(
            s,
            call,
            || match flags {
                None => call_real!(cudaMallocHost(p, size)),
                Some(flags) => call_real!(cudaHostAlloc(p, size, flags)),
            },
            || read_ptr(p),
        )
    })
}

#[inline(always)]
pub fn free_host(ptr: *mut c_void) -> Option<c_int> {
    runtime_call(|s| observe::host_free(s, ptr as u64, || call_real!(cudaFreeHost(ptr))))
}

#[inline(always)]
pub fn mem_get_info(free: *mut usize, total: *mut usize) -> Option<c_int> {
    runtime_call(|_| call_real!(cudaMemGetInfo(free, total)))
}
