//! The calling thread's stack bounds, for unwinders that must never read outside them.
//!
//! Invariant: the answer comes from `pthread_getattr_np` and is `None` when the thread's
//! stack cannot be known (the unwinders then stop instead of guessing). Callers cache it per
//! thread: it allocates inside glibc on some threads and must stay off the hot path.

/// The calling thread's stack `lo..hi`.
pub fn bounds() -> Option<(u64, u64)> {
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed after;
    // the out-pointers are valid locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        let lo = addr as u64;
        (rc == 0 && lo != 0 && size >= 16).then(|| (lo, lo + size as u64))
    }
}
