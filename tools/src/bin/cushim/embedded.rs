//! The shim and simcuda carried inside the `cushim` binary (release builds embed them: see
//! tools/build.rs), so that an installed `cushim` (`cargo install`, a wheel) needs nothing
//! beside it and survives the removal of the tree it was built from.
//!
//! A library must be a file to be preloaded, so the pair is unpacked into the user's private
//! cache (cache_dir.rs) as `<root>/<tag>/libcushim.so` and `libsimcuda.so`, where the tag
//! names the build's contents (each build gets its own directory, so builds never fight
//! over one file).
//!
//! Invariants:
//! - A cached copy is used only when it equals the embedded bytes, compared in full on every
//!   run (a few milliseconds): a truncated, stale or altered file is rewritten, never
//!   loaded. The tag only names; the comparison decides.
//! - A file is never written in place: each writer writes its own temporary file in the
//!   same directory and renames it over the name, so two `cushim` processes starting at once
//!   both end with a whole file and a reader never sees a torn one.
//! - A directory that is not private (a symlink, another owner, open to others) is refused;
//!   the next root (the temporary directory) is tried.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cushim_tools::artifacts;

use crate::cache_dir;

const SHIM: &[u8] = include_bytes!(env!("CUSHIM_EMBED_SHIM"));
const SIMCUDA: &[u8] = include_bytes!(env!("CUSHIM_EMBED_SIMCUDA"));
const TAG: &str = env!("CUSHIM_EMBED_TAG");

/// Whether this binary carries the shim and simcuda.
pub fn present() -> bool {
    !SHIM.is_empty() && !SIMCUDA.is_empty()
}

/// Where the unpacked copies are, and the roots refused on the way (for `doctor`).
#[derive(Debug, Clone)]
pub struct Unpacked {
    pub dir: PathBuf,
    pub refused: Vec<String>,
}

/// The directory holding checked copies of the embedded pair, unpacked once per process.
pub fn unpacked() -> Result<&'static Unpacked, String> {
    static ONCE: OnceLock<Result<Unpacked, String>> = OnceLock::new();
    ONCE.get_or_init(|| {
        if !present() {
            return Err("this cushim was built without the shim and simcuda embedded".into());
        }
        let files = [
            (artifacts::SHIM_LIB, SHIM),
            (artifacts::SIMCUDA_LIB, SIMCUDA),
        ];
        let mut refused = Vec::new();
        for root in cache_dir::roots() {
            match unpack_in(&root, TAG, &files) {
                Ok(dir) => return Ok(Unpacked { dir, refused }),
                Err(e) => refused.push(e.to_string()),
            }
        }
        Err(format!(
            "unpacking the embedded shim and simcuda: {}",
            refused.join("; ")
        ))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Lay `files` out in `root/tag` (private), each checked against its bytes; the directory.
fn unpack_in(root: &Path, tag: &str, files: &[(&str, &[u8])]) -> io::Result<PathBuf> {
    cache_dir::private_dir(root)?;
    let dir = root.join(tag);
    cache_dir::private_dir(&dir)?;
    for (name, bytes) in files {
        let path = dir.join(name);
        if holds(&path, bytes)? {
            continue;
        }
        write_whole(&dir, name, bytes)?;
        if !holds(&path, bytes)? {
            return Err(io::Error::other(format!(
                "{}: does not hold what was just written",
                path.display()
            )));
        }
    }
    Ok(dir)
}

/// Whether `path` is a regular file (not a symlink) whose contents are exactly `bytes`.
fn holds(path: &Path, bytes: &[u8]) -> io::Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    if !meta.file_type().is_file() || meta.len() != bytes.len() as u64 {
        return Ok(false);
    }
    let mut file = std::fs::File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
        if n == 0 {
            return Ok(at == bytes.len());
        }
        if at + n > bytes.len() || buf[..n] != bytes[at..at + n] {
            return Ok(false);
        }
        at += n;
    }
}

/// Write `bytes` to a temporary file of this writer alone in `dir`, then rename it over
/// `dir/name`.
fn write_whole(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes));
    let renamed = written.and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::new(
            e.kind(),
            format!("writing {}: {e}", dir.join(name).display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cushim-embedded-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        dir
    }

    const FILES: [(&str, &[u8]); 2] = [("liba.so", b"library a"), ("libb.so", b"library b!")];

    #[test]
    fn unpacking_writes_each_file_once_in_a_private_directory_named_by_the_tag() {
        let root = scratch("fresh").join("cache");
        let dir = unpack_in(&root, "t1", &FILES).expect("unpacking");
        assert_eq!(dir, root.join("t1"));
        for (name, bytes) in FILES {
            assert_eq!(std::fs::read(dir.join(name)).expect("reading"), bytes);
        }
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let before = std::fs::metadata(dir.join("liba.so")).expect("stat");
        unpack_in(&root, "t1", &FILES).expect("unpacking again");
        let after = std::fs::metadata(dir.join("liba.so")).expect("stat");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(before.ino(), after.ino(), "a correct copy is left alone");
        let _ = std::fs::remove_dir_all(root.parent().expect("scratch"));
    }

    #[test]
    fn a_cached_library_that_differs_from_the_embedded_bytes_is_rewritten() {
        let root = scratch("wrong").join("cache");
        let dir = unpack_in(&root, "t1", &FILES).expect("unpacking");
        // Same length, different bytes; then a truncated file; then a symlink to a lookalike.
        std::fs::write(dir.join("liba.so"), b"library X").expect("altering");
        std::fs::write(dir.join("libb.so"), b"lib").expect("truncating");
        unpack_in(&root, "t1", &FILES).expect("unpacking over bad copies");
        for (name, bytes) in FILES {
            assert_eq!(std::fs::read(dir.join(name)).expect("reading"), bytes);
        }
        let lookalike = root.parent().expect("scratch").join("lookalike.so");
        std::fs::write(&lookalike, b"library a").expect("writing");
        std::fs::remove_file(dir.join("liba.so")).expect("removing");
        std::os::unix::fs::symlink(&lookalike, dir.join("liba.so")).expect("symlink");
        unpack_in(&root, "t1", &FILES).expect("unpacking over a symlink");
        let meta = std::fs::symlink_metadata(dir.join("liba.so")).expect("stat");
        assert!(
            meta.file_type().is_file(),
            "the symlink is replaced by a file"
        );
        let _ = std::fs::remove_dir_all(root.parent().expect("scratch"));
    }

    #[test]
    fn a_tag_directory_that_is_a_symlink_or_open_to_others_is_refused() {
        let base = scratch("refused");
        let root = base.join("cache");
        cache_dir::private_dir(&root).expect("root");
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).expect("creating");
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        std::os::unix::fs::symlink(&elsewhere, root.join("t1")).expect("symlink");
        let e = unpack_in(&root, "t1", &FILES).expect_err("a symlinked tag directory");
        assert!(e.to_string().contains("symlink"), "{e}");
        assert!(
            std::fs::read_dir(&elsewhere)
                .expect("listing")
                .next()
                .is_none(),
            "nothing written through the symlink"
        );
        std::fs::create_dir(root.join("t2")).expect("creating");
        std::fs::set_permissions(root.join("t2"), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let e = unpack_in(&root, "t2", &FILES).expect_err("a tag directory open to all");
        assert!(e.to_string().contains("0700"), "{e}");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let e = unpack_in(&root, "t3", &FILES).expect_err("a root open to others");
        assert!(e.to_string().contains("0700"), "{e}");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn writers_starting_at_once_all_end_with_whole_files() {
        let root = scratch("race").join("cache");
        let big: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        let files: Vec<(&str, &[u8])> = vec![("libbig.so", &big), ("liba.so", b"library a")];
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| unpack_in(&root, "t1", &files)))
                .collect();
            for h in handles {
                let dir = h.join().expect("a writer thread").expect("unpacking");
                assert_eq!(
                    std::fs::read(dir.join("libbig.so")).expect("reading"),
                    big,
                    "a whole file"
                );
            }
        });
        let left: Vec<_> = std::fs::read_dir(root.join("t1"))
            .expect("listing")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 2, "no temporary file left behind: {left:?}");
        let _ = std::fs::remove_dir_all(root.parent().expect("scratch"));
    }
}
