//! libcushim.so as an NVTX v3 injection library: the program's NVTX ranges become the range
//! path every recorded event carries (`cushim::trace::range`).
//!
//! Protocol (NVIDIA's `nvtxDetail/nvtxInit.h`): on a program's first NVTX call, NVTX loads the
//! library named by `NVTX_INJECTION64_PATH` (which `cushim run` sets to this library) and
//! calls its `InitializeInjectionNvtx2` with NVTX's `nvtxGetExportTable`. (We also export
//! `InitializeInjectionNvtx2Preinject`, which NVTX builds that enable discovery of an already
//! loaded injection look up; NVIDIA's current headers leave that off on Linux, so plain
//! `LD_PRELOAD` without `NVTX_INJECTION64_PATH` records no ranges.) We fill the
//! CORE and CORE2 modules' function slots with the range calls: push/pop, start/end, their
//! domain forms, domain creation, registered strings, and thread and category names (ASCII
//! and wide; what names change in a path: `trace::range`).
//!
//! Policy (forwarding): when `CUSHIM_NVTX_FORWARD` names another injection library (the
//! `NVTX_INJECTION64_PATH` the user had set, e.g. Nsight Systems; `cushim run` moves it
//! there), it is loaded and initialised first against a table of our own, so it fills our
//! "downstream" slots; every call we implement is then also passed to it (handles and range
//! ids it returns are the ones the program sees), and every slot we do not implement gets
//! its function directly, so it receives every NVTX call. If it fails to load, ranges are
//! still recorded here and one line says why.
//!
//! Policy (fail open): every callback runs inside `catch_unwind`; on a panic it returns what
//! NVTX's own no-op would (`-1`, `0`, null), never unwinding into the program.

use cushim::trace::range::{self, NameId, DEFAULT_DOMAIN};

use crate::life::nvtx_handles::HANDLES;
use crate::life::shim::annotation_device;
use std::borrow::Cow;
use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

type FnPtr = *const c_void;
type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type GetModuleFunctionTable =
    unsafe extern "C" fn(c_int, *mut *mut *mut FnPtr, *mut c_uint) -> c_int;

const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;
const NVTX_VERSION: u32 = 3;

// CORE callback ids.
const RANGE_START_EX: usize = 4;
const RANGE_START_A: usize = 5;
const RANGE_START_W: usize = 6;
const RANGE_END: usize = 7;
const RANGE_PUSH_EX: usize = 8;
const RANGE_PUSH_A: usize = 9;
const RANGE_PUSH_W: usize = 10;
const RANGE_POP: usize = 11;
const NAME_CATEGORY_A: usize = 12;
const NAME_CATEGORY_W: usize = 13;
const NAME_OS_THREAD_A: usize = 14;
const NAME_OS_THREAD_W: usize = 15;
const CORE_SIZE: usize = 16;
// CORE2 callback ids.
const DOMAIN_RANGE_START_EX: usize = 2;
const DOMAIN_RANGE_END: usize = 3;
const DOMAIN_RANGE_PUSH_EX: usize = 4;
const DOMAIN_RANGE_POP: usize = 5;
const DOMAIN_NAME_CATEGORY_A: usize = 8;
const DOMAIN_NAME_CATEGORY_W: usize = 9;
const DOMAIN_REGISTER_STRING_A: usize = 10;
const DOMAIN_REGISTER_STRING_W: usize = 11;
const DOMAIN_CREATE_A: usize = 12;
const DOMAIN_CREATE_W: usize = 13;
const CORE2_SIZE: usize = 16;

#[repr(C)]
struct Callbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

#[repr(C)]
struct VersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: Option<unsafe extern "C" fn(u32)>,
}

/// `nvtxEventAttributes_t` (v2/v3), as far as we read it.
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;

/// The downstream injection's function slots, which it fills through our export table.
struct Slots {
    core: [UnsafeCell<FnPtr>; CORE_SIZE + 1],
    core2: [UnsafeCell<FnPtr>; CORE2_SIZE + 1],
    core_table: UnsafeCell<[*mut FnPtr; CORE_SIZE + 1]>,
    core2_table: UnsafeCell<[*mut FnPtr; CORE2_SIZE + 1]>,
}

// SAFETY: the slots are written only during `InitializeInjectionNvtx2`, which NVTX calls once
// under its own initialisation lock before any callback of ours can run; afterwards they are
// only read.
unsafe impl Sync for Slots {}

static DOWN: Slots = Slots {
    core: [const { UnsafeCell::new(std::ptr::null()) }; CORE_SIZE + 1],
    core2: [const { UnsafeCell::new(std::ptr::null()) }; CORE2_SIZE + 1],
    core_table: UnsafeCell::new([std::ptr::null_mut(); CORE_SIZE + 1]),
    core2_table: UnsafeCell::new([std::ptr::null_mut(); CORE2_SIZE + 1]),
};

/// The downstream's function for CORE (`core2 == false`) or CORE2 callback `id`, or null.
fn down(core2: bool, id: usize) -> FnPtr {
    let slot = if core2 {
        DOWN.core2.get(id)
    } else {
        DOWN.core.get(id)
    };
    // SAFETY: see `Slots`: no writer runs once callbacks can.
    slot.map_or(std::ptr::null(), |s| unsafe { *s.get() })
}

/// Our own handles (when no downstream made one): distinct, never dereferenced by NVTX users.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x10);
/// Whether NVTX has initialised this library (see [`InitializeInjectionNvtx2`]).
static INITIALISED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Our own start/end ids (when no downstream made one).
static NEXT_RANGE: AtomicU64 = AtomicU64::new(1);

fn quiet<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// A NUL-terminated ASCII/UTF-8 string, borrowed (no allocation) when it is valid UTF-8, as
/// NVTX messages are: a push by name allocates nothing here.
fn cstr<'a>(p: *const c_char) -> Option<Cow<'a, str>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: NVTX's contract: a non-null ASCII message is a NUL-terminated string, which
    // outlives the call that passed it (the borrow does not leave the callback).
    let c = unsafe { CStr::from_ptr(p) };
    // The strict check first: much cheaper than the lossy one's chunking when it passes.
    Some(
        c.to_str()
            .map_or_else(|_| c.to_string_lossy(), Cow::Borrowed),
    )
}

/// A NUL-terminated message's bytes (empty for null), borrowed: a push by name neither
/// allocates nor checks UTF-8 once the thread has seen the name.
fn cbytes<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return &[];
    }
    // SAFETY: as in `cstr`.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}

fn wstr<'a>(p: *const i32) -> Option<Cow<'a, str>> {
    if p.is_null() {
        return None;
    }
    let mut s = String::new();
    let mut i = 0;
    loop {
        // SAFETY: NVTX's contract: a non-null wide message is a NUL-terminated `wchar_t`
        // (32-bit on Linux) string, so every unit up to the terminator is readable.
        let c = unsafe { *p.add(i) };
        if c == 0 {
            return Some(Cow::Owned(s));
        }
        s.push(char::from_u32(c as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
        i += 1;
    }
}

fn handle_name(h: usize) -> Option<NameId> {
    HANDLES.lock().get(&h).copied()
}

fn domain_of(d: *const c_void) -> NameId {
    if d.is_null() {
        DEFAULT_DOMAIN
    } else {
        handle_name(d as usize).unwrap_or(DEFAULT_DOMAIN)
    }
}

/// Open a range in `domain` named by `attr`'s message, under its category.
fn open_attr(domain: NameId, attr: *const EventAttributes, started: u64) -> i32 {
    if attr.is_null() {
        return range::open_str(domain, "", started);
    }
    // SAFETY: NVTX's contract: `attr` points to an initialised `nvtxEventAttributes_t` whose
    // `size` says how much of it is there; the message is read only when it is present.
    let a = unsafe { &*attr };
    if (a.size as usize) < std::mem::size_of::<EventAttributes>() {
        return range::open_str(domain, "", started);
    }
    let text = |s: Option<Cow<str>>| {
        let s = s.unwrap_or_default();
        if a.category == 0 {
            range::open_str(domain, &s, started)
        } else {
            range::open_str_categorized(domain, a.category, &s, started)
        }
    };
    match a.message_type {
        MESSAGE_ASCII if a.category == 0 => {
            range::open_bytes(domain, cbytes(a.message as *const c_char), started)
        }
        MESSAGE_ASCII => text(cstr(a.message as *const c_char)),
        MESSAGE_UNICODE => text(wstr(a.message as *const i32)),
        MESSAGE_REGISTERED => match handle_name(a.message as usize) {
            Some(n) => range::open(domain, range::categorized(domain, a.category, n), started),
            None => text(None),
        },
        _ => text(None),
    }
}

fn new_handle(from_down: *const c_void, name: &str) -> *const c_void {
    let h = if from_down.is_null() {
        NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
    } else {
        from_down as usize
    };
    let id = range::intern_name(name);
    HANDLES.lock().insert(h, id);
    h as *const c_void
}

fn started_id(from_down: u64) -> u64 {
    if from_down != 0 {
        from_down
    } else {
        NEXT_RANGE.fetch_add(1, Ordering::Relaxed)
    }
}

/// Call the downstream's function `$id` as `$ty` with `$args`, or give `$none`.
macro_rules! forward {
    ($core2:expr, $id:expr, $ty:ty, $none:expr, ($($arg:expr),*)) => {{
        let f = down($core2, $id);
        if f.is_null() {
            $none
        } else {
            // SAFETY: the downstream filled this slot with its implementation of callback
            // `$id`, whose C signature NVTX fixes as `$ty`.
            let f: $ty = unsafe { std::mem::transmute::<FnPtr, $ty>(f) };
            f($($arg),*)
        }
    }};
}

extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    forward!(
        false,
        RANGE_PUSH_EX,
        extern "C" fn(*const EventAttributes) -> c_int,
        0,
        (attr)
    );
    quiet(-1, || open_attr(DEFAULT_DOMAIN, attr, 0))
}

extern "C" fn range_push_a(msg: *const c_char) -> c_int {
    forward!(
        false,
        RANGE_PUSH_A,
        extern "C" fn(*const c_char) -> c_int,
        0,
        (msg)
    );
    quiet(-1, || range::open_bytes(DEFAULT_DOMAIN, cbytes(msg), 0))
}

extern "C" fn range_push_w(msg: *const i32) -> c_int {
    forward!(
        false,
        RANGE_PUSH_W,
        extern "C" fn(*const i32) -> c_int,
        0,
        (msg)
    );
    quiet(-1, || {
        range::open_str(DEFAULT_DOMAIN, &wstr(msg).unwrap_or_default(), 0)
    })
}

extern "C" fn range_pop() -> c_int {
    forward!(false, RANGE_POP, extern "C" fn() -> c_int, 0, ());
    quiet(-1, || range::pop(DEFAULT_DOMAIN))
}

extern "C" fn range_start_ex(attr: *const EventAttributes) -> u64 {
    let d = forward!(
        false,
        RANGE_START_EX,
        extern "C" fn(*const EventAttributes) -> u64,
        0,
        (attr)
    );
    quiet(d, || {
        let id = started_id(d);
        open_attr(DEFAULT_DOMAIN, attr, id);
        id
    })
}

extern "C" fn range_start_a(msg: *const c_char) -> u64 {
    let d = forward!(
        false,
        RANGE_START_A,
        extern "C" fn(*const c_char) -> u64,
        0,
        (msg)
    );
    quiet(d, || {
        let id = started_id(d);
        range::open_bytes(DEFAULT_DOMAIN, cbytes(msg), id);
        id
    })
}

extern "C" fn range_start_w(msg: *const i32) -> u64 {
    let d = forward!(
        false,
        RANGE_START_W,
        extern "C" fn(*const i32) -> u64,
        0,
        (msg)
    );
    quiet(d, || {
        let id = started_id(d);
        range::open_str(DEFAULT_DOMAIN, &wstr(msg).unwrap_or_default(), id);
        id
    })
}

extern "C" fn range_end(id: u64) {
    forward!(false, RANGE_END, extern "C" fn(u64), (), (id));
    quiet((), || range::end(id))
}

extern "C" fn domain_range_push_ex(d: *const c_void, attr: *const EventAttributes) -> c_int {
    forward!(
        true,
        DOMAIN_RANGE_PUSH_EX,
        extern "C" fn(*const c_void, *const EventAttributes) -> c_int,
        0,
        (d, attr)
    );
    quiet(-1, || open_attr(domain_of(d), attr, 0))
}

extern "C" fn domain_range_pop(d: *const c_void) -> c_int {
    forward!(
        true,
        DOMAIN_RANGE_POP,
        extern "C" fn(*const c_void) -> c_int,
        0,
        (d)
    );
    quiet(-1, || range::pop(domain_of(d)))
}

extern "C" fn domain_range_start_ex(d: *const c_void, attr: *const EventAttributes) -> u64 {
    let r = forward!(
        true,
        DOMAIN_RANGE_START_EX,
        extern "C" fn(*const c_void, *const EventAttributes) -> u64,
        0,
        (d, attr)
    );
    quiet(r, || {
        let id = started_id(r);
        open_attr(domain_of(d), attr, id);
        id
    })
}

extern "C" fn domain_range_end(d: *const c_void, id: u64) {
    forward!(
        true,
        DOMAIN_RANGE_END,
        extern "C" fn(*const c_void, u64),
        (),
        (d, id)
    );
    quiet((), || range::end(id))
}

extern "C" fn domain_register_string_a(d: *const c_void, s: *const c_char) -> *const c_void {
    let h = forward!(
        true,
        DOMAIN_REGISTER_STRING_A,
        extern "C" fn(*const c_void, *const c_char) -> *const c_void,
        std::ptr::null(),
        (d, s)
    );
    quiet(h, || new_handle(h, &cstr(s).unwrap_or_default()))
}

extern "C" fn domain_register_string_w(d: *const c_void, s: *const i32) -> *const c_void {
    let h = forward!(
        true,
        DOMAIN_REGISTER_STRING_W,
        extern "C" fn(*const c_void, *const i32) -> *const c_void,
        std::ptr::null(),
        (d, s)
    );
    quiet(h, || new_handle(h, &wstr(s).unwrap_or_default()))
}

extern "C" fn domain_create_a(s: *const c_char) -> *const c_void {
    let h = forward!(
        true,
        DOMAIN_CREATE_A,
        extern "C" fn(*const c_char) -> *const c_void,
        std::ptr::null(),
        (s)
    );
    quiet(h, || new_handle(h, &cstr(s).unwrap_or_default()))
}

extern "C" fn domain_create_w(s: *const i32) -> *const c_void {
    let h = forward!(
        true,
        DOMAIN_CREATE_W,
        extern "C" fn(*const i32) -> *const c_void,
        std::ptr::null(),
        (s)
    );
    quiet(h, || new_handle(h, &wstr(s).unwrap_or_default()))
}

extern "C" fn name_category_a(category: u32, name: *const c_char) {
    forward!(
        false,
        NAME_CATEGORY_A,
        extern "C" fn(u32, *const c_char),
        (),
        (category, name)
    );
    quiet((), || {
        range::name_category(DEFAULT_DOMAIN, category, &cstr(name).unwrap_or_default())
    })
}

extern "C" fn name_category_w(category: u32, name: *const i32) {
    forward!(
        false,
        NAME_CATEGORY_W,
        extern "C" fn(u32, *const i32),
        (),
        (category, name)
    );
    quiet((), || {
        range::name_category(DEFAULT_DOMAIN, category, &wstr(name).unwrap_or_default())
    })
}

extern "C" fn domain_name_category_a(d: *const c_void, category: u32, name: *const c_char) {
    forward!(
        true,
        DOMAIN_NAME_CATEGORY_A,
        extern "C" fn(*const c_void, u32, *const c_char),
        (),
        (d, category, name)
    );
    quiet((), || {
        range::name_category(domain_of(d), category, &cstr(name).unwrap_or_default())
    })
}

extern "C" fn domain_name_category_w(d: *const c_void, category: u32, name: *const i32) {
    forward!(
        true,
        DOMAIN_NAME_CATEGORY_W,
        extern "C" fn(*const c_void, u32, *const i32),
        (),
        (d, category, name)
    );
    quiet((), || {
        range::name_category(domain_of(d), category, &wstr(name).unwrap_or_default())
    })
}

extern "C" fn name_os_thread_a(tid: u32, name: *const c_char) {
    forward!(
        false,
        NAME_OS_THREAD_A,
        extern "C" fn(u32, *const c_char),
        (),
        (tid, name)
    );
    quiet((), || {
        range::name_thread(u64::from(tid), &cstr(name).unwrap_or_default())
    })
}

extern "C" fn name_os_thread_w(tid: u32, name: *const i32) {
    forward!(
        false,
        NAME_OS_THREAD_W,
        extern "C" fn(u32, *const i32),
        (),
        (tid, name)
    );
    quiet((), || {
        range::name_thread(u64::from(tid), &wstr(name).unwrap_or_default())
    })
}

/// Implementations by callback id.
type Impls = Vec<(usize, FnPtr)>;

/// Our CORE and CORE2 implementations, by callback id.
fn ours() -> (Impls, Impls) {
    (
        vec![
            (RANGE_START_EX, range_start_ex as FnPtr),
            (RANGE_START_A, range_start_a as FnPtr),
            (RANGE_START_W, range_start_w as FnPtr),
            (RANGE_END, range_end as FnPtr),
            (RANGE_PUSH_EX, range_push_ex as FnPtr),
            (RANGE_PUSH_A, range_push_a as FnPtr),
            (RANGE_PUSH_W, range_push_w as FnPtr),
            (RANGE_POP, range_pop as FnPtr),
            (NAME_CATEGORY_A, name_category_a as FnPtr),
            (NAME_CATEGORY_W, name_category_w as FnPtr),
            (NAME_OS_THREAD_A, name_os_thread_a as FnPtr),
            (NAME_OS_THREAD_W, name_os_thread_w as FnPtr),
        ],
        vec![
            (DOMAIN_RANGE_START_EX, domain_range_start_ex as FnPtr),
            (DOMAIN_RANGE_END, domain_range_end as FnPtr),
            (DOMAIN_RANGE_PUSH_EX, domain_range_push_ex as FnPtr),
            (DOMAIN_RANGE_POP, domain_range_pop as FnPtr),
            (DOMAIN_REGISTER_STRING_A, domain_register_string_a as FnPtr),
            (DOMAIN_REGISTER_STRING_W, domain_register_string_w as FnPtr),
            (DOMAIN_CREATE_A, domain_create_a as FnPtr),
            (DOMAIN_CREATE_W, domain_create_w as FnPtr),
            (DOMAIN_NAME_CATEGORY_A, domain_name_category_a as FnPtr),
            (DOMAIN_NAME_CATEGORY_W, domain_name_category_w as FnPtr),
        ],
    )
}

// ---- The export table we show a downstream injection library. ----

unsafe extern "C" fn down_module_table(
    module: c_int,
    out_table: *mut *mut *mut FnPtr,
    out_size: *mut c_uint,
) -> c_int {
    let (table, n) = match module {
        MODULE_CORE => (DOWN.core_table.get() as *mut *mut FnPtr, CORE_SIZE),
        MODULE_CORE2 => (DOWN.core2_table.get() as *mut *mut FnPtr, CORE2_SIZE),
        _ => return 0,
    };
    // SAFETY: the downstream passes writable out-pointers (or null), as with NVTX's own table.
    unsafe {
        if !out_table.is_null() {
            *out_table = table;
        }
        if !out_size.is_null() {
            *out_size = n as c_uint;
        }
    }
    1
}

unsafe extern "C" fn down_set_version(_v: u32) {}

static DOWN_CALLBACKS: Callbacks = Callbacks {
    struct_size: std::mem::size_of::<Callbacks>(),
    get_module_function_table: Some(down_module_table),
};

static DOWN_VERSION: VersionInfo = VersionInfo {
    struct_size: std::mem::size_of::<VersionInfo>(),
    version: NVTX_VERSION,
    reserved0: 0,
    set_injection_nvtx_version: Some(down_set_version),
};

unsafe extern "C" fn down_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => &DOWN_CALLBACKS as *const Callbacks as *const c_void,
        ETID_VERSIONINFO => &DOWN_VERSION as *const VersionInfo as *const c_void,
        _ => std::ptr::null(),
    }
}

/// Load and initialise the downstream injection library `path` against our slots.
fn load_downstream(path: &str) -> Result<(), String> {
    // SAFETY: the table pointers are written once, here, before the downstream or any
    // callback reads them (see `Slots`).
    unsafe {
        let core = &mut *DOWN.core_table.get();
        for (i, s) in DOWN.core.iter().enumerate() {
            core[i] = s.get();
        }
        let core2 = &mut *DOWN.core2_table.get();
        for (i, s) in DOWN.core2.iter().enumerate() {
            core2[i] = s.get();
        }
    }
    let c = std::ffi::CString::new(path).map_err(|_| "the path holds a NUL byte".to_string())?;
    // SAFETY: dlopen/dlsym with NUL-terminated strings; the library is a user-chosen NVTX
    // injection, loaded as NVTX itself would load it.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY) };
    if h.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated message.
        let e = unsafe { libc::dlerror() };
        return Err(cstr(e).map_or_else(|| "dlopen failed".into(), Cow::into_owned));
    }
    // SAFETY: as above.
    let init = unsafe { libc::dlsym(h, c"InitializeInjectionNvtx2".as_ptr()) };
    if init.is_null() {
        return Err("it has no InitializeInjectionNvtx2".into());
    }
    // SAFETY: NVTX fixes this entry's signature.
    let init: unsafe extern "C" fn(GetExportTable) -> c_int = unsafe { std::mem::transmute(init) };
    // SAFETY: our export table is valid for the life of the process.
    if unsafe { init(down_export_table) } == 0 {
        return Err("its InitializeInjectionNvtx2 declined".into());
    }
    Ok(())
}

/// Fill NVTX's slots of `module`: ours where we implement the call, else the downstream's.
///
/// # Safety
/// `get` is NVTX's `nvtxGetExportTable`.
unsafe fn fill(cb: &Callbacks, module: c_int, ours: &[(usize, FnPtr)], core2: bool) {
    let Some(get_table) = cb.get_module_function_table else {
        return;
    };
    let mut table: *mut *mut FnPtr = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: NVTX's callback with valid out-pointers.
    if unsafe { get_table(module, &mut table, &mut size) } == 0 || table.is_null() {
        return;
    }
    for id in 1..size as usize {
        // SAFETY: NVTX's table has `size + 1` entries, each null or a pointer to its slot.
        let slot = unsafe { *table.add(id) };
        if slot.is_null() {
            continue;
        }
        let f = ours
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, f)| *f)
            .unwrap_or_else(|| down(core2, id));
        if !f.is_null() {
            // SAFETY: NVTX's slot for callback `id`, which an injection may overwrite.
            unsafe { *slot = f };
        }
    }
}

/// NVTX's injection entry (`NVTX_INJECTION64_PATH` names this library).
///
/// # Safety
/// Called by NVTX with its `nvtxGetExportTable`.
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get: Option<GetExportTable>) -> c_int {
    quiet(0, || {
        let Some(get) = get else { return 0 };
        // Once per process: a forward that names this library again (another path to it)
        // would otherwise initialise itself against its own slots, forever.
        if INITIALISED.swap(true, Ordering::AcqRel) {
            return 0;
        }
        // Starts and ends are kept from the first range on, even one opened before the
        // program's first CUDA call builds the shim's state.
        let conf = cushim::config::history::HistoryConf::from_env();
        if conf.records_history() || crate::life::log::requested() {
            cushim::trace::annotations::enable(conf.max_entries, annotation_device);
        }
        if let Some(p) = std::env::var("CUSHIM_NVTX_FORWARD")
            .ok()
            .filter(|p| !p.is_empty())
        {
            if let Err(e) = load_downstream(&p) {
                eprintln!("cushim: NVTX ranges are not forwarded to {p}: {e}");
            }
        }
        // SAFETY: NVTX's export table entries are its static structs (or null).
        let cb = unsafe { get(ETID_CALLBACKS) } as *const Callbacks;
        if cb.is_null() {
            return 0;
        }
        // SAFETY: NVTX's callbacks table, valid for the process's life.
        let cb = unsafe { &*cb };
        if cb.struct_size < std::mem::size_of::<Callbacks>() {
            return 0;
        }
        let (core, core2) = ours();
        // SAFETY: `cb` is NVTX's own callbacks table.
        unsafe {
            fill(cb, MODULE_CORE, &core, false);
            fill(cb, MODULE_CORE2, &core2, true);
        }
        // SAFETY: as for the callbacks table.
        let vi = unsafe { get(ETID_VERSIONINFO) } as *const VersionInfo;
        if !vi.is_null() {
            // SAFETY: NVTX's version-info table.
            let vi = unsafe { &*vi };
            if vi.struct_size >= std::mem::size_of::<VersionInfo>() {
                if let Some(set) = vi.set_injection_nvtx_version {
                    // SAFETY: NVTX's own callback.
                    unsafe { set(NVTX_VERSION) };
                }
            }
        }
        1
    })
}

/// The same entry, found among loaded libraries when `NVTX_INJECTION64_PATH` is unset (the
/// shim under `LD_PRELOAD` alone).
///
/// # Safety
/// As [`InitializeInjectionNvtx2`].
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2Preinject(get: Option<GetExportTable>) -> c_int {
    // SAFETY: same contract.
    unsafe { InitializeInjectionNvtx2(get) }
}
