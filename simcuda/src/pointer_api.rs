//! `cuPointerGetAttribute` and `cuPointerGetAttributes` for device memory (plain
//! allocations and VMM mappings), as CUDA documents them.
//!
//! Invariant: the attributes modelled are the context, memory type (device), device
//! pointer, managed (0), device ordinal, range start and size (the allocation, or for VMM
//! memory the mapping), and mapped (1). `cuPointerGetAttribute` on an address that is not
//! device memory, or for an attribute not modelled, returns `CUDA_ERROR_INVALID_VALUE`;
//! `cuPointerGetAttributes` never fails on such an address: it writes zero (of the
//! attribute's size) for every modelled attribute and returns success, as documented.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, Api};
use crate::error::*;
use crate::state::{ctx_handle, device, initialized};
use crate::{memory, vmm};
use libc::{c_int, c_uint, c_void};

const CONTEXT: c_int = 1;
const MEMORY_TYPE: c_int = 2;
const DEVICE_POINTER: c_int = 3;
const IS_MANAGED: c_int = 8;
const DEVICE_ORDINAL: c_int = 9;
const RANGE_START: c_int = 11;
const RANGE_SIZE: c_int = 12;
const MAPPED: c_int = 13;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: c_uint = 2;

/// Device memory at `ptr`: (device ordinal, range start, range size).
fn lookup(ptr: usize) -> Option<(usize, usize, usize)> {
    if let Some(found) = memory::find(ptr) {
        return Some(found);
    }
    let (base, size) = vmm::mapping_range(ptr)?;
    let dev = vmm::accessible(ptr, 1).unwrap_or(0);
    Some((dev, base, size))
}

/// Write attribute `attr` of the memory at `ptr` (`None`: not device memory: zeros) to
/// `data`. `Err` for an attribute not modelled.
///
/// # Safety
/// `data` points at writable storage of the attribute's C type.
unsafe fn write(
    data: *mut c_void,
    attr: c_int,
    ptr: usize,
    found: Option<(usize, usize, usize)>,
) -> Result<(), CUresult> {
    let (dev, base, size) = found.unwrap_or((0, 0, 0));
    let known = found.is_some();
    // SAFETY (every write below): the caller guarantees `data` holds the attribute's type.
    match attr {
        CONTEXT => {
            let ctx = if known {
                device(dev).map_or(std::ptr::null_mut(), |d| ctx_handle(d) as *mut c_void)
            } else {
                std::ptr::null_mut()
            };
            unsafe { (data as *mut *mut c_void).write(ctx) }
        }
        MEMORY_TYPE => unsafe {
            (data as *mut c_uint).write(if known { MEMORYTYPE_DEVICE } else { 0 })
        },
        DEVICE_POINTER => unsafe { (data as *mut u64).write(if known { ptr as u64 } else { 0 }) },
        IS_MANAGED => unsafe { (data as *mut c_uint).write(0) },
        DEVICE_ORDINAL => unsafe {
            (data as *mut c_int).write(if known { dev as c_int } else { 0 })
        },
        RANGE_START => unsafe { (data as *mut u64).write(base as u64) },
        RANGE_SIZE => unsafe { (data as *mut usize).write(size) },
        MAPPED => unsafe { (data as *mut c_uint).write(u32::from(known)) },
        _ => return Err(INVALID_VALUE),
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: u64,
) -> CUresult {
    driver(Api::cuPointerGetAttribute, || {
        initialized()?;
        if data.is_null() {
            return Err(INVALID_VALUE);
        }
        let found = lookup(ptr as usize).ok_or(INVALID_VALUE)?;
        // SAFETY: the caller passes storage of the attribute's type (CUDA's contract).
        unsafe { write(data, attribute, ptr as usize, Some(found)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: u64,
) -> CUresult {
    driver(Api::cuPointerGetAttributes, || {
        initialized()?;
        if n == 0 || attributes.is_null() || data.is_null() {
            return Err(INVALID_VALUE);
        }
        let found = lookup(ptr as usize);
        for i in 0..n as usize {
            // SAFETY: the caller passes `n` attributes and `n` data pointers.
            let (a, d) = unsafe { (*attributes.add(i), *data.add(i)) };
            if d.is_null() {
                continue;
            }
            // SAFETY: as above; each data pointer holds its attribute's type.
            unsafe { write(d, a, ptr as usize, found)? };
        }
        Ok(())
    })
}
