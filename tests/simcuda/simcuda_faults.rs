//! simcuda's fault injection (`SIMCUDA_FAIL`), latency model (`SIMCUDA_LATENCY`) and exit
//! report (`SIMCUDA_REPORT`).
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The test program, compiled once per test binary (tests run in parallel).
fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_faults", &[]))
}

fn run(name: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = common::sim_cmd(exe());
    cmd.arg(name).envs(env.iter().copied());
    common::run_ok(&mut cmd)
}

fn codes(out: &str) -> Vec<u32> {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("codes:"))
        .expect("a codes line");
    line.split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect()
}

#[test]
fn nth_call_fault_fails_only_that_call_with_out_of_memory() {
    let out = run("create_codes", &[("SIMCUDA_FAIL", "cuMemCreate@3")]);
    assert_eq!(codes(&out), [0, 0, 2, 0, 0, 0, 0, 0]);
}

#[test]
fn every_k_fault_fails_each_kth_call() {
    let out = run("create_codes", &[("SIMCUDA_FAIL", "cuMemCreate@every:4")]);
    assert_eq!(codes(&out), [0, 0, 0, 2, 0, 0, 0, 2]);
}

#[test]
fn after_k_fault_fails_every_later_call() {
    let out = run("create_codes", &[("SIMCUDA_FAIL", "cuMemCreate@after:5")]);
    assert_eq!(codes(&out), [0, 0, 0, 0, 0, 2, 2, 2]);
}

#[test]
fn runtime_faults_set_the_last_error_and_combine_by_comma() {
    let out = run(
        "malloc_codes",
        &[(
            "SIMCUDA_FAIL",
            "cudaMalloc@2,cudaMalloc@every:5,cudaFree@1=700",
        )],
    );
    assert_eq!(codes(&out), [0, 2, 0, 0, 2, 0]);
    let frees = out.lines().find_map(|l| l.strip_prefix("frees:")).unwrap();
    assert_eq!(frees.trim(), "700 0 0 0", "{out}");
    assert!(out.contains("last: 2"), "{out}");
}

#[test]
fn no_fault_plan_means_no_failures() {
    let out = run("create_codes", &[]);
    assert_eq!(codes(&out), [0; 8]);
}

fn malloc_ms(env: &[(&str, &str)]) -> f64 {
    let out = run("malloc_timing", env);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("ms: "))
        .expect("a timing line");
    line.trim().parse().unwrap()
}

#[test]
fn latency_model_delays_the_named_call() {
    let slow = malloc_ms(&[("SIMCUDA_LATENCY", "cudaMalloc:3ms")]);
    assert!(slow >= 30.0, "10 calls at 3 ms took {slow} ms");
    let busy = malloc_ms(&[("SIMCUDA_LATENCY", "cudaMalloc:100us,cudaFree:1us")]);
    assert!(busy >= 1.0, "10 calls at 100 us took {busy} ms");
}

#[test]
fn report_has_the_device_host_and_call_ledger() {
    let dir = common::scratch("simcuda-report");
    let path = dir.join("report.json");
    let out = run(
        "report_workload",
        &[
            ("SIMCUDA_REPORT", path.to_str().unwrap()),
            ("SIMCUDA_MEM_MB", "100"),
        ],
    );
    assert!(out.contains("PASS"));
    let r = common::read_report(&path);
    let d = &r["devices"][0];
    assert_eq!(d["ordinal"], 0);
    assert_eq!(d["capacity_bytes"], 100u64 << 20);
    assert_eq!(d["bytes_in_use"], 1024 + 512);
    assert_eq!(d["peak_bytes_in_use"], (3u64 << 20) + 1024);
    assert_eq!(d["live_allocations"], 2);
    assert_eq!(d["live_physical_handles"], 0);
    assert_eq!(d["live_reservations"], 0);
    assert_eq!(r["host"]["bytes_in_use"], 8192);
    assert_eq!(r["host"]["peak_bytes_in_use"], 8192);
    assert_eq!(r["host"]["live_allocations"], 1);
    assert_eq!(r["calls"]["cudaMalloc"], 2);
    assert_eq!(r["calls"]["cudaFree"], 2);
    assert_eq!(r["calls"]["cuMemAlloc_v2"], 1);
    // the runtime is built on internal functions: its calls are not counted as driver calls
    assert_eq!(r["calls"]["cuMemFree_v2"], 0);
    assert_eq!(r["calls"]["cudaMallocHost"], 1);
}

#[test]
fn the_cuda_profile_on_a_virtual_clock_charges_each_call_its_figure() {
    let dir = common::scratch("simcuda-virtual-clock");
    let path = dir.join("report.json");
    run(
        "report_workload",
        &[
            ("SIMCUDA_REPORT", path.to_str().unwrap()),
            ("SIMCUDA_LATENCY", "cuda,virtual"),
        ],
    );
    let r = common::read_report(&path);
    // cudaMalloc 3 MiB (50 us) and 1000 B (1 us); cudaFree of the 3 MiB block (50 us and
    // the device synchronization it makes, 1 us); cudaMallocHost (2,300 us); a free of an
    // unknown pointer frees nothing and costs nothing; cuMemAlloc of 512 B (1 us).
    assert_eq!(r["modelled_ns"], 2_403_000u64, "{r}");
}

#[test]
fn without_a_latency_model_the_clock_stays_at_zero() {
    let dir = common::scratch("simcuda-no-clock");
    let path = dir.join("report.json");
    run(
        "report_workload",
        &[("SIMCUDA_REPORT", path.to_str().unwrap())],
    );
    assert_eq!(common::read_report(&path)["modelled_ns"], 0u64);
}

#[test]
fn report_is_written_when_another_thread_calls_exit() {
    let dir = common::scratch("simcuda-report-exit");
    let path = dir.join("report.json");
    let mut cmd = common::sim_cmd(exe());
    cmd.arg("exit_from_other_thread")
        .env("SIMCUDA_REPORT", &path);
    let out = common::run(&mut cmd);
    assert_eq!(out.status.code(), Some(0));
    let r = common::read_report(&path);
    assert_eq!(r["devices"][0]["live_allocations"], 1);
    assert_eq!(r["calls"]["cudaStreamCreate"], 1);
}

#[test]
fn report_of_two_devices_lists_both() {
    let dir = common::scratch("simcuda-report-2dev");
    let path = dir.join("report.json");
    run(
        "report_workload",
        &[
            ("SIMCUDA_REPORT", path.to_str().unwrap()),
            ("SIMCUDA_DEVICES", "2"),
        ],
    );
    let r = common::read_report(&path);
    assert_eq!(r["devices"].as_array().unwrap().len(), 2);
    assert_eq!(r["devices"][1]["ordinal"], 1);
    assert_eq!(r["devices"][1]["bytes_in_use"], 0);
}
