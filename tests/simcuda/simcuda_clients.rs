//! simcuda behaves as a real driver toward published clients: its entry points are its
//! own (an interposer's exports are never handed out as the driver's), devices have UUIDs
//! and answer every attribute CUDA 12.9 defines, asynchronous copies follow CUDA's rules for
//! pageable host memory, and unified-addressing copies work (`cuMemcpy`, `cudaMemcpyDefault`).
use crate::common;

fn case(name: &str, env: &[(&str, &str)], shim: bool) -> String {
    let exe = common::compile("sim_clients", &["-lcuda", "-ldl"]);
    let mut cmd = common::cmd(&exe, shim);
    let out = common::run_ok(cmd.arg(name).envs(env.iter().copied()));
    assert!(out.contains(&format!("PASS {name}")), "{out}");
    out
}

#[test]
fn the_drivers_get_proc_address_hands_out_its_own_functions_even_under_an_interposer() {
    let bare = case("self_bound", &[], false);
    assert!(bare.contains("interposed=0"), "{bare}");
    // Driver interception off: dlsym on the driver's handle gives the driver's own
    // cuGetProcAddress_v2, whose answers must not be the shim's same-named exports (which
    // are in the process: the global cuMemAlloc_v2 is the shim's).
    let out = case("self_bound", &[("CUSHIM_INTERCEPT", "runtime")], true);
    assert!(out.contains("interposed=1"), "{out}");
}

#[test]
fn devices_have_distinct_stable_uuids() {
    let a = case("uuid", &[("SIMCUDA_DEVICES", "2")], false);
    let b = case("uuid", &[("SIMCUDA_DEVICES", "2")], false);
    assert_eq!(a, b, "the same UUID in every process");
}

#[test]
fn every_device_attribute_of_cuda_12_9_is_answered() {
    let out = case("attributes", &[], false);
    assert!(out.contains("attributes=143"), "{out}");
}

#[test]
fn an_async_copy_from_pageable_memory_has_consumed_its_source_on_return() {
    case("pageable_htod_consumes_its_source", &[], false);
}

#[test]
fn an_async_copy_into_pageable_memory_is_complete_on_return_and_pinned_stays_async() {
    case("pageable_dtoh_is_done_on_return", &[], false);
}

#[test]
fn unified_addressing_copies_find_each_sides_kind() {
    case("unified_copies", &[], false);
}
