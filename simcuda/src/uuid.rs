//! Device UUIDs (`cuDeviceGetUuid`, `cuDeviceGetUuid_v2`, `cudaDeviceProp::uuid`).
//! Invariant: a device's UUID depends only on its ordinal, so every process sees the same
//! UUID for the same simulated device (as every process sees a GPU's UUID), and no two
//! devices share one. It has the shape of an RFC 4122 version-4 UUID, as NVIDIA's do.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, Api};
use crate::error::CUresult;
use crate::state::driver_device;
use libc::c_int;

/// The 16 bytes of device `ordinal`'s UUID.
pub fn of(ordinal: usize) -> [u8; 16] {
    let mut u = *b"simcudaGPU\0\0\0\0\0\0";
    u[12..16].copy_from_slice(&(ordinal as u32).to_be_bytes());
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

fn get(uuid: *mut [u8; 16], dev: c_int) -> Result<(), CUresult> {
    let d = driver_device(dev)?;
    out(uuid, of(d.ordinal))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> CUresult {
    driver(Api::cuDeviceGetUuid, || get(uuid, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int) -> CUresult {
    driver(Api::cuDeviceGetUuid_v2, || get(uuid, dev))
}
