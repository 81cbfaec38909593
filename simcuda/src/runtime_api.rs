//! Exported runtime entry points for devices, streams, events, capture, errors and versions.
//! Invariant: every function is built on internal Rust functions (never on simcuda's exported
//! `cu*` symbols, which a preloaded shim may interpose), initialises lazily by making the
//! device's primary context current, and records failures as the thread's last error.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{last_error, out, runtime, Api};
use crate::device_prop::DeviceProp;
use crate::driver_api::{attribute, device_name, end_capture, write_name, HostFn};
use crate::error::*;
use crate::state::{self, runtime_device};
use crate::stream::{self, Stream};
use crate::{capture, event};
use libc::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

/// The stream a runtime call names (on the runtime's current device).
pub fn rt_stream(h: *mut c_void) -> Result<Arc<Stream>, CUresult> {
    stream::resolve(runtime_device()?, h as usize, false)
}

/// The stream a `_ptsz` / `_ptds` runtime call names: 0 is the per-thread default stream.
pub fn rt_stream_ptds(h: *mut c_void) -> Result<Arc<Stream>, CUresult> {
    stream::resolve(runtime_device()?, h as usize, true)
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> CUresult {
    runtime(Api::cudaGetDeviceCount, || {
        if count.is_null() {
            return Err(INVALID_VALUE);
        }
        let n = state::device_count()?;
        out(count, n as c_int)?;
        if n == 0 {
            Err(NO_DEVICE)
        } else {
            Ok(())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(dev: *mut c_int) -> CUresult {
    runtime(Api::cudaGetDevice, || {
        if dev.is_null() {
            return Err(INVALID_VALUE);
        }
        out(dev, runtime_device()?.ordinal as c_int)
    })
}

#[no_mangle]
pub extern "C" fn cudaSetDevice(dev: c_int) -> CUresult {
    runtime(Api::cudaSetDevice, || state::runtime_set_device(dev))
}

fn device_props(prop: *mut c_void, dev: c_int) -> Result<(), CUresult> {
    if prop.is_null() {
        return Err(INVALID_VALUE);
    }
    runtime_device()?;
    let d = state::device(usize::try_from(dev).map_err(|_| INVALID_DEVICE)?)?;
    let a = |n| attribute(n, d.ordinal).ok().flatten().unwrap_or(0);
    // SAFETY: the caller passes a `struct cudaDeviceProp` (CUDA 12 layout, 1032 bytes,
    // which `DeviceProp` is); we zero it and fill every field.
    unsafe {
        std::ptr::write_bytes(prop as *mut u8, 0, std::mem::size_of::<DeviceProp>());
        let p = &mut *(prop as *mut DeviceProp);
        write_name(p.name.as_mut_ptr(), p.name.len(), &device_name(d.ordinal))?;
        p.uuid = crate::uuid::of(d.ordinal);
        p.total_global_mem = d.ledger.capacity as usize;
        crate::device_prop::fill(p, a);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties(prop: *mut c_void, dev: c_int) -> CUresult {
    runtime(Api::cudaGetDeviceProperties, || device_props(prop, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties_v2(prop: *mut c_void, dev: c_int) -> CUresult {
    runtime(Api::cudaGetDeviceProperties_v2, || device_props(prop, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetAttribute(
    v: *mut c_int,
    attr: c_int,
    dev: c_int,
) -> CUresult {
    runtime(Api::cudaDeviceGetAttribute, || {
        runtime_device()?;
        let d = state::device(usize::try_from(dev).map_err(|_| INVALID_DEVICE)?)?;
        out(v, attribute(attr, d.ordinal)?.ok_or(INVALID_VALUE)?)
    })
}

#[no_mangle]
pub extern "C" fn cudaDeviceSynchronize() -> CUresult {
    runtime(Api::cudaDeviceSynchronize, || {
        let d = runtime_device()?;
        capture::check_unsafe_call()?;
        stream::sync_device(d);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudaDeviceReset() -> CUresult {
    runtime(Api::cudaDeviceReset, || {
        crate::memory::reset(runtime_device()?.ordinal)
    })
}

fn stream_create(ph: *mut *mut c_void, flags: c_uint, priority: c_int) -> Result<(), CUresult> {
    if ph.is_null() {
        return Err(INVALID_VALUE);
    }
    let d = runtime_device()?;
    out(ph, stream::create(d, flags, priority)? as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(ph: *mut *mut c_void) -> CUresult {
    runtime(Api::cudaStreamCreate, || stream_create(ph, 0, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(
    ph: *mut *mut c_void,
    flags: c_uint,
) -> CUresult {
    runtime(Api::cudaStreamCreateWithFlags, || {
        stream_create(ph, flags, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(
    ph: *mut *mut c_void,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    runtime(Api::cudaStreamCreateWithPriority, || {
        stream_create(ph, flags, priority)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamDestroy(h: *mut c_void) -> CUresult {
    runtime(Api::cudaStreamDestroy, || {
        runtime_device()?;
        stream::destroy(h as usize)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamSynchronize(h: *mut c_void) -> CUresult {
    runtime(Api::cudaStreamSynchronize, || {
        stream::synchronize(&rt_stream(h)?)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamQuery(h: *mut c_void) -> CUresult {
    runtime(Api::cudaStreamQuery, || stream::query(&rt_stream(h)?))
}

#[no_mangle]
pub extern "C" fn cudaStreamWaitEvent(h: *mut c_void, ev: *mut c_void, flags: c_uint) -> CUresult {
    runtime(Api::cudaStreamWaitEvent, || {
        event::stream_wait(&rt_stream(h)?, ev as usize, flags)
    })
}

#[no_mangle]
pub extern "C" fn cudaStreamBeginCapture(h: *mut c_void, mode: c_uint) -> CUresult {
    runtime(Api::cudaStreamBeginCapture, || {
        capture::begin(&rt_stream(h)?, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(h: *mut c_void, graph: *mut *mut c_void) -> CUresult {
    runtime(Api::cudaStreamEndCapture, || {
        end_capture(&rt_stream(h)?, graph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing(h: *mut c_void, status: *mut c_uint) -> CUresult {
    runtime(Api::cudaStreamIsCapturing, || {
        if status.is_null() {
            return Err(INVALID_VALUE);
        }
        out(status, capture::status(&rt_stream(h)?)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult {
    runtime(Api::cudaThreadExchangeStreamCaptureMode, || {
        capture::exchange_mode(mode)
    })
}

fn event_create(ph: *mut *mut c_void, flags: c_uint) -> Result<(), CUresult> {
    if ph.is_null() {
        return Err(INVALID_VALUE);
    }
    runtime_device()?;
    out(ph, event::create(flags)? as *mut c_void)
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(ph: *mut *mut c_void) -> CUresult {
    runtime(Api::cudaEventCreate, || event_create(ph, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(ph: *mut *mut c_void, flags: c_uint) -> CUresult {
    runtime(Api::cudaEventCreateWithFlags, || event_create(ph, flags))
}

#[no_mangle]
pub extern "C" fn cudaEventRecord(ev: *mut c_void, h: *mut c_void) -> CUresult {
    runtime(Api::cudaEventRecord, || {
        event::record(ev as usize, &rt_stream(h)?)
    })
}

#[no_mangle]
pub extern "C" fn cudaEventQuery(ev: *mut c_void) -> CUresult {
    runtime(Api::cudaEventQuery, || {
        runtime_device()?;
        event::query(ev as usize)
    })
}

#[no_mangle]
pub extern "C" fn cudaEventSynchronize(ev: *mut c_void) -> CUresult {
    runtime(Api::cudaEventSynchronize, || {
        runtime_device()?;
        event::synchronize(ev as usize)
    })
}

#[no_mangle]
pub extern "C" fn cudaEventDestroy(ev: *mut c_void) -> CUresult {
    runtime(Api::cudaEventDestroy, || {
        runtime_device()?;
        event::destroy(ev as usize)
    })
}

#[no_mangle]
pub extern "C" fn cudaLaunchHostFunc(h: *mut c_void, f: HostFn, data: *mut c_void) -> CUresult {
    runtime(Api::cudaLaunchHostFunc, || {
        stream::host_func(&rt_stream(h)?, f, data)
    })
}

#[no_mangle]
pub extern "C" fn cudaGetLastError() -> CUresult {
    let mut code = SUCCESS;
    let rc = runtime(Api::cudaGetLastError, || {
        code = last_error(true);
        Ok(())
    });
    if rc != SUCCESS {
        return rc;
    }
    code
}

#[no_mangle]
pub extern "C" fn cudaPeekAtLastError() -> CUresult {
    let mut code = SUCCESS;
    let rc = runtime(Api::cudaPeekAtLastError, || {
        code = last_error(false);
        Ok(())
    });
    if rc != SUCCESS {
        return rc;
    }
    code
}

#[no_mangle]
pub extern "C" fn cudaGetErrorString(code: CUresult) -> *const c_char {
    let mut s = std::ptr::null();
    crate::api::driver(Api::cudaGetErrorString, || {
        s = runtime_string(code);
        Ok(())
    });
    s
}

#[no_mangle]
pub extern "C" fn cudaGetErrorName(code: CUresult) -> *const c_char {
    let mut s = std::ptr::null();
    crate::api::driver(Api::cudaGetErrorName, || {
        s = runtime_name(code);
        Ok(())
    });
    s
}

#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(v: *mut c_int) -> CUresult {
    runtime(Api::cudaDriverGetVersion, || {
        out(v, crate::version::cuda_version())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(v: *mut c_int) -> CUresult {
    runtime(Api::cudaRuntimeGetVersion, || {
        out(v, crate::version::cuda_version())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CUresult {
    runtime(Api::cudaEventElapsedTime, || {
        runtime_device()?;
        if ms.is_null() {
            return Err(INVALID_VALUE);
        }
        out(ms, event::elapsed(start as usize, end as usize)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    runtime(Api::cudaDeviceGetStreamPriorityRange, || {
        runtime_device()?;
        let (l, g) = crate::driver_api::PRIORITY_RANGE;
        if !least.is_null() {
            out(least, l)?;
        }
        if !greatest.is_null() {
            out(greatest, g)?;
        }
        Ok(())
    })
}
