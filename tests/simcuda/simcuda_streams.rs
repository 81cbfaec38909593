//! simcuda's streams: asynchronous workers with CUDA's legacy / blocking / non-blocking /
//! per-thread ordering, events, host functions, stream-ordered allocation.
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The test program, compiled once per test binary (tests run in parallel).
fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_streams", &[]))
}

fn case(name: &str) {
    let out = common::run_ok(common::sim_cmd(exe()).arg(name));
    assert!(out.contains(&format!("PASS {name}")), "{out}");
}

#[test]
fn legacy_stream_does_not_wait_for_a_slow_non_blocking_stream() {
    case("legacy_does_not_wait_for_non_blocking");
}

#[test]
fn legacy_stream_waits_for_a_slow_blocking_stream() {
    case("legacy_waits_for_blocking");
}

#[test]
fn blocking_stream_waits_for_earlier_legacy_work() {
    case("blocking_stream_waits_for_legacy");
}

#[test]
fn non_blocking_stream_does_not_wait_for_legacy_work() {
    case("non_blocking_stream_does_not_wait_for_legacy");
}

#[test]
fn per_thread_default_stream_synchronizes_with_legacy_only() {
    case("per_thread_stream_syncs_with_legacy_only");
}

#[test]
fn events_are_not_ready_until_the_stream_passes_them() {
    case("event_readiness");
}

#[test]
fn copies_sets_and_host_functions_run_in_stream_order() {
    case("work_runs_in_stream_order");
}

#[test]
fn cuda_free_waits_for_work_on_every_stream() {
    case("free_synchronizes_the_device");
}

#[test]
fn device_synchronize_waits_for_all_streams() {
    case("device_synchronize_waits_for_all_streams");
}

#[test]
fn stream_wait_event_orders_one_stream_after_another() {
    case("stream_wait_event_orders_streams");
}

#[test]
fn unknown_or_destroyed_streams_are_invalid_handles() {
    case("bad_stream_handles");
}

#[test]
fn a_destroyed_stream_still_finishes_its_queued_work() {
    case("destroyed_stream_finishes_its_work");
}

#[test]
fn driver_streams_events_and_host_functions_work() {
    case("driver_streams_and_host_funcs");
}

#[test]
fn free_async_releases_memory_when_the_stream_reaches_it() {
    case("malloc_async_free_async_in_stream_order");
}

#[test]
fn driver_async_copies_event_timing_and_context_push_pop_work() {
    case("driver_async_copies_timing_and_context_stack");
}

#[test]
fn runtime_event_elapsed_time_measures_stream_time() {
    case("runtime_event_elapsed_time");
}

fn ptds_seen(extra: &[&str]) -> (String, serde_json::Value) {
    let exe = common::compile("sim_ptds", extra);
    let dir = common::scratch(&format!("simcuda-ptds-{}", extra.len()));
    let report = dir.join("report.json");
    let out = common::run_ok(common::sim_cmd(&exe).env("SIMCUDA_REPORT", &report));
    assert!(out.contains("PASS ptds"), "{out}");
    (out, common::read_report(&report))
}

#[test]
fn per_thread_default_stream_build_gives_each_thread_its_own_stream_zero() {
    let (out, report) = ptds_seen(&["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"]);
    assert!(out.contains("seen 0"), "{out}");
    assert_eq!(report["calls"]["cudaLaunchHostFunc_ptsz"], 2);
    assert_eq!(report["calls"]["cudaLaunchHostFunc"], 0);
    assert_eq!(report["calls"]["cudaMemcpy_ptds"], 1);
}

#[test]
fn legacy_default_stream_build_shares_stream_zero_between_threads() {
    let (out, report) = ptds_seen(&[]);
    assert!(out.contains("seen 1"), "{out}");
    assert_eq!(report["calls"]["cudaLaunchHostFunc"], 2);
}
