//! Memory given back while the driver fails: with expandable segments, a
//! `cuMemRelease` or `cuMemUnmap` that fails at any position of a workload leaves nothing
//! held once the fault stops: after one `cushim_empty_cache()` the device has 0 bytes in use
//! and 0 live physical handles, and the failure is reported on one stderr line. A fault that
//! repeats every second call (`every:2`) is retried within the same release.
use crate::common;

const CONF: &str = "expandable_segments:True";

struct Run {
    used_final: i64,
    handles: u64,
    stderr: String,
    calls: u64,
}

fn run(exe: &std::path::Path, fail: Option<&str>, name: &str) -> Run {
    let dir = common::scratch(name);
    let report = dir.join("report.json");
    let mut cmd = common::shim_cmd(exe);
    cmd.env("CUSHIM_ALLOC_CONF", CONF)
        .env("SIMCUDA_REPORT", &report);
    if let Some(f) = fail {
        cmd.env("SIMCUDA_FAIL", f);
    }
    let out = common::run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{fail:?}: {stdout}\n{stderr}");
    let kv = common::kv(&stdout);
    let r = common::read_report(&report);
    let handles = r["devices"][0]["live_physical_handles"]
        .as_u64()
        .expect("live handles in the report");
    let api = fail
        .and_then(|f| f.split('@').next())
        .unwrap_or("cuMemRelease");
    Run {
        used_final: common::num(&kv, "used_final"),
        handles,
        stderr,
        calls: r["calls"][api].as_u64().unwrap_or(0),
    }
}

fn sweep(api: &str) {
    let exe = common::compile("shim_release_faults", &[]);
    let clean = run(&exe, None, &format!("relfault-{api}-clean"));
    assert_eq!((clean.used_final, clean.handles), (0, 0));
    let n = run(
        &exe,
        Some(&format!("{api}@1000000")),
        &format!("relfault-{api}-count"),
    )
    .calls;
    assert!(n >= 3, "{api} called {n} times");
    for k in 1..=n {
        let r = run(
            &exe,
            Some(&format!("{api}@{k}")),
            &format!("relfault-{api}-{k}"),
        );
        assert_eq!(
            (r.used_final, r.handles),
            (0, 0),
            "{api}@{k}: bytes and handles left\n{}",
            r.stderr
        );
        let lines: Vec<&str> = r.stderr.lines().filter(|l| l.contains(api)).collect();
        assert_eq!(lines.len(), 1, "{api}@{k}: one line:\n{}", r.stderr);
    }
    let r = run(
        &exe,
        Some(&format!("{api}@every:2")),
        &format!("relfault-{api}-every2"),
    );
    assert_eq!(
        (r.used_final, r.handles),
        (0, 0),
        "{api}@every:2\n{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().filter(|l| l.contains(api)).count(), 1);
}

#[test]
fn a_failed_release_at_any_position_is_retried_and_leaves_nothing_after_one_empty_cache() {
    sweep("cuMemRelease");
}

#[test]
fn a_failed_unmap_at_any_position_is_retried_and_leaves_nothing_after_one_empty_cache() {
    sweep("cuMemUnmap");
}
