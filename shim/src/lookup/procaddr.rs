//! `cuGetProcAddress` / `cuGetProcAddress_v2` wrappers: how a static CUDA runtime (and the
//! dynamic one, and driver-API programs) obtain driver entry points by base name and version.
//!
//! Invariants: the real function answers first, and its answer stands unless it succeeded
//! with a non-NULL pointer for an exact known request: a base name whose entry point the
//! shim hooks (allocation, streams, IPC of cached blocks, peer access), asked with at least the CUDA version that introduced the ABI of the hook
//! (`cuMemAlloc` >= 3020 is `cuMemAlloc_v2`; older requests keep the driver's older entry
//! point), per-thread variant (`_ptsz`) when flag 2 asks for it or the driver answered with
//! its `_ptsz` function. Then only the pointer is swapped, for the hook of the same ABI. The
//! wrappers never initialize the shim or CUDA (`cuGetExportTable` is passed through
//! untouched), and substitute nothing for calls from inside the shim. With
//! `CUSHIM_LOG_PROCADDR=1` each request is logged on stderr with the hook it got, if any.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::call_driver;
use crate::ffi::intercept::{enabled, inside, Layer};
use crate::lookup::table::{by_symbol, hooked_symbol};
use crate::real::driver::RealFn;

pub static REAL_GPA: RealFn = RealFn::new(c"cuGetProcAddress");
pub static REAL_GPA_V2: RealFn = RealFn::new(c"cuGetProcAddress_v2");

type GpaFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;
type GpaV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

static LOG: AtomicU8 = AtomicU8::new(0);

/// Whether `CUSHIM_LOG_PROCADDR` asks for one stderr line per request (read once, getenv).
fn logging() -> bool {
    let v = LOG.load(Ordering::Relaxed);
    if v != 0 {
        return v == 2;
    }
    // SAFETY: getenv with a NUL-terminated name; the value is only tested for presence.
    let p = unsafe { libc::getenv(c"CUSHIM_LOG_PROCADDR".as_ptr()) };
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    let on = !p.is_null() && !matches!(unsafe { CStr::from_ptr(p) }.to_bytes(), b"" | b"0");
    LOG.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    on
}

/// After the real lookup: swap `*pfn` for our hook when it succeeded for a known request.
fn substitute(rc: c_int, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller passed a NUL-terminated name and a valid out-pointer.
        let (name, got) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn as usize) };
        let hook = if rc == 0 && got != 0 && enabled(Layer::Driver) && !inside() {
            hooked_symbol(name, version, flags, got)
        } else {
            None
        };
        if logging() {
            eprintln!(
                "cushim: cuGetProcAddress {} {version} {flags} -> {rc}{}",
                String::from_utf8_lossy(name),
                hook.map_or(String::new(), |h| format!(
                    " hook {}",
                    String::from_utf8_lossy(h)
                ))
            );
        }
        let Some(hook) = hook.and_then(by_symbol) else {
            if hook.is_none() && rc == 0 && enabled(Layer::Driver) && !inside() {
                if let Some(stub) = crate::per_thread::driver_stub(name, version, flags, got) {
                    // SAFETY: `pfn` is the caller's valid out-pointer.
                    unsafe { *pfn = stub as *mut c_void };
                }
            }
            return;
        };
        hook.real.offer(got);
        // SAFETY: `pfn` is the caller's valid out-pointer.
        unsafe { *pfn = hook.hook as *mut c_void };
    }));
}

#[no_mangle]
pub extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> c_int {
    let rc = call_driver!(REAL_GPA, GpaFn, (symbol, pfn, version, flags));
    substitute(rc, symbol, pfn, version, flags);
    rc
}

#[no_mangle]
pub extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let rc = call_driver!(REAL_GPA_V2, GpaV2Fn, (symbol, pfn, version, flags, status));
    substitute(rc, symbol, pfn, version, flags);
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_the_hooks_abi_are_not_substituted() {
        assert_eq!(
            hooked_symbol(b"cuMemAlloc", 3020, 0, 1),
            Some(&b"cuMemAlloc_v2"[..])
        );
        assert_eq!(
            hooked_symbol(b"cuMemAlloc", 12090, 0, 1),
            Some(&b"cuMemAlloc_v2"[..])
        );
        assert_eq!(hooked_symbol(b"cuMemAlloc", 3010, 0, 1), None);
        assert_eq!(hooked_symbol(b"cuStreamDestroy", 2000, 0, 1), None);
        assert_eq!(
            hooked_symbol(b"cuGetProcAddress", 11030, 0, 1),
            Some(&b"cuGetProcAddress"[..])
        );
        assert_eq!(
            hooked_symbol(b"cuGetProcAddress", 12000, 0, 1),
            Some(&b"cuGetProcAddress_v2"[..])
        );
    }

    #[test]
    fn per_thread_flag_selects_the_ptsz_hook() {
        assert_eq!(
            hooked_symbol(b"cuMemAllocAsync", 11020, 2, 1),
            Some(&b"cuMemAllocAsync_ptsz"[..])
        );
        assert_eq!(
            hooked_symbol(b"cuMemFreeAsync", 11020, 2, 1),
            Some(&b"cuMemFreeAsync_ptsz"[..])
        );
    }

    #[test]
    fn default_mode_keeps_the_variant_the_driver_answered_with() {
        // Stand-in "real" functions: any two addresses outside libcushim.so.
        let legacy = libc::malloc as *const () as usize;
        let per_thread = libc::free as *const () as usize;
        by_symbol(b"cuMemFreeAsync_ptsz")
            .expect("hook")
            .real
            .offer(per_thread);
        assert_eq!(
            hooked_symbol(b"cuMemFreeAsync", 11020, 0, per_thread),
            Some(&b"cuMemFreeAsync_ptsz"[..])
        );
        assert_eq!(
            hooked_symbol(b"cuMemFreeAsync", 11020, 0, legacy),
            Some(&b"cuMemFreeAsync"[..])
        );
        // An explicit legacy request keeps the legacy hook whatever the answer.
        assert_eq!(
            hooked_symbol(b"cuMemFreeAsync", 11020, 1, per_thread),
            Some(&b"cuMemFreeAsync"[..])
        );
    }

    #[test]
    fn of_everything_nvidias_static_runtime_asks_for_only_allocation_stream_and_capture_entry_points_are_hooked(
    ) {
        for version in ["12.9", "13.2", "13.5"] {
            hooked_in_list(version);
        }
    }

    /// The substitutions for one measured request list (CUDA 13 keeps every allocation
    /// entry point's 12.9 version and flags, so the same set).
    fn hooked_in_list(version: &str) {
        let path = format!(
            "{}/../tests/data/cudart-{version}-static-getprocaddress.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).expect("the measured request list");
        let mut hooked = Vec::new();
        let mut n = 0;
        for line in text.lines().filter(|l| l.starts_with("cu")) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (version, flags) = (f[1].parse().expect("version"), f[2].parse().expect("flags"));
            n += 1;
            if let Some(h) = hooked_symbol(f[0].as_bytes(), version, flags, 1) {
                hooked.push(format!(
                    "{} {version} {flags} {}",
                    f[0],
                    String::from_utf8_lossy(h)
                ));
            }
        }
        assert!(n > 400, "{n} requests");
        hooked.sort();
        let expect = [
            "cuCtxDisablePeerAccess 4000 0 cuCtxDisablePeerAccess",
            "cuCtxEnablePeerAccess 4000 0 cuCtxEnablePeerAccess",
            "cuGetProcAddress 11030 0 cuGetProcAddress",
            "cuGetProcAddress 12000 0 cuGetProcAddress_v2",
            "cuIpcCloseMemHandle 4010 0 cuIpcCloseMemHandle",
            "cuIpcGetMemHandle 4010 0 cuIpcGetMemHandle",
            "cuIpcOpenMemHandle 11000 0 cuIpcOpenMemHandle_v2",
            "cuIpcOpenMemHandle 4010 0 cuIpcOpenMemHandle",
            "cuMemAlloc 3020 0 cuMemAlloc_v2",
            "cuMemAllocAsync 11020 0 cuMemAllocAsync",
            "cuMemAllocAsync 11020 2 cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync 11020 0 cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync 11020 2 cuMemAllocFromPoolAsync_ptsz",
            "cuMemAllocManaged 6000 0 cuMemAllocManaged",
            "cuMemAllocPitch 3020 0 cuMemAllocPitch_v2",
            "cuMemFree 3020 0 cuMemFree_v2",
            "cuMemFreeAsync 11020 0 cuMemFreeAsync",
            "cuMemFreeAsync 11020 2 cuMemFreeAsync_ptsz",
            "cuMemFreeHost 2000 0 cuMemFreeHost",
            "cuMemGetAddressRange 3020 0 cuMemGetAddressRange_v2",
            "cuMemGetInfo 3020 0 cuMemGetInfo_v2",
            "cuMemHostAlloc 2020 0 cuMemHostAlloc",
            "cuMemHostRegister 6050 0 cuMemHostRegister_v2",
            "cuMemHostUnregister 4000 0 cuMemHostUnregister",
            "cuPointerGetAttribute 4000 0 cuPointerGetAttribute",
            "cuPointerGetAttributes 7000 0 cuPointerGetAttributes",
            "cuStreamBeginCapture 10010 0 cuStreamBeginCapture_v2",
            "cuStreamBeginCapture 10010 2 cuStreamBeginCapture_v2_ptsz",
            "cuStreamCreate 2000 0 cuStreamCreate",
            "cuStreamCreateWithPriority 5050 0 cuStreamCreateWithPriority",
            "cuStreamDestroy 4000 0 cuStreamDestroy_v2",
            "cuStreamEndCapture 10000 0 cuStreamEndCapture",
            "cuStreamEndCapture 10000 2 cuStreamEndCapture_ptsz",
        ];
        assert_eq!(hooked, expect, "{version}");
    }

    #[test]
    fn names_are_matched_exactly() {
        for n in [
            &b"cuMemAlloc_v2"[..],
            b"cuMemAllocPitch_v2",
            b"cuMemAllocManagedX",
            b"cuMemPoolCreate",
            b"cudnnCreate",
            b"cuMem",
            b"",
        ] {
            assert_eq!(hooked_symbol(n, 12090, 0, 1), None);
        }
        assert!(by_symbol(b"cuGetProcAddress_v2").is_some());
        assert!(by_symbol(b"cuGetProcAddress_v3").is_none());
        assert!(by_symbol(b"cuGetExportTable").is_none());
        assert_eq!(hooked_symbol(b"cuMemAllocPitch", 3010, 0, 1), None);
        assert_eq!(
            hooked_symbol(b"cuMemAllocPitch", 3020, 0, 1),
            Some(&b"cuMemAllocPitch_v2"[..])
        );
        assert_eq!(hooked_symbol(b"cuMemCreate", 10010, 0, 1), None);
        assert!(by_symbol(b"cuMemCreate").is_some());
        assert!(by_symbol(b"cuMemAllocPitch").is_none());
    }
}
