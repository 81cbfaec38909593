//! Exported stream-capture hooks (runtime `cudaStreamBeginCapture`/`cudaStreamEndCapture`
//! and their `_ptsz` twins; driver `cuStreamBeginCapture_v2`/`cuStreamEndCapture` and
//! twins, also handed out by `dlsym` and `cuGetProcAddress`): each forwards to the real
//! function and tells `capture.rs` what began and ended. No policy lives here.
//!
//! Invariant: the program's arguments reach the real function unchanged and its result
//! comes back unchanged; a call is recorded once, at the layer it arrives at first (a
//! driver hook called from inside a runtime export only forwards).

use std::ffi::{c_int, c_uint, c_void};

use crate::life::capture;
use crate::real::driver::RealFn;
use crate::real::runtime::Stream;
use crate::{call_driver, call_real};

#[no_mangle]
pub extern "C" fn cudaStreamBeginCapture(stream: Stream, mode: c_uint) -> c_int {
    crate::per_thread::note_stream(stream as usize);
    crate::ffi::failopen::around(
        "cudaStreamBeginCapture",
        || call_real!(cudaStreamBeginCapture(stream, mode)),
        |real| {
            let rc = real();
            capture::begun(stream as u64, mode, rc);
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaStreamBeginCapture_ptsz(stream: Stream, mode: c_uint) -> c_int {
    crate::per_thread::note_ptds();
    crate::ffi::failopen::around(
        "cudaStreamBeginCapture_ptsz",
        || call_real!(cudaStreamBeginCapture_ptsz(stream, mode)),
        |real| {
            let rc = real();
            capture::begun(capture::ptsz(stream as u64), mode, rc);
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaStreamEndCapture(stream: Stream, graph: *mut *mut c_void) -> c_int {
    crate::per_thread::note_stream(stream as usize);
    crate::ffi::failopen::around(
        "cudaStreamEndCapture",
        || call_real!(cudaStreamEndCapture(stream, graph)),
        |real| {
            let rc = real();
            capture::ended(stream as u64, rc);
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaStreamEndCapture_ptsz(stream: Stream, graph: *mut *mut c_void) -> c_int {
    crate::per_thread::note_ptds();
    crate::ffi::failopen::around(
        "cudaStreamEndCapture_ptsz",
        || call_real!(cudaStreamEndCapture_ptsz(stream, graph)),
        |real| {
            let rc = real();
            capture::ended(capture::ptsz(stream as u64), rc);
            rc
        },
    )
}

pub static REAL_BEGIN_CAPTURE: RealFn = RealFn::new(c"cuStreamBeginCapture_v2");
pub static REAL_BEGIN_CAPTURE_PTSZ: RealFn = RealFn::new(c"cuStreamBeginCapture_v2_ptsz");
pub static REAL_END_CAPTURE: RealFn = RealFn::new(c"cuStreamEndCapture");
pub static REAL_END_CAPTURE_PTSZ: RealFn = RealFn::new(c"cuStreamEndCapture_ptsz");

type BeginFn = unsafe extern "C" fn(Stream, c_uint) -> c_int;
type EndFn = unsafe extern "C" fn(Stream, *mut *mut c_void) -> c_int;

/// Whether a driver hook records what it forwards: not when a runtime export of the shim
/// is already handling the call (it records it).
fn record_driver() -> bool {
    !crate::ffi::intercept::inside()
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(h: Stream, mode: c_uint) -> c_int {
    crate::per_thread::note_stream(h as usize);
    crate::ffi::failopen::around(
        "cuStreamBeginCapture_v2",
        || call_driver!(REAL_BEGIN_CAPTURE, BeginFn, (h, mode)),
        |real| {
            let rc = real();
            if record_driver() {
                capture::begun(h as u64, mode, rc);
            }
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2_ptsz(h: Stream, mode: c_uint) -> c_int {
    crate::per_thread::note_ptds();
    crate::ffi::failopen::around(
        "cuStreamBeginCapture_v2_ptsz",
        || call_driver!(REAL_BEGIN_CAPTURE_PTSZ, BeginFn, (h, mode)),
        |real| {
            let rc = real();
            if record_driver() {
                capture::begun(capture::ptsz(h as u64), mode, rc);
            }
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cuStreamEndCapture(h: Stream, graph: *mut *mut c_void) -> c_int {
    crate::per_thread::note_stream(h as usize);
    crate::ffi::failopen::around(
        "cuStreamEndCapture",
        || call_driver!(REAL_END_CAPTURE, EndFn, (h, graph)),
        |real| {
            let rc = real();
            if record_driver() {
                capture::ended(h as u64, rc);
            }
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cuStreamEndCapture_ptsz(h: Stream, graph: *mut *mut c_void) -> c_int {
    crate::per_thread::note_ptds();
    crate::ffi::failopen::around(
        "cuStreamEndCapture_ptsz",
        || call_driver!(REAL_END_CAPTURE_PTSZ, EndFn, (h, graph)),
        |real| {
            let rc = real();
            if record_driver() {
                capture::ended(capture::ptsz(h as u64), rc);
            }
            rc
        },
    )
}
