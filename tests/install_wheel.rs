//! The wheel as a user gets it: built here with maturin (scripts/build-wheel.sh), installed
//! with pip into a fresh virtual environment, and run from that environment with nothing
//! but the environment's `bin/` on PATH (no Rust, no C compiler): `cushim demo`, `cushim
//! run --sim` of a prebuilt C program and of a Python script calling the CUDA runtime
//! through ctypes. Every snapshot is read back with the installed `cushim` and must show
//! that the shim served the program's allocations.
//!
//! The wheel is built in the test binary's profile (a debug wheel under `cargo test`,
//! reusing the build the other tests use). maturin is taken from `MATURIN`, PATH, or a
//! private virtual environment in `target/` (installed from the package registry once);
//! when none can be had the test is skipped, with the reason printed.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A Python program that uses the CUDA runtime through ctypes, as a Python library binding
/// CUDA by hand does: 3 rounds of 8 allocations of 1 MiB, each round freed before the next.
const CTYPES_SCRIPT: &str = r#"
import ctypes, sys
rt = ctypes.CDLL("libcudart.so.12")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
rt.cudaDeviceSynchronize.argtypes = []
for _ in range(3):
    ptrs = []
    for _ in range(8):
        p = ctypes.c_void_p()
        rc = rt.cudaMalloc(ctypes.byref(p), 1 << 20)
        if rc != 0:
            sys.exit("cudaMalloc failed: %d" % rc)
        ptrs.append(p)
    for p in ptrs:
        if rt.cudaFree(p) != 0:
            sys.exit("cudaFree failed")
rt.cudaDeviceSynchronize()
print("ctypes: ok")
"#;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// maturin to build with, or why there is none.
fn maturin() -> Result<PathBuf, String> {
    if let Some(m) = std::env::var_os("MATURIN").filter(|m| !m.is_empty()) {
        return Ok(PathBuf::from(m));
    }
    if Command::new("maturin")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(PathBuf::from("maturin"));
    }
    let venv = common::artifacts::source_root()
        .join("target")
        .join("tool-venv");
    let bin = venv.join("bin").join("maturin");
    if bin.is_file() {
        return Ok(bin);
    }
    let made = Command::new(python())
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|e| format!("running {}: {e}", python()))?;
    if !made.status.success() {
        return Err(format!(
            "{} -m venv failed: {}",
            python(),
            String::from_utf8_lossy(&made.stderr)
        ));
    }
    let pip = Command::new(venv.join("bin").join("pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "maturin>=1.5,<2",
        ])
        .output()
        .map_err(|e| format!("running pip: {e}"))?;
    if !pip.status.success() || !bin.is_file() {
        return Err(format!(
            "maturin is not installed and pip could not fetch it (registry unreachable?): {}",
            String::from_utf8_lossy(&pip.stderr).trim()
        ));
    }
    Ok(bin)
}

/// Build the wheel in the test binary's profile; its path.
fn build_wheel(maturin: &Path) -> PathBuf {
    let dir = common::build_dir();
    let profile = if dir.file_name().is_some_and(|n| n == "release") {
        "release"
    } else {
        "dev"
    };
    let root = common::artifacts::source_root();
    let out = Command::new("sh")
        .arg(root.join("scripts").join("build-wheel.sh"))
        .arg(profile)
        .env("MATURIN", maturin)
        .current_dir(&root)
        .output()
        .expect("running scripts/build-wheel.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "building the wheel failed:\n{text}");
    let line = text
        .lines()
        .find_map(|l| l.split("Built wheel to ").nth(1))
        .unwrap_or_else(|| panic!("maturin named no wheel:\n{text}"));
    root.join(line.trim())
}

/// Run `cmd` with only `path` on PATH, a private HOME and `envs`; its stdout, after
/// asserting success.
fn run_in_env(cmd: &mut Command, path: &Path, home: &Path, envs: &[(&str, &Path)]) -> String {
    cmd.env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("SIMCUDA_MEM_MB", "2048")
        .envs(envs.iter().copied());
    let out = cmd.output().expect("running a command from the venv");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Read a snapshot back with the installed cushim (converted to JSON).
fn read_back(cushim: &Path, snap: &Path, bin: &Path, home: &Path) -> Value {
    let json = snap.with_extension("json");
    run_in_env(
        Command::new(cushim).arg("convert").arg(snap).arg(&json),
        bin,
        home,
        &[],
    );
    let text = std::fs::read_to_string(&json).expect("reading the converted snapshot");
    serde_json::from_str(&text).expect("the converted snapshot is JSON")
}

fn stat(snap: &Value, key: &str) -> i64 {
    snap["cushim"]["stats"]["devices"][0][key]
        .as_i64()
        .unwrap_or_else(|| panic!("no stat {key} in the snapshot"))
}

fn report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("reading simcuda's report");
    serde_json::from_str(&text).expect("simcuda's report is JSON")
}

#[test]
fn the_wheel_installs_a_cushim_that_runs_demo_c_and_python_with_no_compiler() {
    let maturin = match maturin() {
        Ok(m) => m,
        Err(reason) => {
            eprintln!("SKIPPED install_wheel: {reason}");
            return;
        }
    };
    let wheel = build_wheel(&maturin);
    let dir = common::scratch("install-wheel");
    let venv = dir.join("venv");
    let home = dir.join("home");
    let work = dir.join("work");
    for d in [&home, &work] {
        std::fs::create_dir_all(d).expect("creating a scratch directory");
    }
    let made = Command::new(python())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .expect("creating the venv");
    assert!(made.success(), "python -m venv failed");
    // The installing pip is the host's (no registry: the wheel is a local file); the venv
    // itself gets no pip, so the only program in its bin/ besides python is cushim.
    let installed = Command::new(python())
        .args(["-m", "pip", "install", "--no-index", "--no-deps", "--quiet"])
        .arg("--prefix")
        .arg(&venv)
        .arg(&wheel)
        .output()
        .expect("running pip install");
    assert!(
        installed.status.success(),
        "pip install of {} failed: {}",
        wheel.display(),
        String::from_utf8_lossy(&installed.stderr)
    );
    let bin = venv.join("bin");
    let cushim = bin.join("cushim");
    assert!(cushim.is_file(), "the wheel installs bin/cushim");
    for tool in ["cc", "gcc", "clang", "cargo", "rustc"] {
        assert!(!bin.join(tool).exists(), "{tool} is in the venv's bin/");
    }

    // --version and doctor name the installed shim.
    let version = run_in_env(Command::new(&cushim).arg("--version"), &bin, &home, &[]);
    let lib = venv.join("lib").join("cushim");
    assert!(
        version.contains(&lib.join("libcushim.so").display().to_string()),
        "{version}"
    );
    let doctor = run_in_env(
        Command::new(&cushim).arg("doctor").current_dir(&work),
        &bin,
        &home,
        &[],
    );
    assert!(doctor.contains("libsimcuda.so"), "{doctor}");

    // The demo: its workload comes from the binary; it writes only into the current
    // directory (and a temporary one it removes).
    let demo = run_in_env(
        Command::new(&cushim)
            .args(["demo", "--steps", "20"])
            .current_dir(&work),
        &bin,
        &home,
        &[],
    );
    assert!(demo.contains("demo: ok: 20 steps"), "{demo}");
    let snap = read_back(&cushim, &work.join("cushim-demo.pickle"), &bin, &home);
    let allocs = stat(&snap, "allocation.all.allocated");
    let device = stat(&snap, "num_device_alloc");
    assert!(
        allocs > 500,
        "the shim served the demo's cudaMallocs: {allocs}"
    );
    assert!(
        device * 5 < allocs,
        "the cache served most of them: {device} of {allocs}"
    );
    let mut left: Vec<_> = std::fs::read_dir(&lib)
        .expect("listing lib/cushim")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["libcushim.so", "libsimcuda.so"],
        "nothing written next to the install"
    );

    // A prebuilt C program (built here, before PATH loses the compiler).
    let exe = common::compile_src(
        &common::artifacts::source_root().join("examples/vector_add.c"),
        "vector_add",
        &[],
    );
    let c_report = work.join("c-report.json");
    let c_snap = work.join("c.pickle");
    let out = run_in_env(
        Command::new(&cushim)
            .args(["run", "--sim", "--snapshot"])
            .arg(&c_snap)
            .arg("--")
            .arg(&exe),
        &bin,
        &home,
        &[("SIMCUDA_REPORT", &c_report)],
    );
    assert!(out.contains("vector_add"), "{out}");
    let r = report(&c_report);
    assert_eq!(
        r["calls"]["cudaMalloc"], 0,
        "the shim served every cudaMalloc"
    );
    let snap = read_back(&cushim, &c_snap, &bin, &home);
    assert_eq!(
        stat(&snap, "allocation.all.allocated"),
        3,
        "vector_add's 3 buffers"
    );

    // A Python script through ctypes, run by the venv's python.
    let script = work.join("ctypes_alloc.py");
    std::fs::write(&script, CTYPES_SCRIPT).expect("writing the script");
    let py_report = work.join("py-report.json");
    let py_snap = work.join("py.pickle");
    let out = run_in_env(
        Command::new(&cushim)
            .args(["run", "--sim", "--snapshot"])
            .arg(&py_snap)
            .args(["--", "python"])
            .arg(&script),
        &bin,
        &home,
        &[("SIMCUDA_REPORT", &py_report)],
    );
    assert!(out.contains("ctypes: ok"), "{out}");
    let r = report(&py_report);
    assert_eq!(
        r["calls"]["cudaMalloc"], 0,
        "the shim served every cudaMalloc"
    );
    let snap = read_back(&cushim, &py_snap, &bin, &home);
    assert_eq!(stat(&snap, "allocation.all.allocated"), 24, "3 rounds of 8");
    let device = stat(&snap, "num_device_alloc");
    assert!(
        device < 24,
        "later rounds reuse the cache: {device} device allocations"
    );
}
