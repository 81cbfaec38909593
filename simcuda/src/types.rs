//! C structures of the CUDA 12 ABI that simcuda reads or writes. Invariant: layouts equal
//! NVIDIA's (checked against NVIDIA's headers by `tests/simcuda_abi.rs`).

use libc::{c_char, c_int, c_uint, c_void};

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

/// Size of CUDA 12's `struct cudaDeviceProp`.
pub const DEVICE_PROP_SIZE: usize = 1032;

/// The leading fields of `struct cudaDeviceProp` (CUDA 12), up to `multiProcessorCount`.
#[repr(C)]
pub struct DevicePropHead {
    pub name: [c_char; 256],
    pub uuid: [u8; 16],
    pub luid: [c_char; 8],
    pub luid_device_node_mask: c_uint,
    pub total_global_mem: usize,
    pub shared_mem_per_block: usize,
    pub regs_per_block: c_int,
    pub warp_size: c_int,
    pub mem_pitch: usize,
    pub max_threads_per_block: c_int,
    pub max_threads_dim: [c_int; 3],
    pub max_grid_size: [c_int; 3],
    pub clock_rate: c_int,
    pub total_const_mem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub texture_alignment: usize,
    pub texture_pitch_alignment: usize,
    pub device_overlap: c_int,
    pub multi_processor_count: c_int,
}

const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<MemAccessDesc>() == 12);
const _: () = assert!(std::mem::size_of::<PointerAttributes>() == 24);
const _: () = assert!(std::mem::offset_of!(DevicePropHead, major) == 360);
const _: () = assert!(std::mem::offset_of!(DevicePropHead, multi_processor_count) == 388);
