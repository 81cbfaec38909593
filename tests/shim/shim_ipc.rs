//! IPC handles of cached blocks: a block inside a cached segment, exported
//! by a process under the shim, is opened by a second process under the shim at the block
//! (right bytes, right offset); a process without the shim is refused with CUDA's error and
//! the exporter says so once; a block at its segment's base works for both. Each compared
//! with the same program without the shim.
use crate::common;

fn exe() -> std::path::PathBuf {
    common::compile("sim_ipc", &["-lcuda"])
}

fn run(mode: &str, shim: bool, env: &[(&str, &str)], dir: &std::path::Path) -> (String, String) {
    let mut cmd = common::cmd(&exe(), shim);
    let out = common::run(
        cmd.arg(mode)
            .env("CUSHIM_IPC_DIR", dir)
            .envs(env.iter().copied()),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{mode}: {stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn a_block_inside_a_cached_segment_opens_at_the_block_in_a_second_process_under_the_shim() {
    let dir = common::scratch("shim-ipc-both");
    let (bare, _) = run("export", false, &[], &dir);
    assert!(
        bare.contains("imported ok") && bare.contains("PASS export"),
        "{bare}"
    );
    let (out, stderr) = run("export", true, &[], &dir);
    assert!(
        out.contains("imported ok") && out.contains("PASS export"),
        "{out}"
    );
    // Under the shim the two allocations are neighbours in one segment: the exported block
    // lies 2 MiB into it, which is what the handle had to carry.
    assert!(out.contains("offset_in_pair=2097152"), "{out}");
    assert_eq!(stderr.matches("cushim: IPC handle").count(), 1, "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("listing")
        .map_while(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("cushim-ipc-"))
        .collect();
    assert!(left.is_empty(), "records removed at exit: {left:?}");
}

#[test]
fn a_process_without_the_shim_is_refused_a_block_inside_a_cached_segment_with_one_line() {
    let dir = common::scratch("shim-ipc-refused");
    let (out, stderr) = run(
        "export",
        true,
        &[
            ("SIM_IPC_CHILD_NO_SHIM", "1"),
            ("SIM_IPC_EXPECT_REFUSED", "1"),
        ],
        &dir,
    );
    assert!(
        out.contains("import refused") && out.contains("PASS export"),
        "{out}"
    );
    let lines: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("cushim:"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("without cushim the driver refuses it"),
        "{stderr}"
    );
}

#[test]
fn a_block_at_its_segments_base_gets_the_drivers_handle_and_works_without_the_shim() {
    let dir = common::scratch("shim-ipc-base");
    // The exporter waits for its importer, so its report (written at its exit) is the last.
    let report = dir.join("report.json");
    let report_env = report.to_str().expect("a UTF-8 path");
    let (out, stderr) = run(
        "export-first",
        true,
        &[
            ("SIM_IPC_CHILD_NO_SHIM", "1"),
            ("SIMCUDA_REPORT", report_env),
        ],
        &dir,
    );
    assert!(
        out.contains("imported ok") && out.contains("PASS export"),
        "{out}"
    );
    assert!(!stderr.contains("cushim: IPC handle"), "{stderr}");
    // Both blocks came from one cached segment: the exporter's device saw one allocation.
    let r = common::read_report(&report);
    assert_eq!(r["calls"]["cuMemAlloc_v2"], 1, "{}", r["calls"]);
    let (out, _) = run("export-first", true, &[], &dir);
    assert!(
        out.contains("imported ok") && out.contains("PASS export"),
        "{out}"
    );
}

#[test]
fn the_record_of_a_block_inside_a_cached_segment_is_removed_when_the_program_frees_it() {
    let dir = common::scratch("shim-ipc-freed");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    // Two blocks inside one cached segment, exported through the driver and the runtime:
    // two records, one gone after cuMemFree, none after cudaFree, all while running.
    let (out, _) = run("freed", true, &[], &dir);
    assert!(
        out.contains("records 2 1 0") && out.contains("PASS freed"),
        "{out}"
    );
    let left = std::fs::read_dir(&dir).expect("listing").count();
    assert_eq!(left, 0, "no record left");
}
