//! simcuda installed as CUDA 13's runtime (`libcudart.so.13`, versioned exports): a C program
//! linked against it records `libcudart.so.13` and `cudaMalloc@libcudart.so.13`, and under
//! the shim (whose unversioned exports interpose versioned references) passes the seed
//! fragmentation scenario and the snapshot test.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

fn layout13() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        cushim_testsupport::sim13::sim_layout_13(common::build_dir())
            .expect("laying out simcuda as CUDA 13")
    })
}

/// `tests/c/<name>.c` linked with `-lcudart` from the CUDA 13 layout.
fn prog13(name: &str) -> PathBuf {
    prog13_with(name, &[])
}

/// [`prog13`] with extra link arguments (built once per process, through
/// `common::test_program`, so tests needing the same program never run a half-written one).
fn prog13_with(name: &str, extra: &[&str]) -> PathBuf {
    let src = common::artifacts::source_root()
        .join("tests/c")
        .join(format!("{name}.c"));
    common::test_program(&format!("{name}-cuda13"), extra, |tmp| {
        common::artifacts::compile_c(&src, tmp, layout13(), extra)
    })
}

fn cmd13(exe: &Path, shim: bool) -> Command {
    let mut c = common::cmd(exe, shim);
    c.env("LD_LIBRARY_PATH", layout13());
    c
}

#[test]
fn a_program_linked_against_cuda_13_records_versioned_references() {
    let exe = prog13("shim_frag");
    let dynamic = Command::new("readelf")
        .args(["-d", "--dyn-syms", "-W"])
        .arg(&exe)
        .output()
        .expect("running readelf");
    let text = String::from_utf8_lossy(&dynamic.stdout);
    assert!(text.contains("Shared library: [libcudart.so.13]"), "{text}");
    assert!(text.contains("cudaMalloc@libcudart.so.13"), "{text}");
    let out = common::run_ok(cmd13(&exe, false).arg("reverse"));
    assert!(out.contains("used_after="), "{out}");
}

#[test]
fn the_cuda_13_install_reports_cuda_13_and_the_12_install_12_9() {
    let exe = prog13_with("sim_clients", &["-lcuda", "-ldl"]);
    let out = common::run_ok(cmd13(&exe, false).arg("versions"));
    assert!(out.contains("version=13020"), "{out}");
    let exe12 = common::compile("sim_clients", &["-lcuda", "-ldl"]);
    let out = common::run_ok(common::sim_cmd(&exe12).arg("versions"));
    assert!(out.contains("version=12090"), "{out}");
    let out = common::run_ok(
        common::sim_cmd(&exe12)
            .arg("versions")
            .env("SIMCUDA_CUDA_VERSION", "13050"),
    );
    assert!(out.contains("version=13050"), "{out}");
}

#[test]
fn the_seed_scenario_passes_under_the_shim_with_cuda_13() {
    let exe = prog13("shim_frag");
    for (mode, want) in [("forward", 256 * MIB), ("reverse", 128 * MIB)] {
        let dir = common::scratch(&format!("cuda13-frag-{mode}"));
        let report = dir.join("report.json");
        let out = common::run_ok(cmd13(&exe, true).arg(mode).env("SIMCUDA_REPORT", &report));
        let m = common::kv(&out);
        assert_eq!(common::num(&m, "used_after") as u64, want, "{mode}: {out}");
        let r = common::read_report(&report);
        assert_eq!(r["devices"][0]["peak_bytes_in_use"], want, "{mode}");
        assert_eq!(
            r["calls"]["cudaMalloc"], 0,
            "every cudaMalloc reached the shim: {r}"
        );
    }
}

#[test]
fn the_snapshot_test_passes_under_the_shim_with_cuda_13() {
    let exe = prog13("shim_trace");
    // Run through the shared check with the CUDA 13 layout first on the library path.
    let dir = common::scratch("cuda13-snap");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        cmd13(&exe, true)
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    let v = common::load_snapshot(&snap);
    let weights = common::call_line("shim_trace.c", "load_weights", "cudaMalloc(");
    let act = common::call_line("shim_trace.c", "make_activation", "cudaMalloc(");
    let traces = v["device_traces"][0].as_array().expect("device_traces[0]");
    let from = |name: &str, line: u64| {
        traces.iter().any(|t| {
            t["action"] == "alloc" && common::is_frame(&t["frames"][0], "shim_trace.c", name, line)
        })
    };
    assert!(from("load_weights", weights), "load_weights:{weights}");
    assert!(from("make_activation", act), "make_activation:{act}");
}
