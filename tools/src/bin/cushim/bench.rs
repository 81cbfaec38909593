//! `cushim bench`: every cost of the shim next to a baseline measured in the same run, as one
//! Markdown table (quick mode: under two minutes; `--full`: more repeats).
//!
//! Invariant: each figure in the table was measured in this run by the workloads shared with
//! the criterion benches (`cushim_tools::workloads`); a figure that cannot be measured
//! here (a piece not built, a program that failed) is a row saying why, never a number. Targets
//! are reported as met / not met, never asserted.

#[path = "bench_observe.rs"]
mod bench_observe;

use std::path::Path;
use std::time::Duration;

use cushim::config::history::Unwinder;
use cushim::snapshot::Format;
use cushim_tools::artifacts;
use cushim_tools::workloads;
use workloads::procs::{self, ProcEnv};
use workloads::table::{markdown, Row};
use workloads::{engine, snapshot, timing, trace};

const MIB: u64 = 1 << 20;
const SIZES: [u64; 3] = [512, MIB, 64 * MIB];

/// How long each measurement runs.
struct Effort {
    batch: Duration,
    repeats: usize,
    dump_repeats: usize,
    alloc_args: [&'static str; 4],
}

/// Run the benchmarks, print the table (and write it with the machine description to `out`).
/// Returns 0 once the table is printed; rows that could not be measured say why in the table
/// and are counted on stderr.
pub fn bench(quick: bool, out: Option<&Path>) -> Result<i32, String> {
    let effort = if quick {
        Effort {
            batch: Duration::from_millis(20),
            repeats: 7,
            dump_repeats: 1,
            alloc_args: ["-r", "5", "-b", "20"],
        }
    } else {
        Effort {
            batch: Duration::from_millis(100),
            repeats: 15,
            dump_repeats: 3,
            alloc_args: ["-r", "11", "-b", "100"],
        }
    };
    let dir = artifacts::build_dir().map_err(|e| format!("locating cushim's files: {e}"))?;
    let machine = machine(&dir);
    let mut rows = Vec::new();
    let procs = ProcEnv::new(&dir);
    eprintln!("cushim bench: 1/5 allocation pairs");
    rows.extend(engine_pair_rows(&effort));
    rows.extend(pair_rows(&procs, &effort));
    rows.extend(bench_observe::observed_rows(effort.batch, effort.repeats));
    eprintln!("cushim bench: 2/5 event recording");
    rows.extend(event_rows(&effort));
    rows.extend(bench_observe::python_rows(&procs));
    eprintln!("cushim bench: 3/5 snapshot dumps");
    rows.extend(dump_rows(&effort));
    eprintln!("cushim bench: 4/5 two threads");
    rows.extend(engine_thread_rows(&effort));
    rows.extend(thread_rows(&procs, &effort));
    eprintln!("cushim bench: 5/5 fragmentation");
    rows.extend(engine_frag_rows());
    rows.extend(frag_rows(&procs));
    rows.sort_by_key(|r| r.group); // stable: keeps the order within a group
    let table = markdown(&rows);
    let command = format!("cushim bench{}", if quick { "" } else { " --full" });
    println!("{machine}\ncommand: `{command}`\n\n{table}");
    if let Some(path) = out {
        let doc = format!("Machine: {machine}\n\nCommand: `{command}`\n\n{table}");
        cushim::snapshot::output::write_atomic(path, doc.as_bytes())?;
        eprintln!("cushim: wrote {}", path.display());
    }
    let skipped = rows.iter().filter(|r| r.value.is_err()).count();
    if skipped > 0 {
        eprintln!(
            "cushim bench: {skipped} of {} rows not measured (see the table)",
            rows.len()
        );
    }
    Ok(0)
}

fn machine(dir: &Path) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or("unknown memory".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1048576.0)
        });
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let profile = dir
        .file_name()
        .map_or("?".into(), |n| n.to_string_lossy().into_owned());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    format!(
        "{nproc} CPUs ({cpu}), {mem} RAM, load average {load} at the start, `{profile}` build, GPU: simcuda"
    )
}

fn size_name(s: u64) -> String {
    if s >= MIB {
        format!("{} MiB", s / MIB)
    } else {
        format!("{s} B")
    }
}

/// 1. Cached pair through the engine directly (FakeDevice), and 2. what history adds to it.
fn engine_pair_rows(e: &Effort) -> Vec<Row> {
    const G: &str = "1 pair";
    const HIST: &str = "enabled=all,stacks=none,max_entries=100000";
    let (off, on) = match (
        engine::allocator("", None),
        engine::allocator("", Some(HIST)),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(err), _) | (_, Err(err)) => return vec![Row::skipped(G, "engine pair", err)],
    };
    let mut rows = Vec::new();
    for s in SIZES {
        let name = format!(
            "engine malloc+free {} (FakeDevice, history off)",
            size_name(s)
        );
        if engine::pairs(&off, s, 2) != 0 {
            rows.push(Row::skipped(G, name, "a cached pair failed"));
            continue;
        }
        engine::pairs(&on, s, 2);
        let m = timing::median_ns_interleaved(
            e.batch,
            e.repeats,
            &mut [
                &mut |n| {
                    engine::pairs(&off, s, n);
                },
                &mut |n| engine::glibc_pairs(s, n),
                &mut |n| {
                    engine::pairs(&on, s, n);
                },
            ],
        );
        let (ours, glibc, hist) = (m[0], m[1], m[2]);
        rows.push(
            Row::new(G, name, ours, "ns")
                .baseline("glibc malloc+free", glibc)
                .target(
                    "<= 100 ns and <= 5x glibc",
                    ours <= 100.0 && ours <= 5.0 * glibc,
                ),
        );
        match engine::events_per_pair(HIST) {
            Ok(k) if k > 0.0 => {
                let added = (hist - ours) / k;
                rows.push(
                    Row::new("2 event", format!("engine pair {} with history on, no stacks: added per event ({k} events/pair)", size_name(s)), added, "ns")
                        .target("adds <= 50 ns", added <= 50.0),
                );
            }
            Ok(_) => rows.push(Row::skipped("2 event", "history on", "no events recorded")),
            Err(err) => rows.push(Row::skipped("2 event", "history on", err)),
        }
    }
    rows
}

/// 4. Two threads against one, engine directly.
fn engine_thread_rows(e: &Effort) -> Vec<Row> {
    const G: &str = "4 threads";
    let a = match engine::allocator("", None) {
        Ok(a) => a,
        Err(err) => return vec![Row::skipped(G, "engine threads", err)],
    };
    let per = (e.batch.as_secs_f64() * 1e7) as u64; // about batch at 100 ns per pair
    let best = |t: usize| {
        let mut v: Vec<f64> = (0..e.repeats)
            .map(|_| engine::threaded_pairs_per_s(&a, MIB, t, per))
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let one = best(1);
    let two = best(2);
    vec![Row::new(
        G,
        "engine malloc+free 1 MiB, 2 threads (pairs/s)",
        two,
        "pairs/s",
    )
    .baseline("1 thread", one)]
}

/// 5. Peak reserved / peak allocated, engine directly (FakeDevice).
fn engine_frag_rows() -> Vec<Row> {
    const G: &str = "5 frag";
    let mut rows = Vec::new();
    let mut last = None;
    for (scenario, expandable) in [
        ("seed", false),
        ("seed", true),
        ("reverse", false),
        ("reverse", true),
        ("serving", false),
        ("serving", true),
    ] {
        let conf = if expandable {
            "expandable_segments:True"
        } else {
            ""
        };
        let name = format!(
            "engine {scenario}{} (peak reserved / peak allocated)",
            if expandable { " + expandable" } else { "" }
        );
        let res = engine::allocator(conf, None).and_then(|a| {
            match scenario {
                "seed" => engine::two_phase(&a, 8, 16 * MIB, 4, 32 * MIB),
                "reverse" => engine::two_phase(&a, 4, 32 * MIB, 8, 16 * MIB),
                _ => engine::serving(&a, 200),
            }?;
            engine::peaks(&a)
        });
        match res {
            Ok((reserved, allocated)) => {
                let ratio = if allocated > 0 {
                    reserved as f64 / allocated as f64
                } else {
                    0.0
                };
                let without = if expandable { last } else { None };
                last = Some(ratio);
                let mut row = Row::new(
                    G,
                    format!("{name}; reserved {} MiB", reserved / MIB),
                    ratio,
                    "",
                );
                if let Some(w) = without {
                    row = row.baseline("without expandable segments", w);
                }
                if scenario == "seed" && expandable {
                    row = row.target("128 MiB reserved (design)", reserved == 128 * MIB);
                }
                if scenario == "seed" && !expandable {
                    row = row.target(
                        "256 MiB reserved (design, PyTorch rules)",
                        reserved == 256 * MIB,
                    );
                }
                rows.push(row);
            }
            Err(err) => rows.push(Row::skipped(G, name, err)),
        }
    }
    rows
}

/// 1. Cached pair through the preloaded exports in a real process on simcuda.
fn pair_rows(procs: &Result<ProcEnv, String>, e: &Effort) -> Vec<Row> {
    const G: &str = "1 pair";
    let run_with = |shim: bool, extra: &[&str]| -> Result<String, String> {
        let p = procs.as_ref().map_err(Clone::clone)?;
        let exe = p.compile("bench_alloc")?;
        let mut args = extra.to_vec();
        args.extend_from_slice(&e.alloc_args);
        p.run(&exe, &args, shim, &[], Duration::from_secs(60))
    };
    let run = |shim: bool| run_with(shim, &[]);
    let plain = match run(false) {
        Ok(out) => out,
        Err(e) => {
            return vec![Row::skipped(
                G,
                "cudaMalloc+cudaFree in a process on simcuda",
                e,
            )]
        }
    };
    let base = procs::pairs(&plain);
    let shimmed = run(true);
    let ours = shimmed.as_deref().map(procs::pairs).unwrap_or_default();
    let intercepted = shimmed
        .as_deref()
        .ok()
        .and_then(procs::shim_allocs)
        .is_some_and(|n| n > 0);
    let mut rows = Vec::new();
    for s in SIZES {
        // glibc from the shimmed process itself, whose batches alternate with the shim's
        // (bench_alloc), so both are measured in the same state of the machine; the raw
        // driver from the process without the shim.
        let glibc = procs::find(&ours, "glibc", s).or_else(|| procs::find(&base, "glibc", s));
        let (Some(glibc), Some(raw)) = (glibc, procs::find(&base, "driver", s)) else {
            rows.push(Row::skipped(
                G,
                format!("pairs of {}", size_name(s)),
                "bench_alloc printed no figure",
            ));
            continue;
        };
        let name = format!(
            "cudaMalloc+cudaFree {} via preloaded shim{}",
            size_name(s),
            if intercepted {
                ""
            } else {
                " (NOT intercepted)"
            }
        );
        match (&shimmed, procs::find(&ours, "runtime", s)) {
            (Ok(_), Some(shim)) => {
                let v = shim.ns_per_pair;
                rows.push(
                    Row::new(G, name.clone(), v, "ns")
                        .baseline("glibc malloc+free", glibc.ns_per_pair)
                        .target(
                            "<= 100 ns and <= 5x glibc",
                            v <= 100.0 && v <= 5.0 * glibc.ns_per_pair,
                        ),
                );
                rows.push(
                    Row::new(G, name, v, "ns")
                        .baseline("simcuda cuMemAlloc_v2+cuMemFree_v2", raw.ns_per_pair),
                );
            }
            (Err(e), _) => rows.push(Row::skipped(G, name, e.clone())),
            (Ok(_), None) => rows.push(Row::skipped(G, name, "bench_alloc printed no figure")),
        }
        if let Some(rt) = procs::find(&base, "runtime", s) {
            rows.push(
                Row::new(
                    G,
                    format!("simcuda cudaMalloc+cudaFree {} (no shim)", size_name(s)),
                    rt.ns_per_pair,
                    "ns",
                )
                .baseline("simcuda cuMemAlloc_v2+cuMemFree_v2", raw.ns_per_pair),
            );
        }
    }
    // The same pair once the program has created streams (idle ones): under free_sync:auto
    // a free then waits for the streams, and the next malloc that needs the block issues a
    // GPU-side barrier (`alloc/barrier.rs`), so this is not the cached fast path.
    for n in [1u32, 8] {
        rows.extend(stream_pair_rows(procs, e, n, &ours));
    }
    // Observing mode (no history): each call goes to simcuda and is recorded, one lock and
    // one address-map operation per call; baseline the same pair without the shim.
    let observed = procs.as_ref().map_err(Clone::clone).and_then(|p| {
        let exe = p.compile("bench_alloc")?;
        let mut args = vec!["-m", "runtime"];
        args.extend_from_slice(&e.alloc_args);
        let env = [("CUSHIM_MODE", "observe")];
        p.run(&exe, &args, true, &env, Duration::from_secs(60))
    });
    let obs = observed.as_deref().map(procs::pairs).unwrap_or_default();
    for s in SIZES {
        let name = format!(
            "cudaMalloc+cudaFree {} via shim, observing (CUSHIM_MODE=observe)",
            size_name(s)
        );
        match (&observed, procs::find(&obs, "runtime", s)) {
            (Ok(_), Some(p)) => {
                let mut row = Row::new(G, name, p.ns_per_pair, "ns");
                if let Some(rt) = procs::find(&base, "runtime", s) {
                    row = row.baseline("simcuda cudaMalloc+cudaFree, no shim", rt.ns_per_pair);
                }
                rows.push(row);
            }
            (Err(e), _) => rows.push(Row::skipped(G, name, e.clone())),
            (Ok(_), None) => rows.push(Row::skipped(G, name, "bench_alloc printed no figure")),
        }
    }
    rows
}

/// The cached pair with `n` idle non-blocking streams created, next to the pair without
/// streams (`ours`, measured in this run), and the 64 MiB loop's device allocations and
/// driver calls per pair (counted by simcuda's report).
fn stream_pair_rows(
    procs: &Result<ProcEnv, String>,
    e: &Effort,
    n: u32,
    ours: &[procs::Pair],
) -> Vec<Row> {
    const G: &str = "1 pair";
    let streams = n.to_string();
    let label = if n == 1 {
        "1 idle stream".to_string()
    } else {
        format!("{n} idle streams")
    };
    let run = |extra: &[&str], env: &[(&str, &str)]| -> Result<String, String> {
        let p = procs.as_ref().map_err(Clone::clone)?;
        let exe = p.compile("bench_alloc")?;
        let mut args = vec!["-m", "runtime", "-S", streams.as_str()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&e.alloc_args);
        p.run(&exe, &args, true, env, Duration::from_secs(60))
    };
    let mut rows = Vec::new();
    let timed = run(&[], &[]);
    let with_streams = timed.as_deref().map(procs::pairs).unwrap_or_default();
    for s in SIZES {
        let name = format!(
            "cudaMalloc+cudaFree {} via shim, {label} (free_sync:auto)",
            size_name(s)
        );
        match (&timed, procs::find(&with_streams, "runtime", s)) {
            (Ok(_), Some(p)) => {
                let mut row = Row::new(G, name, p.ns_per_pair, "ns");
                if let Some(no_stream) = procs::find(ours, "runtime", s) {
                    row = row.baseline("no stream", no_stream.ns_per_pair);
                }
                rows.push(row);
            }
            (Err(e), _) => rows.push(Row::skipped(G, name, e.clone())),
            (Ok(_), None) => rows.push(Row::skipped(G, name, "bench_alloc printed no figure")),
        }
    }
    // The 64 MiB loop alone, with simcuda counting every driver call.
    let report = match procs {
        Ok(p) => p
            .bins
            .join(format!("report-streams-{n}-{}.json", std::process::id())),
        Err(e) => {
            return [
                rows,
                vec![Row::skipped(G, "64 MiB loop driver calls", e.clone())],
            ]
            .concat()
        }
    };
    let report_s = report.display().to_string();
    let counted = run(
        &["-s", "67108864"],
        &[("SIMCUDA_REPORT", report_s.as_str())],
    );
    let calls = procs::report_calls(&report);
    let _ = std::fs::remove_file(&report);
    let name = format!("64 MiB cudaMalloc+cudaFree loop, {label}: driver calls per pair");
    match (&counted, calls) {
        (Ok(out), Some((all, ordering))) => {
            let pairs = procs::runtime_pairs(out).unwrap_or(0).max(1) as f64;
            rows.push(Row::new(G, name, all as f64 / pairs, "calls"));
            rows.push(Row::new(
                G,
                format!(
                    "64 MiB cudaMalloc+cudaFree loop, {label}: of which stream ordering \
                     (event record/query/sync, stream wait, capture status)"
                ),
                ordering as f64 / pairs,
                "calls",
            ));
            let allocs = procs::shim_allocs(out).unwrap_or(-1);
            rows.push(
                Row::new(
                    G,
                    format!("64 MiB cudaMalloc+cudaFree loop, {label}: device allocations"),
                    allocs as f64,
                    "allocs",
                )
                .target("<= 2", (0..=2).contains(&allocs)),
            );
        }
        (Err(e), _) => rows.push(Row::skipped(G, name, e.clone())),
        (Ok(_), None) => rows.push(Row::skipped(G, name, "simcuda wrote no report")),
    }
    rows
}

/// 2. Per-event recording cost.
fn event_rows(e: &Effort) -> Vec<Row> {
    const G: &str = "2 event";
    let mut ring = trace::full_ring(100_000);
    let m = timing::median_ns_interleaved(
        e.batch,
        e.repeats,
        &mut [
            &mut trace::record_off,
            &mut |n| trace::record_no_stack(&mut ring, n),
            &mut trace::timestamps,
        ],
    );
    let (off, plain, stamp) = (m[0], m[1], m[2]);
    let mut rows = vec![
        Row::new(G, "history on, no stacks (ns/event)", plain, "ns")
            .baseline("history off", off)
            .target("adds <= 50 ns", plain - off <= 50.0),
        Row::new(
            G,
            "of which: timestamp (now_us: CLOCK_MONOTONIC via the vDSO)",
            stamp,
            "ns",
        )
        .baseline("history on, no stacks", plain),
    ];
    for (uname, u) in [("DWARF", Unwinder::Dwarf), ("frame pointers", Unwinder::Fp)] {
        let mut points = Vec::new();
        for depth in [8usize, 32, 64] {
            let got = trace::captured_frames(u, depth);
            let ns = timing::median_ns(e.batch, e.repeats, |n| {
                trace::record_with_stack(&mut ring, u, depth, n)
            });
            points.push((got as f64, ns));
            let name = if got == depth {
                format!("stack via {uname}, depth {depth} (ns/event)")
            } else {
                format!("stack via {uname}, depth {depth} (captured {got} frames) (ns/event)")
            };
            rows.push(Row::new(G, name, ns, "ns").baseline("history on, no stacks", plain));
        }
        let mut raw = Vec::new();
        for depth in [8usize, 64] {
            let ns = timing::median_ns(e.batch, e.repeats, |n| trace::capture_only(u, depth, n));
            raw.push((depth as f64, ns));
        }
        let (raw_slope, _) = timing::fit_line(&raw);
        rows.push(Row::new(
            G,
            format!("unwinder {uname} alone (no intern, no ring): per frame"),
            raw_slope,
            "ns",
        ));
        let (per_frame, fixed) = timing::fit_line(&points);
        let per_target = if u == Unwinder::Dwarf { 30.0 } else { 3.0 };
        rows.push(
            Row::new(
                G,
                format!("stack via {uname}: per frame (slope over depths)"),
                per_frame,
                "ns",
            )
            .target(format!("<= {per_target} ns/frame"), per_frame <= per_target),
        );
        let fixed_row = Row::new(
            G,
            format!("stack via {uname}: fixed (intercept)"),
            fixed,
            "ns",
        )
        .baseline("history on, no stacks", plain);
        rows.push(if u == Unwinder::Dwarf {
            fixed_row.target("<= 300 ns fixed", fixed <= 300.0)
        } else {
            fixed_row
        });
    }
    rows
}

/// 3. Snapshot dump of 100k and 1M events with 32-frame stacks.
fn dump_rows(e: &Effort) -> Vec<Row> {
    const G: &str = "3 dump";
    let dir = std::env::temp_dir().join(format!("cushim-bench-{}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&dir) {
        return vec![Row::skipped(
            G,
            "snapshot dump",
            format!("creating {}: {err}", dir.display()),
        )];
    }
    let mut rows = Vec::new();
    for n in [100_000usize, 1_000_000] {
        let input = snapshot::input(n, 32);
        let mut measured: Vec<(Format, f64, u64)> = Vec::new();
        for f in [Format::Json, Format::Pickle, Format::Msgpack] {
            if e.dump_repeats == 1 && n > 100_000 && f != Format::Pickle {
                // JSON and msgpack repeat every frame inline (about 7 GB at 1M events):
                // measured by --full only.
                rows.push(Row::skipped(
                    G,
                    format!("{n} events, 32 frames: {}", snapshot::ext(f)),
                    "quick mode (use --full)",
                ));
                continue;
            }
            let path = dir.join(format!("snap-{n}.{}", snapshot::ext(f)));
            let (secs, res) =
                timing::median_secs(e.dump_repeats, || snapshot::dump(&input, f, &path));
            match res {
                Ok(bytes) => measured.push((f, secs, bytes)),
                Err(err) => rows.push(Row::skipped(
                    G,
                    format!("{n} events {}", snapshot::ext(f)),
                    err,
                )),
            }
            let _ = std::fs::remove_file(&path);
        }
        let json = measured
            .iter()
            .find(|m| m.0 == Format::Json)
            .map(|m| (m.1, m.2));
        for (f, secs, bytes) in &measured {
            let mut t = Row::new(
                G,
                format!("{n} events, 32 frames: {} write", snapshot::ext(*f)),
                *secs,
                "s",
            );
            let mut b = Row::new(
                G,
                format!("{n} events, 32 frames: {} on disk", snapshot::ext(*f)),
                *bytes as f64 / 1e6,
                "MB",
            );
            if let (Some((js, jb)), false) = (json, *f == Format::Json) {
                t = t.baseline("json", js);
                b = b.baseline("json", jb as f64 / 1e6);
            }
            if n == 1_000_000 && *f == Format::Pickle {
                t = t.target("<= 5 s", *secs <= 5.0);
                b = b.target("<= 150 MB", *bytes <= 150_000_000);
            }
            rows.push(t);
            rows.push(b);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// 4. Two threads allocating concurrently against one (real process, shim preloaded).
fn thread_rows(procs: &Result<ProcEnv, String>, e: &Effort) -> Vec<Row> {
    const G: &str = "4 threads";
    let run = |threads: &str, mode: &str| -> Result<f64, String> {
        let p = procs.as_ref().map_err(Clone::clone)?;
        let exe = p.compile("bench_alloc")?;
        let mut args = vec!["-m", mode, "-s", "1048576", "-t", threads];
        args.extend_from_slice(&e.alloc_args);
        let out = p.run(&exe, &args, mode == "runtime", &[], Duration::from_secs(60))?;
        procs::pairs(&out)
            .first()
            .map(|p| p.pairs_per_s)
            .ok_or_else(|| "bench_alloc printed no figure".to_string())
    };
    let mut rows = Vec::new();
    for (mode, label) in [
        ("runtime", "cudaMalloc+cudaFree 1 MiB via shim"),
        ("glibc", "glibc malloc+free 1 MiB"),
    ] {
        match (run("1", mode), run("2", mode)) {
            (Ok(one), Ok(two)) => rows.push(
                Row::new(G, format!("{label}, 2 threads (pairs/s)"), two, "pairs/s")
                    .baseline("1 thread", one),
            ),
            (Err(err), _) | (_, Err(err)) => rows.push(Row::skipped(G, label, err)),
        }
    }
    rows
}

/// 5. Peak reserved / peak allocated, real process on simcuda.
fn frag_rows(procs: &Result<ProcEnv, String>) -> Vec<Row> {
    const G: &str = "5 frag";
    let run = |scenario: &str, shim: bool, expandable: bool| -> Result<(u64, u64), String> {
        let p = procs.as_ref().map_err(Clone::clone)?;
        let exe = p.compile("bench_frag")?;
        let env: &[(&str, &str)] = if expandable {
            &[("CUSHIM_ALLOC_CONF", "expandable_segments:True")]
        } else {
            &[]
        };
        let out = p.run(&exe, &[scenario], shim, env, Duration::from_secs(60))?;
        procs::frag(&out).ok_or_else(|| "bench_frag printed no figure".to_string())
    };
    let ratio = |(a, r): (u64, u64)| if a > 0 { r as f64 / a as f64 } else { 0.0 };
    let mut rows = Vec::new();
    for scenario in ["seed", "reverse", "serving"] {
        let plain = run(scenario, false, false);
        for (cfg, exp) in [("shim", false), ("shim + expandable segments", true)] {
            let name = format!("{scenario}: {cfg} (peak reserved / peak allocated)");
            match (run(scenario, true, exp), plain.clone()) {
                (Ok(m), Ok(p)) => {
                    let mut row = Row::new(
                        G,
                        format!("{name}; reserved {} MiB", m.1 / MIB),
                        ratio(m),
                        "",
                    )
                    .baseline("no shim (simcuda, uncached)", ratio(p));
                    if scenario == "seed" && exp {
                        row = row.target("128 MiB reserved (design)", m.1 == 128 * MIB);
                    }
                    rows.push(row);
                }
                (Err(err), _) | (_, Err(err)) => rows.push(Row::skipped(G, name, err)),
            }
        }
    }
    rows
}
