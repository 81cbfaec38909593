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
            crate::life::sleep::empty_cache(s);
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

/// The C string at `p`, or `None` for NULL.
fn opt_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Tag the calling thread's next allocations `tag` (sleep mode; nests). 0, or
/// `CUDA_ERROR_INVALID_VALUE` (1) for a NULL or empty tag or nesting deeper than 64.
#[no_mangle]
pub extern "C" fn cushim_tag_push(tag: *const c_char) -> c_int {
    let next = || next!(c"cushim_tag_push", fn(*const c_char), (tag));
    guard("cushim_tag_push", next, || match opt_str(tag) {
        Some(t) if cushim::sleep::tag::push(&t) => 0,
        _ => crate::life::sleep::INVALID_VALUE,
    })
}

/// Close the calling thread's innermost tag. 0, or `CUDA_ERROR_INVALID_VALUE` when none is
/// open.
#[no_mangle]
pub extern "C" fn cushim_tag_pop() -> c_int {
    let next = || next!(c"cushim_tag_pop", fn(), ());
    guard("cushim_tag_pop", next, || {
        if cushim::sleep::tag::pop() {
            0
        } else {
            crate::life::sleep::INVALID_VALUE
        }
    })
}

/// Pause the memory of `tag` (NULL: every tag); `mode` 0 discards the contents, 1 backs them
/// up in host memory. 0, or a CUDA error code (`docs/SLEEP-MODE.md`).
#[no_mangle]
pub extern "C" fn cushim_pause(tag: *const c_char, mode: c_int) -> c_int {
    let next = || next!(c"cushim_pause", fn(*const c_char, c_int), (tag, mode));
    guard("cushim_pause", next, || {
        let mode = match mode {
            0 => cushim::sleep::Mode::Discard,
            1 => cushim::sleep::Mode::Backup,
            _ => return crate::life::sleep::INVALID_VALUE,
        };
        let Some(s) = state::get() else {
            return crate::life::sleep::OFF;
        };
        match crate::life::sleep::pause(s, opt_str(tag).as_deref(), mode) {
            Ok(_) => 0,
            Err(code) => code,
        }
    })
}

/// Resume the memory of `tag` (NULL: every tag). 0, or a CUDA error code; on failure the tag
/// stays paused and can be resumed later.
#[no_mangle]
pub extern "C" fn cushim_resume(tag: *const c_char) -> c_int {
    let next = || next!(c"cushim_resume", fn(*const c_char), (tag));
    guard("cushim_resume", next, || {
        let Some(s) = state::get() else {
            return crate::life::sleep::OFF;
        };
        match crate::life::sleep::resume(s, opt_str(tag).as_deref()) {
            Ok(_) => 0,
            Err(code) => code,
        }
    })
}

/// Bytes of `tag` (NULL: every tag) now paused on every device; -1 when sleep mode is off.
#[no_mangle]
pub extern "C" fn cushim_paused_bytes(tag: *const c_char) -> i64 {
    let tag = opt_str(tag);
    std::panic::catch_unwind(|| match crate::life::sleep::arena() {
        Some(a) => a.paused_bytes(tag.as_deref()) as i64,
        None => -1,
    })
    .unwrap_or(-1)
}
