//! The demo's workload, built with cushim (tools/build.rs) and carried inside its binary,
//! and the private temporary directory it runs from.
//!
//! Policy: the workload is written to a fresh `mkdtemp` directory (0700) under the temporary
//! directory, run from there, and the directory is removed when the demo ends, so no C
//! compiler is needed at run time and nothing is written next to the installed binary.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The workload's executable (empty when cushim was built without a C compiler).
static DEMO_EXE: &[u8] = include_bytes!(env!("CUSHIM_DEMO_EXE"));

/// A private temporary directory, removed with its contents when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Result<TempDir, String> {
        let template = std::env::temp_dir().join("cushim-demo.XXXXXX");
        let c = CString::new(template.as_os_str().as_bytes())
            .map_err(|_| format!("{}: a NUL byte in the path", template.display()))?;
        let mut buf = c.into_bytes_with_nul();
        // SAFETY: buf is a writable NUL-terminated template that mkdtemp fills in place.
        let p = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) };
        if p.is_null() {
            return Err(format!(
                "creating a temporary directory {}: {}",
                template.display(),
                std::io::Error::last_os_error()
            ));
        }
        buf.pop();
        Ok(TempDir(PathBuf::from(std::ffi::OsStr::from_bytes(&buf))))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Write the workload into `dir` as an executable; its path.
pub fn write_demo(dir: &Path) -> Result<PathBuf, String> {
    if DEMO_EXE.is_empty() {
        return Err(
            "this cushim was built without the demo's workload (no C compiler at \
                    build time); rebuild it where `cc` is available"
                .to_string(),
        );
    }
    let exe = dir.join("cushim-demo");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&exe)
        .map_err(|e| format!("creating {}: {e}", exe.display()))?;
    f.write_all(DEMO_EXE)
        .map_err(|e| format!("writing {}: {e}", exe.display()))?;
    Ok(exe)
}
