//! `cushim run` stands for the program: the signals a user or a job scheduler sends to the
//! wrapper reach the program, and the wrapper ends as the program did.
//!
//! Policy: TERM, INT, HUP, QUIT, USR1, USR2 and the dump signal (`CUSHIM_DUMP_SIGNAL`) are
//! caught from before the program starts (one arriving before its pid is known is sent as
//! soon as it is) and sent on with `kill`. Only signals sent by a process are forwarded:
//! those the kernel sends on behalf of the terminal (Ctrl-C, Ctrl-\) already reach the
//! program, which shares the wrapper's process group, and forwarding them would deliver
//! them twice. When the program dies of a signal, the wrapper restores that signal's
//! default action and raises it on itself (core dumps off: the program's core is the one
//! that matters), so the shell sees the same status; otherwise it exits with the program's
//! exit code.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

static CHILD: AtomicI32 = AtomicI32::new(0);
/// Signals caught before the program's pid was known (bit n: signal n).
static EARLY: AtomicU64 = AtomicU64::new(0);

/// The signals passed on to the program.
pub fn forwarded() -> Vec<c_int> {
    let mut v = vec![
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ];
    if let Ok(text) = std::env::var("CUSHIM_DUMP_SIGNAL") {
        if let Ok(Some(sig)) = cushim::config::signal::parse_dump_signal(&text) {
            if !v.contains(&sig) {
                v.push(sig);
            }
        }
    }
    v
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    if code > 0 {
        // Sent by the kernel (the terminal): the program got it too.
        return;
    }
    let pid = CHILD.load(Ordering::Acquire);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal safe.
        unsafe { libc::kill(pid, sig) };
    } else {
        EARLY.fetch_or(1 << sig, Ordering::AcqRel);
    }
}

/// Catch the forwarded signals (before the program is started).
///
/// Each handler runs with every forwarded signal blocked, so one cannot overtake another
/// inside the wrapper: they reach the program in the order the wrapper took them.
pub fn install() {
    let sigs = forwarded();
    for &sig in &sigs {
        // SAFETY: a zero-initialised action filled in with our handler and a mask built
        // with sigemptyset/sigaddset; sigaction(2) with valid pointers.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            for &other in &sigs {
                libc::sigaddset(&mut act.sa_mask, other);
            }
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// The program runs as `pid`: send it what arrived before.
pub fn started(pid: u32) {
    let pid = pid as i32;
    CHILD.store(pid, Ordering::Release);
    let early = EARLY.swap(0, Ordering::AcqRel);
    for sig in 1..64 {
        if early & (1 << sig) != 0 {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// End as the program ended: its exit code, or its terminating signal raised on ourselves.
pub fn end_like(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        // SAFETY: resetting one signal to its default action, turning core dumps off for
        // this process only, unblocking the signal and raising it.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &zero);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        // Still here (a signal whose default is not to end): report it as a shell would.
        return 128 + sig;
    }
    status.code().unwrap_or(1)
}
