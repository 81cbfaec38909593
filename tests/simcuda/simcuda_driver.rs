//! simcuda's driver API: initialisation and context strictness, allocation, copies, queries.
use crate::common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The test program, compiled once per test binary (tests run in parallel).
fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_driver", &[]))
}

fn case(name: &str, env: &[(&str, &str)]) {
    let mut cmd = common::sim_cmd(exe());
    cmd.arg(name).envs(env.iter().copied());
    let out = common::run_ok(&mut cmd);
    assert!(out.contains(&format!("PASS {name}")), "{out}");
}

#[test]
fn driver_calls_before_cu_init_return_not_initialized() {
    case("calls_before_init_fail", &[]);
}

#[test]
fn memory_calls_without_a_current_context_return_invalid_context() {
    case("memory_calls_need_a_context", &[]);
}

#[test]
fn cu_mem_alloc_and_free_reject_bad_arguments() {
    case("alloc_free_errors", &[]);
}

#[test]
fn allocations_are_512_aligned_disjoint_and_all_returned() {
    case("allocations_are_aligned_and_disjoint", &[]);
}

#[test]
fn address_range_finds_the_allocation_of_an_interior_pointer() {
    case("address_range_of_interior_pointer", &[]);
}

#[test]
fn driver_copies_and_sets_check_device_ranges() {
    case("copies_and_sets", &[]);
}

#[test]
fn driver_error_names_and_strings_match_cuda() {
    case("error_names", &[]);
}

#[test]
fn device_queries_report_version_name_capacity_and_vmm_support() {
    case("device_queries", &[("SIMCUDA_MEM_MB", "512")]);
}

#[test]
fn simcuda_vmm_0_disables_virtual_memory_management() {
    case("vmm_disabled", &[("SIMCUDA_VMM", "0")]);
}

#[test]
fn primary_context_retain_and_release_are_counted() {
    case("primary_context_refcount", &[]);
}

#[test]
fn concurrent_allocation_from_eight_threads_keeps_blocks_disjoint_and_ledger_exact() {
    case("concurrent_alloc_free", &[]);
}
