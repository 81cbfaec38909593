//! The runtime's sticky "last error" for errors the shim returns itself.
//!
//! Invariant: an error returned by a shim export is reported once by the next
//! `cudaGetLastError` on the same thread (which clears it) and by every `cudaPeekAtLastError`
//! until then, exactly as the real runtime reports its own errors; the real runtime's own
//! last error is cleared or peeked alongside.

use std::cell::Cell;
use std::ffi::c_int;

use crate::ffi::SUCCESS;

thread_local! {
    static LAST: Cell<c_int> = const { Cell::new(0) };
}

/// Remember `code` (if it is an error) and return it.
pub fn set(code: c_int) -> c_int {
    if code != SUCCESS {
        LAST.with(|l| l.set(code));
    }
    code
}

#[no_mangle]
pub extern "C" fn cudaGetLastError() -> c_int {
    crate::ffi::failopen::around(
        "cudaGetLastError",
        || crate::call_real!(cudaGetLastError()),
        |real| {
            let ours = LAST.with(|l| l.replace(SUCCESS));
            let real = real();
            if ours != SUCCESS {
                ours
            } else {
                real
            }
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaPeekAtLastError() -> c_int {
    crate::ffi::failopen::around(
        "cudaPeekAtLastError",
        || crate::call_real!(cudaPeekAtLastError()),
        |real| {
            let ours = LAST.with(|l| l.get());
            let real = real();
            if ours != SUCCESS {
                ours
            } else {
                real
            }
        },
    )
}
