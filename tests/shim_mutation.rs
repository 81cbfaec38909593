//! The mutation check: with a library that does nothing in the shim's place, every shim test
//! fails, except those whose point is the shim's absence (see `tests/common/stand_in.rs` for
//! the policy and the named exceptions). A shim test that passes here proves nothing about
//! the shim.

mod common;

use common::stand_in::{self, Outcome};

/// What one test executable showed against the stand-in.
#[derive(Default)]
struct Seen {
    /// Every test it lists (`target::name`).
    all: Vec<String>,
    /// How many of them had to fail.
    checked: usize,
    passed: Vec<String>,
    unreported: Vec<String>,
}

fn check(target: &str, exe: &std::path::Path) -> Seen {
    // The binary holds other modules too: this module's tests are `target::name`.
    let prefix = format!("{target}::");
    let listed: Vec<String> = stand_in::list_tests(exe)
        .into_iter()
        .filter(|t| t.starts_with(&prefix))
        .collect();
    let mut seen = Seen {
        all: listed.clone(),
        ..Seen::default()
    };
    let tests: Vec<String> = listed
        .into_iter()
        .filter(|t| !stand_in::may_pass_without_the_shim(t))
        .collect();
    if tests.is_empty() {
        return seen;
    }
    seen.checked = tests.len();
    let (outcomes, stdout) = stand_in::run_against_stand_in(exe, &tests);
    for t in &tests {
        match outcomes.get(t) {
            Some(Outcome::Failed) => {}
            Some(Outcome::Passed) => seen.passed.push(t.clone()),
            None => seen.unreported.push(format!("{t} (run output:\n{stdout})")),
        }
    }
    seen
}

#[test]
fn every_shim_test_fails_with_a_do_nothing_library_in_the_shims_place() {
    let exes = stand_in::test_executables(stand_in::SHIM_TARGETS);
    let missing: Vec<_> = stand_in::SHIM_TARGETS
        .iter()
        .filter(|t| !exes.contains_key(**t))
        .collect();
    assert!(missing.is_empty(), "no executable for {missing:?}");
    // Two executables at a time: the programs spend most of their time waiting (host
    // functions that sleep, child processes), so this halves the check's time even on two
    // cores. The outcome does not depend on the order.
    let queue = std::sync::Mutex::new(exes.iter());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let next = queue.lock().expect("the queue").next();
                let Some((target, exe)) = next else { break };
                let seen = check(target, exe);
                results.lock().expect("the results").push(seen);
            });
        }
    });
    let results = results.into_inner().expect("the results");
    let checked: usize = results.iter().map(|r| r.checked).sum();
    let all: Vec<&String> = results.iter().flat_map(|r| &r.all).collect();
    let mut passed: Vec<&String> = results.iter().flat_map(|r| &r.passed).collect();
    passed.sort();
    let unreported: Vec<&String> = results.iter().flat_map(|r| &r.unreported).collect();
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
    // One line CI shows (past the runner's capture): what the check covered.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "mutation check: {checked} shim tests run against the do-nothing stand-in, {} failed as \
         they must; {} tests excepted (absence, pass-through, or listed)",
        checked - passed.len() - unreported.len(),
        all.len() - checked
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
    for (module, group) in stand_in::test_modules() {
        let path = dir.join(&group).join(format!("{module}.rs"));
        let src = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let preloads = ["shim_cmd(", "common::cmd(", "shim_path()"]
            .iter()
            .any(|p| src.contains(p));
        if preloads && !stand_in::SHIM_TARGETS.contains(&module.as_str()) {
            left_out.push(module);
        }
    }
    assert!(
        left_out.is_empty(),
        "add these to stand_in::SHIM_TARGETS: {left_out:?}"
    );
    assert!(
        stand_in::test_modules().len() > 50,
        "the test folders were not read"
    );
}
