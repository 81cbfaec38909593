//! The mutation check's machinery: a do-nothing library in the shim's place, and the suite's
//! shim tests run against it.
//!
//! Policy: every test that preloads the shim must fail when the preloaded library does
//! nothing (`tests/c/stand_in_shim.c`, put in place by `CUSHIM_TEST_SHIM`), because a test
//! that passes either way cannot tell whether the shim served the call. The only tests
//! allowed to pass are those whose point is the shim's absence or a pure pass-through, named
//! so (a word of [`ABSENCE_WORDS`] in the name), and the few listed in [`EXEMPT`], each with
//! its reason. The test executables are the ones cargo built for this profile (asked of
//! cargo with `--no-run`, which builds nothing when they are current), each run once with
//! its shim tests selected by `--exact`, the inner runs under `CUSHIM_REQUIRE_ALL=1` so that a
//! test unable to run counts as what it is (not proven) rather than as a pass.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The test modules (one per file of a test folder) whose tests run programs with the shim
/// preloaded.
pub const SHIM_TARGETS: &[&str] = &[
    "analyze_export",
    "cli_help",
    "cli_signals",
    "cudarc_client",
    "driver_api",
    "driver_dlsym",
    "driver_static",
    "memory_viz_compat",
    "numba_cuda",
    "shim_address_queries",
    "shim_alloc",
    "shim_cache_cap",
    "shim_capture",
    "shim_cuda13",
    "shim_driver_entry",
    "shim_end",
    "shim_end_python",
    "shim_expandable",
    "shim_failopen",
    "shim_fork",
    "shim_ipc",
    "shim_ipc_expandable",
    "shim_ipc_private",
    "shim_log",
    "shim_no_runtime_start",
    "shim_nvtx",
    "shim_observe",
    "shim_peer",
    "shim_ptsz_alloc",
    "shim_python",
    "shim_release_faults",
    "shim_runtime_dlsym",
    "shim_snapshot",
    "shim_special_files",
    "shim_stacked",
    "shim_streams",
    "shim_stress",
    "shim_sleep",
    "shim_threads",
    "simcuda_clients",
    "simcuda_exit",
    "smoke_build",
    "trace_dlclose",
];

/// Tests in [`SHIM_TARGETS`] that may pass against the stand-in although their names do not
/// say so, each with the reason.
pub const EXEMPT: &[(&str, &str)] = &[
    (
        "shim_end::crashes_and_underscore_exit_keep_their_status_under_the_shim",
        "checks that SIGSEGV, SIGABRT and _exit keep their status: the shim writes no snapshot on those ends, so nothing but the status can be compared (the log's crash flush, tests/shim/shim_log.rs, shows the shim ran there)",
    ),
    (
        "cli_signals::run_forwards_each_ending_signal_to_the_program_and_ends_with_it",
        "runs the program through cushim run, which preloads the shim it finds itself (not CUSHIM_TEST_SHIM)",
    ),
    (
        "cli_signals::run_forwards_the_dump_signal",
        "runs the program through cushim run, which preloads the shim it finds itself (not CUSHIM_TEST_SHIM)",
    ),
    (
        "cli_signals::dump_of_the_run_wrappers_pid_reaches_its_program",
        "runs the program through cushim run, which preloads the shim it finds itself (not CUSHIM_TEST_SHIM)",
    ),
    (
        "cli_signals::run_exits_with_the_programs_exit_code",
        "runs the program through cushim run, which preloads the shim it finds itself (not CUSHIM_TEST_SHIM)",
    ),
    (
        "cli_signals::dump_refuses_a_process_without_the_shim_and_leaves_it_running",
        "its point is a process without the shim (sleep)",
    ),
    (
        "cli_help::every_help_line_fits_in_100_columns_and_every_positional_is_described",
        "checks the command line's help text, runs no program under the shim",
    ),
    (
        "cli_help::convert_refuses_an_extension_that_names_no_format_and_names_the_format_it_wrote",
        "checks cushim convert on a file, runs no program under the shim",
    ),
    (
        "cli_help::cushim_lib_names_the_shim_to_preload_and_a_wrong_one_is_an_error",
        "checks where the cushim command finds a library named by CUSHIM_LIB, runs no program",
    ),
    (
        "smoke_build::shim_and_simcuda_build_and_lay_out_as_cuda_libraries",
        "checks the build's files, runs no program",
    ),
    (
        "shim_cuda13::a_program_linked_against_cuda_13_records_versioned_references",
        "checks the CUDA 13 build's symbol versions and runs it on simcuda without the shim",
    ),
    (
        "shim_cuda13::the_cuda_13_install_reports_cuda_13_and_the_12_install_12_9",
        "checks simcuda's CUDA 13 install, runs nothing under the shim",
    ),
    (
        "simcuda_clients::devices_have_distinct_stable_uuids",
        "a simcuda test: runs without the shim",
    ),
    (
        "simcuda_clients::every_device_attribute_of_cuda_12_9_is_answered",
        "a simcuda test: runs without the shim",
    ),
    (
        "simcuda_clients::an_async_copy_from_pageable_memory_has_consumed_its_source_on_return",
        "a simcuda test: runs without the shim",
    ),
    (
        "simcuda_clients::an_async_copy_into_pageable_memory_is_complete_on_return_and_pinned_stays_async",
        "a simcuda test: runs without the shim",
    ),
    (
        "simcuda_clients::unified_addressing_copies_find_each_sides_kind",
        "a simcuda test: runs without the shim",
    ),
    (
        "driver_static::a_static_build_links_no_cuda_library",
        "checks the static build with ldd, runs no program",
    ),
    (
        "shim_observe::cushim_run_observe_sets_the_observing_mode",
        "launched by `cushim run`, which preloads the built libcushim.so itself, not the switch's library",
    ),
    (
        "shim_nvtx::cushim_run_points_nvtx_at_the_shim_and_keeps_the_users_injection",
        "launched by `cushim run`, which preloads the built libcushim.so itself, not the switch's library",
    ),
];

/// The words that name a test for the shim's absence or a pure pass-through.
pub const ABSENCE_WORDS: &[&str] = &[
    "without_shim",
    "without_the_shim",
    "passes_through",
    "passed_through",
    "pure_pass_through",
];

/// Whether a test (`target::name`) may pass against the stand-in: its name says the shim is
/// absent or passes the call through, or it is in [`EXEMPT`].
pub fn may_pass_without_the_shim(full_name: &str) -> bool {
    ABSENCE_WORDS.iter().any(|w| full_name.contains(w))
        || EXEMPT.iter().any(|(n, _)| *n == full_name)
}

/// The do-nothing library, compiled once per test process from `tests/c/stand_in_shim.c`.
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let src = super::artifacts::source_root().join("tests/c/stand_in_shim.c");
        super::test_program("libstand_in_shim.so", &[], |out| {
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
            let o = Command::new(&cc)
                .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
                .arg(out)
                .arg(&src)
                .output()?;
            if o.status.success() {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "{cc} failed on {}:\n{}",
                    src.display(),
                    String::from_utf8_lossy(&o.stderr)
                )))
            }
        })
    })
}

/// The test binaries of the suite: one per folder of `tests/` that has a `main.rs`, each
/// holding a module per test file.
pub fn test_groups() -> Vec<String> {
    let dir = super::artifacts::source_root().join("tests");
    let mut groups: Vec<String> = std::fs::read_dir(&dir)
        .expect("listing tests/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("main.rs").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    groups.sort();
    groups
}

/// The module files of the suite: (module name, the test binary it is in).
pub fn test_modules() -> Vec<(String, String)> {
    let dir = super::artifacts::source_root().join("tests");
    let mut out = Vec::new();
    for group in test_groups() {
        for entry in std::fs::read_dir(dir.join(&group)).expect("listing a test folder") {
            let path = entry.expect("reading a test folder").path();
            let Some(module) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".rs"))
            else {
                continue;
            };
            if module != "main" {
                out.push((module.to_string(), group.clone()));
            }
        }
    }
    out.sort();
    out
}

/// The executable of the test binary holding each of `modules`, by module name, as cargo
/// built it for this test binary's profile.
pub fn test_executables(modules: &[&str]) -> BTreeMap<String, PathBuf> {
    let placed = test_modules();
    let groups: Vec<&str> = placed
        .iter()
        .filter(|(m, _)| modules.contains(&m.as_str()))
        .map(|(_, g)| g.as_str())
        .collect();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(super::artifacts::source_root()).args([
        "test",
        "--no-run",
        "--message-format=json",
        "-p",
        "cushim",
    ]);
    if super::build_dir()
        .file_name()
        .is_some_and(|n| n == "release")
    {
        cmd.arg("--release");
    }
    for g in &groups {
        cmd.args(["--test", g]);
    }
    let out = cmd.output().expect("running cargo test --no-run");
    assert!(
        out.status.success(),
        "cargo test --no-run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut exes = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str())
        else {
            continue;
        };
        if msg["target"]["kind"][0] == "test" {
            exes.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    placed
        .into_iter()
        .filter(|(m, _)| modules.contains(&m.as_str()))
        .filter_map(|(m, g)| exes.get(&g).map(|e| (m, e.clone())))
        .collect()
}

/// The names of the tests in a test executable (`--list`), ignored ones left out.
pub fn list_tests(exe: &Path) -> Vec<String> {
    let listed = |extra: &[&str]| -> Vec<String> {
        let out = Command::new(exe)
            .args(["--list", "--format=terse"])
            .args(extra)
            .output()
            .expect("listing a test executable's tests");
        assert!(out.status.success(), "{} --list: {out:?}", exe.display());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_string)
            .collect()
    };
    let ignored = listed(&["--ignored"]);
    listed(&[])
        .into_iter()
        .filter(|t| !ignored.contains(t))
        .collect()
}

/// How one test ended in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
}

/// Run `tests` of `exe` with the stand-in in the shim's place; each test's outcome, by name.
/// A test the runner never reported (the run died) is missing from the map.
pub fn run_against_stand_in(exe: &Path, tests: &[String]) -> (BTreeMap<String, Outcome>, String) {
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "--color=never"])
        .args(tests)
        .env(super::STAND_IN_VAR, library())
        .env(super::skip::REQUIRE_ALL_VAR, "1")
        .env_remove("RUST_TEST_NOCAPTURE");
    let out = cmd.output().expect("running a test executable");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut outcomes = BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        if let Some(name) = rest.strip_suffix(" ... ok") {
            outcomes.insert(name.to_string(), Outcome::Passed);
        } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
            outcomes.insert(name.to_string(), Outcome::Failed);
        }
    }
    (outcomes, stdout)
}
