//! The event log's file: created as safely as a snapshot, though it is streamed into rather
//! than renamed into place.
//!
//! Policy (why: the log holds the same stacks, paths, range names and settings as a
//! snapshot, and its name is often predictable, in a shared directory):
//! - The file is always a new one, created with `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600
//!   (`files::new_private_file`, as a snapshot's temporary file): nothing
//!   already at the path is ever opened, truncated or written through.
//! - What may be at the path is judged as for a snapshot (`files::target`): a device, a
//!   FIFO, a socket, a directory or a link to one of them is left as it is and the log is
//!   refused (the caller says so in one line and the program runs on without a log).
//! - A symbolic link (dangling, or to a regular file) is replaced, never followed, as a
//!   snapshot replaces it: the link is removed and the new file created in its place; what
//!   it pointed to is untouched.
//! - A regular file (a previous run's log) is kept: it is renamed to the first free
//!   `PATH.1`, `PATH.2`, ... (a rename that never replaces: `RENAME_NOREPLACE`, or a hard
//!   link then unlink where the file system lacks it), and the new log takes the path. The
//!   caller says where the previous file went. Only when the caller asks
//!   ([`Previous::Replace`]: `CUSHIM_LOG_REPLACE=1`, or `cushim demo`'s own log) is the
//!   previous file replaced instead: its name is removed, as a link's, never truncated or
//!   written through (another hard link to it keeps its content).
//! - Somebody racing to put something at the path between these steps makes the exclusive
//!   create fail; the steps are tried again a few times, then the log is refused.

use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::files::new_private_file;
use crate::files::target::check_replaceable;

/// How often the exclusive create is tried when something keeps appearing at the path.
const TRIES: usize = 8;
/// The most `PATH.N` names looked at for a previous file.
const KEPT_NAMES: u32 = 9999;

/// What becomes of a regular file already at the log's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Previous {
    /// Renamed to the first free `PATH.N`.
    Keep,
    /// Its name removed (the file itself never written).
    Replace,
}

/// A log file just created.
#[derive(Debug)]
pub struct Created {
    /// Open for appending, empty.
    pub file: File,
    /// Where the regular file that was at the path went (`PATH.N`), if there was one.
    pub kept: Option<PathBuf>,
}

/// Create the log's file at `path` (module policy). The error names the path and what is
/// there, or the step that failed.
pub fn create(path: &Path, previous: Previous) -> Result<Created, String> {
    let shown = path.display();
    let mut kept = None;
    for _ in 0..TRIES {
        check_replaceable(path).map_err(|e| format!("{shown}: {e}"))?;
        match new_private_file().append(true).open(path) {
            Ok(file) => return Ok(Created { file, kept }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("creating {shown}: {e}")),
        }
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            // Gone since the create failed: try again.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{shown}: cannot inspect it: {e}")),
        };
        let t = meta.file_type();
        if t.is_symlink() || (t.is_file() && previous == Previous::Replace) {
            // Removes the link (the name) itself, never what it points to.
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("replacing the link {shown}: {e}")),
            }
        } else if t.is_file() {
            if let Some(k) = keep_aside(path)? {
                kept = Some(k);
            }
        }
        // Anything else is refused by the check at the top of the next try.
    }
    Err(format!(
        "{shown}: something else kept appearing there while the log was created; nothing written"
    ))
}

/// Rename the file at `path` to the first free `PATH.N`, never replacing anything there
/// (`None`: it vanished meanwhile).
fn keep_aside(path: &Path) -> Result<Option<PathBuf>, String> {
    let shown = path.display();
    let from = c_path(path)?;
    for n in 1..=KEPT_NAMES {
        let mut name = path.as_os_str().to_os_string();
        name.push(format!(".{n}"));
        let to_path = PathBuf::from(name);
        if std::fs::symlink_metadata(&to_path).is_ok() {
            continue;
        }
        let to = c_path(&to_path)?;
        match rename_noreplace(&from, &to) {
            Ok(()) => return Ok(Some(to_path)),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            // The file went away meanwhile: nothing to keep.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => {
                return Err(format!(
                    "keeping the previous {shown} as {}: {e}; nothing written",
                    to_path.display()
                ))
            }
        }
    }
    Err(format!(
        "keeping the previous {shown}: {shown}.1 to {shown}.{KEPT_NAMES} are all taken; nothing written"
    ))
}

fn c_path(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in path", p.display()))
}

/// `rename(from, to)` that fails with `EEXIST` rather than replace `to`: `renameat2` with
/// `RENAME_NOREPLACE`, else (a file system without it) a hard link then an unlink.
fn rename_noreplace(from: &CString, to: &CString) -> std::io::Result<()> {
    // SAFETY: two NUL-terminated paths relative to the working directory; the result is
    // checked.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(e);
    }
    // SAFETY: as above; `link` fails with EEXIST rather than replace `to`.
    if unsafe { libc::link(from.as_ptr(), to.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::unlink(from.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cushim-logfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    #[test]
    fn a_new_log_is_private_and_empty() {
        let d = scratch("new");
        let p = d.join("run.log");
        let mut c = create(&p, Previous::Keep).expect("created");
        assert!(c.kept.is_none());
        c.file.write_all(b"x").expect("write");
        let m = std::fs::metadata(&p).expect("there");
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_previous_file_is_kept_under_the_first_free_number() {
        let d = scratch("keep");
        let p = d.join("run.log");
        std::fs::write(&p, "first").expect("write");
        std::fs::write(d.join("run.log.1"), "older").expect("write");
        let c = create(&p, Previous::Keep).expect("created");
        assert_eq!(c.kept.as_deref(), Some(d.join("run.log.2").as_path()));
        assert_eq!(
            std::fs::read_to_string(d.join("run.log.2")).expect("kept"),
            "first"
        );
        assert_eq!(
            std::fs::read_to_string(d.join("run.log.1")).expect("kept"),
            "older"
        );
        assert_eq!(std::fs::metadata(&p).expect("new").len(), 0);
    }

    #[test]
    fn a_previous_file_is_replaced_by_name_only_when_asked() {
        let d = scratch("replace");
        let p = d.join("run.log");
        std::fs::write(&p, "first").expect("write");
        std::fs::hard_link(&p, d.join("other-name")).expect("link");
        let c = create(&p, Previous::Replace).expect("created");
        assert!(c.kept.is_none());
        assert_eq!(std::fs::metadata(&p).expect("new").len(), 0);
        assert_eq!(
            std::fs::read_to_string(d.join("other-name")).expect("other"),
            "first"
        );
        assert!(!d.join("run.log.1").exists());
    }

    #[test]
    fn a_link_is_replaced_and_what_it_points_to_is_untouched() {
        let d = scratch("link");
        let victim = d.join("precious");
        std::fs::write(&victim, "precious").expect("write");
        let p = d.join("run.log");
        std::os::unix::fs::symlink(&victim, &p).expect("symlink");
        let mut c = create(&p, Previous::Keep).expect("created");
        c.file.write_all(b"log").expect("write");
        assert!(c.kept.is_none());
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious"
        );
        assert!(std::fs::symlink_metadata(&p).expect("there").is_file());
    }

    #[test]
    fn a_fifo_or_a_directory_is_refused_and_left_as_it_was() {
        let d = scratch("special");
        let fifo = d.join("fifo");
        let c = c_path(&fifo).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = create(&fifo, Previous::Keep).expect_err("a FIFO");
        assert!(e.contains("a FIFO") && e.contains("fifo"), "{e}");
        assert!(std::fs::symlink_metadata(&fifo)
            .expect("there")
            .file_type()
            .is_fifo());
        let e = create(&d, Previous::Keep).expect_err("a directory");
        assert!(e.contains("a directory"), "{e}");
    }
}
