//! Exported CUDA driver allocation and stream hooks (`cuMemAlloc_v2` and friends), also
//! handed out by the `dlsym` override and the `cuGetProcAddress` wrapper: they decode the C
//! arguments, call the same engine as the runtime exports and map the result to a driver
//! result code. No policy lives here.
//!
//! Invariants: a hook handles a call only when the driver layer is intercepted, the calling
//! thread is not already inside the shim (a runtime export, or the shim's own driver calls)
//! and the shim is initialized; otherwise it forwards the program's arguments unchanged to
//! the real driver function (also before the program's own `cuInit`). Allocations are cached only for the device's primary context
//! (the context the engine allocates in); with another context current the real driver
//! allocates. Result codes are the driver's: NULL out-pointer or size 0 is
//! `CUDA_ERROR_INVALID_VALUE` (1), exhaustion `CUDA_ERROR_OUT_OF_MEMORY` (2), an invalid
//! free of a cached pointer 1 (logged once per call site); a NULL or foreign pointer goes to
//! the real free function; a stream-ordered free on a destroyed stream 400. Under capture,
//! as the runtime exports (`exports/runtime.rs`, `capture.rs`). In the `_ptsz` variants
//! stream 0 means the per-thread stream.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys as cu;

use crate::driver::entry::{self as drv, ctx_device};
use cushim::alloc::{AllocError, FreeError};
use cushim::trace::event::NO_STACK;

use crate::call_driver;
use crate::exports::ordered;
use crate::ffi::intercept::Inside;
use crate::ffi::{
    ERR_CAPTURE_UNSUPPORTED, ERR_INVALID_HANDLE, ERR_INVALID_VALUE, ERR_UNKNOWN, SUCCESS,
};
use crate::life::capture;
use crate::life::state::driver_state;
use crate::life::state::Shim;
use crate::observe::driver as observing;
use crate::observe::{forget_host_then, forget_then};
use crate::real::driver::RealFn;

use crate::ffi::types::{
    AllocAsyncFn, AllocFn, FreeAsyncFn, FreeFn, FreeHostFn, HostAllocFlagsFn, HostAllocFn,
    MemInfoFn,
};
pub use crate::ffi::types::{CuStream, DevPtr};
use crate::real::slots::*;

/// `CUDA_ERROR_OUT_OF_MEMORY`.
const ERR_OUT_OF_MEMORY: c_int = 2;
/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: c_uint = 1;
/// Devices whose primary context is remembered.
const MAX_DEVICES: usize = 64;

static PRIMARY: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

fn alloc_code(e: AllocError) -> c_int {
    match e {
        AllocError::OutOfMemory | AllocError::Device(_) => ERR_OUT_OF_MEMORY,
        AllocError::Capturing => ERR_CAPTURE_UNSUPPORTED,
        AllocError::InvalidHandle => ERR_INVALID_HANDLE,
    }
}

/// The device the engine may allocate for: the current context's device when that context
/// is the device's primary context (the one the engine allocates in), else `None`.
fn engine_device() -> Option<i32> {
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    if unsafe { drv::cuCtxGetCurrent(&mut ctx) } != drv::SUCCESS || ctx.is_null() {
        return None;
    }
    let key = ctx as usize;
    if let Some(i) = PRIMARY
        .iter()
        .position(|p| p.load(Ordering::Relaxed) == key)
    {
        return Some(i as i32);
    }
    let dev = ctx_device()?;
    let slot = PRIMARY.get(usize::try_from(dev).ok()?)?;
    if slot.load(Ordering::Relaxed) == 0 {
        // A primary context that is not active cannot be the current one (the program works
        // in a context of its own): never create it by retaining it here.
        let (mut flags, mut active) = (0u32, 0i32);
        // SAFETY: valid out-pointers and a device ordinal the driver just reported.
        let r = unsafe { drv::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) };
        if r != drv::SUCCESS || active == 0 {
            return None;
        }
        let mut prim: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and a device ordinal the driver just reported. The
        // engine retains the same primary context; one extra reference is kept for life.
        if unsafe { drv::cuDevicePrimaryCtxRetain(&mut prim, dev) } != drv::SUCCESS {
            return None;
        }
        slot.store(prim as usize, Ordering::Relaxed);
    }
    (slot.load(Ordering::Relaxed) == key).then_some(dev)
}

static REAL_CTX_GET_CURRENT: RealFn = RealFn::new(c"cuCtxGetCurrent");

/// Whether the program has initialized the driver (`cuInit`). Until it has, the hooks leave
/// every call to the real driver, so the shim's own initialization (which calls `cuInit`)
/// never turns a program's `CUDA_ERROR_NOT_INITIALIZED` into something else.
fn program_initialized_driver() -> bool {
    type CtxGetCurrentFn = unsafe extern "C" fn(*mut cu::CUcontext) -> c_int;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    const NOT_INITIALIZED: c_int = 3;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    let p = &mut ctx as *mut cu::CUcontext;
    call_driver!(REAL_CTX_GET_CURRENT, CtxGetCurrentFn, (p)) != NOT_INITIALIZED
}

/// Run a hook: `f` handles the call (`Some(code)`) or declines (`None`), in which case, or
/// when the shim must not handle it at all, `real` forwards it. A failure inside `f` also
/// goes to `real` (`failopen.rs`): a free's `real` serves the cache's own pointers itself.
pub(crate) fn hook(
    what: &str,
    f: impl FnOnce(&'static Shim) -> Option<c_int>,
    real: impl FnOnce() -> c_int,
) -> c_int {
    let handled = catch_unwind(AssertUnwindSafe(|| {
        if crate::life::state::get_if_ready().is_none() && !program_initialized_driver() {
            return None;
        }
        let s = driver_state()?;
        let _inside = Inside::enter();
        f(s)
    }));
    match handled {
        Ok(Some(code)) => code,
        Ok(None) => {
            let _inside = Inside::enter();
            real()
        }
        Err(_) => {
            // Fail open: the next definition, with the program's arguments.
            crate::ffi::failopen::failed(what);
            let _inside = Inside::enter();
            catch_unwind(AssertUnwindSafe(real)).unwrap_or(ERR_UNKNOWN)
        }
    }
}

/// A driver free the shim does not serve itself (declined, or failed inside the shim): the
/// cache's own pointers are still freed by the cache (`failopen.rs`), the rest by `real`.
fn cached_or(ptr: DevPtr, stream: Option<u64>, real: impl FnOnce() -> c_int) -> c_int {
    crate::exports::fallback::free_fallback(
        ptr,
        |s| match stream {
            None => s.alloc.free(ptr, 0, NO_STACK),
            Some(st) => ordered::free_async(&s.alloc, ptr, st, 0, NO_STACK),
        },
        real,
    )
}

/// Store `v` through an out-pointer the caller checked.
pub(crate) fn put<T>(out: *mut T, v: T) -> c_int {
    // SAFETY: `out` was checked non-null and points at the program's variable.
    unsafe { *out = v };
    SUCCESS
}

fn refused_free(what: &str, ptr: u64, e: FreeError) -> Option<c_int> {
    match e {
        FreeError::NotOurs => None,
        FreeError::InvalidValue => {
            crate::ffi::callsite::log_once(&format!(
                "{what}({ptr:#x}): not an allocated block (double free or interior pointer)"
            ));
            Some(ERR_INVALID_VALUE)
        }
        FreeError::InvalidHandle => Some(ERR_INVALID_HANDLE),
    }
}

/// [`capture::forbidden_free`] through the driver.
#[cold]
fn forbidden_free() -> Option<c_int> {
    capture::forbidden_free(
        |size| {
            let mut tmp: DevPtr = 0;
            let out: *mut DevPtr = &mut tmp;
            (call_driver!(REAL_MEM_ALLOC, AllocFn, (out, size)), tmp)
        },
        |p| {
            let _ = call_driver!(REAL_MEM_FREE, FreeFn, (p));
        },
    )
}

fn device_alloc(s: &Shim, out: *mut DevPtr, size: usize, stream: Option<u64>) -> Option<c_int> {
    if crate::ffi::failopen::pass_through(crate::ffi::failopen::Point::Driver) {
        return None;
    }
    if out.is_null() || size == 0 {
        return Some(ERR_INVALID_VALUE);
    }
    if match stream {
        None => capture::forbidden(),
        Some(st) => capture::stream_capturing(st),
    } {
        // The driver decides (refusing, or a graph allocation).
        return None;
    }
    let dev = engine_device()?;
    if stream.is_none() && crate::life::sleep::on() {
        return Some(match super::sleep::malloc(s, dev, size as u64) {
            Ok(p) => put(out, p),
            Err(code) => {
                put(out, 0);
                code
            }
        });
    }
    let stack = s.history.alloc_stack();
    let r = match stream {
        None => s.alloc.malloc(dev, size as u64, 0, stack),
        Some(st) => ordered::malloc_async(&s.alloc, dev, size as u64, st, stack),
    };
    Some(match r {
        Ok(p) => put(out, p),
        Err(e) => {
            put(out, 0);
            alloc_code(e)
        }
    })
}

fn device_free(s: &Shim, what: &str, ptr: DevPtr, stream: Option<u64>) -> Option<c_int> {
    if ptr == 0 {
        return None;
    }
    let degraded = crate::ffi::failopen::pass_through(crate::ffi::failopen::Point::Driver);
    // The device is only a hint (the allocator tries every device), so with one device
    // there is nothing to ask the driver (as `state::alloc_device` for the runtime layer).
    let dev = if s.alloc.device_count() == 1 {
        0
    } else {
        ctx_device().unwrap_or(0)
    };
    if crate::life::sleep::on() {
        if let Some(rc) = super::sleep::free(s, ptr, dev) {
            return Some(rc);
        }
    }
    if capture::any() {
        let ours = s.alloc.owner(ptr).is_some();
        match stream {
            None if ours && capture::forbidden() => {
                if let Some(rc) = forbidden_free() {
                    return Some(rc);
                }
            }
            // The graph may use the block whenever it is launched: it stays allocated.
            Some(st) if ours && capture::stream_capturing(st) => return Some(SUCCESS),
            _ => {}
        }
    }
    let stack = s.history.free_stack();
    let r = match stream {
        None => s.alloc.free(ptr, dev, stack),
        Some(st) => ordered::free_async(&s.alloc, ptr, st, dev, stack),
    };
    if r.is_ok() {
        crate::ipc::freed(ptr);
    }
    match r {
        Ok(()) if degraded && stream.is_none() => Some(crate::life::state::drained(s)),
        Ok(()) => Some(SUCCESS),
        Err(e) => refused_free(what, ptr, e),
    }
}

fn host_alloc(s: &Shim, out: *mut *mut c_void, size: usize, flags: c_uint) -> Option<c_int> {
    if !crate::driver::device::pinned_supported()
        || crate::ffi::failopen::pass_through(crate::ffi::failopen::Point::Pinned)
    {
        return None;
    }
    if out.is_null() {
        return Some(ERR_INVALID_VALUE);
    }
    // Pinned memory needs a current context, as in the driver (which reports its absence).
    ctx_device()?;
    let stack = s.history.alloc_stack();
    Some(match s.alloc.host_alloc(size as u64, flags, stack) {
        Ok(p) => put(out, p as *mut c_void),
        Err(e) => {
            put(out, std::ptr::null_mut());
            alloc_code(e)
        }
    })
}

type StreamCreateFn = unsafe extern "C" fn(*mut CuStream, c_uint) -> c_int;
type StreamCreatePrioFn = unsafe extern "C" fn(*mut CuStream, c_uint, c_int) -> c_int;
type StreamDestroyFn = unsafe extern "C" fn(CuStream) -> c_int;

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut DevPtr, bytesize: usize) -> c_int {
    hook(
        "cuMemAlloc_v2",
        |s| {
            observing::alloc(s, dptr, bytesize, None)
                .or_else(|| device_alloc(s, dptr, bytesize, None))
        },
        || call_driver!(REAL_MEM_ALLOC, AllocFn, (dptr, bytesize)),
    )
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: DevPtr) -> c_int {
    hook(
        "cuMemFree_v2",
        |s| observing::free(s, dptr, None).or_else(|| device_free(s, "cuMemFree_v2", dptr, None)),
        || {
            cached_or(dptr, None, || {
                forget_then(dptr, || call_driver!(REAL_MEM_FREE, FreeFn, (dptr)))
            })
        },
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync(dptr: *mut DevPtr, bytesize: usize, h: CuStream) -> c_int {
    crate::per_thread::note_stream(h as usize);
    hook(
        "cuMemAllocAsync",
        |s| {
            observing::alloc(s, dptr, bytesize, Some((h, false)))
                .or_else(|| device_alloc(s, dptr, bytesize, Some(h as u64)))
        },
        || call_driver!(REAL_MEM_ALLOC_ASYNC, AllocAsyncFn, (dptr, bytesize, h)),
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut DevPtr, bytesize: usize, h: CuStream) -> c_int {
    crate::per_thread::note_ptds();
    hook(
        "cuMemAllocAsync_ptsz",
        |s| {
            observing::alloc(s, dptr, bytesize, Some((h, true)))
                .or_else(|| device_alloc(s, dptr, bytesize, Some(capture::ptsz(h as u64))))
        },
        || call_driver!(REAL_MEM_ALLOC_ASYNC_PTSZ, AllocAsyncFn, (dptr, bytesize, h)),
    )
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: DevPtr, h: CuStream) -> c_int {
    crate::per_thread::note_stream(h as usize);
    hook(
        "cuMemFreeAsync",
        |s| {
            observing::free(s, dptr, Some((h, false)))
                .or_else(|| device_free(s, "cuMemFreeAsync", dptr, Some(h as u64)))
        },
        || {
            cached_or(dptr, Some(h as u64), || {
                forget_then(dptr, || {
                    call_driver!(REAL_MEM_FREE_ASYNC, FreeAsyncFn, (dptr, h))
                })
            })
        },
    )
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: DevPtr, h: CuStream) -> c_int {
    crate::per_thread::note_ptds();
    hook(
        "cuMemFreeAsync_ptsz",
        |s| {
            observing::free(s, dptr, Some((h, true))).or_else(|| {
                device_free(
                    s,
                    "cuMemFreeAsync_ptsz",
                    dptr,
                    Some(capture::ptsz(h as u64)),
                )
            })
        },
        || {
            cached_or(dptr, Some(capture::ptsz(h as u64)), || {
                forget_then(dptr, || {
                    call_driver!(REAL_MEM_FREE_ASYNC_PTSZ, FreeAsyncFn, (dptr, h))
                })
            })
        },
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> c_int {
    hook(
        "cuMemAllocHost_v2",
        |s| observing::host_alloc(s, pp, bytesize, None).or_else(|| host_alloc(s, pp, bytesize, 0)),
        || call_driver!(REAL_MEM_ALLOC_HOST, HostAllocFn, (pp, bytesize)),
    )
}

#[no_mangle]
pub extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> c_int {
    hook(
        "cuMemHostAlloc",
        |s| {
            observing::host_alloc(s, pp, bytesize, Some(flags))
                .or_else(|| host_alloc(s, pp, bytesize, flags))
        },
        || call_driver!(REAL_MEM_HOST_ALLOC, HostAllocFlagsFn, (pp, bytesize, flags)),
    )
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> c_int {
    hook(
        "cuMemFreeHost",
        |s| {
            if let Some(rc) = observing::free_host(s, p) {
                return Some(rc);
            }
            if p.is_null() {
                return None;
            }
            crate::ffi::failopen::inject(crate::ffi::failopen::Point::Pinned);
            match s.alloc.host_free(p as u64, s.history.free_stack()) {
                Ok(()) => Some(SUCCESS),
                Err(e) => refused_free("cuMemFreeHost", p as u64, e),
            }
        },
        || {
            crate::exports::fallback::free_fallback(
                p as u64,
                |s| s.alloc.host_free(p as u64, NO_STACK),
                || {
                    forget_host_then(p as u64, || {
                        call_driver!(REAL_MEM_FREE_HOST, FreeHostFn, (p))
                    })
                },
            )
        },
    )
}

#[no_mangle]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    hook(
        "cuMemGetInfo_v2",
        |s| {
            if let Some(rc) = observing::mem_get_info(free, total) {
                return Some(rc);
            }
            if free.is_null() || total.is_null() {
                return Some(ERR_INVALID_VALUE);
            }
            let (f, t) = s.alloc.mem_get_info(engine_device()?).ok()?;
            put(free, f as usize);
            Some(put(total, t as usize))
        },
        || call_driver!(REAL_MEM_GET_INFO, MemInfoFn, (free, total)),
    )
}

/// Tell the engine of a stream the real driver just created.
fn created(rc: c_int, out: *mut CuStream, flags: c_uint) -> c_int {
    if rc == SUCCESS && !out.is_null() {
        hook(
            "cuStreamCreate",
            |s| {
                // SAFETY: the real create succeeded, so `*out` holds the new stream.
                let stream = unsafe { *out } as u64;
                s.alloc
                    .stream_created(engine_device()?, stream, flags & NON_BLOCKING != 0);
                Some(SUCCESS)
            },
            || SUCCESS,
        );
    }
    rc
}

#[no_mangle]
pub extern "C" fn cuStreamCreate(ph: *mut CuStream, flags: c_uint) -> c_int {
    let rc = call_driver!(REAL_STREAM_CREATE, StreamCreateFn, (ph, flags));
    created(rc, ph, flags)
}

#[no_mangle]
pub extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CuStream,
    flags: c_uint,
    priority: c_int,
) -> c_int {
    let rc = call_driver!(
        REAL_STREAM_CREATE_PRIO,
        StreamCreatePrioFn,
        (ph, flags, priority)
    );
    created(rc, ph, flags)
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(h: CuStream) -> c_int {
    hook(
        "cuStreamDestroy_v2",
        |s| {
            if let Some(dev) = engine_device() {
                s.alloc.stream_destroyed(dev, h as u64);
            }
            None
        },
        || {
            let rc = call_driver!(REAL_STREAM_DESTROY, StreamDestroyFn, (h));
            if rc == SUCCESS {
                capture::ended(h as u64, SUCCESS);
            }
            rc
        },
    )
}
