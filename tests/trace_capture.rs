//! Native stack capture end to end in-process: DWARF and frame-pointer unwinding through
//! Rust and C frames (a `-g -fno-omit-frame-pointer` shared object loaded with dlopen),
//! symbolized to the right function, file and line; skipping a module's leading frames.

mod common;
use common::skip;
use common::snapshot_support as support;

use cushim::config::history::Unwinder;
use cushim::trace::stack::{capture, SkipRange};
use cushim::trace::symbolize::{Frame, Symbolizer};
use cushim::trace::unwind_fp;
use std::path::PathBuf;
use std::sync::OnceLock;

use support::{OuterFn, WalkFn};

struct CLib {
    outer: OuterFn,
    src: PathBuf,
    /// Any address inside the library.
    addr: usize,
}

/// Compile and dlopen `tests/c/trace_fp.c` once, before anything in this binary symbolizes
/// (the symbolizer's module list is taken at its first use).
fn clib() -> &'static CLib {
    static LIB: OnceLock<CLib> = OnceLock::new();
    LIB.get_or_init(|| {
        let (src, outer) = support::load_trace_fp("trace-c", "libtrace_fp.so");
        CLib {
            outer,
            src,
            addr: outer as usize,
        }
    })
}

fn marker_line(src: &PathBuf, marker: &str) -> u64 {
    let text = std::fs::read_to_string(src).unwrap();
    text.lines().position(|l| l.contains(marker)).unwrap() as u64 + 1
}

fn symbolize(ips: &[u64]) -> Vec<Frame> {
    let mut s = Symbolizer::new();
    let mut ids = Vec::new();
    s.resolve_stack(ips, &mut ids);
    ids.iter()
        .map(|&i| s.frames()[i as usize].clone())
        .collect()
}

fn find<'a>(frames: &'a [Frame], name: &str) -> Option<(usize, &'a Frame)> {
    frames
        .iter()
        .enumerate()
        .find(|(_, f)| f.name.contains(name))
}

#[inline(never)]
fn rust_leaf(unwinder: Unwinder) -> (Vec<u64>, u64) {
    let mut buf = [0u64; 64];
    let line = u64::from(line!()) + 1;
    let n = capture(&mut buf, unwinder, &SkipRange::NONE);
    (std::hint::black_box(buf[..n].to_vec()), line)
}

#[inline(never)]
fn rust_caller(unwinder: Unwinder) -> (Vec<u64>, u64, u64) {
    let line = u64::from(line!()) + 1;
    let (ips, leaf_line) = rust_leaf(unwinder);
    (std::hint::black_box(ips), leaf_line, line)
}

#[test]
fn dwarf_capture_names_rust_callers_with_file_and_line() {
    clib();
    let (ips, leaf_line, caller_line) = rust_caller(Unwinder::Dwarf);
    let frames = symbolize(&ips);
    let (i, leaf) = find(&frames, "rust_leaf").unwrap_or_else(|| panic!("{frames:#?}"));
    assert!(leaf.filename.ends_with("trace_capture.rs"), "{leaf:?}");
    assert_eq!(leaf.line, leaf_line, "{leaf:?}");
    let (j, caller) = find(&frames, "rust_caller").unwrap();
    assert_eq!(caller.line, caller_line, "{caller:?}");
    assert!(j > i, "innermost first");
    assert!(
        !leaf.name.contains("::h"),
        "demangled without hash: {}",
        leaf.name
    );
}

extern "C" fn walk_fp(fp: usize, buf: *mut u64, n: usize) -> usize {
    // SAFETY (test): the C side passes a buffer of n words.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf, n) };
    unwind_fp::capture_from(fp, buf, &SkipRange::NONE)
}

extern "C" fn walk_dwarf(_fp: usize, buf: *mut u64, n: usize) -> usize {
    // SAFETY (test): as above.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf, n) };
    capture(buf, Unwinder::Dwarf, &SkipRange::NONE)
}

extern "C" fn walk_fp_skipping_c(fp: usize, buf: *mut u64, n: usize) -> usize {
    // SAFETY (test): as above.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf, n) };
    let skip = SkipRange::of_module_containing(clib().addr);
    unwind_fp::capture_from(fp, buf, &skip)
}

#[inline(never)]
fn call_c(walk: WalkFn) -> Vec<u64> {
    let mut buf = [0u64; 64];
    // SAFETY (test): the library's function walks at most 64 entries into buf.
    let n = unsafe { (clib().outer)(walk, buf.as_mut_ptr(), buf.len()) };
    std::hint::black_box(buf[..n].to_vec())
}

fn check_c_frames(frames: &[Frame]) {
    let lib = clib();
    for (func, marker) in [
        ("trace_fp_middle", "LINE_MIDDLE"),
        ("trace_fp_outer", "LINE_OUTER"),
    ] {
        let (_, f) = find(frames, func).unwrap_or_else(|| panic!("{func} missing: {frames:#?}"));
        assert!(f.filename.ends_with("trace_fp.c"), "{f:?}");
        assert_eq!(f.line, marker_line(&lib.src, marker), "{f:?}");
    }
    let m = find(frames, "trace_fp_middle").unwrap().0;
    let o = find(frames, "trace_fp_outer").unwrap().0;
    assert_eq!(o, m + 1, "outer directly above middle");
}

#[test]
fn frame_pointer_walk_through_c_frames_gives_their_functions_files_and_lines() {
    let frames = symbolize(&call_c(walk_fp));
    // The walk starts at trace_fp_inner's frame: its first return address is in middle.
    assert!(frames[0].name.contains("trace_fp_middle"), "{frames:#?}");
    check_c_frames(&frames);
    // The chain continues into the Rust caller (its return address is in that frame's
    // record even when Rust itself omits frame pointers).
    assert!(find(&frames, "call_c").is_some(), "{frames:#?}");
}

#[test]
fn dwarf_unwind_through_c_frames_gives_their_functions_files_and_lines() {
    let frames = symbolize(&call_c(walk_dwarf));
    let (_, inner) = find(&frames, "trace_fp_inner").unwrap_or_else(|| panic!("{frames:#?}"));
    assert_eq!(inner.line, marker_line(&clib().src, "LINE_INNER"));
    check_c_frames(&frames);
    assert!(find(&frames, "call_c").is_some());
}

#[test]
fn skip_range_drops_the_leading_frames_of_that_module() {
    let frames = symbolize(&call_c(walk_fp_skipping_c));
    assert!(find(&frames, "trace_fp_").is_none(), "{frames:#?}");
    assert!(
        frames[0].name.contains("call_c"),
        "first frame is the call site: {frames:#?}"
    );
}

#[inline(never)]
fn nest(depth: usize, f: &mut dyn FnMut()) {
    if depth == 0 {
        f();
    } else {
        nest(depth - 1, f);
    }
    std::hint::black_box(depth);
}

/// Cost of one capture + intern of a ~30-frame stack. Run with
/// `cargo test --release -p cushim --test trace_capture -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_capture_cost() {
    use cushim::trace::stack::capture_id;
    for (name, unwinder) in [("dwarf", Unwinder::Dwarf), ("fp", Unwinder::Fp)] {
        let mut frames = 0;
        let mut per = 0.0;
        nest(24, &mut || {
            let n = 20_000;
            let t = std::time::Instant::now();
            let mut id = 0;
            for _ in 0..n {
                id = capture_id(64, unwinder, &SkipRange::NONE);
            }
            per = t.elapsed().as_nanos() as f64 / n as f64;
            frames = cushim::trace::intern::StackTable::global()
                .get(id)
                .map_or(0, |s| s.len());
        });
        println!("{name}: {per:.0} ns per capture+intern of {frames} frames");
    }
    // The locked alternative, for comparison with trace_unsynchronized.
    nest(24, &mut || {
        let n = 20_000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let mut k = 0;
            backtrace::trace(|_| {
                k += 1;
                true
            });
            std::hint::black_box(k);
        }
        println!(
            "backtrace::trace (locked): {:.0} ns",
            t.elapsed().as_nanos() as f64 / n as f64
        );
    });
}

#[test]
fn fp_capture_of_rust_frames_agrees_with_dwarf_when_built_with_frame_pointers() {
    clib();
    let (fp_ips, leaf_line, caller_line) = rust_caller(Unwinder::Fp);
    if fp_ips.len() < 3 {
        // This build omits frame pointers (RUSTFLAGS="-C force-frame-pointers=yes" turns
        // them on): the walk stops early, which is all it may do. The C tests above cover
        // walking real frame-pointer chains.
        skip::skip(
            "the frame-pointer walk of Rust frames",
            &format!("no frame pointers in this build: {} frames", fp_ips.len()),
        );
        return;
    }
    let frames = symbolize(&fp_ips);
    let (_, leaf) = find(&frames, "rust_leaf").unwrap_or_else(|| panic!("{frames:#?}"));
    assert_eq!(
        (leaf.line, leaf.filename.ends_with("trace_capture.rs")),
        (leaf_line, true)
    );
    let (_, caller) = find(&frames, "rust_caller").unwrap();
    assert_eq!(caller.line, caller_line);
}
