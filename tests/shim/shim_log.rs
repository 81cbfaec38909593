//! The whole-run event log (`CUSHIM_LOG`): every way to end leaves a log that reads, with
//! the program's events up to the end; a SIGKILL leaves every event written before it (the
//! writer flushes while the program runs); the readers take a log.

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cushim::trace::event::{Action, TraceEvent};
use cushim_tools::snapshot::log_reader::{read_log, LogFrame, LogInfo, LogVisitor};

fn prog() -> PathBuf {
    common::compile("shim_end", &[])
}

#[derive(Default)]
struct Collect {
    events: Vec<TraceEvent>,
    frames: usize,
    stacks: usize,
}

impl LogVisitor for Collect {
    fn event(&mut self, ev: TraceEvent) {
        self.events.push(ev);
    }
    fn frame(&mut self, _id: u64, _f: LogFrame) {
        self.frames += 1;
    }
    fn stack(&mut self, _id: u32, _frames: Vec<u64>) {
        self.stacks += 1;
    }
}

fn read(path: &Path) -> (LogInfo, Collect) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut c = Collect::default();
    let info = read_log(&bytes, &mut c).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (info, c)
}

fn allocs_of(c: &Collect, size: u64) -> usize {
    c.events
        .iter()
        .filter(|e| e.action == Action::Alloc && e.device == 0 && e.size == size)
        .count()
}

/// Run a `shim_end` case with the log (and the snapshot when `snapshot`).
fn run_case(sig: i32, case: &str, snapshot: bool, dir: &Path) -> std::process::Output {
    let mut cmd = common::shim_cmd(&prog());
    cmd.arg(sig.to_string())
        .arg(case)
        .env("CUSHIM_LOG", dir.join("run-%p.log"))
        .env("CUSHIM_HISTORY", "enabled=all,stacks=native");
    if snapshot {
        cmd.env("CUSHIM_SNAPSHOT", dir.join("snap-%n.pickle"));
    }
    common::run(common::default_signals_no_core(&mut cmd))
}

fn the_log(dir: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("reading the scratch directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(logs.len(), 1, "one log: {logs:?}");
    logs[0].clone()
}

#[test]
fn every_way_to_end_leaves_a_log_with_the_programs_events() {
    // (signal argument, case, status code, terminating signal, closed cleanly)
    type Case = (i32, &'static str, Option<i32>, Option<i32>, bool);
    let cases: &[Case] = &[
        (libc::SIGTERM, "default", None, Some(libc::SIGTERM), true),
        (libc::SIGINT, "default", None, Some(libc::SIGINT), true),
        (libc::SIGHUP, "default", None, Some(libc::SIGHUP), true),
        (libc::SIGQUIT, "default", None, Some(libc::SIGQUIT), true),
        (libc::SIGTERM, "flag_after", Some(0), None, true),
        (libc::SIGTERM, "flag_before", Some(0), None, true),
        (libc::SIGTERM, "reraise", None, Some(libc::SIGTERM), true),
        (libc::SIGTERM, "exit_handler", Some(3), None, true),
        (libc::SIGTERM, "segv", None, Some(libc::SIGSEGV), false),
        (libc::SIGTERM, "abort", None, Some(libc::SIGABRT), false),
    ];
    for &(sig, case, code, signal, ended) in cases {
        for snapshot in [false, true] {
            let dir = common::scratch(&format!("log-{sig}-{case}-{snapshot}"));
            let out = run_case(sig, case, snapshot, &dir);
            let what = format!(
                "{case} {sig} snapshot={snapshot}: stderr {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                (out.status.code(), out.status.signal()),
                (code, signal),
                "{what}"
            );
            let (info, c) = read(&the_log(&dir));
            assert_eq!(info.problem, None, "{what}");
            assert_eq!(info.ended, ended, "{what}");
            assert_eq!(allocs_of(&c, 8 << 20), 1, "{what}");
            assert_eq!(allocs_of(&c, 5 << 20), 1, "{what}");
            assert!(c.stacks > 0 || !ended, "stacks are written: {what}");
            if snapshot {
                assert!(dir.join("snap-0.pickle").exists() || !ended, "{what}");
            }
        }
    }
}

#[test]
fn events_of_two_sinks_recorded_in_turn_are_all_in_the_log_each_sink_in_its_own_order() {
    // Pinned host memory and the device have a ring each; 20000 rounds fill several of
    // each ring's blocks, so the writer merges the two rings' events round after round.
    let dir = common::scratch("shim-log-two-sinks");
    let n = 20_000usize;
    let mut cmd = common::shim_cmd(&prog());
    cmd.arg(n.to_string())
        .arg("pinned_loop")
        .env("CUSHIM_LOG", dir.join("run.log"))
        .env("CUSHIM_HISTORY", "enabled=all");
    let out = common::run(&mut cmd);
    assert!(out.status.success(), "{out:?}");
    let (info, c) = read(&dir.join("run.log"));
    assert!(
        info.ended && info.dropped == 0 && info.problem.is_none(),
        "{info:?}"
    );
    assert_eq!(info.events, c.events.len() as u64);
    for (device, size) in [(-1, 1024), (0, 3072)] {
        let evs: Vec<&TraceEvent> = c.events.iter().filter(|e| e.device == device).collect();
        let allocs = evs
            .iter()
            .filter(|e| e.action == Action::Alloc && e.size == size)
            .count();
        assert_eq!(allocs, n, "device {device}: every allocation");
        let frees = evs
            .iter()
            .filter(|e| e.action == Action::FreeRequested && e.size == size)
            .count();
        assert_eq!(frees, n, "device {device}: every free");
        assert!(
            evs.windows(2).all(|w| w[0].time_us <= w[1].time_us),
            "device {device}: its events in the order recorded"
        );
    }
}

#[test]
fn a_free_made_by_an_atexit_handler_of_the_program_is_in_the_log() {
    let dir = common::scratch("log-atexit");
    let out = run_case(0, "atexit_free", true, &dir);
    assert!(out.status.success(), "{out:?}");
    let (info, c) = read(&the_log(&dir));
    assert!(info.ended);
    let freed = c
        .events
        .iter()
        .filter(|e| e.action == Action::FreeRequested && e.size == 8 << 20)
        .count();
    assert_eq!(freed, 1, "the free made after main returned");
}

#[test]
fn the_header_records_the_process_and_its_settings() {
    let dir = common::scratch("log-header");
    let out = run_case(libc::SIGTERM, "flag_after", false, &dir);
    assert!(out.status.success(), "{out:?}");
    let (info, c) = read(&the_log(&dir));
    let h = &info.header;
    assert_eq!(h["version"], cushim::trace::log::format::VERSION);
    assert!(h["pid"].as_u64().is_some_and(|p| p > 0), "{h}");
    assert!(
        h["allocator_settings"]["expandable_segments"].is_boolean(),
        "{h}"
    );
    assert!(h["clock_origin_us"].as_i64().is_some(), "{h}");
    assert_eq!(
        allocs_of(&c, 3 << 20),
        1,
        "the allocation after the handled signal"
    );
    assert!(c.frames > 0);
}

/// Start the loop case with the log; returns the child and its stdout lines.
fn start_loop(
    n: u64,
    dir: &Path,
) -> (
    common::Killed,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut cmd = common::shim_cmd(&prog());
    let mut child = cmd
        .arg(n.to_string())
        .arg("loop")
        .env("CUSHIM_LOG", dir.join("run.log"))
        .env("CUSHIM_HISTORY", "enabled=all,stacks=none")
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the loop");
    let out = child.stdout.take().expect("stdout");
    (common::Killed(child), BufReader::new(out).lines())
}

#[test]
fn after_sigkill_the_log_holds_every_event_the_writer_had_time_to_write() {
    let n = 500_000u64; // a million alloc/free events, and more
    let dir = common::scratch("log-kill");
    let (mut child, mut lines) = start_loop(n, &dir);
    let line = lines.next().expect("a line").expect("reading");
    assert_eq!(line, "half");
    let line = lines.next().expect("a line").expect("reading");
    assert!(line.starts_with("made"), "{line}");
    let log = dir.join("run.log");
    // The program is idle now: the writer flushes on its own. Poll the file until it holds
    // every allocation, then kill.
    let mut polls = 0u64;
    loop {
        let (_, c) = read(&log);
        if allocs_of(&c, 1024) as u64 == n {
            break;
        }
        polls += 1;
        assert!(
            polls < 12_000,
            "the writer never flushed all {n} allocations"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let (info, c) = read(&log);
    assert!(!info.ended, "no clean end after SIGKILL");
    assert_eq!(info.problem, None);
    assert_eq!(allocs_of(&c, 1024) as u64, n);
    let frees = c
        .events
        .iter()
        .filter(|e| e.action == Action::FreeRequested && e.size == 1024)
        .count() as u64;
    assert_eq!(frees, n);
}

#[test]
fn a_sigkill_in_the_middle_of_a_run_leaves_a_log_that_reads() {
    let dir = common::scratch("log-kill-mid");
    let (mut child, mut lines) = start_loop(2_000_000, &dir);
    let line = lines.next().expect("a line").expect("reading");
    assert_eq!(line, "half");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let (info, c) = read(&dir.join("run.log"));
    assert!(!info.ended);
    let allocs = allocs_of(&c, 1024);
    assert!(allocs <= 2_000_000, "{allocs}");
}

#[test]
fn summary_and_replay_read_a_log() {
    let dir = common::scratch("log-summary");
    let out = run_case(libc::SIGTERM, "flag_after", false, &dir);
    assert!(out.status.success(), "{out:?}");
    let log = the_log(&dir);
    for cmd in ["summary", "replay"] {
        let out = Command::new(common::cushim_bin())
            .arg(cmd)
            .arg(&log)
            .output()
            .expect("running cushim");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cmd}: {out:?}");
        assert!(
            text.contains("16.00 MiB") || text.contains("16.0 MiB"),
            "{cmd}: {text}"
        );
        if cmd == "summary" {
            // The log records every segment from the run's start: the reserved memory is
            // known from its events, as `cushim snapshot LOG` shows it.
            let reserved = text
                .lines()
                .find(|l| l.trim_start().starts_with("reserved:"))
                .unwrap_or_else(|| panic!("no reserved line: {text}"));
            assert!(!reserved.contains("not recorded"), "{text}");
        }
    }
}

#[test]
fn cushim_snapshot_writes_the_state_of_a_moment_of_a_log() {
    let dir = common::scratch("log-moment");
    let out = run_case(libc::SIGTERM, "flag_after", false, &dir);
    assert!(out.status.success(), "{out:?}");
    let log = the_log(&dir);
    let (_, c) = read(&log);
    let allocs = c
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count();
    for (args, live, events) in [
        (vec!["--end"], 16u64 << 20, c.events.len()),
        (vec!["--peak"], 16 << 20, c.events.len()),
        (vec!["--at", "0"], 0, 0),
        (vec!["--end", "--events", "2"], 16 << 20, 2),
    ] {
        let out_path = dir.join("moment.pickle");
        let out = Command::new(common::cushim_bin())
            .arg("snapshot")
            .arg(&log)
            .args(&args)
            .arg("-o")
            .arg(&out_path)
            .output()
            .expect("running cushim snapshot");
        assert!(out.status.success(), "{args:?}: {out:?}");
        let v = common::load_snapshot(&out_path);
        let segs = v["segments"].as_array().expect("segments");
        let mut allocated = 0;
        for s in segs {
            let blocks = s["blocks"].as_array().expect("blocks");
            let tiled: u64 = blocks.iter().map(|b| b["size"].as_u64().unwrap_or(0)).sum();
            assert_eq!(
                Some(tiled),
                s["total_size"].as_u64(),
                "{args:?}: blocks tile {s}"
            );
            allocated += s["allocated_size"].as_u64().unwrap_or(0);
        }
        assert_eq!(allocated, live, "{args:?}");
        let traced = v["device_traces"].as_array().map_or(0, |t| {
            t.iter().map(|d| d.as_array().map_or(0, Vec::len)).sum()
        });
        assert_eq!(traced, events, "{args:?}");
    }
    assert_eq!(allocs, 3);
    // A moment after the log's last event is refused in one line, not answered with the end.
    let out = Command::new(common::cushim_bin())
        .arg("snapshot")
        .arg(&log)
        .args(["--at", "100000", "-o"])
        .arg(dir.join("late.pickle"))
        .output()
        .expect("running cushim snapshot");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--at 100000: past the log's end") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!dir.join("late.pickle").exists());
}

#[test]
fn a_log_carries_nvtx_range_paths_into_cushim_snapshot() {
    let dir = common::scratch("log-nvtx");
    let Some(log) = common::nvtx::logged_run(&dir) else {
        return;
    };
    let snap = dir.join("end.json");
    let out = Command::new(common::cushim_bin())
        .arg("snapshot")
        .arg(&log)
        .args(["--end", "-o"])
        .arg(&snap)
        .output()
        .expect("running cushim snapshot");
    assert!(out.status.success(), "{out:?}");
    let v = common::load_snapshot(&snap);
    let trace = v["device_traces"][0].as_array().expect("device 0's trace");
    let path_of = |mib: u64| -> Option<String> {
        let e = trace
            .iter()
            .find(|e| e["action"] == "alloc" && e["size"].as_u64() == Some(mib << 20))
            .unwrap_or_else(|| panic!("no alloc of {mib} MiB in {trace:?}"));
        e.get("user_metadata")
            .and_then(|m| m.as_str())
            .map(String::from)
    };
    // The paths the live snapshot gives the same program (tests/shim/shim_nvtx.rs).
    for (mib, path) in common::nvtx::RANGES_PROGRAM_PATHS {
        assert_eq!(path_of(mib).as_deref(), path, "the {mib} MiB allocation");
    }
}

/// Run an NVTX test program with both the log and the exit snapshot; returns their paths.
fn nvtx_run(exe: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let (log, snap) = (dir.join("run.log"), dir.join("end.pickle"));
    let out = common::run_ok(
        common::shim_cmd(exe)
            .env("NVTX_INJECTION64_PATH", common::shim_path())
            .env("CUSHIM_LOG", &log)
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=none"),
    );
    assert!(out.contains("ok"), "{out}");
    (log, snap)
}

fn by_range(file: &Path) -> String {
    common::run_ok(
        Command::new(common::cushim_bin())
            .args(["summary", "--by", "range"])
            .arg(file),
    )
}

#[test]
fn the_log_records_range_starts_and_ends_so_summary_by_range_tells_what_outlived_its_range() {
    let Some(exe) = common::nvtx::program_named("nvtx_leak") else {
        return;
    };
    let dir = common::scratch("log-nvtx-leak");
    let (log, _) = nvtx_run(&exe, &dir);
    #[derive(Default)]
    struct Marks(Vec<cushim::trace::log::codec::RangeMark>);
    impl LogVisitor for Marks {
        fn event(&mut self, _ev: TraceEvent) {}
        fn frame(&mut self, _id: u64, _f: LogFrame) {}
        fn stack(&mut self, _id: u32, _frames: Vec<u64>) {}
        fn range_mark(&mut self, m: cushim::trace::log::codec::RangeMark) {
            self.0.push(m);
        }
    }
    let mut marks = Marks::default();
    let bytes = std::fs::read(&log).expect("the log");
    read_log(&bytes, &mut marks).expect("the log reads");
    // "train" and five "iteration"s, each started and ended (the first two opened before
    // the program's first CUDA call started the log).
    let starts = marks.0.iter().filter(|m| m.start).count();
    let ends = marks.0.iter().filter(|m| !m.start).count();
    assert_eq!((starts, ends), (6, 6), "{:?}", marks.0);
    let line = "5 of 10 allocations (10.0 MiB) made in train/iteration outlived the range \
                (5 still live at the end)";
    let out = by_range(&log);
    assert!(out.contains(line), "{out}");
    // The report's range section reads the log too.
    let page = dir.join("r.html");
    common::run_ok(
        Command::new(common::cushim_bin())
            .arg("report")
            .arg(&log)
            .arg("-o")
            .arg(&page),
    );
    let html = std::fs::read_to_string(&page).expect("the report");
    assert!(html.contains(line), "the report's range section: {line}");
}

#[test]
fn summary_by_range_of_a_log_says_what_it_says_of_the_snapshot_of_the_same_run() {
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let dir = common::scratch("log-nvtx-by-range");
    let (log, snap) = nvtx_run(&exe, &dir);
    let (from_log, from_snap) = (by_range(&log), by_range(&snap));
    assert!(from_log.contains("peak 27.0 MiB live"), "{from_log}");
    assert_eq!(from_log, from_snap);
}

#[test]
fn cushim_snapshot_of_a_log_carries_its_range_starts_and_ends_as_the_live_snapshot_does() {
    let Some(exe) = common::nvtx::program() else {
        return;
    };
    let dir = common::scratch("log-nvtx-annotations");
    let (log, snap) = nvtx_run(&exe, &dir);
    let end = dir.join("from-log.pickle");
    common::run_ok(
        Command::new(common::cushim_bin())
            .arg("snapshot")
            .arg(&log)
            .args(["--end", "-o"])
            .arg(&end),
    );
    let marks = |file: &Path| -> Vec<(String, String, String)> {
        let v = common::load_snapshot(file);
        let list = v["external_annotations"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no external_annotations", file.display()));
        list.iter()
            .map(|a| {
                let f = |k: &str| a[k].as_str().unwrap_or_default().to_string();
                (f("stage"), f("name"), f("range"))
            })
            .collect()
    };
    let (live, from_log) = (marks(&snap), marks(&end));
    assert!(
        live.iter().any(|(stage, _, _)| stage == "START"),
        "{live:?}"
    );
    assert_eq!(from_log, live);
    // The ranges also read from the snapshot of the log, as from the live one.
    assert_eq!(by_range(&end), by_range(&snap));
}

#[test]
fn events_just_before_a_crash_have_their_stacks_in_the_log() {
    #[derive(Default)]
    struct Stacks {
        events: Vec<TraceEvent>,
        frames: std::collections::HashMap<u32, usize>,
    }
    impl LogVisitor for Stacks {
        fn event(&mut self, ev: TraceEvent) {
            self.events.push(ev);
        }
        fn frame(&mut self, _id: u64, _f: LogFrame) {}
        fn stack(&mut self, id: u32, frames: Vec<u64>) {
            self.frames.insert(id, frames.len());
        }
    }
    // The program crashes right after its first allocations: their stacks are new, and only
    // the crash path's wait for the writer's tables puts them in the log.
    for (case, signal) in [("segv", libc::SIGSEGV), ("abort", libc::SIGABRT)] {
        let dir = common::scratch(&format!("log-crash-stacks-{case}"));
        let out = run_case(libc::SIGTERM, case, false, &dir);
        assert_eq!(out.status.signal(), Some(signal), "{case}: {out:?}");
        let bytes = std::fs::read(the_log(&dir)).expect("reading the log");
        let mut s = Stacks::default();
        let info = read_log(&bytes, &mut s).expect("the log reads");
        assert_eq!(info.problem, None, "{case}");
        for size in [8u64 << 20, 5 << 20] {
            let e = s
                .events
                .iter()
                .find(|e| e.action == Action::Alloc && e.device == 0 && e.size == size)
                .unwrap_or_else(|| panic!("{case}: no alloc of {size} in the log"));
            assert_ne!(e.stack, cushim::trace::event::NO_STACK, "{case}: {e:?}");
            assert!(
                s.frames.get(&e.stack).is_some_and(|&n| n > 0),
                "{case}: the stack of the {size}-byte alloc is in the log: {e:?}, stacks {:?}",
                s.frames
            );
        }
    }
}

/// How a SIGKILL meets the `steps` program at a checkpoint.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// Paused at the checkpoint, after the log was seen to hold it.
    PausedFlushed,
    /// Told to go on after the log was seen to hold the checkpoint: killed while it runs.
    Running,
    /// Paused at the checkpoint before anyone looked at the log.
    PausedUnseen,
}

#[test]
fn sigkill_at_chosen_moments_keeps_every_event_before_a_checkpoint_seen_in_the_log() {
    // About a million events: 3 a pair.
    let n = 333_336u64;
    let quarter = n / 4;
    for (stop, how) in [
        (1u64, KillAt::PausedFlushed),
        (2, KillAt::Running),
        (3, KillAt::PausedUnseen),
    ] {
        let dir = common::scratch(&format!("log-kill-steps-{stop}"));
        let log = dir.join("run.log");
        let mut child = common::shim_cmd(&prog())
            .arg(n.to_string())
            .arg("steps")
            .env("CUSHIM_LOG", &log)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=none")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the program");
        let mut stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut child = common::Killed(child);
        // The checkpoint: pairs the program reported done whose events the log was seen to
        // hold (the program waits at each checkpoint, so what it reported is exactly that).
        let mut seen = 0u64;
        for k in 1..=stop {
            let line = lines.next().expect("a line").expect("reading");
            assert_eq!(line, format!("done {}", k * quarter), "{how:?}");
            let last = k == stop;
            if !(last && matches!(how, KillAt::PausedUnseen)) {
                // Poll the log until it holds the checkpoint (the writer flushes on its own).
                let mut polls = 0u64;
                while (allocs_of(&read(&log).1, 1024) as u64) < k * quarter {
                    polls += 1;
                    assert!(
                        polls < 60_000,
                        "{how:?}: the writer never flushed checkpoint {k}"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                seen = k * quarter;
            }
            if !last || matches!(how, KillAt::Running) {
                use std::io::Write;
                writeln!(stdin, "go").expect("telling the program to go on");
            }
        }
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        let bytes = std::fs::read(&log).expect("reading the log");
        let mut c = Collect::default();
        let info = read_log(&bytes, &mut c).unwrap_or_else(|e| panic!("{how:?}: {e}"));
        assert!(!info.ended, "{how:?}: no clean end after SIGKILL");
        let allocs = allocs_of(&c, 1024) as u64;
        let frees = c
            .events
            .iter()
            .filter(|e| e.action == Action::FreeCompleted && e.size == 1024)
            .count() as u64;
        assert!(
            allocs >= seen && frees >= seen,
            "{how:?}: {allocs} allocs and {frees} frees, {seen} pairs seen flushed ({:?})",
            info.problem
        );
        assert!(allocs <= n, "{how:?}: {allocs}");
        if matches!(how, KillAt::PausedFlushed) {
            assert_eq!(allocs, seen, "{how:?}: paused: nothing more was made");
        }
    }
}

/// Run `shim_fork alloc 2` (two threads allocate while the main thread forks two children
/// that each allocate and free 8 blocks of 700 KiB x 1..8, then write a snapshot) with the
/// log template `log`.
fn fork_run(dir: &Path, log: &str) -> (String, String, Vec<String>) {
    let exe = common::compile("shim_fork", &[]);
    let out = common::run(
        common::shim_cmd(&exe)
            .args(["alloc", "2"])
            .env("CUSHIM_LOG", dir.join(log))
            .env("CUSHIM_SNAPSHOT", dir.join("snap-%p-%n.pickle"))
            .env("CUSHIM_HISTORY", "enabled=all,stacks=none"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ok=2"), "{stdout}");
    let children = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pids="))
        .map(|p| p.split(',').map(String::from).collect::<Vec<_>>())
        .unwrap_or_default();
    assert_eq!(children.len(), 2, "{stdout}");
    (stdout, stderr, children)
}

const CHILD_BLOCK: u64 = 700 * 1024;

#[test]
fn a_fork_child_writes_a_log_of_its_own_with_its_events_and_the_parents_log_goes_on() {
    let dir = common::scratch("log-fork");
    let (_, stderr, children) = fork_run(&dir, "run-%p.log");
    assert!(!stderr.contains("does not write"), "{stderr}");
    let mut parent = None;
    let mut child_logs = 0;
    for entry in std::fs::read_dir(&dir).expect("the scratch directory") {
        let path = entry.expect("an entry").path();
        if path.extension().map_or(true, |x| x != "log") {
            continue;
        }
        let (info, c) = read(&path);
        assert!(info.ended, "{}: {info:?}", path.display());
        let pid = info.header["pid"].to_string();
        if !children.contains(&pid) {
            assert!(parent.is_none(), "one parent log");
            parent = Some((info, c));
            continue;
        }
        // The child's log: its own 8 allocations and frees, nothing of its parent's (the
        // parent's threads were allocating 1 MiB blocks at the fork).
        let allocs: Vec<u64> = c
            .events
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .map(|e| e.size)
            .collect();
        let child_allocs: Vec<u64> = (1..=8).map(|k| k * CHILD_BLOCK).collect();
        assert_eq!(allocs, child_allocs, "{}", path.display());
        let frees = c
            .events
            .iter()
            .filter(|e| e.action == Action::FreeRequested);
        assert_eq!(frees.count(), 8, "{}", path.display());
        assert!(info.header["parent_pid"].is_u64(), "{:?}", info.header);
        child_logs += 1;
    }
    assert_eq!(child_logs, 2, "each child wrote its own log");
    let (info, c) = parent.expect("the parent's log");
    let pid = info.header["pid"].to_string();
    assert!(!children.contains(&pid));
    assert!(
        c.events.iter().any(|e| e.action == Action::Alloc),
        "the parent's allocations are in its log"
    );
    let child_allocs: Vec<u64> = (1..=8).map(|k| k * CHILD_BLOCK).collect();
    let parent_allocs: Vec<u64> = c
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.size)
        .collect();
    assert!(
        !parent_allocs.windows(8).any(|w| w == child_allocs),
        "no child's allocations are in the parent's log"
    );
}

#[test]
fn a_fork_child_does_not_log_when_the_template_has_no_pid_and_says_so_once() {
    let dir = common::scratch("log-fork-nopid");
    let (_, stderr, children) = fork_run(&dir, "run.log");
    let said = stderr
        .matches("is a fork child: it does not write an event log, because CUSHIM_LOG has no %p")
        .count();
    assert_eq!(said, 2, "{stderr}");
    let (info, c) = read(&the_log(&dir));
    assert!(info.ended, "{info:?}");
    assert!(!children.contains(&info.header["pid"].to_string()));
    assert!(c.events.iter().any(|e| e.action == Action::Alloc));
}

#[test]
fn cushim_snapshot_of_a_log_shows_an_expandable_segment_whole_with_blocks_that_span_its_pages() {
    // A 50 MiB block mapped as three pages, then a 20 MiB one on a fourth: at the peak both
    // are live in one reservation's mapped run.
    let dir = common::scratch("log-expandable");
    let log = dir.join("run.log");
    let out = common::run_ok(
        common::shim_cmd(&common::compile("shim_expandable", &[]))
            .arg("growth")
            .env("CUSHIM_ALLOC_CONF", "expandable_segments:True")
            .env("CUSHIM_LOG", &log)
            .env("CUSHIM_HISTORY", "enabled=all,stacks=none"),
    );
    assert!(out.contains("written=1"), "{out}");
    let (_, c) = read(&log);
    let maps = c
        .events
        .iter()
        .filter(|e| e.action == Action::SegmentMap)
        .count();
    assert!(maps >= 2, "the growths map several pages: {maps}");
    let snap = dir.join("peak.pickle");
    let out = Command::new(common::cushim_bin())
        .arg("snapshot")
        .arg(&log)
        .args(["--peak", "-o"])
        .arg(&snap)
        .output()
        .expect("running cushim snapshot");
    assert!(out.status.success(), "{out:?}");
    let v = common::load_snapshot(&snap);
    let segs = v["segments"].as_array().expect("segments");
    assert_eq!(segs.len(), 1, "one mapped run, one segment: {segs:?}");
    let s = &segs[0];
    assert_eq!(s["is_expandable"].as_bool(), Some(true));
    assert_eq!(s["segment_type"].as_str(), Some("large"));
    assert_eq!(s["total_size"].as_u64(), Some(70 << 20));
    let blocks = s["blocks"].as_array().expect("blocks");
    let sizes: Vec<u64> = blocks
        .iter()
        .filter(|b| b["state"].as_str() == Some("active_allocated"))
        .map(|b| b["size"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(sizes, vec![50 << 20, 20 << 20], "{blocks:?}");
    assert_eq!(s["allocated_size"].as_u64(), Some(70 << 20));
}

/// The lines of a `cushim report` page that depend only on the trace (not on whether the
/// input lists its segments or records its device size): the peak, the timeline, the
/// sites and flame graph at the peak, and the replays' rows.
fn trace_lines(page: &str) -> Vec<String> {
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    let mut in_sites = false;
    for l in lines {
        if l.starts_with("<h3>top allocation sites") {
            in_sites = true;
        }
        if in_sites || l.starts_with("<p>peak allocated") || l.starts_with("<svg") {
            out.push(l.to_string());
        }
        if l.starts_with("<tr><td>replay: ") {
            out.push(l.to_string());
        }
        if l.starts_with("</table>") {
            in_sites = false;
        }
    }
    out
}

#[test]
fn report_of_a_log_agrees_with_report_of_the_snapshot_of_the_same_run() {
    let dir = common::scratch("log-report");
    let log = dir.join("run.log");
    let snap = dir.join("snap.pickle");
    let mut cmd = common::shim_cmd(&prog());
    cmd.args(["1000", "loop"])
        .env("SHIM_END_EXIT", "1")
        .env("CUSHIM_LOG", &log)
        .env("CUSHIM_SNAPSHOT", &snap)
        .env("CUSHIM_HISTORY", "enabled=all,stacks=native");
    let out = common::run(&mut cmd);
    assert!(out.status.success(), "{out:?}");
    let page = |input: &Path, name: &str| -> String {
        let html = dir.join(name);
        let out = Command::new(common::cushim_bin())
            .arg("report")
            .arg(input)
            .arg("-o")
            .arg(&html)
            .output()
            .expect("running cushim report");
        assert!(out.status.success(), "{}: {out:?}", input.display());
        std::fs::read_to_string(&html).expect("reading the page")
    };
    let (from_log, from_snap) = (page(&log, "log.html"), page(&snap, "snap.html"));
    let (a, b) = (trace_lines(&from_log), trace_lines(&from_snap));
    // Peak, timeline, sites, flame graph and the 7 replay rows.
    assert!(a.len() >= 10, "{from_log}");
    assert!(
        a.iter().any(|l| l.contains("peak allocated 13.0 MiB")),
        "{from_log}"
    );
    assert_eq!(a, b, "the log's page against the snapshot's");
    // A log records every segment from the run's start: the page shows the segments at the
    // peak and the recorded row's peak reserved, as the summary below it does, and as the
    // snapshot's page shows them.
    let section = |page: &str| -> String {
        let from = page
            .find("<h3>segments at the peak")
            .unwrap_or_else(|| panic!("no segments at the peak:\n{page}"));
        let rest = &page[from..];
        rest[..rest.find("<h3>replay under").unwrap_or(rest.len())].to_string()
    };
    assert_eq!(section(&from_log), section(&from_snap));
    let recorded = |page: &str| -> String {
        page.lines()
            .find(|l| l.starts_with("<tr><td>recorded</td>"))
            .unwrap_or_else(|| panic!("no recorded row:\n{page}"))
            .to_string()
    };
    assert!(
        !recorded(&from_log).starts_with("<tr><td>recorded</td><td>-</td>"),
        "{}",
        recorded(&from_log)
    );
    assert_eq!(recorded(&from_log), recorded(&from_snap));
}
