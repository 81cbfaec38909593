//! Shared fixtures for the snapshot and trace tests: a small, hand-made allocator history whose final
//! state is known, real captured stacks for it, scratch directories and the Python checker.
#![allow(dead_code)]

use cushim::alloc::info::{BlockInfo, BlockState, SegmentInfo};
use cushim::config::history::{parse, HistoryConf, Unwinder};
use cushim::snapshot::model::{DeviceState, SnapshotInput};
use cushim::trace::event::{Action, StackId, TraceEvent, NO_STACK};
use cushim::trace::intern::StackTable;
use cushim::trace::stack::{capture_id, SkipRange};
use cushim::trace::symbolize::Symbolizer;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const MIB: u64 = 1 << 20;
pub const KIB: u64 = 1 << 10;
pub const A: u64 = 0x7f00_0000_0000;
pub const B: u64 = 0x7f00_1000_0000;
pub const C: u64 = 0x7f10_0000_0000;

/// The stack `id` without its leading frames up to the one naming `name` (the test's
/// stand-in for skipping the shim's own frames).
pub fn from_frame(id: StackId, name: &str) -> StackId {
    let table = StackTable::global();
    let ips = table.get(id).unwrap();
    let mut sym = Symbolizer::new();
    let at = ips
        .iter()
        .position(|&ip| {
            let ids = sym.resolve(ip).to_vec();
            ids.iter()
                .any(|&i| sym.frames()[i as usize].name.contains(name))
        })
        .unwrap_or(0);
    table.intern(&ips[at..])
}

#[inline(never)]
pub fn site_a() -> StackId {
    let id = capture_id(64, Unwinder::Dwarf, &SkipRange::NONE);
    from_frame(std::hint::black_box(id), "site_a") // not a tail call: this frame stays
}

#[inline(never)]
pub fn site_b() -> StackId {
    let id = capture_id(64, Unwinder::Dwarf, &SkipRange::NONE);
    from_frame(std::hint::black_box(id), "site_b")
}

/// A stack exactly `depth` frames deep below this call (recursion), capped at `max`.
#[inline(never)]
pub fn deep_site(depth: usize, max: usize) -> StackId {
    if depth == 0 {
        let id = capture_id(max, Unwinder::Dwarf, &SkipRange::NONE);
        return std::hint::black_box(id);
    }
    let id = deep_site(depth - 1, max);
    std::hint::black_box(id)
}

pub struct Events {
    pub v: Vec<TraceEvent>,
    t: i64,
}

impl Default for Events {
    fn default() -> Events {
        Events::new()
    }
}

impl Events {
    pub fn new() -> Events {
        Events {
            v: Vec::new(),
            t: 1_700_000_000_000_000,
        }
    }
    pub fn push(&mut self, action: Action, addr: u64, size: u64, stack: StackId) {
        self.t += 10;
        self.v.push(TraceEvent {
            action,
            device: 0,
            addr,
            size,
            stream: 0,
            time_us: self.t,
            stack,
            device_free: if action == Action::Oom { 123 * MIB } else { 0 },
            range: 0,
        });
    }
}

fn block(address: u64, size: u64, state: BlockState, stack: StackId) -> BlockInfo {
    let requested_size = if state == BlockState::Inactive {
        0
    } else {
        size
    };
    BlockInfo {
        address,
        size,
        requested_size,
        state,
        stack,
    }
}

fn segment(
    address: u64,
    large: bool,
    exp: bool,
    stack: StackId,
    blocks: Vec<BlockInfo>,
) -> SegmentInfo {
    SegmentInfo {
        device: 0,
        address,
        total_size: blocks.iter().map(|b| b.size).sum(),
        stream: 0,
        is_large: large,
        is_expandable: exp,
        pool_id: (0, 0),
        stack,
        blocks,
    }
}

/// The fixture: device 0 with a small, a large and an expandable segment and a history
/// that leads exactly to their state; device 1 present with nothing recorded.
pub fn fixture(history: &str) -> SnapshotInput {
    use Action::*;
    use BlockState::*;
    let (a, b) = (site_a(), site_b());
    let mut e = Events::new();
    e.push(SegmentAlloc, A, 2 * MIB, a);
    e.push(Alloc, A, 512 * KIB, a);
    e.push(Alloc, A + 512 * KIB, 512 * KIB, b);
    e.push(FreeRequested, A, 512 * KIB, a);
    e.push(FreeCompleted, A, 512 * KIB, a);
    e.push(SegmentAlloc, B, 20 * MIB, b);
    e.push(Alloc, B, 4 * MIB, b);
    e.push(Alloc, B + 4 * MIB, 2 * MIB, a);
    e.push(FreeRequested, B + 4 * MIB, 2 * MIB, a);
    e.push(FreeCompleted, B + 4 * MIB, 2 * MIB, a);
    e.push(SegmentMap, C, 2 * MIB, a);
    e.push(Alloc, C, MIB, a);
    e.push(SegmentMap, C + 2 * MIB, 2 * MIB, b);
    e.push(Alloc, C + MIB, 2 * MIB, b);
    e.push(FreeRequested, C + MIB, 2 * MIB, b);
    e.push(FreeCompleted, C + MIB, 2 * MIB, b);
    e.push(SegmentUnmap, C + 2 * MIB, 2 * MIB, b);
    e.push(Oom, 0, 64 << 30, a);
    e.push(Alloc, A + MIB, 512 * KIB, b);
    e.push(FreeRequested, A + MIB, 512 * KIB, b);
    let segments = vec![
        segment(
            A,
            false,
            false,
            a,
            vec![
                block(A, 512 * KIB, Inactive, NO_STACK),
                block(A + 512 * KIB, 512 * KIB, ActiveAllocated, b),
                block(A + MIB, 512 * KIB, ActivePendingFree, b),
                block(A + 3 * 512 * KIB, 512 * KIB, Inactive, NO_STACK),
            ],
        ),
        segment(
            B,
            true,
            false,
            b,
            vec![
                block(B, 4 * MIB, ActiveAllocated, b),
                block(B + 4 * MIB, 16 * MIB, Inactive, NO_STACK),
            ],
        ),
        segment(
            C,
            true,
            true,
            a,
            vec![
                block(C, MIB, ActiveAllocated, a),
                block(C + MIB, MIB, Inactive, NO_STACK),
            ],
        ),
    ];
    let conf = parse(history).unwrap();
    let ring = |evs: Vec<TraceEvent>, conf: &HistoryConf| {
        use cushim::trace::event::EventSink;
        let mut r = cushim::trace::ring::TraceRing::for_device(conf);
        evs.into_iter().for_each(|ev| r.record(ev));
        r.events()
    };
    SnapshotInput {
        devices: vec![
            DeviceState {
                device: 0,
                segments,
                events: ring(e.v, &conf),
            },
            DeviceState {
                device: 1,
                segments: Vec::new(),
                events: Vec::new(),
            },
        ],
        host: None,
        allocator_settings: serde_json::json!({"max_split_size": -1, "expandable_segments": true}),
        stats: serde_json::json!({"num_ooms": 1}),
        history: conf,
        cmdline: vec!["fixture".into(), "--flag".into()],
        ..SnapshotInput::default()
    }
}

/// `tests/c/trace_fp.c`'s walk callback and entry point.
pub type WalkFn = extern "C" fn(usize, *mut u64, usize) -> usize;
pub type OuterFn = unsafe extern "C" fn(WalkFn, *mut u64, usize) -> usize;

/// Build `tests/c/trace_fp.c` as a shared library with frame pointers and line tables
/// (`lib_name` in scratch directory `dir`), load it, and return the source's path and its
/// `trace_fp_outer`.
pub fn load_trace_fp(dir: &str, lib_name: &str) -> (PathBuf, OuterFn) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/trace_fp.c");
    let out = scratch(dir).join(lib_name);
    let st = Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-g",
            "-O1",
            "-fno-omit-frame-pointer",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());
    let path = std::ffi::CString::new(out.to_str().unwrap()).unwrap();
    // SAFETY (test): loading a library just built; the symbol has the declared type.
    let outer = unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen {}", out.display());
        let sym = libc::dlsym(h, c"trace_fp_outer".as_ptr());
        assert!(!sym.is_null());
        std::mem::transmute::<*mut libc::c_void, OuterFn>(sym)
    };
    (src, outer)
}

/// A fresh scratch directory of one test (see `common::scratch_in`), without building the
/// shim.
pub fn scratch(name: &str) -> PathBuf {
    super::scratch_in(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("trace-tests"),
        name,
    )
}

/// Run `tests/snapshot_check.py` on a file; returns (success, stdout+stderr).
pub fn python_check(path: &Path, extra: &[&str]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("snapshot_check.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(path)
        .args(extra)
        .output()
        .expect("running python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
