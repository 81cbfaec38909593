//! `SIMCUDA_AFTER_FORK=exit`: a test switch. Armed, any entry point called in a `fork` child
//! ends that child at once (status 97, one line on stderr naming the call) instead of
//! serving it.
//!
//! Why: CUDA leaves every use of the driver after `fork` (before `exec`) undefined; a real
//! driver may fail the call or wait for ever on a lock that one of the parent's threads held
//! at the fork. A layer above the driver (the shim) must therefore make no call of its own in
//! a child. This switch turns such a call into a deterministic failure a test can see,
//! instead of a hang that happens only when the fork lands inside another thread's call.
//! Unarmed (the default) it costs one load per call and changes nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static FORKED: AtomicBool = AtomicBool::new(false);
static ARM: Once = Once::new();

extern "C" fn in_child() {
    FORKED.store(true, Ordering::Relaxed);
}

fn arm() {
    if std::env::var("SIMCUDA_AFTER_FORK").is_ok_and(|v| v.trim() == "exit") {
        // SAFETY: registering a plain extern "C" function with no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    }
}

/// Called on entry to every entry point (`api.rs`): `name` is the entry point's.
#[inline]
pub fn check(name: &str) {
    ARM.call_once(arm);
    if FORKED.load(Ordering::Relaxed) {
        eprintln!("simcuda: {name} called in a fork child (SIMCUDA_AFTER_FORK=exit)");
        // SAFETY: ending the process without running handlers that could call in again.
        unsafe { libc::_exit(97) };
    }
}
