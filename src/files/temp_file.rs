//! The temporary file a write goes through before it is renamed over its target.
//!
//! Policy: the name cannot be predicted, so another local user who can write to the
//! target's directory cannot plant a file (or a symlink) there ahead of us and make the
//! write fail (a denied exit snapshot) or land somewhere else: it is `.NAME.R.tmp` with R
//! 128 bits from the kernel's random source (`getrandom(2)`, else `/dev/urandom`, else
//! the standard library's per-process random hash keys mixed with the time and a
//! counter). The file is created exclusively and never through a symlink
//! (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600); a name that exists already (a clash, or a
//! planted file) is not touched: another random name is tried, a bounded number of times.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Names tried before giving up (each clash is a 2^-128 chance, or a planted file).
const TRIES: usize = 16;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// 16 random bytes (see the module policy for the sources, best first).
fn random_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    // SAFETY: the kernel writes at most `b.len()` bytes into `b`, a live local buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return b;
    }
    if let Ok(mut f) = File::open("/dev/urandom") {
        if f.read_exact(&mut b).is_ok() {
            return b;
        }
    }
    use std::hash::{BuildHasher, Hasher};
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    for (i, part) in b.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(t);
        h.write_u64(c);
        h.write_u32(std::process::id());
        h.write_usize(i);
        part.copy_from_slice(&h.finish().to_le_bytes());
    }
    b
}

/// A new temporary file in `path`'s directory, for a file to be renamed to `path`: the
/// open file and its name.
pub fn create_beside(path: &Path) -> Result<(File, PathBuf), String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} has no file name", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut last = String::new();
    for _ in 0..TRIES {
        let r: String = random_bytes().iter().map(|x| format!("{x:02x}")).collect();
        let tmp = dir.join(format!(".{}.{r}.tmp", name.to_string_lossy()));
        match crate::files::new_private_file().open(&tmp) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = format!("{} exists", tmp.display());
            }
            Err(e) => return Err(format!("creating {}: {e}", tmp.display())),
        }
    }
    Err(format!(
        "creating a temporary file in {}: {TRIES} random names were all taken (last: {last})",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cushim-temp-file-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    #[test]
    fn temporary_names_are_random_private_and_new() {
        let d = scratch("names");
        let target = d.join("snap.pickle");
        let (_, a) = create_beside(&target).expect("first");
        let (_, b) = create_beside(&target).expect("second");
        assert_ne!(a, b, "two temporaries of one target share a name");
        let an = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            an.starts_with(".snap.pickle.") && an.ends_with(".tmp"),
            "{an}"
        );
        // 128 random bits, hex: nothing in the name is the pid or a counter.
        assert_eq!(an.len(), ".snap.pickle.".len() + 32 + ".tmp".len(), "{an}");
        assert!(!an.contains(&format!(".{}.", std::process::id())), "{an}");
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_planted_symlink_is_never_followed() {
        // Whatever name is drawn, creating it never goes through a link: the planted
        // link's target stays untouched (O_EXCL|O_NOFOLLOW refuse an existing name).
        let d = scratch("planted");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        for i in 0..64 {
            std::os::unix::fs::symlink(&victim, d.join(format!(".snap.pickle.{i}.tmp")))
                .expect("plant");
        }
        let (_, t) = create_beside(&d.join("snap.pickle")).expect("created beside links");
        assert!(!std::fs::symlink_metadata(&t)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let _ = std::fs::remove_dir_all(&d);
    }
}
