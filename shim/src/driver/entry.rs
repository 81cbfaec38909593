//! The driver functions the shim itself calls, obtained as the CUDA runtime obtains them:
//! through `cuGetProcAddress_v2` (else `cuGetProcAddress`) of the driver library the
//! process uses, each name at the CUDA version whose ABI the shim calls.
//!
//! Policy, and why: the shim never loads a driver by a name of its own choosing and never
//! looks driver functions up by symbol. Whatever sits in front of the driver (a forwarding
//! `libcuda.so.1`, a GPU-sharing limiter that exports only `cuInit` and
//! `cuGetProcAddress_v2`) then sees the cache's own device allocations, so its limits
//! and counts apply to them as to the program's, and a wrapper that exports nothing else
//! works with the shim as it does without it. The library is `libcuda.so.1` as already
//! loaded; if the process has not loaded it yet, it is opened by that soname, exactly as the
//! runtime would (the same search path, so the same file); only when no such library exists
//! is the next `cuGetProcAddress_v2` after the shim in the global scope used.
//!
//! Invariants: nothing here panics. Each function resolves once, on first use, and never
//! changes afterwards; a function the driver lacks answers `CUDA_ERROR_NOT_FOUND` (500)
//! without calling anything, and [`has`] says so beforehand, so the feature that needs it
//! can be turned off with one `cushim:` line (`driver/device.rs`). An address inside libcushim.so
//! is never used (a layer below handing back the shim's own hook would loop). Results are
//! the driver's raw `CUresult` integers: an unexpected code is a value, never an invalid
//! Rust enum.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys as cu;
use once_cell::sync::OnceCell;

use crate::real::driver::{in_shim, real_dlsym};

/// `CUDA_SUCCESS`.
pub const SUCCESS: c_int = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: c_int = 2;
/// `CUDA_ERROR_NOT_FOUND`: also the answer of a function the driver lacks.
pub const NOT_FOUND: c_int = 500;
/// `CUDA_ERROR_NOT_READY`.
pub const NOT_READY: c_int = 600;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: c_int = 801;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub const CAPTURE_UNSUPPORTED: c_int = 900;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
pub const CAPTURE_INVALIDATED: c_int = 901;
/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM`: the shim names the per-thread stream explicitly.
const LEGACY_STREAM: u64 = 1;

type GpaV2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
type GpaV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;

/// The driver's `cuGetProcAddress`, whichever revision it has.
#[derive(Clone, Copy)]
enum Gpa {
    V2(GpaV2),
    V1(GpaV1),
}

/// The driver's entry point, or why there is none.
static GPA: OnceCell<Result<Gpa, String>> = OnceCell::new();

/// `name` in the library behind `handle` (or the global scope after the shim), not ours.
fn sym(handle: *mut c_void, name: &CStr) -> Option<usize> {
    // SAFETY: a live handle or pseudo-handle and a NUL-terminated name.
    let p = unsafe { real_dlsym(handle, name.as_ptr()) } as usize;
    (p != 0 && !in_shim(p)).then_some(p)
}

fn gpa_in(handle: *mut c_void) -> Option<Gpa> {
    if let Some(p) = sym(handle, c"cuGetProcAddress_v2") {
        // SAFETY: the driver's cuGetProcAddress_v2 has this C type.
        return Some(Gpa::V2(unsafe { std::mem::transmute::<usize, GpaV2>(p) }));
    }
    // SAFETY: the driver's cuGetProcAddress (CUDA 11.3 to 11.8) has this C type.
    sym(handle, c"cuGetProcAddress")
        .map(|p| Gpa::V1(unsafe { std::mem::transmute::<usize, GpaV1>(p) }))
}

fn find_gpa() -> Result<Gpa, String> {
    const SONAME: &CStr = c"libcuda.so.1";
    // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded library.
    let mut h = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_NOW) };
    if h.is_null() {
        // What the runtime does on its first call: the same soname, the same search path.
        // SAFETY: dlopen with a NUL-terminated soname; the handle is kept for the process.
        h = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    }
    if !h.is_null() {
        return gpa_in(h).ok_or_else(|| {
            "the CUDA driver (libcuda.so.1) has no cuGetProcAddress (older than CUDA 11.3)".into()
        });
    }
    gpa_in(libc::RTLD_NEXT).ok_or_else(|| "no CUDA driver library (libcuda.so.1) found".into())
}

/// Find the driver's `cuGetProcAddress` (once). `Err` says why the shim cannot reach a driver.
pub fn open() -> Result<(), String> {
    match GPA.get_or_init(find_gpa) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.clone()),
    }
}

/// Ask the driver for `base` at `version`; never one of the shim's own functions.
fn resolve(base: &CStr, version: c_int) -> Option<usize> {
    let gpa = *GPA.get_or_init(find_gpa).as_ref().ok()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    // SAFETY: a NUL-terminated name and valid out-pointers, as cuGetProcAddress requires.
    let r = unsafe {
        match gpa {
            Gpa::V2(f) => f(base.as_ptr(), &mut p, version, LEGACY_STREAM, &mut status),
            Gpa::V1(f) => f(base.as_ptr(), &mut p, version, LEGACY_STREAM),
        }
    };
    let a = p as usize;
    (r == SUCCESS && status == 0 && a != 0 && !in_shim(a)).then_some(a)
}

/// One driver function: unresolved, missing, or its address.
struct Slot {
    base: &'static CStr,
    version: c_int,
    addr: AtomicUsize,
}

const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

impl Slot {
    const fn new(base: &'static CStr, version: c_int) -> Slot {
        Slot {
            base,
            version,
            addr: AtomicUsize::new(UNRESOLVED),
        }
    }

    #[inline]
    fn get(&self) -> Option<usize> {
        match self.addr.load(Ordering::Acquire) {
            UNRESOLVED => self.get_first(),
            MISSING => None,
            a => Some(a),
        }
    }

    #[cold]
    fn get_first(&self) -> Option<usize> {
        let a = resolve(self.base, self.version).unwrap_or(MISSING);
        // Two threads may race here; both asked the same driver the same question.
        self.addr.store(a, Ordering::Release);
        (a != MISSING).then_some(a)
    }
}

macro_rules! driver_fns {
    ($($name:ident = $base:literal @ $ver:literal ($($arg:ident : $ty:ty),*);)*) => {
        #[allow(non_upper_case_globals)]
        mod slots {
            use super::Slot;
            $(pub static $name: Slot = Slot::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!($base, "\0").as_bytes()) {
                    Ok(n) => n,
                    Err(_) => panic!("a symbol name"),
                },
                $ver,
            );)*
        }

        /// Whether the driver has each function (resolving it if not yet done).
        pub mod has {
            $(pub fn $name() -> bool {
                super::slots::$name.get().is_some()
            })*
        }

        $(
            /// The driver function of this name (raw `CUresult`; 500 when the driver lacks it).
            ///
            /// # Safety
            /// As the driver function: valid pointers of the documented types.
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> c_int {
                match slots::$name.get() {
                    Some(a) => {
                        // SAFETY: `a` is the driver's function for this name at this version,
                        // whose C type is the one written here.
                        let f = unsafe {
                            std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> c_int>(a)
                        };
                        // SAFETY: the caller's arguments, as the function's contract asks.
                        unsafe { f($($arg),*) }
                    }
                    None => NOT_FOUND,
                }
            }
        )*
    };
}

driver_fns! {
    cuInit = "cuInit" @ 2000 (flags: c_uint);
    cuDeviceGetCount = "cuDeviceGetCount" @ 2000 (n: *mut c_int);
    cuDeviceGetAttribute = "cuDeviceGetAttribute" @ 2000 (v: *mut c_int, attr: c_int, dev: c_int);
    cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" @ 7000 (ctx: *mut cu::CUcontext, dev: c_int);
    cuDevicePrimaryCtxRelease_v2 = "cuDevicePrimaryCtxRelease" @ 11000 (dev: c_int);
    cuDevicePrimaryCtxGetState = "cuDevicePrimaryCtxGetState" @ 7000 (dev: c_int, flags: *mut c_uint, active: *mut c_int);
    cuCtxGetCurrent = "cuCtxGetCurrent" @ 4000 (ctx: *mut cu::CUcontext);
    cuCtxGetDevice = "cuCtxGetDevice" @ 2000 (dev: *mut c_int);
    cuCtxPushCurrent_v2 = "cuCtxPushCurrent" @ 4000 (ctx: cu::CUcontext);
    cuCtxPopCurrent_v2 = "cuCtxPopCurrent" @ 4000 (ctx: *mut cu::CUcontext);
    cuCtxSynchronize = "cuCtxSynchronize" @ 2000 ();
    cuMemGetInfo_v2 = "cuMemGetInfo" @ 3020 (free: *mut usize, total: *mut usize);
    cuMemAlloc_v2 = "cuMemAlloc" @ 3020 (p: *mut u64, size: usize);
    cuMemFree_v2 = "cuMemFree" @ 3020 (p: u64);
    cuMemcpyDtoH_v2 = "cuMemcpyDtoH" @ 3020 (dst: *mut c_void, src: u64, n: usize);
    cuMemcpyHtoD_v2 = "cuMemcpyHtoD" @ 3020 (dst: u64, src: *const c_void, n: usize);
    cuMemHostAlloc = "cuMemHostAlloc" @ 2020 (p: *mut *mut c_void, size: usize, flags: c_uint);
    cuMemFreeHost = "cuMemFreeHost" @ 2000 (p: *mut c_void);
    cuMemGetAllocationGranularity = "cuMemGetAllocationGranularity" @ 10020 (g: *mut usize, prop: *const cu::CUmemAllocationProp, option: c_uint);
    cuMemAddressReserve = "cuMemAddressReserve" @ 10020 (p: *mut u64, size: usize, align: usize, addr: u64, flags: u64);
    cuMemAddressFree = "cuMemAddressFree" @ 10020 (p: u64, size: usize);
    cuMemCreate = "cuMemCreate" @ 10020 (h: *mut u64, size: usize, prop: *const cu::CUmemAllocationProp, flags: u64);
    cuMemRelease = "cuMemRelease" @ 10020 (h: u64);
    cuMemMap = "cuMemMap" @ 10020 (p: u64, size: usize, offset: usize, h: u64, flags: u64);
    cuMemUnmap = "cuMemUnmap" @ 10020 (p: u64, size: usize);
    cuMemSetAccess = "cuMemSetAccess" @ 10020 (p: u64, size: usize, desc: *const cu::CUmemAccessDesc, count: usize);
    cuEventCreate = "cuEventCreate" @ 2000 (ev: *mut cu::CUevent, flags: c_uint);
    cuEventRecord = "cuEventRecord" @ 2000 (ev: cu::CUevent, stream: cu::CUstream);
    cuEventQuery = "cuEventQuery" @ 2000 (ev: cu::CUevent);
    cuEventSynchronize = "cuEventSynchronize" @ 2000 (ev: cu::CUevent);
    cuEventDestroy_v2 = "cuEventDestroy" @ 4000 (ev: cu::CUevent);
    cuStreamWaitEvent = "cuStreamWaitEvent" @ 3020 (stream: cu::CUstream, ev: cu::CUevent, flags: c_uint);
    cuStreamQuery = "cuStreamQuery" @ 2000 (stream: cu::CUstream);
    cuStreamSynchronize = "cuStreamSynchronize" @ 2000 (stream: cu::CUstream);
    cuStreamIsCapturing = "cuStreamIsCapturing" @ 10000 (stream: cu::CUstream, status: *mut c_uint);
    cuThreadExchangeStreamCaptureMode = "cuThreadExchangeStreamCaptureMode" @ 10010 (mode: *mut c_uint);
    cuMemGetAddressRange_v2 = "cuMemGetAddressRange" @ 3020 (base: *mut u64, size: *mut usize, p: u64);
    cuMemRetainAllocationHandle = "cuMemRetainAllocationHandle" @ 11000 (h: *mut u64, p: *mut c_void);
    cuMemExportToShareableHandle = "cuMemExportToShareableHandle" @ 10020 (out: *mut c_void, h: u64, kind: c_uint, flags: u64);
    cuMemImportFromShareableHandle = "cuMemImportFromShareableHandle" @ 10020 (h: *mut u64, os: *mut c_void, kind: c_uint);
}

/// A feature's driver functions: each name with its [`has`] check.
pub type Need = &'static [(&'static str, fn() -> bool)];

/// The first of a feature's driver functions that the driver lacks, if any.
pub fn first_missing(fns: Need) -> Option<&'static str> {
    fns.iter().find(|(_, has)| !has()).map(|(n, _)| *n)
}

/// The device of the calling thread's current context, if one is current.
pub fn ctx_device() -> Option<i32> {
    let mut dev = 0;
    // SAFETY: valid out-pointer; the shim's state exists, so the driver is initialized.
    let r = unsafe { cuCtxGetDevice(&mut dev) };
    (r == SUCCESS).then_some(dev)
}
