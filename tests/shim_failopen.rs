//! Fail open: a failure inside the shim (injected with `CUSHIM_TEST_FAULT`) at any of its
//! points sends that call to CUDA unchanged and turns caching off for new allocations, with
//! one line; the program's results equal those without the shim. The line proves the shim
//! was on the path and failed there.
mod common;

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
