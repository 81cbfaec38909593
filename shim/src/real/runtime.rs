//! The real CUDA runtime functions the shim wraps, found with `dlsym(RTLD_NEXT, ...)`.
//!
//! Invariant: each pointer is resolved lazily, once found never changes, and is missing when
//! no loaded runtime defines the symbol (a program with a static runtime never calls
//! our runtime exports, so `None` there only ever yields `cudaErrorUnknown`).

use std::ffi::{c_int, c_uint, c_void, CStr};

use crate::ffi::types::{Extent, IpcHandle, PitchedPtr};

pub type Stream = *mut c_void;

/// Look a symbol up in the libraries after ours.
///
/// # Safety
/// `T` must be the function pointer type of the symbol named `name`.
pub unsafe fn next_sym<T: Copy>(name: &CStr) -> Option<T> {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name is always safe to call.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller guarantees `T` is the symbol's function pointer type, which has
        // the size of a data pointer on every platform we build for.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

macro_rules! real_runtime {
    ($($name:ident : fn($($arg:ty),*) -> c_int;)*) => {
        /// The real runtime's functions, resolved on first use ([`RealFn`]: the library after
        /// ours, else what a `dlsym` on a runtime handle found, else a privately loaded
        /// `libcudart`).
        #[allow(non_upper_case_globals)]
        pub mod fns {
            use crate::real::driver::RealFn;
            $(pub static $name: RealFn = RealFn::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(n) => n,
                    Err(_) => panic!("a symbol name"),
                },
            );)*
        }

        /// The C types of the real runtime's functions.
        #[allow(non_camel_case_types)]
        pub mod types {
            use super::*;
            $(pub type $name = unsafe extern "C" fn($($arg),*) -> c_int;)*
        }
    };
}

real_runtime! {
    cudaMalloc: fn(*mut *mut c_void, usize) -> c_int;
    cudaFree: fn(*mut c_void) -> c_int;
    cudaMallocHost: fn(*mut *mut c_void, usize) -> c_int;
    cudaHostAlloc: fn(*mut *mut c_void, usize, c_uint) -> c_int;
    cudaFreeHost: fn(*mut c_void) -> c_int;
    cudaMallocAsync: fn(*mut *mut c_void, usize, Stream) -> c_int;
    cudaFreeAsync: fn(*mut c_void, Stream) -> c_int;
    cudaMallocAsync_ptsz: fn(*mut *mut c_void, usize, Stream) -> c_int;
    cudaFreeAsync_ptsz: fn(*mut c_void, Stream) -> c_int;
    cudaMemGetInfo: fn(*mut usize, *mut usize) -> c_int;
    cudaGetDevice: fn(*mut c_int) -> c_int;
    cudaStreamCreate: fn(*mut Stream) -> c_int;
    cudaStreamCreateWithFlags: fn(*mut Stream, c_uint) -> c_int;
    cudaStreamCreateWithPriority: fn(*mut Stream, c_uint, c_int) -> c_int;
    cudaStreamDestroy: fn(Stream) -> c_int;
    cudaStreamBeginCapture: fn(Stream, c_uint) -> c_int;
    cudaStreamBeginCapture_ptsz: fn(Stream, c_uint) -> c_int;
    cudaStreamEndCapture: fn(Stream, *mut *mut c_void) -> c_int;
    cudaStreamEndCapture_ptsz: fn(Stream, *mut *mut c_void) -> c_int;
    cudaDeviceReset: fn() -> c_int;
    cudaGetLastError: fn() -> c_int;
    cudaPeekAtLastError: fn() -> c_int;
    cudaMallocManaged: fn(*mut *mut c_void, usize, c_uint) -> c_int;
    cudaMallocPitch: fn(*mut *mut c_void, *mut usize, usize, usize) -> c_int;
    cudaMalloc3D: fn(*mut PitchedPtr, Extent) -> c_int;
    cudaMallocFromPoolAsync: fn(*mut *mut c_void, usize, *mut c_void, Stream) -> c_int;
    cudaMallocFromPoolAsync_ptsz: fn(*mut *mut c_void, usize, *mut c_void, Stream) -> c_int;
    cudaHostRegister: fn(*mut c_void, usize, c_uint) -> c_int;
    cudaHostUnregister: fn(*mut c_void) -> c_int;
    cudaIpcGetMemHandle: fn(*mut IpcHandle, *mut c_void) -> c_int;
    cudaIpcOpenMemHandle: fn(*mut *mut c_void, IpcHandle, c_uint) -> c_int;
    cudaIpcCloseMemHandle: fn(*mut c_void) -> c_int;
    cudaDeviceEnablePeerAccess: fn(c_int, c_uint) -> c_int;
    cudaDeviceDisablePeerAccess: fn(c_int) -> c_int;
}

/// Call a real runtime function, or return `cudaErrorUnknown` (999) if it is missing.
/// Arguments are plain identifiers, so nothing but the call runs inside the unsafe block.
///
/// While the real function runs the thread is marked inside the shim (when the runtime
/// layer is intercepted), so the driver hooks pass the real runtime's driver calls through:
/// a program call is intercepted once. With `CUSHIM_INTERCEPT=driver` it is not marked, so
/// the driver hooks see what the real runtime does.
#[macro_export]
macro_rules! call_real {
    ($name:ident($($a:ident),*)) => {
        match $crate::real::runtime::fns::$name.get() {
            Some(addr) => {
                let _inside = $crate::ffi::intercept::Inside::enter_runtime();
                // SAFETY: `addr` is the real runtime function of this name, whose C type is
                // `types::$name`.
                let f = unsafe { std::mem::transmute::<usize, $crate::real::runtime::types::$name>(addr) };
                // SAFETY: forwarding the program's own arguments to the real function.
                unsafe { f($($a),*) }
            }
            None => $crate::ffi::ERR_UNKNOWN,
        }
    };
}
