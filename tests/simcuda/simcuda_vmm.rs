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

#[test]
fn copies_and_sets_on_an_unmapped_reservation_fail_with_illegal_address_not_a_fault() {
    case("unmapped_reservation_copies_fail_with_illegal_address", &[]);
}

/// A process holding `mib` MiB of a shared device until its stdin closes.
fn holder(env: &[(&str, &str)], mib: u32) -> std::process::Child {
    use std::io::BufRead;
    let mut child = common::sim_cmd(exe())
        .args(["shared_hold", &mib.to_string()])
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the holder");
    let mut line = String::new();
    let out = child.stdout.take().expect("holder stdout");
    let mut reader = std::io::BufReader::new(out);
    reader.read_line(&mut line).expect("reading the holder");
    assert_eq!(line.trim(), "HELD", "the holder did not get its memory");
    // Kept open, so the holder's last line does not meet a closed pipe.
    child.stdout = Some(reader.into_inner());
    child
}

fn expect_free(env: &[(&str, &str)], mib: u32) {
    let mut cmd = common::sim_cmd(exe());
    cmd.args(["shared_expect", &mib.to_string()])
        .envs(env.iter().copied());
    let out = common::run_ok(&mut cmd);
    assert!(out.contains("PASS shared_expect"), "{out}");
}

#[test]
fn shared_device_capacity_is_split_between_processes_and_a_killed_holder_gives_it_back() {
    let dir = common::scratch("simcuda-shared-ledger");
    let key = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("scratch name")
        .to_string();
    let env = [
        ("SIMCUDA_SHARED", "1"),
        ("SIMCUDA_SHARED_KEY", key.as_str()),
        ("SIMCUDA_MEM_MB", "64"),
    ];
    let mut held = holder(&env, 40);
    // Another process sees the holder's 40 MiB gone: 24 MiB free, 26 MiB do not fit.
    expect_free(&env, 24);
    // Killed while holding its memory (no exit handler runs): its share comes back.
    held.kill().expect("killing the holder");
    held.wait().expect("reaping the holder");
    expect_free(&env, 64);
    // Without the shared mode each process has the whole device.
    let mut own = holder(&env[2..], 40);
    expect_free(&env[2..], 64);
    drop(own.stdin.take());
    assert!(own.wait().expect("holder exit").success());
    let _ = std::fs::remove_file(format!(
        "/dev/shm/simcuda-shared-uid{}-{key}",
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    ));
}

#[test]
fn a_shared_holder_that_exits_normally_gives_its_share_back() {
    let dir = common::scratch("simcuda-shared-exit");
    let key = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("scratch name")
        .to_string();
    let env = [
        ("SIMCUDA_SHARED", "1"),
        ("SIMCUDA_SHARED_KEY", key.as_str()),
        ("SIMCUDA_MEM_MB", "32"),
    ];
    let mut held = holder(&env, 20);
    expect_free(&env, 12);
    drop(held.stdin.take());
    assert!(held.wait().expect("holder exit").success());
    expect_free(&env, 32);
    let _ = std::fs::remove_file(format!(
        "/dev/shm/simcuda-shared-uid{}-{key}",
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    ));
}
