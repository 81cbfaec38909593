//! Sleep mode: memory paused by tag gives its device memory back (to another process on the
//! same GPU) and keeps its addresses; resumed, it holds its backed-up bytes again. Pause and
//! resume are all or nothing under faults, and bad requests are harmless.
use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile("shim_sleep", &["-ldl"]))
}

const SLEEP: (&str, &str) = ("CUSHIM_ALLOC_CONF", "sleep_mode:True");

/// One worker process of the alternation, driven line by line.
struct Worker {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    role: &'static str,
}

impl Worker {
    fn start(role: &'static str, env: &[(&str, &str)], report: &std::path::Path) -> Worker {
        let mut child = common::shim_cmd(exe())
            .args(["worker", role])
            .envs(env.iter().copied())
            .env("SIMCUDA_REPORT", report)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting a worker");
        let input = child.stdin.take().expect("worker stdin");
        let output = BufReader::new(child.stdout.take().expect("worker stdout"));
        Worker {
            child,
            input,
            output,
            role,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.output.read_line(&mut l).expect("reading a worker");
        l.trim().to_string()
    }

    fn ask(&mut self, what: &str) -> String {
        writeln!(self.input, "{what}").expect("writing to a worker");
        self.input.flush().expect("flushing to a worker");
        let l = self.line();
        assert!(!l.is_empty(), "worker {} ended at '{what}'", self.role);
        l
    }

    fn finish(mut self) {
        assert_eq!(self.ask("quit"), "bye");
        drop(self.input);
        let out = self.child.wait_with_output().expect("worker exit");
        assert!(
            out.status.success(),
            "worker {} failed: {:?}",
            self.role,
            out.status
        );
    }
}

fn shared_env(key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SIMCUDA_SHARED", "1".into()),
        ("SIMCUDA_SHARED_KEY", key.into()),
        // Each worker holds 60 MiB; two do not fit in 100.
        ("SIMCUDA_MEM_MB", "100".into()),
    ]
}

fn key_of(dir: &std::path::Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .expect("scratch name")
        .to_string()
}

fn remove_ledger(key: &str) {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let _ = std::fs::remove_file(format!("/dev/shm/simcuda-shared-uid{uid}-{key}"));
}

#[test]
fn two_processes_on_one_gpu_alternate_by_pausing_and_keep_their_backed_up_bytes() {
    let dir = common::scratch("sleep-alternate");
    let key = key_of(&dir);
    let owned = shared_env(&key);
    let mut env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(SLEEP);
    let mut a = Worker::start("trainer", &env, &dir.join("a.json"));
    assert_eq!(a.line(), "ready 0 0");
    let mut b = Worker::start("rollout", &env, &dir.join("b.json"));
    assert_eq!(b.line(), "ready 0 0");
    for round in 0..20 {
        let r = a.ask("resume");
        // Backed-up weights come back identical; the discarded KV cache does not keep what
        // was written before the pause.
        assert_eq!(
            r, "resumed weights_identical=1 kv_discarded=1 paused 0",
            "round {round}"
        );
        if round == 0 {
            // The trainer holds the GPU: the rollout's resume fails, and its tags stay
            // paused, whole, resumable later.
            let r = b.ask("resume");
            assert_eq!(r, format!("refused 2 paused {}", 60 << 20));
        }
        assert_eq!(a.ask("work"), "worked");
        let p = a.ask("pause");
        assert!(p.starts_with("paused 0 0 bytes "), "{p}");
        assert!(p.ends_with("use_after_pause=700"), "{p}");
        let r = b.ask("resume");
        // Backed-up weights come back identical; the discarded KV cache does not keep what
        // was written before the pause.
        assert_eq!(
            r, "resumed weights_identical=1 kv_discarded=1 paused 0",
            "round {round}"
        );
        assert_eq!(b.ask("work"), "worked");
        let p = b.ask("pause");
        assert!(p.starts_with("paused 0 0 bytes "), "{p}");
    }
    a.finish();
    b.finish();
    for r in ["a.json", "b.json"] {
        let report = common::read_report(&dir.join(r));
        let dev = &report["devices"][0];
        assert_eq!(dev["live_physical_handles"], 0, "{r}: {report}");
        assert_eq!(dev["live_reservations"], 0, "{r}: {report}");
    }
    remove_ledger(&key);
}

#[test]
fn without_sleep_mode_the_second_process_runs_out_of_memory() {
    let dir = common::scratch("sleep-off-oom");
    let key = key_of(&dir);
    let owned = shared_env(&key);
    let env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut a = Worker::start("trainer", &env, &dir.join("a.json"));
    // Pause refuses (sleep mode off): the trainer keeps its 60 MiB.
    assert_eq!(a.line(), "ready 801 801");
    let mut b = Worker::start("rollout", &env, &dir.join("b.json"));
    let l = b.line();
    assert!(l.starts_with("out of memory allocating"), "{l}");
    drop(b.input);
    assert_eq!(b.child.wait().expect("rollout exit").code(), Some(4));
    a.finish();
    remove_ledger(&key);
}

#[test]
fn pause_and_resume_under_injected_vmm_faults_leave_the_tag_whole_and_release_every_handle() {
    let dir = common::scratch("sleep-faults");
    for (i, fault) in [
        "cuMemUnmap@2",
        "cuMemUnmap@every:2",
        "cuMemCreate@3",
        "cuMemCreate@every:3",
        "cuMemMap@3",
        "cuMemMap@every:2",
        "cuMemSetAccess@3",
        "cuMemSetAccess@every:2",
        "cuMemRelease@2",
        "cuMemRelease@every:2",
        "cuMemcpyDtoH_v2@1",
        "cuMemcpyHtoD_v2@2",
        "cuMemHostAlloc@1",
    ]
    .iter()
    .enumerate()
    {
        let report = dir.join(format!("report-{i}.json"));
        let mut cmd = common::shim_cmd(exe());
        cmd.arg("faults")
            .env("CUSHIM_ALLOC_CONF", "sleep_mode:True")
            .env("SIMCUDA_FAIL", fault)
            .env("SIMCUDA_REPORT", &report);
        let out = common::run_ok(&mut cmd);
        assert!(out.contains("faults pause_failed="), "{fault}: {out}");
        let r = common::read_report(&report);
        let dev = &r["devices"][0];
        assert_eq!(dev["live_physical_handles"], 0, "{fault}: {r}");
        assert_eq!(dev["live_reservations"], 0, "{fault}: {r}");
        assert_eq!(dev["live_allocations"], 0, "{fault}: {r}");
    }
}

#[test]
fn unknown_tags_double_pauses_and_resuming_what_is_live_change_nothing() {
    let mut cmd = common::shim_cmd(exe());
    cmd.arg("bad_input")
        .env("CUSHIM_ALLOC_CONF", "sleep_mode:True");
    let out = common::run_ok(&mut cmd);
    assert!(out.contains("bad_input ok"), "{out}");
}

#[test]
fn backups_laid_across_several_host_buffers_come_back_byte_for_byte() {
    let mut cmd = common::shim_cmd(exe());
    cmd.arg("spans")
        .env(SLEEP.0, SLEEP.1)
        .env("SIMCUDA_MEM_MB", "1024");
    let out = common::run_ok(&mut cmd);
    assert!(out.contains("spans ok"), "{out}");
}

#[test]
fn a_backup_changed_while_paused_fails_its_resume_and_stays_paused_until_it_matches_again() {
    let mut cmd = common::shim_cmd(exe());
    cmd.arg("corrupt").env(SLEEP.0, SLEEP.1);
    let out = common::run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("corrupt ok"), "{stdout}");
    assert!(
        stderr.contains("does not match its checksum"),
        "the failed resume says why: {stderr}"
    );
}

#[test]
fn pause_without_sleep_mode_is_one_clear_error() {
    let mut cmd = common::shim_cmd(exe());
    cmd.arg("off");
    let out = common::run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("off ok"));
    assert!(
        stderr.contains("sleep mode is off (set sleep_mode:True in CUSHIM_ALLOC_CONF)"),
        "{stderr}"
    );
}

#[test]
fn cushim_pause_and_resume_reach_an_unmodified_running_program_and_answer_with_bytes() {
    let dir = common::scratch("sleep-cli");
    let mut w = Worker::start("trainer", &[SLEEP], &dir.join("a.json"));
    assert_eq!(w.line(), "ready 0 0");
    let r = w.ask("resume");
    assert!(r.starts_with("resumed weights_identical=1 "), "{r}");
    assert_eq!(w.ask("work"), "worked");
    let pid = w.child.id().to_string();
    let out = common::run_ok(
        std::process::Command::new(common::cushim_bin())
            .args(["pause", &pid, "weights", "--backup"]),
    );
    // 24 MiB of weights, a multiple of the 2 MiB granularity.
    assert_eq!(
        out.trim(),
        format!(
            "paused {} bytes of tag 'weights' in process {pid} (backup)",
            24 << 20
        )
    );
    // Pausing again releases nothing more.
    let out = common::run_ok(
        std::process::Command::new(common::cushim_bin()).args(["pause", &pid, "weights"]),
    );
    assert!(out.starts_with("paused 0 bytes"), "{out}");
    let out =
        common::run_ok(std::process::Command::new(common::cushim_bin()).args(["resume", &pid]));
    assert_eq!(
        out.trim(),
        format!("resumed {} bytes of every tag in process {pid}", 24 << 20)
    );
    // The program finds its bytes where it left them (its KV cache was never paused).
    let r = w.ask("resume");
    assert_eq!(r, "resumed weights_identical=1 kv_discarded=0 paused 0");
    w.finish();
}

#[test]
fn cushim_pause_refuses_a_process_without_sleep_mode_and_one_without_the_shim() {
    let dir = common::scratch("sleep-cli-refuse");
    let mut w = Worker::start("trainer", &[], &dir.join("a.json"));
    assert_eq!(w.line(), "ready 801 801");
    let pid = w.child.id().to_string();
    let out = common::run(
        std::process::Command::new(common::cushim_bin()).args(["pause", &pid, "weights"]),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runs without sleep mode"), "{err}");
    w.finish();
    let mut plain = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("starting sleep");
    let out = common::run(
        std::process::Command::new(common::cushim_bin()).args(["resume", &plain.id().to_string()]),
    );
    let _ = plain.kill();
    let _ = plain.wait();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has not loaded"), "{err}");
}

#[test]
fn the_python_module_pauses_and_resumes_a_region_with_its_bytes() {
    let dir = common::scratch("sleep-python");
    let snap = dir.join("paused.json");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = common::shim_cmd(std::path::Path::new("python3"));
    cmd.arg(root.join("tests/py/sleep_region.py"))
        .env("PYTHONPATH", root.join("python"))
        .env("SLEEP_SNAPSHOT", &snap)
        .env("CUSHIM_HISTORY", "enabled=all,stacks=none")
        .env("CUSHIM_ALLOC_CONF", "sleep_mode:True");
    let out = common::run_ok(&mut cmd);
    // The snapshot taken while paused marks the block and holds the pause event.
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&snap).expect("snapshot written")).expect("json");
    let paused: Vec<&serde_json::Value> = s["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .filter(|g| g["kind"] == "paused")
        .collect();
    assert_eq!(paused.len(), 1, "{}", s["segments"]);
    // The 4 MiB tensor's segment: 20 MiB, as the cache makes one for a request under 10 MiB.
    assert_eq!(paused[0]["total_size"], 20 << 20);
    let trace = s["device_traces"][0].as_array().expect("trace");
    assert!(trace.iter().any(|e| e["action"] == "pause"), "{trace:?}");
    let summary = common::run_ok(Command::new(common::cushim_bin()).arg("summary").arg(&snap));
    assert!(summary.contains("paused"), "{summary}");
    let want = format!(
        "available True\npaused {}\nagain {}\nunknown 0\nafter resume 0\nidentical True\npop error 1\n",
        20 << 20,
        20 << 20
    );
    assert_eq!(out, want);
}

#[test]
fn a_pause_during_a_graph_capture_is_refused_with_code_900_and_one_line_saying_why() {
    let mut cmd = common::shim_cmd(exe());
    cmd.arg("capture")
        .env("CUSHIM_ALLOC_CONF", "sleep_mode:True");
    let out = common::run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("capture ok"), "{stdout}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("refused: a CUDA graph capture is running"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("a captured graph may use its memory whenever it is launched"),
        "{stderr}"
    );
}

#[test]
fn cushim_pause_reaches_a_forked_child_through_its_own_request_thread() {
    use std::io::BufRead;
    let mut cmd = common::shim_cmd(exe());
    cmd.arg("forked")
        .env("CUSHIM_ALLOC_CONF", "sleep_mode:True")
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("starting the forking program");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("reading the child's pid");
    let pid = line
        .trim()
        .strip_prefix("child ")
        .unwrap_or_else(|| panic!("no pid line: {line:?}"))
        .to_string();
    let answer = common::run_ok(
        std::process::Command::new(common::cushim_bin()).args(["pause", &pid, "weights"]),
    );
    assert_eq!(
        answer.trim(),
        format!(
            "paused {} bytes of tag 'weights' in process {pid} (discard)",
            20 << 20
        )
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("reading the rest");
    assert_eq!(rest.trim(), format!("child paused {}", 20 << 20));
    let status = child.wait().expect("waiting for the program");
    assert!(status.success(), "{status}");
}

/// Whether `v` (a snapshot) shows the `trace` case: three allocs from make_block and two
/// frees from drop_block in device 0's trace, each with the program's call site as its first
/// frame, and the live 4 KiB block from make_block inside its 2 MiB segment.
fn shows_each_sleep_allocation(v: &serde_json::Value, what: &str) {
    let alloc_line = common::call_line("shim_sleep.c", "make_block", "cudaMalloc(");
    let free_line = common::call_line("shim_sleep.c", "drop_block", "cudaFree(");
    let trace = v["device_traces"][0].as_array().expect("device_traces[0]");
    let from = |action: &str, name: &str, line: u64| {
        trace
            .iter()
            .filter(|t| {
                t["action"] == action
                    && common::is_frame(&t["frames"][0], "shim_sleep.c", name, line)
            })
            .map(|t| t["size"].as_u64().unwrap_or(0))
            .collect::<Vec<u64>>()
    };
    assert_eq!(
        from("alloc", "make_block", alloc_line),
        vec![4096, 8192, 4096],
        "{what}: each alloc, the cached ones too, with its call site: {trace:?}"
    );
    assert_eq!(
        from("free_requested", "drop_block", free_line),
        vec![4096, 8192],
        "{what}: each free with its call site"
    );
    let live = v["segments"].as_array().expect("segments").iter().any(|s| {
        s["total_size"] == 2 << 20
            && s["blocks"].as_array().is_some_and(|bs| {
                bs.len() > 1
                    && bs.iter().any(|b| {
                        b["state"] == "active_allocated"
                            && b["requested_size"] == 4096
                            && common::is_frame(
                                &b["frames"][0],
                                "shim_sleep.c",
                                "make_block",
                                alloc_line,
                            )
                    })
            })
    });
    assert!(
        live,
        "{what}: the live block inside its segment: {}",
        v["segments"]
    );
}

#[test]
fn each_sleep_mode_malloc_and_free_is_in_the_snapshot_and_the_log_with_its_call_site() {
    let dir = common::scratch("sleep-trace");
    let snap = dir.join("snap.pickle");
    let log = dir.join("run.log");
    let out = common::run_ok(
        common::shim_cmd(exe())
            .arg("trace")
            .env(SLEEP.0, SLEEP.1)
            .env("CUSHIM_SNAPSHOT", &snap)
            .env("CUSHIM_LOG", &log)
            .env("CUSHIM_HISTORY", "enabled=all,context=all,stacks=native"),
    );
    assert_eq!(out, "ok\n");
    shows_each_sleep_allocation(&common::load_snapshot(&snap), "snapshot");
    let from_log = dir.join("from-log.pickle");
    common::run_ok(
        Command::new(common::cushim_bin())
            .arg("snapshot")
            .arg(&log)
            .args(["--end", "-o"])
            .arg(&from_log),
    );
    shows_each_sleep_allocation(&common::load_snapshot(&from_log), "log");
}

/// `shim_stream_matrix` (`args`: the kind of stream) under sleep mode with `extra` settings:
/// (the next owner got the freed block's address, its bytes are intact).
fn sleep_matrix(extra: &str, args: &[&str]) -> (bool, bool) {
    let exe = common::compile("shim_stream_matrix", &["-lpthread"]);
    let conf = format!("sleep_mode:True{extra}");
    let mut cmd = common::shim_cmd(&exe);
    cmd.args(args).env("CUSHIM_ALLOC_CONF", &conf);
    if extra.contains("free_sync:none") {
        // Unprotected: force the late write after the owner's (see the C file).
        cmd.env("MATRIX_RACE", "1");
    }
    let out = common::run_ok(&mut cmd);
    let kv = common::kv(&out);
    assert_eq!(
        common::num(&kv, "shim_allocations"),
        0,
        "{conf} {args:?}: the sleep cache served them, not the main one: {out}"
    );
    (
        common::num(&kv, "same_address") == 1,
        common::num(&kv, "intact") == 1,
    )
}

#[test]
fn in_sleep_mode_work_queued_before_a_free_on_any_stream_never_reaches_the_blocks_next_owner() {
    let kinds: [&[&str]; 6] = [
        &["nonblocking", "1"],
        &["nonblocking", "4"],
        &["blocking"],
        &["perthread"],
        &["newstream"],
        &["exited"],
    ];
    for args in kinds {
        let (same, intact) = sleep_matrix("", args);
        assert!(
            same && intact,
            "{args:?}: reused from the sleep cache once ordered: same={same} intact={intact}"
        );
        // The scenario really races: unprotected, the late write lands in the next owner.
        let (same, intact) = sleep_matrix(",free_sync:none", args);
        assert!(
            same && !intact,
            "{args:?}, free_sync:none: same={same} intact={intact}"
        );
    }
}
