//! Fail open: a failure inside the shim (injected with `CUSHIM_TEST_FAULT`) at any of its
//! points sends that call to CUDA unchanged and turns caching off for new allocations, with
//! one line; the program's results equal those without the shim. The line proves the shim
//! was on the path and failed there.
use crate::common;

fn exe() -> std::path::PathBuf {
    common::compile("failopen_work", &["-lcuda", "-ldl"])
}

fn bare() -> String {
    common::run_ok(&mut common::sim_cmd(&exe()))
}

/// Run under the shim with the fault `fault` (and `mode` as `CUSHIM_MODE` when given):
/// stdout, stderr.
fn with_fault(fault: &str, mode: Option<&str>) -> (String, String) {
    let mut c = common::shim_cmd(&exe());
    c.env("CUSHIM_TEST_FAULT", fault);
    if let Some(m) = mode {
        c.env("CUSHIM_MODE", m);
    }
    let out = common::run(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{fault}: {}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

#[test]
fn a_fault_at_any_point_leaves_the_programs_results_as_without_the_shim() {
    let expect = bare();
    assert!(expect.contains("vmm="), "{expect}");
    for (fault, mode) in [
        ("runtime@1", None),
        ("runtime@4", None),
        ("runtime@9", None),
        ("driver@1", None),
        ("driver@3", None),
        ("pinned@1", None),
        ("pinned@3", None),
        ("vmm@1", None),
        ("vmm@3", None),
        ("observe@2", Some("observe")),
        ("observe@9", Some("observe")),
        ("stream@1", None),
        ("stream@2", None),
    ] {
        let (out, err) = with_fault(fault, mode);
        // The same results, and with caching off the cache gave back what it held.
        assert_eq!(out, expect, "{fault}: the same results\n{err}");
        assert_eq!(
            err.matches("cushim: internal error in").count(),
            1,
            "{fault}: one line, from the point that failed: {err}"
        );
    }
}

#[test]
fn a_failed_start_up_passes_every_call_through() {
    let (out, err) = with_fault("init", None);
    assert_eq!(out, bare());
    assert_eq!(
        err.matches("cushim: internal error while starting").count(),
        1,
        "{err}"
    );
}

#[test]
fn without_a_fault_the_same_program_is_served_by_the_cache() {
    let dir = common::scratch("failopen-served");
    let report = dir.join("report.json");
    let out = common::run_ok(
        common::shim_cmd(&exe())
            .env("SIMCUDA_REPORT", &report)
            .env("CUSHIM_TEST_FAULT", ""),
    );
    // The same results; the cache keeps what it holds (used_end is larger).
    let results = |o: &str| -> Vec<String> {
        o.lines()
            .filter(|l| !l.starts_with("used_end="))
            .map(String::from)
            .collect()
    };
    assert_eq!(results(&out), results(&bare()));
    // The cache made fewer device allocations than the program's 13 device allocations.
    let r = common::read_report(&report);
    let allocs = r["calls"]["cuMemAlloc_v2"].as_i64().unwrap_or(0)
        + r["calls"]["cudaMalloc"].as_i64().unwrap_or(0);
    assert!(allocs > 0 && allocs < 13, "{r}");
}

fn ipc_exe() -> std::path::PathBuf {
    common::compile("failopen_ipc", &["-lcuda"])
}

/// Run `failopen_ipc` (exporter and importer, two devices), under the shim when `shim`,
/// with the fault `exporter` in the exporter and `importer` in the importer: stdout, stderr.
fn ipc_run(shim: bool, exporter: Option<&str>, importer: Option<&str>) -> (String, String) {
    let tag = format!("{shim}-{exporter:?}-{importer:?}").replace(['"', '@', ' '], "_");
    let dir = common::scratch(&format!("failopen-ipc-{tag}"));
    let mut c = common::cmd(&ipc_exe(), shim);
    c.env("CUSHIM_IPC_DIR", &dir).env("SIMCUDA_DEVICES", "2");
    if let Some(f) = exporter {
        c.env("CUSHIM_TEST_FAULT", f);
    }
    if let Some(f) = importer {
        c.env("FAULT_IMPORTER", f);
    }
    let out = common::run(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{tag}: {}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// `out` with the lines about block b (and only those) taken out.
fn without_b(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.contains("_b="))
        .collect::<Vec<_>>()
}

#[test]
fn an_ipc_or_peer_fault_where_the_driver_answers_the_programs_own_call_changes_no_result() {
    let (expect, _) = ipc_run(false, None, None);
    assert!(
        expect.contains("open_b=0") && expect.contains("mark_b=44"),
        "{expect}"
    );
    let (out, err) = ipc_run(true, None, None);
    assert_eq!(out, expect, "no fault: {err}");
    assert!(
        err.contains("cushim: IPC handle of block"),
        "b is inside a cached segment: {err}"
    );
    // Exporter: a's export (a block at its segment's base: the driver's handle is exact);
    // every peer point, before and after each of the four real calls. Importer: the open of
    // a's (driver) handle, the close of a, and the close of b after its real call.
    let mut cases: Vec<(Option<String>, Option<&str>)> =
        (1..=8).map(|n| (Some(format!("peer@{n}")), None)).collect();
    cases.push((Some("ipc@1".into()), None));
    for f in ["ipc@1", "ipc@4", "ipc@6"] {
        cases.push((None, Some(f)));
    }
    for (exporter, importer) in cases {
        let (out, err) = ipc_run(true, exporter.as_deref(), importer);
        let what = format!("{exporter:?} {importer:?}");
        assert_eq!(out, expect, "{what}: the same results\n{err}");
        assert_eq!(
            err.matches("cushim: internal error in").count(),
            1,
            "{what}: one line, from the point that failed: {err}"
        );
    }
}

#[test]
fn after_an_ipc_fault_a_block_inside_a_segment_is_refused_never_another_blocks_bytes() {
    let (expect, _) = ipc_run(false, None, None);
    // Exporter, before and after the real call of b's export: the driver's handle would
    // name the segment (a's bytes), so the export is refused (not supported) and nothing
    // else changes.
    for f in ["ipc@2", "ipc@3"] {
        let (out, err) = ipc_run(true, Some(f), None);
        assert!(out.contains("get_b=801\n"), "{f}: {out}\n{err}");
        assert!(
            out.contains("open_b=-1\n") && out.contains("mark_b=22\n"),
            "{out}"
        );
        assert_eq!(without_b(&out), without_b(&expect), "{f}\n{err}");
        assert_eq!(err.matches("cushim: internal error in").count(), 1, "{err}");
    }
    // Importer, before the real open of b's cushim handle (forwarded: the driver refuses
    // it) and after it (the segment closed again): invalid value, as in a process without
    // cushim.
    for f in ["ipc@2", "ipc@3"] {
        let (out, err) = ipc_run(true, None, Some(f));
        assert!(out.contains("open_b=1\n"), "{f}: {out}\n{err}");
        assert!(out.contains("mark_b=22\n"), "{out}");
        assert_eq!(without_b(&out), without_b(&expect), "{f}\n{err}");
        assert_eq!(err.matches("cushim: internal error in").count(), 1, "{err}");
    }
    // Importer, before the real close of b's import: forwarded with the program's pointer
    // (inside the segment the driver mapped), which the driver refuses; b's bytes were
    // read and marked as without the shim.
    let (out, err) = ipc_run(true, None, Some("ipc@5"));
    assert!(out.contains("close_b=1\n"), "{out}\n{err}");
    let same: Vec<&str> = out.lines().filter(|l| !l.starts_with("close_b=")).collect();
    let expected: Vec<&str> = expect
        .lines()
        .filter(|l| !l.starts_with("close_b="))
        .collect();
    assert_eq!(same, expected, "{err}");
    assert_eq!(err.matches("cushim: internal error in").count(), 1, "{err}");
}
