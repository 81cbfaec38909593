//! Driver hooks of the allocation families the cache does not serve: virtual memory
//! (`cuMemCreate`/`cuMemRelease`, `cuMemMap`/`cuMemUnmap`, `cuMemAddressReserve`/
//! `cuMemAddressFree`), managed (`cuMemAllocManaged`), pitched (`cuMemAllocPitch_v2`), pools
//! (`cuMemAllocFromPoolAsync` and `_ptsz`) and host registration (`cuMemHostRegister_v2`/
//! `cuMemHostUnregister`); handed out by `dlsym` and `cuGetProcAddress` for exact
//! (name, version, flags) requests (rows of `lookup/table.rs`).
//!
//! Invariant: in both modes each call goes to the real driver function with the program's
//! arguments and its result is returned unchanged; a success is recorded (`observe`). The
//! shim's own VMM calls (expandable segments) go through the driver's `cuGetProcAddress`
//! (`driver/entry.rs`), never through here.

use std::ffi::{c_int, c_uint, c_void};

use cushim::alloc::observed::Kind;

use crate::call_driver;
use crate::exports::driver::{hook, CuStream, DevPtr};
use crate::observe::driver::driver_device;
use crate::observe::{self, read_out, Call};
use crate::real::driver::RealFn;

pub static REAL_MEM_CREATE: RealFn = RealFn::new(c"cuMemCreate");
pub static REAL_MEM_RELEASE: RealFn = RealFn::new(c"cuMemRelease");
pub static REAL_MEM_MAP: RealFn = RealFn::new(c"cuMemMap");
pub static REAL_MEM_UNMAP: RealFn = RealFn::new(c"cuMemUnmap");
pub static REAL_ADDRESS_RESERVE: RealFn = RealFn::new(c"cuMemAddressReserve");
pub static REAL_ADDRESS_FREE: RealFn = RealFn::new(c"cuMemAddressFree");
pub static REAL_ALLOC_MANAGED: RealFn = RealFn::new(c"cuMemAllocManaged");
pub static REAL_ALLOC_PITCH: RealFn = RealFn::new(c"cuMemAllocPitch_v2");
pub static REAL_ALLOC_FROM_POOL: RealFn = RealFn::new(c"cuMemAllocFromPoolAsync");
pub static REAL_ALLOC_FROM_POOL_PTSZ: RealFn = RealFn::new(c"cuMemAllocFromPoolAsync_ptsz");
pub static REAL_HOST_REGISTER: RealFn = RealFn::new(c"cuMemHostRegister_v2");
pub static REAL_HOST_UNREGISTER: RealFn = RealFn::new(c"cuMemHostUnregister");

/// `CUmemAllocationProp` up to its location (the device the handle's memory is on).
#[repr(C)]
struct PropHead {
    type_: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
}

type CreateFn = unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> c_int;
type ReleaseFn = unsafe extern "C" fn(u64) -> c_int;
type MapFn = unsafe extern "C" fn(DevPtr, usize, usize, u64, u64) -> c_int;
type RangeFn = unsafe extern "C" fn(DevPtr, usize) -> c_int;
type ReserveFn = unsafe extern "C" fn(*mut DevPtr, usize, usize, DevPtr, u64) -> c_int;
type ManagedFn = unsafe extern "C" fn(*mut DevPtr, usize, c_uint) -> c_int;
type PitchFn = unsafe extern "C" fn(*mut DevPtr, *mut usize, usize, usize, c_uint) -> c_int;
type PoolFn = unsafe extern "C" fn(*mut DevPtr, usize, *mut c_void, CuStream) -> c_int;
type RegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int;
type UnregisterFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The driver's result `rc`, unchanged, after `note` has recorded the call's effect when it
/// succeeded (a failed call changed nothing, so nothing is recorded).
fn noted(rc: c_int, note: impl FnOnce()) -> Option<c_int> {
    if rc == crate::ffi::SUCCESS {
        // A failure while recording leaves the real call's result standing (never a
        // second real call).
        crate::ffi::failopen::note("a VMM record", || {
            crate::ffi::failopen::inject(crate::ffi::failopen::Point::Vmm);
            note()
        });
    }
    Some(rc)
}

#[no_mangle]
pub extern "C" fn cuMemCreate(h: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    let real = || call_driver!(REAL_MEM_CREATE, CreateFn, (h, size, prop, flags));
    hook(
        "cuMemCreate",
        |s| {
            let stack = s.history.alloc_stack();
            noted(real(), || {
                if !prop.is_null() {
                    // SAFETY: the real call accepted `prop` as a CUmemAllocationProp.
                    let dev = unsafe { (*(prop as *const PropHead)).location_id };
                    s.observed
                        .create(dev, read_out(h), size as u64, flags, stack);
                }
            })
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemRelease(h: u64) -> c_int {
    let real = || call_driver!(REAL_MEM_RELEASE, ReleaseFn, (h));
    hook(
        "cuMemRelease",
        |s| noted(real(), || s.observed.release(h)),
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemMap(ptr: DevPtr, size: usize, offset: usize, h: u64, flags: u64) -> c_int {
    let real = || call_driver!(REAL_MEM_MAP, MapFn, (ptr, size, offset, h, flags));
    hook(
        "cuMemMap",
        |s| {
            let stack = s.history.alloc_stack();
            noted(real(), || s.observed.map(ptr, size as u64, h, stack))
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: DevPtr, size: usize) -> c_int {
    let real = || call_driver!(REAL_MEM_UNMAP, RangeFn, (ptr, size));
    hook(
        "cuMemUnmap",
        |s| {
            noted(real(), || {
                s.observed.unmap(ptr, size as u64, s.history.free_stack())
            })
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemAddressReserve(
    out: *mut DevPtr,
    size: usize,
    align: usize,
    addr: DevPtr,
    flags: u64,
) -> c_int {
    let real = || {
        call_driver!(
            REAL_ADDRESS_RESERVE,
            ReserveFn,
            (out, size, align, addr, flags)
        )
    };
    hook(
        "cuMemAddressReserve",
        |s| {
            let stack = s.history.alloc_stack();
            noted(real(), || {
                s.observed
                    .reserve(driver_device(s), read_out(out), size as u64, stack)
            })
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: DevPtr, size: usize) -> c_int {
    let real = || call_driver!(REAL_ADDRESS_FREE, RangeFn, (ptr, size));
    hook(
        "cuMemAddressFree",
        |s| noted(real(), || s.observed.address_free(ptr)),
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocManaged(out: *mut DevPtr, size: usize, flags: c_uint) -> c_int {
    let real = || call_driver!(REAL_ALLOC_MANAGED, ManagedFn, (out, size, flags));
    hook(
        "cuMemAllocManaged",
        |s| {
            let call = Call::new(
                Kind::Managed,
                driver_device(s),
                size as u64,
                flags.into(),
                0,
            );
            Some(observe::alloc(s, call, real, || read_out(out)))
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocPitch_v2(
    out: *mut DevPtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> c_int {
    let real = || {
        call_driver!(
            REAL_ALLOC_PITCH,
            PitchFn,
            (out, pitch, width, height, element)
        )
    };
    hook(
        "cuMemAllocPitch_v2",
        |s| {
            let call = Call::new(Kind::Pitched, driver_device(s), 0, u64::from(element), 0);
            Some(observe::alloc_sized(s, call, real, || {
                if pitch.is_null() {
                    return (0, 0);
                }
                // SAFETY: non-null, written by the real call on success.
                let pt = unsafe { *pitch } as u64;
                (read_out(out), pt.saturating_mul(height as u64))
            }))
        },
        real,
    )
}

fn from_pool(
    what: &str,
    real_fn: &'static RealFn,
    out: *mut DevPtr,
    size: usize,
    pool: *mut c_void,
    stream: CuStream,
) -> c_int {
    let real = || call_driver!(real_fn, PoolFn, (out, size, pool, stream));
    hook(
        what,
        |s| {
            let call = Call::new(
                Kind::Pool,
                driver_device(s),
                size as u64,
                pool as u64,
                stream as u64,
            );
            Some(observe::alloc(s, call, real, || read_out(out)))
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync(
    out: *mut DevPtr,
    size: usize,
    pool: *mut c_void,
    stream: CuStream,
) -> c_int {
    crate::per_thread::note_stream(stream as usize);
    from_pool(
        "cuMemAllocFromPoolAsync",
        &REAL_ALLOC_FROM_POOL,
        out,
        size,
        pool,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    out: *mut DevPtr,
    size: usize,
    pool: *mut c_void,
    stream: CuStream,
) -> c_int {
    crate::per_thread::note_ptds();
    from_pool(
        "cuMemAllocFromPoolAsync_ptsz",
        &REAL_ALLOC_FROM_POOL_PTSZ,
        out,
        size,
        pool,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> c_int {
    let real = || call_driver!(REAL_HOST_REGISTER, RegisterFn, (p, size, flags));
    hook(
        "cuMemHostRegister_v2",
        |s| {
            let call = Call::new(Kind::HostRegister, -1, size as u64, flags.into(), 0);
            Some(observe::alloc(s, call, real, || p as u64))
        },
        real,
    )
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> c_int {
    let real = || call_driver!(REAL_HOST_UNREGISTER, UnregisterFn, (p));
    hook(
        "cuMemHostUnregister",
        |s| Some(observe::host_free(s, p as u64, real)),
        || observe::forget_host_then(p as u64, real),
    )
}
