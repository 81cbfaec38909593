//! `cushim run` makes the shim the program's NVTX injection library, so NVTX ranges reach it.
//!
//! Policy: `NVTX_INJECTION64_PATH` is set to the shim. If the user had set it to another
//! library (Nsight Systems' injection, say), that path moves to `CUSHIM_NVTX_FORWARD`, and the
//! shim loads it and passes it every NVTX call, so both tools receive the ranges. A value that
//! already is the shim is left as it is (no forwarding to itself).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

/// The variable NVTX reads in a 64-bit process.
pub const NVTX_VAR: &str = "NVTX_INJECTION64_PATH";
/// Where the shim finds the user's own injection library.
pub const FORWARD_VAR: &str = "CUSHIM_NVTX_FORWARD";

/// Point NVTX at `shim`, moving the user's own injection library to [`FORWARD_VAR`].
pub fn route_nvtx(cmd: &mut Command, shim: &Path) {
    let user: Option<OsString> = std::env::var_os(NVTX_VAR).filter(|v| !v.is_empty());
    if let Some(u) = user {
        if Path::new(&u) != shim {
            cmd.env(FORWARD_VAR, u);
        }
    }
    cmd.env(NVTX_VAR, shim);
}
