//! The engine's build script: which build this is. It sets `CUSHIM_GIT_COMMIT` to the
//! source tree's git commit (12 hex digits), read by `cushim::version` for `cushim --version` and the snapshot's `cushim`
//! section.
//!
//! Policy: a build without git, or from a tree that is not a git checkout (a release
//! tarball), gets `unknown` rather than failing. Cargo reruns this when `HEAD` or the branch
//! it names moves, so the commit never goes stale in an incremental build.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let commit = git(&root, &["rev-parse", "--short=12", "HEAD"]);
    let value = match commit {
        Some(c) if !c.is_empty() => c,
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=CUSHIM_GIT_COMMIT={value}");
    // Rerun when the checked-out commit changes: HEAD itself (a checkout), the ref it points
    // to (a commit on the branch) or the packed refs; git resolves where each lives (a
    // worktree has its own HEAD).
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&root, &["rev-parse", "--git-path", path]) {
            rerun_if_exists(&root, &p);
        }
    }
    if let Some(head_ref) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&root, &["rev-parse", "--git-path", &head_ref]) {
            rerun_if_exists(&root, &p);
        }
    }
}

/// `git args` run in `root`: its trimmed stdout, or `None` when git is missing or fails.
fn git(root: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Tell cargo to rerun when `path` (relative to `root` unless absolute) changes, if it exists.
fn rerun_if_exists(root: &str, path: &str) {
    let p = Path::new(path);
    let p = if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(root).join(p)
    };
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
