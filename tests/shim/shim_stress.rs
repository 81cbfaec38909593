//! Many threads on two devices: no overlap, no corruption, statistics that match the device.
use crate::common;

#[test]
fn four_threads_on_two_devices_never_corrupt_and_stats_match_the_device() {
    let exe = common::compile("shim_stress", &[]);
    common::stress_never_corrupts_and_stats_match_the_device(&exe, 100_000);
}
