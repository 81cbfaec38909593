//! `cushim`'s command line as a user runs it, for the tests of its answers.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `cushim ARGS FILES...`, run with the suite's environment.
pub fn cushim(args: &[&str], files: &[&Path]) -> std::process::Output {
    let mut c = Command::new(super::cushim_bin());
    c.args(args);
    for f in files {
        c.arg(f);
    }
    super::run(&mut c)
}

/// `cushim ARGS FILES...`'s stdout; fails the test, with both outputs, when it fails.
pub fn ok(args: &[&str], files: &[&Path]) -> String {
    let out = cushim(args, files);
    assert!(
        out.status.success(),
        "cushim {args:?} {files:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Write `bytes` to `dir/name` and give its path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}
