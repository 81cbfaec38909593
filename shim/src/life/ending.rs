//! Graceful ends: SIGTERM, SIGINT, SIGHUP and SIGQUIT write the exit snapshot, then end the
//! program exactly as they would have without the shim.
//!
//! Policy: the signal handler (`sigchain.rs`) only records the signal and writes one byte to
//! a pipe (async-signal safe) and returns, so the thread it interrupted, which may hold the
//! allocator's lock, goes on and releases it. The ending thread, a thread of the shim's own
//! with every signal blocked, wakes up, writes the exit snapshot where taking locks and
//! allocating is safe, puts the program's disposition back in the kernel (`SIG_DFL`), and
//! raises the signal again: the program dies of the same signal, with the same status and
//! the same core dump behaviour as without the shim. The program runs on for the time the
//! snapshot takes, so the snapshot holds its events up to the end.
//!
//! Only the first ending signal is served; a second one while the snapshot is being written
//! changes nothing (the process is about to die of the first). If the program reaches
//! `exit` meanwhile, the exit handler leaves the snapshot to the ending thread and waits for
//! it to raise the signal, so the status stays the signal's.
//!
//! A program handler for the signal runs instead (it decides: `exit` from it writes the
//! snapshot through the exit handler; returning keeps the program running).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use once_cell::sync::OnceCell;

use crate::life::sigchain::{self, Role};

/// The signals that end a program gracefully.
pub const ENDING: [c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);
static READ_FD: AtomicI32 = AtomicI32::new(-1);
/// The ending signal being served (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// Called from the signal handler when an ending signal meets the program's `SIG_DFL`.
pub fn request_from_signal(sig: c_int) {
    if PENDING
        .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let fd = WRITE_FD.load(Ordering::Acquire);
    let byte = sig as u8;
    // SAFETY: write(2) of one byte from the stack: async-signal safe.
    if fd < 0 || unsafe { libc::write(fd, &byte as *const u8 as *const c_void, 1) } != 1 {
        // No ending thread: end as without the shim, without a snapshot.
        reraise(sig);
    }
}

/// Whether an ending signal is being served (the exit handler then leaves the snapshot to
/// the ending thread).
pub fn pending() -> bool {
    PENDING.load(Ordering::Acquire) != 0
}

/// From the exit handler when [`pending`]: wait for the ending thread to raise the signal.
pub fn wait_for_end() -> ! {
    loop {
        // SAFETY: pause(2) has no preconditions; the ending thread ends the process.
        unsafe { libc::pause() };
    }
}

/// What the ending thread does before the signal is raised again: the snapshots owed and the
/// event log's end. Registered when the state is built (`state.rs`), before anything can
/// call [`install`].
static ON_END: OnceCell<fn(&str)> = OnceCell::new();

/// Register what the ending thread does before the signal is raised again (`when`: "on
/// SIGTERM"); once, later calls are ignored.
pub fn on_end(end: fn(&str)) {
    let _ = ON_END.set(end);
}

/// Arm the ending signals but `dump_signal` and start the ending thread (once; for the
/// snapshot, the log or both).
pub fn install(dump_signal: Option<c_int>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| install_once(dump_signal));
}

fn install_once(dump_signal: Option<c_int>) {
    if let Err(e) = start_thread() {
        eprintln!("cushim: no snapshot on SIGTERM/SIGINT/SIGHUP/SIGQUIT: {e}");
        return;
    }
    sigchain::on(Role::End, request_from_signal);
    for sig in ENDING {
        if dump_signal == Some(sig) {
            continue;
        }
        if let Err(e) = sigchain::arm(sig, Role::End) {
            eprintln!("cushim: no snapshot on signal {sig}: {e}");
        }
    }
}

fn start_thread() -> Result<(), String> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(format!("pipe2 failed: {}", std::io::Error::last_os_error()));
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    let spawned = cushim::quiet_thread::spawn_quiet("cushim-end", move || ending_thread(rfd));
    if let Err(e) = spawned {
        // SAFETY: closing the two descriptors we just made and nobody else knows.
        unsafe {
            libc::close(rfd);
            libc::close(wfd);
        }
        return Err(e);
    }
    READ_FD.store(rfd, Ordering::Release);
    WRITE_FD.store(wfd, Ordering::Release);
    Ok(())
}

/// In a `fork` child: the ending thread does not exist there; start the child's own.
pub fn after_fork_in_child() {
    let wfd = WRITE_FD.swap(-1, Ordering::AcqRel);
    let rfd = READ_FD.swap(-1, Ordering::AcqRel);
    if wfd < 0 {
        return;
    }
    // SAFETY: the inherited pipe is ours (made by `start_thread`), and its only reader, the
    // parent's ending thread, does not exist in the child.
    unsafe {
        libc::close(wfd);
        libc::close(rfd);
    }
    PENDING.store(0, Ordering::Release);
    if let Err(e) = start_thread() {
        eprintln!("cushim: no snapshot on ending signals in the forked child: {e}");
    }
}

fn ending_thread(rfd: c_int) {
    let mut byte = 0u8;
    // The read end is blocking for this thread only: poll until readable.
    loop {
        let mut p = libc::pollfd {
            fd: rfd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        // SAFETY: reading one byte into our own variable from our own pipe.
        let n = unsafe { libc::read(rfd, &mut byte as *mut u8 as *mut c_void, 1) };
        if n == 1 {
            break;
        }
        if n == 0 {
            return;
        }
    }
    let sig = PENDING.load(Ordering::Acquire);
    if let Some(end) = ON_END.get() {
        end(&format!("on {}", cushim::config::signal::name(sig)));
    }
    reraise(sig);
}

/// Give the signal back its program disposition (`SIG_DFL`) and raise it on this thread,
/// unblocked: the process ends as the signal's default action says.
fn reraise(sig: c_int) {
    sigchain::disarm(sig);
    // SAFETY: sigset operations on a local set, then raise(3) of a catchable signal.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}
