//! Which snapshot targets may be replaced.
//!
//! Policy: a snapshot is written to a new temporary file and renamed over its target, so
//! whatever the target was is gone afterwards. Only two kinds of target may go that way: a
//! name that does not exist yet and a regular file (an older snapshot). A symbolic link is
//! replaced (never followed) only when it dangles or leads to a regular file, as a link to
//! an older snapshot does. Anything else, a character or block device (`/dev/null` run as
//! root would otherwise be replaced for the whole system), a FIFO, a socket, a directory, or
//! a link to one of them, is left exactly as it was and the write is refused with an error
//! that names the path and what it is, before anything is created next to it.
//!
//! The check and the rename are not atomic: a target changed between them by somebody with
//! write access to its directory is replaced anyway (they could have replaced it
//! themselves).

use std::fs::FileType;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// What a file type is, in words for the error line.
fn describe(t: &FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// `Ok` when `path` may be replaced by a snapshot (module policy); otherwise what it is
/// (the caller names the path).
pub fn check_replaceable(path: &Path) -> Result<(), String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot inspect it: {e}")),
    };
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    if t.is_symlink() {
        return match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_file() => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Ok(m) => Err(format!(
                "a symbolic link to {}, not a regular file; left as it is, nothing written",
                describe(&m.file_type())
            )),
            Err(e) => Err(format!(
                "a symbolic link that cannot be followed ({e}); left as it is, nothing written"
            )),
        };
    }
    Err(format!(
        "{}, not a regular file; left as it is, nothing written",
        describe(&t)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cushim-target-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    #[test]
    fn new_names_regular_files_and_links_to_them_may_be_replaced() {
        let d = scratch("ok");
        assert!(check_replaceable(&d.join("new")).is_ok());
        let f = d.join("old");
        std::fs::write(&f, "x").expect("write");
        assert!(check_replaceable(&f).is_ok());
        let l = d.join("link");
        std::os::unix::fs::symlink(&f, &l).expect("symlink");
        assert!(check_replaceable(&l).is_ok());
        let dangling = d.join("dangling");
        std::os::unix::fs::symlink(d.join("nowhere"), &dangling).expect("symlink");
        assert!(check_replaceable(&dangling).is_ok());
    }

    #[test]
    fn directories_fifos_and_links_to_them_are_refused_with_what_they_are() {
        let d = scratch("refused");
        let e = check_replaceable(&d).expect_err("a directory");
        assert!(e.contains("a directory"), "{e}");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf8")).expect("cstring");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = check_replaceable(&fifo).expect_err("a FIFO");
        assert!(e.contains("a FIFO"), "{e}");
        let l = d.join("link");
        std::os::unix::fs::symlink("/dev/null", &l).expect("symlink");
        let e = check_replaceable(&l).expect_err("a link to a device");
        assert!(e.contains("symbolic link to a character device"), "{e}");
    }
}
