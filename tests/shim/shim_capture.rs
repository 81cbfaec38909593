//! Allocation under stream capture, with and without the shim: the same program expects
//! CUDA's documented codes (900 and an invalidated capture for cudaMalloc/cudaFree where the
//! capture mode forbids them, success in relaxed mode and from other threads of a
//! thread-local capture), graph allocations never aliasing ordinary ones, and 400 for a
//! stream-ordered free on a destroyed stream.
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("shim_capture", &[]))
}

/// The `cudaMalloc` and `cudaFree` calls that reached simcuda's runtime in a run of `name`
/// (`shim` preloaded or not, with `CUSHIM_ALLOC_CONF=conf`), and its output.
fn run(name: &str, shim: bool, conf: &str) -> (u64, String) {
    let dir = common::scratch(&format!("capture-{name}-{shim}-{}", conf.len()));
    let report = dir.join("report.json");
    let out = common::run_ok(
        common::cmd(exe(), shim)
            .arg(name)
            .env("CUSHIM_ALLOC_CONF", conf)
            .env("SIMCUDA_REPORT", &report),
    );
    let r = common::read_report(&report);
    let calls = ["cudaMalloc", "cudaFree"]
        .iter()
        .map(|c| r["calls"][c].as_u64().unwrap_or(0))
        .sum();
    (calls, out)
}

/// Run `name` on simcuda alone and under the shim (default configuration, then with
/// expandable segments). Under the shim the codes must come from the shim's path: fewer
/// `cudaMalloc`/`cudaFree` calls reached simcuda's runtime than the program made (the shim
/// served them, asking the driver only where CUDA's own refusal is the answer) and the
/// shim's statistics count the program's allocations.
fn case(name: &str) {
    let (bare_calls, plain) = run(name, false, "");
    assert!(
        plain.contains(&format!("PASS {name}")),
        "without the shim: {plain}"
    );
    for conf in ["", "expandable_segments:True"] {
        let (calls, out) = run(name, true, conf);
        assert!(
            out.contains(&format!("PASS {name}")),
            "shim {conf:?}: {out}"
        );
        assert!(
            calls < bare_calls,
            "shim {conf:?}: {calls} cudaMalloc/cudaFree calls reached simcuda, {bare_calls} without the shim"
        );
        let served = common::num(&common::kv(&out), "shim_allocations");
        assert!(served >= 1, "shim {conf:?}: {out}");
    }
}

#[test]
fn cuda_malloc_in_global_capture_returns_900_and_invalidates_it() {
    case("malloc_in_global_capture");
}

#[test]
fn cuda_malloc_in_thread_local_capture_returns_900_and_invalidates_it() {
    case("malloc_in_thread_local_capture");
}

#[test]
fn cuda_free_of_a_cached_block_in_global_capture_returns_900_and_keeps_it() {
    case("free_in_global_capture");
}

#[test]
fn cuda_free_of_a_cached_block_in_thread_local_capture_returns_900_and_keeps_it() {
    case("free_in_thread_local_capture");
}

#[test]
fn relaxed_thread_mode_allows_malloc_and_free_during_capture() {
    case("relaxed_thread_mode_allows_malloc_and_free");
}

#[test]
fn a_global_capture_forbids_allocation_on_other_threads() {
    case("global_capture_forbids_other_threads");
}

#[test]
fn a_thread_local_capture_allows_allocation_on_other_threads() {
    case("thread_local_capture_allows_other_threads");
}

#[test]
fn an_address_allocated_by_a_capture_is_never_handed_to_an_ordinary_allocation() {
    case("capture_allocation_is_never_handed_out_again");
}

#[test]
fn cuda_free_async_and_malloc_async_on_a_destroyed_stream_return_400() {
    case("free_async_on_a_destroyed_stream_fails");
}

#[test]
fn cu_mem_alloc_and_cu_mem_free_in_global_capture_return_900_and_invalidate_it() {
    case("driver_alloc_and_free_in_global_capture");
}
