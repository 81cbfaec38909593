//! Exported CUDA runtime allocation functions: decode C arguments, call the engine, map the
//! result to a CUDA error code. No policy lives here.
//!
//! Invariants: a NULL out-pointer is `cudaErrorInvalidValue` (1); `cudaMalloc(&p, 0)`
//! succeeds with `p = NULL`; `cudaFree(NULL)` and pointers the cache does not own go to the
//! real function; an invalid free of a cached pointer is 1, logged once per call site; a
//! stream-ordered free on a destroyed stream is 400. While a capture forbids allocation
//! (`capture.rs`) `cudaMalloc` goes to the real function and a free of a cached block
//! returns what a real allocation returns then (900, invalidating the capture); a
//! `cudaMallocAsync` on a capturing stream goes to the real function (a graph allocation),
//! and a `cudaFreeAsync` of a cached block on a capturing stream keeps the block allocated
//! (the graph may use it whenever it is launched).

use std::ffi::{c_int, c_uint, c_void};

use cushim::alloc::{AllocError, FreeError};
use cushim::trace::event::NO_STACK;

use crate::exports::lasterror;
use crate::exports::{fallback, ordered};
use crate::ffi::failopen::{self, Point};
use crate::ffi::{
    ERR_CAPTURE_UNSUPPORTED, ERR_INVALID_HANDLE, ERR_INVALID_VALUE, ERR_MEMORY_ALLOCATION,
    ERR_UNKNOWN, SUCCESS,
};
use crate::life::{capture, state};
use crate::observe::runtime as observing;
use crate::real::runtime::Stream;
use crate::{call_real, observe};

fn alloc_code(e: AllocError) -> c_int {
    match e {
        AllocError::OutOfMemory => ERR_MEMORY_ALLOCATION,
        AllocError::Capturing => ERR_CAPTURE_UNSUPPORTED,
        AllocError::InvalidHandle => ERR_INVALID_HANDLE,
        AllocError::Device(_) => ERR_MEMORY_ALLOCATION,
    }
}

/// Store `p` through the program's out-pointer.
fn put(out: *mut *mut c_void, p: u64) -> c_int {
    // SAFETY: `out` was checked non-null by the caller and points at the program's variable.
    unsafe { *out = p as *mut c_void };
    SUCCESS
}

/// Handle a free the engine refused: forward what it does not own, report the rest.
fn refused_free(what: &str, ptr: *mut c_void, e: FreeError, real: impl FnOnce() -> c_int) -> c_int {
    match e {
        FreeError::NotOurs => real(),
        FreeError::InvalidValue => {
            crate::ffi::callsite::log_once(&format!(
                "{what}({ptr:p}): not an allocated block (double free or interior pointer)"
            ));
            lasterror::set(ERR_INVALID_VALUE)
        }
        FreeError::InvalidHandle => lasterror::set(ERR_INVALID_HANDLE),
    }
}

/// [`capture::forbidden_free`] through the runtime.
#[cold]
fn forbidden_free() -> Option<c_int> {
    capture::forbidden_free(
        |size| {
            let mut tmp: *mut c_void = std::ptr::null_mut();
            let out: *mut *mut c_void = &mut tmp;
            (call_real!(cudaMalloc(out, size)), tmp as u64)
        },
        |p| {
            let p = p as *mut c_void;
            let _ = call_real!(cudaFree(p));
        },
    )
}

/// The cached allocation of every runtime allocating export. Inlined into each: a call of
/// its own cost about 20 instructions a pair in saved and restored registers (callgrind,
/// BENCHMARKS.md "Instructions per cached pair").
#[inline(always)]
fn malloc_on(out: *mut *mut c_void, size: usize, stream: u64, async_: bool) -> Option<c_int> {
    let s = crate::life::state::runtime_state()?;
    if failopen::pass_through(Point::Runtime) {
        return None;
    }
    if out.is_null() {
        return Some(lasterror::set(ERR_INVALID_VALUE));
    }
    if async_ && capture::stream_capturing(stream) || !async_ && capture::forbidden() {
        return None;
    }
    let dev = state::alloc_device(s);
    if !async_ && size > 0 && crate::life::sleep::on() {
        return Some(match super::sleep::malloc(s, dev, size as u64) {
            Ok(p) => put(out, p),
            Err(code) => {
                // SAFETY: `out` is non-null; CUDA leaves the out-pointer NULL on failure.
                unsafe { *out = std::ptr::null_mut() };
                lasterror::set(code)
            }
        });
    }
    let stack = s.history.alloc_stack();
    let r = if async_ {
        ordered::malloc_async(&s.alloc, dev, size as u64, stream, stack)
    } else {
        s.alloc.malloc(dev, size as u64, stream, stack)
    };
    Some(match r {
        Ok(p) => put(out, p),
        Err(e) => {
            // SAFETY: `out` is non-null; CUDA leaves the out-pointer NULL on failure.
            unsafe { *out = std::ptr::null_mut() };
            if e == AllocError::OutOfMemory {
                crate::life::dump::on_oom(s);
            }
            lasterror::set(alloc_code(e))
        }
    })
}

#[no_mangle]
pub extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> c_int {
    let real = || call_real!(cudaMalloc(dev_ptr, size));
    failopen::guard_or(
        "cudaMalloc",
        ERR_UNKNOWN,
        || {
            observing::malloc(dev_ptr, size)
                .or_else(|| malloc_on(dev_ptr, size, 0, false))
                .unwrap_or_else(real)
        },
        real,
    )
}

/// `cudaMallocAsync` and its `_ptsz` twin: `stream` is the stream the call means (the
/// per-thread stream for a `_ptsz` null), `real` the program's own call.
#[inline(always)]
fn malloc_async(
    what: &str,
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: u64,
    real: impl Fn() -> c_int,
) -> c_int {
    failopen::guard_or(
        what,
        ERR_UNKNOWN,
        || {
            observing::malloc_async(dev_ptr, size, stream, &real)
                .or_else(|| malloc_on(dev_ptr, size, stream, true))
                .unwrap_or_else(&real)
        },
        &real,
    )
}

#[no_mangle]
pub extern "C" fn cudaMallocAsync(dev_ptr: *mut *mut c_void, size: usize, stream: Stream) -> c_int {
    crate::per_thread::note_stream(stream as usize);
    malloc_async("cudaMallocAsync", dev_ptr, size, stream as u64, || {
        call_real!(cudaMallocAsync(dev_ptr, size, stream))
    })
}

#[no_mangle]
pub extern "C" fn cudaMallocAsync_ptsz(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: Stream,
) -> c_int {
    crate::per_thread::note_ptds();
    malloc_async(
        "cudaMallocAsync_ptsz",
        dev_ptr,
        size,
        capture::ptsz(stream as u64),
        || call_real!(cudaMallocAsync_ptsz(dev_ptr, size, stream)),
    )
}

#[no_mangle]
pub extern "C" fn cudaFree(ptr: *mut c_void) -> c_int {
    let real = || call_real!(cudaFree(ptr));
    let fallback = || {
        let p = ptr as u64;
        fallback::free_fallback(p, |s| s.alloc.free(p, 0, NO_STACK), real)
    };
    failopen::guard_or(
        "cudaFree",
        ERR_UNKNOWN,
        || {
            if let Some(rc) = observing::free(ptr) {
                return rc;
            }
            let Some(s) = crate::life::state::runtime_state() else {
                return real();
            };
            if ptr.is_null() {
                return real();
            }
            if crate::life::sleep::on() {
                if let Some(rc) = super::sleep::free(s, ptr as u64, state::alloc_device(s)) {
                    return lasterror::set(rc);
                }
            }
            let degraded = failopen::pass_through(Point::Runtime);
            if capture::forbidden() {
                if s.alloc.owner(ptr as u64).is_none() {
                    return real();
                }
                if let Some(rc) = forbidden_free() {
                    return rc;
                }
            }
            let stack = s.history.free_stack();
            let dev = state::alloc_device(s);
            let r = s.alloc.free(ptr as u64, dev, stack);
            if r.is_ok() {
                crate::ipc::freed(ptr as u64);
            }
            match r {
                Ok(()) if degraded => state::drained(s),
                Ok(()) => SUCCESS,
                Err(e) => refused_free("cudaFree", ptr, e, || {
                    observe::free(s, ptr as u64, dev, real)
                }),
            }
        },
        fallback,
    )
}

/// `cudaFreeAsync` and its `_ptsz` twin: `stream` is the stream the call means (the
/// per-thread stream for a `_ptsz` null), `real` the program's own call.
#[inline(always)]
fn free_async(what: &str, ptr: *mut c_void, stream: u64, real: impl Fn() -> c_int) -> c_int {
    let fallback = || {
        let p = ptr as u64;
        fallback::free_fallback(
            p,
            |s| ordered::free_async(&s.alloc, p, stream, 0, NO_STACK),
            &real,
        )
    };
    failopen::guard_or(
        what,
        ERR_UNKNOWN,
        || {
            if let Some(rc) = observing::free_async(ptr, &real) {
                return rc;
            }
            let Some(s) = crate::life::state::runtime_state() else {
                return real();
            };
            if ptr.is_null() {
                return real();
            }
            failopen::inject(Point::Runtime);
            if capture::stream_capturing(stream) && s.alloc.owner(ptr as u64).is_some() {
                return SUCCESS;
            }
            let stack = s.history.free_stack();
            let dev = state::alloc_device(s);
            match ordered::free_async(&s.alloc, ptr as u64, stream, dev, stack) {
                Ok(()) => {
                    crate::ipc::freed(ptr as u64);
                    SUCCESS
                }
                Err(e) => refused_free(what, ptr, e, || observe::free(s, ptr as u64, dev, &real)),
            }
        },
        fallback,
    )
}

#[no_mangle]
pub extern "C" fn cudaFreeAsync(ptr: *mut c_void, stream: Stream) -> c_int {
    crate::per_thread::note_stream(stream as usize);
    free_async("cudaFreeAsync", ptr, stream as u64, || {
        call_real!(cudaFreeAsync(ptr, stream))
    })
}

#[no_mangle]
pub extern "C" fn cudaFreeAsync_ptsz(ptr: *mut c_void, stream: Stream) -> c_int {
    crate::per_thread::note_ptds();
    free_async(
        "cudaFreeAsync_ptsz",
        ptr,
        capture::ptsz(stream as u64),
        || call_real!(cudaFreeAsync_ptsz(ptr, stream)),
    )
}

fn host_alloc(out: *mut *mut c_void, size: usize, flags: c_uint) -> Option<c_int> {
    let s = crate::life::state::runtime_state()?;
    if !crate::driver::device::pinned_supported() || failopen::pass_through(Point::Pinned) {
        return None;
    }
    if out.is_null() {
        return Some(lasterror::set(ERR_INVALID_VALUE));
    }
    let stack = s.history.alloc_stack();
    Some(match s.alloc.host_alloc(size as u64, flags, stack) {
        Ok(p) => put(out, p),
        Err(e) => {
            // SAFETY: `out` is non-null.
            unsafe { *out = std::ptr::null_mut() };
            lasterror::set(alloc_code(e))
        }
    })
}

#[no_mangle]
pub extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    let real = || call_real!(cudaMallocHost(ptr, size));
    failopen::guard_or(
        "cudaMallocHost",
        ERR_UNKNOWN,
        || {
            observing::host_alloc(ptr, size, None)
                .or_else(|| host_alloc(ptr, size, 0))
                .unwrap_or_else(real)
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    let real = || call_real!(cudaHostAlloc(ptr, size, flags));
    failopen::guard_or(
        "cudaHostAlloc",
        ERR_UNKNOWN,
        || {
            observing::host_alloc(ptr, size, Some(flags))
                .or_else(|| host_alloc(ptr, size, flags))
                .unwrap_or_else(real)
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    let real = || call_real!(cudaFreeHost(ptr));
    let fallback = || {
        let p = ptr as u64;
        fallback::free_fallback(p, |s| s.alloc.host_free(p, NO_STACK), real)
    };
    failopen::guard_or(
        "cudaFreeHost",
        ERR_UNKNOWN,
        || {
            if let Some(rc) = observing::free_host(ptr) {
                return rc;
            }
            let Some(s) = crate::life::state::runtime_state() else {
                return real();
            };
            if ptr.is_null() {
                return real();
            }
            failopen::inject(Point::Pinned);
            match s.alloc.host_free(ptr as u64, s.history.free_stack()) {
                Ok(()) => SUCCESS,
                Err(e) => refused_free("cudaFreeHost", ptr, e, real),
            }
        },
        fallback,
    )
}

#[no_mangle]
pub extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    crate::ffi::failopen::around(
        "cudaMemGetInfo",
        || call_real!(cudaMemGetInfo(free, total)),
        |real| {
            if let Some(rc) = observing::mem_get_info(free, total) {
                return rc;
            }
            let Some(s) = crate::life::state::runtime_state() else {
                return real();
            };
            if free.is_null() || total.is_null() {
                return lasterror::set(ERR_INVALID_VALUE);
            }
            match s.alloc.mem_get_info(state::current_device()) {
                Ok((f, t)) => {
                    // SAFETY: both out-pointers were checked non-null.
                    unsafe {
                        *free = f as usize;
                        *total = t as usize;
                    }
                    SUCCESS
                }
                Err(_) => call_real!(cudaMemGetInfo(free, total)),
            }
        },
    )
}
