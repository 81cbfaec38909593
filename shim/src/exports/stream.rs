//! Exported stream and device-reset hooks: forwarded to the real runtime, and reported to the
//! engine so it knows which streams are live (stream-safe reuse of freed blocks) and can
//! release its cache before a device reset.
//!
//! Invariant: the engine hears of a stream only after the real creation succeeded, and of its
//! destruction before the real destroy (so it can still order pending frees on it).

use std::ffi::{c_int, c_uint};

use crate::call_real;
use crate::ffi::SUCCESS;
use crate::life::state;
use crate::observe::observing;
use crate::real::runtime::Stream;

const NON_BLOCKING: c_uint = 1;

fn created(rc: c_int, out: *mut Stream, flags: c_uint) -> c_int {
    crate::ffi::failopen::inject(crate::ffi::failopen::Point::Stream);
    if rc == SUCCESS && !out.is_null() {
        // Observing: the cache is unused and asks the runtime nothing.
        if let Some(s) = crate::life::state::runtime_state().filter(|_| !observing()) {
            // SAFETY: the real create succeeded, so `*out` holds the new stream.
            let stream = unsafe { *out } as u64;
            s.alloc
                .stream_created(state::current_device(), stream, flags & NON_BLOCKING != 0);
        }
    }
    rc
}

#[no_mangle]
pub extern "C" fn cudaStreamCreate(out: *mut Stream) -> c_int {
    crate::ffi::failopen::around(
        "cudaStreamCreate",
        || call_real!(cudaStreamCreate(out)),
        |real| created(real(), out, 0),
    )
}

#[no_mangle]
pub extern "C" fn cudaStreamCreateWithFlags(out: *mut Stream, flags: c_uint) -> c_int {
    crate::ffi::failopen::around(
        "cudaStreamCreateWithFlags",
        || call_real!(cudaStreamCreateWithFlags(out, flags)),
        |real| created(real(), out, flags),
    )
}

#[no_mangle]
pub extern "C" fn cudaStreamCreateWithPriority(
    out: *mut Stream,
    flags: c_uint,
    priority: c_int,
) -> c_int {
    crate::ffi::failopen::around(
        "cudaStreamCreateWithPriority",
        || call_real!(cudaStreamCreateWithPriority(out, flags, priority)),
        |real| created(real(), out, flags),
    )
}

#[no_mangle]
pub extern "C" fn cudaStreamDestroy(stream: Stream) -> c_int {
    crate::ffi::failopen::around(
        "cudaStreamDestroy",
        || call_real!(cudaStreamDestroy(stream)),
        |real| {
            crate::ffi::failopen::inject(crate::ffi::failopen::Point::Stream);
            if let Some(s) = crate::life::state::runtime_state().filter(|_| !observing()) {
                s.alloc
                    .stream_destroyed(state::current_device(), stream as u64);
            }
            let rc = real();
            if rc == SUCCESS {
                crate::life::capture::ended(stream as u64, SUCCESS);
            }
            rc
        },
    )
}

#[no_mangle]
pub extern "C" fn cudaDeviceReset() -> c_int {
    crate::ffi::failopen::around(
        "cudaDeviceReset",
        || call_real!(cudaDeviceReset()),
        |real| {
            if let Some(s) = crate::life::state::runtime_state() {
                s.alloc.device_reset(state::current_device());
                // The program's own allocations go with the device too.
                s.observed
                    .device_reset(state::current_device(), s.history.free_stack());
            }
            real()
        },
    )
}
