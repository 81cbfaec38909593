//! Exported driver entry points for memory: `cuMemAlloc_v2` and friends, pinned host memory,
//! virtual memory management, stream-ordered allocation, copies and sets, plus the internal
//! operations the runtime shares. Invariant: the same internal function serves a driver call
//! and its runtime twin, so both validate and account identically.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, Api};
use crate::driver_api::drv_stream;
use crate::error::*;
use crate::state::{current_device, Device};
use crate::stream::{self, Stream};
use crate::types::{MemAccessDesc, MemAllocationProp};
use crate::{capture, host, memory, vmm};
use libc::{c_uint, c_void};
use std::sync::Arc;

/// `cuMemAlloc_v2` on `d` (size 0 is invalid, as in the driver).
pub fn mem_alloc(d: &Device, size: usize) -> Result<usize, CUresult> {
    capture::check_unsafe_call()?;
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    memory::alloc(d, size)
}

/// `cuMemFree_v2` (0 is a no-op).
pub fn mem_free(ptr: usize) -> Result<(), CUresult> {
    capture::check_unsafe_call()?;
    if ptr == 0 {
        return Ok(());
    }
    memory::free(ptr)
}

/// Copy `n` bytes, validating the device side(s): `dst_dev` / `src_dev` say which side must
/// be device-accessible memory.
pub fn copy_job(
    dst: usize,
    src: usize,
    n: usize,
    dst_dev: bool,
    src_dev: bool,
) -> Result<stream::Job, CUresult> {
    if n > 0 && (dst == 0 || src == 0) {
        return Err(INVALID_VALUE);
    }
    if n > 0 && dst_dev {
        memory::check_device_range(dst, n)?;
    }
    if n > 0 && src_dev {
        memory::check_device_range(src, n)?;
    }
    // A side the caller calls host memory but that lies in a VMM reservation is device
    // address space: usable only where mapped read-write, else an illegal address (never a
    // fault of the process).
    for (addr, dev) in [(dst, dst_dev), (src, src_dev)] {
        if n > 0 && !dev && vmm::reserved(addr, n) {
            memory::check_device_range(addr, n)?;
        }
    }
    Ok(Box::new(move || {
        if n > 0 {
            // SAFETY: the device side(s) were checked to be live device-accessible memory;
            // the host side is the program's buffer of at least n bytes, as the API requires.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) }
        }
    }))
}

/// Fill `n` bytes of device memory at `dst` with `value`, on a stream of device `dev`: a
/// kernel of `dev`, so virtual-memory pages `dev` was not granted read-write access to fail
/// it (`CUDA_ERROR_ILLEGAL_ADDRESS`, here at the call), as on a GPU.
pub fn set_job(dst: usize, value: u8, n: usize, dev: usize) -> Result<stream::Job, CUresult> {
    if n > 0 {
        memory::check_device_range(dst, n)?;
        if !vmm::writable_by(dst, n, dev) {
            return Err(ILLEGAL_ADDRESS);
        }
    }
    Ok(Box::new(move || {
        if n > 0 {
            // SAFETY: [dst, dst + n) was checked to be live device-accessible memory.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) }
        }
    }))
}

/// `cuMemAllocAsync` on `s`: allocated at once (a valid point in stream order).
pub fn alloc_async(s: &Arc<Stream>, size: usize) -> Result<usize, CUresult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    memory::alloc(crate::state::device(s.device)?, size)
}

/// `cuMemFreeAsync` on `s`: freed when the stream reaches this point.
pub fn free_async(s: &Arc<Stream>, ptr: usize) -> Result<(), CUresult> {
    let (dev, start, _) = memory::find(ptr).ok_or(INVALID_VALUE)?;
    if start != ptr {
        return Err(INVALID_VALUE);
    }
    stream::run_async(
        s,
        Box::new(move || {
            if let Ok(d) = crate::state::device(dev) {
                if let Some(size) = d.heap.lock().free(ptr) {
                    d.ledger.release(size as u64);
                    d.ledger
                        .live_allocations
                        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> CUresult {
    driver(Api::cuMemAlloc_v2, || {
        let d = current_device()?;
        if dptr.is_null() {
            return Err(INVALID_VALUE);
        }
        crate::latency::sized(Api::cuMemAlloc_v2, size, false);
        out(dptr, mem_alloc(d, size)? as u64)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    driver(Api::cuMemFree_v2, || {
        current_device()?;
        crate::latency::free_of(Api::cuMemFree_v2, dptr as usize);
        mem_free(dptr as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    driver(Api::cuMemGetInfo_v2, || {
        let d = current_device()?;
        if free.is_null() || total.is_null() {
            return Err(INVALID_VALUE);
        }
        out(free, d.ledger.free() as usize)?;
        out(total, d.ledger.capacity as usize)
    })
}

/// Pinned allocation for the driver or the runtime.
pub fn host_alloc(pp: *mut *mut c_void, size: usize, flags: u32) -> Result<(), CUresult> {
    if pp.is_null() {
        return Err(INVALID_VALUE);
    }
    capture::check_unsafe_call()?;
    out(pp, host::alloc(size, flags)? as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    driver(Api::cuMemAllocHost_v2, || {
        current_device()?;
        host_alloc(pp, size, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    driver(Api::cuMemHostAlloc, || {
        current_device()?;
        host_alloc(pp, size, flags)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    driver(Api::cuMemFreeHost, || {
        current_device()?;
        capture::check_unsafe_call()?;
        host::free(p as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut u64,
    size: usize,
    alignment: usize,
    addr: u64,
    flags: u64,
) -> CUresult {
    driver(Api::cuMemAddressReserve, || {
        let d = current_device()?;
        if ptr.is_null() {
            return Err(INVALID_VALUE);
        }
        out(
            ptr,
            vmm::reserve(d, size, alignment, addr as usize, flags)? as u64,
        )
    })
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> CUresult {
    driver(Api::cuMemAddressFree, || {
        current_device()?;
        vmm::address_free(ptr as usize, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CUresult {
    driver(Api::cuMemCreate, || {
        current_device()?;
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        out(handle, vmm::create(size, prop, flags)?)
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    driver(Api::cuMemRelease, || {
        current_device()?;
        vmm::release(handle)
    })
}

#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: u64,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    driver(Api::cuMemMap, || {
        current_device()?;
        vmm::map(ptr as usize, size, offset, handle, flags)
    })
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> CUresult {
    driver(Api::cuMemUnmap, || {
        current_device()?;
        vmm::unmap(ptr as usize, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: u64,
    size: usize,
    desc: *const MemAccessDesc,
    count: usize,
) -> CUresult {
    driver(Api::cuMemSetAccess, || {
        current_device()?;
        vmm::set_access(ptr as usize, size, desc, count)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const MemAllocationProp,
    option: c_uint,
) -> CUresult {
    driver(Api::cuMemGetAllocationGranularity, || {
        crate::state::initialized()?;
        if g.is_null() {
            return Err(INVALID_VALUE);
        }
        out(g, vmm::granularity(prop, option)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    dptr: u64,
) -> CUresult {
    driver(Api::cuMemGetAddressRange_v2, || {
        current_device()?;
        let p = dptr as usize;
        let (b, s) = memory::find(p)
            .map(|(_, b, s)| (b, s))
            .or_else(|| vmm::mapping_range(p))
            .ok_or(NOT_FOUND)?;
        if !base.is_null() {
            out(base, b as u64)?;
        }
        if !size.is_null() {
            out(size, s)?;
        }
        Ok(())
    })
}

fn alloc_async_c(dptr: *mut u64, size: usize, h: *mut c_void, ptds: bool) -> Result<(), CUresult> {
    let s = drv_stream(h, ptds)?;
    if dptr.is_null() {
        return Err(INVALID_VALUE);
    }
    out(dptr, alloc_async(&s, size)? as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, h: *mut c_void) -> CUresult {
    driver(Api::cuMemAllocAsync, || alloc_async_c(dptr, size, h, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemAllocAsync_ptsz, || {
        alloc_async_c(dptr, size, h, true)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: u64, h: *mut c_void) -> CUresult {
    driver(Api::cuMemFreeAsync, || {
        free_async(&drv_stream(h, false)?, dptr as usize)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, h: *mut c_void) -> CUresult {
    driver(Api::cuMemFreeAsync_ptsz, || {
        free_async(&drv_stream(h, true)?, dptr as usize)
    })
}

pub(crate) fn copy_c(
    dst: usize,
    src: usize,
    n: usize,
    dst_dev: bool,
    src_dev: bool,
    ptds: bool,
) -> Result<(), CUresult> {
    let s = drv_stream(std::ptr::null_mut(), ptds)?;
    stream::run_sync(&s, copy_job(dst, src, n, dst_dev, src_dev)?)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CUresult {
    driver(Api::cuMemcpyHtoD_v2, || {
        copy_c(dst as usize, src as usize, n, true, false, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, n: usize) -> CUresult {
    driver(Api::cuMemcpyHtoD_v2_ptds, || {
        copy_c(dst as usize, src as usize, n, true, false, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CUresult {
    driver(Api::cuMemcpyDtoH_v2, || {
        copy_c(dst as usize, src as usize, n, false, true, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, n: usize) -> CUresult {
    driver(Api::cuMemcpyDtoH_v2_ptds, || {
        copy_c(dst as usize, src as usize, n, false, true, true)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) -> CUresult {
    driver(Api::cuMemcpyDtoD_v2, || {
        copy_c(dst as usize, src as usize, n, true, true, false)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, n: usize) -> CUresult {
    driver(Api::cuMemcpyDtoD_v2_ptds, || {
        copy_c(dst as usize, src as usize, n, true, true, true)
    })
}

fn set_c(dst: u64, value: u8, n: usize, ptds: bool) -> Result<(), CUresult> {
    let s = drv_stream(std::ptr::null_mut(), ptds)?;
    stream::run_sync(&s, set_job(dst as usize, value, n, s.device)?)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: u64, value: u8, n: usize) -> CUresult {
    driver(Api::cuMemsetD8_v2, || set_c(dst, value, n, false))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2_ptds(dst: u64, value: u8, n: usize) -> CUresult {
    driver(Api::cuMemsetD8_v2_ptds, || set_c(dst, value, n, true))
}

fn copy_async_c(
    dst: usize,
    src: usize,
    n: usize,
    sides: (bool, bool),
    h: *mut c_void,
    ptds: bool,
) -> Result<(), CUresult> {
    let s = drv_stream(h, ptds)?;
    crate::copy::copy_async(&s, dst, src, n, sides.0, sides.1)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyHtoDAsync_v2, || {
        copy_async_c(dst as usize, src as usize, n, (true, false), h, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyDtoHAsync_v2, || {
        copy_async_c(dst as usize, src as usize, n, (false, true), h, false)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, h: *mut c_void) -> CUresult {
    driver(Api::cuMemcpyDtoDAsync_v2, || {
        copy_async_c(dst as usize, src as usize, n, (true, true), h, false)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: u64, value: u8, n: usize, h: *mut c_void) -> CUresult {
    driver(Api::cuMemsetD8Async, || {
        let s = drv_stream(h, false)?;
        stream::run_async(&s, set_job(dst as usize, value, n, s.device)?)
    })
}

/// Fill `n` 32-bit words at `dst` (4-byte aligned) with `value`.
pub fn set32_job(dst: usize, value: u32, n: usize) -> Result<stream::Job, CUresult> {
    let bytes = n.checked_mul(4).ok_or(INVALID_VALUE)?;
    if dst % 4 != 0 {
        return Err(INVALID_VALUE);
    }
    if bytes > 0 {
        memory::check_device_range(dst, bytes)?;
    }
    Ok(Box::new(move || {
        for i in 0..n {
            // SAFETY: [dst, dst + 4n) was checked to be live device-accessible memory and
            // dst is 4-byte aligned.
            unsafe { (dst as *mut u32).add(i).write(value) }
        }
    }))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dst: u64, value: c_uint, n: usize) -> CUresult {
    driver(Api::cuMemsetD32_v2, || {
        let s = drv_stream(std::ptr::null_mut(), false)?;
        stream::run_sync(&s, set32_job(dst as usize, value, n)?)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(dst: u64, value: c_uint, n: usize, h: *mut c_void) -> CUresult {
    driver(Api::cuMemsetD32Async, || {
        let s = drv_stream(h, false)?;
        stream::run_async(&s, set32_job(dst as usize, value, n)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut u64,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    driver(Api::cuMemHostGetDevicePointer_v2, || {
        current_device()?;
        if flags != 0 || pdptr.is_null() {
            return Err(INVALID_VALUE);
        }
        host::find(p as usize).ok_or(INVALID_VALUE)?;
        out(pdptr, p as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: u64,
    src: *const c_void,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyHtoDAsync_v2_ptsz, || {
        copy_async_c(dst as usize, src as usize, n, (true, false), h, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: u64,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyDtoHAsync_v2_ptsz, || {
        copy_async_c(dst as usize, src as usize, n, (false, true), h, true)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst: u64,
    src: u64,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemcpyDtoDAsync_v2_ptsz, || {
        copy_async_c(dst as usize, src as usize, n, (true, true), h, true)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async_ptsz(dst: u64, value: u8, n: usize, h: *mut c_void) -> CUresult {
    driver(Api::cuMemsetD8Async_ptsz, || {
        let s = drv_stream(h, true)?;
        stream::run_async(&s, set_job(dst as usize, value, n, s.device)?)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2_ptds(dst: u64, value: c_uint, n: usize) -> CUresult {
    driver(Api::cuMemsetD32_v2_ptds, || {
        let s = drv_stream(std::ptr::null_mut(), true)?;
        stream::run_sync(&s, set32_job(dst as usize, value, n)?)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async_ptsz(
    dst: u64,
    value: c_uint,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemsetD32Async_ptsz, || {
        let s = drv_stream(h, true)?;
        stream::run_async(&s, set32_job(dst as usize, value, n)?)
    })
}
