//! The real CUDA runtime functions the shim wraps, found with `dlsym(RTLD_NEXT, ...)`.
//!
//! Invariant: each pointer is resolved once, lazily, and is `None` when the next library in
//! the search order does not define the symbol (a program with a static runtime never calls
//! our runtime exports, so `None` there only ever yields `cudaErrorUnknown`).

use std::ffi::{c_int, c_uint, c_void, CStr};

use once_cell::sync::Lazy;

use crate::exports_families::{Extent, PitchedPtr};

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
        /// Pointers to the real runtime's functions.
        #[allow(non_snake_case)]
        pub struct Real {
            $(pub $name: Option<unsafe extern "C" fn($($arg),*) -> c_int>,)*
        }

        /// The real runtime, resolved on first use.
        pub static REAL: Lazy<Real> = Lazy::new(|| {
            // SAFETY: each type matches the CUDA runtime's declaration of that symbol.
            unsafe {
                Real {
                    $($name: next_sym(&std::ffi::CString::new(stringify!($name)).unwrap_or_default()),)*
                }
            }
        });
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
    cudaMemGetInfo: fn(*mut usize, *mut usize) -> c_int;
    cudaGetDevice: fn(*mut c_int) -> c_int;
    cudaStreamCreate: fn(*mut Stream) -> c_int;
    cudaStreamCreateWithFlags: fn(*mut Stream, c_uint) -> c_int;
    cudaStreamCreateWithPriority: fn(*mut Stream, c_uint, c_int) -> c_int;
    cudaStreamDestroy: fn(Stream) -> c_int;
    cudaDeviceReset: fn() -> c_int;
    cudaGetLastError: fn() -> c_int;
    cudaPeekAtLastError: fn() -> c_int;
    cudaMallocManaged: fn(*mut *mut c_void, usize, c_uint) -> c_int;
    cudaMallocPitch: fn(*mut *mut c_void, *mut usize, usize, usize) -> c_int;
    cudaMalloc3D: fn(*mut PitchedPtr, Extent) -> c_int;
    cudaMallocFromPoolAsync: fn(*mut *mut c_void, usize, *mut c_void, Stream) -> c_int;
    cudaHostRegister: fn(*mut c_void, usize, c_uint) -> c_int;
    cudaHostUnregister: fn(*mut c_void) -> c_int;
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
        match $crate::real::REAL.$name {
            Some(f) => {
                let _inside = $crate::intercept::Inside::enter_runtime();
                // SAFETY: forwarding the program's own arguments to the real function.
                unsafe { f($($a),*) }
            }
            None => $crate::ffi::ERR_UNKNOWN,
        }
    };
}
