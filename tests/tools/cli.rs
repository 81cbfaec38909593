//! The `cushim` command as the README uses it: `demo`, `run`, `summary`, `dump`.
use crate::common;

use std::process::Command;

/// `cushim demo` replaces its own log run after run, as it replaces its snapshot (a log
/// the user names with `CUSHIM_LOG` or `--log` keeps its previous file instead).
#[test]
fn demo_run_twice_replaces_its_own_log_and_keeps_no_numbered_copy() {
    let dir = common::scratch("cli-demo-twice");
    let snap = dir.join("demo.pickle");
    for _ in 0..2 {
        let out = common::run(
            Command::new(common::cushim_bin())
                .args(["demo", "--steps", "2", "--snapshot"])
                .arg(&snap),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("kept as"), "{stderr}");
    }
    let log = dir.join("demo.log");
    let bytes = std::fs::read(&log).expect("the demo's log");
    assert!(cushim_tools::snapshot::log_reader::is_log(&bytes));
    assert!(!dir.join("demo.log.1").exists());
}

#[test]
fn demo_runs_the_workload_with_and_without_the_shim_and_reports_the_cache() {
    let dir = common::scratch("cli-demo");
    let snap = dir.join("demo.pickle");
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["demo", "--steps", "20", "--snapshot"])
            .arg(&snap),
    );
    assert!(out.contains("demo: ok: 20 steps"), "{out}");
    let line = |key: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no '{key}' line in {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let calls = line("device allocation calls");
    let without: u64 = calls[calls.len() - 2].parse().expect("number");
    let with: u64 = calls[calls.len() - 1].parse().expect("number");
    assert!(
        without > 500,
        "every cudaMalloc reaches the device without the shim: {without}"
    );
    // Not a race: the demo uses streams, so its frees wait for events, and whether a batch
    // has completed when the next malloc polls it depends on simcuda's workers. But every
    // step ends with stream synchronizations that pass the batch recorded at its first
    // malloc, so a block freed in step k is reusable in step k+2 whatever the timing: with
    // each simcuda worker held 2 ms or 10 ms before every item (workers always late), the
    // demo made 52 device allocations (45-50 with three busy loops running), against 532.
    assert!(
        with * 5 < without,
        "the cache saves most device allocations: {with} vs {without}"
    );
    assert!(out.contains("the cache:"), "{out}");
    assert!(snap.exists(), "the demo writes its snapshot");
    let summary = common::run_ok(Command::new(common::cushim_bin()).arg("summary").arg(&snap));
    assert!(summary.contains("device 0"), "{summary}");
}

#[test]
fn run_preloads_the_shim_sets_the_snapshot_and_returns_the_programs_exit_code() {
    let dir = common::scratch("cli-run");
    let snap = dir.join("run.pickle");
    let exe = common::compile("shim_frag", &[]);
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["run", "--sim", "--expandable", "--snapshot"])
            .arg(&snap)
            .arg("--")
            .arg(&exe)
            .arg("forward"),
    );
    assert!(
        out.contains(&format!("used_after={}", 128u64 << 20)),
        "{out}"
    );
    assert!(snap.exists());
    let failing = Command::new(common::cushim_bin())
        .args(["run", "--sim", "--", "sh", "-c", "exit 7"])
        .status()
        .expect("running cushim");
    assert_eq!(failing.code(), Some(7));
}

#[test]
fn version_names_the_release_and_the_commit_it_was_built_from() {
    let out = common::run_ok(Command::new(common::cushim_bin()).arg("--version"));
    assert_eq!(
        out.lines().next().unwrap_or(""),
        format!("cushim {}", cushim::version::LONG),
        "{out}"
    );
}

/// A reader that closes the pipe before `cushim` writes (`cushim summary F | head`) ends it
/// as it ends any Unix filter, by SIGPIPE, with nothing on stderr: never a panic.
#[test]
fn output_to_a_closed_pipe_ends_quietly_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().expect("a pipe");
    // The read end closed before the child starts: its first write meets a broken pipe.
    drop(reader);
    let out = Command::new(common::cushim_bin())
        .arg("summary")
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/real/cs336-assignment2-memory_snapshot.pickle.gz"),
        )
        .stdout(writer)
        .output()
        .expect("cushim runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{stderr}");
}
