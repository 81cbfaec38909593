//! simcuda's virtual memory management really maps: reserve, create, map, set access,
//! unmap, release, with CUDA's errors, capacity accounting and faults on unmapped pages.
use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The test program, compiled once per test binary (tests run in parallel).
fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("sim_vmm", &[]))
}

fn case(name: &str, env: &[(&str, &str)]) {
    let mut cmd = common::sim_cmd(exe());
    cmd.arg(name).envs(env.iter().copied());
    let out = common::run_ok(&mut cmd);
    assert!(out.contains(&format!("PASS {name}")), "{out}");
}

fn dies_of_sigsegv(name: &str) {
    let out = common::run(common::sim_cmd(exe()).arg(name));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("touching"),
        "did not reach the touch: {stderr}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "{:?}: {stderr}",
        out.status
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("survived"));
}

#[test]
fn mapped_memory_is_usable_after_set_access_and_returned_after_release() {
    case("map_access_unmap_roundtrip", &[]);
}

#[test]
fn physical_memory_keeps_its_contents_when_remapped_elsewhere() {
    case("remap_physical_memory_keeps_contents", &[]);
}

#[test]
fn misaligned_out_of_range_overlapping_and_unmapped_ranges_are_rejected() {
    case("bad_maps_are_rejected", &[]);
}

#[test]
fn released_physical_memory_stays_charged_until_unmapped() {
    case("release_while_mapped_frees_at_unmap", &[]);
}

#[test]
fn physical_memory_counts_against_device_capacity() {
    case(
        "physical_memory_counts_against_capacity",
        &[("SIMCUDA_MEM_MB", "5")],
    );
}

#[test]
fn touching_mapped_memory_without_access_kills_the_process() {
    dies_of_sigsegv("touch_mapped_without_access");
}

#[test]
fn touching_an_unmapped_page_kills_the_process() {
    dies_of_sigsegv("touch_after_unmap");
}

#[test]
fn report_counts_live_reservations_handles_and_allocations() {
    let dir = common::scratch("simcuda-vmm-report");
    let report = dir.join("report.json");
    case(
        "leave_vmm_objects_live",
        &[("SIMCUDA_REPORT", report.to_str().unwrap())],
    );
    let r = common::read_report(&report);
    let d = &r["devices"][0];
    assert_eq!(d["live_reservations"], 1);
    assert_eq!(d["live_physical_handles"], 1);
    assert_eq!(d["live_allocations"], 1);
    assert_eq!(d["bytes_in_use"], (2u64 << 20) + 1024);
    assert_eq!(r["calls"]["cuMemMap"], 1);
}
