//! simcuda's managed, pitched/3D, pool and host-registration entry points behave as CUDA
//! documents them: sizes, pitches, flags, errors and the device ledger.
use crate::common;

fn case(name: &str) {
    let exe = common::compile("sim_families", &["-lcuda"]);
    let out = common::run_ok(common::sim_cmd(&exe).arg(name));
    assert!(out.contains(&format!("PASS {name}")), "{out}");
}

#[test]
fn managed_memory_is_host_accessible_charged_to_the_device_and_checks_its_flags() {
    case("managed");
}

#[test]
fn pitched_and_3d_allocations_round_the_pitch_to_512_and_check_the_element_size() {
    case("pitched");
}

#[test]
fn pool_allocations_come_from_a_pools_device_and_pools_can_be_created_and_destroyed() {
    case("pools");
}

#[test]
fn host_registrations_refuse_overlaps_and_unknown_ranges() {
    case("host_register");
}
