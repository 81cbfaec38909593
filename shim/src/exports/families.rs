//! Runtime exports of the allocation families the cache does not serve: managed
//! (`cudaMallocManaged`), pitched and 3D (`cudaMallocPitch`, `cudaMalloc3D`), pools
//! (`cudaMallocFromPoolAsync`) and host registration (`cudaHostRegister`/`Unregister`).
//!
//! Invariant: in both modes each call goes to the real runtime with the program's
//! arguments and its result reaches the program unchanged; a success is recorded
//! (`observe`), and the memory's free (`cudaFree`, `cudaFreeAsync`, `cudaHostUnregister`)
//! forgets it. Without the shim's state (disabled, runtime layer not intercepted) they are
//! plain pass-throughs.

use std::ffi::{c_int, c_uint, c_void};

use cushim::alloc::observed::Kind;

use crate::call_real;
pub use crate::ffi::types::{Extent, PitchedPtr};
use crate::life::state;
use crate::life::state::runtime_state;
use crate::observe::{self, read_ptr, Call};
use crate::real::runtime::Stream;

/// Record a device allocation made by `real` (sizes known only after it ran come from
/// `size`, read on success).
fn device_alloc(
    kind: Kind,
    flags: u64,
    stream: u64,
    real: impl FnOnce() -> c_int,
    addr_size: impl FnOnce() -> (u64, u64),
) -> Option<c_int> {
    let s = runtime_state()?;
    let call = Call::new(kind, state::alloc_device(s), 0, flags, stream);
    Some(observe::alloc_sized(s, call, real, addr_size))
}

#[no_mangle]
pub extern "C" fn cudaMallocManaged(p: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    crate::ffi::failopen::around(
        "cudaMallocManaged",
        || call_real!(cudaMallocManaged(p, size, flags)),
        |real| {
            device_alloc(Kind::Managed, u64::from(flags), 0, real, || {
                (read_ptr(p), size as u64)
            })
            .unwrap_or_else(real)
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaMallocPitch(
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> c_int {
    crate::ffi::failopen::around(
        "cudaMallocPitch",
        || call_real!(cudaMallocPitch(p, pitch, width, height)),
        |real| {
            device_alloc(Kind::Pitched, 0, 0, real, || {
                let pt = observe::read_out(pitch as *const usize as *const u64);
                (read_ptr(p), pt.saturating_mul(height as u64))
            })
            .unwrap_or_else(real)
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaMalloc3D(pp: *mut PitchedPtr, extent: Extent) -> c_int {
    crate::ffi::failopen::around(
        "cudaMalloc3D",
        || call_real!(cudaMalloc3D(pp, extent)),
        |real| {
            device_alloc(Kind::Malloc3D, 0, 0, real, || {
                if pp.is_null() {
                    return (0, 0);
                }
                // SAFETY: non-null, and the real function filled it on success.
                let v = unsafe { *pp };
                let rows = extent.height.saturating_mul(extent.depth);
                (v.ptr as u64, v.pitch.saturating_mul(rows) as u64)
            })
            .unwrap_or_else(real)
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaMallocFromPoolAsync(
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: Stream,
) -> c_int {
    crate::per_thread::note_stream(stream as usize);
    crate::ffi::failopen::around(
        "cudaMallocFromPoolAsync",
        || call_real!(cudaMallocFromPoolAsync(p, size, pool, stream)),
        |real| {
            device_alloc(Kind::Pool, pool as u64, stream as u64, real, || {
                (read_ptr(p), size as u64)
            })
            .unwrap_or_else(real)
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaMallocFromPoolAsync_ptsz(
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: Stream,
) -> c_int {
    crate::per_thread::note_ptds();
    crate::ffi::failopen::around(
        "cudaMallocFromPoolAsync_ptsz",
        || call_real!(cudaMallocFromPoolAsync_ptsz(p, size, pool, stream)),
        |real| {
            let on = crate::life::capture::ptsz(stream as u64);
            device_alloc(Kind::Pool, pool as u64, on, real, || {
                (read_ptr(p), size as u64)
            })
            .unwrap_or_else(real)
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> c_int {
    crate::ffi::failopen::around(
        "cudaHostRegister",
        || call_real!(cudaHostRegister(p, size, flags)),
        |real| {
            let Some(s) = runtime_state() else {
                return real();
            };
            let call = Call {
                kind: Kind::HostRegister,
                device: -1,
                size: size as u64,
                flags: u64::from(flags),
                stream: 0,
            };
            observe::alloc(s, call, real, || p as u64)
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaHostUnregister(p: *mut c_void) -> c_int {
    crate::ffi::failopen::around(
        "cudaHostUnregister",
        || call_real!(cudaHostUnregister(p)),
        |real| match runtime_state() {
            Some(s) => observe::host_free(s, p as u64, real),
            None => real(),
        },
    )
}
