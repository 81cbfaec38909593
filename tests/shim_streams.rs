//! Stream safety of the cache: a freed block is not handed out while work queued before the
//! free may still write it, without a driver call per free.
mod common;

fn stream_safety(free_sync: &str) -> String {
    let exe = common::compile("shim_stream_safety", &[]);
    common::run_ok(
        common::shim_cmd(&exe).env("CUSHIM_ALLOC_CONF", format!("free_sync:{free_sync}")),
    )
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
    assert!(out.contains("device_allocs="), "{out}");
}
