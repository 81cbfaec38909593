//! What `cushim run` checks and says before and around starting the program.
//!
//! Policy, and why: the wrapper command must not hide what a shell would show. A program
//! that cannot be found exits 127 and one that cannot be executed 126, as in a shell, so
//! scripts that test those codes behave the same with `cushim run` in front. The snapshot
//! and log directories are checked at start, because a typo there is otherwise reported
//! only when the run is over (the exit-time message stays: the directory can change during
//! the run); a failed check only warns, the program still runs.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The exit code a shell gives a program that could not be started with error `e`.
pub fn spawn_failure_code(e: &io::Error) -> i32 {
    match e.kind() {
        io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// Why files cannot be created in `dir`, if they cannot.
fn dir_problem(dir: &Path) -> Option<String> {
    match std::fs::metadata(dir) {
        Err(e) => return Some(format!("{e}")),
        Ok(m) if !m.is_dir() => return Some("not a directory".into()),
        Ok(_) => {}
    }
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: access with a NUL-terminated path only reads the file system.
    let ok = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    (!ok).then(|| format!("{}", io::Error::last_os_error()))
}

/// Warn (one line) when the directory of the path template `template` (the value of
/// `var`) cannot take new files. A directory part with a `%` placeholder is not checked.
pub fn warn_unwritable_dir(var: &str, template: &Path) {
    let dir = match template.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.as_os_str().as_bytes().contains(&b'%') {
        return;
    }
    if let Some(why) = dir_problem(dir) {
        eprintln!(
            "cushim: {var}={}: cannot write in {} ({why}); the program runs, but that file will not be written",
            template.display(),
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_programs_exit_127_and_unrunnable_ones_126() {
        let missing = std::process::Command::new("/nonexistent/cushim-test-program").status();
        let e = missing.expect_err("a missing program does not start");
        assert_eq!(spawn_failure_code(&e), 127);
        let dir = std::process::Command::new("/").status();
        let e = dir.expect_err("a directory does not run");
        assert_eq!(spawn_failure_code(&e), 126);
    }

    #[test]
    fn a_missing_directory_is_a_problem_and_the_temp_dir_is_not() {
        assert!(dir_problem(Path::new("/nonexistent/cushim-dir")).is_some());
        assert!(dir_problem(&std::env::temp_dir()).is_none());
    }
}
