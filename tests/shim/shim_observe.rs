//! Observing mode (`CUSHIM_MODE=observe`) and the families the cache does not serve, on
//! `tests/c/observe_families.c`: the program's device calls, pointers and results are those
//! of a run without the shim; every allocation of every family is in the snapshot with its
//! kind and the program's stack; the unexplained memory is what simcuda handed out that the
//! shim never saw.
use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

const HISTORY: &str = "enabled=all,context=all,stacks=native,record_host=true";

fn prog() -> PathBuf {
    common::compile("observe_families", &["-lcuda"])
}

/// Run the program; returns (stdout words, simcuda report, snapshot if one was asked for).
fn run(cmd: &mut std::process::Command, dir: &Path, tag: &str) -> (HashMap<String, String>, Value) {
    let report = dir.join(format!("report-{tag}.json"));
    let out = common::run_ok(cmd.env("SIMCUDA_REPORT", &report));
    assert!(out.contains("done"), "{out}");
    (common::kv(&out), common::read_report(&report))
}

fn hex(m: &HashMap<String, String>, k: &str) -> i128 {
    let v = m.get(k).unwrap_or_else(|| panic!("{k} missing in {m:?}"));
    let v = v.trim_start_matches("0x");
    i128::from_str_radix(v, 16).unwrap_or_else(|e| panic!("{k}={v}: {e}"))
}

/// Device pointers, as offsets from the first allocation (the simulated device's address
/// space is mapped where the loader leaves room, so absolute addresses move with what else
/// is loaded), and every other printed value as is; the VMM reservation (its own mapping)
/// only by its alignment.
fn results(m: &HashMap<String, String>) -> Vec<(String, String)> {
    let ptrs = [
        "plain", "plain2", "async", "managed", "pitched", "p3d", "pool", "pool2", "dmanaged",
        "dpitched", "dpool",
    ];
    let base = hex(m, "plain");
    let mut v: Vec<(String, String)> = m
        .iter()
        .map(|(k, val)| {
            if k == "va" {
                (k.clone(), format!("{}", hex(m, k) % (2 << 20)))
            } else if ptrs.contains(&k.as_str()) {
                (k.clone(), format!("{:+#x}", hex(m, k) - base))
            } else {
                (k.clone(), val.clone())
            }
        })
        .collect();
    v.sort();
    v
}

fn segments(snap: &Value) -> Vec<&Value> {
    let dev = snap["segments"].as_array().into_iter().flatten();
    let host = snap["host_segments"].as_array().into_iter().flatten();
    dev.chain(host).collect()
}

/// The segment at `addr` names function `func` as the first frame of its block.
fn segment_by(snap: &Value, addr: i128) -> &Value {
    segments(snap)
        .into_iter()
        .find(|s| s["address"].as_i64().map(i128::from) == Some(addr))
        .unwrap_or_else(|| panic!("no segment at {addr:#x}"))
}

fn first_frame(v: &Value) -> &str {
    v["frames"][0]["name"].as_str().unwrap_or("")
}

/// `tests/snapshot_check.py` (the viewers' reading, trace replayed against the segments).
fn check(path: &Path) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshot_check.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(path)
        .output()
        .expect("running python3");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn memory(snap: &Value) -> &Value {
    &snap["cushim"]["memory"][0]
}

#[test]
fn observing_makes_exactly_the_programs_device_calls_and_records_every_family_with_its_stack() {
    let exe = prog();
    let dir = common::scratch("observe-same");
    let (plain, plain_report) = run(&mut common::sim_cmd(&exe), &dir, "plain");
    let snap_path = dir.join("snap.json");
    let (obs, obs_report) = run(
        common::shim_cmd(&exe)
            .env("CUSHIM_MODE", "observe")
            .env("CUSHIM_HISTORY", HISTORY)
            .env("CUSHIM_SNAPSHOT", &snap_path),
        &dir,
        "observe",
    );
    // Same pointers (relative to the first), pitches, memory info.
    assert_eq!(results(&plain), results(&obs));
    assert_eq!(plain_report["devices"], obs_report["devices"]);
    // Same calls to every entry point, except read-only queries: the shim's start-up
    // (`cuInit`, `cuDeviceGetCount`) and the snapshot at exit (the driver's free memory,
    // for the unexplained figure).
    let dump_queries = [
        "cuInit",
        "cuDeviceGetCount",
        "cuDevicePrimaryCtxGetState",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuMemGetInfo_v2",
    ];
    // The shim's own lookups of the driver functions it calls (`shim/src/driver/entry.rs`).
    let lookups = ["cuGetProcAddress_v2"];
    let (a, b) = (&plain_report["calls"], &obs_report["calls"]);
    let names = a.as_object().expect("calls");
    let mut differ = Vec::new();
    for (name, n) in names {
        let ours = dump_queries.contains(&name.as_str()) || lookups.contains(&name.as_str());
        if b[name] != *n && !ours {
            differ.push(format!(
                "{name}: {n} without the shim, {} observing",
                b[name]
            ));
        }
    }
    assert!(differ.is_empty(), "{differ:#?}");
    for q in dump_queries {
        assert!(b[q].as_u64() <= Some(a[q].as_u64().unwrap_or(0) + 1), "{q}");
    }

    let snap = common::load_snapshot(&snap_path);
    let (ok, text) = check(&snap_path);
    assert!(ok, "{text}");
    assert_eq!(snap["cushim"]["mode"], "observe");
    for (key, kind, func) in [
        ("plain", "malloc", "alloc_plain"),
        ("managed", "managed", "alloc_managed"),
        ("pitched", "pitched", "alloc_pitched"),
        ("pool", "pool", "alloc_from_pool"),
        ("va", "vmm", "map_physical"),
        ("dmanaged", "managed", "driver_managed"),
        ("dpitched", "pitched", "driver_pitched"),
    ] {
        let seg = segment_by(&snap, hex(&obs, key));
        assert_eq!(seg["kind"], kind, "{key}: {seg}");
        assert_eq!(first_frame(&seg["blocks"][0]), func, "{key}");
    }
    let pitched = segment_by(&snap, hex(&obs, "pitched"));
    assert_eq!(pitched["total_size"], common::num(&obs, "pitch") * 64);
    let kinds: Vec<&str> = segments(&snap)
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"host_register") && kinds.contains(&"pinned"),
        "{kinds:?}"
    );
    // Freed allocations are in the trace with the call's stack: the 3D one, the pool's
    // second, the unmapped VMM range.
    let trace = snap["device_traces"][0].as_array().expect("trace");
    let p3d = hex(&obs, "p3d") as i64;
    let alloc_3d = trace
        .iter()
        .find(|e| e["action"] == "alloc" && e["addr"].as_i64() == Some(p3d))
        .expect("the 3D allocation's alloc event");
    assert_eq!(first_frame(alloc_3d), "alloc_3d");
    for act in [
        "free_completed",
        "segment_free",
        "segment_map",
        "segment_unmap",
    ] {
        assert!(trace.iter().any(|e| e["action"] == act), "{act}");
    }
    // Everything simcuda handed out is explained.
    let m = memory(&snap);
    assert_eq!(
        m["driver_used"], obs_report["devices"][0]["bytes_in_use"],
        "{m}"
    );
    assert_eq!(m["unexplained"], 0, "{m}");
}

#[test]
fn in_cache_mode_the_other_families_are_recorded_and_what_the_shim_never_saw_is_unexplained() {
    let exe = prog();
    let dir = common::scratch("observe-unexplained");
    // All layers: everything is either cached or recorded.
    let all = dir.join("all.json");
    let (_, report) = run(
        common::shim_cmd(&exe)
            .env("CUSHIM_HISTORY", HISTORY)
            .env("CUSHIM_SNAPSHOT", &all),
        &dir,
        "all",
    );
    let snap = common::load_snapshot(&all);
    let (ok, text) = check(&all);
    assert!(ok, "{text}");
    assert_eq!(snap["cushim"]["mode"], "cache");
    let m = memory(&snap);
    assert_eq!(
        m["driver_used"], report["devices"][0]["bytes_in_use"],
        "{m}"
    );
    assert_eq!(m["unexplained"], 0, "{m}");
    assert!(m["explained_by"]["cached"].as_u64() > Some(0), "{m}");
    let kinds: Vec<&str> = segments(&snap)
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    for k in ["managed", "pitched", "pool", "vmm", "host_register"] {
        assert!(kinds.contains(&k), "{k} not in {kinds:?}");
    }
    assert!(
        !kinds.contains(&"malloc"),
        "cudaMalloc is cached, not observed"
    );

    // Runtime layer only: the driver-API part is invisible, and is exactly the unexplained.
    let rt = dir.join("rt.json");
    let (out, report) = run(
        common::shim_cmd(&exe)
            .env("CUSHIM_INTERCEPT", "runtime")
            .env("CUSHIM_HISTORY", HISTORY)
            .env("CUSHIM_SNAPSHOT", &rt),
        &dir,
        "rt",
    );
    let snap = common::load_snapshot(&rt);
    let m = memory(&snap);
    assert_eq!(
        m["driver_used"], report["devices"][0]["bytes_in_use"],
        "{m}"
    );
    assert_eq!(m["unexplained"], common::num(&out, "hidden"), "{m}");
    // `cushim summary` groups by kind and prints the unexplained bytes.
    let text = common::run_ok(
        std::process::Command::new(common::cushim_bin())
            .arg("summary")
            .arg(&rt),
    );
    assert!(
        text.contains("by kind:") && text.contains("host_register"),
        "{text}"
    );
    let want = format!("({} bytes)", common::num(&out, "hidden"));
    assert!(
        text.lines()
            .any(|l| l.contains("driver used:") && l.contains(&want)),
        "{text}"
    );
}

#[test]
fn cushim_run_observe_sets_the_observing_mode() {
    let exe = prog();
    let dir = common::scratch("observe-cli");
    let snap = dir.join("snap.json");
    let mut cmd = std::process::Command::new(common::cushim_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("CUSHIM_") || k.starts_with("SIMCUDA_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    let out = common::run_ok(
        cmd.args(["run", "--sim", "--observe", "--snapshot"])
            .arg(&snap)
            .arg("--")
            .arg(&exe),
    );
    assert!(out.contains("done"), "{out}");
    let v = common::load_snapshot(&snap);
    assert_eq!(v["cushim"]["mode"], "observe");
    assert!(segments(&v).iter().any(|s| s["kind"] == "malloc"));
}
