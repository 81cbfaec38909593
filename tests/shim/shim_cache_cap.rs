//! The cache cap under the shim on simcuda: the seed programs keep their results and reserve
//! what the cap keeps, and the stream-safety program still finds its data intact with a cap
//! that caches nothing (a pending free is never released).
use crate::common;

const MIB: u64 = 1 << 20;

#[test]
fn seed_forward_order_with_a_64_mib_cap_reserves_192_mib() {
    // 8 x 16 MiB freed: the cap keeps the 4 freed last; the 4 x 32 MiB need new segments.
    let (m, report) = common::shim_frag("cap-frag", "forward", "max_cached_mb:64");
    assert_eq!(common::num(&m, "used_after") as u64, 192 * MIB);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 192 * MIB);
}

#[test]
fn seed_reverse_order_with_a_64_mib_cap_still_reserves_128_mib() {
    let (m, report) = common::shim_frag("cap-frag", "reverse", "max_cached_mb:64");
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB);
    // The cache served part of the eight 16 MiB blocks from the 32 MiB segments it kept:
    // the device saw fewer allocations than the program's twelve, each one the shim's.
    let allocs = common::num(&m, "device_allocs");
    assert!((4..12).contains(&allocs), "{allocs} device allocations");
    assert_eq!(report["calls"]["cuMemAlloc_v2"].as_i64(), Some(allocs));
}

#[test]
fn seed_forward_order_with_a_zero_cap_reserves_only_what_is_live() {
    let (m, report) = common::shim_frag("cap-frag", "forward", "max_cached_mb:0");
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 128 * MIB);
    // Nothing cached: the shim made a device allocation for each of the twelve mallocs and
    // released each freed segment at once.
    assert_eq!(common::num(&m, "device_allocs"), 12);
    assert_eq!(report["calls"]["cuMemAlloc_v2"], 12);
    assert!(report["calls"]["cuMemFree_v2"].as_u64() >= Some(8));
}

fn stream_safety(free_sync: &str) -> String {
    common::stream_safety(free_sync, ",max_cached_mb:0")
}

#[test]
fn freed_block_is_intact_under_pending_work_with_a_zero_cap_in_auto_mode() {
    let out = stream_safety("auto");
    assert!(out.contains("intact=1"), "{out}");
}

#[test]
fn freed_block_is_intact_under_pending_work_with_a_zero_cap_in_event_mode() {
    let out = stream_safety("event");
    assert!(out.contains("intact=1"), "{out}");
}

#[test]
fn freed_block_is_intact_under_pending_work_with_a_zero_cap_in_device_mode() {
    let out = stream_safety("device");
    assert!(out.contains("intact=1"), "{out}");
}

#[test]
fn cap_releases_appear_in_the_snapshot_as_segment_free_oldest_first() {
    let exe = common::compile("shim_frag", &[]);
    let dir = common::scratch("cap-snapshot");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        common::shim_cmd(&exe)
            .arg("forward")
            .env("CUSHIM_ALLOC_CONF", "max_cached_mb:64")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all"),
    );
    let v = common::load_snapshot(&snap);
    let trace = v["device_traces"][0].as_array().expect("device 0 trace");
    let addrs = |action: &str| -> Vec<u64> {
        trace
            .iter()
            .filter(|e| e["action"] == action)
            .filter_map(|e| e["addr"].as_u64())
            .collect()
    };
    let allocs = addrs("segment_alloc");
    let frees = addrs("segment_free");
    // 8 segments of 16 MiB, then 4 of 32 MiB; freeing the first 8 leaves 64 MiB cached:
    // the 4 segments freed first (allocated first) went back, in that order.
    assert_eq!(allocs.len(), 12, "{allocs:?}");
    assert_eq!(&frees[..4], &allocs[..4], "{frees:?}");
}

/// The Caffe SyncedMemory example (examples/caffe_blobs.c, measured in BENCHMARKS.md) runs
/// the same without the shim, with it, and with it under a cap; the cache serves most of its
/// allocations, and under a zero cap every segment goes back once the program has freed
/// everything in it (the program ends with every blob freed).
#[test]
fn caffe_blobs_example_runs_and_the_cache_serves_most_of_its_allocations() {
    let src = common::artifacts::source_root().join("examples/caffe_blobs.c");
    let exe = common::compile_src(&src, "caffe_blobs", &[]);
    let dir = common::scratch("cap-caffe");
    let run = |shim: bool, conf: &str| {
        let report = dir.join(format!("report-{shim}-{}.json", conf.len()));
        let mut cmd = common::cmd(&exe, shim);
        cmd.args(["1", "10"])
            .env("CUSHIM_ALLOC_CONF", conf)
            .env("SIMCUDA_REPORT", &report);
        let kv = common::kv(&common::run_ok(&mut cmd));
        (kv, common::read_report(&report))
    };
    let (plain, plain_r) = run(false, "");
    let (cached, cached_r) = run(true, "");
    let (capped, capped_r) = run(true, "max_cached_mb:0");
    let mallocs = common::num(&plain, "device_mallocs");
    assert!(mallocs > 100, "{plain:?}");
    assert_eq!(plain_r["calls"]["cudaMalloc"].as_i64(), Some(mallocs));
    for kv in [&cached, &capped] {
        assert_eq!(common::num(kv, "device_mallocs"), mallocs);
        assert_eq!(
            common::num(kv, "host_mallocs"),
            common::num(&plain, "host_mallocs")
        );
    }
    let segments = cached_r["calls"]["cuMemAlloc_v2"].as_i64().unwrap_or(0);
    assert!(
        segments > 0 && segments * 4 < mallocs,
        "{segments} of {mallocs}"
    );
    let capped_allocs = capped_r["calls"]["cuMemAlloc_v2"].as_i64().unwrap_or(0);
    let capped_frees = capped_r["calls"]["cuMemFree_v2"].as_i64().unwrap_or(0);
    assert!(capped_allocs > segments, "{capped_r}");
    assert_eq!(capped_frees, capped_allocs, "{capped_r}");
}
