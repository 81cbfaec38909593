//! Peer access carried onto expandable segments (`cudaDeviceEnablePeerAccess`,
//! `cudaDeviceDisablePeerAccess`, `cuCtxEnablePeerAccess`, `cuCtxDisablePeerAccess`).
//!
//! The problem: peer access governs `cuMemAlloc` memory only; virtual-memory mappings are
//! reachable from exactly the devices `cuMemSetAccess` names. The cache maps expandable
//! pages for their own device only, so a program that enabled peer access would fault
//! touching a peer's tensor that happens to live in an expandable segment.
//!
//! Policy (why: the program must see expandable memory behave as ordinary allocations do):
//! - When the driver accepts the program's enabling of access from device D to device P,
//!   D may read and write every expandable page of P: the pages mapped now are granted
//!   (`cuMemSetAccess` for D over each mapped range), and every page mapped later for P is
//!   granted to D in the same step that grants P itself (a failure there fails the growth,
//!   as a failed `cuMemSetAccess` for P does).
//! - When the driver accepts the disabling, D's access to P's mapped pages is removed
//!   (`PROT_NONE` for D) and later pages are no longer granted to it.
//! - The enabled pairs are one bit matrix of atomic words (row P: the devices that may
//!   access P; `driver/peers.rs`, which the cache's mapping path calls), so the mapping path reads one word and allocates nothing when no peer is
//!   enabled. The program's call is answered by the driver, unchanged; a failure to carry
//!   it onto a mapped range already unmapped by a racing free is ignored (nothing is left
//!   to grant there).
//!
//! Fail open (`ffi/failopen.rs`, `failopen::around`): the real call is made once, with the
//! program's own arguments (the shim substitutes none here). An internal failure before it
//! forwards the call; one after it (carrying the change onto the mappings) keeps the
//! driver's answer. Either way caching goes off for new allocations, with one `cushim:`
//! line, so every later allocation is the driver's own, which peer access governs as
//! without the shim. What a failure after the real call can leave undone is the carrying
//! itself: expandable pages the cache mapped before may then lack (or keep) the peer's
//! access. The pair is still recorded first when the failure comes later, so pages mapped
//! afterwards follow it.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys as cu;

use crate::driver::entry as de;
use crate::driver::peers;

use crate::call_driver;
use crate::call_real;
use crate::ffi::failopen::{self, Point};
use crate::ffi::intercept::{enabled, inside, Inside, Layer};
use crate::ffi::SUCCESS;
use crate::real::driver::RealFn;

/// Record that `from` may (or may no longer) access `to`, and carry it onto `to`'s mapped
/// expandable pages.
fn changed(from: i32, to: i32, enable: bool) {
    if !peers::record(from, to, enable) {
        return;
    }
    failopen::inject(Point::Peer);
    let Some(s) = crate::life::state::get_if_ready() else {
        return;
    };
    let flags = if enable {
        cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    } else {
        cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
    };
    let desc = peers::access_desc(from, flags);
    let _inside = Inside::enter();
    for seg in s.alloc.segments(to).iter().filter(|g| g.is_expandable) {
        // SAFETY: a range the cache has mapped (or, racing a release, had mapped: the
        // driver then refuses and nothing changes); one descriptor of ours.
        let _ = unsafe { de::cuMemSetAccess(seg.address, seg.total_size as usize, &desc, 1) };
    }
}

/// The device of the calling thread's current context.
fn current_device() -> Option<i32> {
    let mut d: c_int = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { de::cuCtxGetDevice(&mut d) };
    (rc == de::SUCCESS).then_some(d)
}

/// The device of context `ctx`.
fn ctx_device(ctx: *mut c_void) -> Option<i32> {
    // SAFETY: pushing the program's own context (the driver checks it), reading its device,
    // popping it again.
    unsafe {
        if de::cuCtxPushCurrent_v2(ctx as cu::CUcontext) != de::SUCCESS {
            return None;
        }
        let d = current_device();
        let mut old: cu::CUcontext = std::ptr::null_mut();
        let _ = de::cuCtxPopCurrent_v2(&mut old);
        d
    }
}

pub static REAL_ENABLE: RealFn = RealFn::new(c"cuCtxEnablePeerAccess");
pub static REAL_DISABLE: RealFn = RealFn::new(c"cuCtxDisablePeerAccess");

type EnableFn = unsafe extern "C" fn(*mut c_void, c_uint) -> c_int;
type DisableFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// Whether a driver hook applies the policy on this thread.
fn driver_layer() -> bool {
    enabled(Layer::Driver) && !inside()
}

fn after_driver(rc: c_int, peer: *mut c_void, enable: bool) {
    if rc != SUCCESS || !driver_layer() {
        return;
    }
    let _inside = Inside::enter();
    if let (Some(from), Some(to)) = (current_device(), ctx_device(peer)) {
        changed(from, to, enable);
    }
}

#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: *mut c_void, flags: c_uint) -> c_int {
    failopen::around(
        "cuCtxEnablePeerAccess",
        || {
            let _inside = Inside::enter();
            call_driver!(REAL_ENABLE, EnableFn, (peer, flags))
        },
        |real| {
            if driver_layer() {
                failopen::inject(Point::Peer);
            }
            let rc = real();
            after_driver(rc, peer, true);
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: *mut c_void) -> c_int {
    failopen::around(
        "cuCtxDisablePeerAccess",
        || {
            let _inside = Inside::enter();
            call_driver!(REAL_DISABLE, DisableFn, (peer))
        },
        |real| {
            if driver_layer() {
                failopen::inject(Point::Peer);
            }
            let rc = real();
            after_driver(rc, peer, false);
            rc
        },
    )
}

fn after_runtime(rc: c_int, peer: c_int, enable: bool) {
    if rc != SUCCESS || !enabled(Layer::Runtime) {
        return;
    }
    let mut dev: c_int = -1;
    let out = &mut dev as *mut c_int;
    if call_real!(cudaGetDevice(out)) == SUCCESS {
        let _inside = Inside::enter();
        changed(dev, peer, enable);
    }
}

#[no_mangle]
pub extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> c_int {
    failopen::around(
        "cudaDeviceEnablePeerAccess",
        || call_real!(cudaDeviceEnablePeerAccess(peer, flags)),
        |real| {
            if enabled(Layer::Runtime) {
                failopen::inject(Point::Peer);
            }
            let rc = real();
            after_runtime(rc, peer, true);
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> c_int {
    failopen::around(
        "cudaDeviceDisablePeerAccess",
        || call_real!(cudaDeviceDisablePeerAccess(peer)),
        |real| {
            if enabled(Layer::Runtime) {
                failopen::inject(Point::Peer);
            }
            let rc = real();
            after_runtime(rc, peer, false);
            rc
        },
    )
}
