//! The `dlsym` override and the `cuGetProcAddress` wrappers: only the exact allocation entry
//! points are ever substituted; unrelated libraries, other driver functions and names such as
//! `cudnnCreate` get the real answer; and a program is intercepted at one layer only.
use crate::common;

use std::collections::HashMap;

/// The program's lookups, with the shim preloaded when `shim`. Under the shim, whatever
/// `env` asks, the process's `cudaMalloc` is the shim's: the shim is the library answering,
/// so what the test finds passed through, the shim passed through.
fn lookups(shim: bool, env: &[(&str, &str)]) -> HashMap<String, String> {
    let exe = common::compile("driver_dlsym", &["-lcuda", "-lm"]);
    let mut cmd = common::cmd(&exe, shim);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let m: HashMap<String, String> = common::run_ok(&mut cmd)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if shim {
        assert_eq!(m["default:cudaMalloc"], "shim:cudaMalloc", "{env:?}");
    }
    m
}

const HOOKED: [&str; 18] = [
    "cuMemGetAddressRange_v2",
    // The families the cache does not serve are recorded.
    "cuMemAddressReserve",
    "cuMemAllocPitch_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemGetInfo_v2",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
];

const REAL: [&str; 6] = [
    "cuInit",
    "cuDeviceGetCount",
    "cuMemcpyHtoD_v2",
    "cuStreamSynchronize",
    "cuStreamDestroy",
    "cuGetExportTable",
];

#[test]
fn unrelated_libraries_always_get_their_own_functions() {
    let m = lookups(true, &[]);
    for k in [
        "libm_cos_same",
        "libc_malloc_same",
        "default_printf_same",
        "next_puts_same",
    ] {
        assert_eq!(m[k], "1", "{k}");
    }
    assert_eq!(
        m["libm:cuMemAlloc_v2"], "null",
        "no hook from a library without it"
    );
    assert_eq!(m["libc:cuMemFree_v2"], "null");
}

#[test]
fn rtld_next_is_answered_for_the_caller_not_for_the_shim() {
    let m = lookups(true, &[]);
    assert_eq!(m["next:cudaMalloc"], "shim:cudaMalloc");
    assert_eq!(m["default:cudaMalloc"], "shim:cudaMalloc");
    let bare = lookups(false, &[]);
    assert_eq!(bare["next:cudaMalloc"], "cuda:cudaMalloc");
}

#[test]
fn only_exact_allocation_names_on_libcuda_are_substituted() {
    let m = lookups(true, &[]);
    for n in HOOKED {
        assert_eq!(m[&format!("cuda:{n}")], format!("shim:{n}"), "{n}");
    }
    for n in REAL {
        assert_eq!(m[&format!("cuda:{n}")], format!("cuda:{n}"), "{n}");
    }
    for n in ["cudnnCreate", "cuMemAlloc", "cuMemAlloc_v2x"] {
        assert_eq!(m[&format!("cuda:{n}")], "null", "{n}");
    }
    assert_eq!(m["use_alloc"], "0");
    assert_eq!(m["use_free"], "0");
}

#[test]
fn cu_get_proc_address_substitutes_known_name_and_version_pairs_only() {
    let m = lookups(true, &[]);
    let expect = [
        ("gpa:cuMemAlloc:3020:0", "shim:cuMemAlloc_v2"),
        ("gpa:cuMemAlloc:12090:0", "shim:cuMemAlloc_v2"),
        ("gpa:cuMemAlloc:2000:0", "null"),
        ("gpa:cuMemFree:3020:0", "shim:cuMemFree_v2"),
        ("gpa:cuMemHostAlloc:2020:0", "shim:cuMemHostAlloc"),
        ("gpa:cuMemFreeHost:2000:0", "shim:cuMemFreeHost"),
        ("gpa:cuMemGetInfo:3020:0", "shim:cuMemGetInfo_v2"),
        ("gpa:cuMemAllocAsync:11020:0", "shim:cuMemAllocAsync"),
        ("gpa:cuMemAllocAsync:11020:2", "shim:cuMemAllocAsync_ptsz"),
        ("gpa:cuMemFreeAsync:11020:2", "shim:cuMemFreeAsync_ptsz"),
        ("gpa:cuStreamDestroy:2000:0", "cuda:cuStreamDestroy"),
        ("gpa:cuStreamDestroy:4000:0", "shim:cuStreamDestroy_v2"),
        ("gpa:cuDeviceGetCount:2000:0", "cuda:cuDeviceGetCount"),
        // A per-thread variant: a stub in the shim that notes the per-thread default
        // stream's use, then jumps to the driver's function (`shim/src/per_thread.rs`).
        ("gpa:cuMemcpyHtoD:7000:2", "shim"),
        ("gpa:cuGetExportTable:3000:0", "cuda:cuGetExportTable"),
        ("gpa:cuGetProcAddress:12000:0", "shim:cuGetProcAddress_v2"),
        ("gpa:cuGetProcAddress:11030:0", "shim:cuGetProcAddress"),
        ("gpa:cudnnCreate:12000:0", "null"),
        ("gpa:cuMemAlloc_v2:12000:0", "null"),
    ];
    for (k, v) in expect {
        assert_eq!(m[k], v, "{k}");
    }
}

#[test]
fn without_the_shim_every_lookup_is_real() {
    let m = lookups(false, &[]);
    for (k, v) in &m {
        assert!(!v.starts_with("shim:"), "{k}={v}");
    }
    assert_eq!(m["cuda:cuMemAlloc_v2"], "cuda:cuMemAlloc_v2");
    assert_eq!(m["gpa:cuMemAlloc:3020:0"], "cuda:cuMemAlloc_v2");
    assert_eq!(m["use_alloc"], "0");
}

#[test]
fn runtime_only_interception_substitutes_nothing_in_dlsym() {
    let m = lookups(true, &[("CUSHIM_INTERCEPT", "runtime")]);
    for n in HOOKED.iter().chain(REAL.iter()) {
        assert_eq!(m[&format!("cuda:{n}")], format!("cuda:{n}"), "{n}");
    }
    assert_eq!(m["use_alloc"], "0");
    assert_eq!(m["use_free"], "0");
}

/// `shim_frag reuse` under the shim with `env`: simcuda's report and the device allocations
/// the shim's statistics count (-1 when no shim answers).
fn dynamic_reuse(env: &[(&str, &str)]) -> (serde_json::Value, i64) {
    let exe = common::compile("shim_frag", &[]);
    let dir = common::scratch(&format!("dyn-layers-{}", env.len()));
    let report = dir.join("report.json");
    let mut cmd = common::shim_cmd(&exe);
    cmd.arg("reuse").env("SIMCUDA_REPORT", &report);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = common::run_ok(&mut cmd);
    let allocs = common::num(&common::kv(&out), "device_allocs");
    (common::read_report(&report), allocs)
}

#[test]
fn a_dynamic_runtime_program_is_intercepted_once_at_cuda_malloc() {
    let (r, allocs) = dynamic_reuse(&[]);
    assert_eq!(allocs, 8, "{r}");
    assert_eq!(r["calls"]["cudaMalloc"].as_u64().unwrap_or(0), 0, "{r}");
    assert_eq!(r["calls"]["cuMemAlloc_v2"], 8, "{r}");
}

#[test]
fn driver_only_interception_leaves_the_dynamic_runtime_alone() {
    let (r, allocs) = dynamic_reuse(&[("CUSHIM_INTERCEPT", "driver")]);
    assert_eq!(r["calls"]["cudaMalloc"], 9, "{r}");
    // The shim is loaded (its statistics answer) and served none of them.
    assert_eq!(allocs, 0, "{r}");
}

#[test]
fn a_disabled_shim_substitutes_nothing() {
    let m = lookups(true, &[("CUSHIM_DISABLE", "1")]);
    for n in HOOKED {
        assert_eq!(m[&format!("cuda:{n}")], format!("cuda:{n}"), "{n}");
    }
    assert_eq!(m["use_alloc"], "0");
}
