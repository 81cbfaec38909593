//! The allocation families beyond `cuMemAlloc`: managed memory (`cuMemAllocManaged`,
//! `cudaMallocManaged`), pitched and 3D allocations (`cuMemAllocPitch_v2`,
//! `cudaMallocPitch`, `cudaMalloc3D`), memory pools (`cu/cudaDeviceGetDefaultMemPool`,
//! `cu/cudaMemPoolCreate`, `cu/cudaMemPoolDestroy`, `cu/cudaMallocFromPoolAsync`) and host
//! registration (`cuMemHostRegister_v2`/`cuMemHostUnregister`, `cudaHostRegister`/
//! `cudaHostUnregister`), behaving as CUDA documents them.
//!
//! Simplifications (documented, not hidden): managed memory is device memory of the current
//! device that the host can also touch (simcuda's device memory is host memory), charged on
//! the device ledger as if resident there; a pool allocation is a device allocation of the
//! pool's device made at once and freed (by `cu/cudaFreeAsync`) when the stream gets there,
//! with no release threshold; registration pins nothing (the range stays the program's) and
//! charges no ledger. Pitch is the width rounded up to 512 bytes (what current NVIDIA GPUs
//! give; CUDA documents only that the pitch is chosen for aligned, coalesced rows).
//!
//! Invariant: every block these make is an ordinary `memory` block, so `cuMemFree_v2`,
//! `cudaFree`, the async frees, copies and `cuMemGetInfo` treat it as CUDA does.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, runtime, Api};
use crate::driver_api::drv_stream;
use crate::driver_mem_api::mem_alloc;
use crate::error::*;
use crate::runtime_api::{rt_stream, rt_stream_ptds};
use crate::state::{current_device, device, runtime_device, Device};
use crate::types::MemAllocationProp;
use crate::{capture, memory};
use libc::{c_int, c_uint, c_void};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// `CU_MEM_ATTACH_GLOBAL` / `cudaMemAttachGlobal`, `..._HOST`.
const ATTACH_GLOBAL: c_uint = 1;
const ATTACH_HOST: c_uint = 2;
/// Pitch alignment.
pub const PITCH_ALIGN: usize = 512;
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` / `cudaErrorHostMemoryAlreadyRegistered`.
pub const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
/// `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED` / `cudaErrorHostMemoryNotRegistered`.
pub const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
/// `PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY`.
const REGISTER_FLAGS: c_uint = 0xF;

/// `cudaExtent`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Extent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaPitchedPtr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

fn managed(d: &Device, size: usize, flags: c_uint) -> Result<usize, CUresult> {
    if size == 0 || (flags != ATTACH_GLOBAL && flags != ATTACH_HOST) {
        return Err(INVALID_VALUE);
    }
    mem_alloc(d, size)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> CUresult {
    driver(Api::cuMemAllocManaged, || {
        let d = current_device()?;
        if dptr.is_null() {
            return Err(INVALID_VALUE);
        }
        out(dptr, managed(d, size, flags)? as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(
    p: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    runtime(Api::cudaMallocManaged, || {
        let d = runtime_device()?;
        if p.is_null() {
            return Err(INVALID_VALUE);
        }
        out(p, managed(d, size, flags)? as *mut c_void)
    })
}

fn pitch_of(width: usize) -> Result<usize, CUresult> {
    width
        .checked_next_multiple_of(PITCH_ALIGN)
        .ok_or(INVALID_VALUE)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CUresult {
    driver(Api::cuMemAllocPitch_v2, || {
        let d = current_device()?;
        if dptr.is_null() || pitch.is_null() || !matches!(element, 4 | 8 | 16) {
            return Err(INVALID_VALUE);
        }
        let pt = pitch_of(width)?;
        let size = pt.checked_mul(height).ok_or(INVALID_VALUE)?;
        let p = mem_alloc(d, size)?;
        out(pitch, pt)?;
        out(dptr, p as u64)
    })
}

/// A runtime pitched allocation of `pitch * rows` bytes; size 0 gives NULL and success, as
/// `cudaMalloc` does.
fn rt_pitched(width: usize, rows: usize) -> Result<(usize, usize), CUresult> {
    let d = runtime_device()?;
    let pt = pitch_of(width)?;
    let size = pt.checked_mul(rows).ok_or(INVALID_VALUE)?;
    if size == 0 {
        capture::check_unsafe_call()?;
        return Ok((0, pt));
    }
    Ok((mem_alloc(d, size)?, pt))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> CUresult {
    runtime(Api::cudaMallocPitch, || {
        if p.is_null() || pitch.is_null() {
            return Err(INVALID_VALUE);
        }
        let (a, pt) = rt_pitched(width, height)?;
        out(pitch, pt)?;
        out(p, a as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc3D(pp: *mut PitchedPtr, extent: Extent) -> CUresult {
    runtime(Api::cudaMalloc3D, || {
        if pp.is_null() {
            return Err(INVALID_VALUE);
        }
        let rows = extent
            .height
            .checked_mul(extent.depth)
            .ok_or(INVALID_VALUE)?;
        let (a, pt) = rt_pitched(extent.width, rows)?;
        out(
            pp,
            PitchedPtr {
                ptr: a as *mut c_void,
                pitch: pt,
                xsize: extent.width,
                ysize: extent.height,
            },
        )
    })
}

/// Live pools: handle -> device ordinal. Default pools are `DEFAULT_POOL + ordinal`.
static POOLS: Lazy<Mutex<BTreeMap<usize, usize>>> = Lazy::new(|| Mutex::new(BTreeMap::new()));
const DEFAULT_POOL: usize = 0x5000_0000;
const CREATED_POOL: usize = 0x6000_0000;
static NEXT_POOL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn pool_device(pool: *mut c_void) -> Result<&'static Device, CUresult> {
    let h = pool as usize;
    if let Some(o) = h.checked_sub(DEFAULT_POOL).filter(|&o| o < 0x1000) {
        return device(o).map_err(|_| INVALID_VALUE);
    }
    let o = *POOLS.lock().get(&h).ok_or(INVALID_VALUE)?;
    device(o)
}

fn default_pool(pool: *mut *mut c_void, dev: c_int) -> Result<(), CUresult> {
    crate::state::initialized()?;
    let o = usize::try_from(dev).map_err(|_| INVALID_DEVICE)?;
    device(o)?;
    out(pool, (DEFAULT_POOL + o) as *mut c_void)
}

/// `cuMemPoolCreate`: reads the location of `CUmemPoolProps` (laid out as
/// `CUmemAllocationProp` up to it).
fn pool_create(pool: *mut *mut c_void, props: *const MemAllocationProp) -> Result<(), CUresult> {
    if pool.is_null() || props.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, pointing at the caller's CUmemPoolProps, whose leading fields
    // (allocType, handleTypes, location) have the layout of MemAllocationProp's.
    let (ty, loc) = unsafe { ((*props).type_, (*props).location) };
    // `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
    if ty != 1 || loc.type_ != 1 {
        return Err(INVALID_VALUE);
    }
    let o = usize::try_from(loc.id).map_err(|_| INVALID_VALUE)?;
    device(o).map_err(|_| INVALID_VALUE)?;
    let h =
        CREATED_POOL + 0x100 * (NEXT_POOL.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
    POOLS.lock().insert(h, o);
    out(pool, h as *mut c_void)
}

fn pool_destroy(pool: *mut c_void) -> Result<(), CUresult> {
    POOLS
        .lock()
        .remove(&(pool as usize))
        .map(|_| ())
        .ok_or(INVALID_VALUE)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: c_int) -> CUresult {
    driver(Api::cuDeviceGetDefaultMemPool, || default_pool(pool, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetDefaultMemPool(
    pool: *mut *mut c_void,
    dev: c_int,
) -> CUresult {
    runtime(Api::cudaDeviceGetDefaultMemPool, || {
        runtime_device()?;
        default_pool(pool, dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut *mut c_void,
    props: *const MemAllocationProp,
) -> CUresult {
    driver(Api::cuMemPoolCreate, || {
        crate::state::initialized()?;
        pool_create(pool, props)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolCreate(
    pool: *mut *mut c_void,
    props: *const MemAllocationProp,
) -> CUresult {
    runtime(Api::cudaMemPoolCreate, || {
        runtime_device()?;
        pool_create(pool, props)
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CUresult {
    driver(Api::cuMemPoolDestroy, || pool_destroy(pool))
}

#[no_mangle]
pub extern "C" fn cudaMemPoolDestroy(pool: *mut c_void) -> CUresult {
    runtime(Api::cudaMemPoolDestroy, || pool_destroy(pool))
}

/// An allocation from `pool` in the order of stream `s` (checked by the caller).
fn from_pool(pool: *mut c_void, size: usize) -> Result<usize, CUresult> {
    let d = pool_device(pool)?;
    capture::check_unsafe_call()?;
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    memory::alloc(d, size)
}

fn drv_from_pool(
    dptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    h: *mut c_void,
    ptds: bool,
) -> Result<(), CUresult> {
    drv_stream(h, ptds)?;
    if dptr.is_null() {
        return Err(INVALID_VALUE);
    }
    out(dptr, from_pool(pool, size)? as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemAllocFromPoolAsync, || {
        drv_from_pool(dptr, size, pool, h, false)
    })
}

/// The per-thread default stream twin: a null stream is the calling thread's own.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    h: *mut c_void,
) -> CUresult {
    driver(Api::cuMemAllocFromPoolAsync_ptsz, || {
        drv_from_pool(dptr, size, pool, h, true)
    })
}

fn rt_from_pool(
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    h: *mut c_void,
    ptds: bool,
) -> Result<(), CUresult> {
    if ptds {
        rt_stream_ptds(h)?;
    } else {
        rt_stream(h)?;
    }
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    if size == 0 {
        return out(p, std::ptr::null_mut());
    }
    out(p, from_pool(pool, size)? as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMallocFromPoolAsync, || {
        rt_from_pool(p, size, pool, h, false)
    })
}

/// The per-thread default stream twin: a null stream is the calling thread's own.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocFromPoolAsync_ptsz(
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMallocFromPoolAsync_ptsz, || {
        rt_from_pool(p, size, pool, h, true)
    })
}

/// Registered host ranges: start -> (size, flags).
static REGISTERED: Lazy<Mutex<BTreeMap<usize, (usize, c_uint)>>> =
    Lazy::new(|| Mutex::new(BTreeMap::new()));

fn register(p: *mut c_void, size: usize, flags: c_uint) -> Result<(), CUresult> {
    if p.is_null() || size == 0 || flags & !REGISTER_FLAGS != 0 {
        return Err(INVALID_VALUE);
    }
    let a = p as usize;
    let end = a.checked_add(size).ok_or(INVALID_VALUE)?;
    let mut reg = REGISTERED.lock();
    let overlaps = reg
        .range(..end)
        .next_back()
        .is_some_and(|(&s, &(n, _))| s + n > a);
    if overlaps {
        return Err(HOST_MEMORY_ALREADY_REGISTERED);
    }
    reg.insert(a, (size, flags));
    Ok(())
}

fn unregister(p: *mut c_void) -> Result<(), CUresult> {
    REGISTERED
        .lock()
        .remove(&(p as usize))
        .map(|_| ())
        .ok_or(HOST_MEMORY_NOT_REGISTERED)
}

/// The registered range containing `addr`: (start, size, flags).
pub fn registered(addr: usize) -> Option<(usize, usize, c_uint)> {
    let reg = REGISTERED.lock();
    let (&a, &(n, f)) = reg.range(..=addr).next_back()?;
    (addr < a + n).then_some((a, n, f))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    driver(Api::cuMemHostRegister_v2, || {
        current_device()?;
        register(p, size, flags)
    })
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    driver(Api::cuMemHostUnregister, || {
        current_device()?;
        unregister(p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> CUresult {
    runtime(Api::cudaHostRegister, || {
        runtime_device()?;
        register(p, size, flags)
    })
}

#[no_mangle]
pub extern "C" fn cudaHostUnregister(p: *mut c_void) -> CUresult {
    runtime(Api::cudaHostUnregister, || {
        runtime_device()?;
        unregister(p)
    })
}
