//! The runtime's per-thread-default-stream entry points (`_ptds` / `_ptsz`), which NVIDIA's
//! headers select under `CUDA_API_PER_THREAD_DEFAULT_STREAM` (nvcc
//! `--default-stream per-thread`). Invariant: each behaves as its plain twin except that
//! stream handle 0 means the calling thread's per-thread default stream.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{out, runtime, Api};
use crate::driver_api::{end_capture, HostFn};
use crate::error::*;
use crate::runtime_api::rt_stream_ptds;
use crate::runtime_mem_api::{free_async_on, malloc_async_on, memcpy_on, memset_on, Default0};
use crate::{capture, event, stream};
use libc::{c_int, c_uint, c_void};

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy_ptds(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
) -> CUresult {
    runtime(Api::cudaMemcpy_ptds, || {
        memcpy_on(
            dst,
            src,
            n,
            kind,
            std::ptr::null_mut(),
            Default0::PerThread,
            true,
        )
    })
}

#[no_mangle]
pub extern "C" fn cudaMemset_ptds(dst: *mut c_void, value: c_int, n: usize) -> CUresult {
    runtime(Api::cudaMemset_ptds, || {
        memset_on(
            dst,
            value,
            n,
            std::ptr::null_mut(),
            Default0::PerThread,
            true,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync_ptsz(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMemcpyAsync_ptsz, || {
        memcpy_on(dst, src, n, kind, h, Default0::PerThread, false)
    })
}

#[no_mangle]
pub extern "C" fn cudaMemsetAsync_ptsz(
    dst: *mut c_void,
    value: c_int,
    n: usize,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMemsetAsync_ptsz, || {
        memset_on(dst, value, n, h, Default0::PerThread, false)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamQuery_ptsz(h: *mut c_void) -> CUresult {
    runtime(Api::cudaStreamQuery_ptsz, || {
        stream::query(&rt_stream_ptds(h)?)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamSynchronize_ptsz(h: *mut c_void) -> CUresult {
    runtime(Api::cudaStreamSynchronize_ptsz, || {
        stream::synchronize(&rt_stream_ptds(h)?)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamWaitEvent_ptsz(
    h: *mut c_void,
    ev: *mut c_void,
    flags: c_uint,
) -> CUresult {
    runtime(Api::cudaStreamWaitEvent_ptsz, || {
        event::stream_wait(&rt_stream_ptds(h)?, ev as usize, flags)
    })
}

#[no_mangle]
pub extern "C" fn cudaEventRecord_ptsz(ev: *mut c_void, h: *mut c_void) -> CUresult {
    runtime(Api::cudaEventRecord_ptsz, || {
        event::record(ev as usize, &rt_stream_ptds(h)?)
    })
}

#[no_mangle]
pub extern "C" fn cudaLaunchHostFunc_ptsz(
    h: *mut c_void,
    f: HostFn,
    data: *mut c_void,
) -> CUresult {
    runtime(Api::cudaLaunchHostFunc_ptsz, || {
        stream::host_func(&rt_stream_ptds(h)?, f, data)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamBeginCapture_ptsz(h: *mut c_void, mode: c_uint) -> CUresult {
    runtime(Api::cudaStreamBeginCapture_ptsz, || {
        capture::begin(&rt_stream_ptds(h)?, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(
    h: *mut c_void,
    graph: *mut *mut c_void,
) -> CUresult {
    runtime(Api::cudaStreamEndCapture_ptsz, || {
        end_capture(&rt_stream_ptds(h)?, graph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing_ptsz(
    h: *mut c_void,
    status: *mut c_uint,
) -> CUresult {
    runtime(Api::cudaStreamIsCapturing_ptsz, || {
        if status.is_null() {
            return Err(INVALID_VALUE);
        }
        out(status, capture::status(&rt_stream_ptds(h)?)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(
    p: *mut *mut c_void,
    size: usize,
    h: *mut c_void,
) -> CUresult {
    runtime(Api::cudaMallocAsync_ptsz, || {
        malloc_async_on(p, size, h, Default0::PerThread)
    })
}

#[no_mangle]
pub extern "C" fn cudaFreeAsync_ptsz(p: *mut c_void, h: *mut c_void) -> CUresult {
    runtime(Api::cudaFreeAsync_ptsz, || {
        free_async_on(p, h, Default0::PerThread)
    })
}
