//! C structures of the CUDA 12 ABI that simcuda reads or writes. Invariant: layouts equal
//! NVIDIA's (checked against NVIDIA's headers by `tests/simcuda/simcuda_abi.rs`).

use libc::{c_int, c_void};

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
pub struct MemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: c_int,
}

/// `struct cudaPointerAttributes`.
#[repr(C)]
pub struct PointerAttributes {
    pub type_: c_int,
    pub device: c_int,
    pub device_pointer: *mut c_void,
    pub host_pointer: *mut c_void,
}

const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<MemAccessDesc>() == 12);
const _: () = assert!(std::mem::size_of::<PointerAttributes>() == 24);
