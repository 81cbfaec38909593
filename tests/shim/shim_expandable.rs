//! Expandable segments on simcuda's real virtual-memory mapping: reservation follows
//! allocation, holes are reused by moving physical pages, nothing leaks on failure.
use crate::common;

use std::collections::HashMap;

const MIB: u64 = 1 << 20;
const EXPANDABLE: &str = "expandable_segments:True";

fn run(
    prog: &str,
    mode: &str,
    env: &[(&str, &str)],
) -> (HashMap<String, String>, serde_json::Value, String) {
    let exe = common::compile(prog, &[]);
    let dir = common::scratch(&format!("exp-{prog}-{mode}-{}", env.len()));
    let report = dir.join("report.json");
    let mut cmd = common::shim_cmd(&exe);
    cmd.arg(mode)
        .env("CUSHIM_ALLOC_CONF", EXPANDABLE)
        .env("SIMCUDA_REPORT", &report);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = common::run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (common::kv(&stdout), common::read_report(&report), stderr)
}

fn maps(r: &serde_json::Value) -> u64 {
    r["calls"]["cuMemMap"].as_u64().unwrap_or(0)
}

#[test]
fn seed_scenario_reserves_exactly_128_mib_in_both_orders() {
    for mode in ["forward", "reverse"] {
        let (m, r, _) = run("shim_frag", mode, &[]);
        println!(
            "expandable seed scenario, {mode}: {} cuMemMap calls, {} cuMemCreate calls",
            maps(&r),
            r["calls"]["cuMemCreate"]
        );
        assert_eq!((common::num(&m, "used_after") as u64), 128 * MIB, "{mode}");
        assert_eq!(
            r["devices"][0]["peak_bytes_in_use"],
            128 * MIB,
            "{mode}: {r}"
        );
        assert_eq!(
            r["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0),
            0,
            "no ordinary segments"
        );
        // The program makes no VMM call itself: the pages are the cache's.
        assert!(maps(&r) > 0, "{mode}: no page mapped");
    }
}

#[test]
fn allocating_across_a_hole_moves_free_pages_instead_of_growing() {
    let (m, r, _) = run("shim_expandable", "hole", &[]);
    assert_eq!((common::num(&m, "used_three") as u64), 60 * MIB);
    assert_eq!(
        (common::num(&m, "used_after") as u64),
        60 * MIB,
        "{m:?} {r}"
    );
    // The cache moved pages: it unmapped the hole's pages and mapped them again further on
    // (the program makes no VMM call itself).
    assert!(maps(&r) > 0, "{}", r["calls"]);
    assert!(
        r["calls"]["cuMemUnmap"].as_u64() > Some(0),
        "{}",
        r["calls"]
    );
}

#[test]
fn blocks_keep_addresses_and_contents_while_the_reservation_grows_and_shrinks() {
    let (m, r, _) = run("shim_expandable", "data", &[]);
    assert_eq!((common::num(&m, "data_intact") as u64), 1);
    // The reservation that grew and shrank is the cache's (no VMM call in the program).
    assert!(maps(&r) > 0, "{}", r["calls"]);
    assert!(
        r["calls"]["cuMemUnmap"].as_u64() > Some(0),
        "{}",
        r["calls"]
    );
}

#[test]
fn empty_cache_returns_the_device_to_zero_bytes_and_zero_handles() {
    let (m, r, _) = run("shim_expandable", "empty", &[]);
    assert!((common::num(&m, "used_before_empty") as u64) > 0);
    assert_eq!((common::num(&m, "empty_rc") as u64), 0);
    assert_eq!((common::num(&m, "used_after_empty") as u64), 0);
    assert_eq!(r["devices"][0]["live_physical_handles"], 0, "{r}");
    assert_eq!(r["devices"][0]["bytes_in_use"], 0, "{r}");
}

#[test]
fn failed_cu_mem_create_midway_leaks_nothing_and_the_next_allocation_succeeds() {
    let (m, r, _) = run(
        "shim_expandable",
        "fail",
        &[("SIMCUDA_FAIL", "cuMemCreate@every:2")],
    );
    assert_eq!((common::num(&m, "first") as u64), 2);
    assert_eq!(
        (common::num(&m, "used_after_fail") as u64),
        0,
        "no created page left behind"
    );
    assert_eq!(m["second"], "ok");
    assert_eq!(r["devices"][0]["live_physical_handles"], 0, "{r}");
}

#[test]
fn failed_cu_mem_map_midway_leaks_nothing_and_the_next_allocation_succeeds() {
    let (m, r, _) = run(
        "shim_expandable",
        "fail",
        &[("SIMCUDA_FAIL", "cuMemMap@every:2")],
    );
    assert_eq!((common::num(&m, "first") as u64), 2);
    assert_eq!(
        (common::num(&m, "used_after_fail") as u64),
        0,
        "no mapped page left behind"
    );
    assert_eq!(m["second"], "ok");
    assert_eq!(r["devices"][0]["live_physical_handles"], 0, "{r}");
}

#[test]
fn a_growth_sets_access_once_over_all_its_pages() {
    let (m, r, _) = run("shim_expandable", "growth", &[]);
    assert_eq!(m["written"], "1", "{m:?}");
    assert_eq!((common::num(&m, "used_first") as u64), 50 * MIB);
    assert_eq!((common::num(&m, "used_second") as u64), 70 * MIB);
    let calls = &r["calls"];
    // 20 + 20 + 10 MiB pages for the first growth, one 20 MiB page for the second.
    assert_eq!(calls["cuMemCreate"].as_u64(), Some(4), "{calls}");
    assert_eq!(calls["cuMemMap"].as_u64(), Some(4), "{calls}");
    assert_eq!(
        calls["cuMemSetAccess"].as_u64(),
        Some(2),
        "one access call per growth: {calls}"
    );
    assert_eq!(r["devices"][0]["live_physical_handles"], 0, "{r}");
}

#[test]
fn failed_access_call_undoes_the_growth_and_the_retry_maps_only_what_it_needs() {
    let (m, r, _) = run(
        "shim_expandable",
        "growth",
        &[("SIMCUDA_FAIL", "cuMemSetAccess@1")],
    );
    assert_eq!(m["written"], "1", "{m:?}");
    assert_eq!(
        (common::num(&m, "used_first") as u64),
        50 * MIB,
        "the failed growth's pages were released"
    );
    let calls = &r["calls"];
    assert_eq!(calls["cuMemSetAccess"].as_u64(), Some(3), "{calls}");
    assert_eq!(calls["cuMemUnmap"].as_u64(), Some(3 + 4), "{calls}");
    assert_eq!(r["devices"][0]["live_physical_handles"], 0, "{r}");
}

#[test]
fn device_without_vmm_falls_back_to_ordinary_segments_with_one_line() {
    let (m, r, stderr) = run("shim_frag", "forward", &[("SIMCUDA_VMM", "0")]);
    assert_eq!(
        (common::num(&m, "used_after") as u64),
        256 * MIB,
        "ordinary segments again"
    );
    assert!(r["calls"]["cuMemAlloc_v2"].as_u64().unwrap_or(0) > 0);
    assert_eq!(
        stderr.lines().filter(|l| l.contains("expandable")).count(),
        1,
        "{stderr}"
    );
}
