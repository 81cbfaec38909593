//! The C types shared by the exports, the observing paths and the real-function slots:
//! CUDA's handles and structs as the C ABI lays them out, and the signatures of the real
//! driver functions more than one module calls.
//!
//! Invariant: each type has exactly the size, alignment and field order of the CUDA type it
//! names (`#[repr(C)]`); nothing here has behaviour.

use std::ffi::{c_int, c_uint, c_void};

/// `CUdeviceptr`.
pub type DevPtr = u64;
/// `CUstream`.
pub type CuStream = *mut c_void;

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

/// The 64 opaque bytes of `CUipcMemHandle` / `cudaIpcMemHandle_t`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle {
    pub reserved: [u8; 64],
}

// The real driver allocation functions' signatures (the driver hooks and their observing
// paths both call them).
pub type AllocFn = unsafe extern "C" fn(*mut DevPtr, usize) -> c_int;
pub type FreeFn = unsafe extern "C" fn(DevPtr) -> c_int;
pub type HostAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub type HostAllocFlagsFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
pub type FreeHostFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type AllocAsyncFn = unsafe extern "C" fn(*mut DevPtr, usize, CuStream) -> c_int;
pub type FreeAsyncFn = unsafe extern "C" fn(DevPtr, CuStream) -> c_int;
pub type MemInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
