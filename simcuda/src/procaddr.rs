//! `cuGetProcAddress` / `cuGetProcAddress_v2`: simcuda's own entry points by base name and
//! requested CUDA version, as the real driver answers (per-thread-default-stream variants
//! for flag 2). Invariant: every name listed here is an exported function of this library;
//! names not listed answer `CUDA_ERROR_NOT_FOUND` with a NULL pointer.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, Api};
use crate::driver_api::*;
use crate::driver_mem_api::*;
use crate::error::*;
use crate::families::*;
use crate::pointer_api::*;
use libc::{c_char, c_int, c_void};
use once_cell::sync::Lazy;
use std::ffi::CStr;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_FLAG: u64 = 2;
/// `CUdriverProcAddressQueryResult`.
const SYMBOL_SUCCESS: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

struct Entry {
    base: &'static str,
    since: c_int,
    per_thread: bool,
    f: usize,
}

macro_rules! e {
    ($base:literal, $since:literal, $ptds:literal, $f:expr) => {
        Entry {
            base: $base,
            since: $since,
            per_thread: $ptds,
            f: $f as usize,
        }
    };
}

#[rustfmt::skip]
static TABLE: Lazy<Vec<Entry>> = Lazy::new(|| {
    vec![
        e!("cuInit", 2000, false, cuInit as extern "C" fn(_) -> _),
        e!("cuDriverGetVersion", 2020, false, cuDriverGetVersion as unsafe extern "C" fn(_) -> _),
        e!("cuDeviceGet", 2000, false, cuDeviceGet as unsafe extern "C" fn(_, _) -> _),
        e!("cuDeviceGetCount", 2000, false, cuDeviceGetCount as unsafe extern "C" fn(_) -> _),
        e!("cuDeviceGetName", 2000, false, cuDeviceGetName as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuDeviceTotalMem", 3020, false, cuDeviceTotalMem_v2 as unsafe extern "C" fn(_, _) -> _),
        e!("cuDeviceGetAttribute", 2000, false, cuDeviceGetAttribute as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuDevicePrimaryCtxRetain", 7000, false, cuDevicePrimaryCtxRetain as unsafe extern "C" fn(_, _) -> _),
        e!("cuDevicePrimaryCtxRelease", 7000, false, cuDevicePrimaryCtxRelease as extern "C" fn(_) -> _),
        e!("cuDevicePrimaryCtxRelease", 11000, false, cuDevicePrimaryCtxRelease_v2 as extern "C" fn(_) -> _),
        e!("cuDevicePrimaryCtxGetState", 7000, false, cuDevicePrimaryCtxGetState as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuCtxGetCurrent", 4000, false, cuCtxGetCurrent as unsafe extern "C" fn(_) -> _),
        e!("cuCtxSetCurrent", 4000, false, cuCtxSetCurrent as extern "C" fn(_) -> _),
        e!("cuCtxGetDevice", 2000, false, cuCtxGetDevice as unsafe extern "C" fn(_) -> _),
        e!("cuCtxSynchronize", 2000, false, cuCtxSynchronize as extern "C" fn() -> _),
        e!("cuMemAlloc", 3020, false, cuMemAlloc_v2 as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemFree", 3020, false, cuMemFree_v2 as extern "C" fn(_) -> _),
        e!("cuMemGetInfo", 3020, false, cuMemGetInfo_v2 as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemAllocHost", 3020, false, cuMemAllocHost_v2 as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemHostAlloc", 2020, false, cuMemHostAlloc as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemFreeHost", 2000, false, cuMemFreeHost as extern "C" fn(_) -> _),
        e!("cuMemAddressReserve", 10020, false, cuMemAddressReserve as unsafe extern "C" fn(_, _, _, _, _) -> _),
        e!("cuMemAddressFree", 10020, false, cuMemAddressFree as extern "C" fn(_, _) -> _),
        e!("cuMemCreate", 10020, false, cuMemCreate as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemRelease", 10020, false, cuMemRelease as extern "C" fn(_) -> _),
        e!("cuMemMap", 10020, false, cuMemMap as extern "C" fn(_, _, _, _, _) -> _),
        e!("cuMemUnmap", 10020, false, cuMemUnmap as extern "C" fn(_, _) -> _),
        e!("cuMemSetAccess", 10020, false, cuMemSetAccess as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemGetAllocationGranularity", 10020, false, cuMemGetAllocationGranularity as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemGetAddressRange", 3020, false, cuMemGetAddressRange_v2 as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuPointerGetAttribute", 4000, false, cuPointerGetAttribute as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuPointerGetAttributes", 7000, false, cuPointerGetAttributes as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemAllocAsync", 11020, false, cuMemAllocAsync as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemAllocAsync", 11020, true, cuMemAllocAsync_ptsz as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemFreeAsync", 11020, false, cuMemFreeAsync as extern "C" fn(_, _) -> _),
        e!("cuMemFreeAsync", 11020, true, cuMemFreeAsync_ptsz as extern "C" fn(_, _) -> _),
        e!("cuMemcpyHtoD", 3020, false, cuMemcpyHtoD_v2 as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyHtoD", 7000, true, cuMemcpyHtoD_v2_ptds as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyDtoH", 3020, false, cuMemcpyDtoH_v2 as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyDtoH", 7000, true, cuMemcpyDtoH_v2_ptds as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyDtoD", 3020, false, cuMemcpyDtoD_v2 as extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyDtoD", 7000, true, cuMemcpyDtoD_v2_ptds as extern "C" fn(_, _, _) -> _),
        e!("cuMemsetD8", 3020, false, cuMemsetD8_v2 as extern "C" fn(_, _, _) -> _),
        e!("cuMemsetD8", 7000, true, cuMemsetD8_v2_ptds as extern "C" fn(_, _, _) -> _),
        e!("cuStreamCreate", 2000, false, cuStreamCreate as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamCreateWithPriority", 5050, false, cuStreamCreateWithPriority as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuStreamDestroy", 2000, false, cuStreamDestroy as extern "C" fn(_) -> _),
        e!("cuStreamDestroy", 4000, false, cuStreamDestroy_v2 as extern "C" fn(_) -> _),
        e!("cuStreamSynchronize", 2000, false, cuStreamSynchronize as extern "C" fn(_) -> _),
        e!("cuStreamSynchronize", 7000, true, cuStreamSynchronize_ptsz as extern "C" fn(_) -> _),
        e!("cuStreamQuery", 2000, false, cuStreamQuery as extern "C" fn(_) -> _),
        e!("cuStreamQuery", 7000, true, cuStreamQuery_ptsz as extern "C" fn(_) -> _),
        e!("cuStreamWaitEvent", 3020, false, cuStreamWaitEvent as extern "C" fn(_, _, _) -> _),
        e!("cuStreamWaitEvent", 7000, true, cuStreamWaitEvent_ptsz as extern "C" fn(_, _, _) -> _),
        e!("cuStreamBeginCapture", 10000, false, cuStreamBeginCapture as extern "C" fn(_) -> _),
        e!("cuStreamBeginCapture", 10000, true, cuStreamBeginCapture_ptsz as extern "C" fn(_) -> _),
        e!("cuStreamBeginCapture", 10010, false, cuStreamBeginCapture_v2 as extern "C" fn(_, _) -> _),
        e!("cuStreamBeginCapture", 10010, true, cuStreamBeginCapture_v2_ptsz as extern "C" fn(_, _) -> _),
        e!("cuStreamEndCapture", 10000, false, cuStreamEndCapture as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamEndCapture", 10000, true, cuStreamEndCapture_ptsz as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamIsCapturing", 10000, false, cuStreamIsCapturing as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamIsCapturing", 10000, true, cuStreamIsCapturing_ptsz as unsafe extern "C" fn(_, _) -> _),
        e!("cuThreadExchangeStreamCaptureMode", 10010, false, cuThreadExchangeStreamCaptureMode as unsafe extern "C" fn(_) -> _),
        e!("cuEventCreate", 2000, false, cuEventCreate as unsafe extern "C" fn(_, _) -> _),
        e!("cuEventRecord", 2000, false, cuEventRecord as extern "C" fn(_, _) -> _),
        e!("cuEventRecord", 7000, true, cuEventRecord_ptsz as extern "C" fn(_, _) -> _),
        e!("cuEventQuery", 2000, false, cuEventQuery as extern "C" fn(_) -> _),
        e!("cuEventSynchronize", 2000, false, cuEventSynchronize as extern "C" fn(_) -> _),
        e!("cuEventDestroy", 2000, false, cuEventDestroy as extern "C" fn(_) -> _),
        e!("cuEventDestroy", 4000, false, cuEventDestroy_v2 as extern "C" fn(_) -> _),
        e!("cuLaunchHostFunc", 10000, false, cuLaunchHostFunc as extern "C" fn(_, _, _) -> _),
        e!("cuLaunchHostFunc", 10000, true, cuLaunchHostFunc_ptsz as extern "C" fn(_, _, _) -> _),
        e!("cuGetErrorName", 6000, false, cuGetErrorName as unsafe extern "C" fn(_, _) -> _),
        e!("cuGetErrorString", 6000, false, cuGetErrorString as unsafe extern "C" fn(_, _) -> _),
        e!("cuGetProcAddress", 11030, false, cuGetProcAddress as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuGetProcAddress", 12000, false, cuGetProcAddress_v2 as unsafe extern "C" fn(_, _, _, _, _) -> _),
        e!("cuMemcpyHtoDAsync", 3020, false, cuMemcpyHtoDAsync_v2 as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemcpyDtoHAsync", 3020, false, cuMemcpyDtoHAsync_v2 as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemcpyDtoDAsync", 3020, false, cuMemcpyDtoDAsync_v2 as extern "C" fn(_, _, _, _) -> _),
        e!("cuMemsetD8Async", 3020, false, cuMemsetD8Async as extern "C" fn(_, _, _, _) -> _),
        e!("cuMemsetD32", 3020, false, cuMemsetD32_v2 as extern "C" fn(_, _, _) -> _),
        e!("cuMemsetD32Async", 3020, false, cuMemsetD32Async as extern "C" fn(_, _, _, _) -> _),
        e!("cuMemHostGetDevicePointer", 3020, false, cuMemHostGetDevicePointer_v2 as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyHtoDAsync", 7000, true, cuMemcpyHtoDAsync_v2_ptsz as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemcpyDtoHAsync", 7000, true, cuMemcpyDtoHAsync_v2_ptsz as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemcpyDtoDAsync", 7000, true, cuMemcpyDtoDAsync_v2_ptsz as extern "C" fn(_, _, _, _) -> _),
        e!("cuMemsetD8Async", 7000, true, cuMemsetD8Async_ptsz as extern "C" fn(_, _, _, _) -> _),
        e!("cuMemsetD32", 7000, true, cuMemsetD32_v2_ptds as extern "C" fn(_, _, _) -> _),
        e!("cuMemsetD32Async", 7000, true, cuMemsetD32Async_ptsz as extern "C" fn(_, _, _, _) -> _),
        e!("cuStreamGetPriority", 7000, true, cuStreamGetPriority_ptsz as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamGetFlags", 7000, true, cuStreamGetFlags_ptsz as unsafe extern "C" fn(_, _) -> _),
        e!("cuEventElapsedTime", 2000, false, cuEventElapsedTime as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuCtxGetStreamPriorityRange", 5050, false, cuCtxGetStreamPriorityRange as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamGetPriority", 5050, false, cuStreamGetPriority as unsafe extern "C" fn(_, _) -> _),
        e!("cuStreamGetFlags", 5050, false, cuStreamGetFlags as unsafe extern "C" fn(_, _) -> _),
        e!("cuCtxPushCurrent", 4000, false, cuCtxPushCurrent_v2 as extern "C" fn(_) -> _),
        e!("cuCtxPopCurrent", 4000, false, cuCtxPopCurrent_v2 as unsafe extern "C" fn(_) -> _),
        e!("cuGetExportTable", 3000, false, cuGetExportTable as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemAllocManaged", 6000, false, cuMemAllocManaged as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemAllocPitch", 3020, false, cuMemAllocPitch_v2 as unsafe extern "C" fn(_, _, _, _, _) -> _),
        e!("cuDeviceGetDefaultMemPool", 11020, false, cuDeviceGetDefaultMemPool as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemPoolCreate", 11020, false, cuMemPoolCreate as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemPoolDestroy", 11020, false, cuMemPoolDestroy as extern "C" fn(_) -> _),
        e!("cuMemAllocFromPoolAsync", 11020, false, cuMemAllocFromPoolAsync as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemAllocFromPoolAsync", 11020, true, cuMemAllocFromPoolAsync_ptsz as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemHostRegister", 6050, false, cuMemHostRegister_v2 as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemHostUnregister", 4000, false, cuMemHostUnregister as extern "C" fn(_) -> _),
        e!("cuDeviceGetUuid", 9020, false, crate::uuid::cuDeviceGetUuid as unsafe extern "C" fn(_, _) -> _),
        e!("cuDeviceGetUuid", 11040, false, crate::uuid::cuDeviceGetUuid_v2 as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemcpy", 4000, false, crate::copy::cuMemcpy as extern "C" fn(_, _, _) -> _),
        e!("cuMemcpy", 7000, true, crate::copy::cuMemcpy_ptds as extern "C" fn(_, _, _) -> _),
        e!("cuMemcpyAsync", 4000, false, crate::copy::cuMemcpyAsync as extern "C" fn(_, _, _, _) -> _),
        e!("cuMemcpyAsync", 7000, true, crate::copy::cuMemcpyAsync_ptsz as extern "C" fn(_, _, _, _) -> _),
        e!("cuIpcGetMemHandle", 4010, false, crate::ipc::cuIpcGetMemHandle as unsafe extern "C" fn(_, _) -> _),
        e!("cuIpcOpenMemHandle", 4010, false, crate::ipc::cuIpcOpenMemHandle as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuIpcOpenMemHandle", 11000, false, crate::ipc::cuIpcOpenMemHandle_v2 as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuIpcCloseMemHandle", 4010, false, crate::ipc::cuIpcCloseMemHandle as extern "C" fn(_) -> _),
        e!("cuDeviceCanAccessPeer", 4000, false, crate::peer::cuDeviceCanAccessPeer as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuCtxEnablePeerAccess", 4000, false, crate::peer::cuCtxEnablePeerAccess as extern "C" fn(_, _) -> _),
        e!("cuCtxDisablePeerAccess", 4000, false, crate::peer::cuCtxDisablePeerAccess as extern "C" fn(_) -> _),
        e!("cuMemcpyPeer", 4000, false, crate::peer::cuMemcpyPeer as extern "C" fn(_, _, _, _, _) -> _),
        e!("cuMemcpyPeer", 7000, true, crate::peer::cuMemcpyPeer_ptds as extern "C" fn(_, _, _, _, _) -> _),
        e!("cuMemcpyPeerAsync", 4000, false, crate::peer::cuMemcpyPeerAsync as extern "C" fn(_, _, _, _, _, _) -> _),
        e!("cuMemcpyPeerAsync", 7000, true, crate::peer::cuMemcpyPeerAsync_ptsz as extern "C" fn(_, _, _, _, _, _) -> _),
        e!("cuMemExportToShareableHandle", 10020, false, crate::vmm_share::cuMemExportToShareableHandle as unsafe extern "C" fn(_, _, _, _) -> _),
        e!("cuMemImportFromShareableHandle", 10020, false, crate::vmm_share::cuMemImportFromShareableHandle as unsafe extern "C" fn(_, _, _) -> _),
        e!("cuMemRetainAllocationHandle", 11000, false, crate::vmm_share::cuMemRetainAllocationHandle as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemGetAllocationPropertiesFromHandle", 10020, false, crate::vmm_share::cuMemGetAllocationPropertiesFromHandle as unsafe extern "C" fn(_, _) -> _),
        e!("cuMemGetAccess", 10020, false, crate::vmm_share::cuMemGetAccess as unsafe extern "C" fn(_, _, _) -> _),
    ]
});

/// Resolve `name` at `version` with `flags`: the entry point, or the query status why not.
pub fn lookup(name: &str, version: c_int, flags: u64) -> Result<usize, c_int> {
    let want_ptds = flags & PER_THREAD_FLAG != 0;
    let mut known = false;
    let mut best: Option<&Entry> = None;
    for e in TABLE.iter().filter(|e| e.base == name) {
        known = true;
        if e.since > version || (e.per_thread && !want_ptds) {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => (e.per_thread, e.since) > (b.per_thread, b.since),
        };
        if better {
            best = Some(e);
        }
    }
    match best {
        Some(e) => Ok(e.f),
        None if known => Err(VERSION_NOT_SUFFICIENT),
        None => Err(SYMBOL_NOT_FOUND),
    }
}

fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Result<(), CUresult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated symbol name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let r = lookup(name, version, flags);
    // SAFETY: `pfn` is non-NULL; `status` is checked before writing.
    unsafe {
        *pfn = r.map_or(std::ptr::null_mut(), |f| f as *mut c_void);
        if !status.is_null() {
            *status = r.map_or_else(|s| s, |_| SYMBOL_SUCCESS);
        }
    }
    r.map(|_| ()).map_err(|_| NOT_FOUND)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    driver(Api::cuGetProcAddress, || {
        get_proc(symbol, pfn, version, flags, std::ptr::null_mut())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    driver(Api::cuGetProcAddress_v2, || {
        get_proc(symbol, pfn, version, flags, status)
    })
}

/// simcuda has none of NVIDIA's private export tables: every UUID is not found.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const c_void,
) -> CUresult {
    driver(Api::cuGetExportTable, || {
        if table.is_null() || id.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: non-NULL out-pointer.
        unsafe { *table = std::ptr::null() };
        Err(NOT_FOUND)
    })
}
