//! Snapshot triggers: at normal exit, live on a signal, on demand (`cushim_dump_snapshot`)
//! and on out-of-memory (`CUSHIM_DUMP_ON_OOM=1`).
//!
//! Invariants: the signal handler (`sigchain.rs`, which then runs the program's own handler)
//! only counts a request and writes one byte to a non-blocking pipe (async-signal safe: no
//! unwinding, allocation or lock); a dedicated thread reads the pipe and writes one snapshot
//! per counted request. Requests are counted, never merged: a request still open when the
//! program ends is served by the exit path before the exit snapshot, so two signals just
//! before the end give three files. Dumps are written one at a time. Allocations stop only
//! while the allocator's state is copied, never while the file is formatted or written.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use once_cell::sync::OnceCell;

use crate::life::shim::{self, Shim};

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);
static READ_FD: AtomicI32 = AtomicI32::new(-1);
static SEQUENCE: AtomicU64 = AtomicU64::new(0);
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
pub fn dump_signal() -> Option<c_int> {
    static SIG: OnceCell<Option<c_int>> = OnceCell::new();
    *SIG.get_or_init(|| {
        let Ok(v) = std::env::var("CUSHIM_DUMP_SIGNAL") else {
            return Some(libc::SIGUSR1);
        };
        cushim::config::signal::parse_dump_signal(&v).unwrap_or_else(|e| {
            eprintln!("cushim: CUSHIM_DUMP_SIGNAL: {e}; using SIGUSR1");
            Some(libc::SIGUSR1)
        })
    })
}

/// Dump requests made by the signal, and those a writer has taken on. Each request gives
/// one snapshot: requests are counted, never merged, so none is lost near exit (the exit
/// handler serves the ones still open before the exit snapshot).
static REQUESTED: AtomicU64 = AtomicU64::new(0);
static CLAIMED: AtomicU64 = AtomicU64::new(0);

/// From the signal handler (`sigchain.rs`): count one request and wake the dump thread.
pub fn request_from_signal() {
    REQUESTED.fetch_add(1, Ordering::AcqRel);
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) of one byte from a static: async-signal safe. A full pipe loses
        // only the wake-up, not the request (the thread serves every counted request).
        let _ = unsafe { libc::write(fd, b"d".as_ptr() as *const c_void, 1) };
    }
}

/// Take on one open request, if any.
fn claim() -> bool {
    let mut c = CLAIMED.load(Ordering::Acquire);
    loop {
        if c >= REQUESTED.load(Ordering::Acquire) {
            return false;
        }
        match CLAIMED.compare_exchange(c, c + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => c = now,
        }
    }
}

/// Write one snapshot for each open request, in turn with every other dump.
fn serve_requests(s: &Shim) {
    loop {
        let turn = DumpTurn::take();
        if !claim() {
            return;
        }
        if let Err(e) = dump_with_turn(s, None, &turn) {
            eprintln!("cushim: live snapshot not written: {e}");
        }
    }
}

/// The snapshots owed at the end of the program (`when`: "at exit", "on SIGTERM"): one for
/// each open dump request, then the exit snapshot.
pub fn final_dumps(when: &str) {
    let Some(s) = shim::get_if_ready() else {
        return;
    };
    if template().is_none() {
        return;
    }
    serve_requests(s);
    let turn = DumpTurn::take();
    if let Err(e) = dump_with_turn(s, None, &turn) {
        eprintln!("cushim: snapshot {when} not written: {e}");
    }
}

extern "C" fn at_exit() {
    if crate::life::ending::pending() {
        // The ending thread writes the snapshot and ends the process with the signal.
        crate::life::ending::wait_for_end();
    }
    final_dumps("at exit");
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

/// Arm the exit dump, the ending signals and the signal dumper thread, when
/// `CUSHIM_SNAPSHOT` names a path.
pub fn install() {
    if template().is_none() {
        return;
    }
    // SAFETY: registering a plain extern "C" function with no preconditions.
    unsafe { libc::atexit(at_exit) };
    crate::life::ending::install(dump_signal());
    let Some(sig) = dump_signal() else {
        return;
    };
    if let Err(e) = start_dumper() {
        eprintln!("cushim: no live dumps: {e}");
        return;
    }
    crate::life::sigchain::on(crate::life::sigchain::Role::Dump, |_| request_from_signal());
    if let Err(e) = crate::life::sigchain::arm(sig, crate::life::sigchain::Role::Dump) {
        eprintln!("cushim: no live dumps: {e}");
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
    let spawned = cushim::quiet_thread::spawn_quiet("cushim-dump", move || dumper(rfd));
    if let Err(e) = spawned {
        // SAFETY: closing the two descriptors we just made and nobody else knows.
        unsafe {
            libc::close(rfd);
            libc::close(wfd);
        }
        return Err(e);
    }
    READ_FD.store(rfd, Ordering::Relaxed);
    WRITE_FD.store(wfd, Ordering::Relaxed);
    Ok(())
}

/// In a `fork` child (from `fork.rs`, after the ending thread's and the log's): the parent's dump thread does not exist here, so when
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
        if let Some(s) = shim::get_if_ready() {
            serve_requests(s);
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
    let turn = DumpTurn::take();
    dump_with_turn(s, Some(template), &turn)
}

/// Write a snapshot while holding the dump turn.
fn dump_with_turn(s: &Shim, path: Option<&str>, _turn: &DumpTurn) -> Result<PathBuf, String> {
    let template = match path {
        Some(p) => p,
        None => template().ok_or("no path given and CUSHIM_SNAPSHOT is unset")?,
    };
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    crate::life::snapshot::write(s, template, seq)
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
