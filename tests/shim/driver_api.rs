//! Programs written against the driver API (`cuMemAlloc_v2` / `cuMemFree_v2` called
//! directly, linked with `-lcuda`) with the shim preloaded: cached by the same allocator,
//! the same driver result codes as the bare driver, stacks from the program's call sites.
use crate::common;

use std::collections::HashMap;

const MIB: u64 = 1 << 20;
const HISTORY: &str = "enabled=all,context=all,stacks=native";

fn prog(name: &str) -> std::path::PathBuf {
    common::compile(name, &["-lcuda"])
}

fn frag(
    mode: &str,
    shim: bool,
    env: &[(&str, &str)],
) -> (HashMap<String, String>, serde_json::Value) {
    let exe = prog("driver_frag");
    let dir = common::scratch(&format!("drv-frag-{mode}-{shim}-{}", env.len()));
    let report = dir.join("report.json");
    let mut cmd = common::cmd(&exe, shim);
    cmd.arg(mode).env("SIMCUDA_REPORT", &report);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = common::run_ok(&mut cmd);
    (common::kv(&out), common::read_report(&report))
}

#[test]
fn driver_api_seed_fragmentation_forward_order_reserves_256_mib() {
    let (m, report) = frag("forward", true, &[]);
    assert_eq!(common::num(&m, "used_after") as u64, 256 * MIB);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 256 * MIB);
}

#[test]
fn driver_api_seed_fragmentation_reverse_order_reserves_128_mib() {
    let (m, report) = frag("reverse", true, &[]);
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 128 * MIB);
    // The eight 16 MiB blocks are split from the four cached 32 MiB segments: four device
    // allocations for the program's twelve.
    assert_eq!(report["calls"]["cuMemAlloc_v2"], 4, "{report}");
}

#[test]
fn driver_api_freed_blocks_are_reused_without_device_allocations() {
    let (m, report) = frag("reuse", true, &[]);
    assert_eq!(report["calls"]["cuMemAlloc_v2"], 8, "{report}");
    assert_eq!(common::num(&m, "device_allocs"), 8);
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB);
}

#[test]
fn driver_api_without_the_shim_every_cu_mem_alloc_reaches_the_device() {
    let (m, report) = frag("reuse", false, &[]);
    assert_eq!(report["calls"]["cuMemAlloc_v2"], 9, "{report}");
    assert_eq!(common::num(&m, "used_after") as u64, 16 * MIB);
}

#[test]
fn driver_api_is_passed_through_with_runtime_only_interception() {
    let (m, report) = frag("reuse", true, &[("CUSHIM_INTERCEPT", "runtime")]);
    assert_eq!(report["calls"]["cuMemAlloc_v2"], 9, "{report}");
    assert_eq!(common::num(&m, "used_after") as u64, 16 * MIB);
    // The shim is loaded (its statistics answer) and served none of them.
    assert_eq!(common::num(&m, "device_allocs"), 0);
}

#[test]
fn a_bad_intercept_value_is_named_once_and_all_layers_stay_on() {
    let exe = prog("driver_frag");
    let dir = common::scratch("drv-bad-intercept");
    let report = dir.join("report.json");
    let out = common::run(
        common::shim_cmd(&exe)
            .arg("reuse")
            .env("CUSHIM_INTERCEPT", "drivers")
            .env("SIMCUDA_REPORT", &report),
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("CUSHIM_INTERCEPT=drivers").count(),
        1,
        "{stderr}"
    );
    assert_eq!(common::read_report(&report)["calls"]["cuMemAlloc_v2"], 8);
}

#[test]
fn driver_api_expandable_segments_reserve_128_mib_in_both_orders() {
    for mode in ["forward", "reverse"] {
        let (m, report) = frag(
            mode,
            true,
            &[("CUSHIM_ALLOC_CONF", "expandable_segments:True")],
        );
        assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB, "{mode}");
        // The cache served every allocation from mapped pages: the program's cuMemAlloc
        // calls never reached the device.
        assert_eq!(report["calls"]["cuMemAlloc_v2"], 0, "{mode}: {report}");
        assert!(
            report["calls"]["cuMemMap"].as_u64() > Some(0),
            "{mode}: {report}"
        );
    }
}

#[test]
fn driver_api_result_codes_match_the_bare_driver() {
    let exe = prog("driver_errors");
    let bare = common::run_ok(&mut common::sim_cmd(&exe));
    let out = common::run(&mut common::shim_cmd(&exe));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, bare, "the same codes with and without the shim");
    let m = common::kv(&stdout);
    for (k, v) in [
        ("before_init", 3),
        ("null_out", 1),
        ("zero_size", 1),
        ("free_null", 0),
        ("free_unknown", 1),
        ("free_first", 0),
        ("free_double", 1),
        ("free_interior", 1),
        ("host_null_out", 1),
        ("host_alloc_null_out", 1),
        ("host_free_unknown", 1),
        ("meminfo_null", 1),
        ("async_null_out", 1),
        ("no_context", 201),
        ("no_context_host", 201),
        ("async_alloc", 0),
        ("async_free", 0),
        ("async_legacy_alloc", 0),
        ("async_legacy_free", 0),
        ("ptsz_alloc", 0),
        ("ptsz_free", 0),
        ("host_free_first", 0),
    ] {
        assert_eq!(common::num(&m, k), v, "{k}");
    }
    assert_eq!(
        stderr.matches("double free").count(),
        2,
        "both invalid frees logged, once per call site: {stderr}"
    );
    assert!(stderr.contains("driver_errors.c"), "{stderr}");
}

#[test]
fn driver_api_snapshot_stacks_start_at_the_programs_call_site() {
    let exe = prog("driver_trace");
    for unwinder in ["dwarf", "fp"] {
        let dir = common::scratch(&format!("drv-snap-{unwinder}"));
        let snap = dir.join("snap.pickle");
        common::run_ok(
            common::shim_cmd(&exe)
                .arg("sites")
                .env("CUSHIM_SNAPSHOT", &snap)
                .env("CUSHIM_HISTORY", format!("{HISTORY},unwinder={unwinder}")),
        );
        let v = common::load_snapshot(&snap);
        let weights = common::call_line("driver_trace.c", "load_weights", "cuMemAlloc(");
        let live = v["segments"].as_array().expect("segments").iter().any(|s| {
            s["blocks"].as_array().is_some_and(|bs| {
                bs.iter().any(|b| {
                    b["state"] == "active_allocated"
                        && common::is_frame(
                            &b["frames"][0],
                            "driver_trace.c",
                            "load_weights",
                            weights,
                        )
                })
            })
        });
        assert!(
            live,
            "{unwinder}: no live block from load_weights:{weights}"
        );
        let act = common::call_line("driver_trace.c", "make_activation", "cuMemAlloc(");
        let traces = v["device_traces"][0].as_array().expect("device_traces[0]");
        let allocs: Vec<_> = traces.iter().filter(|t| t["action"] == "alloc").collect();
        assert_eq!(allocs.len(), 12, "{unwinder}");
        assert!(
            allocs
                .iter()
                .filter(|t| common::is_frame(
                    &t["frames"][0],
                    "driver_trace.c",
                    "make_activation",
                    act
                ))
                .count()
                == 11,
            "{unwinder}: 11 allocs from make_activation:{act}, first frame"
        );
    }
}

#[test]
fn driver_api_a_hundred_thousand_events_stay_under_10_mb() {
    let dir = common::scratch("drv-snap-many");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        common::shim_cmd(&prog("driver_trace"))
            .args(["many", "50000"])
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let size = std::fs::metadata(&snap).expect("snapshot written").len();
    let v = common::load_snapshot_counts(&snap);
    let n = v["device_traces"][0].as_u64().unwrap_or(0);
    assert!(n >= 100_000, "{n} events");
    assert!(size < 10 << 20, "{size} bytes");
}

#[test]
fn driver_api_live_snapshots_under_signals_parse_and_results_stay_correct() {
    common::signal_storm_keeps_results_and_snapshots(&prog("driver_trace"), "drv-signals", 100);
}

fn stream_safety(free_sync: &str) -> String {
    // Unprotected, the program forces the late write after the new owner's (see the C file).
    let args: &[&str] = if free_sync == "none" { &["race"] } else { &[] };
    common::run_ok(
        common::shim_cmd(&prog("driver_stream_safety"))
            .args(args)
            .env("CUSHIM_ALLOC_CONF", format!("free_sync:{free_sync}")),
    )
}

#[test]
fn driver_api_streams_reach_the_cache_so_freed_blocks_wait_for_pending_work() {
    // The stream came from the shim's cuStreamCreate hook; only because the cache knows of
    // it are frees held back in auto mode.
    let out = stream_safety("auto");
    assert!(out.contains("intact=1"), "{out}");
    assert!(out.contains("same_address=0"), "{out}");
}

#[test]
fn driver_api_free_sync_none_really_races() {
    let out = stream_safety("none");
    assert!(out.contains("same_address=1"), "{out}");
    assert!(out.contains("intact=0"), "{out}");
}
