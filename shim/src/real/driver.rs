//! The real driver functions behind the driver hooks, and the real `dlsym`.
//!
//! Invariants: a [`RealFn`] holds either nothing or the address of the real driver (or
//! runtime) function of its name, never a function of libcushim.so (so a hook can never
//! forward to itself); once set it never changes. Which one: see [`RealFn`]'s policy; it is
//! never found by loading a library. Nothing here initializes the shim or CUDA.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Stand-in when libc's `dlsym` cannot be found (never expected): nothing is found.
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// libc's own `dlsym`: `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, else "GLIBC_2.2.5".
/// Never null (falls back to [`no_dlsym`]).
pub fn real_dlsym_addr() -> usize {
    let a = REAL_DLSYM.load(Ordering::Acquire);
    if a != 0 {
        return a;
    }
    let mut p = std::ptr::null_mut();
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings; dlvsym is not overridden.
        p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !p.is_null() {
            break;
        }
    }
    let a = if p.is_null() {
        no_dlsym as *const () as usize
    } else {
        p as usize
    };
    REAL_DLSYM.store(a, Ordering::Release);
    a
}

/// Call libc's `dlsym`.
///
/// # Safety
/// As `dlsym`: `handle` from `dlopen` (or a pseudo-handle), `name` NUL-terminated.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let a = real_dlsym_addr();
    // SAFETY: `a` is libc's dlsym (or `no_dlsym`), both of type `DlsymFn`.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(a) };
    // SAFETY: the caller passes a handle and a NUL-terminated name, as dlsym requires.
    unsafe { f(handle, name) }
}

static OUR_BASE: AtomicUsize = AtomicUsize::new(0);

/// Whether `addr` lies in libcushim.so.
pub fn in_shim(addr: usize) -> bool {
    let mut ours = OUR_BASE.load(Ordering::Relaxed);
    if ours == 0 {
        ours =
            crate::ffi::callsite::module_base(in_shim as *const () as usize).unwrap_or(usize::MAX);
        OUR_BASE.store(ours, Ordering::Relaxed);
    }
    addr != 0 && crate::ffi::callsite::module_base(addr) == Some(ours)
}

/// One real driver function, by name.
///
/// Which function a hook forwards to, policy: the next definition of its name after the shim
/// in the process's global search order (`RTLD_NEXT`), i.e. the next layer down: the driver,
/// or an interposer stacked between the shim and the driver (a `libcuda.so.1` wrapper), so a
/// call passes each layer once however the program got the hook (link, `dlsym`,
/// `cuGetProcAddress`). Only when no such definition exists (the driver or runtime was loaded
/// privately, `RTLD_LOCAL`) is it what a `dlsym` on a library handle or `cuGetProcAddress`
/// returned for the hook ([`RealFn::offer`]), else the function in an already loaded
/// `libcuda.so.1` (`libcudart.so.12`/`.13` for `cuda*` names).
pub struct RealFn {
    name: &'static CStr,
    /// The function the hook forwards to, once decided (never changes after).
    addr: AtomicUsize,
    /// The first non-shim address handed out for this name by a handle lookup.
    offered: AtomicUsize,
}

impl RealFn {
    pub const fn new(name: &'static CStr) -> RealFn {
        RealFn {
            name,
            addr: AtomicUsize::new(0),
            offered: AtomicUsize::new(0),
        }
    }

    pub fn name(&self) -> &'static CStr {
        self.name
    }

    /// Remember `addr`, the real function a handle lookup found, if none was yet and it is
    /// not ours.
    pub fn offer(&self, addr: usize) {
        if addr == 0 || self.offered.load(Ordering::Relaxed) != 0 || in_shim(addr) {
            return;
        }
        let _ = self
            .offered
            .compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Decide the forwarding target once (see the type's policy).
    fn decide(&self, addr: usize) {
        if addr != 0 && !in_shim(addr) {
            let _ = self
                .addr
                .compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The real function's address, decided on first use.
    pub fn get(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return Some(a);
        }
        // SAFETY: a pseudo-handle and a NUL-terminated name.
        self.decide(unsafe { real_dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize);
        if self.addr.load(Ordering::Acquire) == 0 {
            self.decide(self.offered.load(Ordering::Acquire));
        }
        // A library loaded privately (a runtime that dlopen'ed the driver, ctypes loading the
        // runtime with RTLD_LOCAL): look in that copy, never load.
        let libs: &[&CStr] = if self.name.to_bytes().starts_with(b"cuda") {
            &[c"libcudart.so.12", c"libcudart.so.13"]
        } else {
            &[c"libcuda.so.1"]
        };
        for lib in libs {
            if self.addr.load(Ordering::Acquire) != 0 {
                break;
            }
            // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded library.
            let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
            if !h.is_null() {
                // SAFETY: a live handle and a NUL-terminated name.
                self.decide(unsafe { real_dlsym(h, self.name.as_ptr()) } as usize);
                // SAFETY: balances the reference RTLD_NOLOAD took; the library stays loaded.
                unsafe { libc::dlclose(h) };
            }
        }
        let a = self.addr.load(Ordering::Acquire);
        (a != 0).then_some(a)
    }
}

/// Call the real driver function `$real` (a [`RealFn`]) as type `$ty`, or return
/// `CUDA_ERROR_NOT_FOUND` (500) when the driver has no such function. The arguments are
/// plain variables holding the program's own arguments.
#[macro_export]
macro_rules! call_driver {
    ($real:expr, $ty:ty, ($($a:expr),*)) => {
        match $real.get() {
            #[allow(clippy::macro_metavars_in_unsafe)]
            Some(addr) => {
                // SAFETY: `addr` is the real driver function of this name, whose C type is
                // `$ty`; the program's own arguments are forwarded unchanged.
                let f = unsafe { std::mem::transmute::<usize, $ty>(addr) };
                // SAFETY: as above.
                unsafe { f($($a),*) }
            }
            None => 500,
        }
    };
}

/// A hook and the real function it stands for.
pub struct Hook {
    pub hook: usize,
    pub real: &'static RealFn,
}
