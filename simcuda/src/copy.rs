//! Stream-ordered copies and host memory, as CUDA documents them ("API synchronization
//! behavior"): an asynchronous copy involving pinned host memory (or none) is queued and
//! returns at once; one from pageable host memory to the device has consumed its source when
//! it returns (the bytes are staged at the call, so the program may reuse its buffer); one
//! from the device into pageable host memory returns only when the copy is done; a
//! host-to-host copy is fully synchronous. Unified-addressing copies (`cuMemcpy`,
//! `cudaMemcpyDefault`) find each side's kind from the address. Why: published clients rely
//! on it (cudarc's `clone_dtoh` reads a pageable `Vec` right after `cuMemcpyDtoHAsync`).

use crate::driver_mem_api::copy_job;
use crate::error::*;
use crate::stream::{self, Stream};
use crate::{host, memory};
use std::sync::Arc;

/// Whether `addr` is device memory (in a `cuMemAlloc` block or a VMM reservation, mapped or
/// not), as opposed to host memory, for a copy whose kind is not given; the copy then checks
/// that the whole range is usable (an unmapped reservation is an illegal address).
pub fn is_device(addr: usize) -> bool {
    matches!(memory::check_device_range(addr, 1), Ok(Some(_))) || crate::vmm::reserved(addr, 1)
}

/// Whether a host side of a copy is pageable (not pinned by simcuda).
fn pageable(addr: usize, n: usize) -> bool {
    n > 0 && !host::contains(addr, n)
}

/// Queue a copy of `n` bytes on `s` with CUDA's asynchronous-copy semantics toward host
/// memory (see the module comment). `dst_dev` / `src_dev`: which sides are device memory.
pub fn copy_async(
    s: &Arc<Stream>,
    dst: usize,
    src: usize,
    n: usize,
    dst_dev: bool,
    src_dev: bool,
) -> Result<(), CUresult> {
    let job = copy_job(dst, src, n, dst_dev, src_dev)?;
    if !dst_dev && (!src_dev || pageable(dst, n)) {
        // Host to host, or device to pageable host: done before returning.
        return stream::run_sync(s, job);
    }
    if !src_dev && pageable(src, n) {
        // Pageable host to device: stage the source now, copy it in stream order.
        // SAFETY: the program passes `n` readable bytes at `src`, as the API requires.
        let staged: Vec<u8> = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
        drop(job);
        let into = copy_job(dst, staged.as_ptr() as usize, n, dst_dev, false)?;
        return stream::run_async(
            s,
            Box::new(move || {
                into();
                drop(staged);
            }),
        );
    }
    stream::run_async(s, job)
}

/// A unified-addressing copy (`cuMemcpy[Async]`, `cudaMemcpyDefault`): each side's kind from
/// its address; `wait` for the synchronous form.
pub fn copy_unified(
    s: &Arc<Stream>,
    dst: usize,
    src: usize,
    n: usize,
    wait: bool,
) -> Result<(), CUresult> {
    let (dd, sd) = (is_device(dst), is_device(src));
    if wait {
        stream::run_sync(s, copy_job(dst, src, n, dd, sd)?)
    } else {
        copy_async(s, dst, src, n, dd, sd)
    }
}

fn unified_c(
    dst: u64,
    src: u64,
    n: usize,
    h: *mut libc::c_void,
    ptds: bool,
    wait: bool,
) -> Result<(), CUresult> {
    let s = crate::driver_api::drv_stream(h, ptds)?;
    copy_unified(&s, dst as usize, src as usize, n, wait)
}

#[no_mangle]
pub extern "C" fn cuMemcpy(dst: u64, src: u64, n: usize) -> CUresult {
    crate::api::driver(crate::api::Api::cuMemcpy, || {
        unified_c(dst, src, n, std::ptr::null_mut(), false, true)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpy_ptds(dst: u64, src: u64, n: usize) -> CUresult {
    crate::api::driver(crate::api::Api::cuMemcpy_ptds, || {
        unified_c(dst, src, n, std::ptr::null_mut(), true, true)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(dst: u64, src: u64, n: usize, h: *mut libc::c_void) -> CUresult {
    crate::api::driver(crate::api::Api::cuMemcpyAsync, || {
        unified_c(dst, src, n, h, false, false)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync_ptsz(
    dst: u64,
    src: u64,
    n: usize,
    h: *mut libc::c_void,
) -> CUresult {
    crate::api::driver(crate::api::Api::cuMemcpyAsync_ptsz, || {
        unified_c(dst, src, n, h, true, false)
    })
}
