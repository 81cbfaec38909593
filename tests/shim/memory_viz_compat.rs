//! cushim's snapshots open unchanged in PyTorch's own `torch/cuda/_memory_viz.py`: its `stats`, `trace`, `trace_plot` and `segment_plot` commands, and its
//! `segments`, `memory` and `compare` functions, run on snapshots the shim writes on simcuda
//! (cache mode with history and native stacks plus pinned host memory, expandable segments,
//! observe mode over every allocation family), and what they print is checked against what
//! the snapshot holds and what `cushim summary` says.
//!
//! The script is PyTorch's, never ours: it comes from the `torch` wheel (pinned below; the
//! script imports only the standard library), downloaded once with `pip download --no-deps`
//! into `target/` (the CPython 3.11 x86-64 Linux wheel, 539 MB, on any machine), from which
//! only `torch/cuda/_memory_viz.py` is extracted and kept. Where no
//! registry answers, each test skips visibly (`common::skip`), a failure under
//! `CUSHIM_REQUIRE_ALL=1`.
use crate::common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The torch release whose `_memory_viz.py` the tests run.
const TORCH_VERSION: &str = "2.15.0";
const HISTORY: &str = "enabled=all,context=all,stacks=native,record_host=true";

/// [`memory_viz`], or a visible skip (a failure under `CUSHIM_REQUIRE_ALL=1`) when the wheel
/// cannot be downloaded.
fn memory_viz_or_skip() -> Option<&'static Path> {
    let script = memory_viz();
    if script.is_none() {
        common::skip::skip(
            "PyTorch's memory_viz check",
            &format!("could not download the torch {TORCH_VERSION} wheel with pip (no registry reachable?)"),
        );
    }
    script
}

/// PyTorch's `_memory_viz.py`, cached in `target/torch-memviz/<version>/`; None when the
/// wheel cannot be downloaded (each test then skips, see [`memory_viz_or_skip`]).
fn memory_viz() -> Option<&'static Path> {
    static SCRIPT: OnceLock<Option<PathBuf>> = OnceLock::new();
    SCRIPT
        .get_or_init(|| {
            let target = common::build_dir().parent()?.to_path_buf();
            let dir = target.join("torch-memviz").join(TORCH_VERSION);
            let script = dir.join("_memory_viz.py");
            if script.exists() {
                return Some(script);
            }
            let wheels = dir.join("wheel");
            std::fs::create_dir_all(&wheels).ok()?;
            let got = Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "-q"])
                // One fixed wheel whatever this machine's python and architecture: the
                // script is the same file in every platform's wheel of a release.
                .args(["--only-binary=:all:", "--platform", "manylinux_2_28_x86_64"])
                .args(["--python-version", "3.11", "-d"])
                .arg(&wheels)
                .arg(format!("torch=={TORCH_VERSION}"))
                .status();
            if !got.is_ok_and(|s| s.success()) {
                return None;
            }
            // Extract the one file (to a temporary name, then renamed: never half a file).
            let code = "import glob, sys, zipfile\n\
                        whl = glob.glob(sys.argv[1] + '/torch-*.whl')[0]\n\
                        data = zipfile.ZipFile(whl).read('torch/cuda/_memory_viz.py')\n\
                        open(sys.argv[2], 'wb').write(data)\n";
            let tmp = dir.join(format!(".memviz-{}", std::process::id()));
            common::run_ok(
                Command::new("python3")
                    .args(["-c", code])
                    .arg(&wheels)
                    .arg(&tmp),
            );
            std::fs::rename(&tmp, &script).expect("installing _memory_viz.py");
            // The wheel is over 500 MB; only the script is kept.
            let _ = std::fs::remove_dir_all(&wheels);
            Some(script)
        })
        .as_deref()
}

/// Run `python3 _memory_viz.py ARGS` in `dir`; require success and no traceback.
fn viz(script: &Path, dir: &Path, args: &[&str]) -> String {
    let out = common::run(
        Command::new("python3")
            .arg(script)
            .args(args)
            .current_dir(dir),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && !stderr.contains("Traceback") && !stdout.contains("Traceback"),
        "_memory_viz.py {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

/// Our helper that imports PyTorch's script and calls its functions (`tests/py/memviz_api.py`).
fn api(args: &[&Path]) -> Value {
    let helper = common::artifacts::source_root().join("tests/py/memviz_api.py");
    let out = common::run_ok(Command::new("python3").arg(helper).args(args));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("memviz_api.py output {out:?}: {e}"))
}

/// `_memory_viz.py`'s `_format_size`: `{:3.1f}` with binary units.
fn fmt_size(n: u64) -> String {
    let mut x = n as f64;
    for unit in ["", "Ki", "Mi", "Gi", "Ti"] {
        if x.abs() < 1024.0 {
            return format!("{x:.1}{unit}B");
        }
        x /= 1024.0;
    }
    format!("{x:.1}PiB")
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{v} is not an unsigned integer"))
}

fn count_actions(trace: &Value, action: &str) -> usize {
    trace
        .as_array()
        .map_or(0, |t| t.iter().filter(|e| e["action"] == action).count())
}

/// `file.c:line:name` as `_memory_viz.py` writes a frame.
fn frame_fmt(f: &Value) -> String {
    let file = f["filename"].as_str().unwrap_or("");
    let base = file.rsplit('/').next().unwrap_or(file);
    format!("{base}:{}:{}", f["line"], f["name"].as_str().unwrap_or(""))
}

/// Run every `_memory_viz.py` view on `snap` (a pickle in `dir`) and check what each printed
/// or wrote against the snapshot's own figures and `cushim summary`. Returns the snapshot.
fn check_all_views(script: &Path, dir: &Path, snap: &Path) -> Value {
    let v = common::load_snapshot(snap);
    let segs = v["segments"].as_array().cloned().unwrap_or_default();
    let name = snap.to_str().expect("utf-8 path");

    // stats: its totals are the snapshot's reserved bytes and the requested bytes of the
    // allocated blocks.
    let reserved: u64 = segs.iter().map(|s| u(&s["total_size"])).sum();
    let allocated: u64 = segs
        .iter()
        .flat_map(|s| s["blocks"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["state"] == "active_allocated")
        .map(|b| u(&b["requested_size"]))
        .sum();
    let stats = viz(script, dir, &["stats", name]);
    for want in [
        format!("segments: {}", segs.len()),
        format!("total_reserved: {}", fmt_size(reserved)),
        format!("total_allocated: {}", fmt_size(allocated)),
    ] {
        assert!(
            stats.lines().any(|l| l == want),
            "stats lacks {want:?}:\n{stats}"
        );
    }
    // ... and `cushim summary` reports the same reserved bytes per device.
    let summary = common::run_ok(Command::new(common::cushim_bin()).args(["summary", name]));
    let mut devices: Vec<u64> = segs.iter().map(|s| u(&s["device"])).collect();
    devices.sort_unstable();
    devices.dedup();
    for d in devices {
        let on_d: u64 = segs
            .iter()
            .filter(|s| u(&s["device"]) == d)
            .map(|s| u(&s["total_size"]))
            .sum();
        let section = summary
            .split(&format!("device {d}:"))
            .nth(1)
            .unwrap_or_else(|| panic!("summary has no device {d}:\n{summary}"));
        let want = format!("reserved:  {:.2} MiB", on_d as f64 / (1u64 << 20) as f64);
        assert!(
            section
                .lines()
                .take(3)
                .any(|l| l.trim_start().starts_with(&want)),
            "summary of device {d} lacks {want:?}:\n{summary}"
        );
    }

    // trace: one section per device with events, every event counted and named.
    let trace = viz(script, dir, &["trace", name]);
    let traces = v["device_traces"].as_array().cloned().unwrap_or_default();
    let mut sections = trace.split("Device ").skip(1);
    for (i, t) in traces.iter().enumerate() {
        let n = t.as_array().map_or(0, Vec::len);
        if n == 0 {
            continue;
        }
        let sec = sections
            .next()
            .unwrap_or_else(|| panic!("trace lacks device {i}:\n{trace}"));
        assert!(
            sec.starts_with(&format!("{i} ----")) && sec.contains(&format!("\n{n} entries\n")),
            "trace of device {i} does not count {n} entries:\n{sec}"
        );
        let lines = |p: &dyn Fn(&str) -> bool| sec.lines().filter(|l| p(l)).count();
        assert_eq!(
            lines(&|l| l.contains(" = cudaMalloc(")),
            count_actions(t, "segment_alloc"),
            "segment_alloc lines of device {i}"
        );
        assert_eq!(
            lines(&|l| l.starts_with("del ")),
            count_actions(t, "free_requested"),
            "free_requested lines of device {i}"
        );
        assert_eq!(
            lines(&|l| l.starts_with("# free completed for ")),
            count_actions(t, "free_completed"),
            "free_completed lines of device {i}"
        );
    }

    // trace_plot / segment_plot: the page embeds exactly the snapshot.
    for (cmd, out) in [("trace_plot", "trace.html"), ("segment_plot", "seg.html")] {
        viz(script, dir, &[cmd, name, "-o", out]);
        let eq = api(&[Path::new("--embedded"), &dir.join(out), snap]);
        assert_eq!(eq["equal"], true, "{cmd} page does not embed the snapshot");
    }

    // segments / memory (flamegraph input): PyTorch's walk over the blocks accounts for every
    // segment's bytes, and every live block's innermost frame is named.
    let got = api(&[script, snap]);
    for s in &segs {
        let key = format!("stream_{};seg_{}", s["stream"], s["address"]);
        assert_eq!(
            got["segments"]["by_prefix"][&key], s["total_size"],
            "segments view of {key}"
        );
    }
    assert_eq!(u(&got["memory"]["total"]), reserved, "memory view total");
    let named: Vec<&str> = got["memory"]["frames"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for s in &segs {
        for b in s["blocks"].as_array().into_iter().flatten() {
            if let Some(f) = b["frames"].as_array().and_then(|f| f.first()) {
                if b["state"] == "active_allocated" {
                    let f = frame_fmt(f);
                    assert!(named.contains(&f.as_str()), "memory view lacks {f}");
                }
            }
        }
    }
    v
}

fn snapshot_of(name: &str, cmd: &mut Command) -> (PathBuf, PathBuf) {
    let dir = common::scratch(name);
    let snap = dir.join("snap.pickle");
    common::run_ok(
        cmd.env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    (dir, snap)
}

#[test]
fn cached_run_with_native_stacks_and_pinned_memory_reads_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let exe = common::compile("shim_trace", &[]);
    let (dir, snap) = snapshot_of("memviz-cache", common::shim_cmd(&exe).arg("sites"));
    let v = check_all_views(script, &dir, &snap);
    // The viewer names the program's own call sites (sites() keeps a load_weights and a
    // make_activation block live) and the run recorded pinned host memory.
    let got = api(&[script, &snap]);
    let frames = got["memory"]["frames"].to_string();
    for f in ["load_weights", "make_activation"] {
        let line = common::call_line("shim_trace.c", f, "cudaMalloc");
        assert!(
            frames.contains(&format!("shim_trace.c:{line}:{f}")),
            "{f} in {frames}"
        );
    }
    assert!(
        count_actions(&v["host_traces"], "alloc") > 0,
        "no pinned events"
    );
    // compare (as a function: the command line's call is broken in this torch version): a
    // snapshot against itself has nothing only before or after; against a run that holds
    // other segments, the differing ones are accounted byte for byte.
    let same = api(&[script, &snap, &snap]);
    assert_eq!(same["compare"]["total"], 0, "{same}");
    let exp = common::compile("shim_expandable", &[]);
    let (_, other) = snapshot_of(
        "memviz-cmp",
        common::shim_cmd(&exp)
            .arg("hole")
            .env("CUSHIM_ALLOC_CONF", "expandable_segments:True"),
    );
    let cmp = api(&[script, &snap, &other]);
    let before: u64 = v["segments"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| u(&s["total_size"]))
        .sum();
    assert_eq!(
        u(&cmp["compare"]["by_prefix"]["only_before"]),
        before,
        "{cmp}"
    );
}

#[test]
fn expandable_segments_read_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let exe = common::compile("shim_expandable", &[]);
    let (dir, snap) = snapshot_of(
        "memviz-exp",
        common::shim_cmd(&exe)
            .arg("data")
            .env("CUSHIM_ALLOC_CONF", "expandable_segments:True"),
    );
    let v = check_all_views(script, &dir, &snap);
    let t = &v["device_traces"][0];
    assert!(count_actions(t, "segment_map") > 0, "no segment_map events");
}

#[test]
fn observed_run_of_every_allocation_family_reads_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let exe = common::compile("observe_families", &["-lcuda"]);
    let (dir, snap) = snapshot_of(
        "memviz-observe",
        common::shim_cmd(&exe).env("CUSHIM_MODE", "observe"),
    );
    let v = check_all_views(script, &dir, &snap);
    let kinds = v["segments"].to_string();
    for k in ["managed", "pitched", "vmm"] {
        assert!(
            kinds.contains(&format!("\"{k}")),
            "no {k} segment in {kinds}"
        );
    }
}

/// `_memory_viz.py` reads only the device keys (`segments`, `device_traces`): a run with
/// pinned memory alone has none, and the script must still take the file (its `host_*` keys
/// included) without failing.
#[test]
fn pinned_only_run_reads_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let exe = common::compile("shim_pinned", &[]);
    let (dir, snap) = snapshot_of("memviz-pinned", &mut common::shim_cmd(&exe));
    let v = check_all_views(script, &dir, &snap);
    assert!(
        count_actions(&v["host_traces"], "alloc") >= 4,
        "pinned events"
    );
}

/// An out-of-memory dump (`CUSHIM_DUMP_ON_OOM`) holds an `oom` event, which `trace` prints
/// with the requested size and the driver's free memory (`device_free`).
#[test]
fn out_of_memory_dump_reads_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let dir = common::scratch("memviz-oom");
    let out = common::run_oom_dump(&dir, HISTORY);
    assert!(out.status.success(), "{out:?}");
    let snap = dir.join("oom-0.pickle");
    let v = check_all_views(script, &dir, &snap);
    let oom = v["device_traces"][0]
        .as_array()
        .and_then(|t| t.iter().find(|e| e["action"] == "oom"))
        .cloned()
        .expect("an oom event");
    let trace = viz(script, &dir, &["trace", snap.to_str().expect("utf-8 path")]);
    let want = format!(
        "raise OutOfMemoryError # 2.0GiB requested, {} free in CUDA",
        fmt_size(u(&oom["device_free"]))
    );
    assert!(trace.contains(&want), "trace lacks {want:?}:\n{trace}");
}

/// A snapshot converted to JSON and back to a pickle by `cushim convert` (what users do
/// to edit or filter one) still opens, with the same figures.
#[test]
fn snapshot_converted_through_json_reads_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let exe = common::compile("shim_trace", &[]);
    let (dir, snap) = snapshot_of("memviz-convert", common::shim_cmd(&exe).arg("sites"));
    let (json, back) = (dir.join("snap.json"), dir.join("back.pickle"));
    for (from, to) in [(&snap, &json), (&json, &back)] {
        common::run_ok(
            Command::new(common::cushim_bin())
                .arg("convert")
                .arg(from)
                .arg(to),
        );
    }
    let name = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    assert_eq!(
        viz(script, &dir, &["stats", &name(&snap)]),
        viz(script, &dir, &["stats", &name(&back)])
    );
    check_all_views(script, &dir, &back);
}

#[test]
fn nvtx_range_paths_read_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let (dir, snap) = snapshot_of(
        "memviz-nvtx",
        common::shim_cmd(&exe).env("NVTX_INJECTION64_PATH", common::shim_path()),
    );
    let v = check_all_views(script, &dir, &snap);
    let paths: Vec<&str> = v["device_traces"][0]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["user_metadata"].as_str())
        .collect();
    assert!(paths.contains(&"step/forward/layer"), "{paths:?}");
}

#[test]
fn a_moment_of_a_whole_run_log_reads_in_pytorchs_memory_viz() {
    let Some(script) = memory_viz_or_skip() else {
        return;
    };
    let exe = common::compile("shim_trace", &[]);
    let dir = common::scratch("memviz-log");
    let log = dir.join("run.log");
    common::run_ok(
        common::shim_cmd(&exe)
            .arg("sites")
            .env("CUSHIM_LOG", &log)
            .env("CUSHIM_HISTORY", HISTORY),
    );
    let snap = dir.join("end.pickle");
    common::run_ok(
        Command::new(common::cushim_bin())
            .arg("snapshot")
            .arg(&log)
            .args(["--peak", "-o"])
            .arg(&snap),
    );
    let v = check_all_views(script, &dir, &snap);
    // The moment holds the program's live blocks, with the program's own call sites.
    assert!(
        v["segments"].as_array().is_some_and(|s| !s.is_empty()),
        "no segments at the peak: {v}"
    );
    let frames = api(&[script, &snap])["memory"]["frames"].to_string();
    for f in ["load_weights", "make_activation"] {
        let line = common::call_line("shim_trace.c", f, "cudaMalloc");
        assert!(
            frames.contains(&format!("shim_trace.c:{line}:{f}")),
            "{f} in {frames}"
        );
    }
}
