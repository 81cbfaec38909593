//! The shim starts neither the CUDA runtime nor a context the program did not start: a
//! driver-API program that loads the runtime library but never calls it makes no runtime
//! call under the shim, and its primary context is referenced by the program (and the
//! shim's engine, which allocates in it) but never retained by the runtime.
use crate::common;

fn run(shim: bool) -> serde_json::Value {
    let exe = common::compile("driver_only", &["-lcuda", "-ldl"]);
    let dir = common::scratch(&format!("no-runtime-start-{shim}"));
    let report = dir.join("report.json");
    let mut cmd = common::cmd(&exe, shim);
    let out = common::run_ok(cmd.env("SIMCUDA_REPORT", &report));
    assert!(out.contains("result=ok"), "{out}");
    common::read_report(&report)
}

fn runtime_calls(report: &serde_json::Value) -> Vec<(String, u64)> {
    report["calls"]
        .as_object()
        .expect("calls")
        .iter()
        .filter(|(k, v)| k.starts_with("cuda") && v.as_u64() != Some(0))
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
        .collect()
}

#[test]
fn a_driver_only_program_that_loads_the_runtime_makes_no_runtime_call_under_the_shim() {
    let bare = run(false);
    assert_eq!(runtime_calls(&bare), vec![], "{bare}");
    let shim = run(true);
    assert_eq!(runtime_calls(&shim), vec![], "{shim}");
    let dev = &shim["devices"][0];
    assert_eq!(dev["runtime_started"], false, "{dev}");
    // The shim served the program's allocations from its cache: fewer device allocations.
    let allocs = |r: &serde_json::Value| r["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0);
    assert_eq!(allocs(&bare), 12);
    assert!(allocs(&shim) < 12, "{shim}");
}
