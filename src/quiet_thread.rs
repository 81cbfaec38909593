//! The shim's own threads (dump, ending, event log, sleep requests, a backup's checksum) run
//! with every signal blocked, so the program's signals are always delivered to the program's
//! own threads: a handler the program installed never runs on a thread it does not know.

use std::thread::{Scope, ScopedJoinHandle};

/// Block every signal on the calling thread; returns the mask to give [`restore_signals`].
pub fn block_all_signals() -> libc::sigset_t {
    // SAFETY: plain sigset operations on local, initialised sets.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

/// Give the calling thread back the mask [`block_all_signals`] returned.
pub fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: `old` is a mask pthread_sigmask filled in.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// Run `spawn` with every signal blocked on the calling thread, so the thread it starts
/// inherits that mask; the caller's own mask is restored before returning.
fn with_signals_blocked<T>(spawn: impl FnOnce() -> T) -> T {
    let old = block_all_signals();
    let out = spawn();
    restore_signals(&old);
    out
}

/// Spawn a shim thread with every signal blocked (the thread's creator keeps its mask).
pub fn spawn_quiet(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
    with_signals_blocked(|| std::thread::Builder::new().name(name.into()).spawn(f))
        .map(|_| ())
        .map_err(|e| format!("cannot start the {name} thread: {e}"))
}

/// [`spawn_quiet`] for a thread that borrows from its creator's scope.
pub fn spawn_quiet_scoped<'scope, T: Send + 'scope>(
    scope: &'scope Scope<'scope, '_>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'scope,
) -> Result<ScopedJoinHandle<'scope, T>, String> {
    with_signals_blocked(|| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(scope, f)
    })
    .map_err(|e| format!("cannot start the {name} thread: {e}"))
}
