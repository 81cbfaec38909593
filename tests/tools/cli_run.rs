//! `cushim run` tells the truth: shell exit codes for programs that cannot start, one line
//! when it falls back to simcuda, and unwritable snapshot directories named at start.
use crate::common;

use std::process::Command;

fn cushim_run() -> Command {
    let mut c = Command::new(common::cushim_bin());
    c.arg("run");
    c
}

#[test]
fn a_missing_program_exits_127_and_an_unexecutable_one_126() {
    let missing = common::run(cushim_run().args(["--sim", "--", "/nonexistent/no-such-program"]));
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    let dir = common::scratch("cli-run-126");
    let file = dir.join("not-executable");
    std::fs::write(&file, "plain text\n").expect("writing a plain file");
    let plain = common::run(cushim_run().args(["--sim", "--"]).arg(&file));
    assert_eq!(plain.status.code(), Some(126), "{plain:?}");
    let directory = common::run(cushim_run().args(["--sim", "--"]).arg(&dir));
    assert_eq!(directory.status.code(), Some(126), "{directory:?}");
}

#[test]
fn an_unwritable_snapshot_directory_is_named_at_start_and_the_program_still_runs() {
    let out = common::run(
        cushim_run()
            .args([
                "--sim",
                "--snapshot",
                "/nonexistent/cushim-dir/snap.pickle",
                "--",
            ])
            .args(["sh", "-c", "echo started >&2; exit 3"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let warn = stderr
        .find("cannot write in /nonexistent/cushim-dir")
        .expect("the warning");
    let started = stderr.find("started").expect("the program ran");
    assert!(
        warn < started,
        "warned before the program started: {stderr}"
    );
    // So is the log's, given as an option.
    let out = common::run(
        cushim_run()
            .args(["--sim", "--log", "/nonexistent/cushim-logdir/run.log", "--"])
            .args(["sh", "-c", "echo started >&2"]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warn = stderr
        .find("CUSHIM_LOG=/nonexistent/cushim-logdir/run.log: cannot write in")
        .expect("the log directory's warning");
    assert!(
        warn < stderr.find("started").expect("the program ran"),
        "{stderr}"
    );
    // A writable directory draws no warning.
    let dir = common::scratch("cli-run-snapdir");
    let ok = common::run(
        cushim_run()
            .args(["--sim", "--snapshot"])
            .arg(dir.join("snap.pickle"))
            .args(["--", "true"]),
    );
    assert!(ok.status.success());
    assert!(
        !String::from_utf8_lossy(&ok.stderr).contains("cannot write"),
        "{ok:?}"
    );
}

#[test]
fn running_without_a_driver_says_it_uses_simcuda() {
    let mut c = cushim_run();
    c.env_remove("LD_LIBRARY_PATH").args(["--", "true"]);
    let out = common::run(&mut c);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // SAFETY: dlopen/dlclose of a library name; the handle is closed at once.
    let driver = unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    };
    assert_eq!(
        stderr.matches("running on simcuda").count(),
        usize::from(!driver),
        "one line exactly when no driver is installed: {stderr}"
    );
}
