//! Where the `cushim` command finds the pieces it runs programs with: the shim
//! (`libcushim.so`) and simcuda (`libsimcuda.so`, laid out under NVIDIA's library names).
//!
//! Policy, first match wins:
//! 1. `CUSHIM_LIB`: the shim's file, or a directory holding it (and simcuda). When set it is
//!    the only place looked for the shim: a wrong value is an error, never silently replaced.
//! 2. Next to the binary: a cargo build (`target/release`) or a hand-made install.
//! 3. `../lib/cushim` from the binary: the wheel's data (`pip install` puts the binary in the
//!    environment's `bin/` and the libraries in its `lib/cushim/`).
//! 4. The build tree the binary was built from (`target/release`, then `target/debug`):
//!    `cargo install --path tools` from a clone after `cargo build --release`.
//!
//! simcuda's layout (symlinks named `libcuda.so.1`, `libcudart.so.12`, ... to one
//! `libsimcuda.so`, so every name a process loads gives one simcuda state) is made next to
//! the library only in a cargo target directory; an installed copy (a wheel, possibly in a
//! read-only site) gets it in the user's cache (`$XDG_CACHE_HOME/cushim`, `~/.cache/cushim`,
//! else a private directory under the temporary directory), so nothing is ever written next
//! to an installed binary. Copies would not do: two files are two simcuda states.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use cushim_tools::artifacts;

/// Where a piece was found, for `--version` and `doctor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Env,
    NextToBinary,
    Prefix,
    BuildTree,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Env => "from CUSHIM_LIB",
            Origin::NextToBinary => "next to the cushim binary",
            Origin::Prefix => "installed with cushim (lib/cushim)",
            Origin::BuildTree => "in the build tree cushim was built from",
        }
    }
}

/// The directories searched, in order, with where each comes from.
fn candidates() -> Vec<(PathBuf, Origin)> {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe().and_then(|e| e.canonicalize()) {
        if let Some(bin) = exe.parent() {
            dirs.push((bin.to_path_buf(), Origin::NextToBinary));
            if let Some(prefix) = bin.parent() {
                dirs.push((prefix.join("lib").join("cushim"), Origin::Prefix));
            }
        }
    }
    let target = artifacts::source_root().join("target");
    dirs.push((target.join("release"), Origin::BuildTree));
    dirs.push((target.join("debug"), Origin::BuildTree));
    dirs
}

/// The shim to preload, and where it was found.
pub fn shim() -> Result<(PathBuf, Origin), String> {
    if let Some(v) = std::env::var_os("CUSHIM_LIB").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        let file = if p.is_dir() {
            p.join(artifacts::SHIM_LIB)
        } else {
            p
        };
        if !file.is_file() {
            return Err(format!(
                "CUSHIM_LIB={}: no {} there",
                file.display(),
                artifacts::SHIM_LIB
            ));
        }
        return Ok((file, Origin::Env));
    }
    find(artifacts::SHIM_LIB).ok_or_else(|| {
        format!(
            "{} not found (looked in {}); build it with `cargo build --release \
             --manifest-path {}`, or set CUSHIM_LIB to its path",
            artifacts::SHIM_LIB,
            searched(),
            artifacts::source_root().join("Cargo.toml").display()
        )
    })
}

/// simcuda's library, and where it was found (beside `CUSHIM_LIB` first when that is set).
pub fn simcuda() -> Result<(PathBuf, Origin), String> {
    if let Some(v) = std::env::var_os("CUSHIM_LIB").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        let dir = if p.is_dir() {
            p
        } else {
            p.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let lib = dir.join(artifacts::SIMCUDA_LIB);
        if lib.is_file() {
            return Ok((lib, Origin::Env));
        }
    }
    find(artifacts::SIMCUDA_LIB).ok_or_else(|| {
        format!(
            "{} not found (looked in {}); build it with `cargo build --release \
             --manifest-path {}`",
            artifacts::SIMCUDA_LIB,
            searched(),
            artifacts::source_root().join("Cargo.toml").display()
        )
    })
}

fn find(name: &str) -> Option<(PathBuf, Origin)> {
    candidates()
        .into_iter()
        .map(|(d, o)| (d.join(name), o))
        .find(|(f, _)| f.is_file())
}

fn searched() -> String {
    let mut s = String::from("CUSHIM_LIB");
    for (d, _) in candidates() {
        s.push_str(", ");
        s.push_str(&d.display().to_string());
    }
    s
}

/// The directory to put first on `LD_LIBRARY_PATH` so that a program loads simcuda under
/// NVIDIA's names.
pub fn sim_layout() -> Result<PathBuf, String> {
    let (lib, _) = simcuda()?;
    let dir = lib.parent().map(Path::to_path_buf).unwrap_or_default();
    // A cargo target directory (`target/` carries CACHEDIR.TAG) keeps its layout in place,
    // where the tests make it too.
    let in_target = dir
        .parent()
        .is_some_and(|t| t.join("CACHEDIR.TAG").is_file());
    if in_target && lib.file_name().is_some_and(|n| n == artifacts::SIMCUDA_LIB) {
        return artifacts::sim_layout(&dir).map_err(|e| format!("simcuda: {e}"));
    }
    cached_layout(&lib).map_err(|e| format!("simcuda's layout for {}: {e}", lib.display()))
}

/// The user's cache directory for cushim, made private (0700) if new.
fn cache_root() -> io::Result<PathBuf> {
    let home_cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        });
    if let Some(c) = home_cache {
        let dir = c.join("cushim");
        if private_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("cushim-{uid}"));
    private_dir(&dir)?;
    Ok(dir)
}

/// Create `dir` (0700) or accept it if it exists, is a real directory, and is ours: in a
/// shared temporary directory another user could have made it first.
fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid {
        return Err(io::Error::other(format!(
            "{} is not a directory owned by this user",
            dir.display()
        )));
    }
    Ok(())
}

/// A short stable name for a path (FNV-1a), so that each installed simcuda gets its own
/// layout directory.
fn path_tag(p: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The layout in the cache: absolute symlinks to `lib`, each made under a unique name and
/// renamed over, so concurrent runs never see a missing or half-made link.
fn cached_layout(lib: &Path) -> io::Result<PathBuf> {
    cached_layout_in(&cache_root()?, lib)
}

fn cached_layout_in(root: &Path, lib: &Path) -> io::Result<PathBuf> {
    let lib = lib.canonicalize()?;
    let layout = root.join(format!("simcuda-lib-{}", path_tag(&lib)));
    private_dir(&layout)?;
    for name in artifacts::SIM_NAMES {
        let link = layout.join(name);
        if std::fs::read_link(&link).is_ok_and(|t| t == lib) {
            continue;
        }
        let tmp = layout.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&lib, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cushim-locate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        dir
    }

    #[test]
    fn the_cached_layout_links_every_nvidia_name_to_the_one_library_and_repairs_a_wrong_link() {
        let dir = scratch("layout");
        let lib = dir.join(artifacts::SIMCUDA_LIB);
        std::fs::write(&lib, b"not really a library").expect("writing");
        let root = dir.join("cache");
        private_dir(&root).expect("making the cache root");
        let layout = cached_layout_in(&root, &lib).expect("laying out");
        let canonical = lib.canonicalize().expect("canonical path");
        std::fs::remove_file(layout.join("libcuda.so.1")).expect("removing a link");
        std::fs::remove_file(layout.join("libcudart.so.12")).expect("removing a link");
        std::os::unix::fs::symlink("/nonexistent", layout.join("libcudart.so.12"))
            .expect("planting a wrong link");
        let again = cached_layout_in(&root, &lib).expect("laying out again");
        assert_eq!(again, layout, "one directory per library path");
        for name in artifacts::SIM_NAMES {
            let target = std::fs::read_link(layout.join(name)).expect("a link");
            assert_eq!(target, canonical, "{name}");
        }
        let mode = std::fs::metadata(&layout).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o700, "the layout directory is private");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cache_directory_that_is_a_symlink_is_refused() {
        let dir = scratch("symlink");
        let real = dir.join("real");
        std::fs::create_dir_all(&real).expect("creating");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        assert!(
            private_dir(&link).is_err(),
            "a planted symlink is not our directory"
        );
        assert!(private_dir(&real).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
