//! simcuda's stream capture: capture modes, rejected unsafe calls, invalidation.
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The test program, compiled once per test binary (tests run in parallel).
fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_capture", &[]))
}

fn case(name: &str) {
    let out = common::run_ok(common::sim_cmd(exe()).arg(name));
    assert!(out.contains(&format!("PASS {name}")), "{out}");
}

#[test]
fn cuda_malloc_during_global_capture_fails_and_invalidates_the_capture() {
    case("malloc_in_global_capture_fails_and_invalidates");
}

#[test]
fn cu_mem_alloc_during_global_capture_fails() {
    case("driver_alloc_in_global_capture_fails");
}

#[test]
fn relaxed_thread_capture_mode_allows_allocation() {
    case("relaxed_thread_mode_allows_malloc");
}

#[test]
fn event_query_and_sync_during_global_capture_fail() {
    case("event_query_in_global_capture_fails");
}

#[test]
fn work_queued_on_a_capturing_stream_is_captured_not_run() {
    case("captured_work_does_not_run");
}

#[test]
fn synchronizing_a_capturing_stream_fails() {
    case("sync_of_capturing_stream_fails");
}

#[test]
fn legacy_stream_cannot_capture_and_capture_states_are_checked() {
    case("legacy_stream_cannot_capture");
}

#[test]
fn legacy_work_during_a_blocking_stream_capture_is_an_implicit_dependency() {
    case("legacy_use_during_blocking_capture_is_implicit_dependency");
}

#[test]
fn a_global_capture_forbids_allocation_on_other_threads() {
    case("global_capture_blocks_other_threads");
}

#[test]
fn a_thread_local_capture_leaves_other_threads_free() {
    case("thread_local_capture_allows_other_threads");
}

#[test]
fn ending_a_global_capture_from_another_thread_is_wrong_thread() {
    case("end_capture_from_another_thread_is_wrong_thread");
}
