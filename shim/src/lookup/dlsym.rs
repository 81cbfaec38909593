//! The `dlsym` override: `dlsym` on a library handle bypasses `LD_PRELOAD`, so a program or
//! runtime that fetches driver entry points with `dlopen("libcuda.so.1")` + `dlsym` gets the
//! shim's hooks (and `cuGetProcAddress` wrappers) this way.
//!
//! The same holds for the runtime: a `dlsym` on a `libcudart` handle (ctypes) gets the shim's
//! runtime exports.
//!
//! Invariants: the answer is always libc's own `dlsym` result, except for a name that is
//! exactly one of the shim's hooked symbols (driver hooks, runtime exports; no prefix or
//! pattern matching: `cudnnCreate` or `cuMemAllocPitch_v2` are never touched), looked up on a
//! specific library handle that really defines it, from outside libcushim.so and from a
//! library that does not define that name itself (an interposer stacked below the shim gets
//! the real function: see [`caller_defines`]), on a thread not inside a shim export, with
//! that layer intercepted: then the hook is returned and the real address remembered for
//! the hook to forward to. `RTLD_NEXT` and `RTLD_DEFAULT` lookups and every answer that
//! is not substituted are made by tail-jumping into libc's `dlsym` with the caller's own
//! return address on the stack, so glibc sees the true caller (what `RTLD_NEXT` depends
//! on). Nothing here allocates, initializes the shim or calls CUDA.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::ffi::intercept::{enabled, inside, Layer};
use crate::real::driver::{in_shim, real_dlsym, real_dlsym_addr};

/// Decide a `dlsym(handle, name)` made from return address `caller`: the hook to return, or
/// NULL to let libc's `dlsym` answer.
extern "C" fn decide(handle: *mut c_void, name: *const c_char, caller: usize) -> *mut c_void {
    if handle.is_null() || handle == libc::RTLD_NEXT || name.is_null() {
        return std::ptr::null_mut();
    }
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        let (hook, layer) = match crate::lookup::table::row(bytes) {
            Some(row) => (row.hook(), row.layer),
            // The per-thread stream stubs exported for runtime and driver entry points
            // (`per_thread/stubs.rs`).
            None => match crate::per_thread::runtime_hook(bytes) {
                Some(h) => (h, Layer::Runtime),
                None => match crate::per_thread::driver_hook(bytes) {
                    Some(h) => (h, Layer::Driver),
                    None => return per_thread_stub(handle, name, bytes, caller),
                },
            },
        };
        if !enabled(layer) || inside() || in_shim(caller) {
            return None;
        }
        // SAFETY: the program's own handle and name, as its dlsym call passed them.
        let real = unsafe { real_dlsym(handle, name) };
        if real.is_null() || caller_defines(caller, name) {
            return None;
        }
        hook.real.offer(real as usize);
        Some(hook.hook as *mut c_void)
    }))
    .ok()
    .flatten()
    .unwrap_or(std::ptr::null_mut())
}

/// A driver `_ptsz`/`_ptds` entry point looked up on a library handle: the stub that notes
/// the per-thread stream's use (`per_thread.rs`), or `None`.
fn per_thread_stub(
    handle: *mut c_void,
    name: *const c_char,
    bytes: &[u8],
    caller: usize,
) -> Option<*mut c_void> {
    if !(bytes.ends_with(b"_ptsz") || bytes.ends_with(b"_ptds"))
        || !enabled(Layer::Driver)
        || inside()
        || in_shim(caller)
    {
        return None;
    }
    // SAFETY: the program's own handle and name, as its dlsym call passed them.
    let real = unsafe { real_dlsym(handle, name) } as usize;
    crate::per_thread::dlsym_stub(bytes, real).map(|s| s as *mut c_void)
}

/// Whether the library the call comes from defines `name` itself: then it is an interposer
/// of that function (a `libcuda.so.1` wrapper such as HAMi-core's `libvgpu.so`) looking up
/// the layer below it, and must get that layer's function. Handing it the shim's hook would
/// make the hook forward to the wrapper and the wrapper to the hook, for ever. The wrapper
/// itself is what the hook forwards to (the next definition after the shim), so a call
/// passes each layer once: program, shim, wrapper, driver. Only runs for exact hooked names
/// looked up on a library handle (start-up, not a hot path).
fn caller_defines(caller: usize, name: *const c_char) -> bool {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(caller as *const c_void, &mut info) } == 0 || info.dli_fname.is_null()
    {
        return false;
    }
    // A handle of the caller's own object (never loads one): the link map `dladdr1` gives is
    // no handle for a library loaded as a dependency (glibc builds its search list only in
    // `dlopen`).
    // SAFETY: dli_fname is the loaded object's NUL-terminated file name; RTLD_NOLOAD.
    let h = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return false;
    }
    // SAFETY: a live handle and the program's NUL-terminated name; a lookup on a handle
    // searches the object first, then its dependencies.
    let def = unsafe { real_dlsym(h, name) } as usize;
    // SAFETY: balances the reference RTLD_NOLOAD took; the library stays loaded.
    unsafe { libc::dlclose(h) };
    def != 0 && crate::ffi::callsite::module_base(def) == Some(info.dli_fbase as usize)
}

/// libc's `dlsym`, for the tail jump.
extern "C" fn real_addr() -> usize {
    real_dlsym_addr()
}

/// The exported `dlsym`. On x86-64 a naked entry passes the caller's return address to
/// [`decide`] and tail-jumps into libc's `dlsym` with the original arguments and return
/// address when it declines.
///
/// # Safety
/// As libc's `dlsym`: a handle from `dlopen` (or a pseudo-handle) and a NUL-terminated name.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // Stack on entry: [rsp] = return address, rsp = 8 mod 16. After two pushes and 8 bytes
    // of padding it is 16-byte aligned for the calls, and the return address is at rsp+24.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdx, [rsp + 24]",
        "call {decide}",
        "test rax, rax",
        "jnz 2f",
        "call {real}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        "2:",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "ret",
        decide = sym decide,
        real = sym real_addr,
    )
}

/// The exported `dlsym` elsewhere: without the caller's address, only the per-thread guard
/// keeps the shim's own lookups real, and `RTLD_NEXT` is answered as if from libcushim.so.
///
/// # Safety
/// As libc's `dlsym`.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let hook = decide(handle, name, 0);
    if !hook.is_null() {
        return hook;
    }
    // SAFETY: the caller's own arguments.
    unsafe { real_dlsym(handle, name) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide_for(handle: *mut c_void, name: &CStr, caller: usize) -> *mut c_void {
        decide(handle, name.as_ptr(), caller)
    }

    #[test]
    fn the_shims_own_code_is_recognised_as_the_caller_to_answer_for_real() {
        let ours = decide as *const () as usize;
        assert!(in_shim(ours));
        assert!(!in_shim(libc::malloc as *const () as usize));
        assert!(!in_shim(0));
    }

    #[test]
    fn pseudo_handles_and_unknown_names_go_to_libc() {
        let foreign = libc::malloc as *const () as usize;
        assert!(!in_shim(foreign));
        for h in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
            assert!(decide_for(h, c"cuMemAlloc_v2", foreign).is_null());
        }
        // SAFETY: dlopen(NULL) returns the main program's handle.
        let main = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_NOW) };
        for n in [c"cudnnCreate", c"cuMemAlloc", c"malloc", c""] {
            assert!(decide_for(main, n, foreign).is_null(), "{n:?}");
        }
        assert!(decide(main, std::ptr::null(), foreign).is_null());
    }

    #[test]
    fn the_override_answers_like_libc_for_ordinary_names() {
        // SAFETY: dlsym through the override with pseudo-handles and NUL-terminated names.
        unsafe {
            let ours = dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
            let theirs = real_dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
            assert!(!ours.is_null());
            assert_eq!(ours, theirs);
            assert!(dlsym(libc::RTLD_DEFAULT, c"no_such_symbol_anywhere".as_ptr()).is_null());
        }
    }
}
