//! Opening an event log, the process's or a fork child's: its file (created as a snapshot's
//! is, `cushim::trace::log::file`), its header, a fresh writer state and the writer thread.
//!
//! Invariant: whatever fails here, the program runs on as without a log: the caller says
//! why in one `cushim:` line on stderr, and no switch is left on that would make an
//! allocating thread wait for a writer that does not exist.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use cushim::trace::log::codec::header_payload;
use cushim::trace::log::format::{self, kind, MAGIC};

use super::shared::{DRAINING, FD, ON};
use super::writer::{install_new_writer, write_all, writer_thread};

/// Open the file `template` names, write `header`, and start a writer thread with a fresh
/// writer state.
pub(super) fn open_log(template: &str, header: &serde_json::Value) -> Result<(), String> {
    use cushim::snapshot::output::{expand, TemplateVars};
    use std::os::fd::IntoRawFd;
    let path = expand(template, &TemplateVars::current(0));
    use cushim::trace::log::file::{create, Previous};
    let previous = match std::env::var("CUSHIM_LOG_REPLACE").as_deref() {
        Ok("1") => Previous::Replace,
        _ => Previous::Keep,
    };
    let created = create(std::path::Path::new(&path), previous)?;
    if let Some(kept) = &created.kept {
        say(&format!(
            "cushim: event log {path}: the previous file there is kept as {}\n",
            kept.display()
        ));
    }
    let fd = created.file.into_raw_fd();
    FD.store(fd, Ordering::Release);
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    let mut chunk = Vec::new();
    format::chunk(kind::HEADER, &header_payload(header), &mut chunk);
    out.extend_from_slice(&chunk);
    write_all(fd, &out).map_err(|e| format!("writing {path}: {e}"))?;
    install_new_writer();
    ON.store(true, Ordering::Release);
    DRAINING.store(true, Ordering::Release);
    let spawned = cushim::quiet_thread::spawn_quiet("cushim-log", writer_thread);
    if let Err(e) = spawned {
        DRAINING.store(false, Ordering::Release);
        return Err(e);
    }
    Ok(())
}

/// One line on stderr with `write(2)` (no lock another thread of the parent may have held
/// at the fork: Rust's stderr lock).
pub(super) fn say(line: &str) {
    // SAFETY: writing a valid slice to stderr.
    unsafe { libc::write(2, line.as_ptr() as *const c_void, line.len()) };
}
