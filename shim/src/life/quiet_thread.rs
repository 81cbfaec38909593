//! The shim's own threads (dump, ending, event log) run with every signal blocked, so the
//! program's signals are always delivered to the program's own threads.

/// Spawn a shim thread with every signal blocked, so that the program's signals are always
/// delivered to the program's own threads (the thread's creator keeps its mask).
pub fn spawn_quiet(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), String> {
    // SAFETY: sigset operations on local sets; the creator's mask is restored below.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
        .map(|_| ())
        .map_err(|e| format!("cannot start the {name} thread: {e}"))
}
