//! Ending signals in a Python program under the shim: Python's own SIGINT handler (installed
//! before the shim starts) still turns Ctrl-C into KeyboardInterrupt, and SIGTERM still ends
//! the interpreter with its signal, each after writing the snapshot.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

fn live_bytes(path: &Path) -> u64 {
    let v = common::load_snapshot(path);
    v["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| s["allocated_size"].as_u64().unwrap_or(0))
        .sum()
}

fn run(case: &str) -> (std::process::Output, std::path::PathBuf) {
    let dir = common::scratch(&format!("py-end-{case}"));
    let snap = dir.join("snap.pickle");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/end_signals.py");
    let mut cmd = common::shim_cmd(Path::new("python3"));
    cmd.arg(script)
        .arg(case)
        .env("CUSHIM_SNAPSHOT", &snap)
        .env("CUSHIM_HISTORY", "enabled=all,stacks=none");
    let out = common::run(common::default_signals_no_core(&mut cmd));
    (out, snap)
}

#[test]
fn python_keeps_its_keyboard_interrupt_and_the_exit_snapshot_is_written() {
    let (out, snap) = run("int");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("interrupted"));
    assert_eq!(live_bytes(&snap), 6 << 20);
}

#[test]
fn sigterm_ends_python_with_its_signal_after_the_snapshot() {
    let (out, snap) = run("term");
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:?}");
    assert_eq!(live_bytes(&snap), 4 << 20);
}
