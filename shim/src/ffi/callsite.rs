//! Error messages logged once per program call site.
//!
//! Invariant: only error paths come here (they may allocate and unwind); the call site is the
//! first frame outside libcushim.so, and each distinct site is reported once per process.

use std::collections::HashSet;
use std::ffi::c_void;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

static SEEN: Lazy<Mutex<HashSet<usize>>> = Lazy::new(|| Mutex::new(HashSet::new()));

/// The load base of the module holding `addr`, if any.
pub fn module_base(addr: usize) -> Option<usize> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 {
            return None;
        }
        Some(info.dli_fbase as usize)
    }
}

/// The program's call site: the first return address outside this library.
fn caller() -> usize {
    let ours = module_base(caller as *const () as usize);
    let mut site = 0;
    backtrace::trace(|frame| {
        let ip = frame.ip() as usize;
        if module_base(ip) != ours {
            site = ip;
            return false;
        }
        true
    });
    site
}

/// Print `msg` with the caller's location, once per call site.
pub fn log_once(msg: &str) {
    let site = caller();
    if !SEEN.lock().insert(site) {
        return;
    }
    let mut place = format!("{site:#x}");
    backtrace::resolve(site.saturating_sub(1) as *mut c_void, |sym| {
        if let Some(name) = sym.name() {
            place = format!("{name}");
        }
        if let (Some(file), Some(line)) = (sym.filename(), sym.lineno()) {
            place.push_str(&format!(" ({}:{line})", file.display()));
        }
    });
    eprintln!("cushim: {msg}, at {place}");
}
