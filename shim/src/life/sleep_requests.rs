//! Serving `cushim pause`/`cushim resume` (`cushim::sleep::request`): with sleep mode on, the
//! request signal is armed and a quiet thread waits on a pipe the handler writes one byte to
//! (async-signal safe); the thread reads this process's request file, removes it, serves it
//! like the C API and writes the answer file.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use cushim::sleep::request::{self, Request};

static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

fn wake(_sig: c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) of one byte from a static: async-signal safe.
        let _ = unsafe { libc::write(fd, b"s".as_ptr() as *const c_void, 1) };
    }
}

/// Arm the request signal and start the thread (sleep mode on only).
pub fn install() {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("cushim: no pause requests from outside: pipe2 failed");
        return;
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    // SAFETY: the write end is ours; the handler must never block.
    unsafe { libc::fcntl(wfd, libc::F_SETFL, libc::O_NONBLOCK) };
    if let Err(e) = crate::life::quiet_thread::spawn_quiet("cushim-sleep", move || serve(rfd)) {
        eprintln!("cushim: no pause requests from outside: {e}");
        return;
    }
    WRITE_FD.store(wfd, Ordering::Relaxed);
    crate::life::sigchain::on(crate::life::sigchain::Role::Sleep, wake);
    if let Err(e) = crate::life::sigchain::arm(request::SIGNAL, crate::life::sigchain::Role::Sleep)
    {
        eprintln!("cushim: no pause requests from outside: {e}");
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
