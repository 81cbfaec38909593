//! The `dlclose` interposer: counts unloads for the module epochs of recorded stacks
//! (engine `trace/module_epochs.rs`), so that frames of a library unloaded after a capture
//! are never symbolized as the library mapped at its address later.
//!
//! Invariants: the program's call always reaches libc's `dlclose` with its argument
//! unchanged and its result returned; the bookkeeping runs only while stacks are recorded,
//! and a panic in it is caught (the unload still happens).

use std::ffi::{c_int, c_void};
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicUsize, Ordering};

use cushim::trace::module_epochs;

use crate::real::driver::real_dlsym;

type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

static REAL: AtomicUsize = AtomicUsize::new(0);

/// libc's `dlclose` (the next definition after libcushim.so).
fn real_dlclose() -> Option<DlcloseFn> {
    let mut a = REAL.load(Ordering::Acquire);
    if a == 0 {
        // SAFETY: libc's dlsym with RTLD_NEXT and a NUL-terminated name, called from here, so
        // "next" means after libcushim.so.
        a = unsafe { real_dlsym(libc::RTLD_NEXT, c"dlclose".as_ptr()) } as usize;
        if a == 0 {
            return None;
        }
        REAL.store(a, Ordering::Release);
    }
    // SAFETY: `a` is libc's dlclose, of type `DlcloseFn`.
    Some(unsafe { std::mem::transmute::<usize, DlcloseFn>(a) })
}

/// # Safety
/// As libc's `dlclose`: a handle from `dlopen`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = real_dlclose() else {
        return -1;
    };
    let tracking = module_epochs::tracking();
    if tracking {
        let _ = catch_unwind(module_epochs::before_unload);
    }
    // SAFETY: the program's own handle, forwarded unchanged.
    let rc = unsafe { real(handle) };
    if tracking {
        let _ = catch_unwind(module_epochs::after_unload);
    }
    rc
}
