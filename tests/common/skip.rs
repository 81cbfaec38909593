//! Skips that CI sees: a test that cannot run here says so on the real standard error (the
//! test runner captures `println!`/`eprintln!` and shows them only for failing tests, so a
//! skip printed that way passes unseen), and `CUSHIM_REQUIRE_ALL=1` (set by `.ci/run`) turns
//! every skip into a failure, so CI never passes with a check left out.
#![allow(dead_code)]

use std::io::Write;

/// The variable that turns every skip into a failure.
pub const REQUIRE_ALL_VAR: &str = "CUSHIM_REQUIRE_ALL";

/// Whether `CUSHIM_REQUIRE_ALL` is set (to anything but `0` or empty).
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL_VAR).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Record that the check `what` cannot run here because of `reason`: fails the test under
/// `CUSHIM_REQUIRE_ALL=1`, else writes one `SKIPPED:` line past the runner's capture. The
/// caller returns (or leaves out the part) after this.
pub fn skip(what: &str, reason: &str) {
    assert!(
        !require_all(),
        "{what} cannot run: {reason} ({REQUIRE_ALL_VAR}=1 makes a skip a failure)"
    );
    // Straight to the process's standard error, not through the captured eprintln!.
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED: {what}: {reason}");
}
