//! Which build this is: the package version and the git commit it was built from (set by the
//! root `build.rs`; `unknown` when built without git, e.g. from a tarball). Shown by
//! `cushim --version` and written in every snapshot's `cushim` section.

/// The package version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit of the source tree (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("CUSHIM_GIT_COMMIT");

/// `VERSION (commit COMMIT)`, for `--version`.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CUSHIM_GIT_COMMIT"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_is_a_short_hash_or_unknown() {
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT}"
        );
        assert_eq!(LONG, format!("{VERSION} (commit {COMMIT})"));
    }
}
