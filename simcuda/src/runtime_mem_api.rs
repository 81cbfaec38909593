//! Exported runtime entry points for memory: device, pinned and stream-ordered allocation,
//! copies, sets, pointer attributes and memory info. Invariant: built on the same internal
//! functions as the driver twins, with the runtime's rules on top (size 0 gives NULL and
//! success; sync copies and sets are ordered on the legacy stream; free synchronises).
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{out, runtime, Api};
use crate::driver_mem_api::{
    alloc_async, copy_job, free_async, host_alloc, mem_alloc, mem_free, set_job,
};
use crate::error::*;
use crate::runtime_api::{rt_stream, rt_stream_ptds};
use crate::state::runtime_device;
use crate::stream::{self, Stream};
use crate::types::PointerAttributes;
use crate::{capture, host, memory};
use libc::{c_int, c_uint, c_void};
use std::sync::Arc;

fn malloc(p: *mut *mut c_void, size: usize) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    let d = runtime_device()?;
    if size == 0 {
        capture::check_unsafe_call()?;
        return out(p, std::ptr::null_mut());
    }
    out(p, mem_alloc(d, size)? as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(p: *mut *mut c_void, size: usize) -> CUresult {
    runtime(Api::cudaMalloc, || {
        crate::latency::sized(Api::cudaMalloc, size, false);
        malloc(p, size)
    })
}

#[no_mangle]
pub extern "C" fn cudaFree(p: *mut c_void) -> CUresult {
    runtime(Api::cudaFree, || {
        runtime_device()?;
        crate::latency::free_of(Api::cudaFree, p as usize);
        mem_free(p as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(p: *mut *mut c_void, size: usize) -> CUresult {
    runtime(Api::cudaMallocHost, || {
        runtime_device()?;
        if size == 0 && !p.is_null() {
            return out(p, std::ptr::null_mut());
        }
        host_alloc(p, size, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(
    p: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    runtime(Api::cudaHostAlloc, || {
        runtime_device()?;
        if flags & !host::VALID_FLAGS != 0 {
            return Err(INVALID_VALUE);
        }
        if size == 0 && !p.is_null() {
            return out(p, std::ptr::null_mut());
        }
        host_alloc(p, size, flags)
    })
}

#[no_mangle]
pub extern "C" fn cudaFreeHost(p: *mut c_void) -> CUresult {
    runtime(Api::cudaFreeHost, || {
        runtime_device()?;
        capture::check_unsafe_call()?;
        if p.is_null() {
            return Ok(());
        }
        host::free(p as usize)
    })
}

/// How a runtime call names the default stream: plain calls mean the legacy stream by 0,
/// `_ptsz`/`_ptds` calls the calling thread's per-thread default stream.
#[derive(Clone, Copy)]
pub(crate) enum Default0 {
    Legacy,
    PerThread,
}

fn stream_of(h: *mut c_void, d: Default0) -> Result<Arc<Stream>, CUresult> {
    match d {
        Default0::Legacy => rt_stream(h),
        Default0::PerThread => rt_stream_ptds(h),
    }
}

/// `cudaMallocAsync` and its `_ptsz` twin.
pub(crate) fn malloc_async_on(
    p: *mut *mut c_void,
    size: usize,
    h: *mut c_void,
    d: Default0,
) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    let s = stream_of(h, d)?;
    if size == 0 {
        return out(p, std::ptr::null_mut());
    }
    out(p, alloc_async(&s, size)? as *mut c_void)
}

/// `cudaFreeAsync` and its `_ptsz` twin.
pub(crate) fn free_async_on(p: *mut c_void, h: *mut c_void, d: Default0) -> Result<(), CUresult> {
    let s = stream_of(h, d)?;
    if p.is_null() {
        return Ok(());
    }
    free_async(&s, p as usize)
}

/// `cudaMemcpy[Async]` and their `_ptds`/`_ptsz` twins; `wait` for the synchronous ones.
pub(crate) fn memcpy_on(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
    h: *mut c_void,
    d: Default0,
    wait: bool,
) -> Result<(), CUresult> {
    let (dd, sd) = copy_sides(kind)?;
    let s = stream_of(h, d)?;
    let (dst, src) = (dst as usize, src as usize);
    if kind == MEMCPY_DEFAULT {
        return crate::copy::copy_unified(&s, dst, src, n, wait);
    }
    if wait {
        stream::run_sync(&s, copy_job(dst, src, n, dd, sd)?)
    } else {
        crate::copy::copy_async(&s, dst, src, n, dd, sd)
    }
}

/// `cudaMemset[Async]` and their `_ptds`/`_ptsz` twins; `wait` for the synchronous ones.
pub(crate) fn memset_on(
    dst: *mut c_void,
    value: c_int,
    n: usize,
    h: *mut c_void,
    d: Default0,
    wait: bool,
) -> Result<(), CUresult> {
    let s = stream_of(h, d)?;
    let job = set_job(dst as usize, value as u8, n, s.device)?;
    if wait {
        stream::run_sync(&s, job)
    } else {
        stream::run_async(&s, job)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(
    p: *mut *mut c_void,
    size: usize,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMallocAsync, || {
        malloc_async_on(p, size, h, Default0::Legacy)
    })
}

#[no_mangle]
pub extern "C" fn cudaFreeAsync(p: *mut c_void, h: *mut c_void) -> CUresult {
    runtime(Api::cudaFreeAsync, || free_async_on(p, h, Default0::Legacy))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> CUresult {
    runtime(Api::cudaMemGetInfo, || {
        if free.is_null() || total.is_null() {
            return Err(INVALID_VALUE);
        }
        let d = runtime_device()?;
        out(free, d.ledger.free() as usize)?;
        out(total, d.ledger.capacity as usize)
    })
}

/// `cudaMemcpyDefault`: each side's kind from its address (unified addressing).
const MEMCPY_DEFAULT: c_int = 4;

/// Which sides of a copy of `kind` must be device memory: (dst, src).
pub(crate) fn copy_sides(kind: c_int) -> Result<(bool, bool), CUresult> {
    match kind {
        0 => Ok((false, false)),
        1 => Ok((true, false)),
        2 => Ok((false, true)),
        3 => Ok((true, true)),
        4 => Ok((false, false)),
        _ => Err(INVALID_MEMCPY_DIRECTION),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
) -> CUresult {
    runtime(Api::cudaMemcpy, || {
        memcpy_on(
            dst,
            src,
            n,
            kind,
            std::ptr::null_mut(),
            Default0::Legacy,
            true,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMemcpyAsync, || {
        memcpy_on(dst, src, n, kind, h, Default0::Legacy, false)
    })
}

#[no_mangle]
pub extern "C" fn cudaMemset(dst: *mut c_void, value: c_int, n: usize) -> CUresult {
    runtime(Api::cudaMemset, || {
        memset_on(dst, value, n, std::ptr::null_mut(), Default0::Legacy, true)
    })
}

#[no_mangle]
pub extern "C" fn cudaMemsetAsync(
    dst: *mut c_void,
    value: c_int,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMemsetAsync, || {
        memset_on(dst, value, n, h, Default0::Legacy, false)
    })
}

/// `cudaMemoryType`.
const MEMORY_TYPE_UNREGISTERED: c_int = 0;
const MEMORY_TYPE_HOST: c_int = 1;
const MEMORY_TYPE_DEVICE: c_int = 2;

#[no_mangle]
pub unsafe extern "C" fn cudaPointerGetAttributes(
    attr: *mut PointerAttributes,
    ptr: *const c_void,
) -> CUresult {
    runtime(Api::cudaPointerGetAttributes, || {
        if attr.is_null() {
            return Err(INVALID_VALUE);
        }
        let cur = runtime_device()?.ordinal as c_int;
        let p = ptr as usize;
        let a = if let Some((dev, _, _)) = memory::find(p) {
            PointerAttributes {
                type_: MEMORY_TYPE_DEVICE,
                device: dev as c_int,
                device_pointer: ptr as *mut c_void,
                host_pointer: std::ptr::null_mut(),
            }
        } else if let Some(dev) =
            crate::vmm::mapping_range(p).and_then(|_| crate::vmm::accessible(p, 1))
        {
            PointerAttributes {
                type_: MEMORY_TYPE_DEVICE,
                device: dev as c_int,
                device_pointer: ptr as *mut c_void,
                host_pointer: std::ptr::null_mut(),
            }
        } else if host::find(p).is_some() {
            PointerAttributes {
                type_: MEMORY_TYPE_HOST,
                device: cur,
                device_pointer: ptr as *mut c_void,
                host_pointer: ptr as *mut c_void,
            }
        } else {
            PointerAttributes {
                type_: MEMORY_TYPE_UNREGISTERED,
                device: -2,
                device_pointer: std::ptr::null_mut(),
                host_pointer: ptr as *mut c_void,
            }
        };
        out(attr, a)
    })
}
