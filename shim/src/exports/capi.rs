//! The C API for programs that want control (declared in `shim/include/cushim.h`).
//!
//! Invariant: these never initialize CUDA on their own when the program has not used it
//! yet: without shim state they do nothing and return -1 (or 0 bytes of JSON). A failure
//! inside the shim goes to the next definition of the same function (another cushim
//! stacked after this one), else returns -1 (`failopen::around`).

use std::ffi::{c_char, c_int, CStr};

use crate::life::state;
use crate::real::driver::RealFn;

/// The next definition of a C-API function, called with the program's arguments, or -1.
macro_rules! next {
    ($name:literal, fn($($t:ty),*), ($($a:expr),*)) => {{
        static NEXT: RealFn = RealFn::new($name);
        match NEXT.get() {
            #[allow(clippy::macro_metavars_in_unsafe)]
            Some(addr) => {
                // SAFETY: `addr` is another library's function of this name, declared in
                // `cushim.h` with this C type; the program's own arguments go unchanged.
                let f = unsafe {
                    std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> c_int>(addr)
                };
                // SAFETY: as above.
                unsafe { f($($a),*) }
            }
            None => -1,
        }
    }};
}

/// [`crate::ffi::failopen::around`] for a C-API function (no real call inside: `f` never calls it).
fn guard(what: &str, real: impl Fn() -> c_int, f: impl FnOnce() -> c_int) -> c_int {
    crate::ffi::failopen::around(what, real, |_| f())
}

/// Release every cached block and page back to the device. Returns 0, or -1 when inactive.
#[no_mangle]
pub extern "C" fn cushim_empty_cache() -> c_int {
    let next = || next!(c"cushim_empty_cache", fn(), ());
    guard("cushim_empty_cache", next, || match state::get() {
        Some(s) => {
            s.alloc.empty_cache();
            0
        }
        None => -1,
    })
}

/// Reset the peak statistics of every device and of pinned memory. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cushim_reset_peak_stats() -> c_int {
    let next = || next!(c"cushim_reset_peak_stats", fn(), ());
    guard("cushim_reset_peak_stats", next, || match state::get() {
        Some(s) => {
            s.alloc.reset_peak_stats();
            0
        }
        None => -1,
    })
}

/// Write the memory statistics as JSON (`{"devices":[{...}],"host":{...}}`, PyTorch's key
/// names) into `buf` (NUL-terminated, truncated to `len`). Returns the full length without
/// the NUL, like `snprintf`, or -1 when inactive.
#[no_mangle]
pub extern "C" fn cushim_memory_stats_json(buf: *mut c_char, len: usize) -> c_int {
    let next = || {
        next!(
            c"cushim_memory_stats_json",
            fn(*mut c_char, usize),
            (buf, len)
        )
    };
    guard("cushim_memory_stats_json", next, || {
        let Some(s) = state::get() else {
            return -1;
        };
        let text = crate::life::stats::stats_json(s).to_string();
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: the caller gave `len` writable bytes at `buf`; we write n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        c_int::try_from(text.len()).unwrap_or(c_int::MAX)
    })
}

/// Write a snapshot now to `path` (NULL: the `CUSHIM_SNAPSHOT` template). Returns 0 on
/// success, -1 on failure (reported on stderr).
#[no_mangle]
pub extern "C" fn cushim_dump_snapshot(path: *const c_char) -> c_int {
    let next = || next!(c"cushim_dump_snapshot", fn(*const c_char), (path));
    guard("cushim_dump_snapshot", next, || {
        let Some(s) = state::get() else {
            return -1;
        };
        let path = if path.is_null() {
            None
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            Some(
                unsafe { CStr::from_ptr(path) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        match crate::life::dump::dump_now(s, path.as_deref()) {
            Ok(_) => 0,
            Err(e) => {
                eprintln!("cushim: snapshot not written: {e}");
                -1
            }
        }
    })
}
