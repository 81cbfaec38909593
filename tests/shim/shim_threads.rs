//! Threads cost nothing without per-thread default streams: under `free_sync:auto` a block
//! one thread freed goes at once to another thread's malloc while all their work is on the
//! legacy default stream, and the GPU-side barrier comes back as soon as a per-thread
//! default stream is used (its `_ptsz` entry points, or the `cudaStreamPerThread` handle),
//! through the runtime's exports, through the driver entry points a static runtime gets
//! from `cuGetProcAddress`, and through the driver's symbols a program linked with `-lcuda`
//! calls.
use crate::common;

use std::path::Path;

/// Run `exe KIND` under the shim; returns (event records simcuda saw, device allocations,
/// allocations the shim served).
fn run(exe: &Path, kind: &str, tag: &str) -> (u64, i64, i64) {
    let report = common::scratch(&format!("threads-{tag}-{kind}")).join("report.json");
    let out = common::run_ok(
        common::shim_cmd(exe)
            .arg(kind)
            .env("SIMCUDA_REPORT", &report),
    );
    let kv = common::kv(&out);
    let r = common::read_report(&report);
    (
        r["calls"]["cuEventRecord"].as_u64().unwrap_or(0),
        common::num(&kv, "device_allocs"),
        common::num(&kv, "shim_allocations"),
    )
}

#[test]
fn a_second_thread_on_the_legacy_stream_reuses_the_first_threads_block_without_ordering() {
    let exe = common::compile("shim_threads", &["-lpthread"]);
    let (records, allocs, served) = run(&exe, "legacy", "dyn");
    assert_eq!(served, 100, "the cache served every allocation");
    assert_eq!(allocs, 1, "both threads reused one segment at once");
    assert_eq!(
        records, 0,
        "no barrier: every thread's work is on the legacy stream"
    );
}

#[test]
fn a_per_thread_default_stream_program_gets_barriers_once_a_second_thread_allocates() {
    let exe = common::compile(
        "shim_threads",
        &["-lpthread", "-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
    );
    let (records, _, served) = run(&exe, "legacy", "ptds");
    assert_eq!(served, 100, "the cache served every allocation");
    assert!(
        records >= 1,
        "the _ptsz memsets were seen: the second thread ordered the first's frees"
    );
}

#[test]
fn the_per_thread_stream_handle_brings_barriers_back() {
    let exe = common::compile("shim_threads", &["-lpthread"]);
    let (records, _, served) = run(&exe, "handle", "dyn");
    assert_eq!(served, 100, "the cache served every allocation");
    assert!(records >= 1, "cudaStreamPerThread was seen");
}

#[test]
fn a_static_runtime_is_watched_through_the_driver_entry_points_it_gets() {
    let exe = common::compile_static("shim_threads", &["-lpthread"]);
    let (records, allocs, served) = run(&exe, "legacy", "static");
    assert_eq!(served, 100, "the cache served every allocation");
    assert_eq!(allocs, 1);
    assert_eq!(records, 0, "legacy stream only: no barrier");
    let (records, _, served) = run(&exe, "handle", "static");
    assert_eq!(served, 100);
    assert!(
        records >= 1,
        "CU_STREAM_PER_THREAD passed to cuLaunchHostFunc was seen"
    );
}

#[test]
fn a_program_linked_with_the_driver_is_watched_through_the_driver_symbols_it_calls_or_looks_up() {
    let exe = common::compile("shim_threads_driver", &["-lcuda", "-lpthread"]);
    let (records, allocs, served) = run(&exe, "legacy", "driver");
    assert_eq!(served, 100, "the cache served every allocation");
    assert_eq!(allocs, 1);
    assert_eq!(records, 0, "legacy stream only: no barrier");
    let (records, _, served) = run(&exe, "handle", "driver");
    assert_eq!(served, 100);
    assert!(
        records >= 1,
        "CU_STREAM_PER_THREAD passed to cuMemsetD8Async, bound by the dynamic linker, was seen"
    );
    let (records, _, served) = run(&exe, "dlsym", "driver");
    assert_eq!(served, 100);
    assert!(
        records >= 1,
        "CU_STREAM_PER_THREAD passed to cuMemsetD8Async from dlsym on a driver handle was seen"
    );
}
