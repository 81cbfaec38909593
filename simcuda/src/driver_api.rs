//! Exported driver entry points for initialisation, devices, contexts, streams, events,
//! capture and errors. Invariant: each function is a thin C decoder over internal modules,
//! runs through `api::driver` (count, latency, faults, panic guard) and follows the driver's
//! strictness: NOT_INITIALIZED before `cuInit`, INVALID_CONTEXT without a current context.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, Api};
use crate::error::*;
use crate::state::{self, current_device, driver_device, Ctx};
use crate::stream::{self, Stream};
use crate::{capture, event};
use libc::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

/// A device attribute's value (`cuDeviceGetAttribute`), `None` when unknown.
pub fn attribute(attr: c_int, ordinal: usize) -> Result<Option<c_int>, CUresult> {
    let vmm = state::state()?.config.vmm;
    Ok(crate::attributes::value(attr, ordinal, vmm))
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    driver(Api::cuInit, || state::init(flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    driver(Api::cuDriverGetVersion, || {
        out(v, crate::version::cuda_version())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CUresult {
    driver(Api::cuDeviceGet, || {
        let d = driver_device(ordinal)?;
        out(dev, d.ordinal as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    driver(Api::cuDeviceGetCount, || {
        out(count, state::initialized()?.devices.len() as c_int)
    })
}

/// Copy `name` NUL-terminated into `buf` of `len` bytes (truncating).
pub fn write_name(buf: *mut c_char, len: usize, name: &str) -> Result<(), CUresult> {
    if buf.is_null() || len == 0 {
        return Err(INVALID_VALUE);
    }
    let n = name.len().min(len - 1);
    // SAFETY: the caller gave `len` writable bytes at `buf`; we write n + 1 <= len of them.
    unsafe {
        std::ptr::copy_nonoverlapping(name.as_ptr() as *const c_char, buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// The name of device `ordinal`.
pub fn device_name(ordinal: usize) -> String {
    format!("simcuda Device {ordinal}")
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    driver(Api::cuDeviceGetName, || {
        let d = driver_device(dev)?;
        write_name(
            name,
            usize::try_from(len).map_err(|_| INVALID_VALUE)?,
            &device_name(d.ordinal),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    driver(Api::cuDeviceTotalMem_v2, || {
        let d = driver_device(dev)?;
        out(bytes, d.ledger.capacity as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attr: c_int, dev: c_int) -> CUresult {
    driver(Api::cuDeviceGetAttribute, || {
        let d = driver_device(dev)?;
        let v = attribute(attr, d.ordinal)?.ok_or(INVALID_VALUE)?;
        out(pi, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut *mut Ctx, dev: c_int) -> CUresult {
    driver(Api::cuDevicePrimaryCtxRetain, || {
        let d = driver_device(dev)?;
        out(pctx, state::ctx_handle(d))?;
        d.primary_refs
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    })
}

fn primary_release(dev: c_int) -> Result<(), CUresult> {
    let d = driver_device(dev)?;
    d.primary_refs
        .fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |n| n.checked_sub(1),
        )
        .map(|_| ())
        .map_err(|_| INVALID_CONTEXT)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: c_int) -> CUresult {
    driver(Api::cuDevicePrimaryCtxRelease, || primary_release(dev))
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    driver(Api::cuDevicePrimaryCtxRelease_v2, || primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    driver(Api::cuDevicePrimaryCtxGetState, || {
        let d = driver_device(dev)?;
        out(flags, 0)?;
        out(
            active,
            (d.primary_refs.load(std::sync::atomic::Ordering::Acquire) > 0) as c_int,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut *mut Ctx) -> CUresult {
    driver(Api::cuCtxGetCurrent, || out(pctx, state::current_ctx()?))
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut Ctx) -> CUresult {
    driver(Api::cuCtxSetCurrent, || state::set_current(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CUresult {
    driver(Api::cuCtxGetDevice, || {
        out(dev, current_device()?.ordinal as c_int)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    driver(Api::cuCtxSynchronize, || {
        let d = current_device()?;
        capture::check_unsafe_call()?;
        stream::sync_device(d);
        Ok(())
    })
}

/// The stream a driver call names, on the current context.
pub fn drv_stream(h: *mut c_void, ptds: bool) -> Result<Arc<Stream>, CUresult> {
    stream::resolve(current_device()?, h as usize, ptds)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut *mut c_void, flags: c_uint) -> CUresult {
    driver(Api::cuStreamCreate, || {
        let d = current_device()?;
        if ph.is_null() {
            return Err(INVALID_VALUE);
        }
        out(ph, stream::create(d, flags, 0)? as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut *mut c_void,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    driver(Api::cuStreamCreateWithPriority, || {
        let d = current_device()?;
        if ph.is_null() {
            return Err(INVALID_VALUE);
        }
        out(ph, stream::create(d, flags, priority)? as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy(h: *mut c_void) -> CUresult {
    driver(Api::cuStreamDestroy, || {
        state::initialized()?;
        stream::destroy(h as usize)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(h: *mut c_void) -> CUresult {
    driver(Api::cuStreamDestroy_v2, || {
        state::initialized()?;
        stream::destroy(h as usize)
    })
}

macro_rules! stream_fn {
    ($name:ident, $ptds:expr, |$s:ident| $body:expr) => {
        #[no_mangle]
        pub extern "C" fn $name(h: *mut c_void) -> CUresult {
            driver(Api::$name, || {
                let $s = drv_stream(h, $ptds)?;
                $body
            })
        }
    };
}

stream_fn!(cuStreamSynchronize, false, |s| stream::synchronize(&s));
stream_fn!(cuStreamSynchronize_ptsz, true, |s| stream::synchronize(&s));
stream_fn!(cuStreamQuery, false, |s| stream::query(&s));
stream_fn!(cuStreamQuery_ptsz, true, |s| stream::query(&s));
stream_fn!(cuStreamBeginCapture, false, |s| capture::begin(
    &s,
    capture::MODE_GLOBAL
));
stream_fn!(cuStreamBeginCapture_ptsz, true, |s| capture::begin(
    &s,
    capture::MODE_GLOBAL
));

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(h: *mut c_void, ev: *mut c_void, flags: c_uint) -> CUresult {
    driver(Api::cuStreamWaitEvent, || {
        event::stream_wait(&drv_stream(h, false)?, ev as usize, flags)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent_ptsz(
    h: *mut c_void,
    ev: *mut c_void,
    flags: c_uint,
) -> CUresult {
    driver(Api::cuStreamWaitEvent_ptsz, || {
        event::stream_wait(&drv_stream(h, true)?, ev as usize, flags)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(h: *mut c_void, mode: c_uint) -> CUresult {
    driver(Api::cuStreamBeginCapture_v2, || {
        capture::begin(&drv_stream(h, false)?, mode)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2_ptsz(h: *mut c_void, mode: c_uint) -> CUresult {
    driver(Api::cuStreamBeginCapture_v2_ptsz, || {
        capture::begin(&drv_stream(h, true)?, mode)
    })
}

/// `cuStreamEndCapture` / `cudaStreamEndCapture` on a resolved stream.
pub fn end_capture(s: &Arc<Stream>, graph: *mut *mut c_void) -> Result<(), CUresult> {
    if graph.is_null() {
        return Err(INVALID_VALUE);
    }
    match capture::end(s) {
        Ok(g) => out(graph, g as *mut c_void),
        Err((code, ended)) => {
            if ended {
                out(graph, std::ptr::null_mut())?;
            }
            Err(code)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(h: *mut c_void, graph: *mut *mut c_void) -> CUresult {
    driver(Api::cuStreamEndCapture, || {
        end_capture(&drv_stream(h, false)?, graph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    h: *mut c_void,
    graph: *mut *mut c_void,
) -> CUresult {
    driver(Api::cuStreamEndCapture_ptsz, || {
        end_capture(&drv_stream(h, true)?, graph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(h: *mut c_void, status: *mut c_uint) -> CUresult {
    driver(Api::cuStreamIsCapturing, || {
        if status.is_null() {
            return Err(INVALID_VALUE);
        }
        out(status, capture::status(&drv_stream(h, false)?)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(h: *mut c_void, status: *mut c_uint) -> CUresult {
    driver(Api::cuStreamIsCapturing_ptsz, || {
        if status.is_null() {
            return Err(INVALID_VALUE);
        }
        out(status, capture::status(&drv_stream(h, true)?)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult {
    driver(Api::cuThreadExchangeStreamCaptureMode, || {
        state::initialized()?;
        capture::exchange_mode(mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut *mut c_void, flags: c_uint) -> CUresult {
    driver(Api::cuEventCreate, || {
        current_device()?;
        if ph.is_null() {
            return Err(INVALID_VALUE);
        }
        out(ph, event::create(flags)? as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(ev: *mut c_void, h: *mut c_void) -> CUresult {
    driver(Api::cuEventRecord, || {
        event::record(ev as usize, &drv_stream(h, false)?)
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord_ptsz(ev: *mut c_void, h: *mut c_void) -> CUresult {
    driver(Api::cuEventRecord_ptsz, || {
        event::record(ev as usize, &drv_stream(h, true)?)
    })
}

#[no_mangle]
pub extern "C" fn cuEventQuery(ev: *mut c_void) -> CUresult {
    driver(Api::cuEventQuery, || {
        state::initialized()?;
        event::query(ev as usize)
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: *mut c_void) -> CUresult {
    driver(Api::cuEventSynchronize, || {
        state::initialized()?;
        event::synchronize(ev as usize)
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy(ev: *mut c_void) -> CUresult {
    driver(Api::cuEventDestroy, || {
        state::initialized()?;
        event::destroy(ev as usize)
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: *mut c_void) -> CUresult {
    driver(Api::cuEventDestroy_v2, || {
        state::initialized()?;
        event::destroy(ev as usize)
    })
}

/// A C host callback.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(h: *mut c_void, f: HostFn, data: *mut c_void) -> CUresult {
    driver(Api::cuLaunchHostFunc, || {
        stream::host_func(&drv_stream(h, false)?, f, data)
    })
}

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc_ptsz(h: *mut c_void, f: HostFn, data: *mut c_void) -> CUresult {
    driver(Api::cuLaunchHostFunc_ptsz, || {
        stream::host_func(&drv_stream(h, true)?, f, data)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, p: *mut *const c_char) -> CUresult {
    driver(Api::cuGetErrorName, || match driver_name(code) {
        Some(s) => out(p, s),
        None => {
            out(p, std::ptr::null())?;
            Err(INVALID_VALUE)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, p: *mut *const c_char) -> CUresult {
    driver(Api::cuGetErrorString, || match driver_string(code) {
        Some(s) => out(p, s),
        None => {
            out(p, std::ptr::null())?;
            Err(INVALID_VALUE)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CUresult {
    driver(Api::cuEventElapsedTime, || {
        state::initialized()?;
        if ms.is_null() {
            return Err(INVALID_VALUE);
        }
        out(ms, event::elapsed(start as usize, end as usize)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CUresult {
    driver(Api::cuEventElapsedTime_v2, || {
        state::initialized()?;
        if ms.is_null() {
            return Err(INVALID_VALUE);
        }
        out(ms, event::elapsed(start as usize, end as usize)?)
    })
}

/// Stream priorities: 0 (least) to -5 (greatest), as on current GPUs.
pub const PRIORITY_RANGE: (c_int, c_int) = (0, -5);

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    driver(Api::cuCtxGetStreamPriorityRange, || {
        current_device()?;
        if !least.is_null() {
            out(least, PRIORITY_RANGE.0)?;
        }
        if !greatest.is_null() {
            out(greatest, PRIORITY_RANGE.1)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(h: *mut c_void, priority: *mut c_int) -> CUresult {
    driver(Api::cuStreamGetPriority, || {
        out(priority, drv_stream(h, false)?.priority)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(h: *mut c_void, flags: *mut c_uint) -> CUresult {
    driver(Api::cuStreamGetFlags, || {
        out(flags, drv_stream(h, false)?.flags)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: *mut Ctx) -> CUresult {
    driver(Api::cuCtxPushCurrent_v2, || state::push_current(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut *mut Ctx) -> CUresult {
    driver(Api::cuCtxPopCurrent_v2, || {
        let c = state::pop_current()?;
        if !pctx.is_null() {
            out(pctx, c)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(
    h: *mut c_void,
    priority: *mut c_int,
) -> CUresult {
    driver(Api::cuStreamGetPriority_ptsz, || {
        out(priority, drv_stream(h, true)?.priority)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags_ptsz(h: *mut c_void, flags: *mut c_uint) -> CUresult {
    driver(Api::cuStreamGetFlags_ptsz, || {
        out(flags, drv_stream(h, true)?.flags)
    })
}
