//! The fast DWARF unwinder (`Unwinder::Dwarf`) gives the same return addresses as libgcc's
//! `_Unwind_Backtrace` (`backtrace::trace_unsynchronized`) for the same call stack: through
//! Rust frames at several depths, on several threads, and through C frames built without
//! frame pointers in a library loaded with dlopen after the process's first capture.
//! (x86_64 only: elsewhere `Unwinder::Dwarf` is libgcc itself, and the fixtures are x86 code.)
#![cfg(target_arch = "x86_64")]

use cushim::config::history::Unwinder;
use cushim::trace::stack::{capture, SkipRange};
use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;

/// Both captures of one call stack, taken inside the same `#[inline(never)]` function.
struct Pair {
    ours: Vec<u64>,
    /// libgcc's frames as (ip, start of the enclosing function).
    theirs: Vec<(u64, u64)>,
    /// Start of the function both captures were taken in.
    at: u64,
}

#[inline(never)]
fn capture_both() -> Pair {
    let mut buf = [0u64; 256];
    let n = capture(&mut buf, Unwinder::Dwarf, &SkipRange::NONE);
    let mut theirs = Vec::new();
    // SAFETY (test): libgcc's unwinder is thread-safe on Linux.
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            // libgcc reports the end of the stack as a frame at ip 0.
            if f.ip().is_null() {
                return false;
            }
            theirs.push((f.ip() as u64, f.symbol_address() as u64));
            true
        })
    };
    std::hint::black_box(Pair {
        ours: buf[..n].to_vec(),
        theirs,
        at: capture_both as *const () as u64,
    })
}

/// Ours must end with exactly libgcc's frames above the capturing function, preceded by
/// one return address inside it.
fn assert_same_callers(p: &Pair) -> usize {
    let h = p
        .theirs
        .iter()
        .position(|&(_, sym)| sym == p.at)
        .unwrap_or_else(|| panic!("libgcc never saw the capturing function: {:x?}", p.theirs));
    let outer: Vec<u64> = p.theirs[h + 1..].iter().map(|&(ip, _)| ip).collect();
    assert!(
        outer.len() >= 3,
        "too few frames to compare: {:x?}",
        p.theirs
    );
    assert!(
        p.ours.len() > outer.len(),
        "ours {:x?} shorter than libgcc's callers {outer:x?}",
        p.ours
    );
    let tail = &p.ours[p.ours.len() - outer.len()..];
    assert_eq!(tail, &outer[..], "ours {:x?}", p.ours);
    let inside = p.ours[p.ours.len() - outer.len() - 1];
    let (lo, hi) = (p.at, p.theirs[h].0 + 1);
    assert!(
        lo < inside && inside < lo + 0x10000 && inside != hi,
        "frame below the callers ({inside:#x}) should return into the capturing function at {lo:#x}"
    );
    outer.len()
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

#[test]
fn rust_frames_at_several_depths_match_libgcc() {
    let mut seen = Vec::new();
    for depth in [0usize, 1, 5, 20, 60] {
        // Twice: the second walk runs on cached rules.
        for _ in 0..2 {
            nest(depth, &mut || {
                seen.push(assert_same_callers(&capture_both()))
            });
        }
    }
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert!(
        seen[seen.len() - 1] >= seen[0] + 60,
        "depth shows: {seen:?}"
    );
}

#[test]
fn threads_with_their_own_caches_match_libgcc() {
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..50 {
                    nest((t * 7 + i) % 13, &mut || {
                        assert_same_callers(&capture_both());
                    });
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_thread_with_a_small_stack_still_matches_libgcc() {
    // Too little stack for the fast path's rule evaluation: the capture goes to libgcc.
    std::thread::Builder::new()
        .stack_size(96 << 10)
        .spawn(|| {
            nest(3, &mut || {
                assert_same_callers(&capture_both());
            })
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn skip_range_drops_only_leading_frames_of_that_module() {
    let me = skip_range_drops_only_leading_frames_of_that_module as *const () as usize;
    let skip = SkipRange::of_module_containing(me);
    let mut buf = [0u64; 64];
    let n = capture(&mut buf, Unwinder::Dwarf, &skip);
    assert!(n > 0, "libc's thread start lies outside the test binary");
    assert!(!skip.contains(buf[0] as usize), "{:x?}", &buf[..n]);
    let mut small = [0u64; 2];
    assert_eq!(capture(&mut small, Unwinder::Dwarf, &SkipRange::NONE), 2);
}

type CbFn = extern "C" fn(*mut c_void) -> usize;
type OuterFn = unsafe extern "C" fn(CbFn, *mut c_void) -> usize;

extern "C" fn callback(ctx: *mut c_void) -> usize {
    // SAFETY (test): ctx is the Option<Pair> handed to the C code by `through_c`.
    let slot = unsafe { &mut *(ctx as *mut Option<Pair>) };
    *slot = Some(capture_both());
    0
}

/// The frame-pointer walk from inside the C frames, for contrast.
extern "C" fn fp_callback(ctx: *mut c_void) -> usize {
    // SAFETY (test): ctx is the Vec<u64> handed to the C code.
    let out = unsafe { &mut *(ctx as *mut Vec<u64>) };
    let mut buf = [0u64; 64];
    let n = capture(&mut buf, Unwinder::Fp, &SkipRange::NONE);
    out.extend_from_slice(&buf[..n]);
    0
}

fn symbol_of(ip: u64) -> String {
    // SAFETY (test): dladdr only reads loader data; `info` is a valid out-pointer.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr((ip - 1) as *const c_void, &mut info) == 0 || info.dli_sname.is_null() {
            return String::new();
        }
        CStr::from_ptr(info.dli_sname)
            .to_string_lossy()
            .into_owned()
    }
}

#[test]
fn c_frames_without_frame_pointers_in_a_library_loaded_after_first_capture_match_libgcc() {
    // The shared module list exists before the library is loaded.
    let mut buf = [0u64; 8];
    assert!(capture(&mut buf, Unwinder::Dwarf, &SkipRange::NONE) > 0);

    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/trace_unwind_nofp.c");
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("unwind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("libtrace_unwind_nofp.so");
    let st = std::process::Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-fomit-frame-pointer",
            "-fasynchronous-unwind-tables",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());
    let path = CString::new(out.to_str().unwrap()).unwrap();
    // SAFETY (test): loading the library just built; the symbol has the declared type.
    let outer = unsafe {
        assert!(libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD).is_null());
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen {}", out.display());
        let sym = libc::dlsym(h, c"unwind_c_outer".as_ptr());
        assert!(!sym.is_null());
        std::mem::transmute::<*mut c_void, OuterFn>(sym)
    };
    for _ in 0..2 {
        let mut slot: Option<Pair> = None;
        // SAFETY (test): the C code calls `callback` with our slot and returns.
        unsafe { outer(callback, &mut slot as *mut Option<Pair> as *mut c_void) };
        let pair = slot.unwrap();
        assert_same_callers(&pair);
        let names: Vec<String> = pair.ours.iter().map(|&ip| symbol_of(ip)).collect();
        let at = |name: &str| {
            names
                .iter()
                .position(|n| n == name)
                .unwrap_or_else(|| panic!("{name} missing: {names:?}"))
        };
        let (inner, middle, outer_i) = (
            at("unwind_c_inner"),
            at("unwind_c_middle"),
            at("unwind_c_outer"),
        );
        assert_eq!((middle, outer_i), (inner + 1, inner + 2), "{names:?}");
    }
    // The C frames leave no frame-pointer chain: only their unwind tables lead through.
    let mut fp = Vec::new();
    // SAFETY (test): as above.
    unsafe { outer(fp_callback, &mut fp as *mut Vec<u64> as *mut c_void) };
    let names: Vec<String> = fp.iter().map(|&ip| symbol_of(ip)).collect();
    assert!(!names.iter().any(|n| n == "unwind_c_outer"), "{names:?}");
}

/// ns per capture of 1, 8 and 64 frames (deep enough stack below) for the fast walk and
/// libgcc's. Run with
/// `cargo test --release -p cushim --test trace_unwind_matches_libgcc -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_fast_walk_against_libgcc() {
    use cushim::trace::unwind_dwarf;
    type Walker = fn(&mut [u64], &SkipRange) -> usize;
    let walkers: [(&str, Walker); 2] = [
        ("fast", unwind_dwarf::capture),
        ("libgcc", unwind_dwarf::capture_libgcc),
    ];
    nest(80, &mut || {
        for (name, walk) in walkers {
            let mut line = format!("{name}:");
            for frames in [1usize, 8, 64] {
                let mut buf = [0u64; 64];
                let n = 20_000;
                let t = std::time::Instant::now();
                for _ in 0..n {
                    std::hint::black_box(walk(&mut buf[..frames], &SkipRange::NONE));
                }
                let ns = t.elapsed().as_nanos() as f64 / n as f64;
                line += &format!(" {frames} frames {ns:.0} ns;");
            }
            println!("{line}");
        }
    });
}

extern "C" fn jit_callback(ctx: *mut c_void) {
    callback(ctx);
}

/// Code outside every module (as a JIT makes): `sub rsp,8; call rsi; add rsp,8; ret`, which
/// calls `cb(ctx)` with ctx in rdi.
const JIT_CODE: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, 0xff, 0xd6, 0x48, 0x83, 0xc4, 0x08, 0xc3,
];

#[test]
fn a_frame_outside_every_module_is_reported_and_ends_the_walk_like_libgcc() {
    // SAFETY (test): a fresh anonymous mapping, filled then made executable; the code only
    // calls the function it is given, keeping the stack aligned.
    let pair = unsafe {
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(page, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(JIT_CODE.as_ptr(), page as *mut u8, JIT_CODE.len());
        assert_eq!(
            libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
        let code = std::mem::transmute::<
            *mut c_void,
            extern "C" fn(*mut c_void, extern "C" fn(*mut c_void)),
        >(page);
        let mut slot: Option<Pair> = None;
        code(&mut slot as *mut Option<Pair> as *mut c_void, jit_callback);
        libc::munmap(page, 4096);
        slot.unwrap()
    };
    let last = *pair.ours.last().unwrap();
    let jit = pair.theirs.last().unwrap().0;
    assert_eq!(
        last, jit,
        "both end at the return address into the mapping: {:x?}",
        pair.ours
    );
    let h = pair.theirs.iter().position(|&(_, s)| s == pair.at).unwrap();
    let outer: Vec<u64> = pair.theirs[h + 1..].iter().map(|&(ip, _)| ip).collect();
    assert!(
        pair.ours.ends_with(&outer),
        "ours {:x?} theirs {outer:x?}",
        pair.ours
    );
}
