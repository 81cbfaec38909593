//! Serving `cushim pause`/`cushim resume` (`cushim::sleep::request`): with sleep mode on, the
//! request signal is armed and a quiet thread waits on a pipe the handler writes one byte to
//! (async-signal safe); the thread reads this process's request file, removes it, serves it
//! like the C API and writes the answer file.
//!
//! A `fork` child gets its own pipe and thread (`after_fork_in_child`, from the child's
//! `pthread_atfork` handler): the parent's thread does not exist there, and the inherited
//! pipe would wake the parent's, so `cushim pause CHILD_PID` is served by the child itself.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use cushim::sleep::request::{self, Request};

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);
static READ_FD: AtomicI32 = AtomicI32::new(-1);

fn wake(_sig: c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) of one byte from a static: async-signal safe.
        let _ = unsafe { libc::write(fd, b"s".as_ptr() as *const c_void, 1) };
    }
}

/// Arm the request signal and start the thread (sleep mode on only).
pub fn install() {
    if let Err(e) = start_thread() {
        eprintln!("cushim: no pause requests from outside: {e}");
        return;
    }
    crate::life::sigchain::on(crate::life::sigchain::Role::Sleep, wake);
    if let Err(e) = crate::life::sigchain::arm(request::SIGNAL, crate::life::sigchain::Role::Sleep)
    {
        eprintln!("cushim: no pause requests from outside: {e}");
    }
}

/// A new pipe and the thread that reads it.
fn start_thread() -> Result<(), String> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    // SAFETY: the write end is ours; the handler must never block.
    unsafe { libc::fcntl(wfd, libc::F_SETFL, libc::O_NONBLOCK) };
    if let Err(e) = cushim::quiet_thread::spawn_quiet("cushim-sleep", move || serve(rfd)) {
        // SAFETY: both ends are ours and nothing else knows them.
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

/// In a `fork` child: drop the inherited pipe (its reader, the parent's thread, does not
/// exist here) and start the child's own thread. The signal stays armed (inherited).
pub fn after_fork_in_child() {
    let (rfd, wfd) = (
        READ_FD.load(Ordering::Relaxed),
        WRITE_FD.load(Ordering::Relaxed),
    );
    if wfd < 0 {
        return;
    }
    WRITE_FD.store(-1, Ordering::Relaxed);
    READ_FD.store(-1, Ordering::Relaxed);
    // SAFETY: the inherited descriptors are ours (made by `start_thread`); no thread of the
    // child reads or writes them.
    unsafe {
        libc::close(wfd);
        libc::close(rfd);
    }
    if let Err(e) = start_thread() {
        eprintln!("cushim: no pause requests from outside in the forked child: {e}");
    }
}

fn serve(rfd: c_int) {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reading into our own buffer from our own pipe.
        let n = unsafe { libc::read(rfd, buf.as_mut_ptr() as *mut c_void, buf.len()) };
        if n == 0 {
            return;
        }
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
        if n > 0 {
            serve_one();
        }
    }
}

fn serve_one() {
    let Ok(dir) = request::dir() else {
        return;
    };
    let pid = std::process::id();
    let path = request::request_path(&dir, pid);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let _ = std::fs::remove_file(&path);
    let answer = match (Request::parse(&text), crate::life::shim::get_if_ready()) {
        (None, _) => Err(crate::life::sleep::INVALID_VALUE),
        (Some(_), None) => Err(crate::life::sleep::OFF),
        (Some(Request::Pause(tag, mode)), Some(s)) => {
            crate::life::sleep::pause(s, tag.as_deref(), mode).map(|o| o.bytes)
        }
        (Some(Request::Resume(tag)), Some(s)) => {
            crate::life::sleep::resume(s, tag.as_deref()).map(|o| o.bytes)
        }
    };
    let _ = request::write_atomic(
        &request::answer_path(&dir, pid),
        &request::answer_line(&answer),
    );
}
