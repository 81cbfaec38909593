//! Python stacks: a Python program calling the simulated runtime's `cudaMalloc` through ctypes
//! (with the GIL held: `ctypes.PyDLL(None)`, the preloaded shim's symbol) gets alloc events
//! whose frames name its own functions, files and lines, each evaluation loop's Python
//! frames just inside the loop's native `_PyEval_EvalFrameDefault` frame; on every CPython
//! 3.9 to 3.13 found on the machine (`python3`, and pyenv's versions when present).
//! Calls made through `ctypes.CDLL`, which releases the GIL, get the same frames, read
//! without it, on the main thread and on a second thread.
use crate::common;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/alloc_stacks.py")
}

/// The line of `tests/py/alloc_stacks.py` carrying `marker`.
fn line_of(marker: &str) -> u64 {
    let text = std::fs::read_to_string(script()).expect("reading the script");
    text.lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u64 + 1)
        .unwrap_or_else(|| panic!("{marker} not in the script"))
}

/// Interpreters to try: `python3`, and every pyenv CPython 3.9 to 3.13, one per minor.
fn interpreters() -> Vec<(String, PathBuf)> {
    let mut cands = vec![PathBuf::from("python3")];
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(Ok(dir)) = root.map(|r| std::fs::read_dir(r.join("versions"))) {
        let mut v: Vec<PathBuf> = dir
            .map_while(Result::ok)
            .map(|e| e.path().join("bin/python3"))
            .collect();
        v.sort();
        cands.extend(v);
    }
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for c in cands {
        let Ok(o) = std::process::Command::new(&c)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
        else {
            continue;
        };
        let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let minor: u32 = v
            .strip_prefix("3.")
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if o.status.success() && (9..=13).contains(&minor) && !out.iter().any(|x| x.0 == v) {
            out.push((v, c));
        }
    }
    out
}

fn is_py(f: &Value) -> bool {
    f["filename"]
        .as_str()
        .is_some_and(|s| s.ends_with("alloc_stacks.py"))
}

fn check_stack(version: &str, frames: &[Value]) {
    let names: Vec<(String, u64)> = frames
        .iter()
        .filter(|f| is_py(f))
        .map(|f| {
            (
                f["name"].as_str().unwrap_or("").to_string(),
                f["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let want_in_order = [
        ("allocate_weights", line_of("ALLOC-LINE")),
        ("train_step", line_of("STEP-LINE")),
        ("main", line_of("MAIN-LINE")),
        ("<module>", line_of("MODULE-LINE")),
    ];
    let mut at = 0;
    for w in want_in_order {
        let found = names[at..]
            .iter()
            .position(|n| n.0 == w.0 && n.1 == w.1)
            .unwrap_or_else(|| panic!("{version}: {w:?} not after {:?} in {names:?}", at));
        at += found + 1;
    }
    // Native frames of the call path sit inside the innermost Python frame...
    let first_py = frames.iter().position(is_py).expect("a Python frame");
    assert!(
        frames[..first_py]
            .iter()
            .any(|f| f["name"] == "_ctypes_callproc"),
        "{version}: no ctypes frame inside the Python frames: {frames:#?}"
    );
    // ...and every run of Python frames is followed by its evaluation loop's native frame
    // before any other Python frame.
    let mut i = 0;
    while i < frames.len() {
        if !is_py(&frames[i]) {
            i += 1;
            continue;
        }
        while i < frames.len() && is_py(&frames[i]) {
            i += 1;
        }
        let next_py = frames[i..]
            .iter()
            .position(is_py)
            .map_or(frames.len(), |p| p + i);
        assert!(
            frames[i..next_py]
                .iter()
                .any(|f| f["name"] == "_PyEval_EvalFrameDefault"),
            "{version}: Python frames before frame {i} not followed by their loop: {frames:#?}"
        );
        i = next_py;
    }
}

#[test]
fn alloc_events_name_the_programs_python_functions_interleaved_with_native_frames() {
    let pys = interpreters();
    assert!(!pys.is_empty(), "no CPython 3.9-3.13 found");
    let dir = common::scratch("python-stacks");
    for (version, py) in &pys {
        let snap = dir.join(format!("snap-{version}.json"));
        let out = common::run_ok(
            common::shim_cmd(&py.clone())
                .arg(script())
                .env("CUSHIM_HISTORY", "enabled=all,stacks=all,max_frames=128")
                .env("CUSHIM_SNAPSHOT", &snap),
        );
        assert!(out.contains("done"), "{version}: {out}");
        let v = common::load_snapshot(&snap);
        let trace = v["device_traces"][0].as_array().expect("trace");
        let allocs: Vec<&Value> = trace.iter().filter(|e| e["action"] == "alloc").collect();
        assert_eq!(allocs.len(), 3, "{version}");
        for a in allocs {
            check_stack(version, a["frames"].as_array().expect("frames"));
        }
        println!("{version}: ok");
    }
    println!(
        "checked: {:?}",
        pys.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
}

#[test]
fn stacks_python_keeps_only_the_python_frames_and_native_keeps_none() {
    let dir = common::scratch("python-only");
    for (mode, want_native, want_py) in [("python", false, true), ("native", true, false)] {
        let snap = dir.join(format!("snap-{mode}.json"));
        common::run_ok(
            common::shim_cmd(Path::new("python3"))
                .arg(script())
                .env("CUSHIM_HISTORY", format!("enabled=all,stacks={mode}"))
                .env("CUSHIM_SNAPSHOT", &snap),
        );
        let v = common::load_snapshot(&snap);
        let a = v["device_traces"][0]
            .as_array()
            .and_then(|t| t.iter().find(|e| e["action"] == "alloc"))
            .expect("an alloc event")
            .clone();
        let frames = a["frames"].as_array().expect("frames");
        assert_eq!(frames.iter().any(|f| !is_py(f)), want_native, "{mode}");
        assert_eq!(frames.iter().any(is_py), want_py, "{mode}");
    }
}

#[test]
fn without_the_gil_allocations_get_python_frames_and_while_finalizing_none() {
    let dir = common::scratch("python-edges");
    let snap = dir.join("snap.json");
    let edges = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/alloc_edges.py");
    let out = common::run_ok(
        common::shim_cmd(Path::new("python3"))
            .arg(&edges)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=all")
            .env("CUSHIM_SNAPSHOT", &snap),
    );
    assert!(out.contains("done"), "{out}");
    let v = common::load_snapshot(&snap);
    let trace = v["device_traces"][0].as_array().expect("trace");
    let allocs: Vec<&Value> = trace.iter().filter(|e| e["action"] == "alloc").collect();
    // 1 MiB and 2 MiB through CDLL (main thread, second thread), the GIL released: the
    // thread's Python frames are read all the same, merged into the native ones.
    for size in [1u64 << 20, 2 << 20] {
        let a = allocs
            .iter()
            .find(|e| e["size"] == size)
            .unwrap_or_else(|| panic!("no alloc of {size}"));
        let frames = a["frames"].as_array().expect("frames");
        let first_py = frames
            .iter()
            .position(|f| f["filename"].as_str().is_some_and(|s| s.ends_with(".py")))
            .unwrap_or_else(|| panic!("{size}: no Python frame without the GIL: {frames:#?}"));
        assert_eq!(frames[first_py]["name"], "released", "{size}: {frames:#?}");
        assert!(
            frames[..first_py]
                .iter()
                .any(|f| f["name"] == "_ctypes_callproc"),
            "{size}: {frames:#?}"
        );
    }
    // The allocation made from a __del__ while the interpreter finalizes (GIL held, but
    // Py_IsInitialized already 0) is recorded without Python frames and without harm.
    let a = allocs
        .iter()
        .find(|e| e["size"] == 3u64 << 20)
        .expect("the allocation made while finalizing");
    let frames = a["frames"].as_array().expect("frames");
    assert!(!frames.iter().any(is_py), "{frames:#?}");
}

fn nogil_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/alloc_nogil.py")
}

/// The line of `tests/py/alloc_nogil.py` carrying `marker`.
fn nogil_line(marker: &str) -> u64 {
    let text = std::fs::read_to_string(nogil_script()).expect("reading the script");
    text.lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u64 + 1)
        .unwrap_or_else(|| panic!("{marker} not in the script"))
}

#[test]
fn ctypes_cdll_calls_without_the_gil_get_the_threads_python_frames_on_every_version() {
    let pys = interpreters();
    assert!(!pys.is_empty(), "no CPython 3.9-3.13 found");
    let dir = common::scratch("python-nogil");
    let main_line = nogil_line("MAIN-ALLOC");
    let thread_line = nogil_line("THREAD-ALLOC");
    for (version, py) in &pys {
        for (mode, size, want) in [
            (
                "main",
                3u64 << 20,
                vec![("load_weights", main_line), ("<module>", 0)],
            ),
            (
                "thread",
                4 << 20,
                vec![("worker", thread_line), ("run", 0), ("_bootstrap", 0)],
            ),
        ] {
            let snap = dir.join(format!("snap-{version}-{mode}.json"));
            let out = common::run_ok(
                common::shim_cmd(&py.clone())
                    .arg(nogil_script())
                    .arg(mode)
                    .env("CUSHIM_HISTORY", "enabled=all,max_frames=128")
                    .env("CUSHIM_SNAPSHOT", &snap),
            );
            assert!(out.contains("done"), "{version} {mode}: {out}");
            let v = common::load_snapshot(&snap);
            let a = v["device_traces"][0]
                .as_array()
                .and_then(|t| {
                    t.iter()
                        .find(|e| e["action"] == "alloc" && e["size"] == size)
                })
                .unwrap_or_else(|| panic!("{version} {mode}: no alloc of {size}"))
                .clone();
            let frames = a["frames"].as_array().expect("frames");
            let py: Vec<(String, String, u64)> = frames
                .iter()
                .filter(|f| f["filename"].as_str().is_some_and(|s| s.ends_with(".py")))
                .map(|f| {
                    (
                        f["name"].as_str().unwrap_or("").to_string(),
                        f["filename"].as_str().unwrap_or("").to_string(),
                        f["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            // Innermost first, in order; line 0 here: any line.
            let mut at = 0;
            for (name, line) in &want {
                let found = py[at..]
                    .iter()
                    .position(|f| f.0 == *name && (*line == 0 || f.2 == *line))
                    .unwrap_or_else(|| {
                        panic!("{version} {mode}: {name}:{line} not after {at} in {py:?}")
                    });
                at += found + 1;
            }
            assert!(
                py[0].1.ends_with("alloc_nogil.py"),
                "{version} {mode}: {py:?}"
            );
            // Merged where the loops stand: the innermost Python frame lies outside the
            // ctypes call machinery and inside an evaluation loop.
            let first_py = frames
                .iter()
                .position(|f| f["name"] == want[0].0)
                .expect("the innermost Python frame");
            assert!(
                frames[..first_py]
                    .iter()
                    .any(|f| f["name"] == "_ctypes_callproc"),
                "{version} {mode}: {frames:#?}"
            );
            assert!(
                frames[first_py..]
                    .iter()
                    .any(|f| f["name"] == "_PyEval_EvalFrameDefault"),
                "{version} {mode}: {frames:#?}"
            );
        }
        println!("{version}: ok");
    }
}

#[test]
fn summary_names_the_python_function_of_a_gil_less_call_as_the_top_site() {
    let dir = common::scratch("python-nogil-summary");
    for (mode, site, marker, mib) in [
        ("main", "load_weights", "MAIN-ALLOC", "3.00 MiB"),
        ("thread", "worker", "THREAD-ALLOC", "4.00 MiB"),
    ] {
        let snap = dir.join(format!("snap-{mode}.pickle"));
        let out = common::run_ok(
            common::shim_cmd(Path::new("python3"))
                .arg(nogil_script())
                .arg(mode)
                // The documented default stacks (`all`).
                .env("CUSHIM_HISTORY", "enabled=all")
                .env("CUSHIM_SNAPSHOT", &snap),
        );
        assert!(out.contains("done"), "{mode}: {out}");
        let mut c = std::process::Command::new(common::cushim_bin());
        c.arg("summary").arg(&snap);
        let out = common::run_ok(&mut c);
        // The one live block, recorded by the shim (nothing is there without it), has
        // the program's function as its site, not libffi's or CPython's frames.
        let first = out
            .lines()
            .skip_while(|l| !l.contains("by live bytes (live at the end)"))
            .nth(1)
            .unwrap_or_else(|| panic!("{mode}: no site\n{out}"));
        let want = format!("{site} (");
        let line = format!("alloc_nogil.py:{})", nogil_line(marker));
        assert!(
            first.contains(&want) && first.contains(&line) && first.contains(mib),
            "{mode}: {first}\n{out}"
        );
    }
}
