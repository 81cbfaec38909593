//! Python frames in allocation stacks (CPython 3.9 to 3.13), merged into the native stack
//! where the interpreter's evaluation loops stand (`stacks=all`), or alone (`stacks=python`).
//!
//! Policy, and why:
//! - Only while the interpreter is initialized (`Py_IsInitialized`: nothing during start-up
//!   or once finalization began) and only for a thread that has a thread state of its own
//!   (`PyGILState_GetThisThreadState`: the thread-local state of the thread, a thread-specific
//!   key read that needs no GIL). A native thread that never ran Python gets native frames.
//! - With the GIL held (that state is the one attached and `PyGILState_Check` agrees), the
//!   frames are read as CPython keeps them: 3.9 and 3.10 through the frame API; 3.11+ by
//!   walking the interpreter frames from the innermost frame object, at the offsets of each
//!   version's `pycore_frame.h` (checked against the headers of 3.11.7, 3.12.1 and 3.13.0),
//!   so no frame object is created for the outer frames.
//! - Without the GIL (a `ctypes.CDLL` call, a Cython `with nogil` call such as
//!   `cuda.bindings`' driver calls, any `Py_BEGIN_ALLOW_THREADS`), the same frames are read
//!   without any call into Python, because they cannot change: a thread's frame chain is
//!   pushed and popped only by that thread, and the thread is here, in native code, until
//!   the allocation returns. Other threads may take the GIL meanwhile, but what they can do
//!   to this thread's frames leaves what is read alone: they may create a frame object for
//!   one (`sys._current_frames`), which writes only the frame's `frame_obj`, never read
//!   here; a running generator's frame cannot be resumed elsewhere; the code objects are
//!   held by the frames that run them, so they outlive the walk. What is read: the thread
//!   state's innermost-frame pointer (3.9/3.10 `frame`; 3.11/3.12 `cframe->current_frame`,
//!   a `_PyCFrame` on this thread's own C stack; 3.13 `current_frame`), then per frame its
//!   link, code object, instruction pointer (3.9/3.10: `f_lasti`) and owner; of a code object
//!   seen for the first time, its type, `co_filename` and `co_name` (compact string objects,
//!   immutable, decoded from their inline data) and its line through `PyCode_Addr2Line`,
//!   which only reads the code's immutable line table. Nothing is written, no reference is
//!   taken, nothing is allocated by Python. Offsets are those of each version's headers
//!   (3.9.18, 3.10.13, 3.11.7, 3.12.1, 3.13.0, measured with `offsetof`).
//!   One thing can free that memory under the reader: finalization deletes the thread
//!   states of daemon threads without waiting for them (they stop when they next take the
//!   GIL). So the GIL-less walk reads the thread state, the frames and the code objects'
//!   headers and strings through `self_mem::Checked` (`process_vm_readv` on this process:
//!   an unmapped address fails the read instead of faulting) and validates every pointer it
//!   follows (a code object's type is `PyCode_Type`, a string's is `PyUnicode_Type`, the
//!   walk is bounded); freed-but-mapped memory then yields at worst wrong frames for a
//!   thread that is being torn down. The one plain read left is `PyCode_Addr2Line` on a code
//!   object that passed those checks. What is not read without the GIL: frame objects'
//!   fields (3.11+), `f_lineno` of a traced 3.9/3.10 frame (the line comes from the
//!   instruction, as it does untraced), strings that are not compact (never made by the
//!   compiler or unmarshalling; shown as `?`), and a thread whose attached state is another
//!   one (a sub-interpreter on 3.12+; on 3.9 to 3.11 such a thread shows its main
//!   interpreter's frames). A kernel that refuses `process_vm_readv` (a seccomp filter)
//!   leaves GIL-less captures with native frames only.
//! - A frame is a code object and an instruction offset (3.9/3.10: its line), interned in
//!   one table. The first time one is seen with the GIL held, its name, file and line are
//!   taken through the C API (the caller's pending exception saved and restored) and the
//!   code object is kept alive for the life of the process (so its address is never reused
//!   for another code object); every later capture of it is one table lookup. One first
//!   seen without the GIL cannot be kept alive (a reference count may not be touched
//!   without the GIL), so its entry remembers the code's file and name objects and is
//!   reused only while the code object at that address still has them (checked on each
//!   use; pinned as above the next time it is seen with the GIL). Strings are taken at
//!   capture, not at dump time, because a dump may run on a thread without the GIL or
//!   after the interpreter finalized (the exit dump).
//! - Merging: each native frame inside `_PyEval_EvalFrameDefault` is one evaluation loop;
//!   the Python frames it runs (3.9/3.10: one; 3.11+: up to the next entry frame) are put
//!   just inside it, innermost first, as PyTorch's `stacks=all` shows them. Python frames
//!   left over (a native stack cut short) go at the outer end.
//! - Unsupported builds (free-threaded, `Py_TRACE_REFS` debug builds, other versions) are
//!   named once on stderr; their stacks stay native. The interpreter is looked for once, at
//!   the first capture (a libpython loaded later is not seen).
//!
//! Invariant: Python frames are stored in stacks as `PY_TAG | id` (a non-canonical address,
//! as `module_epochs`' words are, and distinct from them; never a return address) and
//! resolved by [`frame`]; nothing here runs unless `python_stacks` is on.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::config::history::HistoryConf;
use crate::trace::event::{StackId, NO_STACK};
use crate::trace::self_mem::{Blocks, Cached, Mem, Plain};
use crate::trace::stack::intern_tagged;
use crate::trace::stack::{capture, with_frame_buf, SkipRange, CAPTURE_MAX};

/// Marks a Python frame id (low 32 bits) in a stack: a non-canonical address, so never a
/// return address, and not one of `module_epochs`' words (`0xffff_fffe_...`, `..fffd_...`).
pub const PY_TAG: u64 = 0xffff_fffc_0000_0000;
const PY_MASK: u64 = 0xffff_ffff_0000_0000;
/// Most Python frames taken per capture.
const MAX_PY: usize = 256;
/// `FRAME_OWNED_BY_CSTACK` (3.12+): the entry frame an evaluation loop pushes.
const OWNED_BY_CSTACK: u8 = 3;

type Obj = *mut c_void;

/// Where 3.11+ keeps what the walk reads (x86-64 and aarch64 layouts: 8-byte pointers).
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// `offsetof(PyCodeObject, co_code_adaptive)`.
    code_adaptive: usize,
    /// `offsetof(PyFrameObject, f_frame)`.
    f_frame: usize,
    /// `_PyInterpreterFrame`: `previous`, code (`f_code`/`f_executable`), instruction pointer
    /// (`prev_instr`/`instr_ptr`), `owner`.
    previous: usize,
    code: usize,
    instr: usize,
    owner: usize,
    /// 3.11's `is_entry` (3.12+ mark entries by a C-stack frame before them).
    is_entry: Option<usize>,
}

fn layout(minor: u32) -> Option<Layout> {
    let l = match minor {
        11 => Layout {
            code_adaptive: 184,
            f_frame: 24,
            previous: 48,
            code: 32,
            instr: 56,
            owner: 69,
            is_entry: Some(68),
        },
        12 => Layout {
            code_adaptive: 192,
            f_frame: 24,
            previous: 8,
            code: 0,
            instr: 56,
            owner: 70,
            is_entry: None,
        },
        13 => Layout {
            code_adaptive: 200,
            f_frame: 24,
            previous: 8,
            code: 0,
            instr: 56,
            owner: 70,
            is_entry: None,
        },
        _ => return None,
    };
    Some(l)
}

/// Where the innermost frame hangs off a thread state.
#[derive(Debug, Clone, Copy)]
enum Current {
    /// A field of the thread state at this offset (3.9/3.10 `frame`, 3.13 `current_frame`).
    Field(usize),
    /// `tstate->cframe` at the first offset, its `current_frame` at the second (3.11, 3.12).
    CFrame(usize, usize),
}

/// What the GIL-less walk reads (x86-64 and aarch64, from each version's headers).
#[derive(Debug, Clone, Copy)]
struct Detached {
    current: Current,
    /// `offsetof(PyCodeObject, co_filename)`; `co_name` is the next pointer.
    co_filename: usize,
    /// `sizeof(PyASCIIObject)`, `sizeof(PyCompactUnicodeObject)`: where a compact ASCII
    /// string's and a compact non-ASCII string's characters start.
    str_ascii: usize,
    str_compact: usize,
    /// 3.9/3.10 frame objects: `f_back`, `f_code`, `f_lasti`, and the bytes per `f_lasti`
    /// unit (3.9 counts bytes, 3.10 code units).
    old: Option<(usize, usize, usize, i64)>,
}

fn detached(minor: u32) -> Option<Detached> {
    let d = match minor {
        9 | 10 => Detached {
            current: Current::Field(24),
            co_filename: 104,
            str_ascii: 48,
            str_compact: 72,
            old: Some((24, 32, if minor == 9 { 104 } else { 96 }, minor as i64 - 8)),
        },
        11 | 12 => Detached {
            current: Current::CFrame(56, if minor == 11 { 8 } else { 0 }),
            co_filename: 112,
            str_ascii: if minor == 11 { 48 } else { 40 },
            str_compact: if minor == 11 { 72 } else { 56 },
            old: None,
        },
        13 => Detached {
            current: Current::Field(72),
            co_filename: 112,
            str_ascii: 40,
            str_compact: 56,
            old: None,
        },
        _ => return None,
    };
    Some(d)
}

struct Api {
    minor: u32,
    is_initialized: unsafe extern "C" fn() -> c_int,
    gil_check: unsafe extern "C" fn() -> c_int,
    this_tstate: unsafe extern "C" fn() -> Obj,
    current: Option<unsafe extern "C" fn() -> Obj>,
    get_frame: unsafe extern "C" fn(Obj) -> Obj,
    frame_back: unsafe extern "C" fn(Obj) -> Obj,
    frame_code: unsafe extern "C" fn(Obj) -> Obj,
    frame_line: unsafe extern "C" fn(Obj) -> c_int,
    incref: unsafe extern "C" fn(Obj),
    decref: unsafe extern "C" fn(Obj),
    getattr: unsafe extern "C" fn(Obj, *const c_char) -> Obj,
    as_utf8: unsafe extern "C" fn(Obj) -> *const c_char,
    addr2line: unsafe extern "C" fn(Obj, c_int) -> c_int,
    err_fetch: unsafe extern "C" fn(*mut Obj, *mut Obj, *mut Obj),
    err_restore: unsafe extern "C" fn(Obj, Obj, Obj),
    code_type: usize,
    frame_type: usize,
    unicode_type: usize,
    /// `_PyEval_EvalFrameDefault`'s extent.
    eval: (usize, usize),
    layout: Option<Layout>,
    detached: Option<Detached>,
}

// SAFETY: function pointers and plain numbers, read-only after detection.
unsafe impl Sync for Api {}
// SAFETY: as above.
unsafe impl Send for Api {}

fn sym(name: &CStr) -> Option<usize> {
    // SAFETY: dlsym with a pseudo-handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p as usize)
}

/// `sym` as a function pointer of type `T`.
macro_rules! func {
    ($name:literal) => {{
        // SAFETY: the symbol is CPython's function of that name, whose C type is the
        // field's type (Python's documented C API).
        sym($name).map(|a| unsafe { std::mem::transmute::<usize, _>(a) })
    }};
}

/// glibc's `RTLD_DL_SYMENT` (`<dlfcn.h>`).
const RTLD_DL_SYMENT: c_int = 1;

/// The extent of the function starting at `addr` (its ELF symbol's size).
fn extent(addr: usize) -> Option<(usize, usize)> {
    // SAFETY: Dl_info is plain C data for which all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut extra: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-parameters; RTLD_DL_SYMENT stores a pointer to the ELF symbol.
    let ok = unsafe { libc::dladdr1(addr as *const c_void, &mut info, &mut extra, RTLD_DL_SYMENT) };
    if ok == 0 || extra.is_null() {
        return None;
    }
    // SAFETY: with RTLD_DL_SYMENT, `extra` points at the symbol's Elf64_Sym.
    let size = unsafe { (*(extra as *const libc::Elf64_Sym)).st_size } as usize;
    (size > 0).then_some((addr, addr + size))
}

fn say_once(msg: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("cushim: {msg}; Python frames are not recorded (native only)"));
}

fn detect() -> Option<Api> {
    let is_initialized = func!(c"Py_IsInitialized")?;
    let version: unsafe extern "C" fn() -> *const c_char = func!(c"Py_GetVersion")?;
    // SAFETY: Py_GetVersion returns a static NUL-terminated string; it needs no GIL.
    let v = unsafe { CStr::from_ptr(version()) }
        .to_string_lossy()
        .into_owned();
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    if major != 3 || !(9..=13).contains(&minor) {
        say_once(&format!(
            "Python {major}.{minor} is not supported (3.9 to 3.13 are)"
        ));
        return None;
    }
    if sym(c"_Py_MergeZeroLocalRefcount").is_some() {
        say_once(&format!("Python {major}.{minor} is a free-threaded build"));
        return None;
    }
    if sym(c"_Py_PrintReferences").is_some() {
        say_once(&format!("Python {major}.{minor} is a Py_TRACE_REFS build"));
        return None;
    }
    let eval = sym(c"_PyEval_EvalFrameDefault").and_then(extent);
    let api = Api {
        minor,
        is_initialized,
        gil_check: func!(c"PyGILState_Check")?,
        this_tstate: func!(c"PyGILState_GetThisThreadState")?,
        current: func!(c"PyThreadState_GetUnchecked").or(func!(c"_PyThreadState_UncheckedGet")),
        get_frame: func!(c"PyThreadState_GetFrame")?,
        frame_back: func!(c"PyFrame_GetBack")?,
        frame_code: func!(c"PyFrame_GetCode")?,
        frame_line: func!(c"PyFrame_GetLineNumber")?,
        incref: func!(c"Py_IncRef")?,
        decref: func!(c"Py_DecRef")?,
        getattr: func!(c"PyObject_GetAttrString")?,
        as_utf8: func!(c"PyUnicode_AsUTF8")?,
        addr2line: func!(c"PyCode_Addr2Line")?,
        err_fetch: func!(c"PyErr_Fetch")?,
        err_restore: func!(c"PyErr_Restore")?,
        code_type: sym(c"PyCode_Type")?,
        frame_type: sym(c"PyFrame_Type")?,
        unicode_type: sym(c"PyUnicode_Type")?,
        eval: eval.unwrap_or((0, 0)),
        layout: layout(minor),
        detached: detached(minor),
    };
    if eval.is_none() {
        say_once("_PyEval_EvalFrameDefault's extent is unknown");
        return None;
    }
    Some(api)
}

fn api() -> Option<&'static Api> {
    static API: OnceCell<Option<Api>> = OnceCell::new();
    API.get_or_init(detect).as_ref()
}

/// One interned Python frame.
#[derive(Debug, Clone)]
struct Info {
    name: String,
    filename: String,
    line: u64,
    /// `None`: the code object is kept alive (seen with the GIL). Otherwise the code's
    /// `co_filename` and `co_name` objects when it was seen: the entry stands for the code
    /// object at that address only while it still has them.
    unpinned: Option<(usize, usize)>,
}

/// Hasher of (code address, offset) keys: one folded multiply per word (the keys are
/// addresses and small offsets, not input an attacker chooses; SipHash was the larger part
/// of a frame's lookup).
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n) * 0x9E37_79B9_7F4A_7C15u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_i64(&mut self, n: i64) {
        self.write_u64(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type KeyBuild = std::hash::BuildHasherDefault<KeyHasher>;

#[derive(Default)]
struct Table {
    ids: HashMap<(usize, i64), u32, KeyBuild>,
    frames: Vec<Info>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Offsets of 3.9/3.10 frames are their lines, marked with this bit.
const LINE: i64 = 1 << 40;

/// A frame as read: code object, offset (or `LINE | line`), entry of its evaluation loop.
#[derive(Clone, Copy, Default)]
struct Raw {
    code: usize,
    off: i64,
    entry: bool,
}

/// The calling thread's own thread state, and whether it holds the GIL with it; `None`
/// when the interpreter is not running or the thread has no Python state to read.
fn thread_state(a: &Api) -> Option<(Obj, bool)> {
    // SAFETY: these need no GIL: a flag, and the thread's own thread-local states.
    unsafe {
        if (a.is_initialized)() == 0 {
            return None;
        }
        let mine = (a.this_tstate)();
        if mine.is_null() {
            return None;
        }
        let cur = a.current.map(|f| f());
        if cur.map_or(true, |c| c == mine) && (a.gil_check)() == 1 {
            return Some((mine, true));
        }
        // 3.12+ keep the attached state per thread: another one attached here is a
        // sub-interpreter's, whose frames are not `mine`'s.
        if a.minor >= 12 && cur.is_some_and(|c| !c.is_null()) {
            return None;
        }
        a.detached.is_some().then_some((mine, false))
    }
}

/// Read the thread's Python frames, innermost first, into `out` (GIL held: checked).
fn read_frames(a: &Api, tstate: Obj, out: &mut [Raw]) -> usize {
    // SAFETY: the thread holds the GIL (`thread_state`), so its frames are alive and
    // unchanging during the walk; every new reference taken is released.
    unsafe {
        let f = (a.get_frame)(tstate);
        if f.is_null() {
            return 0;
        }
        let Some(l) = a.layout else {
            // 3.9 / 3.10: frame objects, one per evaluation loop.
            let (mut f, mut n) = (f, 0);
            while !f.is_null() && n < out.len() {
                let code = (a.frame_code)(f);
                out[n] = Raw {
                    code: code as usize,
                    off: LINE | i64::from((a.frame_line)(f).max(0)),
                    entry: true,
                };
                (a.decref)(code);
                n += 1;
                let back = (a.frame_back)(f);
                (a.decref)(f);
                f = back;
            }
            if !f.is_null() {
                (a.decref)(f);
            }
            return n;
        };
        // 3.11+: the interpreter frames, from the innermost one. The frame object stays
        // alive after our reference goes (its interpreter frame owns it). An object header
        // of another size (a Py_TRACE_REFS build) puts the type elsewhere: nothing is read.
        if *((f as usize + 8) as *const usize) != a.frame_type {
            (a.decref)(f);
            say_once("this Python's object header is not the standard one");
            return 0;
        }
        let fr = *((f as usize + l.f_frame) as *const usize);
        (a.decref)(f);
        walk(a, &l, &Plain, fr, out)
    }
}

/// The fields of one 3.11+ interpreter frame the walk uses.
struct Rec {
    prev: usize,
    code: usize,
    instr: usize,
    owner: u8,
    is_entry: bool,
}

/// Bytes of an interpreter frame that hold every field read (3.11: `owner` at 69; 3.12+:
/// the instruction pointer at 56 and `owner` at 70).
const REC_BYTES: usize = 72;

fn rec(l: &Layout, m: &impl Mem, fr: usize) -> Option<Rec> {
    let mut b = [0u8; REC_BYTES];
    if !m.read(fr, &mut b) {
        return None;
    }
    let w = |o: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[o..o + 8]);
        usize::from_ne_bytes(x)
    };
    Some(Rec {
        prev: w(l.previous),
        code: w(l.code),
        instr: w(l.instr),
        owner: b[l.owner],
        is_entry: l.is_entry.is_some_and(|o| b[o] != 0),
    })
}

/// Whether `obj` is an object of type `ty` (its header read through `m`).
fn is_a(m: &impl Mem, obj: usize, ty: usize) -> bool {
    obj != 0 && m.word(obj + 8) == Some(ty)
}

/// Walk 3.11+ interpreter frames from `fr`, innermost first, reading through `m`.
fn walk(a: &Api, l: &Layout, m: &impl Mem, fr: usize, out: &mut [Raw]) -> usize {
    let mut n = 0;
    let mut cur = if fr == 0 { None } else { rec(l, m, fr) };
    // Bounded: a chain read from freed memory could loop.
    let mut steps = 0;
    while let Some(r) = cur {
        if n >= out.len() || steps > 4 * MAX_PY {
            break;
        }
        steps += 1;
        let prev = if r.prev == 0 { None } else { rec(l, m, r.prev) };
        if (a.minor >= 12 && r.owner == OWNED_BY_CSTACK) || !is_a(m, r.code, a.code_type) {
            cur = prev;
            continue;
        }
        let off = r.instr as i64 - (r.code + l.code_adaptive) as i64;
        let entry = match l.is_entry {
            Some(_) => r.is_entry,
            None => prev.as_ref().map_or(true, |p| p.owner == OWNED_BY_CSTACK),
        };
        if off >= 0 {
            out[n] = Raw {
                code: r.code,
                off,
                entry,
            };
            n += 1;
        } else if entry && n > 0 {
            // A frame not started yet ends its loop's group all the same.
            out[n - 1].entry = true;
        }
        cur = prev;
    }
    n
}

/// Read the Python frames of a thread running native code without the GIL, innermost
/// first, into `out`: every read checked (see the head of this file).
fn read_frames_detached(a: &Api, m: &Cached, tstate: Obj, out: &mut [Raw]) -> usize {
    let Some(d) = a.detached else {
        return 0;
    };
    let ts = tstate as usize;
    let first = match d.current {
        Current::Field(o) => m.word(ts + o),
        Current::CFrame(c, o) => m.word(ts + c).and_then(|cf| m.word(cf + o)),
    };
    let Some(first) = first else {
        return 0;
    };
    if let Some(l) = a.layout {
        return walk(a, &l, m, first, out);
    }
    // 3.9 / 3.10: frame objects linked by `f_back`.
    let Some((back, code_at, lasti_at, unit)) = d.old else {
        return 0;
    };
    let (mut f, mut n) = (first, 0);
    while f != 0 && n < out.len() {
        let mut b = [0u8; 112];
        if !is_a(m, f, a.frame_type) || !m.read(f, &mut b) {
            break;
        }
        let w = |o: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[o..o + 8]);
            usize::from_ne_bytes(x)
        };
        let code = w(code_at);
        if !is_a(m, code, a.code_type) {
            break;
        }
        let mut li = [0u8; 4];
        li.copy_from_slice(&b[lasti_at..lasti_at + 4]);
        let lasti = i64::from(i32::from_ne_bytes(li)) * unit;
        let addrq = lasti.clamp(-1, i64::from(c_int::MAX)) as c_int;
        // SAFETY: `code` is a code object (its type checked), held by its running frame;
        // `PyCode_Addr2Line` only reads its immutable line table.
        let line = unsafe { (a.addr2line)(code as Obj, addrq) }.max(0);
        out[n] = Raw {
            code,
            off: LINE | i64::from(line),
            entry: true,
        };
        n += 1;
        f = w(back);
    }
    n
}

/// Name, file and line of a frame seen for the first time (GIL held: checked by caller).
fn describe(a: &Api, r: Raw) -> Info {
    // SAFETY: GIL held; `code` is a live code object (on the thread's stack); the caller's
    // pending exception is saved first and restored after, whatever our calls raise.
    unsafe {
        let (mut t, mut v, mut tb): (Obj, Obj, Obj) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        (a.err_fetch)(&mut t, &mut v, &mut tb);
        let code = r.code as Obj;
        let text = |attr: &CStr| -> String {
            let o = (a.getattr)(code, attr.as_ptr());
            if o.is_null() {
                return "?".into();
            }
            let p = (a.as_utf8)(o);
            let s = if p.is_null() {
                "?".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            };
            (a.decref)(o);
            s
        };
        let name = text(c"co_name");
        let filename = text(c"co_filename");
        let line = if r.off & LINE != 0 {
            (r.off & !LINE) as u64
        } else {
            (a.addr2line)(code, r.off.min(i64::from(c_int::MAX)) as c_int).max(0) as u64
        };
        // Kept alive for good: its address is its identity in the table.
        (a.incref)(code);
        // Clear whatever our calls raised, then give the caller back its own state.
        let (mut t2, mut v2, mut tb2): (Obj, Obj, Obj) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        (a.err_fetch)(&mut t2, &mut v2, &mut tb2);
        for o in [t2, v2, tb2] {
            if !o.is_null() {
                (a.decref)(o);
            }
        }
        (a.err_restore)(t, v, tb);
        Info {
            name,
            filename,
            line,
            unpinned: None,
        }
    }
}

/// The code object's `co_filename` and `co_name` objects, read through `m`.
fn names_of(d: &Detached, m: &impl Mem, code: usize) -> Option<(usize, usize)> {
    let mut b = [0u8; 16];
    if !m.read(code + d.co_filename, &mut b) {
        return None;
    }
    let (mut f, mut n) = ([0u8; 8], [0u8; 8]);
    f.copy_from_slice(&b[..8]);
    n.copy_from_slice(&b[8..]);
    Some((usize::from_ne_bytes(f), usize::from_ne_bytes(n)))
}

/// Longest string taken from a code object without the GIL, in characters.
const MAX_CHARS: usize = 4096;

/// The text of a compact string object, read through `m` (no GIL: no call into Python).
fn text_of(a: &Api, d: &Detached, m: &impl Mem, s: usize) -> Option<String> {
    // refcount, type, length, hash, state.
    let mut h = [0u8; 36];
    if !is_a(m, s, a.unicode_type) || !m.read(s, &mut h) {
        return None;
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[16..24]);
    let len = (isize::from_ne_bytes(len).max(0) as usize).min(MAX_CHARS);
    let mut st = [0u8; 4];
    st.copy_from_slice(&h[32..36]);
    let state = u32::from_ne_bytes(st);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || !(1..=4).contains(&kind) || kind == 3 {
        return None;
    }
    let at = s + if ascii == 1 {
        d.str_ascii
    } else {
        d.str_compact
    };
    let mut data = vec![0u8; len * kind as usize];
    if !m.read(at, &mut data) {
        return None;
    }
    let chars: String = match kind {
        1 => data.iter().map(|&b| char::from(b)).collect(),
        2 => data
            .chunks_exact(2)
            .map(|c| char::from_u32(u32::from(u16::from_ne_bytes([c[0], c[1]]))).unwrap_or('?'))
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    };
    Some(chars)
}

/// Name, file and line of a frame seen for the first time without the GIL: read, not
/// asked (see the head of this file); the entry is not pinned.
fn describe_detached(a: &Api, m: &Cached, r: Raw) -> Info {
    let names = a
        .detached
        .and_then(|d| names_of(&d, m, r.code).map(|n| (d, n)));
    let (name, filename) = match names {
        Some((d, (f, n))) => (text_of(a, &d, m, n), text_of(a, &d, m, f)),
        None => (None, None),
    };
    let line = if r.off & LINE != 0 {
        (r.off & !LINE) as u64
    } else {
        // SAFETY: `code` is a code object (its type checked through checked reads), held
        // by its running frame; `PyCode_Addr2Line` only reads its immutable line table.
        let l = unsafe { (a.addr2line)(r.code as Obj, r.off.min(i64::from(c_int::MAX)) as c_int) };
        l.max(0) as u64
    };
    Info {
        name: name.unwrap_or_else(|| "?".into()),
        filename: filename.unwrap_or_else(|| "?".into()),
        line,
        // No string object lies at `usize::MAX`: names that could not be read.
        unpinned: Some(names.map_or((usize::MAX, usize::MAX), |(_, n)| n)),
    }
}

/// Intern `raw` frames; writes `PY_TAG | id` and the entry flag of each into `out`.
/// `held`: the GIL is held (new frames are described through the C API and pinned);
/// otherwise memory is read through `m`.
fn intern(a: &Api, held: bool, m: &Cached, raw: &[Raw], out: &mut [(u64, bool)]) {
    // Whether an unpinned entry still stands for the code object now at its address.
    let same = |r: &Raw, fp: (usize, usize)| {
        let d = a.detached;
        let now = if held {
            d.and_then(|d| names_of(&d, &Plain, r.code))
        } else {
            d.and_then(|d| names_of(&d, m, r.code))
        };
        // Names that could not be read stand as `usize::MAX` twice, as when described: such
        // an entry is reused, not made again at every capture.
        now.unwrap_or((usize::MAX, usize::MAX)) == fp
    };
    let mut missing = false;
    {
        let mut t = TABLE.lock();
        let t = t.get_or_insert_with(Table::default);
        for (i, r) in raw.iter().enumerate() {
            out[i] = (0, r.entry);
            let Some(&id) = t.ids.get(&(r.code, r.off)) else {
                missing = true;
                continue;
            };
            match t.frames[id as usize].unpinned {
                None => out[i].0 = PY_TAG | u64::from(id),
                Some(fp) if same(r, fp) => {
                    if held {
                        // SAFETY: GIL held; the code object is alive (its frame runs).
                        unsafe { (a.incref)(r.code as Obj) };
                        t.frames[id as usize].unpinned = None;
                    }
                    out[i].0 = PY_TAG | u64::from(id);
                }
                Some(_) => missing = true,
            }
        }
    }
    if !missing {
        return;
    }
    // Outside the lock: describing calls into Python, which may re-enter the shim.
    for (i, r) in raw.iter().enumerate() {
        if out[i].0 != 0 {
            continue;
        }
        let key = (r.code, r.off);
        let info = if held {
            describe(a, *r)
        } else {
            describe_detached(a, m, *r)
        };
        let mut t = TABLE.lock();
        let t = t.get_or_insert_with(Table::default);
        // Described meanwhile by a re-entered capture: keep that entry when it is pinned
        // (this description's reference, if any, keeps the same object alive twice).
        let id = match t.ids.get(&key) {
            Some(&id) if t.frames[id as usize].unpinned.is_none() => id,
            _ => {
                let id = t.frames.len() as u32;
                t.frames.push(info);
                t.ids.insert(key, id);
                id
            }
        };
        out[i] = (PY_TAG | u64::from(id), r.entry);
    }
}

/// The calling thread's Python frames (tagged ids, entry flags), innermost first, read
/// through `raw`; 0 when there are none to take (no interpreter, no thread state,
/// unsupported build).
fn capture_python(raw: &mut [Raw], out: &mut [(u64, bool)], blocks: &mut Blocks) -> usize {
    let Some(a) = api() else {
        return 0;
    };
    let Some((tstate, held)) = thread_state(a) else {
        return 0;
    };
    let len = out.len().min(raw.len());
    // One walk's copies of the memory it reads without the GIL (not used with it).
    let m = Cached::new(blocks);
    let n = if held {
        read_frames(a, tstate, &mut raw[..len])
    } else {
        read_frames_detached(a, &m, tstate, &mut raw[..len])
    };
    intern(a, held, &m, &raw[..n], &mut out[..n]);
    n
}

/// A thread's buffers for one capture, kept between captures so a capture clears no
/// stack arrays (about 18 KiB zeroed per capture was a fixed cost of `stacks=all`).
struct Scratch {
    raw: Vec<Raw>,
    py: Vec<(u64, bool)>,
    out: Vec<u64>,
    /// Made at the thread's first capture (64 KiB): GIL-less walks read through it.
    blocks: Option<Blocks>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            raw: Vec::new(),
            py: Vec::new(),
            out: Vec::new(),
            blocks: None,
        })
    };
}

/// Whether return address `ip` lies in the interpreter's evaluation loop.
fn is_eval(a: &Api, ip: u64) -> bool {
    let at = (ip as usize).wrapping_sub(1);
    a.eval.0 <= at && at < a.eval.1
}

/// Merge Python frames (`py`, innermost first, with entry flags) into native frames: each
/// evaluation loop's group just inside its native frame; leftovers at the outer end.
/// Without `keep_native`, only the Python frames. Returns the number written to `out`.
pub fn merge(
    native: &[u64],
    py: &[(u64, bool)],
    keep_native: bool,
    is_eval: impl Fn(u64) -> bool,
    out: &mut [u64],
) -> usize {
    let mut n = 0;
    let mut push = |v: u64, n: &mut usize| {
        if *n < out.len() {
            out[*n] = v;
            *n += 1;
        }
    };
    let mut p = 0;
    for &ip in native {
        if is_eval(ip) && p < py.len() {
            while p < py.len() {
                let (id, entry) = py[p];
                push(id, &mut n);
                p += 1;
                if entry {
                    break;
                }
            }
        }
        if keep_native {
            push(ip, &mut n);
        }
    }
    for &(id, _) in &py[p..] {
        push(id, &mut n);
    }
    n
}

/// Capture the calling thread's stack as `conf` asks (native, Python, or both merged) and
/// intern it. Python is looked at only with `python_stacks`.
#[inline(never)]
pub fn capture_id(conf: &HistoryConf, skip: &SkipRange) -> StackId {
    let max = conf.max_frames.clamp(1, CAPTURE_MAX);
    if !conf.python_stacks {
        return crate::trace::stack::capture_id(max, conf.unwinder, skip);
    }
    with_frame_buf(max, |native| capture_merged(conf, skip, max, native))
}

/// [`capture_id`] with Python frames, the native ones captured into `native`.
#[inline(always)]
fn capture_merged(conf: &HistoryConf, skip: &SkipRange, max: usize, native: &mut [u64]) -> StackId {
    let n = capture(&mut native[..max], conf.unwinder, skip);
    // The thread's scratch; taken already (a capture re-entered from Python code run while
    // describing a new frame) or gone (thread exit): native frames only.
    let merged = SCRATCH
        .try_with(|cell| {
            let mut guard = cell.try_borrow_mut().ok()?;
            let s = &mut *guard;
            s.raw.resize(MAX_PY, Raw::default());
            s.py.resize(MAX_PY, (0, false));
            s.out.resize(CAPTURE_MAX, 0);
            let blocks = s.blocks.get_or_insert_with(Blocks::default);
            let m = capture_python(&mut s.raw, &mut s.py[..max.min(MAX_PY)], blocks);
            if m == 0 {
                return None;
            }
            let a = api()?;
            let k = merge(
                &native[..n],
                &s.py[..m],
                conf.native_frames,
                |ip| is_eval(a, ip),
                &mut s.out[..max],
            );
            Some(intern_tagged(&mut s.out, k))
        })
        .ok()
        .flatten();
    match merged {
        Some(id) => id,
        None if conf.native_frames => intern_tagged(native, n),
        None => NO_STACK,
    }
}

/// `(name, filename, line)` of a tagged Python frame id, for the symbolizer.
pub fn frame(tagged: u64) -> Option<(String, String, u64)> {
    if tagged & PY_MASK != PY_TAG {
        return None;
    }
    let id = (tagged & !PY_MASK) as usize;
    let t = TABLE.lock();
    let f = t.as_ref()?.frames.get(id)?;
    Some((f.name.clone(), f.filename.clone(), f.line))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVAL: u64 = 0x1000;

    fn is_eval(ip: u64) -> bool {
        ip == EVAL + 1
    }

    #[test]
    fn each_evaluation_loop_gets_its_group_just_inside_it() {
        let e = EVAL + 1;
        let native = [10, 11, e, 12, e, 13];
        let (a, b, c) = (PY_TAG | 1, PY_TAG | 2, PY_TAG | 3);
        // a and b run in the inner loop (b is its entry), c in the outer.
        let py = [(a, false), (b, true), (c, true)];
        let mut out = [0u64; 16];
        let n = merge(&native, &py, true, is_eval, &mut out);
        assert_eq!(&out[..n], &[10, 11, a, b, e, 12, c, e, 13]);
        let n = merge(&native, &py, false, is_eval, &mut out);
        assert_eq!(&out[..n], &[a, b, c]);
    }

    #[test]
    fn python_frames_beyond_the_native_stack_go_at_the_outer_end() {
        let e = EVAL + 1;
        let (a, b) = (PY_TAG | 1, PY_TAG | 2);
        let mut out = [0u64; 16];
        let n = merge(&[10, e], &[(a, true), (b, true)], true, is_eval, &mut out);
        assert_eq!(&out[..n], &[10, a, e, b]);
        let n = merge(&[10, 11], &[(a, true)], true, is_eval, &mut out);
        assert_eq!(&out[..n], &[10, 11, a]);
        let mut small = [0u64; 2];
        assert_eq!(
            merge(&[10, e, 12], &[(a, true)], true, is_eval, &mut small),
            2
        );
    }

    #[test]
    fn untagged_addresses_and_epoch_words_are_not_python_frames() {
        assert!(frame(0x7fff_0000).is_none());
        assert!(frame(crate::trace::module_epochs::UNKNOWN_IP).is_none());
        assert!(frame(0xffff_fffe_0000_0001).is_none());
        assert!(!crate::trace::module_epochs::is_tag(PY_TAG | 7));
    }
}
