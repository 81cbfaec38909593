//! The preloaded caching allocator on simcuda: reuse, fragmentation, out-of-memory, error
//! codes, pinned memory. Device-side figures come from `cudaMemGetInfo` (passed through to
//! the device) and simcuda's report, never from the shim's own statistics alone.
use crate::common;

const MIB: u64 = 1 << 20;

#[test]
fn seed_fragmentation_forward_order_reserves_256_mib() {
    let (m, report) = common::shim_frag("frag", "forward", "");
    assert_eq!(common::num(&m, "used_after") as u64, 256 * MIB);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 256 * MIB);
}

#[test]
fn seed_fragmentation_reverse_order_reserves_128_mib() {
    let (m, report) = common::shim_frag("frag", "reverse", "");
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 128 * MIB);
    // The eight 16 MiB blocks are split from the four cached 32 MiB segments: four device
    // allocations for the program's twelve.
    assert_eq!(common::num(&m, "device_allocs"), 4);
    assert_eq!(report["calls"]["cuMemAlloc_v2"], 4, "{}", report["calls"]);
}

#[test]
fn freed_blocks_are_reused_without_device_allocations() {
    let (m, report) = common::shim_frag("frag", "reuse", "");
    assert_eq!(
        report["calls"]["cuMemAlloc_v2"], 8,
        "8 x 16 MiB cost 8 device allocations, the 9th none"
    );
    assert_eq!(common::num(&m, "device_allocs"), 8);
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB);
}

#[test]
fn without_the_shim_every_cuda_malloc_reaches_the_device() {
    let exe = common::compile("shim_frag", &[]);
    let dir = common::scratch("frag-noshim");
    let report = dir.join("report.json");
    common::run_ok(
        common::sim_cmd(&exe)
            .arg("reuse")
            .env("SIMCUDA_REPORT", &report),
    );
    let r = common::read_report(&report);
    assert_eq!(r["calls"]["cudaMalloc"], 9);
}

#[test]
fn out_of_memory_releases_the_cache_and_retries_then_fails_cleanly() {
    let exe = common::compile("shim_oom", &[]);
    let out = common::run_ok(common::shim_cmd(&exe).env("SIMCUDA_MEM_MB", "1024"));
    let m = common::kv(&out);
    assert_eq!(common::num(&m, "retries"), 1, "{out}");
    assert_eq!(common::num(&m, "beyond"), 2, "cudaErrorMemoryAllocation");
    assert_eq!(common::num(&m, "null"), 1);
    assert_eq!(common::num(&m, "last_error"), 2);
    assert_eq!(common::num(&m, "ooms"), 1);
    assert_eq!(m["after"], "ok");
}

#[test]
fn error_codes_match_cuda() {
    check_error_codes("all");
}

#[test]
fn memory_the_shim_did_not_allocate_is_freed_by_the_real_runtime() {
    // With only the runtime layer intercepted, the program's cuMemAlloc is not the cache's:
    // cudaFree must hand it to the real cudaFree (and a second free gets the real error).
    check_error_codes("runtime");
}

fn check_error_codes(intercept: &str) {
    let exe = common::compile("shim_errors", &["-lcuda"]);
    let dir = common::scratch(&format!("errors-{intercept}"));
    let report = dir.join("report.json");
    let out = common::run(
        common::shim_cmd(&exe)
            .env("CUSHIM_INTERCEPT", intercept)
            .env("SIMCUDA_REPORT", &report),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let m = common::kv(&stdout);
    assert_eq!(common::num(&m, "null_out"), 1);
    assert_eq!(common::num(&m, "zero_size"), 0);
    assert_eq!(
        common::num(&m, "null"),
        1,
        "cudaMalloc(&p, 0) leaves p NULL"
    );
    assert_eq!(common::num(&m, "free_null"), 0);
    assert_eq!(common::num(&m, "free_unknown"), 1);
    assert_eq!(common::num(&m, "free_first"), 0);
    assert_eq!(common::num(&m, "free_double"), 1);
    assert_eq!(common::num(&m, "last_error"), 1);
    assert_eq!(common::num(&m, "last_error_cleared"), 0);
    assert_eq!(common::num(&m, "free_interior"), 1);
    assert_eq!(common::num(&m, "host_null_out"), 1);
    assert_eq!(common::num(&m, "host_free_unknown"), 1);
    assert_eq!(common::num(&m, "meminfo_null"), 1);
    assert_eq!(
        common::num(&m, "free_foreign"),
        0,
        "memory the shim did not allocate is freed by CUDA"
    );
    assert_eq!(common::num(&m, "free_foreign_again"), 1);
    assert!(
        stderr.contains("cushim:"),
        "invalid frees are logged: {stderr}"
    );
    // What reached the real cudaFree: the shim's own cudaFree(NULL) at start-up, the
    // program's NULL and unknown pointer always; the driver allocation (twice) only when the
    // shim does not cache the driver layer.
    let real_frees = if intercept == "runtime" { 5 } else { 3 };
    assert_eq!(
        common::read_report(&report)["calls"]["cudaFree"],
        real_frees
    );
    assert_eq!(
        stderr.matches("double free").count(),
        stderr.lines().filter(|l| l.contains("double free")).count()
    );
}

#[test]
fn disabled_shim_is_a_pure_pass_through() {
    let exe = common::compile("shim_frag", &[]);
    let dir = common::scratch("frag-disabled");
    let report = dir.join("report.json");
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .arg("reuse")
            .env("CUSHIM_DISABLE", "1")
            .env("SIMCUDA_REPORT", &report),
    );
    assert_eq!(
        common::num(&common::kv(&out), "device_allocs"),
        -1,
        "the C API reports inactive"
    );
    assert_eq!(common::read_report(&report)["calls"]["cudaMalloc"], 9);
}

#[test]
fn pinned_blocks_are_reused_and_flag_combinations_kept_apart() {
    let exe = common::compile("shim_pinned", &[]);
    let dir = common::scratch("pinned");
    let report = dir.join("report.json");
    let out = common::run_ok(common::shim_cmd(&exe).env("SIMCUDA_REPORT", &report));
    let m = common::kv(&out);
    assert_eq!(common::num(&m, "reused"), 1);
    assert_eq!(common::num(&m, "wc_kept_apart"), 1);
    assert_eq!(common::num(&m, "default_reuses_default"), 1);
    let r = common::read_report(&report);
    let host_allocs = r["calls"]["cuMemHostAlloc"].as_u64().unwrap_or(0)
        + r["calls"]["cuMemAllocHost_v2"].as_u64().unwrap_or(0);
    assert_eq!(
        host_allocs, 2,
        "one default block and one write-combined block: {r}"
    );
}

#[test]
fn bad_alloc_conf_prints_one_line_and_keeps_defaults() {
    let exe = common::compile("shim_frag", &[]);
    let out = common::run(common::shim_cmd(&exe).arg("forward").env(
        "CUSHIM_ALLOC_CONF",
        "max_split_size_mb:banana,no_such_key:1",
    ));
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_split_size_mb"), "{stderr}");
    assert!(stderr.contains("no_such_key"), "{stderr}");
    assert_eq!(
        common::num(
            &common::kv(&String::from_utf8_lossy(&out.stdout)),
            "used_after"
        ) as u64,
        256 * MIB
    );
}
