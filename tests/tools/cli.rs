//! The `cushim` command as the README uses it: `demo`, `run`, `summary`, `dump`.
use crate::common;

use std::process::Command;

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
