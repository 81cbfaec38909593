//! The exported entry points by name, their call counters, and the guard every exported
//! function runs through. Invariant: each exported `extern "C"` function calls `driver` or
//! `runtime` exactly once with its own `Api` id, so `COUNTS[id]` is the number of calls the
//! program made to that exported name (internal calls never pass through here), and no panic
//! crosses the C boundary.

use crate::error::{CUresult, NOT_READY, SUCCESS, UNKNOWN};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! entry_points {
    ($($name:ident),* $(,)?) => {
        /// One id per exported entry point.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Api { $($name),* }
        /// Exported names, indexed by `Api as usize`.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

entry_points! {
    cuInit, cuDriverGetVersion, cuDeviceGet, cuDeviceGetCount, cuDeviceGetName,
    cuDeviceTotalMem_v2, cuDeviceGetAttribute, cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxGetState,
    cuCtxGetCurrent, cuCtxSetCurrent, cuCtxGetDevice, cuCtxSynchronize,
    cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, cuMemAllocHost_v2, cuMemHostAlloc,
    cuMemFreeHost, cuMemAddressReserve, cuMemAddressFree, cuMemCreate, cuMemRelease, cuMemMap,
    cuMemUnmap, cuMemSetAccess, cuMemGetAllocationGranularity, cuMemGetAddressRange_v2,
    cuPointerGetAttribute, cuPointerGetAttributes,
    cuMemAllocAsync, cuMemFreeAsync, cuMemAllocAsync_ptsz, cuMemFreeAsync_ptsz,
    cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoD_v2, cuMemsetD8_v2,
    cuMemcpyHtoD_v2_ptds, cuMemcpyDtoH_v2_ptds, cuMemcpyDtoD_v2_ptds, cuMemsetD8_v2_ptds,
    cuStreamCreate, cuStreamCreateWithPriority, cuStreamDestroy, cuStreamDestroy_v2,
    cuStreamSynchronize, cuStreamQuery, cuStreamWaitEvent,
    cuStreamSynchronize_ptsz, cuStreamQuery_ptsz, cuStreamWaitEvent_ptsz,
    cuStreamBeginCapture, cuStreamBeginCapture_v2, cuStreamBeginCapture_ptsz,
    cuStreamBeginCapture_v2_ptsz, cuStreamEndCapture, cuStreamEndCapture_ptsz,
    cuStreamIsCapturing, cuStreamIsCapturing_ptsz, cuThreadExchangeStreamCaptureMode,
    cuEventCreate, cuEventRecord, cuEventRecord_ptsz, cuEventQuery, cuEventSynchronize,
    cuEventDestroy, cuEventDestroy_v2, cuLaunchHostFunc, cuLaunchHostFunc_ptsz,
    cuGetErrorName, cuGetErrorString, cuGetProcAddress, cuGetProcAddress_v2, cuGetExportTable,
    cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2, cuMemcpyDtoDAsync_v2, cuMemsetD8Async,
    cuMemsetD32_v2, cuMemsetD32Async, cuMemHostGetDevicePointer_v2,
    cuEventElapsedTime, cuEventElapsedTime_v2, cuCtxGetStreamPriorityRange, cuStreamGetPriority, cuStreamGetFlags,
    cuCtxPushCurrent_v2, cuCtxPopCurrent_v2,
    cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoDAsync_v2_ptsz,
    cuMemsetD8Async_ptsz, cuMemsetD32_v2_ptds, cuMemsetD32Async_ptsz, cuStreamGetPriority_ptsz,
    cuStreamGetFlags_ptsz,
    cudaMalloc, cudaFree, cudaMallocHost, cudaHostAlloc, cudaFreeHost, cudaMallocAsync,
    cudaFreeAsync, cudaMemGetInfo, cudaMemcpy, cudaMemcpyAsync, cudaMemset, cudaMemsetAsync,
    cudaDeviceSynchronize, cudaDeviceReset, cudaGetDevice, cudaSetDevice, cudaGetDeviceCount,
    cudaGetDeviceProperties, cudaGetDeviceProperties_v2, cudaDeviceGetAttribute,
    cudaStreamCreate, cudaStreamCreateWithFlags, cudaStreamCreateWithPriority,
    cudaStreamDestroy, cudaStreamSynchronize, cudaStreamQuery, cudaStreamWaitEvent,
    cudaStreamBeginCapture, cudaStreamEndCapture, cudaStreamIsCapturing,
    cudaThreadExchangeStreamCaptureMode,
    cudaEventCreate, cudaEventCreateWithFlags, cudaEventRecord, cudaEventQuery,
    cudaEventSynchronize, cudaEventDestroy, cudaLaunchHostFunc, cudaGetLastError,
    cudaPeekAtLastError, cudaGetErrorString, cudaGetErrorName, cudaPointerGetAttributes,
    cudaDriverGetVersion, cudaRuntimeGetVersion, cudaEventElapsedTime,
    cudaDeviceGetStreamPriorityRange,
    cudaMemcpy_ptds, cudaMemset_ptds, cudaMemcpyAsync_ptsz, cudaMemsetAsync_ptsz,
    cudaStreamQuery_ptsz, cudaStreamSynchronize_ptsz, cudaStreamWaitEvent_ptsz,
    cudaEventRecord_ptsz, cudaLaunchHostFunc_ptsz, cudaStreamBeginCapture_ptsz,
    cudaStreamEndCapture_ptsz, cudaStreamIsCapturing_ptsz, cudaMallocAsync_ptsz,
    cudaFreeAsync_ptsz,
    cuMemAllocManaged, cudaMallocManaged, cuMemAllocPitch_v2, cudaMallocPitch, cudaMalloc3D,
    cuDeviceGetDefaultMemPool, cudaDeviceGetDefaultMemPool, cuMemPoolCreate, cudaMemPoolCreate,
    cuMemPoolDestroy, cudaMemPoolDestroy, cuMemAllocFromPoolAsync, cudaMallocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz, cudaMallocFromPoolAsync_ptsz,
    cuMemHostRegister_v2, cuMemHostUnregister, cudaHostRegister, cudaHostUnregister,
    cuDeviceGetUuid, cuDeviceGetUuid_v2, cuMemcpy, cuMemcpy_ptds, cuMemcpyAsync, cuMemcpyAsync_ptsz,
    cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle,
    cudaIpcGetMemHandle, cudaIpcOpenMemHandle, cudaIpcCloseMemHandle,
    cuDeviceCanAccessPeer, cuCtxEnablePeerAccess, cuCtxDisablePeerAccess, cuMemcpyPeer,
    cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess, cudaDeviceDisablePeerAccess,
    cudaMemcpyPeer, cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
    cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle, cuMemGetAccess,
    cuMemcpyPeer_ptds, cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, cudaMemcpyPeerAsync,
}

/// Number of entry points.
pub const COUNT: usize = NAMES.len();

static COUNTS: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

/// The id of an exported name.
pub fn by_name(name: &str) -> Option<usize> {
    NAMES.iter().position(|n| *n == name)
}

/// How often each entry point was called so far.
pub fn count_of(id: usize) -> u64 {
    COUNTS.get(id).map_or(0, |c| c.load(Ordering::Relaxed))
}

/// Count the call, apply the latency model, and return an injected failure if the fault
/// plan says this call fails.
fn enter(api: Api) -> Option<CUresult> {
    let id = api as usize;
    crate::after_fork::check(NAMES[id]);
    let n = COUNTS[id].fetch_add(1, Ordering::Relaxed) + 1;
    crate::latency::apply(id);
    crate::fault::check(id, n)
}

fn guarded(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Run a driver entry point.
pub fn driver(api: Api, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    if let Some(code) = enter(api) {
        return code;
    }
    guarded(f)
}

thread_local! {
    static LAST_ERROR: Cell<CUresult> = const { Cell::new(SUCCESS) };
}

/// Run a runtime entry point; a failure (other than "not ready") becomes the thread's last
/// error, as cudart does.
pub fn runtime(api: Api, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    let code = match enter(api) {
        Some(code) => code,
        None => guarded(f),
    };
    if code != SUCCESS && code != NOT_READY {
        LAST_ERROR.with(|e| e.set(code));
    }
    code
}

/// The thread's last runtime error; `reset` clears it (cudaGetLastError).
pub fn last_error(reset: bool) -> CUresult {
    LAST_ERROR.with(|e| if reset { e.replace(SUCCESS) } else { e.get() })
}

/// Write `value` through a C out-pointer, or fail with `INVALID_VALUE` if it is NULL.
pub fn out<T>(ptr: *mut T, value: T) -> Result<(), CUresult> {
    if ptr.is_null() {
        return Err(crate::error::INVALID_VALUE);
    }
    // SAFETY: the caller passed a non-NULL out-pointer for a T, as the C API requires.
    unsafe { ptr.write(value) };
    Ok(())
}
