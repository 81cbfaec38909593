//! The mutation check: with a library that does nothing in the shim's place, every shim test
//! fails, except those whose point is the shim's absence (see `tests/common/stand_in.rs` for
//! the policy and the named exceptions). A shim test that passes here proves nothing about
//! the shim.

mod common;

use common::stand_in::{self, Outcome};

#[test]
fn every_shim_test_fails_with_a_do_nothing_library_in_the_shims_place() {
    let exes = stand_in::test_executables(stand_in::SHIM_TARGETS);
    let missing: Vec<_> = stand_in::SHIM_TARGETS
        .iter()
        .filter(|t| !exes.contains_key(**t))
        .collect();
    assert!(missing.is_empty(), "no executable for {missing:?}");
    let mut passed = Vec::new();
    let mut unreported = Vec::new();
    let mut checked = 0;
    let mut all = Vec::new();
    for (target, exe) in &exes {
        let listed = stand_in::list_tests(exe);
        all.extend(listed.iter().map(|t| format!("{target}::{t}")));
        let tests: Vec<String> = listed
            .into_iter()
            .filter(|t| !stand_in::may_pass_without_the_shim(&format!("{target}::{t}")))
            .collect();
        if tests.is_empty() {
            continue;
        }
        checked += tests.len();
        let (outcomes, stdout) = stand_in::run_against_stand_in(exe, &tests);
        for t in &tests {
            match outcomes.get(t) {
                Some(Outcome::Failed) => {}
                Some(Outcome::Passed) => passed.push(format!("{target}::{t}")),
                None => unreported.push(format!("{target}::{t} (run output:\n{stdout})")),
            }
        }
    }
    assert!(checked > 100, "only {checked} shim tests found");
    let stale: Vec<_> = stand_in::EXEMPT
        .iter()
        .filter(|(n, _)| !all.iter().any(|t| t == n))
        .collect();
    assert!(stale.is_empty(), "exceptions naming no test: {stale:?}");
    assert!(
        unreported.is_empty(),
        "tests the runner never reported against the stand-in: {unreported:#?}"
    );
    assert!(
        passed.is_empty(),
        "these tests pass with a do-nothing library in the shim's place, so they cannot tell \
         whether the shim served the call (make them check the shim's work, or name them for \
         the shim's absence): {passed:#?}"
    );
}

/// Every test file that runs a program with the shim preloaded is in the mutation check.
#[test]
fn every_test_file_that_preloads_the_shim_is_in_the_mutation_check() {
    let dir = common::artifacts::source_root().join("tests");
    let mut left_out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("listing tests/") {
        let path = entry.expect("reading tests/").path();
        let Some(target) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".rs"))
        else {
            continue;
        };
        let src = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let preloads = ["shim_cmd(", "common::cmd(", "shim_path()"]
            .iter()
            .any(|p| src.contains(p));
        if preloads && target != "shim_mutation" && !stand_in::SHIM_TARGETS.contains(&target) {
            left_out.push(target.to_string());
        }
    }
    assert!(
        left_out.is_empty(),
        "add these to stand_in::SHIM_TARGETS: {left_out:?}"
    );
}
