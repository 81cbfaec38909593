//! The record files behind cushim's IPC handles, private to the user who shares.
//!
//! A record holds a driver handle that opens a whole segment, so it must never be readable
//! by another user, and creating it must never write through a name someone else planted.
//!
//! Policy (why: a local user must not read another user's records, redirect the exporter's
//! write onto a file of their choosing, or hand an importer a record of their own):
//! - Directory: `CUSHIM_IPC_DIR` when set, else `/dev/shm/cushim-<uid>` (the temporary
//!   directory's `cushim-<uid>` without `/dev/shm`), created mode 0700 when missing. It is
//!   used only when `lstat` says it is a real directory (not a link), owned by the effective
//!   user, and neither group- nor world-writable; otherwise sharing through records is
//!   refused with one `cushim:` line naming the directory and the reason.
//! - Name: `cushim-ipc-<pid>-<serial>-<token>` with a 64-bit token from the kernel's random
//!   source, carried in the handle: nobody can guess a name to plant, and a handle cannot be
//!   forged from a pid and a serial.
//! - Creation: `open(O_CREAT | O_EXCL | O_NOFOLLOW)` mode 0600 (then `fchmod` 0600 whatever the
//!   umask): an existing name (a planted file or link) is never followed, truncated or reused;
//!   the exporter tries a fresh token instead.
//! - Reading (the importer): `open(O_NOFOLLOW | O_NONBLOCK)`, then `fstat` of what was opened:
//!   a regular file of exactly a record's size, owned by the exporter's user (the owner of
//!   `/proc/<pid>`), with no group or other permission bits, in a directory that passes the
//!   same checks for that user. Anything else is refused with one clear error.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bytes of a record of a block inside a segment: the driver's 64-byte handle, the block's
/// offset and size.
pub const RECORD_LEN: usize = 80;
/// The most bytes any record may have.
pub const RECORD_MAX: u64 = 1 << 20;

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The record directory for `uid`'s records (the exporter's user).
pub fn dir_for(uid: u32) -> PathBuf {
    if let Some(d) = std::env::var_os("CUSHIM_IPC_DIR") {
        return PathBuf::from(d);
    }
    let shm = Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    parent.join(format!("cushim-{uid}"))
}

/// Check that `dir` is a real directory owned by `uid`, writable by nobody else.
pub fn check_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if m.file_type().is_symlink() {
        return Err(format!("{} is a symbolic link", dir.display()));
    }
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != uid {
        return Err(format!(
            "{} belongs to user {}, not {uid}",
            dir.display(),
            m.uid()
        ));
    }
    if m.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by others (mode {:o})",
            dir.display(),
            m.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

/// The exporter's record directory, created 0700 if missing, checked.
pub fn own_dir() -> Result<PathBuf, String> {
    let uid = euid();
    let dir = dir_for(uid);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", dir.display())),
    }
    check_dir(&dir, uid)?;
    Ok(dir)
}

/// A fresh token from the kernel's random source.
pub fn token() -> Result<u64, String> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into our buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(format!("getrandom: {}", std::io::Error::last_os_error()));
    }
    Ok(u64::from_le_bytes(b))
}

pub fn name(pid: u32, serial: u32, token: u64) -> String {
    format!("cushim-ipc-{pid}-{serial}-{token:016x}")
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: NUL in path", path.display()))
}

/// Create `path` exclusively (never following or reusing an existing name), mode 0600, and
/// write `bytes` into it.
pub fn create_exclusive(path: &Path, bytes: &[u8]) -> Result<(), std::io::Error> {
    let c = c_path(path).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(fd);
    let written = f
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| f.write_all(bytes));
    if let Err(e) = written {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// The user a live process runs as (the owner of `/proc/<pid>`).
pub fn uid_of(pid: u32) -> Result<u32, String> {
    std::fs::metadata(format!("/proc/{pid}"))
        .map(|m| m.uid())
        .map_err(|e| format!("exporting process {pid} is gone ({e})"))
}

/// Read the record at `path`, which must belong to `uid`, be private to it, and have a
/// length `len_ok` accepts.
pub fn read_private(
    path: &Path,
    uid: u32,
    len_ok: impl Fn(u64) -> bool,
) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let c = c_path(path)?;
    // SAFETY: `c` is a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) {
            return Err(format!("{shown} is a symbolic link"));
        }
        return Err(format!("{shown}: {e}"));
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let m = f.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if !m.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    if m.uid() != uid {
        return Err(format!(
            "{shown} belongs to user {}, not the exporter's user {uid}",
            m.uid()
        ));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{shown} is open to other users (mode {:o})",
            m.permissions().mode() & 0o7777
        ));
    }
    if m.len() > RECORD_MAX || !len_ok(m.len()) {
        return Err(format!("{shown} is not a record ({} bytes)", m.len()));
    }
    let mut v = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut v).map_err(|e| format!("{shown}: {e}"))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_record(n: u64) -> bool {
        n == RECORD_LEN as u64
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cushim-records-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&d)
            .expect("scratch dir");
        d
    }

    #[test]
    fn a_record_is_created_mode_0600_and_read_back_by_its_owner() {
        let d = scratch("create");
        let p = d.join("rec");
        create_exclusive(&p, &[7u8; RECORD_LEN]).expect("create");
        let mode = std::fs::metadata(&p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            read_private(&p, euid(), is_record).expect("read"),
            vec![7u8; RECORD_LEN]
        );
        assert!(
            read_private(&p, euid() + 1, is_record).is_err(),
            "another user's record"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_planted_link_or_file_at_the_name_is_never_followed_truncated_or_reused() {
        let d = scratch("planted");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        let link = d.join("link");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        let e = create_exclusive(&link, &[1u8; RECORD_LEN]).expect_err("link followed");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        let foreign = d.join("foreign");
        std::fs::write(&foreign, b"someone else's").expect("foreign");
        let e = create_exclusive(&foreign, &[1u8; RECORD_LEN]).expect_err("file reused");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(std::fs::read(&foreign).expect("foreign"), b"someone else's");
        // Reading never follows a link either.
        assert!(read_private(&link, euid(), is_record).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_record_open_to_others_or_of_the_wrong_size_is_refused() {
        let d = scratch("open");
        let p = d.join("rec");
        std::fs::write(&p, [0u8; RECORD_LEN]).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = read_private(&p, euid(), is_record).expect_err("0644 accepted");
        assert!(e.contains("open to other users"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&p, [0u8; 3]).expect("write");
        assert!(read_private(&p, euid(), is_record)
            .expect_err("short")
            .contains("not a record"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_writable_by_others_a_link_or_a_foreign_owner_is_refused() {
        let d = scratch("dir");
        assert!(check_dir(&d, euid()).is_ok());
        assert!(check_dir(&d, euid() + 1)
            .expect_err("owner")
            .contains("belongs to user"));
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).expect("symlink");
        assert!(check_dir(&link, euid())
            .expect_err("link")
            .contains("symbolic link"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert!(check_dir(&d, euid())
            .expect_err("world")
            .contains("writable by others"));
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }
}
