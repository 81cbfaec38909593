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
use crate::real::runtime::Stream;

#[inline(always)]
pub fn malloc(p: *mut *mut c_void, size: usize) -> Option<c_int> {
    runtime_call(|s| {
        let call = Call::new(Kind::Malloc, state::alloc_device(s), size as u64, 0, 0);
        observe::alloc(s, call, || call_real!(cudaMalloc(p, size)), || read_ptr(p))
    })
}

#[inline(always)]
pub fn malloc_async(p: *mut *mut c_void, size: usize, stream: Stream) -> Option<c_int> {
    runtime_call(|s| {
        let call = Call::new(
            Kind::MallocAsync,
            state::alloc_device(s),
            size as u64,
            0,
            stream as u64,
        );
        observe::alloc(
            s,
            call,
            || call_real!(cudaMallocAsync(p, size, stream)),
            || read_ptr(p),
        )
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
pub fn free_async(ptr: *mut c_void, stream: Stream) -> Option<c_int> {
    runtime_call(|s| {
        let hint = state::alloc_device(s);
        observe::free(s, ptr as u64, hint, || {
            call_real!(cudaFreeAsync(ptr, stream))
        })
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
