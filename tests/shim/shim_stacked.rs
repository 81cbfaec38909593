//! cushim beside another interposer: a forwarding `libcuda.so.1` (written here in C, built
//! like HAMi-core's `libvgpu.so`: it dlopens the real driver by path and looks its functions,
//! `cuGetProcAddress_v2` included, up with `dlsym` on that handle) sits between the shim and
//! simcuda. Each call passes each layer once: the seed scenario, the error codes and the
//! snapshot come out as without the wrapper, and the wrapper sees the device traffic.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

/// The wrapper's directory (`libcuda.so.1` and `libcuda.so`), built once per test binary.
fn wrapper_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::build_dir()
            .join("test-bin")
            .join(format!("stack-wrapper-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the wrapper's directory");
        // Every driver function simcuda exports, except those the wrapper writes itself.
        let nm = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(common::build_dir().join("libsimcuda.so"))
            .output()
            .expect("running nm");
        assert!(nm.status.success(), "nm failed");
        let names: String = String::from_utf8_lossy(&nm.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|n| n.starts_with("cu") && !n.starts_with("cuda"))
            .filter(|n| !n.starts_with("cuGetProcAddress") && !n.starts_with("cuIpcOpenMemHandle"))
            .map(|n| format!("FWD({n})\n"))
            .collect();
        let header = dir.join("wrap_names.h");
        std::fs::write(&header, names).expect("writing the name list");
        let src = common::artifacts::source_root().join("tests/c/stack_wrapper.c");
        let lib = dir.join("libcuda.so.1");
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O1", "-g", "-shared", "-fPIC", "-Wall", "-pthread"])
            .arg(format!("-DWRAP_NAMES=\"{}\"", header.display()))
            .arg(&src)
            .arg("-o")
            .arg(&lib)
            .args(["-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic", "-ldl"])
            .output()
            .expect("running cc");
        assert!(
            out.status.success(),
            "building the wrapper:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let link = dir.join("libcuda.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libcuda.so.1", &link).expect("linking libcuda.so");
        dir
    })
}

/// `tests/c/<name>.c` linked to the wrapper as its `libcuda.so.1`.
fn prog(name: &str) -> PathBuf {
    let src = common::artifacts::source_root()
        .join("tests/c")
        .join(format!("{name}.c"));
    let lib = wrapper_dir().join("libcuda.so.1");
    let lib = lib.to_str().expect("a UTF-8 path");
    common::compile_src(&src, &format!("{name}-stacked"), &[lib, "-ldl", "-lm"])
}

/// A command for `exe` with the wrapper first on the library path, with or without the shim.
fn cmd(exe: &Path, shim: bool, report: &Path) -> Command {
    let mut c = common::cmd(exe, shim);
    let ld = format!(
        "{}:{}",
        wrapper_dir().display(),
        common::sim_lib_dir().display()
    );
    c.env("LD_LIBRARY_PATH", ld)
        .env(
            "WRAP_REAL_DRIVER",
            common::sim_lib_dir().join("libcuda.so.1"),
        )
        .env("WRAP_REPORT", report);
    c
}

fn wrapper_counts(report: &Path) -> std::collections::HashMap<String, String> {
    let text = std::fs::read_to_string(report).expect("the wrapper's report");
    common::kv(&text)
}

#[test]
fn the_seed_scenario_is_served_through_a_forwarding_driver_wrapper() {
    let exe = prog("driver_frag");
    let dir = common::scratch("stacked-frag");
    let (wrap, sim) = (dir.join("wrap.txt"), dir.join("report.json"));
    let out = common::run_ok(
        cmd(&exe, true, &wrap)
            .arg("reverse")
            .env("SIMCUDA_REPORT", &sim),
    );
    let m = common::kv(&out);
    assert_eq!(common::num(&m, "used_after") as u64, 128 * MIB, "{out}");
    let report = common::read_report(&sim);
    assert_eq!(report["devices"][0]["peak_bytes_in_use"], 128 * MIB);
    // The shim's device allocations went down through the wrapper.
    let w = wrapper_counts(&wrap);
    assert!(common::num(&w, "allocs") > 0, "{w:?}");
    assert_eq!(
        report["calls"]["cuMemAlloc_v2"].as_i64(),
        Some(common::num(&w, "allocs")),
        "every device allocation passed the wrapper once"
    );
    // The cache served it: four 32 MiB segments for the program's twelve allocations.
    assert_eq!(common::num(&m, "device_allocs"), 4, "{out}");
    assert_eq!(common::num(&w, "allocs"), 4, "{w:?}");
}

#[test]
fn error_codes_through_a_forwarding_driver_wrapper_match_the_bare_driver() {
    let exe = prog("driver_errors");
    let dir = common::scratch("stacked-errors");
    let bare = common::run_ok(&mut cmd(&exe, false, &dir.join("bare.txt")));
    let out = common::run(&mut cmd(&exe, true, &dir.join("shim.txt")));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, bare, "the same codes with and without the shim");
    assert_eq!(common::num(&common::kv(&stdout), "free_double"), 1);
    assert_eq!(stderr.matches("double free").count(), 2, "{stderr}");
}

#[test]
fn the_snapshot_through_a_forwarding_driver_wrapper_names_the_programs_call_sites() {
    let exe = prog("driver_trace");
    let dir = common::scratch("stacked-snap");
    let snap = dir.join("snap.pickle");
    common::run_ok(
        cmd(&exe, true, &dir.join("wrap.txt"))
            .arg("sites")
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    let v = common::load_snapshot(&snap);
    let act = common::call_line("driver_trace.c", "make_activation", "cuMemAlloc(");
    let traces = v["device_traces"][0].as_array().expect("device_traces[0]");
    let allocs: Vec<_> = traces.iter().filter(|t| t["action"] == "alloc").collect();
    assert_eq!(allocs.len(), 12);
    let from_site = allocs
        .iter()
        .filter(|t| common::is_frame(&t["frames"][0], "driver_trace.c", "make_activation", act))
        .count();
    assert_eq!(from_site, 11, "allocs from make_activation:{act}");
}

#[test]
fn dlsym_and_get_proc_address_through_a_forwarding_driver_wrapper_do_not_recurse() {
    // driver_dlsym looks entry points up with dlsym on a libcuda handle and through
    // cuGetProcAddress, then allocates through what it got.
    let exe = prog("driver_dlsym");
    let dir = common::scratch("stacked-dlsym");
    let (wrap, sim) = (dir.join("wrap.txt"), dir.join("report.json"));
    let out = common::run_ok(cmd(&exe, true, &wrap).env("SIMCUDA_REPORT", &sim));
    // What the program got on the wrapper's handle is the shim's hook.
    assert!(
        out.lines()
            .any(|l| l == "cuda:cuMemAlloc_v2=shim:cuMemAlloc_v2"),
        "{out}"
    );
    let w = wrapper_counts(&wrap);
    assert!(common::num(&w, "gpa") > 0, "{w:?}");
    // Hooks obtained through dlsym and cuGetProcAddress forward to the wrapper too.
    let report = common::read_report(&sim);
    assert_eq!(
        report["calls"]["cuMemAlloc_v2"].as_i64(),
        Some(common::num(&w, "allocs")),
        "every device allocation passed the wrapper once: {report}"
    );
}
