//! simcuda's runtime API: allocation, copies, errors, devices, pointer attributes.
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The test program, compiled once per test binary (tests run in parallel).
fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_runtime", &[]))
}

fn case(name: &str, env: &[(&str, &str)]) {
    let mut cmd = common::sim_cmd(exe());
    cmd.arg(name).envs(env.iter().copied());
    let out = common::run_ok(&mut cmd);
    assert!(out.contains(&format!("PASS {name}")), "{out}");
}

#[test]
fn cuda_malloc_of_zero_bytes_succeeds_with_null() {
    case("malloc_zero", &[]);
}

#[test]
fn unknown_and_double_free_return_invalid_value() {
    case("free_unknown_and_double", &[]);
}

#[test]
fn last_error_is_sticky_until_get_last_error() {
    case("last_error_sticky", &[]);
}

#[test]
fn null_out_pointers_return_invalid_value() {
    case("null_out_pointers", &[]);
}

#[test]
fn memcpy_and_memset_move_bytes_through_device_memory() {
    case("memcpy_memset_roundtrip", &[]);
}

#[test]
fn memcpy_rejects_bad_direction_and_non_device_ranges() {
    case("memcpy_bad_arguments", &[]);
}

#[test]
fn capacity_is_enforced_and_mem_get_info_is_exact() {
    case("capacity_oom_and_exact_info", &[("SIMCUDA_MEM_MB", "64")]);
}

#[test]
fn error_names_and_strings_match_cuda() {
    case("error_names_and_strings", &[]);
}

#[test]
fn device_properties_report_name_and_capacity() {
    case("device_properties", &[("SIMCUDA_MEM_MB", "1024")]);
}

#[test]
fn two_devices_have_separate_memory_and_contexts() {
    case("multi_device", &[("SIMCUDA_DEVICES", "2")]);
}

#[test]
fn runtime_makes_the_primary_context_current() {
    case("runtime_makes_primary_context_current", &[]);
}

#[test]
fn pointer_attributes_tell_device_host_and_unregistered_apart() {
    case("pointer_attributes", &[]);
}

#[test]
fn driver_and_runtime_versions_are_12_9() {
    case("versions", &[]);
}

#[test]
fn pinned_host_memory_checks_flags_and_host_capacity() {
    case(
        "pinned_host_flags_and_capacity",
        &[("SIMCUDA_HOST_MEM_MB", "8")],
    );
}

#[test]
fn device_reset_frees_every_allocation() {
    case("device_reset_frees_allocations", &[]);
}

#[test]
fn vector_add_example_links_libcudart_12_and_computes_the_sum() {
    let src = common::artifacts::source_root()
        .join("examples")
        .join("vector_add.c");
    let exe = common::compile_src(&src, "vector_add", &[]);
    let ldd = std::process::Command::new("ldd")
        .arg(&exe)
        .output()
        .unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    assert!(ldd.contains("libcudart.so.12"), "{ldd}");
    let out = common::run_ok(common::sim_cmd(&exe).arg("1000"));
    // sum of 3i for i < 1000
    assert!(out.contains("vector_add: OK n=1000 sum=1498500"), "{out}");
}

#[test]
fn zero_devices_report_no_device() {
    case("no_devices", &[("SIMCUDA_DEVICES", "0")]);
}
