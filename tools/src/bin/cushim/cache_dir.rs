//! The user's private cache directory, where `cushim` writes what it must never write next
//! to an installed binary: the shim and simcuda unpacked from the binary, and simcuda's
//! layout under NVIDIA's library names.
//!
//! Policy: `$XDG_CACHE_HOME/cushim`, else `~/.cache/cushim`, else (a read-only or missing
//! home) `cushim-<uid>` under the temporary directory. A directory is used only when it is
//! private: a real directory (not a symlink), owned by this user, with no permission for
//! group or others. Anything else is refused, never repaired in place: a library that
//! others could have replaced is never preloaded. A shared temporary directory is why the
//! check matters; in the user's own cache it catches a mistake before it becomes a hole.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The candidate roots, best first: the user's cache, then the temporary directory.
pub fn roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let home_cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        });
    if let Some(c) = home_cache {
        roots.push(c.join("cushim"));
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    roots.push(std::env::temp_dir().join(format!("cushim-{uid}")));
    roots
}

/// The first root that is (or can be made) private.
pub fn root() -> io::Result<PathBuf> {
    let mut refused = Vec::new();
    for dir in roots() {
        match private_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => refused.push(e.to_string()),
        }
    }
    Err(io::Error::other(format!(
        "no private cache directory: {}",
        refused.join("; ")
    )))
}

/// Create `dir` (0700, with its missing parents) or accept it if it exists and is private:
/// a real directory, owned by this user, not open to group or others.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let why = if meta.file_type().is_symlink() {
        Some("is a symlink")
    } else if !meta.is_dir() {
        Some("is not a directory")
    } else if meta.uid() != uid {
        Some("is owned by another user")
    } else if meta.mode() & 0o077 != 0 {
        Some("is open to group or others (not mode 0700)")
    } else {
        None
    };
    match why {
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} {why}: refused", dir.display()),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    pub fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cushim-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        dir
    }

    #[test]
    fn a_cache_directory_that_is_a_symlink_is_refused() {
        let dir = scratch("symlink");
        let real = dir.join("real");
        std::fs::create_dir_all(&real).expect("creating");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let e = private_dir(&link).expect_err("a planted symlink is not our directory");
        assert!(e.to_string().contains("symlink"), "{e}");
        assert!(private_dir(&real).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cache_directory_open_to_others_is_refused_and_a_new_one_is_private() {
        let dir = scratch("mode");
        let open = dir.join("open");
        std::fs::create_dir_all(&open).expect("creating");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let e = private_dir(&open).expect_err("a directory others can read is not private");
        assert!(e.to_string().contains("0700"), "{e}");
        let fresh = dir.join("a").join("fresh");
        private_dir(&fresh).expect("making a private directory");
        let mode = std::fs::metadata(&fresh).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
