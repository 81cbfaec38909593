//! The record files behind cushim's IPC handles, private to the user who shares.
//!
//! A record holds a driver handle that opens a whole segment, so it must never be readable
//! by another user, and creating it must never write through a name someone else planted.
//!
//! Policy (why: a local user must not read another user's records, redirect the exporter's
//! write onto a file of their choosing, or hand an importer a record of their own):
//! - Directory: `CUSHIM_IPC_DIR` when set, else `/dev/shm/cushim-<uid>` (the temporary
//!   directory's `cushim-<uid>` without `/dev/shm`), created mode 0700 when missing. It is
//!   opened without following a link (`O_DIRECTORY | O_NOFOLLOW`) and used only when what
//!   was opened is a directory owned by the effective user and neither group- nor
//!   world-writable; records are then created and opened relative to that descriptor
//!   (`openat`), so the directory cannot be swapped between the check and the use.
//!   Otherwise sharing through records is refused with one `cushim:` line naming the
//!   directory and the reason.
//! - Name: `cushim-ipc-<pid>-<serial>-<token>` with a 64-bit token from the kernel's random
//!   source, carried in the handle: nobody can guess a name to plant, and a handle cannot be
//!   forged from a pid and a serial.
//! - Creation: `openat(O_CREAT | O_EXCL | O_NOFOLLOW)` mode 0600 (then `fchmod` 0600 whatever the
//!   umask): an existing name (a planted file or link) is never followed, truncated or reused;
//!   the exporter tries a fresh token instead.
//! - Reading (the importer): `openat(O_NOFOLLOW | O_NONBLOCK)`, then `fstat` of what was opened:
//!   a regular file of exactly a record's size, owned by the exporter's user (the owner of
//!   `/proc/<pid>`), with no group or other permission bits, in a directory that passes the
//!   same checks for that user. Anything else is refused with one clear error.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// An open record directory: checked through the descriptor itself, and every record is
/// created or opened relative to it, so the directory cannot be swapped after the check.
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn c_name(name: &str) -> Result<CString, String> {
    CString::new(name).map_err(|_| format!("{name:?}: NUL in name"))
}

/// Open `dir` (not following a link) and check that it is a directory owned by `uid`,
/// writable by nobody else.
pub fn open_checked(dir: &Path, uid: u32) -> Result<Dir, String> {
    let shown = dir.display();
    let c =
        CString::new(dir.as_os_str().as_bytes()).map_err(|_| format!("{shown}: NUL in path"))?;
    // SAFETY: `c` is a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
        return Err(match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) if link => {
                format!("{shown} is a symbolic link")
            }
            Some(libc::ENOTDIR) => format!("{shown} is not a directory"),
            _ => format!("{shown}: {e}"),
        });
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let m = std::fs::File::from(fd.try_clone().map_err(|e| format!("{shown}: {e}"))?)
        .metadata()
        .map_err(|e| format!("{shown}: {e}"))?;
    if m.uid() != uid {
        return Err(format!("{shown} belongs to user {}, not {uid}", m.uid()));
    }
    if m.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{shown} is writable by others (mode {:o})",
            m.permissions().mode() & 0o7777
        ));
    }
    Ok(Dir {
        fd,
        path: dir.to_path_buf(),
    })
}

/// The exporter's record directory, created 0700 if missing, opened and checked.
pub fn own_dir() -> Result<Dir, String> {
    let uid = euid();
    let dir = dir_for(uid);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", dir.display())),
    }
    open_checked(&dir, uid)
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

/// Remove, at exit, the record files this process wrote (`files` picks the list out of the
/// table `table` guards). A `fork` child inherits its parent's list: it removes only the
/// files named for its own pid (the parent's handles stay open to importers), and leaves the
/// list alone if a thread that does not exist in the child held it at the fork.
pub fn remove_at_exit<T>(
    table: &parking_lot::Mutex<T>,
    files: impl FnOnce(&mut T) -> &mut Vec<std::path::PathBuf>,
) {
    let forked = crate::life::forked::in_forked_child();
    let mut guard = if forked {
        match table.try_lock() {
            Some(g) => g,
            None => return,
        }
    } else {
        table.lock()
    };
    let own = format!("cushim-ipc-{}-", std::process::id());
    for f in files(&mut guard).drain(..) {
        let mine = f
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&own));
        if !forked || mine {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Dir {
    /// Create `name` in this directory exclusively (never following or reusing an existing
    /// name), mode 0600, holding `bytes`.
    pub fn create_exclusive(&self, name: &str, bytes: &[u8]) -> Result<(), std::io::Error> {
        let c = c_name(name).map_err(std::io::Error::other)?;
        // SAFETY: our directory descriptor and a NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let written = f
            .set_permissions(std::fs::Permissions::from_mode(0o600))
            .and_then(|()| f.write_all(bytes));
        if let Err(e) = written {
            // SAFETY: removing the name we just created, relative to our directory.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
            return Err(e);
        }
        Ok(())
    }

    /// Read record `name`, which must be a regular file belonging to `uid`, private to it,
    /// with a length `len_ok` accepts.
    pub fn read_private(
        &self,
        name: &str,
        uid: u32,
        len_ok: impl Fn(u64) -> bool,
    ) -> Result<Vec<u8>, String> {
        let path = self.path.join(name);
        let shown = path.display();
        let c = c_name(name)?;
        // SAFETY: our directory descriptor and a NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
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
}

/// The user a live process runs as (the owner of `/proc/<pid>`).
pub fn uid_of(pid: u32) -> Result<u32, String> {
    std::fs::metadata(format!("/proc/{pid}"))
        .map(|m| m.uid())
        .map_err(|e| format!("exporting process {pid} is gone ({e})"))
}

/// Write a new record of this process (`serial`) holding `bytes` into its checked
/// directory: its path (to remove at exit) and the token naming it. A taken name (planted
/// by someone else) is skipped, never reused.
pub fn write_new(serial: u32, bytes: &[u8]) -> Result<(PathBuf, u64), String> {
    let dir = own_dir()?;
    let pid = std::process::id();
    for _ in 0..8 {
        let t = token()?;
        let n = name(pid, serial, t);
        match dir.create_exclusive(&n, bytes) {
            Ok(()) => return Ok((dir.path.join(n), t)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("creating {}: {e}", dir.path.join(n).display())),
        }
    }
    Err(format!("{}: no free record name", dir.path.display()))
}

/// Read the record (`pid`, `serial`, `token`) of an exporter, checked to belong to the
/// exporter's user in that user's checked directory.
pub fn read(
    pid: u32,
    serial: u32,
    token: u64,
    len_ok: impl Fn(u64) -> bool,
) -> Result<Vec<u8>, String> {
    let uid = uid_of(pid)?;
    let dir = open_checked(&dir_for(uid), uid)?;
    dir.read_private(&name(pid, serial, token), uid, len_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_record(n: u64) -> bool {
        n == RECORD_LEN as u64
    }

    fn scratch(tag: &str) -> (PathBuf, Dir) {
        let d = std::env::temp_dir().join(format!("cushim-records-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&d)
            .expect("scratch dir");
        let dir = open_checked(&d, euid()).expect("checked");
        (d, dir)
    }

    #[test]
    fn a_record_is_created_mode_0600_and_read_back_by_its_owner() {
        let (d, dir) = scratch("create");
        dir.create_exclusive("rec", &[7u8; RECORD_LEN])
            .expect("create");
        let mode = std::fs::metadata(d.join("rec"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            dir.read_private("rec", euid(), is_record).expect("read"),
            vec![7u8; RECORD_LEN]
        );
        let e = dir
            .read_private("rec", euid() + 1, is_record)
            .expect_err("another user's record");
        assert!(e.contains("not the exporter's user"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_planted_link_or_file_at_the_name_is_never_followed_truncated_or_reused() {
        let (d, dir) = scratch("planted");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        std::os::unix::fs::symlink(&victim, d.join("link")).expect("symlink");
        let e = dir
            .create_exclusive("link", &[1u8; RECORD_LEN])
            .expect_err("link followed");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        std::fs::write(d.join("foreign"), b"someone else's").expect("foreign");
        let e = dir
            .create_exclusive("foreign", &[1u8; RECORD_LEN])
            .expect_err("file reused");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(
            std::fs::read(d.join("foreign")).expect("foreign"),
            b"someone else's"
        );
        // Reading never follows a link either.
        let e = dir
            .read_private("link", euid(), |_| true)
            .expect_err("link read");
        assert!(e.contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_record_open_to_others_or_of_the_wrong_size_is_refused() {
        let (d, dir) = scratch("open");
        let p = d.join("rec");
        std::fs::write(&p, [0u8; RECORD_LEN]).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = dir
            .read_private("rec", euid(), is_record)
            .expect_err("0644 accepted");
        assert!(e.contains("open to other users"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&p, [0u8; 3]).expect("write");
        let e = dir
            .read_private("rec", euid(), is_record)
            .expect_err("short");
        assert!(e.contains("not a record"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_writable_by_others_a_link_or_a_foreign_owner_is_refused() {
        let (d, _dir) = scratch("dir");
        let e = open_checked(&d, euid() + 1).err().expect("owner");
        assert!(e.contains("belongs to user"), "{e}");
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).expect("symlink");
        let e = open_checked(&link, euid()).err().expect("link");
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let e = open_checked(&d, euid()).err().expect("world");
        assert!(e.contains("writable by others"), "{e}");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }
}
