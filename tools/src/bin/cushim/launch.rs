//! How the `cushim` command launches a program: the shim preloaded, simcuda as the GPU when
//! asked (or when no driver is installed), and the cushim variables set.
//!
//! Invariant: the program's own environment is kept; cushim only prepends to `LD_PRELOAD` and
//! `LD_LIBRARY_PATH`, sets the `CUSHIM_*` variables the options ask for, and points NVTX at
//! the shim (keeping the user's own NVTX injection, see `nvtx_env`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::locate;

/// What to set up around the program.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    pub expandable: bool,
    pub snapshot: Option<PathBuf>,
    /// `CUSHIM_LOG`: the whole-run event log's path template.
    pub log: Option<PathBuf>,
    /// `CUSHIM_LOG_REPLACE=1`: a previous file at the log's path is replaced, not kept.
    pub log_replace: bool,
    pub history: Option<String>,
    pub sim: bool,
    /// `CUSHIM_MODE=observe`.
    pub observe: bool,
    pub preload: bool,
}

/// Whether a real CUDA driver can be loaded in this environment.
pub fn driver_present() -> bool {
    // SAFETY: dlopen/dlclose of a library name; the handle is closed at once.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

fn prepend(var: &str, value: &Path) -> OsString {
    let mut v = OsString::from(value);
    if let Some(old) = std::env::var_os(var).filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

impl Launch {
    /// Build the command for `program args...`.
    pub fn command(&self, program: &OsString, args: &[OsString]) -> Result<Command, String> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        if self.preload {
            let (shim, _) = locate::shim()?;
            cmd.env("LD_PRELOAD", prepend("LD_PRELOAD", &shim));
            crate::nvtx_env::route_nvtx(&mut cmd, &shim);
        }
        if self.sim || !driver_present() {
            if !self.sim {
                eprintln!(
                    "cushim: no CUDA driver (libcuda.so.1) found; running on simcuda, the simulated GPU"
                );
            }
            let layout = locate::sim_layout()?;
            cmd.env("LD_LIBRARY_PATH", prepend("LD_LIBRARY_PATH", &layout));
        }
        if self.expandable {
            let conf = match std::env::var("CUSHIM_ALLOC_CONF") {
                Ok(c) if !c.is_empty() => format!("{c},expandable_segments:True"),
                _ => "expandable_segments:True".to_string(),
            };
            cmd.env("CUSHIM_ALLOC_CONF", conf);
        }
        for var in ["CUSHIM_SNAPSHOT", "CUSHIM_LOG"] {
            let from_option = if var == "CUSHIM_SNAPSHOT" {
                &self.snapshot
            } else {
                &self.log
            };
            if let Some(p) = from_option
                .clone()
                .or_else(|| std::env::var_os(var).map(PathBuf::from))
            {
                crate::run_checks::warn_unwritable_dir(var, &p);
            }
        }
        if let Some(snap) = &self.snapshot {
            cmd.env("CUSHIM_SNAPSHOT", snap);
        }
        if let Some(log) = &self.log {
            cmd.env("CUSHIM_LOG", log);
            if self.log_replace {
                cmd.env("CUSHIM_LOG_REPLACE", "1");
            }
        }
        if (self.snapshot.is_some() || self.log.is_some())
            && std::env::var_os("CUSHIM_HISTORY").is_none()
            && self.history.is_none()
        {
            // Only `enabled`: every other key keeps CUSHIM_HISTORY's own default
            // (stacks=all), so `cushim run` and the variable record the same stacks.
            cmd.env("CUSHIM_HISTORY", "enabled=all");
        }
        if self.observe {
            cmd.env("CUSHIM_MODE", "observe");
        }
        if let Some(h) = &self.history {
            cmd.env("CUSHIM_HISTORY", h);
        }
        Ok(cmd)
    }
}

/// Exit code of a finished child, as a shell reports it (128 + signal when killed).
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
