//! Many threads on two devices: no overlap, no corruption, statistics that match the device.
mod common;

#[test]
fn four_threads_on_two_devices_never_corrupt_and_stats_match_the_device() {
    let exe = common::compile("shim_stress", &[]);
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .arg("100000")
            .env("SIMCUDA_DEVICES", "2"),
    );
    assert!(out.contains("failures=0"), "{out}");
    let stats_line = out
        .lines()
        .find_map(|l| l.strip_prefix("stats="))
        .expect("stats line");
    let stats: serde_json::Value = serde_json::from_str(stats_line).expect("stats JSON");
    for dev in 0..2 {
        let s = &stats["devices"][dev];
        assert_eq!(s["allocated_bytes.all.current"], 0, "device {dev}: {s}");
        let used: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("dev{dev} used=")))
            .expect("used line")
            .parse()
            .expect("number");
        assert_eq!(
            s["reserved_bytes.all.current"].as_u64(),
            Some(used),
            "device {dev}"
        );
        assert!(s["allocation.all.allocated"].as_u64().unwrap_or(0) > 1000);
    }
}
