//! numba-cuda (a published Python client, through NVIDIA's `cuda.bindings`) on simcuda, with
//! and without the shim: the same device-array workload (`to_device`, `device_array`,
//! `copy_to_host`, a second stream) gives the same results, and under the shim simcuda sees
//! fewer device allocations. Ignored by default: it needs a Python with numba-cuda, taken from
//! `CUSHIM_NUMBA_PYTHON` or `target/numba-venv/bin/python` (see the README).
use crate::common;

use std::path::PathBuf;

fn python() -> PathBuf {
    std::env::var_os("CUSHIM_NUMBA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::artifacts::source_root().join("target/numba-venv/bin/python"))
}

fn run(shim: bool) -> (String, serde_json::Value) {
    let dir = common::scratch(&format!("numba-{shim}"));
    let report = dir.join("report.json");
    let script = common::artifacts::source_root().join("tests/py/numba_workload.py");
    let py = python();
    let mut cmd = common::cmd(&py, shim);
    let out = common::run_ok(cmd.arg(script).env("SIMCUDA_REPORT", &report));
    (out, common::read_report(&report))
}

#[test]
#[ignore = "needs numba-cuda: python3 -m venv target/numba-venv && target/numba-venv/bin/pip install numba-cuda cuda-bindings==12.9.*"]
fn a_numba_cuda_device_array_workload_gives_the_same_results_with_and_without_the_shim() {
    let (bare, bare_report) = run(false);
    let (shim, shim_report) = run(true);
    let sums = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("numba_workload sums="))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no result line in {out}"))
    };
    assert_eq!(sums(&bare), sums(&shim));
    let allocs = |r: &serde_json::Value| r["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0);
    assert!(allocs(&shim_report) < allocs(&bare_report), "{shim_report}");
    assert_eq!(
        shim_report["devices"][0]["runtime_started"], false,
        "{shim_report}"
    );
}
