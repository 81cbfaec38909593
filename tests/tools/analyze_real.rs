//! The analyses on inputs shaped as real programs make them: PyTorch snapshots whose stacks
//! hold CPython, libffi and C++ frames with return types around the program's Python
//! frames, a Python program run under `cushim run` with its default stacks, compressed
//! snapshots, files that are not snapshots, and runs on different device numbers.
//!
//! The PyTorch-shaped pickles are written by python3's own pickle module from the frame
//! lists below; their frame names are copied in form (not content) from stacks PyTorch
//! 2.x records with `_record_memory_history(stacks="all")`: `torch::unwind::unwind()`,
//! c10 allocator frames, demangled C++ with return types, CPython's evaluation loop and
//! call machinery, then the program's Python frames.
use crate::common;
use crate::common::analyze_support as support;

use common::cli::{cushim, ok, write};

use std::path::{Path, PathBuf};
use std::process::Command;

/// A python3 program's stdout (a pickle it wrote); `None` when python3 is missing.
pub(crate) fn python(script: &str) -> Option<Vec<u8>> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

/// Frames as PyTorch records them with `stacks="all"`, innermost first, around `user`.
pub(crate) const FRAMES_PY: &str = r#"
import pickle, sys
MIB = 1 << 20
def native(n):
    return {"name": n, "filename": "??", "line": 0}
def py(n, f, l):
    return {"name": n, "filename": f, "line": l}
def frames(user):
    return [
        native("torch::unwind::unwind()"),
        native("torch::CapturedTraceback::gather(bool, bool, bool)"),
        native("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
        native("void at::cuda::blas::gemm_and_bias<float>(bool, bool, long, long, long, float, float const*, long, float const*, long, float const*, float*, long, at::cuda::blas::GEMMAndBiasActivationEpilogue)"),
        native("bool at::native::_resize_output_check<long>(at::Tensor const&, c10::ArrayRef<long>)"),
        native("_object* torch::autograd::THPVariable_addmm(_object*, _object*, _object*)"),
        {"name": "cfunction_call", "filename": "", "line": 0},
        native("_PyObject_MakeTpCall"),
        native("_PyEval_EvalFrameDefault"),
        py("forward", "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/linear.py", 116),
        py("_call_impl", "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", 1527),
        native("_PyFunction_Vectorcall"),
    ] + user + [
        native("_PyEval_EvalFrameDefault"),
        native("PyEval_EvalCode"),
        native("run_mod"),
        native("Py_RunMain"),
        native("Py_BytesMain"),
        native("__libc_start_main"),
        native("_start"),
    ]
bert = frames([py("forward", "/w/transformers/models/bert/modeling_bert.py", 286),
               native("_PyEval_EvalFrameDefault"),
               py("validate", "/w/validate_old.py", 59)])
# PyTorch's allocator_settings under its defaults, as a snapshot records them.
DEFAULTS = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False}
"#;

#[test]
fn the_site_of_a_pytorch_stack_is_the_programs_python_frame() {
    let dir = common::scratch("analyze-real-sites");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
base = 0x7f0000000000
seg = {{"device": 0, "address": base, "total_size": 20 * MIB, "allocated_size": 8 * MIB,
       "active_size": 8 * MIB, "requested_size": 8 * MIB, "stream": 0,
       "segment_type": "large", "is_expandable": False, "frames": bert,
       "blocks": [
         {{"address": base, "size": 8 * MIB, "requested_size": 8 * MIB, "state": "active_allocated", "frames": bert}},
         {{"address": base + 8 * MIB, "size": 12 * MIB, "requested_size": 0, "state": "inactive", "frames": []}}]}}
trace = [{{"action": "segment_alloc", "addr": base, "size": 20 * MIB, "stream": 0, "frames": bert}},
         {{"action": "alloc", "addr": base, "size": 8 * MIB, "stream": 0, "frames": bert}}]
sys.stdout.buffer.write(pickle.dumps({{"segments": [seg], "device_traces": [trace]}}, protocol=5))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "bert.pickle", &p);
    let out = ok(&["summary"], &[&f]);
    let want = "forward (/w/transformers/models/bert/modeling_bert.py:286)";
    assert!(out.contains(want), "{out}");
    for machinery in [
        "cfunction_call",
        "gemm_and_bias",
        "THPVariable",
        "linear.py",
    ] {
        assert!(!out.contains(machinery), "{machinery}\n{out}");
    }
    // Depth counts program frames: the caller shown is the program's, not CPython's.
    let out = ok(&["summary", "--depth", "2", "--tree"], &[&f]);
    assert!(
        out.contains(&format!("{want} <- validate (/w/validate_old.py:59)")),
        "{out}"
    );
    assert!(!out.contains("Py_BytesMain"), "{out}");
    assert!(!out.contains("_PyFunction_Vectorcall"), "{out}");
}

#[test]
fn a_python_program_under_cushim_run_has_its_python_function_as_top_site() {
    let dir = common::scratch("analyze-real-python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/alloc_stacks.py");
    if Command::new("python3").arg("-V").output().is_err() {
        eprintln!("skipping: python3 is not installed");
        return;
    }
    let snap = dir.join("py.pickle");
    let mut c = Command::new(common::cushim_bin());
    c.args(["run", "--sim", "--snapshot"])
        .arg(&snap)
        .arg("--")
        .arg("python3")
        .arg(&script)
        .env_remove("CUSHIM_HISTORY");
    let out = common::run_ok(&mut c);
    assert!(out.contains("done"), "{out}");
    let out = ok(&["summary"], &[&snap]);
    // Two blocks stay live (1 and 2 MiB), both allocated in allocate_weights: the shim
    // recorded them (nothing would be there without it) with the default stacks.
    let first = out
        .lines()
        .skip_while(|l| !l.contains("by live bytes (live at the end)"))
        .nth(1)
        .filter(|l| l.contains("alloc_stacks.py"))
        .unwrap_or_else(|| panic!("no Python site\n{out}"));
    assert!(
        first.contains("allocate_weights") && first.contains("3.00 MiB"),
        "{out}"
    );
    for machinery in ["libffi", "cfunction_call", "_PyEval", "python3"] {
        assert!(!first.contains(machinery), "{machinery}\n{out}");
    }
}

#[test]
fn gzip_and_zstd_snapshots_read_as_the_snapshot_inside() {
    use std::io::Write;
    let dir = common::scratch("analyze-real-compressed");
    let plain = support::seed_scenario("", cushim::snapshot::Format::Pickle);
    let plain_f = write(&dir, "seed.pickle", &plain);
    let want = ok(&["summary"], &[&plain_f]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    // Named as if plain: the content decides.
    let gz_f = write(&dir, "seed-gz.pickle", &gz.finish().unwrap());
    let zst =
        ruzstd::encoding::compress_to_vec(&plain[..], ruzstd::encoding::CompressionLevel::Fastest);
    let zst_f = write(&dir, "seed.pickle.zst", &zst);
    for f in [&gz_f, &zst_f] {
        let got = ok(&["summary"], &[f]);
        assert_eq!(
            got.replace(&*f.display().to_string(), ""),
            want.replace(&*plain_f.display().to_string(), ""),
            "{}",
            f.display()
        );
        assert!(got.contains("MiB"), "{got}");
    }
    let out = ok(&["replay", "--conf", ""], &[&zst_f]);
    assert!(out.contains("recorded"), "{out}");
}

/// Write a JSON snapshot of `cycles` alloc / free_requested / free_completed cycles of
/// one 512 KiB block, then one more alloc, to `out`, every event with its own copy of a 32-frame stack (JSON
/// shares nothing): large when decompressed, small compressed. Written as it is made, so
/// this process never holds it (its memory would count in a child's peak: see
/// `summary_max_rss`). Returns the bytes written.
fn write_big_json(out: &mut impl std::io::Write, cycles: usize) -> u64 {
    const MIB: u64 = 1 << 20;
    let base = 0x7f00_0000_0000u64;
    let half = MIB / 2;
    let frames: Vec<String> = (0..32)
        .map(|i| {
            format!(
                r#"{{"name": "layer_{i}", "filename": "/w/model/train.py", "line": {}}}"#,
                10 + i
            )
        })
        .collect();
    let frames = format!("[{}]", frames.join(", "));
    let head = format!(
        r#"{{"segments": [{{"device": 0, "address": {base}, "total_size": {}, "allocated_size": {half}, "active_size": {half}, "requested_size": {half}, "stream": 0, "segment_type": "large", "is_expandable": false, "frames": {frames}, "blocks": [{{"address": {base}, "size": {half}, "requested_size": {half}, "state": "active_allocated", "frames": {frames}}}, {{"address": {}, "size": {}, "requested_size": 0, "state": "inactive", "frames": []}}]}}], "device_traces": [[{{"action": "segment_alloc", "addr": {base}, "size": {}, "stream": 0, "frames": {frames}}}"#,
        2 * MIB,
        base + MIB / 2,
        2 * MIB - MIB / 2,
        2 * MIB
    );
    out.write_all(head.as_bytes()).unwrap();
    let mut n = head.len() as u64;
    let mut cycle = String::new();
    for action in ["alloc", "free_requested", "free_completed"] {
        cycle.push_str(&format!(
            r#", {{"action": "{action}", "addr": {base}, "size": {}, "stream": 0, "frames": {frames}}}"#,
            MIB / 2
        ));
    }
    for _ in 0..cycles {
        out.write_all(cycle.as_bytes()).unwrap();
        n += cycle.len() as u64;
    }
    // One block stays allocated: the live site the summary names.
    let last = format!(
        r#", {{"action": "alloc", "addr": {base}, "size": {}, "stream": 0, "frames": {frames}}}]]}}"#,
        MIB / 2
    );
    out.write_all(last.as_bytes()).unwrap();
    n + last.len() as u64
}

/// Run `c` with its data memory limited to `limit` bytes by the kernel (`RLIMIT_DATA`:
/// heap and every private writable mapping; an allocation past it fails).
fn run_limited(c: &mut Command, limit: u64) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // setrlimit, which is async-signal-safe; it allocates nothing.
    unsafe {
        c.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    common::run(c)
}

#[test]
fn compressed_snapshots_are_read_as_a_stream_in_memory_far_below_their_decompressed_size() {
    use std::io::Write;
    let dir = common::scratch("analyze-real-compressed-big");
    let gz_f = dir.join("big.json.gz");
    let file = std::io::BufWriter::new(std::fs::File::create(&gz_f).unwrap());
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    let big = write_big_json(&mut gz, 20_000);
    gz.finish().unwrap().flush().unwrap();
    let zst_f = dir.join("big.json.zst");
    let mut zst = std::io::BufWriter::new(std::fs::File::create(&zst_f).unwrap());
    ruzstd::encoding::compress(
        flate2::read::MultiGzDecoder::new(std::fs::File::open(&gz_f).unwrap()),
        &mut zst,
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    zst.flush().unwrap();
    drop(zst);
    // Read whole, the decompressed text alone would take `big` bytes; streamed, the reader
    // holds the model (events and one interned stack) and its buffers.
    let limit = big / 4;
    // The limit bites here: a program holding `big / 2` bytes at once fails under it.
    let held = run_limited(
        Command::new("python3").args(["-c", &format!("b = bytearray({})", big / 2)]),
        limit,
    );
    assert!(
        !held.status.success(),
        "RLIMIT_DATA is not enforced: {:?}",
        held.status
    );
    for f in [&gz_f, &zst_f] {
        let out = run_limited(
            Command::new(common::cushim_bin()).arg("summary").arg(f),
            limit,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {big} bytes decompressed, data limited to {limit}: {:?}\n{}",
            f.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("layer_0 (/w/model/train.py:10)"), "{text}");
        assert!(
            text.contains("allocated: 0.50 MiB (peak 0.50 MiB"),
            "{text}"
        );
    }
}

#[test]
fn convert_streams_a_compressed_json_snapshot_in_memory_far_below_its_decompressed_size() {
    use std::io::Write;
    let dir = common::scratch("analyze-real-convert-big");
    let gz_f = dir.join("big.json.gz");
    let file = std::io::BufWriter::new(std::fs::File::create(&gz_f).unwrap());
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    let big = write_big_json(&mut gz, 20_000);
    gz.finish().unwrap().flush().unwrap();
    // Read whole, the decompressed text alone would take `big` bytes (and its parsed tree
    // several times that); streamed, frames and frame lists repeated in the text are one
    // shared node each, as in the pickle PyTorch writes.
    let limit = big / 4;
    for out in [dir.join("big.pickle"), dir.join("big.msgpack")] {
        let r = run_limited(
            Command::new(common::cushim_bin())
                .arg("convert")
                .arg(&gz_f)
                .arg(&out),
            limit,
        );
        assert!(
            r.status.success(),
            "{big} bytes decompressed, data limited to {limit}: {:?}\n{}",
            r.status,
            String::from_utf8_lossy(&r.stderr)
        );
        let text = ok(&["summary"], &[&out]);
        assert!(text.contains("layer_0 (/w/model/train.py:10)"), "{text}");
        assert!(
            text.contains("allocated: 0.50 MiB (peak 0.50 MiB"),
            "{text}"
        );
    }
}

/// The peak reserved (MiB) of the replay table's row starting with `label`: the first
/// figure followed by `MiB`.
fn peak_reserved(out: &str, label: &str) -> f64 {
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label}\n{out}"));
    let t: Vec<&str> = row.split_whitespace().collect();
    let i = t
        .windows(2)
        .position(|w| w[1] == "MiB")
        .unwrap_or_else(|| panic!("no MiB in {row}"));
    t[i].parse()
        .unwrap_or_else(|_| panic!("not a number in {row}"))
}

/// A real PyTorch snapshot (tests/data/real/README.md says where it comes from and under
/// which licence): its sites are the program's lines, its Windows paths classified as
/// POSIX ones, and replaying it under its own recorded settings gives its recorded peak
/// reserved within 1%.
#[test]
fn a_real_pytorch_snapshot_replays_to_its_recorded_peak_and_names_the_programs_lines() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-assignment2-memory_snapshot.pickle.gz");
    let out = ok(&["summary"], &[&f]);
    assert!(
        out.contains(r"silu (D:\Dev\assignment2-systems\cs336-basics\cs336_basics\model.py:532)"),
        "{out}"
    );
    // PyTorch's own Python (torch\functional.py) is not a site while the program has one.
    assert!(!out.contains(r"torch\functional.py"), "{out}");
    // `convert` reads the compressed pickle too, to the same snapshot.
    let dir = common::scratch("analyze-real-pytorch");
    let json = dir.join("real.json");
    ok(&["convert"], &[&f, &json]);
    assert_eq!(
        ok(&["summary"], &[&json]).replace(&*json.display().to_string(), "F"),
        out.replace(&*f.display().to_string(), "F")
    );
    let out = ok(&["replay"], &[&f]);
    let recorded = peak_reserved(&out, "recorded");
    let replayed = peak_reserved(&out, "replay: recorded");
    assert!(recorded > 13_000.0, "{out}");
    assert!(
        (replayed - recorded).abs() <= recorded / 100.0,
        "replayed {replayed} MiB against recorded {recorded} MiB\n{out}"
    );
}

/// A real full training step converted to JSON and msgpack (read as one mapped slice) and
/// to gzipped JSON (read as a stream) summarises, by site and by category, exactly as its
/// pickle: the fast readers build the same tree.
#[test]
fn a_real_snapshot_converted_to_json_or_msgpack_summarises_exactly_as_its_pickle() {
    use std::io::Write;
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-medium-128-training-memory_snapshot.pickle.gz");
    let dir = common::scratch("analyze-real-json-as-pickle");
    let json = dir.join("step.json");
    let msgpack = dir.join("step.msgpack");
    ok(&["convert"], &[&f, &json]);
    ok(&["convert"], &[&f, &msgpack]);
    let gz = dir.join("step.json.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(&std::fs::read(&json).unwrap()).unwrap();
    enc.finish().unwrap().flush().unwrap();
    for by in [&["summary"][..], &["summary", "--by", "category"][..]] {
        let want = ok(by, &[&f]).replace(&*f.display().to_string(), "F");
        assert!(want.contains("peak"), "{want}");
        for other in [&json, &msgpack, &gz] {
            let got = ok(by, &[other]).replace(&*other.display().to_string(), "F");
            assert_eq!(got, want, "{by:?} {}", other.display());
        }
    }
}

#[test]
fn files_that_are_not_snapshots_get_one_line_saying_what_they_are() {
    let dir = common::scratch("analyze-real-not-snapshots");
    let elf = std::fs::read(common::cushim_bin()).unwrap();
    let mut cases: Vec<(PathBuf, &str)> = vec![
        (
            write(&dir, "notes.txt", b"hello, this is a note\nsecond line\n"),
            "text",
        ),
        (write(&dir, "prog", &elf[..4096]), "ELF"),
        (write(&dir, "table.csv", b"name,size\nx,1\n"), "CSV"),
        (
            write(
                &dir,
                "trace.json",
                br#"{"traceEvents": [{"ph": "X"}], "displayTimeUnit": "ms"}"#,
            ),
            "Chrome trace",
        ),
        (
            write(
                &dir,
                "package.json",
                br#"{"name": "x", "version": "1.0.0"}"#,
            ),
            "keys name, version",
        ),
        (write(&dir, "brackets.txt", b"[not json at all\n"), "text"),
    ];
    if let Some(p) =
        python("import pickle,sys; sys.stdout.buffer.write(pickle.dumps([1, 2, 3], protocol=5))")
    {
        cases.push((write(&dir, "list.pickle", &p), "a list"));
    }
    if let Some(p) = python(
        "import pickle,sys,collections; sys.stdout.buffer.write(pickle.dumps(collections.OrderedDict(a=1), protocol=5))",
    ) {
        cases.push((write(&dir, "objects.pickle", &p), "Python objects"));
    }
    for (f, what) in &cases {
        for cmd in ["summary", "replay"] {
            let out = cushim(&[cmd], &[f]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {}: {err}", f.display());
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.contains(&format!("{} is not a snapshot (found ", f.display()))
                    && err.contains(what),
                "{cmd}: {err}"
            );
        }
    }
}

#[test]
fn pickle_protocol_5_with_bytearrays_reads() {
    let dir = common::scratch("analyze-real-protocol5");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
seg = {{"device": 0, "address": 1 << 40, "total_size": 2 * MIB, "stream": 0,
       "segment_type": "large", "blob": bytearray(b"x" * 300),
       "blocks": [{{"address": 1 << 40, "size": 2 * MIB, "requested_size": 2 * MIB,
                    "state": "active_allocated", "frames": bert}}]}}
sys.stdout.buffer.write(pickle.dumps({{"segments": [seg], "device_traces": [[]]}}, protocol=5))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    assert!(
        p.windows(1).any(|w| w[0] == 0x96),
        "a BYTEARRAY8 opcode is in the pickle"
    );
    let f = write(&dir, "p5.pickle", &p);
    let out = ok(&["summary"], &[&f]);
    assert!(out.contains("modeling_bert.py:286"), "{out}");
}

/// A JSON snapshot of one device `ord` holding one `mib` MiB block allocated at `site`.
fn one_device(ord: i64, mib: u64, site: &str) -> String {
    let m = 1u64 << 20;
    serde_json::json!({
        "segments": [{"device": ord, "address": 1u64 << 40, "total_size": mib * m, "stream": 0,
            "segment_type": "large",
            "blocks": [{"address": 1u64 << 40, "size": mib * m, "requested_size": mib * m,
                "state": "active_allocated",
                "frames": [{"name": site, "filename": "/w/train.py", "line": 1}]}]}],
        "device_traces": [],
    })
    .to_string()
}

#[test]
fn diff_of_two_single_device_files_compares_them_whatever_their_numbers() {
    let dir = common::scratch("analyze-real-diff-pairing");
    let a = write(&dir, "rank0.json", one_device(0, 4, "step").as_bytes());
    let b = write(&dir, "rank1.json", one_device(1, 6, "step").as_bytes());
    let out = ok(&["diff"], &[&a, &b]);
    assert!(out.contains("device 0 (A) vs device 1 (B)"), "{out}");
    assert!(out.contains("grew") && out.contains("+2.00 MiB"), "{out}");
    assert!(
        !out.contains("vanished") && !out.contains("appeared"),
        "{out}"
    );
    // By number: device 0 only in A, device 1 only in B.
    let out = ok(&["diff", "--by-number"], &[&a, &b]);
    assert!(
        out.contains("vanished") && out.contains("appeared"),
        "{out}"
    );
}

#[test]
fn summary_takes_peaks_from_the_recorded_statistics_when_history_is_off() {
    let dir = common::scratch("analyze-real-stats-peaks");
    let m = 1i64 << 20;
    let mut v: serde_json::Value = serde_json::from_str(&one_device(0, 4, "step")).unwrap();
    v["cushim"] = serde_json::json!({"stats": {"devices": [{
        "allocated_bytes.all.peak": 69 * m, "reserved_bytes.all.peak": 80 * m,
        "allocated_bytes.all.current": 4 * m, "reserved_bytes.all.current": 4 * m,
    }]}});
    let f = write(&dir, "no-history.json", v.to_string().as_bytes());
    let out = ok(&["summary"], &[&f]);
    assert!(
        out.contains("allocated: 4.00 MiB (peak 69.00 MiB, allocator statistics, whole run)"),
        "{out}"
    );
    assert!(
        out.contains("(peak 80.00 MiB, allocator statistics"),
        "{out}"
    );
    assert!(
        out.contains("fragmentation: 0.0% of reserved memory"),
        "{out}"
    );
}

/// A PyTorch-shaped snapshot of a run that reached its device's limit: a 20 MiB segment
/// live before the trace with free gaps between its blocks, two 40 MiB blocks, the first
/// freed; a 50 MiB request then fails, PyTorch releases the cached 40 MiB segment and
/// retries (`segment_free` then `segment_alloc`); last, with `oom`, a 512 MiB request that
/// failed with 20 MiB reported free. Reserved peaks at 110 MiB; the device held 130 MiB.
fn limit_pickle(with_oom: bool) -> Option<Vec<u8>> {
    python(&format!(
        r#"{FRAMES_PY}
base = 0x7f0000000000
s1, s2, s3 = base + (256 << 20), base + (512 << 20), base + (768 << 20)
def blk(a, n, st): return {{"address": a, "size": n * MIB, "requested_size": n * MIB, "state": st, "frames": bert}}
def seg(a, n, blocks): return {{"device": 0, "address": a, "total_size": n * MIB, "stream": 0,
    "segment_type": "large", "is_expandable": False, "frames": bert, "blocks": blocks}}
segs = [seg(base, 20, [blk(base, 4, "active_allocated"), blk(base + 4 * MIB, 6, "inactive"),
                       blk(base + 10 * MIB, 6, "active_allocated"), blk(base + 16 * MIB, 4, "inactive")]),
        seg(s2, 40, [blk(s2, 40, "active_allocated")]),
        seg(s3, 50, [blk(s3, 50, "active_allocated")])]
def e(action, a, n, **kw): return dict({{"action": action, "addr": a, "size": n, "stream": 0, "frames": bert}}, **kw)
trace = [e("segment_alloc", s1, 40 * MIB), e("alloc", s1, 40 * MIB),
         e("segment_alloc", s2, 40 * MIB), e("alloc", s2, 40 * MIB),
         e("alloc", base + 4 * MIB, 6 * MIB), e("free_requested", base + 4 * MIB, 6 * MIB),
         e("free_completed", base + 4 * MIB, 6 * MIB),
         e("free_requested", s1, 40 * MIB), e("free_completed", s1, 40 * MIB),
         e("segment_free", s1, 40 * MIB), e("segment_alloc", s3, 50 * MIB), e("alloc", s3, 50 * MIB)]
if {with_oom}:
    trace.append(e("oom", 20 * MIB, 512 * MIB))
s = {{"segments": segs, "device_traces": [trace],
     "allocator_settings": DEFAULTS}}
sys.stdout.buffer.write(pickle.dumps(s, protocol=4))
"#,
        with_oom = if with_oom { "True" } else { "False" }
    ))
}

/// The figures of the row labelled `label`: seg frees, reserved, allocated, frag, device
/// allocations, OOMs.
pub(crate) fn replay_row(out: &str, label: &str) -> Vec<String> {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?} in\n{out}"));
    let v: Vec<String> = line[label.len()..]
        .split_whitespace()
        .filter(|w| *w != "MiB")
        .map(String::from)
        .collect();
    v[v.len() - 6..].to_vec()
}

#[test]
fn replay_infers_the_device_from_release_and_retry_and_reproduces_the_recorded_peak() {
    let dir = common::scratch("analyze-real-replay-limit");
    for with_oom in [false, true] {
        let Some(p) = limit_pickle(with_oom) else {
            eprintln!("skipping: python3 is not installed");
            return;
        };
        let f = write(&dir, &format!("limit-{with_oom}.pickle"), &p);
        let out = ok(&["replay", "--conf", ""], &[&f]);
        let how = if with_oom {
            "out-of-memory"
        } else {
            "released cached segments to retry a failed device allocation 1 times"
        };
        assert!(
            out.contains(&format!(
                "device memory: 0.13 GiB ({} bytes), inferred",
                130u64 << 20
            )) && out.contains(how),
            "{out}"
        );
        assert!(out.contains("1 segments with 2 free gaps"), "{out}");
        let recorded = replay_row(&out, "recorded");
        let replayed = replay_row(&out, "replay: recorded");
        assert_eq!(recorded[1], "110.0", "{out}");
        // Within 1% of the recorded peak reserved, under the recorded settings.
        let (r, p): (f64, f64) = (recorded[1].parse().unwrap(), replayed[1].parse().unwrap());
        assert!(
            (p - r).abs() <= r * 0.01,
            "replayed {p} vs recorded {r}\n{out}"
        );
        assert_eq!(recorded[0], "1", "one recorded segment free\n{out}");
        assert_eq!(
            replayed[0], "1",
            "the replay released the cache once too\n{out}"
        );
        // The trace's own device allocations (3), not the seeded segment's.
        assert_eq!(
            (recorded[4].as_str(), replayed[4].as_str()),
            ("3", "3"),
            "{out}"
        );
        if with_oom {
            let page = dir.join("limit.html");
            let mut c = Command::new(common::cushim_bin());
            c.arg("report").arg(&f).arg("-o").arg(&page);
            common::run_ok(&mut c);
            let html = std::fs::read_to_string(&page).unwrap();
            assert!(
                html.contains("<title>out of memory at event 12</title>"),
                "OOM marked"
            );
            assert!(html.contains("out of memory (1)"), "and in the legend");
        }
        let ooms = if with_oom { "1" } else { "0" };
        assert_eq!(
            (recorded[5].as_str(), replayed[5].as_str()),
            (ooms, ooms),
            "{out}"
        );
        // On a large device the cache never gives memory back, and the failed 512 MiB
        // request succeeds.
        let big = ok(&["replay", "--conf", "", "--device-memory", "80GiB"], &[&f]);
        assert!(big.contains("as given by --device-memory"), "{big}");
        let r = replay_row(&big, "replay: recorded");
        let want = if with_oom { "662.0" } else { "150.0" };
        assert_eq!(
            (r[0].as_str(), r[1].as_str(), r[5].as_str()),
            ("0", want, "0"),
            "{big}"
        );
    }
}

#[test]
fn pytorchs_newer_fields_are_read_carried_through_convert_and_shown() {
    let dir = common::scratch("analyze-real-newer-fields");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
seg = {{"device": 0, "address": 1 << 40, "total_size": 2 * MIB, "stream": 0,
       "segment_type": "large", "segment_pool_id": (1, 7), "is_expandable": False,
       "blocks": [{{"address": 1 << 40, "size": 2 * MIB, "requested_size": 2 * MIB,
                    "state": "active_allocated", "frames": bert}}]}}
e = {{"action": "alloc", "addr": 1 << 40, "size": 2 * MIB, "stream": 0, "frames": bert,
      "user_metadata": "step=3", "compile_context": "Torch-Compiled Region: 0/1",
      "pool_id": (1, 7), "internal_metadata": "x",
      "forward_frames": [{{"name": "fwd", "filename": "/w/m.py", "line": 5}}]}}
# The same line outside any compiled region and in the default pool: PyTorch writes "N/A".
c = {{"action": "alloc", "addr": (1 << 40) + 4 * MIB, "size": MIB, "stream": 0, "frames": bert,
      "compile_context": "N/A", "pool_id": (0, 0)}}
# A backward allocation: the autograd engine's thread, no Python frame; PyTorch records the
# forward pass that made its autograd node.
engine = [native("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
          native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
          native("execute_native_thread_routine"), native("start_thread")]
fwd = [{{"name": "project", "filename": "/w/attention.py", "line": 41}},
       {{"name": "_call_impl", "filename": "/x/torch/nn/modules/module.py", "line": 1527}}]
b = {{"action": "alloc", "addr": (1 << 40) + 2 * MIB, "size": 2 * MIB, "stream": 0,
      "frames": engine, "forward_frames": fwd}}
s = {{"segments": [seg], "device_traces": [[e, b, c]],
     "external_annotations": [{{"device": 0, "stage": "START", "name": "fwd", "time_us": 1}}],
     "internal_metadata": {{"trace_format": 2}}}}
sys.stdout.buffer.write(pickle.dumps(s, protocol=5))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "newer.pickle", &p);
    let out = ok(&["summary"], &[&f]);
    assert!(out.contains("modeling_bert.py:286"), "{out}");
    // A backward allocation's site is the forward line that made its autograd node.
    assert!(
        out.contains("backward of project (/w/attention.py:41)"),
        "{out}"
    );
    // The private pool's memory is shown apart: the default pool cannot reuse it.
    assert!(
        out.contains("pool (1, 7): 2.00 MiB reserved in 1 segments, 2.00 MiB allocated"),
        "{out}"
    );
    // Sites are split by the torch.compile region and the private pool the trace entry
    // names (PyTorch's memory_viz shows both on each allocation); "N/A" and the default
    // pool (0, 0) add nothing.
    let bert = "forward (/w/transformers/models/bert/modeling_bert.py:286)";
    let at_peak = out
        .split("at the trace's peak")
        .nth(1)
        .and_then(|p| p.split("by live bytes").next())
        .unwrap_or_else(|| panic!("no sites at the peak\n{out}"));
    assert!(
        at_peak.contains(&format!(
            "1 blocks  {bert} [compiled region Torch-Compiled Region: 0/1] [private pool (1, 7)]\n"
        )),
        "{out}"
    );
    assert!(at_peak.contains(&format!("1 blocks  {bert}\n")), "{out}");
    // A block live at the end in a private pool's segment says so too.
    let at_end = out.split("by live bytes").nth(1).unwrap_or_default();
    assert!(
        at_end.contains(&format!("1 blocks  {bert} [private pool (1, 7)]\n")),
        "{out}"
    );
    // The report's sites at the peak name them as well.
    let page = dir.join("newer.html");
    let mut rc = Command::new(common::cushim_bin());
    rc.arg("report").arg(&f).arg("-o").arg(&page);
    common::run_ok(&mut rc);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("[compiled region Torch-Compiled Region: 0/1] [private pool (1, 7)]"),
        "report"
    );
    let j = dir.join("newer.json");
    let back = dir.join("back.pickle");
    ok(&["convert"], &[&f, &j]);
    ok(&["convert"], &[&j, &back]);
    let text = std::fs::read_to_string(&j).unwrap();
    for key in [
        "user_metadata",
        "compile_context",
        "forward_frames",
        "pool_id",
        "segment_pool_id",
        "external_annotations",
        "internal_metadata",
    ] {
        assert!(text.contains(key), "{key} carried into JSON");
    }
    let back_bytes = std::fs::read(&back).unwrap();
    assert!(back_bytes.windows(13).any(|w| w == b"user_metadata"));
    // The summary prints no file name: the round trip gives the same text.
    assert_eq!(ok(&["summary"], &[&back]), out);
}

/// Three stack shapes copied in form from public PyTorch 2.x snapshots: a backward
/// allocation on the autograd engine's worker thread whose start inside libstdc++ and libc
/// the symbolizer misnamed (nearest export); `a / b` on tensors in a LLaMA layer, through
/// CPython's number protocol (`binary_op1`); and a custom autograd Function whose outer
/// Python frames PyTorch appended past `_start`.
const SHAPES_PY: &str = r#"
import pickle, sys
MIB = 1 << 20
def native(n, f="??"):
    return {"name": n, "filename": f, "line": 0}
def py(n, f, l):
    return {"name": n, "filename": f, "line": l}
alloc = [native("torch::unwind::unwind()"),
         native("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp")]
worker = alloc + [
    native("at::_ops::div_Scalar::call(at::Tensor const&, c10::Scalar const&)"),
    native("torch::autograd::generated::MeanBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
    native("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
    native("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*)"),
    native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    native("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", ""),
    native("std::error_code::default_error_condition() const"),
    native("pthread_condattr_setpshared"),
    native("__clone")]
llama = alloc + [
    native("torch::autograd::THPVariable_div(_object*, _object*, _object*)", "python_variable_methods.cpp"),
    native("method_vectorcall_VARARGS_KEYWORDS", ""),
    native("vectorcall_maybe.constprop.0", ""),
    native("slot_nb_true_divide", ""),
    native("binary_op1", ""),
    py("forward", "/w/lib/transformers/models/llama/modeling_llama.py", 330),
    native("_PyEval_EvalFrameDefault"),
    native("_PyObject_MakeTpCall.localalias", ""),
    py("main", "/w/run_llama.py", 53),
    native("Py_BytesMain"), native("__libc_start_main"), native("_start")]
function = alloc + [
    native("pybind11::cpp_function::dispatcher(_object*, _object*, _object*)", ""),
    native("cfunction_call", ""),
    py("broadcast_coalesced", "/v/site-packages/torch/nn/parallel/comm.py", 66),
    native("_PyEval_EvalFrameDefault"),
    native("(anonymous namespace)::THPFunction_apply(_object*, _object*)", "python_function.cpp"),
    native("PyObject_Call"),
    py("forward", "/v/site-packages/torch/nn/parallel/_functions.py", 23),
    py("apply", "/v/site-packages/torch/autograd/function.py", 576),
    native("_PyEval_EvalFrameDefault"),
    native("Py_RunMain.localalias", ""), native("Py_BytesMain"), native("__libc_start_main"), native("_start"),
    py("train", "/w/trainers.py", 444),
    py("main", "/w/start_train.py", 46)]
base = 0x7f0000000000
blocks, trace = [], []
for i, (frames, mib) in enumerate([(worker, 8), (llama, 4), (function, 2)]):
    a = base + i * 16 * MIB
    blocks.append({"address": a, "size": mib * MIB, "requested_size": mib * MIB,
                   "state": "active_allocated", "frames": frames})
    trace.append({"action": "alloc", "addr": a, "size": mib * MIB, "stream": 0, "frames": frames})
segs = [{"device": 0, "address": b["address"], "total_size": 16 * MIB, "allocated_size": b["size"],
         "active_size": b["size"], "requested_size": b["size"], "stream": 0, "segment_type": "large",
         "is_expandable": False, "frames": b["frames"],
         "blocks": [b, {"address": b["address"] + b["size"], "size": 16 * MIB - b["size"],
                        "requested_size": 0, "state": "inactive", "frames": []}]} for b in blocks]
trace = [{"action": "segment_alloc", "addr": s["address"], "size": 16 * MIB, "stream": 0,
          "frames": s["frames"]} for s in segs] + trace
sys.stdout.buffer.write(pickle.dumps({"segments": segs, "device_traces": [trace]}, protocol=5))
"#;

#[test]
fn interpreter_thread_start_and_binding_frames_of_real_stack_shapes_are_never_sites() {
    let dir = common::scratch("analyze-real-shapes");
    let Some(p) = python(SHAPES_PY) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "shapes.pickle", &p);
    let out = ok(&["summary"], &[&f]);
    for want in [
        "torch::autograd::generated::MeanBackward0::apply(",
        "forward (/w/lib/transformers/models/llama/modeling_llama.py:330)",
        "train (/w/trainers.py:444)",
    ] {
        assert!(out.contains(want), "{want}\n{out}");
    }
    for machinery in [
        "std::error_code",
        "pthread_condattr",
        "__clone",
        "binary_op1",
        "slot_nb",
        "THPFunction_apply",
        "broadcast_coalesced",
        "(??:0)",
        "(:0)",
    ] {
        assert!(!out.contains(machinery), "{machinery}\n{out}");
    }
}

/// Whether `v` conforms to the JSON Schema `schema` (the keywords cushim's schemas use:
/// `type`, `const`, `required`, `properties`, `items`; each applies to the instances of its
/// type only, as JSON Schema says). The path of the first mismatch otherwise.
fn conforms(schema: &serde_json::Value, v: &serde_json::Value, at: &str) -> Result<(), String> {
    use serde_json::Value;
    let type_ok = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    };
    match schema.get("type") {
        Some(Value::String(t)) if !type_ok(t) => return Err(format!("{at}: not {t}: {v}")),
        Some(Value::Array(ts)) if !ts.iter().any(|t| t.as_str().is_some_and(type_ok)) => {
            return Err(format!("{at}: none of {ts:?}: {v}"))
        }
        _ => {}
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(o) = v.as_object() {
        for k in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let k = k.as_str().unwrap();
            if !o.contains_key(k) {
                return Err(format!("{at}: no {k:?}"));
            }
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (k, s) in props {
                if let Some(x) = o.get(k) {
                    conforms(s, x, &format!("{at}.{k}"))?;
                }
            }
        }
    }
    if let (Some(a), Some(s)) = (v.as_array(), schema.get("items")) {
        for (i, x) in a.iter().enumerate() {
            conforms(s, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn schema(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/json")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

#[test]
fn the_schema_check_rejects_what_the_schema_does_not_allow() {
    let s = schema("fit.schema.json");
    let good = serde_json::json!({"schema_version": 1, "command": "fit", "file": "f",
        "step_bytes": 2, "device_memory_bytes": null, "recorded_fits": null,
        "configurations": [{"name": "x", "recorded": true, "min_device_bytes": 4, "fits": null}],
        "devices": []});
    conforms(&s, &good, "$").unwrap();
    let mut bad = good.clone();
    bad["configurations"][0]["min_device_bytes"] = serde_json::json!("4");
    assert!(conforms(&s, &bad, "$").is_err());
    let mut bad = good;
    bad["schema_version"] = serde_json::json!(2);
    assert!(conforms(&s, &bad, "$").is_err());
}

/// `cushim fit` on real full training steps (tests/data/real/README.md): under the recorded
/// settings the smallest device lies between the peak allocated and the recorded peak
/// reserved, the trace fits on it (exit status 0) and not on 2 MiB less (exit status 1,
/// naming the first failing request); the JSON holds to its schema, and `replay --json` too.
#[test]
fn fit_on_real_snapshots_passes_at_its_smallest_device_and_fails_2_mib_below() {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real");
    for name in [
        "cs336-assignment2-memory_snapshot.pickle.gz",
        "cs336-medium-128-training-memory_snapshot.pickle.gz",
        // Every segment there when the trace began; blocks holding a tail past their request.
        "cs336-bcrafton-memory_snapshot.pickle.gz",
    ] {
        let f = real.join(name);
        let out = ok(&["fit", "--json", "--conf", ""], &[&f]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        conforms(&schema("fit.schema.json"), &v, "$").unwrap();
        let dev = &v["devices"][0];
        let rec = &dev["configurations"][0];
        assert_eq!(rec["recorded"], true, "{out}");
        let min = rec["min_device_bytes"].as_u64().unwrap();
        let (alloc, reserved) = (
            dev["peak_allocated_bytes"].as_u64().unwrap(),
            dev["recorded_peak_reserved_bytes"].as_u64().unwrap(),
        );
        assert!(
            alloc <= min && min <= reserved,
            "{name}: {alloc} <= {min} <= {reserved}\n{out}"
        );
        assert_eq!(v["configurations"][0]["min_device_bytes"], min);
        let at = |b: u64| {
            cushim(
                &["fit", "--conf", "", "--device-memory", &b.to_string()],
                &[&f],
            )
        };
        let pass = at(min);
        assert_eq!(pass.status.code(), Some(0), "{name} on {min}");
        let fail = at(min - (2 << 20));
        let text = String::from_utf8_lossy(&fail.stdout);
        assert_eq!(fail.status.code(), Some(1), "{name} on 2 MiB less\n{text}");
        // The first failure is named: an event, or the layout the trace began with.
        assert!(text.contains("first out-of-memory "), "{text}");
        let r: serde_json::Value =
            serde_json::from_str(&ok(&["replay", "--json", "--conf", ""], &[&f])).unwrap();
        conforms(&schema("replay.schema.json"), &r, "$").unwrap();
        assert_eq!(r["devices"][0]["rows"][0]["recorded"], true);
    }
}

/// A program that empties the cache itself (`torch.cuda.empty_cache()`: segment frees that
/// no failed allocation explains) has the replayed cache emptied at the same moment: the
/// 20 MiB request after it gets a new segment, as it did, instead of a piece of the cached
/// 40 MiB one.
#[test]
fn replay_empties_the_cache_where_the_program_did() {
    let dir = common::scratch("analyze-real-empty-cache");
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
a, b, c = 0x7f0000000000, 0x7f0010000000, 0x7f0020000000
def e(action, x, n): return {{"action": action, "addr": x, "size": n, "stream": 0, "frames": bert}}
# The program's empty_cache frees the cached 40 MiB segment (the small one holds a block
# from before the trace, so it stays); an allocation in the small segment follows (no failed device allocation: nothing was retried), then 20 MiB.
trace = [e("segment_alloc", a, 40 * MIB), e("alloc", a, 40 * MIB),
         e("free_requested", a, 40 * MIB), e("free_completed", a, 40 * MIB),
         e("segment_free", a, 40 * MIB), e("alloc", c + 512, 512),
         e("segment_alloc", b, 20 * MIB), e("alloc", b, 20 * MIB)]
def blk(x, n, st): return {{"address": x, "size": n, "requested_size": n, "state": st, "frames": bert}}
def seg(x, n, blocks, kind): return {{"device": 0, "address": x, "total_size": n, "stream": 0,
    "segment_type": kind, "is_expandable": False, "frames": bert, "blocks": blocks}}
segs = [seg(b, 20 * MIB, [blk(b, 20 * MIB, "active_allocated")], "large"),
        seg(c, 2 * MIB, [blk(c, 512, "active_allocated"), blk(c + 512, 512, "active_allocated"),
                         blk(c + 1024, 2 * MIB - 1024, "inactive")], "small")]
sys.stdout.buffer.write(pickle.dumps({{"segments": segs, "device_traces": [trace]}}, protocol=4))
"#
    )) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "empty-cache.pickle", &p);
    let out = ok(&["replay", "--conf", ""], &[&f]);
    let replayed = replay_row(&out, "replay: recorded");
    assert_eq!(
        (replayed[0].as_str(), replayed[4].as_str()),
        ("1", "2"),
        "one segment freed, two made\n{out}"
    );
    assert!(
        out.contains("1 times releasing it at the program's request"),
        "{out}"
    );
}

/// Bad input to `fit` and `replay`: one line saying what and where, exit status 2.
#[test]
fn fit_and_replay_refuse_bad_input_in_one_line() {
    let dir = common::scratch("analyze-real-fit-bad");
    let real = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-assignment2-memory_snapshot.pickle.gz");
    let r = cushim(&["fit", "--device-memory", "lots"], &[&real]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--device-memory \"lots\"") && err.lines().count() == 1,
        "{err}"
    );
    // Segments without a trace: nothing to replay is an error, not an empty table.
    let Some(p) = python(&format!(
        r#"{FRAMES_PY}
seg = {{"device": 0, "address": 1 << 40, "total_size": 2 * MIB, "stream": 0,
       "segment_type": "small", "is_expandable": False, "frames": bert,
       "blocks": [{{"address": 1 << 40, "size": 2 * MIB, "requested_size": 2 * MIB,
                   "state": "inactive", "frames": bert}}]}}
sys.stdout.buffer.write(pickle.dumps({{"segments": [seg], "device_traces": [[]]}}, protocol=4))
"#
    )) else {
        return;
    };
    let f = write(&dir, "no-trace.pickle", &p);
    for cmd in ["replay", "fit"] {
        let r = cushim(&[cmd], &[&f]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("no allocation trace to replay") && err.lines().count() == 1,
            "{cmd}: {err}"
        );
    }
}

/// The committed real PyTorch snapshot.
fn real_snapshot() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real/cs336-assignment2-memory_snapshot.pickle.gz")
}

fn json_of(args: &[&str], files: &[&Path]) -> serde_json::Value {
    let out = ok(args, files);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}):\n{out}"))
}

#[test]
fn the_categories_of_a_real_snapshots_peak_sum_to_its_allocated_bytes() {
    let real = real_snapshot();
    let v = json_of(&["summary", "--by", "category", "--json"], &[&real]);
    let s = json_of(&["summary", "--json"], &[&real]);
    let dev = &v["devices"][0];
    let cats = dev["categories"].as_array().expect("categories");
    let sum: i64 = cats
        .iter()
        .map(|c| c["bytes"].as_i64().expect("bytes"))
        .sum();
    assert_eq!(Some(sum), dev["allocated_bytes"].as_i64(), "{v}");
    // The moment is the trace's peak the summary names, with the same bytes as its sites.
    let sd = &s["devices"][0];
    assert_eq!(dev["after_event"], sd["trace_peak_after_event"], "{v}\n{s}");
    let sites: i64 = sd["sites_at_peak"]
        .as_array()
        .expect("sites")
        .iter()
        .map(|x| x["bytes"].as_i64().expect("bytes"))
        .sum();
    assert_eq!(sum, sites, "{v}\n{s}");
    // The blocks live when the trace began are their own line, whole.
    let before = cats
        .iter()
        .find(|c| c["category"] == "before the recording / no stack")
        .expect("a before-the-recording line");
    assert_eq!(before["bytes"], dev["before_recording_bytes"], "{v}");
    // The peak of this forward-and-backward run is activations kept for backward, most of it.
    let acts = cats
        .iter()
        .find(|c| c["category"] == "activations kept for backward")
        .and_then(|c| c["bytes"].as_i64())
        .expect("activations");
    assert!(acts * 2 > sum, "{v}");
    // The text and the JSON give the same figures: the activations' row in MiB.
    let text = ok(&["summary", "--by", "category"], &[&real]);
    let mib = format!("{:.2} MiB", acts as f64 / (1u64 << 20) as f64);
    assert!(
        text.lines()
            .any(|l| l.contains(&mib) && l.ends_with("activations kept for backward")),
        "{mib}:\n{text}"
    );
}

/// Validate `value` against `docs/json/<schema>.schema.json` with python3's jsonschema;
/// false (after a skip line) where that cannot run here.
fn valid_against(schema: &str, value: &serde_json::Value, dir: &Path) -> bool {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/json")
        .join(format!("{schema}.schema.json"));
    assert!(path.exists(), "no schema {}", path.display());
    let doc = write(dir, &format!("{schema}.json"), value.to_string().as_bytes());
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import json, sys\n\
             try:\n    import jsonschema\nexcept ImportError:\n    sys.exit(77)\n\
             s = json.load(open(sys.argv[1])); d = json.load(open(sys.argv[2]))\n\
             jsonschema.Draft202012Validator.check_schema(s)\n\
             jsonschema.Draft202012Validator(s).validate(d)\n",
        )
        .arg(&path)
        .arg(&doc)
        .output();
    match out {
        Ok(o) if o.status.code() == Some(77) => {
            common::skip::skip("--json against its schema", "python3 has no jsonschema");
            false
        }
        Err(e) => {
            common::skip::skip("--json against its schema", &format!("no python3: {e}"));
            false
        }
        Ok(o) => {
            assert!(
                o.status.success(),
                "{schema}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            true
        }
    }
}

#[test]
fn every_json_output_holds_to_its_schema() {
    let dir = common::scratch("json-schemas");
    let real = real_snapshot();
    let other = write(&dir, "other.json", one_device(0, 64, "other.py").as_bytes());
    // PyTorch's newer fields: pinned host memory (device -1), record_function ranges.
    let newer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pytorch-newer");
    let (host, annotated) = (
        newer.join("pinned-host.pickle"),
        newer.join("record-function-2.5.pickle"),
    );
    for (schema, args, files) in [
        ("summary", vec!["summary", "--json"], vec![host.as_path()]),
        (
            "summary-by-range",
            vec!["summary", "--by", "range", "--json"],
            vec![annotated.as_path()],
        ),
        ("summary", vec!["summary", "--json"], vec![real.as_path()]),
        (
            "summary",
            vec!["summary", "--json"],
            vec![real.as_path(), other.as_path()],
        ),
        (
            "summary-by-category",
            vec!["summary", "--by", "category", "--json"],
            vec![real.as_path()],
        ),
        (
            "summary-by-category",
            vec!["summary", "--by", "category", "--json", "--at", "end"],
            vec![other.as_path()],
        ),
        (
            "summary-by-range",
            vec!["summary", "--by", "range", "--json"],
            vec![real.as_path()],
        ),
        (
            "diff",
            vec!["diff", "--json"],
            vec![real.as_path(), other.as_path()],
        ),
    ] {
        let v = json_of(&args, &files);
        assert_eq!(v["schema_version"], 1, "{v}");
        if !valid_against(schema, &v, &dir) {
            return;
        }
    }
}

#[test]
fn diff_shows_the_categories_at_each_runs_peak() {
    let dir = common::scratch("diff-categories");
    let a = write(&dir, "a.json", one_device(0, 64, "a.py").as_bytes());
    let b = write(&dir, "b.json", one_device(0, 96, "b.py").as_bytes());
    let out = ok(&["diff"], &[&a, &b]);
    // No trace: every block's allocation is before the recording, on both sides.
    assert!(
        out.contains("device 0: bytes per category at each run's peak:"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.ends_with("before the recording / no stack"))
        .unwrap_or_else(|| panic!("no category row:\n{out}"));
    assert!(
        row.contains("64.00 MiB ->      96.00 MiB") && row.contains("+32.00 MiB"),
        "{row}"
    );
    // --at and --category without --by category: one line, exit status 2.
    let bad = common::cli::cushim(&["summary", "--at", "end"], &[&a]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

#[test]
fn categories_at_seconds_after_the_first_trace_event() {
    let dir = common::scratch("categories-seconds");
    let m = 1u64 << 20;
    let base = 1u64 << 40;
    let frames = serde_json::json!([{"name": "load", "filename": "/w/train.py", "line": 3}]);
    let snap = serde_json::json!({
        "segments": [{"device": 0, "address": base, "total_size": 4 * m, "stream": 0,
            "segment_type": "large",
            "blocks": [
                {"address": base, "size": m, "requested_size": m, "state": "active_allocated",
                 "frames": frames},
                {"address": base + m, "size": 2 * m, "requested_size": 2 * m,
                 "state": "active_allocated", "frames": frames},
                {"address": base + 3 * m, "size": m, "requested_size": m, "state": "inactive"}]}],
        "device_traces": [[
            {"action": "alloc", "addr": base, "size": m, "stream": 0,
             "time_us": 1_000_000, "frames": frames},
            {"action": "alloc", "addr": base + m, "size": 2 * m, "stream": 0,
             "time_us": 3_000_000, "frames": frames}]],
    });
    let f = write(&dir, "t.json", snap.to_string().as_bytes());
    let at = |s: &str| -> serde_json::Value {
        json_of(&["summary", "--by", "category", "--json", "--at", s], &[&f])
    };
    assert_eq!(
        at("1.5s")["devices"][0]["allocated_bytes"],
        m,
        "1.5 s: the first only"
    );
    assert_eq!(
        at("2s")["devices"][0]["allocated_bytes"],
        3 * m,
        "2 s: both"
    );
    assert_eq!(at("2s")["devices"][0]["after_event"], 2);
}

/// `summary` of a snapshot that ran out of memory says so: the request and its site, what
/// the driver reported free, the cache then, why it failed, and what was live by category
/// (the same moment `summary --by category --at EVENT` shows); `--json` carries it all.
#[test]
fn summary_tells_an_out_of_memory_its_request_the_cache_then_and_why() {
    let dir = common::scratch("analyze-real-summary-oom");
    let Some(p) = limit_pickle(true) else {
        eprintln!("skipping: python3 is not installed");
        return;
    };
    let f = write(&dir, "oom.pickle", &p);
    let out = ok(&["summary"], &[&f]);
    for want in [
        "device 0: ran out of memory 1 time",
        "at event 12 of 13: a request of 512.00 MiB from",
        "the driver reported 20.00 MiB free on a device of about 130.00 MiB",
        "the cache held 110.00 MiB reserved: 100.00 MiB allocated, 10.00 MiB free inside",
        "why: the device was full: 492.00 MiB more free device memory",
        "--device-memory 136314880",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }
    let v = json_of(&["summary", "--json"], &[&f]);
    valid_against("summary", &v, &dir);
    let o = &v["devices"][0]["out_of_memory"][0];
    assert_eq!(o["requested_bytes"], 512u64 << 20, "{v}");
    assert_eq!(o["device_free_bytes"], 20u64 << 20, "{v}");
    assert_eq!(o["fragmentation"], false, "{v}");
    let sum: u64 = o["categories"]
        .as_array()
        .expect("categories")
        .iter()
        .map(|c| c["bytes"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(o["allocated_bytes"], sum, "{v}");
    let at = json_of(
        &["summary", "--by", "category", "--at", "12", "--json"],
        &[&f],
    );
    assert_eq!(
        at["devices"][0]["allocated_bytes"], o["allocated_bytes"],
        "{at}"
    );
    // Without the oom entry, nothing is said.
    let f = write(&dir, "limit.pickle", &limit_pickle(false).expect("python3"));
    let out = ok(&["summary"], &[&f]);
    assert!(!out.contains("ran out of memory"), "{out}");
    let v = json_of(&["summary", "--json"], &[&f]);
    assert_eq!(
        v["devices"][0]["out_of_memory"],
        serde_json::json!([]),
        "{v}"
    );
}
