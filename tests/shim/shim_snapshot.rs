//! Snapshots written by the preloaded shim: native frames of the program, compact storage of
//! repeated stacks, live dumps on a signal under load, safe file writing.
use crate::common;

const HISTORY: &str = "enabled=all,context=all,stacks=native";

fn trace_prog() -> std::path::PathBuf {
    common::compile("shim_trace", &[])
}

#[test]
fn snapshot_frames_name_the_programs_functions_files_and_lines() {
    common::snapshot_frames_start_at_the_programs_call_sites(&trace_prog(), "snap-sites");
}

#[test]
fn a_hundred_thousand_events_from_one_call_site_stay_under_10_mb() {
    let dir = common::scratch("snap-many");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        common::shim_cmd(&trace_prog())
            .args(["many", "50000"])
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let size = std::fs::metadata(&snap).expect("snapshot written").len();
    let v = common::load_snapshot_counts(&snap);
    let n = v["device_traces"][0].as_u64().unwrap_or(0);
    println!("{n} events in {size} bytes");
    assert!(n >= 100_000, "{n} events");
    assert!(size < 10 << 20, "{size} bytes");
}

#[test]
fn a_hundred_signals_while_two_threads_allocate_leave_correct_results_and_parsable_snapshots() {
    common::signal_storm_keeps_results_and_snapshots(&trace_prog(), "snap-signals", 100);
}

#[test]
fn an_unwritable_snapshot_path_prints_one_line_and_the_program_goes_on() {
    let out = common::run(
        common::shim_cmd(&trace_prog())
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", "/nonexistent-dir/x/snap.pickle")
            .env("CUSHIM_HISTORY", HISTORY),
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.lines().filter(|l| l.contains("snapshot")).count(),
        1,
        "{stderr}"
    );
}

#[test]
fn a_symlink_planted_at_the_target_is_replaced_not_followed() {
    let dir = common::scratch("snap-symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious").expect("writing victim");
    let snap = dir.join("snap.pickle");
    std::os::unix::fs::symlink(&victim, &snap).expect("planting a symlink");
    common::run_ok(
        common::shim_cmd(&trace_prog())
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious"
    );
    let meta = std::fs::symlink_metadata(&snap).expect("snapshot");
    assert!(meta.file_type().is_file());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    common::load_snapshot(&snap);
}

#[test]
fn expandable_runs_record_segment_map_events_and_expandable_segments() {
    let dir = common::scratch("snap-expandable");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        common::shim_cmd(&trace_prog())
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_ALLOC_CONF", "expandable_segments:True")
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let v = common::load_snapshot(&snap);
    let traces = v["device_traces"][0].as_array().expect("traces");
    assert!(traces.iter().any(|t| t["action"] == "segment_map"));
    let segs = v["segments"].as_array().expect("segments");
    assert!(!segs.is_empty());
    assert!(segs.iter().all(|s| s["is_expandable"] == true));
}

#[test]
fn the_summary_command_reads_a_shim_snapshot() {
    let dir = common::scratch("snap-summary");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        common::shim_cmd(&trace_prog())
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let out = common::run_ok(
        std::process::Command::new(common::cushim_bin())
            .arg("summary")
            .arg(&snap),
    );
    assert!(out.contains("load_weights"), "{out}");
    for fmt in ["json", "msgpack"] {
        let conv = dir.join(format!("snap.{fmt}"));
        common::run_ok(
            std::process::Command::new(common::cushim_bin())
                .arg("convert")
                .arg(&snap)
                .arg(&conv),
        );
        let again = common::run_ok(
            std::process::Command::new(common::cushim_bin())
                .arg("summary")
                .arg(&conv),
        );
        assert_eq!(again, out, "{fmt} summary equals the pickle's");
    }
}

#[test]
fn an_out_of_memory_with_dump_on_oom_writes_a_snapshot_holding_the_oom_event() {
    let dir = common::scratch("snap-oom");
    let out = common::run_oom_dump(&dir, HISTORY);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("out of memory; snapshot written"));
    let v = common::load_snapshot(&dir.join("oom-0.pickle"));
    let traces = v["device_traces"][0].as_array().expect("traces");
    let oom = traces
        .iter()
        .find(|t| t["action"] == "oom")
        .expect("an oom event");
    assert_eq!(oom["size"], 2048u64 << 20);
    assert!(oom["device_free"].as_u64().is_some(), "{oom}");
}

#[test]
fn exit_called_from_another_thread_still_writes_the_snapshot() {
    let dir = common::scratch("snap-exit-thread");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        common::shim_cmd(&trace_prog())
            .arg("exit_thread")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let v = common::load_snapshot(&snap);
    let live: u64 = v["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| s["allocated_size"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(live, 13 << 20, "both live blocks are in the exit snapshot");
}
