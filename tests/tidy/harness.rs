//! The test harness's own rules: a scratch directory belongs to exactly one test.

use crate::common;
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    common::scratch_in(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("harness"),
        name,
    )
}

#[test]
fn a_scratch_directory_belongs_to_one_test_and_a_repeated_name_fails() {
    let first = scratch("twice");
    assert!(first.is_dir());
    std::fs::write(first.join("mine"), b"kept").expect("writing into the scratch directory");
    // Another test (another thread, named as libtest names it) asking for the same name
    // gets a directory of its own and leaves this one's files alone.
    let other = std::thread::Builder::new()
        .name("smoke_build::another_test".into())
        .spawn(|| scratch("twice"))
        .expect("spawning a second test thread")
        .join()
        .expect("the second test's scratch");
    assert_ne!(first, other);
    assert_eq!(
        std::fs::read(first.join("mine")).expect("the first test's file"),
        b"kept"
    );
    // The same test asking for the same name again is refused loudly.
    let again = std::panic::catch_unwind(|| scratch("twice"));
    assert!(again.is_err(), "a repeated scratch name was handed out");
}
