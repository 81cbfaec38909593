//! `cushim run` passes signals on to the program and ends as it did; `cushim dump` signals
//! only processes that loaded the shim, with their own dump signal.

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn prog() -> PathBuf {
    common::compile("shim_end", &[])
}

/// Start `cmd` and wait until the program prints "ready" (its allocations made, the shim's
/// signal handling armed).
fn start_ready(cmd: &mut Command) -> common::Killed {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the program");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("reading the program's first line");
    let child = common::Killed(child);
    assert_eq!(line.trim(), "ready", "the program's first line");
    child
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(pid as i32, sig) },
        0,
        "kill {pid} {sig}"
    );
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

/// Poll until `dir` holds `n` snapshots (a dump's file appears by an atomic rename).
fn wait_for_files(dir: &Path, n: usize) {
    for _ in 0..12_000 {
        if snapshots(dir).len() >= n {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{n} snapshots never appeared in {}", dir.display());
}

fn live_bytes(path: &Path) -> u64 {
    let v = common::load_snapshot(path);
    v["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| s["allocated_size"].as_u64().unwrap_or(0))
        .sum()
}

fn wrapped(dir: &Path) -> Command {
    let mut cmd = Command::new(common::cushim_bin());
    cmd.env_remove("CUSHIM_DUMP_SIGNAL")
        .env("CUSHIM_HISTORY", "enabled=all,stacks=none")
        .arg("run")
        .arg("--sim")
        .arg("--snapshot")
        .arg(dir.join("snap-%n.pickle"))
        .arg(prog())
        .arg("0")
        .arg("wait");
    common::default_signals_no_core(&mut cmd);
    cmd
}

#[test]
fn run_forwards_each_ending_signal_to_the_program_and_ends_with_it() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
        let dir = common::scratch(&format!("cli-forward-{sig}"));
        let mut child = start_ready(&mut wrapped(&dir));
        kill(child.id(), sig);
        let status = child.wait().expect("waiting for cushim run");
        assert_eq!(status.signal(), Some(sig), "{status}");
        let files = snapshots(&dir);
        assert_eq!(files.len(), 1, "the program's exit snapshot: {files:?}");
        assert_eq!(live_bytes(&files[0]), 13 << 20);
    }
}

#[test]
fn run_forwards_the_dump_signal() {
    let dir = common::scratch("cli-forward-usr1");
    let mut child = start_ready(&mut wrapped(&dir));
    kill(child.id(), libc::SIGUSR1);
    wait_for_files(&dir, 1);
    kill(child.id(), libc::SIGTERM);
    let status = child.wait().expect("waiting for cushim run");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert_eq!(
        snapshots(&dir).len(),
        2,
        "the live dump and the exit snapshot"
    );
}

#[test]
fn dump_of_the_run_wrappers_pid_reaches_its_program() {
    let dir = common::scratch("cli-dump-wrapper");
    let mut child = start_ready(&mut wrapped(&dir));
    let out = Command::new(common::cushim_bin())
        .env_remove("CUSHIM_DUMP_SIGNAL")
        .arg("dump")
        .arg(child.id().to_string())
        .output()
        .expect("running cushim dump");
    assert!(out.status.success(), "{out:?}");
    wait_for_files(&dir, 1);
    kill(child.id(), libc::SIGTERM);
    let status = child.wait().expect("waiting for cushim run");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert_eq!(
        snapshots(&dir).len(),
        2,
        "the live dump and the exit snapshot"
    );
}

#[test]
fn run_exits_with_the_programs_exit_code() {
    let dir = common::scratch("cli-forward-code");
    let status = Command::new(common::cushim_bin())
        .args(["run", "--sim"])
        .arg(prog())
        .args(["0", "_exit"])
        .env("CUSHIM_SNAPSHOT", dir.join("s.pickle"))
        .status()
        .expect("running cushim run");
    assert_eq!(status.code(), Some(4));
}

#[test]
fn dump_refuses_a_process_without_the_shim_and_leaves_it_running() {
    let mut sleeper = Command::new("sleep")
        .arg("100")
        .spawn()
        .expect("starting sleep");
    let out = Command::new(common::cushim_bin())
        .arg("dump")
        .arg(sleeper.id().to_string())
        .output()
        .expect("running cushim dump");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("has not loaded libcushim.so"), "{stderr}");
    assert!(
        sleeper.try_wait().expect("polling sleep").is_none(),
        "sleep is still running"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn dump_sends_the_processs_own_dump_signal_and_takes_signal_names() {
    let dir = common::scratch("cli-dump-usr2");
    let mut cmd = common::shim_cmd(&prog());
    cmd.args(["0", "wait"])
        .env("CUSHIM_SNAPSHOT", dir.join("snap-%n.pickle"))
        .env("CUSHIM_HISTORY", "enabled=all,stacks=none")
        .env("CUSHIM_DUMP_SIGNAL", "USR2");
    let mut child = start_ready(&mut cmd);
    let pid = child.id().to_string();
    let dumps = [
        vec!["dump", pid.as_str()],
        vec!["dump", "--signal", "SIGUSR2", &pid],
    ];
    for (n, args) in dumps.iter().enumerate() {
        let out = Command::new(common::cushim_bin())
            .env_remove("CUSHIM_DUMP_SIGNAL")
            .args(args)
            .output()
            .expect("running cushim dump");
        assert!(out.status.success(), "{args:?}: {out:?}");
        // Standard signals do not queue: wait for this dump's file before the next signal.
        wait_for_files(&dir, n + 1);
    }
    kill(child.id(), libc::SIGTERM);
    let status = child.wait().expect("waiting for the program");
    // USR1 (not the program's dump signal) would have ended it with SIGUSR1.
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert_eq!(
        snapshots(&dir).len(),
        3,
        "two live dumps and the exit snapshot"
    );
}
