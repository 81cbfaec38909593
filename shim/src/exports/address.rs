//! Address-query hooks: `cuMemGetAddressRange_v2`, `cuPointerGetAttribute` and
//! `cuPointerGetAttributes` answer for the program's allocation, not the cache's segment
//! (policy in the engine's `alloc/allocator/address.rs`). Exported, and handed out by the
//! `dlsym` override and the `cuGetProcAddress` wrapper like the allocation hooks.
//!
//! Invariants: only an address inside the cache's memory is answered here; any other
//! address, and every attribute other than the range start and size, goes to the real
//! driver unchanged. Inside a block the program holds: its start and size. Inside cache
//! memory the program does not hold (it freed it): `cuMemGetAddressRange` and
//! `cuPointerGetAttribute` return `CUDA_ERROR_NOT_FOUND` / `CUDA_ERROR_INVALID_VALUE` as the
//! driver does for freed memory; `cuPointerGetAttributes` (which never fails on such an
//! address) reports a range of 0 and 0, the other attributes as the driver gives them.

use std::ffi::{c_int, c_uint, c_void};

use cushim::alloc::AddressRange;

use crate::call_driver;
use crate::exports::driver::{hook, put, DevPtr};
use crate::ffi::{ERR_INVALID_VALUE, SUCCESS};
use crate::real::driver::RealFn;

/// `CUDA_ERROR_NOT_FOUND`.
const ERR_NOT_FOUND: c_int = 500;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` (a `CUdeviceptr`).
const ATTR_RANGE_START: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE` (a `size_t`).
const ATTR_RANGE_SIZE: c_int = 12;

pub static REAL_GET_ADDRESS_RANGE: RealFn = RealFn::new(c"cuMemGetAddressRange_v2");
pub static REAL_POINTER_GET_ATTRIBUTE: RealFn = RealFn::new(c"cuPointerGetAttribute");
pub static REAL_POINTER_GET_ATTRIBUTES: RealFn = RealFn::new(c"cuPointerGetAttributes");

type AddressRangeFn = unsafe extern "C" fn(*mut DevPtr, *mut usize, DevPtr) -> c_int;
type PointerAttrFn = unsafe extern "C" fn(*mut c_void, c_int, DevPtr) -> c_int;
type PointerAttrsFn = unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, DevPtr) -> c_int;

#[no_mangle]
pub extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut DevPtr,
    psize: *mut usize,
    dptr: DevPtr,
) -> c_int {
    hook(
        "cuMemGetAddressRange_v2",
        |s| match s.alloc.address_range(dptr) {
            AddressRange::NotOurs => None,
            AddressRange::NotAllocated => Some(ERR_NOT_FOUND),
            AddressRange::Allocated { base, size } => {
                if !pbase.is_null() {
                    put(pbase, base);
                }
                if !psize.is_null() {
                    put(psize, size as usize);
                }
                Some(SUCCESS)
            }
        },
        || call_driver!(REAL_GET_ADDRESS_RANGE, AddressRangeFn, (pbase, psize, dptr)),
    )
}

#[no_mangle]
pub extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: DevPtr) -> c_int {
    hook(
        "cuPointerGetAttribute",
        |s| {
            if attribute != ATTR_RANGE_START && attribute != ATTR_RANGE_SIZE {
                return None;
            }
            match s.alloc.address_range(ptr) {
                AddressRange::NotOurs => None,
                AddressRange::NotAllocated => Some(ERR_INVALID_VALUE),
                _ if data.is_null() => Some(ERR_INVALID_VALUE),
                AddressRange::Allocated { base, size } => Some(if attribute == ATTR_RANGE_START {
                    put(data as *mut DevPtr, base)
                } else {
                    put(data as *mut usize, size as usize)
                }),
            }
        },
        || {
            call_driver!(
                REAL_POINTER_GET_ATTRIBUTE,
                PointerAttrFn,
                (data, attribute, ptr)
            )
        },
    )
}

#[no_mangle]
pub extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: DevPtr,
) -> c_int {
    let rc = call_driver!(
        REAL_POINTER_GET_ATTRIBUTES,
        PointerAttrsFn,
        (n, attributes, data, ptr)
    );
    if rc != SUCCESS || n == 0 || attributes.is_null() || data.is_null() {
        return rc;
    }
    hook(
        "cuPointerGetAttributes",
        |s| {
            let (base, size) = match s.alloc.address_range(ptr) {
                AddressRange::NotOurs => return Some(rc),
                AddressRange::NotAllocated => (0, 0),
                AddressRange::Allocated { base, size } => (base, size as usize),
            };
            for i in 0..n as usize {
                // SAFETY: the caller passes arrays of `n` attributes and `n` data pointers,
                // which the real call just accepted.
                let (a, d) = unsafe { (*attributes.add(i), *data.add(i)) };
                if d.is_null() {
                    continue;
                }
                if a == ATTR_RANGE_START {
                    put(d as *mut DevPtr, base);
                } else if a == ATTR_RANGE_SIZE {
                    put(d as *mut usize, size);
                }
            }
            Some(rc)
        },
        || rc,
    )
}
