//! Where the `cushim` command finds the pieces it runs programs with: the shim
//! (`libcushim.so`) and simcuda (`libsimcuda.so`, laid out under NVIDIA's library names).
//!
//! Policy, first match wins:
//! 1. `CUSHIM_LIB`: the shim's file, or a directory holding it (and simcuda). When set it is
//!    the only place looked for the shim: a wrong value is an error, never silently replaced.
//! 2. Next to the binary: a cargo build (`target/release`) or a hand-made install.
//! 3. `../lib/cushim` from the binary: a hand-made install (`bin/cushim` with the libraries
//!    in `lib/cushim/`), or a wheel of an earlier layout.
//! 4. Embedded in the binary (a release build: `cargo install`, a wheel), unpacked into the
//!    user's private cache and checked against the embedded bytes (embedded.rs). A binary
//!    that carries them never falls back to a build tree, which may be gone or stale.
//! 5. The build tree the binary was built from (`target/release`, then `target/debug`): a
//!    dev build run from elsewhere.
//!
//! simcuda's layout (symlinks named `libcuda.so.1`, `libcudart.so.12`, ... to one
//! `libsimcuda.so`, so every name a process loads gives one simcuda state) is made next to
//! the library only in a cargo target directory; an installed copy (a wheel, possibly in a
//! read-only site) gets it in the user's private cache (cache_dir.rs), so nothing is ever
//! written next to an installed binary. Copies would not do: two files are two simcuda
//! states.

use std::io;
use std::path::{Path, PathBuf};

use cushim_tools::artifacts;

use crate::cache_dir::{self, private_dir};
use crate::embedded;

/// Where a piece was found, for `--version` and `doctor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Env,
    NextToBinary,
    Prefix,
    Embedded,
    BuildTree,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Env => "from CUSHIM_LIB",
            Origin::NextToBinary => "next to the cushim binary",
            Origin::Prefix => "installed with cushim (lib/cushim)",
            Origin::Embedded => {
                "embedded in cushim, unpacked into the private cache and checked byte for byte"
            }
            Origin::BuildTree => "in the build tree cushim was built from",
        }
    }
}

/// The directories searched before the embedded copies, in order, with where each comes
/// from.
fn installed() -> Vec<(PathBuf, Origin)> {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe().and_then(|e| e.canonicalize()) {
        if let Some(bin) = exe.parent() {
            dirs.push((bin.to_path_buf(), Origin::NextToBinary));
            if let Some(prefix) = bin.parent() {
                dirs.push((prefix.join("lib").join("cushim"), Origin::Prefix));
            }
        }
    }
    dirs
}

/// The build tree the binary was built from: searched last, and only by a binary that
/// carries no libraries of its own.
fn build_tree() -> Vec<(PathBuf, Origin)> {
    let target = artifacts::source_root().join("target");
    vec![
        (target.join("release"), Origin::BuildTree),
        (target.join("debug"), Origin::BuildTree),
    ]
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
    find(artifacts::SHIM_LIB)
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
    find(artifacts::SIMCUDA_LIB)
}

/// `name` in the installed places, then the embedded copies, then (for a binary without
/// them) the build tree.
fn find(name: &str) -> Result<(PathBuf, Origin), String> {
    let first = |dirs: Vec<(PathBuf, Origin)>| {
        dirs.into_iter()
            .map(|(d, o)| (d.join(name), o))
            .find(|(f, _)| f.is_file())
    };
    if let Some(found) = first(installed()) {
        return Ok(found);
    }
    if embedded::present() {
        return embedded::unpacked().map(|u| (u.dir.join(name), Origin::Embedded));
    }
    first(build_tree()).ok_or_else(|| {
        let mut looked = String::from("CUSHIM_LIB");
        for (d, _) in installed().into_iter().chain(build_tree()) {
            looked.push_str(", ");
            looked.push_str(&d.display().to_string());
        }
        format!(
            "{name} not found (looked in {looked}; this cushim carries no copy of its own); \
             build it with `cargo build --release --manifest-path {}`, or set CUSHIM_LIB to \
             its directory",
            artifacts::source_root().join("Cargo.toml").display()
        )
    })
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
    cached_layout_in(&cache_dir::root()?, lib)
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
    use std::os::unix::fs::MetadataExt;

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
}
