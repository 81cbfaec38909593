//! Every way for a program to end under the shim: the exit snapshot is written on SIGTERM,
//! SIGINT, SIGHUP and SIGQUIT as at a normal exit, the program's own handlers (installed
//! before or after the shim) still decide, and the exit status is what it is without the
//! shim. Dump requests made just before the end are all served.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output};

const HISTORY: &str = "enabled=all,stacks=none";

fn prog() -> PathBuf {
    common::compile("shim_end", &[])
}

fn run_case(sig: i32, case: &str, shim: bool, dir: &Path) -> Output {
    let mut cmd = common::cmd(&prog(), shim);
    cmd.arg(sig.to_string())
        .arg(case)
        .env("CUSHIM_SNAPSHOT", dir.join("snap-%n.pickle"))
        .env("CUSHIM_HISTORY", HISTORY);
    common::run(common::default_signals_no_core(&mut cmd))
}

fn describe(s: ExitStatus) -> (Option<i32>, Option<i32>) {
    (s.code(), s.signal())
}

/// Live bytes in a snapshot's segments.
fn live_bytes(path: &Path) -> u64 {
    let v = common::load_snapshot(path);
    v["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| s["allocated_size"].as_u64().unwrap_or(0))
        .sum()
}

fn snapshots(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("reading the scratch directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    v.sort();
    v
}

/// Run `case` with and without the shim; the statuses must match `want`, and the shim's run
/// must leave exactly one snapshot holding `live` bytes.
fn check(sig: i32, case: &str, want: (Option<i32>, Option<i32>), live: u64) -> String {
    let name = format!("end-{sig}-{case}");
    let plain = run_case(sig, case, false, &common::scratch(&format!("{name}-plain")));
    assert_eq!(
        describe(plain.status),
        want,
        "{case} {sig} without the shim"
    );
    let dir = common::scratch(&name);
    let out = run_case(sig, case, true, &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        describe(out.status),
        want,
        "{case} {sig} under the shim: stderr: {stderr}"
    );
    let files = snapshots(&dir);
    assert_eq!(
        files.len(),
        1,
        "{case} {sig}: one exit snapshot: {files:?}; stderr: {stderr}"
    );
    assert_eq!(
        live_bytes(&files[0]),
        live,
        "{case} {sig}: the snapshot holds the program's live blocks up to the end"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const ENDING: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

#[test]
fn an_ending_signal_with_the_default_action_writes_the_snapshot_and_ends_with_that_signal() {
    for sig in ENDING {
        check(sig, "default", (None, Some(sig)), 13 << 20);
    }
}

#[test]
fn a_program_handler_installed_before_the_shim_runs_and_keeps_the_program_running() {
    for sig in ENDING {
        let out = check(sig, "flag_before", (Some(0), None), 16 << 20);
        assert!(out.contains("handled"), "{out}");
    }
}

#[test]
fn a_program_handler_installed_after_the_shim_runs_and_sigaction_reports_it() {
    for sig in ENDING {
        let out = check(sig, "flag_after", (Some(0), None), 16 << 20);
        assert!(out.contains("handled"), "{out}");
    }
}

#[test]
fn a_program_handler_that_restores_the_default_and_raises_again_ends_with_the_signal() {
    for sig in ENDING {
        let out = check(sig, "reraise", (None, Some(sig)), 13 << 20);
        assert!(out.contains("cleanup"), "{out}");
    }
}

#[test]
fn a_program_handler_that_calls_exit_keeps_its_status_and_the_snapshot_is_written() {
    for sig in ENDING {
        check(sig, "exit_handler", (Some(3), None), 13 << 20);
    }
}

#[test]
fn an_ignored_ending_signal_stays_ignored() {
    for sig in ENDING {
        let out = check(sig, "ignore", (Some(0), None), 16 << 20);
        assert!(out.contains("ignored"), "{out}");
    }
}

#[test]
fn two_dump_signals_just_before_exit_give_three_snapshots() {
    let dir = common::scratch("end-dump2");
    let out = run_case(libc::SIGUSR1, "dump2", true, &dir);
    assert!(out.status.success(), "{out:?}");
    let files = snapshots(&dir);
    assert_eq!(files.len(), 3, "two live dumps and the exit one: {files:?}");
    for f in &files {
        assert_eq!(live_bytes(f), 13 << 20, "{}", f.display());
    }
}

#[test]
fn crashes_and_underscore_exit_keep_their_status_under_the_shim() {
    for (case, want) in [
        ("segv", (None, Some(libc::SIGSEGV))),
        ("abort", (None, Some(libc::SIGABRT))),
        ("_exit", (Some(4), None)),
    ] {
        for shim in [false, true] {
            let dir = common::scratch(&format!("end-{case}-{shim}"));
            let out = run_case(libc::SIGTERM, case, shim, &dir);
            assert_eq!(describe(out.status), want, "{case} shim={shim}");
        }
    }
}
