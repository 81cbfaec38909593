//! Where cushim's built pieces live and how to lay out simcuda as a CUDA installation.
//!
//! Shared by the `cushim` command and the integration tests, so both run programs the same
//! way. Invariant: the sim layout directory holds only symlinks named like NVIDIA's libraries
//! (`libcuda.so.1`, `libcuda.so`, `libcudart.so.12`, `libcudart.so`), all pointing at one
//! `libsimcuda.so`, so whichever name a process loads it by, it gets one process state.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// File name of the preload library.
pub const SHIM_LIB: &str = "libcushim.so";
/// File name of the simulated CUDA library.
pub const SIMCUDA_LIB: &str = "libsimcuda.so";
/// The names simcuda is installed under.
pub const SIM_NAMES: [&str; 4] = [
    "libcuda.so.1",
    "libcuda.so",
    "libcudart.so.12",
    "libcudart.so",
];

/// The repository root this crate was built from (the folder above `testsupport/`).
pub fn source_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// simcuda's C headers (`cuda.h`, `cuda_runtime_api.h`, `cuda_runtime.h`).
pub fn simcuda_include_dir() -> PathBuf {
    source_root().join("simcuda").join("include")
}

/// The shim's public C header directory (`cushim.h`).
pub fn shim_include_dir() -> PathBuf {
    source_root().join("shim").join("include")
}

/// The cargo output directory (`target/debug` or `target/release`) that holds the current
/// executable, for the `cushim` binary and for test binaries (which live in `.../deps`).
pub fn build_dir() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("current executable has no parent directory"))?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Make (idempotently, safely against concurrent callers) `dir/simcuda-lib` holding the
/// NVIDIA library names as symlinks to `dir/libsimcuda.so`. Returns the layout directory, to
/// be put first on `LD_LIBRARY_PATH`.
pub fn sim_layout(dir: &Path) -> io::Result<PathBuf> {
    let lib = dir.join(SIMCUDA_LIB);
    if !lib.exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} not found: build it with `cargo build -p simcuda`",
                lib.display()
            ),
        ));
    }
    let layout = dir.join("simcuda-lib");
    std::fs::create_dir_all(&layout)?;
    for name in SIM_NAMES {
        let link = layout.join(name);
        if std::fs::read_link(&link).is_ok_and(|t| t == Path::new("../libsimcuda.so")) {
            continue;
        }
        // Create under a unique name, then rename over: concurrent callers never see a
        // missing or half-made link.
        let tmp = layout.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink("../libsimcuda.so", &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(layout)
}

/// Compile a C program against simcuda's headers, linked to `libcudart` from `libdir`
/// (normally the sim layout), with debug info and frame pointers.
pub fn compile_c(src: &Path, out: &Path, libdir: &Path, extra: &[&str]) -> io::Result<()> {
    let mut link: Vec<OsString> = extra.iter().map(OsString::from).collect();
    link.push("-lcudart".into());
    compile_c_linked(src, out, libdir, &link)
}

/// Compile a C program against simcuda's headers with debug info and frame pointers,
/// searching `libdir` for libraries; `link` (objects, archives, `-l` flags) follows the
/// source, so a program can link a static runtime instead of `-lcudart`.
pub fn compile_c_linked(
    src: &Path,
    out: &Path,
    libdir: &Path,
    link: &[OsString],
) -> io::Result<()> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&cc)
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-pthread"])
        .arg("-I")
        .arg(simcuda_include_dir())
        .arg("-I")
        .arg(shim_include_dir())
        .arg(src)
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(libdir)
        .args(link)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running {cc}: {e}")))?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "{cc} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}
