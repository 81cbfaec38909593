//! IPC of blocks inside expandable segments: a block 2 MiB into an expandable segment,
//! written by the exporter, is read by a second process under the shim at the block (its
//! physical pages exported as POSIX descriptors and copied out of the exporter with
//! `pidfd_getfd`), whose writes the exporter then sees; a process without the shim is
//! refused; the importer ends with no mapping, handle or descriptor left. Without the shim
//! the program's blocks are separate allocations and no page is exported, so the reports'
//! export and import counts prove the shim served it.
use crate::common;

fn exe() -> std::path::PathBuf {
    common::compile("sim_ipc", &["-lcuda"])
}

struct Run {
    stdout: String,
    stderr: String,
    exporter: serde_json::Value,
    importer: serde_json::Value,
}

fn run(name: &str, env: &[(&str, &str)]) -> Run {
    let dir = common::scratch(name);
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    let (rep, child) = (dir.join("exporter.json"), dir.join("importer.json"));
    let mut cmd = common::shim_cmd(&exe());
    cmd.arg("export")
        .env("CUSHIM_IPC_DIR", &dir)
        .env("CUSHIM_ALLOC_CONF", "expandable_segments:True")
        .env("SIMCUDA_REPORT", &rep)
        .env("SIM_IPC_CHILD_REPORT", &child)
        .envs(env.iter().copied());
    let out = common::run(&mut cmd);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    Run {
        stdout,
        stderr,
        exporter: common::read_report(&rep),
        importer: common::read_report(&child),
    }
}

fn calls(r: &serde_json::Value, name: &str) -> u64 {
    r["calls"][name].as_u64().unwrap_or(0)
}

#[test]
fn a_block_inside_an_expandable_segment_opens_at_the_block_in_a_second_process() {
    let r = run("ipc-exp-both", &[]);
    assert!(
        r.stdout.contains("imported ok") && r.stdout.contains("PASS export"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("offset_in_pair=2097152"), "{}", r.stdout);
    assert!(
        r.stdout.contains("importer descriptors left 0"),
        "{}",
        r.stdout
    );
    // The exporter's blocks were pages of an expandable segment, exported as descriptors.
    assert_eq!(calls(&r.exporter, "cuMemAlloc_v2"), 0, "{}", r.exporter);
    assert!(
        calls(&r.exporter, "cuMemExportToShareableHandle") >= 1,
        "{}",
        r.exporter
    );
    // The importer mapped them and released everything by exit.
    assert!(
        calls(&r.importer, "cuMemImportFromShareableHandle") >= 1,
        "{}",
        r.importer
    );
    let d = &r.importer["devices"][0];
    assert_eq!(d["live_physical_handles"], 0, "{}", r.importer);
    assert_eq!(d["live_reservations"], 0, "{}", r.importer);
    assert_eq!(d["bytes_in_use"], 0, "{}", r.importer);
    assert_eq!(
        r.stderr.matches("cushim: IPC handle").count(),
        1,
        "{}",
        r.stderr
    );
}

#[test]
fn a_runtime_only_importer_opens_a_block_inside_an_expandable_segment() {
    let r = run("ipc-exp-runtime", &[("SIM_IPC_RUNTIME_IMPORT", "1")]);
    assert!(
        r.stdout.contains("imported ok") && r.stdout.contains("PASS export"),
        "{}",
        r.stdout
    );
    assert!(
        calls(&r.importer, "cuMemImportFromShareableHandle") >= 1,
        "{}",
        r.importer
    );
    assert_eq!(calls(&r.importer, "cuCtxSetCurrent"), 0, "{}", r.importer);
    assert_eq!(
        r.importer["devices"][0]["live_reservations"], 0,
        "{}",
        r.importer
    );
}

#[test]
fn a_process_without_the_shim_is_refused_a_block_inside_an_expandable_segment() {
    let r = run(
        "ipc-exp-refused",
        &[
            ("SIM_IPC_CHILD_NO_SHIM", "1"),
            ("SIM_IPC_EXPECT_REFUSED", "1"),
        ],
    );
    assert!(
        r.stdout.contains("import refused") && r.stdout.contains("PASS export"),
        "{}",
        r.stdout
    );
    assert!(
        calls(&r.exporter, "cuMemExportToShareableHandle") >= 1,
        "{}",
        r.exporter
    );
    assert_eq!(calls(&r.importer, "cuMemImportFromShareableHandle"), 0);
    assert_eq!(r.importer["devices"][0]["live_reservations"], 0);
}

#[test]
fn an_importer_without_ptrace_permission_over_the_exporter_is_refused_with_one_line() {
    // What Yama's ptrace_scope 1 does to an importer that is not the exporter's ancestor:
    // the exporter cannot be ptraced by it (here: the exporter is not dumpable and the
    // importer gave up CAP_SYS_PTRACE), so pidfd_getfd fails with EPERM.
    let r = run(
        "ipc-exp-noptrace",
        &[
            ("SIM_IPC_NOT_DUMPABLE", "1"),
            ("SIM_IPC_DROP_PTRACE", "1"),
            ("SIM_IPC_EXPECT_REFUSED", "1"),
        ],
    );
    assert!(
        r.stdout.contains("import refused") && r.stdout.contains("PASS export"),
        "{}",
        r.stdout
    );
    let lines: Vec<_> = r
        .stderr
        .lines()
        .filter(|l| l.contains("pidfd_getfd"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].contains("Operation not permitted") && lines[0].contains("ptrace permission"),
        "{}",
        r.stderr
    );
    assert!(
        calls(&r.exporter, "cuMemExportToShareableHandle") >= 1,
        "{}",
        r.exporter
    );
    assert_eq!(calls(&r.importer, "cuMemImportFromShareableHandle"), 0);
    assert_eq!(r.importer["devices"][0]["live_reservations"], 0);
}

#[test]
fn an_expandable_blocks_record_replaced_by_a_link_is_refused() {
    let r = run(
        "ipc-exp-link",
        &[("SIM_IPC_TAMPER", "link"), ("SIM_IPC_EXPECT_REFUSED", "1")],
    );
    assert!(r.stdout.contains("import refused"), "{}", r.stdout);
    assert!(r.stderr.contains("is a symbolic link"), "{}", r.stderr);
    assert_eq!(calls(&r.importer, "cuMemImportFromShareableHandle"), 0);
}

#[test]
fn the_export_of_a_block_is_forgotten_when_the_program_frees_it() {
    let dir = common::scratch("ipc-exp-freed");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    let mut cmd = common::shim_cmd(&exe());
    cmd.arg("freed")
        .env("CUSHIM_IPC_DIR", &dir)
        .env("CUSHIM_ALLOC_CONF", "expandable_segments:True");
    let out = common::run_ok(&mut cmd);
    // One record per exported block, removed (descriptors closed) by cuMemFree / cudaFree.
    assert!(
        out.contains("records 2 1 0") && out.contains("PASS freed"),
        "{out}"
    );
    let left = std::fs::read_dir(&dir).expect("listing").count();
    assert_eq!(left, 0, "no record left");
}
