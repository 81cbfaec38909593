//! Stream safety of the cache: a freed block is not handed out while work queued before the
//! free may still write it, without a driver call per free.
use crate::common;

fn stream_safety(free_sync: &str) -> String {
    common::stream_safety(free_sync, "")
}

#[test]
fn freed_block_is_not_reused_under_pending_work_in_auto_mode() {
    let out = stream_safety("auto");
    assert!(out.contains("intact=1"), "{out}");
}

#[test]
fn freed_block_is_not_reused_under_pending_work_in_event_mode() {
    let out = stream_safety("event");
    assert!(out.contains("intact=1"), "{out}");
}

#[test]
fn freed_block_is_not_reused_under_pending_work_in_device_mode() {
    let out = stream_safety("device");
    assert!(out.contains("intact=1"), "{out}");
}

#[test]
fn free_sync_none_reuses_at_once_and_the_late_write_lands_in_the_new_block() {
    // Proves the scenario really races: without protection the new block is corrupted.
    let out = stream_safety("none");
    assert!(out.contains("same_address=1"), "{out}");
    assert!(out.contains("intact=0"), "{out}");
}

#[test]
fn single_stream_program_makes_no_event_calls_in_auto_mode() {
    let exe = common::compile("shim_single_stream", &[]);
    let dir = common::scratch("single-stream");
    let report = dir.join("report.json");
    let out = common::run_ok(common::shim_cmd(&exe).env("SIMCUDA_REPORT", &report));
    let r = common::read_report(&report);
    for call in [
        "cuEventCreate",
        "cuEventRecord",
        "cuEventQuery",
        "cuEventSynchronize",
    ] {
        assert_eq!(r["calls"][call].as_u64().unwrap_or(0), 0, "{call}: {r}");
    }
    common::assert_single_stream_cached(&out, &r);
}

/// Run `shim_stream_matrix` with `args` under `conf`; returns (same_address, intact).
fn matrix(conf: &str, args: &[&str]) -> (bool, bool) {
    let exe = common::compile("shim_stream_matrix", &["-lpthread"]);
    let mut cmd = common::shim_cmd(&exe);
    cmd.args(args).env("CUSHIM_ALLOC_CONF", conf);
    if conf.contains("free_sync:none") {
        // Unprotected: force the late write after the owner's (see the C file).
        cmd.env("MATRIX_RACE", "1");
    }
    let out = common::run_ok(&mut cmd);
    let kv = common::kv(&out);
    // The cache served the program's two allocations (the verdict alone holds without it).
    assert_eq!(
        common::num(&kv, "shim_allocations"),
        2,
        "{conf} {args:?}: {out}"
    );
    (
        common::num(&kv, "same_address") == 1,
        common::num(&kv, "intact") == 1,
    )
}

const KINDS: [&[&str]; 8] = [
    &["nonblocking", "1"],
    &["nonblocking", "4"],
    &["nonblocking", "16"],
    &["blocking"],
    &["perthread"],
    &["newstream"],
    &["exited"],
    &["ptsz"],
];

#[test]
fn a_thread_created_after_the_only_allocating_one_ended_is_ordered_after_its_work() {
    // The next owner has the exited thread's thread pointer; taken for that thread, it
    // would get the block with no ordering and the late write would land in it.
    let exe = common::compile("shim_stream_matrix", &["-lpthread"]);
    let out = common::run_ok(common::shim_cmd(&exe).arg("exited"));
    let kv = common::kv(&out);
    assert_eq!(common::num(&kv, "same_thread_pointer"), 1, "{out}");
    assert_eq!(common::num(&kv, "shim_allocations"), 2, "{out}");
    assert_eq!(common::num(&kv, "same_address"), 1, "{out}");
    assert_eq!(common::num(&kv, "intact"), 1, "{out}");
}

#[test]
fn a_late_write_never_reaches_the_next_owner_in_any_protecting_mode_or_kind_of_stream() {
    for mode in ["auto", "barrier", "event", "device"] {
        for args in KINDS {
            for extra in ["", ",expandable_segments:True"] {
                let conf = format!("free_sync:{mode}{extra}");
                let (_, intact) = matrix(&conf, args);
                assert!(
                    intact,
                    "{conf} {args:?}: the late write corrupted the new owner"
                );
            }
        }
    }
}

#[test]
fn barriers_hand_the_freed_block_out_again_at_once_with_every_kind_of_stream() {
    for args in KINDS {
        for conf in ["", "free_sync:barrier", "expandable_segments:True"] {
            let (same, intact) = matrix(conf, args);
            assert!(
                same && intact,
                "{conf:?} {args:?}: same={same} intact={intact}"
            );
        }
    }
}

#[test]
fn without_protection_the_late_write_does_corrupt_the_next_owner_for_every_kind() {
    // Proves each scenario really races: free_sync:none reuses at once, unordered.
    for args in KINDS {
        let (same, intact) = matrix("free_sync:none", args);
        assert!(same && !intact, "{args:?}: same={same} intact={intact}");
    }
}

/// Run `shim_lagging_gpu` (50 steps, streams 10 ms behind) under `conf`; returns the shim's
/// peak allocated and reserved bytes and the device's peak bytes in use.
fn lagging_gpu(conf: &str, run: u32) -> (i64, i64, u64) {
    let exe = common::compile("shim_lagging_gpu", &[]);
    let report = common::scratch(&format!("lagging-{run}")).join("report.json");
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .env("CUSHIM_ALLOC_CONF", conf)
            .env("SIMCUDA_REPORT", &report),
    );
    let kv = common::kv(&out);
    let r = common::read_report(&report);
    let device_peak = r["devices"][0]["peak_bytes_in_use"]
        .as_u64()
        .unwrap_or(u64::MAX);
    (
        common::num(&kv, "peak_allocated"),
        common::num(&kv, "peak_reserved"),
        device_peak,
    )
}

#[test]
fn a_lagging_gpu_never_makes_the_cache_reserve_more_than_its_peak_allocation() {
    // Every free is still in flight at the next malloc (the streams run 10 ms behind);
    // the barrier hands the blocks out again anyway. Bytes, not times: they are exact.
    let mut seen = Vec::new();
    for run in 0..3 {
        let (allocated, reserved, device) = lagging_gpu("", run);
        assert_eq!(allocated, (128 << 20) + 512, "run {run}");
        assert!(
            reserved as f64 <= 1.05 * allocated as f64,
            "run {run}: reserved {reserved} for a peak allocation of {allocated}"
        );
        assert!(
            device as f64 <= 1.05 * allocated as f64,
            "run {run}: device peak {device}"
        );
        seen.push((reserved, device));
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}
