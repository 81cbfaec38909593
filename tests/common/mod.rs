//! Shared helpers for the integration tests: build the shim and simcuda once, lay simcuda
//! out as a CUDA installation, compile C programs against it and run them (optionally with
//! the shim preloaded). Every test binary includes this with `mod common;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};

pub use cushim_testsupport::artifacts;

pub mod analyze_support;
pub mod cli;
pub mod engine_support;
pub mod nvtx;
pub mod skip;
pub mod snapshot_support;
pub mod stand_in;

/// The cargo output directory with `libcushim.so` and `libsimcuda.so` in it, built on first
/// use (same profile as the test binary) by a nested `cargo build`.
pub fn build_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = artifacts::build_dir().expect("locating the cargo output directory");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(artifacts::source_root()).args([
            "build",
            "-p",
            "cushim-shim",
            "-p",
            "simcuda",
            "-p",
            "cushim-tools",
        ]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .expect("running cargo build for the shim and simcuda");
        assert!(
            status.success(),
            "cargo build of the shim and simcuda failed"
        );
        dir
    })
}

/// The directory to put first on `LD_LIBRARY_PATH` so `libcuda.so.1` and `libcudart.so.12`
/// are simcuda.
pub fn sim_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| artifacts::sim_layout(build_dir()).expect("laying out simcuda"))
}

/// The variable that puts another library in the shim's place for the whole suite (the
/// mutation check's do-nothing stand-in, see `tests/shim_mutation.rs`).
pub const STAND_IN_VAR: &str = "CUSHIM_TEST_SHIM";

/// `libcushim.so`, for `LD_PRELOAD`; or the library `CUSHIM_TEST_SHIM` names, when set.
pub fn shim_path() -> PathBuf {
    match std::env::var_os(STAND_IN_VAR) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => build_dir().join(artifacts::SHIM_LIB),
    }
}

/// The `cushim` command.
pub fn cushim_bin() -> PathBuf {
    build_dir().join("cushim")
}

/// A fresh scratch directory that belongs to exactly one test, unique by construction: it is
/// named from `name`, the test's own name (libtest names each test's thread after it), the
/// process id and a counter of this process, so two tests running at once never share one,
/// and no test removes another's. The same `name` asked for twice by one test panics: the
/// caller meant two directories but named them alike, and saying so at once beats a test
/// that reads another run's files once under load.
pub fn scratch(name: &str) -> PathBuf {
    scratch_in(&build_dir().join("test-scratch"), name)
}

/// [`scratch`] under `root` (for tests that need no build of the shim).
pub fn scratch_in(root: &Path, name: &str) -> PathBuf {
    let test = std::thread::current().name().unwrap_or("").to_owned();
    claim_scratch_name(&test, name);
    let n = SCRATCH_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = root.join(format!(
        "{name}-{}-{}-{n}",
        file_name_part(&test),
        std::process::id()
    ));
    // A directory of that name can only be left from an earlier process with this pid.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

static SCRATCH_COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Records that the test `test` was handed a scratch directory called `name`; panics when it
/// already was. Threads without a name (ones a test spawned itself) share the empty name.
pub fn claim_scratch_name(test: &str, name: &str) {
    static CLAIMED: OnceLock<std::sync::Mutex<std::collections::HashSet<(String, String)>>> =
        OnceLock::new();
    let mut claimed = CLAIMED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    assert!(
        claimed.insert((test.to_owned(), name.to_owned())),
        "scratch directory {name:?} was already handed to test {test:?} in this process: \
         name each directory of a test differently"
    );
}

/// `s` as part of a file name: path separators and odd characters become `_`, and a long
/// name keeps its end (the test's own function name), so the whole stays under the limit.
fn file_name_part(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let skip = clean.len().saturating_sub(96);
    clean[skip..].to_owned()
}

/// `tests/c/<name>.c`.
fn c_source(name: &str) -> PathBuf {
    artifacts::source_root()
        .join("tests")
        .join("c")
        .join(format!("{name}.c"))
}

/// Compile `tests/c/<name>.c` (once per test binary and name) linked to simcuda's
/// `libcudart`, with `extra` compiler arguments; returns the executable.
pub fn compile(name: &str, extra: &[&str]) -> PathBuf {
    compile_src(&c_source(name), name, extra)
}

/// Compile any C source (see [`compile`]); the output is named `name` (plus a hash of
/// `extra`) in the build directory's `test-bin`.
pub fn compile_src(src: &Path, name: &str, extra: &[&str]) -> PathBuf {
    test_program(name, extra, |tmp| {
        artifacts::compile_c(src, tmp, sim_lib_dir(), extra)
    })
}

/// The executable `name` (tagged with a hash of `extra`) in `test-bin`, built by `build`
/// into a temporary path on first use and renamed into place: two tests needing the same
/// program at once never see a half-written executable. It is built once per test process:
/// a second build renamed over the first would leave a test that already runs it with a
/// deleted executable, whose symbols its own stack captures could then not resolve.
pub fn test_program(
    name: &str,
    extra: &[&str],
    build: impl FnOnce(&Path) -> std::io::Result<()>,
) -> PathBuf {
    let tag: u64 = extra
        .iter()
        .flat_map(|s| s.bytes())
        .fold(1469598103934665603u64, |h, b| {
            (h ^ b as u64).wrapping_mul(1099511628211)
        });
    let bins = build_dir().join("test-bin");
    std::fs::create_dir_all(&bins).expect("creating test-bin");
    let out = bins.join(format!("{name}-{tag:x}-{}", std::process::id()));
    // One lock per program: the first test builds it, the others wait and reuse it.
    static BUILDING: OnceLock<
        std::sync::Mutex<std::collections::HashMap<PathBuf, Arc<std::sync::Mutex<()>>>>,
    > = OnceLock::new();
    let lock = BUILDING
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(out.clone())
        .or_default()
        .clone();
    let _built = lock.lock().unwrap_or_else(|e| e.into_inner());
    if !out.exists() {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = bins.join(format!(".{name}-{tag:x}-{}-{n}", std::process::id()));
        build(&tmp).expect("compiling a C test program");
        std::fs::rename(&tmp, &out).expect("installing a compiled test program");
    }
    out
}

/// A command for `exe` on simcuda (no shim), with a clean cushim/simcuda environment.
pub fn sim_cmd(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("CUSHIM_") || k.starts_with("SIMCUDA_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", sim_lib_dir().display()),
        _ => sim_lib_dir().display().to_string(),
    };
    cmd.env("LD_LIBRARY_PATH", ld);
    cmd
}

/// A command for `exe` on simcuda with the shim preloaded.
pub fn shim_cmd(exe: &Path) -> Command {
    let mut cmd = sim_cmd(exe);
    cmd.env("LD_PRELOAD", shim_path());
    cmd
}

/// [`shim_cmd`] when `shim`, else [`sim_cmd`]: the same program with and without the shim.
pub fn cmd(exe: &Path, shim: bool) -> Command {
    if shim {
        shim_cmd(exe)
    } else {
        sim_cmd(exe)
    }
}

/// Run and require success; returns stdout. Panics with both streams on failure.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run and return the output, whatever the status.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("starting a test program")
}

/// Read a simcuda report (`SIMCUDA_REPORT=path`).
pub fn read_report(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading simcuda report {}: {e}", path.display()));
    serde_json::from_str(&text).expect("parsing the simcuda report")
}

/// `simcuda/static` (the static-runtime stand-in) compiled with `cc -c` and archived with
/// `ar` into the build directory, once per test binary; returns `libcudart_static.a`.
pub fn static_runtime() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = build_dir()
            .join("test-bin")
            .join(format!("cudart-static-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the static runtime's directory");
        let src = artifacts::source_root().join("simcuda/static/cudart_static.c");
        let obj = dir.join("cudart_static.o");
        let lib = dir.join("libcudart_static.a");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .args([
                "-c",
                "-O1",
                "-g",
                "-fno-omit-frame-pointer",
                "-Wall",
                "-fPIC",
            ])
            .arg("-I")
            .arg(artifacts::simcuda_include_dir())
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .output()
            .expect("running cc on the static runtime");
        assert!(
            out.status.success(),
            "cc failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_file(&lib);
        let out = Command::new("ar")
            .arg("rcs")
            .arg(&lib)
            .arg(&obj)
            .output()
            .expect("running ar");
        assert!(out.status.success(), "ar failed: {out:?}");
        lib
    })
}

/// Compile `tests/c/<name>.c` as nvcc's default build would link it: against the static
/// runtime (the `simcuda/static` stand-in) instead of `-lcudart`, with `extra` arguments
/// after it (e.g. `-lcuda` for a program that also calls the driver). Returns the program.
pub fn compile_static(name: &str, extra: &[&str]) -> PathBuf {
    let mut link: Vec<std::ffi::OsString> = vec![static_runtime().into()];
    link.extend(extra.iter().map(std::ffi::OsString::from));
    link.push("-ldl".into());
    test_program(&format!("{name}-static"), extra, |tmp| {
        artifacts::compile_c_linked(&c_source(name), tmp, sim_lib_dir(), &link)
    })
}

/// Load a snapshot with Python's standard library, as PyTorch's viewers do, as JSON data.
pub fn load_snapshot(path: &Path) -> serde_json::Value {
    load_snapshot_with(path, &[])
}

/// Load a snapshot with Python and keep only the number of trace events per device and of
/// segments (`{"device_traces": [n0, ...], "segments": n}`): for big snapshots, where a full
/// JSON round trip would cost far more than the check.
pub fn load_snapshot_counts(path: &Path) -> serde_json::Value {
    load_snapshot_with(path, &["--counts"])
}

fn load_snapshot_with(path: &Path, args: &[&str]) -> serde_json::Value {
    let script = artifacts::source_root().join("tests/py/snapshot_to_json.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .arg(path)
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "python could not load {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("snapshot JSON")
}

/// Parse the `key=value` words a C test program prints (values up to the next space).
pub fn kv(out: &str) -> std::collections::HashMap<String, String> {
    out.lines()
        .flat_map(|l| l.split(' '))
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// The integer value of `k` in a [`kv`] map; panics naming the key when absent or not a number.
pub fn num(m: &std::collections::HashMap<String, String>, k: &str) -> i64 {
    m.get(k)
        .unwrap_or_else(|| panic!("{k} missing in {m:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{k}: {e}"))
}

/// `tests/c/shim_single_stream.c` (3200 mallocs of 16 sizes, each freed within its round)
/// was served by the cache: the shim counts at most one device allocation per size, and the
/// device saw no more than that.
pub fn assert_single_stream_cached(out: &str, report: &serde_json::Value) {
    let allocs = num(&kv(out), "device_allocs");
    assert!((1..=16).contains(&allocs), "{out}");
    assert_eq!(
        report["calls"]["cuMemAlloc_v2"].as_i64(),
        Some(allocs),
        "{report}"
    );
}

/// Run `tests/c/shim_stream_safety.c` under the shim with `free_sync:<free_sync>` plus
/// `conf_tail` (`""` or `,key:value...`); unprotected (`none`), the program forces the late
/// write after the new owner's (see the C file). Returns its output, once the shim's
/// statistics show it served both of the program's allocations (simcuda alone keeps a
/// freed block intact, so the verdict proves nothing about the cache otherwise).
pub fn stream_safety(free_sync: &str, conf_tail: &str) -> String {
    let exe = compile("shim_stream_safety", &[]);
    let args: &[&str] = if free_sync == "none" { &["race"] } else { &[] };
    let out = run_ok(shim_cmd(&exe).args(args).env(
        "CUSHIM_ALLOC_CONF",
        format!("free_sync:{free_sync}{conf_tail}"),
    ));
    assert_eq!(num(&kv(&out), "shim_allocations"), 2, "{out}");
    out
}

/// Run `tests/c/shim_frag.c` in `mode` under the shim with `CUSHIM_ALLOC_CONF=conf`, in a
/// scratch directory named after `tag`: its [`kv`] output and simcuda's report.
pub fn shim_frag(
    tag: &str,
    mode: &str,
    conf: &str,
) -> (std::collections::HashMap<String, String>, serde_json::Value) {
    let exe = compile("shim_frag", &[]);
    let dir = scratch(&format!("{tag}-{mode}-{}", conf.len()));
    let report = dir.join("report.json");
    let out = run_ok(
        shim_cmd(&exe)
            .arg(mode)
            .env("CUSHIM_ALLOC_CONF", conf)
            .env("SIMCUDA_REPORT", &report),
    );
    (kv(&out), read_report(&report))
}

/// Run `tests/c/shim_oom.c` under the shim on a 1 GiB simcuda device with
/// `CUSHIM_DUMP_ON_OOM` and history `history`: the out-of-memory snapshot is written to
/// `dir/oom-0.pickle`. The caller checks the exit status.
pub fn run_oom_dump(dir: &Path, history: &str) -> Output {
    let exe = compile("shim_oom", &[]);
    run(shim_cmd(&exe)
        .env("SIMCUDA_MEM_MB", "1024")
        .env("CUSHIM_SNAPSHOT", dir.join("oom-%n.pickle"))
        .env("CUSHIM_DUMP_ON_OOM", "1")
        .env("CUSHIM_HISTORY", history))
}

/// The line of the first line containing `call` after the definition of `fn_name` in
/// `tests/c/<c_file>` (where a test expects the frame of that call).
pub fn call_line(c_file: &str, fn_name: &str, call: &str) -> u64 {
    let path = artifacts::source_root().join("tests/c").join(c_file);
    let src = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let start = src
        .find(&format!("{fn_name}("))
        .unwrap_or_else(|| panic!("{fn_name} not in {c_file}"));
    let before = src[..start].lines().count() as u64;
    let rel = src[start..]
        .lines()
        .position(|l| l.contains(call))
        .unwrap_or_else(|| panic!("{call} not in {fn_name}")) as u64;
    before + rel
}

/// Whether snapshot frame `f` is `name` at `c_file:line`.
pub fn is_frame(f: &serde_json::Value, c_file: &str, name: &str, line: u64) -> bool {
    f["name"].as_str().is_some_and(|n| n.contains(name))
        && f["filename"].as_str().is_some_and(|p| p.ends_with(c_file))
        && f["line"].as_u64() == Some(line)
}

/// Whether a snapshot frame list holds `name` at `c_file:line`.
pub fn frames_have(frames: &serde_json::Value, c_file: &str, name: &str, line: u64) -> bool {
    frames
        .as_array()
        .is_some_and(|fs| fs.iter().any(|f| is_frame(f, c_file, name, line)))
}

/// The live-dump scenario for any build of `shim_trace.c`/`driver_trace.c`: run
/// `exe threads 50000` (two threads allocating) with the shim and a `%n` snapshot template,
/// wait for its "ready", send `signals` SIGUSR1 500 µs apart, and require correct results,
/// at least one live dump besides the exit dump, and every snapshot loadable by Python.
pub fn signal_storm_keeps_results_and_snapshots(exe: &Path, name: &str, signals: u32) {
    use std::io::{BufRead, BufReader, Write};
    let dir = scratch(name);
    let mut child = shim_cmd(exe)
        .args(["threads", "50000"])
        .env("CUSHIM_SNAPSHOT", dir.join("live-%n.pickle"))
        .env(
            "CUSHIM_HISTORY",
            "enabled=all,context=all,stacks=native,max_entries=20000",
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the program");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("a line").expect("utf8"), "ready");
    for _ in 0..signals {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    // The program holds its exit until told, so that a live dump (written by the shim's
    // dump thread whenever it is scheduled) exists before the exit dump, however loaded the
    // machine: wait for one, with a generous deadline.
    let pickles = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&dir)
            .expect("listing")
            .map_while(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while pickles().is_empty() && std::time::Instant::now() < deadline {
        // A program that died (no dump signal handler: SIGUSR1 ends it) never writes one.
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the program ended before any live dump: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = writeln!(stdin, "go");
    drop(stdin);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("waiting");
    assert!(status.success(), "{status}");
    assert!(rest.iter().any(|l| l == "result=correct"), "{rest:?}");
    let files = pickles();
    assert!(
        files.len() >= 2,
        "at least one live dump and the exit dump: {files:?}"
    );
    for f in &files {
        let v = load_snapshot_counts(f);
        assert!(v["segments"].is_u64(), "{}", f.display());
    }
}

/// The stress scenario for any build of `shim_stress.c`: 4 threads x `ops` random
/// malloc/free on a 2-device simcuda under the shim; no block corrupted, and per device
/// allocated bytes 0 with reserved bytes equal to what the device reports in use.
pub fn stress_never_corrupts_and_stats_match_the_device(exe: &Path, ops: u32) {
    let out = run_ok(
        shim_cmd(exe)
            .arg(ops.to_string())
            .env("SIMCUDA_DEVICES", "2"),
    );
    assert!(out.contains("failures=0"), "{out}");
    let stats_line = out
        .lines()
        .find_map(|l| l.strip_prefix("stats="))
        .expect("stats line");
    let stats: serde_json::Value = serde_json::from_str(stats_line).expect("stats JSON");
    for dev in 0..2 {
        let s = &stats["devices"][dev];
        assert_eq!(s["allocated_bytes.all.current"], 0, "device {dev}: {s}");
        let used: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("dev{dev} used=")))
            .expect("used line")
            .parse()
            .expect("number");
        assert_eq!(
            s["reserved_bytes.all.current"].as_u64(),
            Some(used),
            "device {dev}"
        );
        assert!(
            s["allocation.all.allocated"].as_u64().unwrap_or(0) > 1000,
            "device {dev}: {s}"
        );
    }
}

/// The frames check for any build of `shim_trace.c`: with each unwinder, the exit
/// snapshot of `exe sites` has a live block carrying `load_weights` at its `cudaMalloc` line,
/// an alloc event from `make_activation`, and every stack starts at the program's call site
/// (neither the shim's frames nor a linked-in runtime's come first).
pub fn snapshot_frames_start_at_the_programs_call_sites(exe: &Path, name: &str) {
    const C: &str = "shim_trace.c";
    let weights = call_line(C, "load_weights", "cudaMalloc(");
    let act = call_line(C, "make_activation", "cudaMalloc(");
    for unwinder in ["dwarf", "fp"] {
        let dir = scratch(&format!("{name}-{unwinder}"));
        let snap = dir.join("snap.pickle");
        run_ok(
            shim_cmd(exe)
                .arg("sites")
                .env("CUSHIM_SNAPSHOT", &snap)
                .env(
                    "CUSHIM_HISTORY",
                    format!("enabled=all,context=all,stacks=native,unwinder={unwinder}"),
                ),
        );
        let v = load_snapshot(&snap);
        let live = v["segments"].as_array().expect("segments").iter().any(|s| {
            s["blocks"].as_array().is_some_and(|bs| {
                bs.iter().any(|b| {
                    b["state"] == "active_allocated"
                        && frames_have(&b["frames"], C, "load_weights", weights)
                })
            })
        });
        assert!(
            live,
            "{unwinder}: no live block carries load_weights at line {weights}"
        );
        let traces = v["device_traces"][0].as_array().expect("device_traces[0]");
        assert!(
            traces
                .iter()
                .any(|t| t["action"] == "alloc"
                    && frames_have(&t["frames"], C, "make_activation", act)),
            "{unwinder}: no alloc event from make_activation:{act}"
        );
        let first = &traces
            .iter()
            .find(|t| t["action"] == "alloc")
            .expect("an alloc")["frames"][0];
        let file = first["filename"].as_str().unwrap_or("");
        assert!(
            !file.contains("shim/src") && !file.ends_with("cudart_static.c"),
            "{unwinder}: the first frame is the program's: {first}"
        );
        assert!(
            is_frame(first, C, "load_weights", weights)
                || is_frame(first, C, "make_activation", act),
            "{unwinder}: the first frame is the program's call site: {first}"
        );
    }
}

/// Start `cmd`'s program as a shell in the foreground would: the ending and dump signals at
/// their default action and unblocked (a test runner started as a background job of a
/// non-interactive shell passes SIGINT and SIGQUIT on ignored, which would make "the default
/// action" cases meaningless), and no core files from the cases that end by SIGQUIT (the
/// status still names the signal).
pub fn default_signals_no_core(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal, sigprocmask and setrlimit are async-signal safe and touch only the
    // child, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &zero);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGTERM,
                libc::SIGHUP,
                libc::SIGUSR1,
                libc::SIGUSR2,
            ] {
                libc::signal(sig, libc::SIG_DFL);
                libc::sigaddset(&mut set, sig);
            }
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// A child that is killed (and reaped) when the test lets go of it, also when an assertion
/// fails first: an idle loop program left running would keep the test's output pipes open
/// (and a runner reading them, such as the mutation check, waiting for ever).
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Killed {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}
