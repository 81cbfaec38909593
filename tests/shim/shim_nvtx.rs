//! The shim as an NVTX v3 injection library: a C program built with NVIDIA's own NVTX headers
//! (from the `nvidia-nvtx-cu12` wheel, fetched into `target/` on first use, never committed)
//! runs under the shim with `NVTX_INJECTION64_PATH`, and each allocation's trace entry carries
//! the range path it was made in as `user_metadata`; `cushim summary --by range` charges the
//! bytes to those paths.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: i64 = 1024 * 1024;

/// Run the program under the shim (NVTX pointed at it), writing the snapshot to `name` in
/// `dir` (its format by extension); returns its path.
fn run_to(exe: &Path, dir: &Path, name: &str) -> PathBuf {
    let snap = dir.join(name);
    let out = common::run_ok(
        common::shim_cmd(exe)
            .env("NVTX_INJECTION64_PATH", common::shim_path())
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    assert!(out.contains("ok"), "{out}");
    snap
}

/// Run the program under the shim (NVTX pointed at it) and return the JSON snapshot.
fn run_under_shim(exe: &Path, dir: &Path) -> (PathBuf, serde_json::Value) {
    let snap = run_to(exe, dir, "snap.json");
    let text = std::fs::read_to_string(&snap)
        .unwrap_or_else(|e| panic!("the shim wrote no snapshot at {}: {e}", snap.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("parsing the JSON snapshot");
    (snap, v)
}

#[test]
fn allocations_carry_the_nvtx_range_path_they_were_made_in() {
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let dir = common::scratch("nvtx-paths");
    let (_, snap) = run_under_shim(&exe, &dir);
    let trace = snap["device_traces"][0]
        .as_array()
        .expect("device 0 has a trace");
    let path_of = |mib: u64| -> Option<String> {
        let e = trace
            .iter()
            .find(|e| e["action"] == "alloc" && e["size"].as_i64() == Some(mib as i64 * MIB))
            .unwrap_or_else(|| panic!("no alloc of {mib} MiB in the trace"));
        e.get("user_metadata")
            .and_then(|m| m.as_str())
            .map(String::from)
    };
    for (mib, path) in common::nvtx::RANGES_PROGRAM_PATHS {
        assert_eq!(path_of(mib).as_deref(), path, "the {mib} MiB allocation");
    }
    // Every range's start and end, as PyTorch writes external annotations.
    let ann = snap["external_annotations"]
        .as_array()
        .expect("external_annotations");
    assert_eq!(ann.len(), 14, "7 ranges opened and closed: {ann:?}");
    for (name, range) in [
        ("step", "step"),
        ("layer", "step/forward/layer"),
        ("mem:phase [io]", "step/mem:phase [io]"),
        ("request", "step/request"),
        ("backward", "[loader]/worker/backward"),
    ] {
        for stage in ["START", "END"] {
            assert!(
                ann.iter().any(|a| a["name"] == name
                    && a["range"] == range
                    && a["stage"] == stage
                    && a["device"] == 0
                    && a["time_us"].as_i64().is_some_and(|t| t > 0)),
                "{stage} of {name} in {ann:?}"
            );
        }
    }
}

#[test]
fn summary_by_range_charges_bytes_to_their_ranges() {
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let dir = common::scratch("nvtx-summary");
    // A pickle, as PyTorch writes them: the writer and reader carry `user_metadata` too.
    let snap = run_to(&exe, &dir, "snap.pickle");
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "range"])
            .arg(&snap),
    );
    let row = |path: &str| -> String {
        out.lines()
            .find(|l| l.trim_end().ends_with(&format!("  {path}")))
            .unwrap_or_else(|| panic!("no row for {path}:\n{out}"))
            .to_string()
    };
    // Allocated bytes (4th column) per path, and the paths freed inside their range hold
    // nothing at the end while the others do until the final frees.
    assert!(row("step/forward/layer").contains("3.0 MiB"), "{out}");
    assert!(row("[loader]/worker/backward").contains("8.0 MiB"), "{out}");
    assert!(row("step/mem:phase [io]").contains("4.0 MiB"), "{out}");
    assert!(row("(no range)").contains("6.0 MiB"), "{out}");
    // The peak: 1+2+4+5+7 kept, plus 8 ([loader]/worker/backward) at once = 27 MiB.
    assert!(out.contains("peak 27.0 MiB live"), "{out}");
    assert!(
        out.contains("held the most at the peak: [loader]/worker/backward"),
        "{out}"
    );
}

#[test]
fn allocations_kept_past_their_iteration_range_are_reported_as_outliving_it() {
    let Some(exe) = common::nvtx::program_named("nvtx_leak") else {
        return;
    };
    let dir = common::scratch("nvtx-leak");
    let snap = run_to(&exe, &dir, "snap.pickle");
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "range"])
            .arg(&snap),
    );
    // Five 2 MiB buffers kept, never freed; the five 1 MiB scratch buffers freed inside.
    assert!(
        out.contains(
            "5 of 10 allocations (10.0 MiB) made in train/iteration outlived the range \
             (5 still live at the end)"
        ),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.trim_end().ends_with("  train/iteration"))
        .unwrap_or_else(|| panic!("no row for train/iteration:\n{out}"));
    assert!(row.contains("15.0 MiB"), "allocated in all: {row}");
}

#[test]
fn ranges_from_the_nvtx_python_package_carry_their_paths() {
    let Some(nvtx) = common::nvtx::nvtx_python() else {
        common::skip::skip(
            "NVTX ranges from NVIDIA's nvtx Python package",
            "the nvtx wheel for this python3 cannot be downloaded here",
        );
        return;
    };
    let dir = common::scratch("nvtx-python");
    let snap = dir.join("snap.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/nvtx_ranges.py");
    let out = common::run_ok(
        common::shim_cmd(Path::new("python3"))
            .arg(&script)
            .env("PYTHONPATH", nvtx)
            .env("NVTX_INJECTION64_PATH", common::shim_path())
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    assert!(out.contains("done"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&snap).expect("the shim's snapshot"))
            .expect("parsing the snapshot");
    let trace = v["device_traces"][0].as_array().expect("a trace");
    let paths_of = |mib: i64| -> Vec<Option<&str>> {
        trace
            .iter()
            .filter(|e| e["action"] == "alloc" && e["size"].as_i64() == Some(mib * MIB))
            .map(|e| e.get("user_metadata").and_then(|m| m.as_str()))
            .collect()
    };
    assert_eq!(paths_of(1), [Some("train")]);
    assert_eq!(paths_of(2), [Some("train/iteration [loop]"); 3]);
    assert_eq!(paths_of(3), [Some("train/iteration [loop]"); 3]);
    assert_eq!(paths_of(4), [Some("infer:eval")]);
    assert_eq!(paths_of(5), [Some("cleanup")]);
    let by = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "range"])
            .arg(&snap),
    );
    let row = by
        .lines()
        .find(|l| l.trim_end().ends_with("  train/iteration [loop]"))
        .unwrap_or_else(|| panic!("no row for the iterations:\n{by}"));
    assert!(row.contains("15.0 MiB"), "3 x (2 + 3) MiB allocated: {row}");
    assert!(
        by.contains(
            "3 of 6 allocations (6.0 MiB) made in train/iteration [loop] outlived the range \
             (3 still live at the end)"
        ),
        "{by}"
    );
}

/// The second injection library (`tests/c/nvtx_second_tool.c`), built as a shared object.
fn second_tool() -> PathBuf {
    common::compile("nvtx_second_tool", &["-shared", "-fPIC"])
}

/// The second tool's counts: pushes, pops, starts, ends.
fn tool_counts(report: &Path) -> String {
    std::fs::read_to_string(report)
        .unwrap_or_else(|e| {
            panic!(
                "the second tool wrote no report at {}: {e}",
                report.display()
            )
        })
        .trim()
        .to_string()
}

#[test]
fn a_second_injection_library_receives_every_range_too() {
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let dir = common::scratch("nvtx-forward");
    let snap = dir.join("snap.json");
    let report = dir.join("tool.txt");
    common::run_ok(
        common::shim_cmd(&exe)
            .env("NVTX_INJECTION64_PATH", common::shim_path())
            .env("CUSHIM_NVTX_FORWARD", second_tool())
            .env("SECOND_TOOL_REPORT", &report)
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    // 5 plain pushes and one domain push, as many pops, one start/end range.
    assert_eq!(tool_counts(&report), "6 6 1 1");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&snap).expect("a snapshot"))
            .expect("parsing the snapshot");
    let paths: Vec<&str> = v["device_traces"][0]
        .as_array()
        .expect("a trace")
        .iter()
        .filter(|e| e["action"] == "alloc")
        .filter_map(|e| e.get("user_metadata").and_then(|m| m.as_str()))
        .collect();
    assert!(paths.contains(&"step/forward/layer"), "{paths:?}");
    assert!(paths.contains(&"step/mem:phase [io]"), "{paths:?}");
}

#[test]
fn cushim_run_points_nvtx_at_the_shim_and_keeps_the_users_injection() {
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let dir = common::scratch("nvtx-run");
    let snap = dir.join("snap.json");
    let report = dir.join("tool.txt");
    let mut cmd = Command::new(common::cushim_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("CUSHIM_") || k.starts_with("SIMCUDA_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    common::run_ok(
        cmd.args(["run", "--sim", "--snapshot"])
            .arg(&snap)
            .arg("--")
            .arg(&exe)
            .env("NVTX_INJECTION64_PATH", second_tool())
            .env("SECOND_TOOL_REPORT", &report)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    assert_eq!(tool_counts(&report), "6 6 1 1");
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "range"])
            .arg(&snap),
    );
    assert!(out.contains("step/forward/layer"), "{out}");
}

/// `cushim summary --by category --json` of `snap` at `at`.
fn categories_json(snap: &Path, at: &str) -> serde_json::Value {
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "category", "--json", "--at", at])
            .arg(snap),
    );
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

fn bytes_of(dev: &serde_json::Value, category: &str) -> i64 {
    dev["categories"]
        .as_array()
        .expect("categories")
        .iter()
        .find(|c| c["category"] == category)
        .map_or(0, |c| c["bytes"].as_i64().expect("bytes"))
}

#[test]
fn a_c_loop_with_numbered_nvtx_steps_is_split_into_its_steps_and_categorised_by_its_ranges() {
    let Some(exe) = common::nvtx::program_named("nvtx_steps") else {
        return;
    };
    let dir = common::scratch("nvtx-steps");
    let snap = run_to(&exe, &dir, "snap.pickle");
    let v = categories_json(&snap, "end");
    let dev = &v["devices"][0];
    // At the end: the gradient and the optimizer state kept, four 6 MiB leaks outside
    // every phase; every temporary and activation freed.
    assert_eq!(bytes_of(dev, "gradients"), 2 * MIB, "{v}");
    assert_eq!(bytes_of(dev, "optimizer state"), 4 * MIB, "{v}");
    assert_eq!(bytes_of(dev, "unclassified"), 24 * MIB, "{v}");
    assert_eq!(bytes_of(dev, "activations kept for backward"), 0, "{v}");
    assert_eq!(dev["allocated_bytes"], 30 * MIB, "{v}");
    // Four steps from the numbered ranges; each after the first grows by its leak.
    assert!(
        dev["steps_source"]
            .as_str()
            .is_some_and(|s| s.contains("numbered ranges")),
        "{v}"
    );
    let steps = dev["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 4, "{v}");
    assert_eq!(steps[0]["growth_bytes"], 12 * MIB, "{v}");
    for s in &steps[1..] {
        assert_eq!(s["growth_bytes"], 6 * MIB, "{v}");
    }
    // The last step peaks highest (three leaks before it), inside its backward pass:
    // 18 (leaks) + 2 + 4 (kept) + 4 (the activation) + 3 (backward temporary) = 31 MiB,
    // the activation kept for backward while the backward pass runs.
    assert_eq!(dev["peak_step"], 4, "{v}");
    assert_eq!(steps[3]["peak_allocated_bytes"], 31 * MIB, "{v}");
    let at_peak = |name: &str| {
        steps[3]["categories"]
            .as_array()
            .expect("categories")
            .iter()
            .find(|c| c["category"] == name)
            .map_or(0, |c| c["bytes"].as_i64().expect("bytes"))
    };
    assert_eq!(at_peak("activations kept for backward"), 4 * MIB, "{v}");
    assert_eq!(at_peak("backward temporaries"), 3 * MIB, "{v}");
    let peak = categories_json(&snap, "peak");
    let p = &peak["devices"][0];
    let sum: i64 = p["categories"]
        .as_array()
        .expect("categories")
        .iter()
        .map(|c| c["bytes"].as_i64().expect("bytes"))
        .sum();
    assert_eq!(
        sum,
        p["allocated_bytes"].as_i64().expect("allocated"),
        "{peak}"
    );
    // The summary names the step that peaked.
    let out = common::run_ok(Command::new(common::cushim_bin()).arg("summary").arg(&snap));
    assert!(out.contains("the peak was in step 4 of 4"), "{out}");
}

#[test]
fn a_c_loop_without_any_range_is_split_into_steps_by_its_repeating_allocations() {
    let exe = common::compile("steps_plain", &[]);
    let dir = common::scratch("plain-steps");
    let snap = dir.join("snap.pickle");
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    assert!(out.contains("ok"), "{out}");
    let v = categories_json(&snap, "end");
    let dev = &v["devices"][0];
    assert!(
        dev["steps_source"]
            .as_str()
            .is_some_and(|s| s.contains("repeats every 2 allocations")),
        "{v}"
    );
    let steps = dev["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 4, "{v}");
    for s in steps {
        assert_eq!(s["growth_bytes"], 2 * MIB, "{v}");
    }
    // No phase and no rule: the kept buffers are unclassified, all 8 MiB of them.
    assert_eq!(bytes_of(dev, "unclassified"), 8 * MIB, "{v}");
    assert_eq!(dev["allocated_bytes"], 8 * MIB, "{v}");
}

#[test]
fn a_users_rule_over_range_paths_names_the_memory_first() {
    let Some(exe) = common::nvtx::program_named("nvtx_steps") else {
        return;
    };
    let dir = common::scratch("nvtx-user-rule");
    let snap = run_to(&exe, &dir, "snap.pickle");
    let out = common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "category", "--at", "end"])
            .args(["--category", "kept buffers=^step [0-9]+$"])
            .arg(&snap),
    );
    let row = out
        .lines()
        .find(|l| l.trim_end().ends_with("kept buffers"))
        .unwrap_or_else(|| panic!("no row for the user's category:\n{out}"));
    assert!(row.contains("24.00 MiB"), "{out}");
    let bad = common::run(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "category", "--category", "x=("])
            .arg(&snap),
    );
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--category \"x=(\""), "{err}");
}
