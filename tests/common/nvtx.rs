//! NVIDIA's NVTX v3 headers for the C test programs: the `nvidia-nvtx-cu12` wheel, fetched
//! with pip into `target/nvtx-wheel/` on first use (never committed), and the programs
//! `tests/c/nvtx_*.c` built against them; and NVIDIA's `nvtx` Python package, its wheel for
//! this `python3` fetched the same way into `target/nvtx-python/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The range path each allocation of `tests/c/nvtx_ranges.c` is made in, by its size in MiB
/// (`None`: outside every range), as a live snapshot and a log both record it.
pub const RANGES_PROGRAM_PATHS: [(u64, Option<&str>); 8] = [
    (1, Some("step")),
    (2, Some("step/forward")),
    (3, Some("step/forward/layer")),
    (4, Some("step/mem:phase [io]")),
    (5, Some("step/request")),
    (6, None),
    (7, Some("[loader]/worker")),
    (8, Some("[loader]/worker/backward")),
];
use std::process::Command;
use std::sync::OnceLock;

/// The wheel's `include` directory, fetched with pip and unpacked under `target/` once; None
/// when it cannot be had here.
pub fn nvtx_include() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        fetch_wheel(
            "nvtx-wheel",
            &["nvidia-nvtx-cu12"],
            "nvidia/nvtx/include/nvtx3/nvToolsExt.h",
        )
        .map(|x| x.join("nvidia/nvtx/include"))
    })
    .as_deref()
}

/// A directory holding NVIDIA's `nvtx` Python package (its wheel for this `python3`,
/// unpacked), to put on `PYTHONPATH`; None when it cannot be had here.
pub fn nvtx_python() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        fetch_wheel(
            "nvtx-python",
            &["--only-binary=:all:", "nvtx"],
            "nvtx/__init__.py",
        )
    })
    .as_deref()
}

/// Download the wheel `pip_args` names with pip into `target/<dir>/` and unpack it there
/// (once: a later call finds `marker` in place); returns the unpacked root.
fn fetch_wheel(dir: &str, pip_args: &[&str], marker: &str) -> Option<PathBuf> {
    let root = super::build_dir().parent()?.join(dir);
    let unpacked = root.join("x");
    if unpacked.join(marker).exists() {
        return Some(unpacked);
    }
    // Downloaded and unpacked under this process's own names, then renamed into place:
    // two test binaries fetching at once never read half a file.
    let mine = root.join(format!("fetch-{}", std::process::id()));
    std::fs::create_dir_all(&mine).ok()?;
    let got = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet"])
        .args(pip_args)
        .arg("-d")
        .arg(&mine)
        .status()
        .ok()?;
    if !got.success() {
        return None;
    }
    let wheel = std::fs::read_dir(&mine)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))?;
    let done = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(mine.join("x"))
        .status()
        .ok()?;
    if done.success() {
        // Another process may have won the race: its copy is as good as ours.
        let _ = std::fs::rename(mine.join("x"), &unpacked);
    }
    let _ = std::fs::remove_dir_all(&mine);
    unpacked.join(marker).exists().then_some(unpacked)
}

/// `tests/c/nvtx_ranges.c` built against NVIDIA's headers; None (skipped) where they cannot
/// be had.
pub fn program() -> Option<PathBuf> {
    program_named("nvtx_ranges")
}

/// The C test program `name` built against NVIDIA's NVTX headers; None (skipped) where they
/// cannot be had.
pub fn program_named(name: &str) -> Option<PathBuf> {
    let Some(inc) = nvtx_include() else {
        super::skip::skip(
            "NVTX ranges from NVIDIA's NVTX headers",
            "the nvidia-nvtx-cu12 wheel cannot be downloaded here",
        );
        return None;
    };
    let flag = format!("-I{}", inc.display());
    Some(super::compile(name, &[&flag, "-ldl"]))
}

/// [`program`] run under the shim with the whole-run log on (native stacks) into
/// `dir/run.log`, which it returns; `None` where the NVTX headers cannot be had.
pub fn logged_run(dir: &Path) -> Option<PathBuf> {
    let exe = program()?;
    let log = dir.join("run.log");
    let out = super::run_ok(
        super::shim_cmd(&exe)
            .env("NVTX_INJECTION64_PATH", super::shim_path())
            .env("CUSHIM_LOG", &log)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=native"),
    );
    assert!(out.contains("ok"), "{out}");
    Some(log)
}
