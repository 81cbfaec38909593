//! Snapshot triggers: at normal exit, live on a signal, on demand (`cushim_dump_snapshot`)
//! and on out-of-memory (`CUSHIM_DUMP_ON_OOM=1`).
//!
//! Invariants: the signal handler only writes one byte to a non-blocking pipe (async-signal
//! safe: no unwinding, allocation or lock) and then chains to the handler the program had
//! installed before; a dedicated thread reads the pipe and writes the snapshot, coalescing
//! signals that arrived while it was busy. Allocations stop only while the allocator's state
//! is copied, never while the file is formatted or written.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use once_cell::sync::OnceCell;

use crate::state::{self, Shim};

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);
static READ_FD: AtomicI32 = AtomicI32::new(-1);
static SEQUENCE: AtomicU64 = AtomicU64::new(0);
static PREV: OnceCell<libc::sigaction> = OnceCell::new();
static TEMPLATE: OnceCell<Option<String>> = OnceCell::new();

fn template() -> Option<&'static str> {
    TEMPLATE
        .get_or_init(|| {
            std::env::var("CUSHIM_SNAPSHOT")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Whether `CUSHIM_DUMP_ON_OOM` asks for a snapshot when an allocation fails.
pub fn dump_on_oom() -> bool {
    static ON: OnceCell<bool> = OnceCell::new();
    *ON.get_or_init(|| {
        std::env::var("CUSHIM_DUMP_ON_OOM")
            .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    })
}

/// The signal that asks for a live dump: `CUSHIM_DUMP_SIGNAL` (a number or a name such as
/// `USR2`/`SIGUSR2`), default `SIGUSR1`; `0`/`none` disables it.
fn dump_signal() -> Option<c_int> {
    let Ok(v) = std::env::var("CUSHIM_DUMP_SIGNAL") else {
        return Some(libc::SIGUSR1);
    };
    let name = v.trim().trim_start_matches("SIG").to_ascii_uppercase();
    let sig = match name.as_str() {
        "" | "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "HUP" => libc::SIGHUP,
        "0" | "NONE" => return None,
        other => match other.parse::<c_int>() {
            Ok(n) if n > 0 && n < 65 && n != libc::SIGKILL && n != libc::SIGSTOP => n,
            _ => {
                eprintln!("cushim: CUSHIM_DUMP_SIGNAL={v} is not a signal (use USR1, USR2, HUP or a number); using SIGUSR1");
                libc::SIGUSR1
            }
        },
    };
    Some(sig)
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: only async-signal-safe calls: errno access, write(2) and the previous handler.
    unsafe {
        let errno = *libc::__errno_location();
        let fd = WRITE_FD.load(Ordering::Relaxed);
        if fd >= 0 {
            let _ = libc::write(fd, b"d".as_ptr() as *const c_void, 1);
        }
        if let Some(prev) = PREV.get() {
            let h = prev.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                        std::mem::transmute(h);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(c_int) = std::mem::transmute(h);
                    f(sig);
                }
            }
        }
        *libc::__errno_location() = errno;
    }
}

extern "C" fn at_exit() {
    if let Some(s) = state::get_if_ready() {
        if let Err(e) = dump_now(s, None) {
            eprintln!("cushim: snapshot at exit not written: {e}");
        }
    }
}

/// After an allocation failed for lack of memory: a snapshot, when `CUSHIM_DUMP_ON_OOM=1`.
/// Runs on the failing thread after the allocator's lock was released.
pub fn on_oom(s: &Shim) {
    if !dump_on_oom() {
        return;
    }
    match dump_now(s, None) {
        Ok(p) => eprintln!("cushim: out of memory; snapshot written to {}", p.display()),
        Err(e) => eprintln!("cushim: out of memory; snapshot not written: {e}"),
    }
}

/// Arm the exit dump and the signal dumper thread, when `CUSHIM_SNAPSHOT` names a path.
pub fn install() {
    if template().is_none() {
        return;
    }
    // SAFETY: registering a plain extern "C" function with no preconditions.
    unsafe { libc::atexit(at_exit) };
    let Some(sig) = dump_signal() else {
        return;
    };
    if let Err(e) = start_dumper() {
        eprintln!("cushim: no live dumps: {e}");
        return;
    }
    // SAFETY: plain sigaction calls on zero-initialised structs. The program's previous
    // action is read first (NULL new action) and stored in PREV before ours is installed,
    // so the handler never runs without knowing what to chain to.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        let _ = PREV.set(old);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
            eprintln!(
                "cushim: no live dumps: sigaction failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A pipe and the thread that reads it; the signal handler writes to the pipe from now on.
fn start_dumper() -> Result<(), String> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2 failed: {}", std::io::Error::last_os_error()));
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    // SAFETY: setting O_NONBLOCK on our own write end: the handler must never block.
    unsafe { libc::fcntl(wfd, libc::F_SETFL, libc::O_NONBLOCK) };
    let spawned = std::thread::Builder::new()
        .name("cushim-dump".into())
        .spawn(move || dumper(rfd));
    if let Err(e) = spawned {
        // SAFETY: closing the two descriptors we just made and nobody else knows.
        unsafe {
            libc::close(rfd);
            libc::close(wfd);
        }
        return Err(format!("cannot start the dump thread: {e}"));
    }
    READ_FD.store(rfd, Ordering::Relaxed);
    WRITE_FD.store(wfd, Ordering::Relaxed);
    Ok(())
}

/// In a `fork` child (from `fork.rs`): the parent's dump thread does not exist here, so when
/// live dumps are armed, the child gets its own pipe and thread (the signal handler, which
/// the child inherits, writes to the new pipe). The inherited pipe is closed.
pub fn after_fork_in_child() {
    // A dump the parent's dump thread was writing will never finish here.
    DUMPING.store(false, Ordering::Release);
    let (rfd, wfd) = (
        READ_FD.load(Ordering::Relaxed),
        WRITE_FD.load(Ordering::Relaxed),
    );
    if wfd < 0 {
        return;
    }
    WRITE_FD.store(-1, Ordering::Relaxed);
    READ_FD.store(-1, Ordering::Relaxed);
    // SAFETY: the inherited pipe's descriptors are ours (made by `start_dumper`), and their
    // only reader, the parent's dump thread, does not exist in the child.
    unsafe {
        libc::close(wfd);
        libc::close(rfd);
    }
    if let Err(e) = start_dumper() {
        eprintln!("cushim: no live dumps in the forked child: {e}");
    }
}

fn dumper(rfd: c_int) {
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: reading into our own buffer from our own pipe.
        let n = unsafe { libc::read(rfd, buf.as_mut_ptr() as *mut c_void, buf.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        // Coalesce: drain whatever else arrived, then write one snapshot.
        loop {
            let mut p = libc::pollfd {
                fd: rfd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout.
            if unsafe { libc::poll(&mut p, 1, 0) } <= 0 {
                break;
            }
            // SAFETY: as above.
            if unsafe { libc::read(rfd, buf.as_mut_ptr() as *mut c_void, buf.len()) } <= 0 {
                break;
            }
        }
        if let Some(s) = state::get_if_ready() {
            if let Err(e) = dump_now(s, None) {
                eprintln!("cushim: live snapshot not written: {e}");
            }
        }
    }
}

/// Write a snapshot now to `path` (or the `CUSHIM_SNAPSHOT` template). Returns the path.
///
/// Dumps are serialized: one that finds another in progress waits for it. So the exit dump
/// never lets the process end under a live dump the dump thread is still writing (that
/// dump would be lost, its temporary file left behind).
pub fn dump_now(s: &Shim, path: Option<&str>) -> Result<PathBuf, String> {
    let template = match path {
        Some(p) => p,
        None => template().ok_or("no path given and CUSHIM_SNAPSHOT is unset")?,
    };
    let _one_at_a_time = DumpTurn::take();
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    crate::snapshot::write(s, template, seq)
}

/// Whether a dump is being written. A flag rather than a mutex so that a `fork` child, where
/// the dumping thread does not exist, can clear it (`after_fork_in_child`).
static DUMPING: AtomicBool = AtomicBool::new(false);

/// The right to write a dump; released on drop.
struct DumpTurn;

impl DumpTurn {
    /// Wait (1 ms sleeps: dumps take milliseconds to seconds) until no dump is in progress.
    fn take() -> DumpTurn {
        while DUMPING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        DumpTurn
    }
}

impl Drop for DumpTurn {
    fn drop(&mut self) {
        DUMPING.store(false, Ordering::Release);
    }
}
