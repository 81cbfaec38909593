//! Python frames in allocation stacks (CPython 3.9 to 3.13), merged into the native stack
//! where the interpreter's evaluation loops stand (`stacks=all`), or alone (`stacks=python`).
//!
//! Policy, and why:
//! - Only when the allocating thread holds the GIL: the interpreter is initialized
//!   (`Py_IsInitialized`, so nothing happens during start-up or once finalization began),
//!   the thread has a thread state, it is the thread state currently attached, and
//!   `PyGILState_Check` agrees. Otherwise nothing of Python is touched (a thread that
//!   released the GIL, such as a `ctypes.CDLL` call, gets native frames only).
//! - With the GIL held, the frames are read as CPython keeps them: 3.9 and 3.10 through the
//!   frame API; 3.11+ by walking the interpreter frames from the innermost frame object,
//!   at the offsets of each version's `pycore_frame.h` (checked against the headers of
//!   3.11.7, 3.12.1 and 3.13.0), so no frame object is created for the outer frames. A frame
//!   is a code object and an instruction offset (3.9/3.10: its line), interned in one table.
//! - The first time a (code, offset) pair is seen, its name, file and line are taken through
//!   the C API (under the GIL, the caller's pending exception saved and restored) and the
//!   code object is kept alive for the life of the process (so its address is never reused
//!   for another code object); every later capture of it is one table lookup. Strings are
//!   taken then, not at dump time, because a dump may run on a thread without the GIL or
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
//! as `module_epochs`' words are, and distinct from them; never a return address)
//! address) and resolved by [`frame`]; nothing here runs unless `python_stacks` is on.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::config::history::HistoryConf;
use crate::trace::event::{StackId, NO_STACK};
use crate::trace::stack::intern_tagged;
use crate::trace::stack::{capture, SkipRange, CAPTURE_MAX};

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
    /// `_PyEval_EvalFrameDefault`'s extent.
    eval: (usize, usize),
    layout: Option<Layout>,
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
        eval: eval.unwrap_or((0, 0)),
        layout: layout(minor),
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

/// Whether the calling thread holds the GIL of an initialized interpreter: its thread state.
fn attached(a: &Api) -> Option<Obj> {
    // SAFETY: these three need no GIL: a flag, and the thread's own thread-local states.
    unsafe {
        if (a.is_initialized)() == 0 {
            return None;
        }
        let mine = (a.this_tstate)();
        if mine.is_null() {
            return None;
        }
        if let Some(cur) = a.current {
            if cur() != mine {
                return None;
            }
        }
        ((a.gil_check)() == 1).then_some(mine)
    }
}

/// Read the thread's Python frames, innermost first, into `out` (GIL held: checked).
fn read_frames(a: &Api, tstate: Obj, out: &mut [Raw]) -> usize {
    // SAFETY: the thread holds the GIL (`attached`), so its frames are alive and unchanging
    // during the walk; every new reference taken is released.
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
        let mut fr = *((f as usize + l.f_frame) as *const usize);
        (a.decref)(f);
        let mut n = 0;
        while fr != 0 && n < out.len() {
            let prev = *((fr + l.previous) as *const usize);
            let owner = *((fr + l.owner) as *const u8);
            let code = *((fr + l.code) as *const usize);
            let is_code = code != 0 && *((code + 8) as *const usize) == a.code_type;
            if (a.minor >= 12 && owner == OWNED_BY_CSTACK) || !is_code {
                fr = prev;
                continue;
            }
            let instr = *((fr + l.instr) as *const usize) as i64;
            let off = instr - (code + l.code_adaptive) as i64;
            let entry = match l.is_entry {
                Some(o) => *((fr + o) as *const u8) != 0,
                None => prev == 0 || *((prev + l.owner) as *const u8) == OWNED_BY_CSTACK,
            };
            if off >= 0 {
                out[n] = Raw { code, off, entry };
                n += 1;
            } else if entry && n > 0 {
                // A frame not started yet ends its loop's group all the same.
                out[n - 1].entry = true;
            }
            fr = prev;
        }
        n
    }
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
        }
    }
}

/// Intern `raw` frames; writes `PY_TAG | id` and the entry flag of each into `out`.
fn intern(a: &Api, raw: &[Raw], out: &mut [(u64, bool)]) {
    let mut missing = false;
    {
        let mut t = TABLE.lock();
        let t = t.get_or_insert_with(Table::default);
        for (i, r) in raw.iter().enumerate() {
            match t.ids.get(&(r.code, r.off)) {
                Some(&id) => out[i] = (PY_TAG | u64::from(id), r.entry),
                None => {
                    out[i] = (0, r.entry);
                    missing = true;
                }
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
        let known = TABLE.lock().as_ref().and_then(|t| t.ids.get(&key).copied());
        let id = match known {
            Some(id) => id,
            None => {
                let info = describe(a, *r);
                let mut t = TABLE.lock();
                let t = t.get_or_insert_with(Table::default);
                match t.ids.get(&key) {
                    Some(&id) => id,
                    None => {
                        let id = t.frames.len() as u32;
                        t.frames.push(info);
                        t.ids.insert(key, id);
                        id
                    }
                }
            }
        };
        out[i] = (PY_TAG | u64::from(id), r.entry);
    }
}

/// The calling thread's Python frames (tagged ids, entry flags), innermost first, read
/// through `raw`; 0 when there are none to take (no interpreter, GIL not held, unsupported).
fn capture_python(raw: &mut [Raw], out: &mut [(u64, bool)]) -> usize {
    let Some(a) = api() else {
        return 0;
    };
    let Some(tstate) = attached(a) else {
        return 0;
    };
    let len = out.len().min(raw.len());
    let n = read_frames(a, tstate, &mut raw[..len]);
    intern(a, &raw[..n], &mut out[..n]);
    n
}

/// A thread's buffers for one capture, kept between captures so a capture clears no
/// stack arrays (about 18 KiB zeroed per capture was a fixed cost of `stacks=all`).
struct Scratch {
    raw: Vec<Raw>,
    py: Vec<(u64, bool)>,
    out: Vec<u64>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch {
            raw: Vec::new(),
            py: Vec::new(),
            out: Vec::new(),
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
    let mut native = [0u64; CAPTURE_MAX];
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
            let m = capture_python(&mut s.raw, &mut s.py[..max.min(MAX_PY)]);
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
        None if conf.native_frames => intern_tagged(&mut native, n),
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
