//! simcuda across devices and processes (`SIMCUDA_DEVICES=2`): `cudaDeviceProp` agrees with
//! the driver's attributes field by field; peer queries, enabling and copies answer the same
//! through both APIs; asynchronous peer copies are stream-ordered; virtual-memory access is per device; a physical allocation exported as
//! a POSIX descriptor is imported by a second process that sees and changes the same bytes.
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_peer", &["-lcuda"]))
}

fn case(name: &str) -> String {
    let mut cmd = common::sim_cmd(exe());
    cmd.arg(name).env("SIMCUDA_DEVICES", "2");
    let out = common::run_ok(&mut cmd);
    assert!(out.contains(&format!("PASS {name}")), "{out}");
    out
}

#[test]
fn every_device_prop_field_equals_the_drivers_attribute() {
    let out = case("props");
    assert!(out.contains("fields compared 224"), "{out}");
}

#[test]
fn peer_access_and_peer_copies_answer_the_same_through_both_apis() {
    case("peer");
}

#[test]
fn async_peer_copies_return_at_once_and_run_in_stream_order_through_both_apis() {
    case("peer_async");
}

#[test]
fn virtual_memory_access_is_per_device_and_retained_handles_count() {
    case("vmm_access");
}

#[test]
fn an_exported_descriptor_is_imported_by_another_process_onto_the_same_bytes() {
    let out = case("vmm_share");
    assert!(out.contains("child imported ok"), "{out}");
}
