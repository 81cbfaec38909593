//! `cushim export`: several ranks' whole-run logs as Parquet tables that DuckDB and pyarrow
//! read, whose SQL gives back what `cushim summary` says of each rank (peak allocated,
//! event count, top site); a log as a Chrome trace whose memory counters peak where the
//! summary does and whose events follow the Trace Event Format's rules; bad inputs and
//! occupied outputs refused with one line.
//!
//! DuckDB and pyarrow are the published Python packages, installed once with pip into a
//! virtual environment under `target/`; where no registry answers, the tests that need
//! them skip visibly (`common::skip`), a failure under `CUSHIM_REQUIRE_ALL=1`.
use crate::common;

use cushim_tools::analyze::summary::{summaries, Options};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const DUCKDB_VERSION: &str = "2.0.1";
const PYARROW_VERSION: &str = "26.0.1";

/// A Python with duckdb and pyarrow, in `target/py-export/<versions>/`; None when pip
/// cannot install them.
fn python() -> Option<&'static Path> {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    PY.get_or_init(|| {
        let target = common::build_dir().parent()?.to_path_buf();
        let dir = target
            .join("py-export")
            .join(format!("duckdb-{DUCKDB_VERSION}-pyarrow-{PYARROW_VERSION}"));
        let py = dir.join("venv/bin/python");
        let ready = dir.join("ready");
        if ready.exists() {
            return Some(py);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir.join("venv"))
            .status();
        if !made.is_ok_and(|s| s.success()) {
            return None;
        }
        let got = Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--only-binary=:all:"])
            .arg(format!("duckdb=={DUCKDB_VERSION}"))
            .arg(format!("pyarrow=={PYARROW_VERSION}"))
            .status();
        if !got.is_ok_and(|s| s.success()) {
            return None;
        }
        std::fs::write(&ready, b"").ok()?;
        Some(py)
    })
    .as_deref()
}

pub(crate) fn python_or_skip(what: &str) -> Option<&'static Path> {
    let py = python();
    if py.is_none() {
        common::skip::skip(
            what,
            &format!(
                "could not install duckdb {DUCKDB_VERSION} and pyarrow {PYARROW_VERSION} with pip (no registry reachable?)"
            ),
        );
    }
    py
}

/// Run `code` with the venv's Python and `args`; its stdout as JSON.
pub(crate) fn py_json(py: &Path, code: &str, args: &[&Path]) -> Value {
    let out = common::run_ok(Command::new(py).arg("-c").arg(code).args(args));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Run `analyze_grow EXTRA` under the shim as rank `rank`, logging to `run-%r.log` in `dir`.
fn rank_run(dir: &Path, rank: u32, extra: u32) {
    let exe = common::compile("analyze_grow", &[]);
    let out = common::run_ok(
        common::shim_cmd(&exe)
            .arg(extra.to_string())
            .env("CUSHIM_LOG", dir.join("run-%r.log"))
            .env("CUSHIM_HISTORY", "enabled=all,stacks=native")
            .env("RANK", rank.to_string()),
    );
    assert!(out.contains("ok"), "{out}");
}

/// Four ranks' logs; ranks 0 and 1 allocate most from `weights`, 2 and 3 from
/// `activations`, each a different peak.
fn four_ranks(dir: &Path) -> Vec<PathBuf> {
    (0..4u32)
        .map(|r| {
            rank_run(dir, r, r * 3);
            dir.join(format!("run-{r}.log"))
        })
        .collect()
}

pub(crate) fn cushim(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(common::cushim_bin())
        .args(args)
        .output()
        .expect("running cushim")
}

pub(crate) fn export_parquet(files: &[PathBuf], out: &Path) -> String {
    export_parquet_with(files, out, &[])
}

/// [`export_parquet`] with more arguments.
pub(crate) fn export_parquet_with(files: &[PathBuf], out: &Path, more: &[&str]) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec!["export".as_ref()];
    args.extend(files.iter().map(|f| f.as_os_str()));
    args.push("--parquet".as_ref());
    args.push(out.as_os_str());
    args.extend(more.iter().map(std::ffi::OsStr::new));
    let o = cushim(&args);
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What `cushim summary` says of a file: (device 0's peak allocated, events of every
/// device, device 0's top site by live bytes at the end, if any is live).
fn summary_of(file: &Path) -> (u64, u64, Option<String>) {
    let snap = cushim_tools::analyze::input::read(file).expect("reading the log");
    let events: usize = snap
        .devices
        .iter()
        .chain(snap.host.iter())
        .map(|d| d.events.len())
        .sum();
    let devs = summaries(&snap, &Options::default());
    let (_, d0) = devs.iter().find(|(o, _)| *o == 0).expect("device 0");
    (
        d0.peak_allocated,
        events as u64,
        d0.sites.first().map(|s| s.0.clone()),
    )
}

const DUCKDB_QUERIES: &str = r#"
import duckdb, json, sys
d = sys.argv[1]
con = duckdb.connect()
con.sql(f"create view events as select * from read_parquet('{d}/events/*/*.parquet', hive_partitioning = true)")
counts = dict(con.sql("select rank, count(*) from events group by rank").fetchall())
# Allocated bytes as the summary counts them: a block leaves at its free_requested, or at
# its free_completed when the trace has no requests.
con.sql("""create view deltas as
  with e as (select *, bool_or(action = 'free_requested') over (partition by rank, device) as req
             from events)
  select rank, device, seq, site,
    case when action = 'alloc' then size
         when action = 'free_requested' then -size
         when action = 'free_completed' and not req then -size
         else 0 end as delta
  from e""")
peaks = dict(con.sql("""select rank, max(allocated) from (
    select rank, sum(delta) over (partition by rank, device order by seq) as allocated
    from deltas where device = 0) group by rank""").fetchall())
tops = dict(con.sql("""select rank, arg_max(site, struct_pack(live := live, neg := -rank_in))
  from (select rank, site, sum(delta) as live,
               row_number() over (partition by rank order by site) as rank_in
        from deltas where device = 0 and site is not null group by rank, site)
  group by rank""").fetchall())
print(json.dumps({str(r): {"events": counts[r], "peak": int(peaks[r]), "top": tops[r]} for r in counts}))
"#;

#[test]
fn duckdb_sql_over_the_parquet_export_of_four_ranks_gives_each_ranks_summary() {
    let Some(py) = python_or_skip("the DuckDB reading of the Parquet export") else {
        return;
    };
    let dir = common::scratch("export-duckdb");
    let logs = four_ranks(&dir);
    let out = dir.join("tables");
    let said = export_parquet(&logs, &out);
    assert!(said.contains("rank 3"), "{said}");
    assert!(out.join("events/rank=2/part-0.parquet").is_file());
    let got = py_json(py, DUCKDB_QUERIES, &[&out]);
    let mut tops = Vec::new();
    for (r, log) in logs.iter().enumerate() {
        let (peak, events, top) = summary_of(log);
        let top = top.expect("blocks live at the end");
        let row = &got[r.to_string()];
        assert_eq!(row["events"].as_u64(), Some(events), "rank {r}: {got}");
        assert_eq!(row["peak"].as_u64(), Some(peak), "rank {r}: {got}");
        assert_eq!(row["top"].as_str(), Some(top.as_str()), "rank {r}: {got}");
        tops.push(top);
    }
    // The ranks differ, so a column that ignored its rank's data could not pass.
    assert!(tops[0].contains("weights"), "{tops:?}");
    assert!(tops[3].contains("activations"), "{tops:?}");
}

const PYARROW_READ: &str = r#"
import json, sys
import pyarrow.dataset as ds, pyarrow.parquet as pq
d = sys.argv[1]
events = ds.dataset(d + "/events", format="parquet", partitioning="hive").to_table()
ranks = {}
for r in events.column("rank").to_pylist():
    ranks[str(r)] = ranks.get(str(r), 0) + 1
stacks = ds.dataset(d + "/stacks", format="parquet", partitioning="hive").to_table()
segments = ds.dataset(d + "/segments", format="parquet", partitioning="hive").to_table()
schema = {f.name: str(f.type) for f in pq.read_schema(d + "/events/rank=0/part-0.parquet")}
print(json.dumps({
    "ranks": ranks,
    "schema": schema,
    "functions": sorted(set(stacks.column("function").to_pylist())),
    "segment_bytes": sum(segments.column("size").to_pylist()),
    "actions": sorted(set(events.column("action").to_pylist())),
}))
"#;

#[test]
fn pyarrow_reads_the_three_tables_with_the_documented_schema() {
    let Some(py) = python_or_skip("the pyarrow reading of the Parquet export") else {
        return;
    };
    let dir = common::scratch("export-pyarrow");
    let logs: Vec<PathBuf> = (0..2u32)
        .map(|r| {
            rank_run(&dir, r, r);
            dir.join(format!("run-{r}.log"))
        })
        .collect();
    let out = dir.join("tables");
    export_parquet(&logs, &out);
    let got = py_json(py, PYARROW_READ, &[&out]);
    for (r, log) in logs.iter().enumerate() {
        let (_, events, _) = summary_of(log);
        assert_eq!(got["ranks"][r.to_string()].as_u64(), Some(events), "{got}");
    }
    let schema = &got["schema"];
    for (col, ty) in [
        ("source", "string"),
        ("pid", "int64"),
        ("seq", "int64"),
        ("device", "int32"),
        ("time_us", "int64"),
        ("action", "string"),
        ("address", "int64"),
        ("size", "int64"),
        ("stream", "int64"),
        ("pool", "string"),
        ("segment", "int64"),
        ("category", "string"),
        ("site", "string"),
        ("range", "string"),
        ("stack_id", "int64"),
        ("device_free", "int64"),
    ] {
        assert_eq!(schema[col].as_str(), Some(ty), "{col}: {schema}");
    }
    // The rank is the partition's, not a column of the files.
    assert!(schema.get("rank").is_none(), "{schema}");
    let functions = got["functions"].as_array().expect("functions");
    for f in ["weights", "activations"] {
        assert!(functions.iter().any(|x| x == f), "{f}: {functions:?}");
    }
    assert!(
        got["segment_bytes"].as_u64().is_some_and(|b| b >= 32 << 20),
        "{got}"
    );
    let actions = got["actions"].as_array().expect("actions");
    assert!(actions.iter().any(|a| a == "alloc"), "{actions:?}");
    assert!(actions.iter().any(|a| a == "segment_alloc"), "{actions:?}");
}

/// Check the Trace Event Format's rules (the JSON object form) that a reader relies on:
/// a `traceEvents` array; every event a `ph` of the format with a `pid`; a timestamp on
/// every non-metadata event; counters with numeric series; async begins and ends paired
/// by category and id, an end never before its begin. Returns each counter series' maximum
/// by (counter name, series).
fn check_trace_event_format(v: &Value) -> HashMap<(String, String), f64> {
    let events = v["traceEvents"].as_array().expect("a traceEvents array");
    assert!(!events.is_empty());
    assert_eq!(v["displayTimeUnit"], "ms");
    assert!(
        v["baseTimeNanoseconds"].as_i64().is_some_and(|b| b > 0),
        "{}",
        v["baseTimeNanoseconds"]
    );
    let mut max: HashMap<(String, String), f64> = HashMap::new();
    let mut open: BTreeMap<(String, String), f64> = BTreeMap::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(
            ["B", "E", "X", "i", "I", "C", "b", "n", "e", "M", "s", "t", "f"].contains(&ph),
            "{e}"
        );
        assert!(e["pid"].is_i64() || e["pid"].is_u64(), "{e}");
        assert!(e["name"].is_string(), "{e}");
        if ph == "M" {
            continue;
        }
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
        match ph {
            "C" => {
                let args = e["args"].as_object().expect("counter args");
                for (k, x) in args {
                    let x = x
                        .as_f64()
                        .unwrap_or_else(|| panic!("{k} not a number: {e}"));
                    let m = max
                        .entry((e["name"].as_str().unwrap_or("").into(), k.clone()))
                        .or_insert(0.0);
                    *m = m.max(x);
                }
            }
            "i" | "I" => assert!(
                ["g", "p", "t"].contains(&e["s"].as_str().unwrap_or("t")),
                "{e}"
            ),
            "b" | "e" => {
                let key = (
                    e["cat"]
                        .as_str()
                        .expect("async events need a cat")
                        .to_string(),
                    e["id"]
                        .as_str()
                        .expect("async events need an id")
                        .to_string(),
                );
                if ph == "b" {
                    assert!(open.insert(key, ts).is_none(), "id reused while open: {e}");
                } else {
                    let start = open
                        .remove(&key)
                        .unwrap_or_else(|| panic!("an end without a begin: {e}"));
                    assert!(start <= ts, "{e}");
                }
            }
            _ => {}
        }
    }
    max
}

#[test]
fn the_chrome_trace_of_a_log_follows_the_trace_event_format_and_peaks_at_the_summarys_peak() {
    let dir = common::scratch("export-trace");
    let Some(log) = common::nvtx::logged_run(&dir) else {
        return;
    };
    let trace = dir.join("trace.json");
    let o = cushim(&[
        "export".as_ref(),
        log.as_os_str(),
        "--trace".as_ref(),
        trace.as_os_str(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let v: Value =
        serde_json::from_slice(&std::fs::read(&trace).expect("the trace")).expect("JSON");
    let max = check_trace_event_format(&v);
    let (peak, _, _) = summary_of(&log);
    assert!(peak > 0);
    let got = max
        .get(&("device 0 memory".to_string(), "allocated".to_string()))
        .copied();
    assert_eq!(got, Some(peak as f64), "{max:?}");
    let events = v["traceEvents"].as_array().expect("events");
    // NVTX ranges as slices, named by their own level, the path in args.
    let slices: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "b")
        .filter_map(|e| e["args"]["path"].as_str())
        .collect();
    for p in ["step", "step/forward", "step/forward/layer"] {
        assert!(slices.contains(&p), "{p}: {slices:?}");
    }
    assert!(events
        .iter()
        .any(|e| e["ph"] == "i" && e["name"] == "segment_alloc"));
    // Times are on the Unix-epoch clock: base + ts is within the run's day.
    let base_us = v["baseTimeNanoseconds"].as_i64().expect("base") / 1000;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as i64;
    let first = events.iter().find_map(|e| e["ts"].as_i64()).expect("a ts");
    assert!(
        (now_us - (base_us + first)).abs() < 86_400_000_000,
        "{base_us} {first} {now_us}"
    );
}

#[test]
fn an_input_without_events_and_an_occupied_directory_are_refused_with_one_line() {
    let dir = common::scratch("export-refusals");
    rank_run(&dir, 0, 0);
    let log = dir.join("run-0.log");
    // A snapshot with segments but no trace: nothing to export.
    let empty = dir.join("empty.json");
    std::fs::write(&empty, br#"{"segments": [], "device_traces": [[]]}"#).expect("writing");
    let out = dir.join("t1");
    let o = cushim(&[
        "export".as_ref(),
        empty.as_os_str(),
        "--parquet".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no events"), "{err}");
    // A directory that holds a file is refused, and the file stays; --replace replaces.
    let full = dir.join("t2");
    std::fs::create_dir_all(&full).expect("mkdir");
    std::fs::write(full.join("keep.txt"), b"mine").expect("writing");
    let o = cushim(&[
        "export".as_ref(),
        log.as_os_str(),
        "--parquet".as_ref(),
        full.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--replace"), "{err}");
    assert!(!full.join("events").exists());
    let o = cushim(&[
        "export".as_ref(),
        log.as_os_str(),
        "--parquet".as_ref(),
        full.as_os_str(),
        "--replace".as_ref(),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(full.join("events/rank=0/part-0.parquet").is_file());
    assert_eq!(std::fs::read(full.join("keep.txt")).expect("kept"), b"mine");
    // No temporary file is left behind.
    let left: Vec<_> = walk(&full)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // A trace over an existing file is refused without --replace.
    let trace = dir.join("trace.json");
    std::fs::write(&trace, b"old").expect("writing");
    let o = cushim(&[
        "export".as_ref(),
        log.as_os_str(),
        "--trace".as_ref(),
        trace.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert_eq!(std::fs::read(&trace).expect("kept"), b"old");
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_logged_programs_categories_and_phases_come_from_its_nvtx_range_paths() {
    // The program's frames say nothing of its phases; its NVTX ranges (step/forward,
    // [loader]/worker/backward) do: the log records them per event and the categories read
    // them, as they read a snapshot's user_metadata.
    let dir = common::scratch("categories-ranges");
    let Some(log) = common::nvtx::logged_run(&dir) else {
        return;
    };
    let o = cushim(&[
        "summary".as_ref(),
        "--by".as_ref(),
        "category".as_ref(),
        "--json".as_ref(),
        log.as_os_str(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let dev = &v["devices"][0];
    let phases: Vec<&str> = dev["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .filter_map(|p| p["phase"].as_str())
        .collect();
    assert!(
        phases.contains(&"forward") && phases.contains(&"backward"),
        "{phases:?}"
    );
    let bytes = |name: &str| {
        dev["categories"]
            .as_array()
            .expect("categories")
            .iter()
            .find(|c| c["category"] == name)
            .and_then(|c| c["bytes"].as_u64())
            .unwrap_or(0)
    };
    assert!(bytes("backward temporaries") > 0, "{dev}");
    assert!(
        bytes("unclassified") < dev["allocated_bytes"].as_u64().expect("allocated"),
        "{dev}"
    );
}
