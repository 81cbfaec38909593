//! The runtime exports' observing-mode paths (`CUSHIM_MODE=observe`): each calls the real
//! function with the program's arguments and records the result (`observe`), or answers
//! `None` when not observing so the export takes its cache path.
//!
//! Invariant: the program sees exactly the real function's result; `cudaMemGetInfo` is the
//! real one.

use std::ffi::{c_int, c_uint, c_void};

use engine::alloc::observed::Kind;

use crate::call_real;
use crate::observe::{self, read_ptr, runtime_observer, Call};
use crate::real::Stream;
use crate::state;

fn device_call(kind: Kind, device: i32, size: usize, flags: u64, stream: u64) -> Call {
    Call {
        kind,
        device,
        size: size as u64,
        flags,
        stream,
    }
}

pub fn malloc(p: *mut *mut c_void, size: usize) -> Option<c_int> {
    let s = runtime_observer()?;
    let call = device_call(Kind::Malloc, state::alloc_device(s), size, 0, 0);
    Some(observe::alloc(
        s,
        call,
        || call_real!(cudaMalloc(p, size)),
        || read_ptr(p),
    ))
}

pub fn malloc_async(p: *mut *mut c_void, size: usize, stream: Stream) -> Option<c_int> {
    let s = runtime_observer()?;
    let call = device_call(
        Kind::MallocAsync,
        state::alloc_device(s),
        size,
        0,
        stream as u64,
    );
    Some(observe::alloc(
        s,
        call,
        || call_real!(cudaMallocAsync(p, size, stream)),
        || read_ptr(p),
    ))
}

pub fn free(ptr: *mut c_void) -> Option<c_int> {
    let s = runtime_observer()?;
    let hint = state::alloc_device(s);
    Some(observe::free(s, ptr as u64, hint, || {
        call_real!(cudaFree(ptr))
    }))
}

pub fn free_async(ptr: *mut c_void, stream: Stream) -> Option<c_int> {
    let s = runtime_observer()?;
    let hint = state::alloc_device(s);
    Some(observe::free(s, ptr as u64, hint, || {
        call_real!(cudaFreeAsync(ptr, stream))
    }))
}

pub fn host_alloc(p: *mut *mut c_void, size: usize, flags: Option<c_uint>) -> Option<c_int> {
    let s = runtime_observer()?;
    let call = device_call(Kind::Pinned, -1, size, u64::from(flags.unwrap_or(0)), 0);
    Some(observe::alloc(
        s,
        call,
        || match flags {
            None => call_real!(cudaMallocHost(p, size)),
            Some(flags) => call_real!(cudaHostAlloc(p, size, flags)),
        },
        || read_ptr(p),
    ))
}

pub fn free_host(ptr: *mut c_void) -> Option<c_int> {
    let s = runtime_observer()?;
    Some(observe::host_free(s, ptr as u64, || {
        call_real!(cudaFreeHost(ptr))
    }))
}

pub fn mem_get_info(free: *mut usize, total: *mut usize) -> Option<c_int> {
    runtime_observer()?;
    Some(call_real!(cudaMemGetInfo(free, total)))
}
