//! The CUDA version simcuda reports as driver and runtime (`cuDriverGetVersion`,
//! `cudaDriverGetVersion`, `cudaRuntimeGetVersion`). Policy: `SIMCUDA_CUDA_VERSION` when set
//! to a valid version (e.g. 13020); else 13020 when this library was installed as CUDA 13's
//! runtime (its file is `libcudart.so.13`, see the workspace's `testsupport/src/sim13.rs`),
//! so NVIDIA's 13.x runtime, which asks for the driver version first, sees a driver new
//! enough for it; else 12090. Read once.

use libc::c_int;
use std::sync::OnceLock;

/// CUDA 12.9, simcuda's default.
pub const CUDA_12_9: c_int = 12090;
/// CUDA 13.2, reported by the `libcudart.so.13` install.
pub const CUDA_13_2: c_int = 13020;

/// The version to report.
pub fn cuda_version() -> c_int {
    static V: OnceLock<c_int> = OnceLock::new();
    *V.get_or_init(detect)
}

fn detect() -> c_int {
    if let Ok(v) = std::env::var("SIMCUDA_CUDA_VERSION") {
        match v.trim().parse::<c_int>() {
            Ok(n) if (2000..=99990).contains(&n) => return n,
            _ => eprintln!("simcuda: SIMCUDA_CUDA_VERSION={v:?} is not a CUDA version such as 13020; ignoring it"),
        }
    }
    if installed_as_cuda_13() {
        CUDA_13_2
    } else {
        CUDA_12_9
    }
}

/// Whether this library's file (symlinks resolved) is named `libcudart.so.13`.
fn installed_as_cuda_13() -> bool {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above, with the address of a function of this library.
    let found = unsafe { libc::dladdr(detect as *const () as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is the loaded object's NUL-terminated path.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::Path::new(std::ffi::OsStr::new(
        std::str::from_utf8(path.to_bytes()).unwrap_or(""),
    ));
    std::fs::canonicalize(path).is_ok_and(|p| p.file_name().is_some_and(|n| n == "libcudart.so.13"))
}
