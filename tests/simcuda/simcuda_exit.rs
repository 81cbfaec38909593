//! simcuda answers from exit handlers as a driver does, and the shim's exit snapshot gets
//! the driver's figures: a program that pushes and pops a context once (its thread-local
//! storage is destroyed before the exit handlers run) exits under the shim with a snapshot
//! that holds the driver's memory figures and the cache's allocations.
use crate::common;

#[test]
fn the_exit_snapshot_has_the_drivers_figures_after_a_context_push_and_pop() {
    let exe = common::compile("exit_ctx", &["-lcuda", "-ldl"]);
    let dir = common::scratch("exit-ctx");
    let (snap, report) = (dir.join("snap.json"), dir.join("report.json"));
    let out = common::run(
        common::shim_cmd(&exe)
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("SIMCUDA_REPORT", &report),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("internal error"), "{stderr}");
    let v = common::load_snapshot(&snap);
    // The shim served the program: its cache holds the allocations.
    let segments = v["segments"].as_array().expect("segments");
    assert!(
        !segments.is_empty(),
        "the cache served the allocations: {v}"
    );
    let m = &v["cushim"]["memory"][0];
    let report = common::read_report(&report);
    assert!(
        m["driver_used"].is_u64(),
        "the driver was asked at exit: {m}"
    );
    assert_eq!(
        m["driver_used"], report["devices"][0]["bytes_in_use"],
        "the driver's own figure: {m}"
    );
    assert_eq!(
        m["driver_used"].as_u64(),
        common::kv(&stdout)["used"].parse::<u64>().ok(),
        "{stdout}"
    );
}
