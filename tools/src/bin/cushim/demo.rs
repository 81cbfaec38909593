//! `cushim demo`: run the bundled workload (`examples/demo.c`, plain CUDA runtime API, built
//! with cushim and embedded in its binary) on simcuda without the shim and with it, and print
//! what the cache changed.
//!
//! Policy: the demo writes only into a private temporary directory (the workload and
//! simcuda's reports, removed at the end) and its snapshot into the current directory (or
//! `--snapshot`), never next to the installed binary, which may be read-only.
//!
//! The device side of each figure comes from simcuda's own ledger (`SIMCUDA_REPORT`), the
//! cache side from the shim's statistics in the snapshot it writes at exit, so the two are
//! measured independently. simcuda's allocation latency is a model (`SIMCUDA_LATENCY`),
//! set here to figures in the range of real cudaMalloc/cudaFree costs, not a measurement.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use crate::launch::{exit_code, Launch};
use crate::workload;
use cushim_tools::analyze::units::mib1 as mib;

/// The latency model for the demo's simulated GPU.
const LATENCY_MODEL: &str =
    "cuMemAlloc_v2:60us,cuMemFree_v2:40us,cuMemHostAlloc:200us,cuMemFreeHost:100us";

struct RunResult {
    seconds: f64,
    report: Value,
    stdout: String,
}

fn run_once(exe: &Path, launch: &Launch, report: &Path, steps: u32) -> Result<RunResult, String> {
    let _ = std::fs::remove_file(report);
    let mut cmd = launch.command(&exe.as_os_str().to_owned(), &[steps.to_string().into()])?;
    cmd.env("SIMCUDA_REPORT", report)
        .env("SIMCUDA_LATENCY", LATENCY_MODEL)
        .env("SIMCUDA_MEM_MB", "4096");
    let t = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let seconds = t.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "the demo workload failed (exit {}):\n{stdout}{}",
            exit_code(out.status),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(report)
        .map_err(|e| format!("reading simcuda's report {}: {e}", report.display()))?;
    let report =
        serde_json::from_str(&text).map_err(|e| format!("parsing simcuda's report: {e}"))?;
    Ok(RunResult {
        seconds,
        report,
        stdout,
    })
}

fn calls(r: &Value, name: &str) -> u64 {
    r["calls"][name].as_u64().unwrap_or(0)
}

pub fn demo(expandable: bool, snapshot: Option<PathBuf>, steps: u32) -> Result<i32, String> {
    let work = workload::TempDir::new()?;
    let exe = workload::write_demo(work.path())?;
    let work = work.path();
    let snapshot = snapshot.unwrap_or_else(|| PathBuf::from("cushim-demo.pickle"));
    let log = snapshot.with_extension("log");

    let plain = Launch {
        sim: true,
        ..Launch::default()
    };
    let shimmed = Launch {
        sim: true,
        preload: true,
        expandable,
        snapshot: Some(snapshot.clone()),
        log: Some(log.clone()),
        // The demo's log is replaced as its snapshot is, run after run.
        log_replace: true,
        ..Launch::default()
    };
    let base = run_once(&exe, &plain, &work.join("report-plain.json"), steps)?;
    let with = run_once(&exe, &shimmed, &work.join("report-shim.json"), steps)?;
    let snap = crate::tools::read_snapshot_json(&snapshot)?;
    let stats = &snap["cushim"]["stats"]["devices"][0];
    let stat = |k: &str| stats[k].as_i64().unwrap_or(0).max(0) as u64;

    let dev = |r: &RunResult, k: &str| r.report["devices"][0][k].as_u64().unwrap_or(0);
    let device_allocs = |r: &RunResult| {
        calls(&r.report, "cuMemAlloc_v2")
            + calls(&r.report, "cuMemCreate")
            + calls(&r.report, "cudaMalloc")
    };
    println!("{}", with.stdout.trim_end());
    println!();
    println!("cushim demo on simcuda ({} steps{}; allocation latency is simcuda's model: {LATENCY_MODEL})",
        steps, if expandable { ", expandable segments" } else { "" });
    println!("{:<42} {:>16} {:>16}", "", "without shim", "with shim");
    println!(
        "{:<42} {:>16} {:>16}",
        "wall time",
        format!("{:.2} s", base.seconds),
        format!("{:.2} s", with.seconds)
    );
    println!(
        "{:<42} {:>16} {:>16}",
        "device allocation calls (device side)",
        device_allocs(&base),
        device_allocs(&with)
    );
    println!(
        "{:<42} {:>16} {:>16}",
        "device free calls (device side)",
        calls(&base.report, "cudaFree")
            + calls(&base.report, "cuMemFree_v2")
            + calls(&base.report, "cuMemRelease"),
        calls(&with.report, "cuMemFree_v2") + calls(&with.report, "cuMemRelease")
    );
    println!(
        "{:<42} {:>16} {:>16}",
        "pinned allocation calls (device side)",
        calls(&base.report, "cudaHostAlloc") + calls(&base.report, "cudaMallocHost"),
        calls(&with.report, "cuMemHostAlloc") + calls(&with.report, "cuMemAllocHost_v2")
    );
    println!(
        "{:<42} {:>16} {:>16}",
        "peak device memory in use (device side)",
        mib(dev(&base, "peak_bytes_in_use")),
        mib(dev(&with, "peak_bytes_in_use"))
    );
    println!();
    println!("the cache: {} allocations served by {} device allocations; peak allocated {} (allocated_bytes.all.peak, as `cushim summary` shows it), peak reserved {}; {} cached at exit",
        stat("allocation.all.allocated"), stat("num_device_alloc"),
        mib(stat("allocated_bytes.all.peak")), mib(stat("reserved_bytes.all.peak")),
        mib(stat("reserved_bytes.all.current").saturating_sub(stat("allocated_bytes.all.current"))));
    println!(
        "wrote {} (open it at https://pytorch.org/memory_viz, or `cushim summary {}`)",
        snapshot.display(),
        snapshot.display()
    );
    println!(
        "log: {} (every event of the run; `cushim summary {}`, `cushim snapshot {} --peak -o peak.pickle`)",
        log.display(),
        log.display(),
        log.display()
    );
    Ok(0)
}
