//! The shim reaches the driver as the CUDA runtime does: through `cuGetProcAddress_v2` of the
//! `libcuda.so.1` the process uses. A forwarding wrapper that exports only `cuInit` and
//! `cuGetProcAddress_v2` (written here in C, `tests/c/gpa_wrapper.c`) sits in front of
//! simcuda: a runtime program gives the same results with and without the shim, and every
//! device allocation the shim's cache makes passes through the wrapper.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const MIB: i64 = 1 << 20;

/// The wrapper's directory (`libcuda.so.1`), built once per test binary.
fn wrapper_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::build_dir()
            .join("test-bin")
            .join(format!("gpa-wrapper-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the wrapper's directory");
        let src = common::artifacts::source_root().join("tests/c/gpa_wrapper.c");
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O1", "-g", "-shared", "-fPIC", "-Wall", "-pthread"])
            .arg(&src)
            .arg("-o")
            .arg(dir.join("libcuda.so.1"))
            .args(["-Wl,-soname,libcuda.so.1", "-ldl"])
            .output()
            .expect("running cc");
        assert!(
            out.status.success(),
            "building the wrapper:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// `exe` with the wrapper first on the library path, with or without the shim.
fn cmd(exe: &Path, shim: bool, dir: &Path) -> Command {
    let mut c = common::cmd(exe, shim);
    c.env(
        "LD_LIBRARY_PATH",
        format!(
            "{}:{}",
            wrapper_dir().display(),
            common::sim_lib_dir().display()
        ),
    )
    .env(
        "WRAP_REAL_DRIVER",
        common::sim_lib_dir().join("libcuda.so.1"),
    )
    .env("WRAP_REPORT", dir.join("wrap.txt"))
    .env("SIMCUDA_REPORT", dir.join("report.json"));
    c
}

/// Run `shim_frag <mode>` with and without the shim under `conf`: (bare output, shim output,
/// wrapper counts of the shim run, simcuda's report of the shim run).
fn frag_both(
    tag: &str,
    mode: &str,
    conf: &str,
) -> (
    String,
    String,
    std::collections::HashMap<String, String>,
    serde_json::Value,
) {
    let exe = common::compile("shim_frag", &[]);
    let bare_dir = common::scratch(&format!("{tag}-bare"));
    let bare = common::run_ok(cmd(&exe, false, &bare_dir).arg(mode));
    let dir = common::scratch(&format!("{tag}-shim"));
    let out = common::run(
        cmd(&exe, true, &dir)
            .arg(mode)
            .env("CUSHIM_ALLOC_CONF", conf),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains("cushim:"),
        "no complaint from the shim: {stderr}"
    );
    let wrap = std::fs::read_to_string(dir.join("wrap.txt")).expect("the wrapper's report");
    (
        bare,
        stdout,
        common::kv(&wrap),
        common::read_report(&dir.join("report.json")),
    )
}

#[test]
fn a_wrapper_exporting_only_get_proc_address_sees_every_cache_allocation() {
    let (bare, shim, wrap, report) = frag_both("gpa-frag", "reverse", "");
    let (b, s) = (common::kv(&bare), common::kv(&shim));
    assert_eq!(common::num(&b, "used_after"), 128 * MIB, "{bare}");
    assert_eq!(
        common::num(&s, "used_after"),
        common::num(&b, "used_after"),
        "the same result with and without the shim"
    );
    // The shim's cache served the program ...
    let cache_allocs = common::num(&s, "device_allocs");
    assert!(cache_allocs > 0, "{shim}");
    // ... and each of its device allocations went down through the wrapper.
    assert_eq!(common::num(&wrap, "allocs"), cache_allocs, "{wrap:?}");
    assert_eq!(
        report["calls"]["cuMemAlloc_v2"].as_i64(),
        Some(cache_allocs),
        "{report}"
    );
}

#[test]
fn expandable_segments_map_memory_created_through_the_wrapper() {
    let (bare, shim, wrap, report) =
        frag_both("gpa-expandable", "forward", "expandable_segments:True");
    let (b, s) = (common::kv(&bare), common::kv(&shim));
    assert_eq!(
        common::num(&s, "used_after"),
        common::num(&b, "used_after"),
        "{bare}\n{shim}"
    );
    let creates = report["calls"]["cuMemCreate"]
        .as_i64()
        .expect("simcuda counted cuMemCreate");
    assert!(
        creates > 0,
        "the cache mapped expandable segments: {report}"
    );
    assert_eq!(common::num(&wrap, "creates"), creates, "{wrap:?}");
    assert_eq!(common::num(&wrap, "allocs"), 0, "{wrap:?}");
}

/// Run `shim_frag <mode>` under the shim with the wrapper hiding `hide` and `conf`:
/// (bare output, shim output, shim stderr, wrapper counts).
fn hiding(
    tag: &str,
    mode: &str,
    conf: &str,
    hide: &str,
) -> (
    String,
    String,
    String,
    std::collections::HashMap<String, String>,
) {
    let exe = common::compile("shim_frag", &[]);
    let bare_dir = common::scratch(&format!("{tag}-bare"));
    let bare = common::run_ok(cmd(&exe, false, &bare_dir).arg(mode));
    let dir = common::scratch(&format!("{tag}-shim"));
    let out = common::run(
        cmd(&exe, true, &dir)
            .arg(mode)
            .env("CUSHIM_ALLOC_CONF", conf)
            .env("WRAP_HIDE", hide),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let wrap = std::fs::read_to_string(dir.join("wrap.txt")).expect("the wrapper's report");
    (bare, stdout, stderr, common::kv(&wrap))
}

#[test]
fn a_driver_without_the_vmm_functions_turns_expandable_segments_off_with_one_line() {
    let (bare, shim, err, wrap) = hiding(
        "gpa-novmm",
        "reverse",
        "expandable_segments:True",
        "cuMemCreate",
    );
    assert_eq!(
        common::kv(&shim)["used_after"],
        common::kv(&bare)["used_after"],
        "{err}"
    );
    assert_eq!(
        err.matches("cushim:").count(),
        1,
        "one line, and no other complaint: {err}"
    );
    assert!(
        err.contains("expandable segments unavailable on device 0"),
        "{err}"
    );
    // The cache served the program with plain segments, through the wrapper.
    let cache_allocs = common::num(&common::kv(&shim), "device_allocs");
    assert!(cache_allocs > 0, "{shim}");
    assert_eq!(common::num(&wrap, "allocs"), cache_allocs, "{wrap:?}");
    assert_eq!(common::num(&wrap, "creates"), 0, "{wrap:?}");
}

#[test]
fn a_driver_without_a_core_function_leaves_every_call_to_cuda() {
    let (bare, shim, err, _) = hiding("gpa-nocore", "reverse", "", "cuEventRecord");
    assert_eq!(
        common::kv(&shim)["used_after"],
        common::kv(&bare)["used_after"],
        "{err}"
    );
    assert!(
        err.contains("has no cuEventRecord; passing every call through"),
        "{err}"
    );
    assert_eq!(err.matches("cushim:").count(), 1, "{err}");
    // Nothing was cached: the shim's statistics are not there.
    assert_eq!(
        common::num(&common::kv(&shim), "device_allocs"),
        -1,
        "{shim}"
    );
}
