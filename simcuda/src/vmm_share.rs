//! Sharing and inspecting virtual-memory allocations: `cuMemExportToShareableHandle` /
//! `cuMemImportFromShareableHandle` with POSIX file descriptors (a physical allocation is a
//! memfd: the exported descriptor is a duplicate of it, which another process receives by
//! `SCM_RIGHTS` or `pidfd_getfd` and imports), `cuMemRetainAllocationHandle`,
//! `cuMemGetAllocationPropertiesFromHandle` and `cuMemGetAccess`. The rules live in `vmm`.
//! Only `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` is supported, and only for allocations
//! created asking for it, as in CUDA; other handle types are `CUDA_ERROR_NOT_SUPPORTED`.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, Api};
use crate::error::*;
use crate::state::current_device;
use crate::types::{MemAllocationProp, MemLocation};
use crate::vmm::{self, HANDLE_TYPE_POSIX_FD};
use libc::{c_int, c_void};

const LOCATION_TYPE_DEVICE: c_int = 1;

fn posix_only(kind: c_int) -> Result<(), CUresult> {
    if kind == HANDLE_TYPE_POSIX_FD {
        Ok(())
    } else {
        Err(NOT_SUPPORTED)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    kind: c_int,
    flags: u64,
) -> CUresult {
    driver(Api::cuMemExportToShareableHandle, || {
        current_device()?;
        posix_only(kind)?;
        if flags != 0 || shareable.is_null() {
            return Err(INVALID_VALUE);
        }
        let fd = vmm::export_fd(handle)?;
        out(shareable as *mut c_int, fd)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: c_int,
) -> CUresult {
    driver(Api::cuMemImportFromShareableHandle, || {
        current_device()?;
        posix_only(kind)?;
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        // The descriptor travels in the pointer's bits, as CUDA's POSIX handle type says.
        let fd = c_int::try_from(os_handle as usize).map_err(|_| INVALID_VALUE)?;
        out(handle, vmm::import_fd(fd)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    driver(Api::cuMemRetainAllocationHandle, || {
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        out(handle, vmm::retain(addr as usize)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut MemAllocationProp,
    handle: u64,
) -> CUresult {
    driver(Api::cuMemGetAllocationPropertiesFromHandle, || {
        if prop.is_null() {
            return Err(INVALID_VALUE);
        }
        let (dev, types) = vmm::properties(handle)?;
        out(
            prop,
            MemAllocationProp {
                type_: 1,
                requested_handle_types: types,
                location: MemLocation {
                    type_: LOCATION_TYPE_DEVICE,
                    id: dev as c_int,
                },
                win32_handle_meta_data: std::ptr::null_mut(),
                alloc_flags: [0; 8],
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    location: *const MemLocation,
    ptr: u64,
) -> CUresult {
    driver(Api::cuMemGetAccess, || {
        if flags.is_null() || location.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: non-NULL pointer to the caller's CUmemLocation.
        let loc = unsafe { *location };
        if loc.type_ != LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        let dev = usize::try_from(loc.id).map_err(|_| INVALID_DEVICE)?;
        out(flags, vmm::get_access(ptr as usize, dev)?)
    })
}
