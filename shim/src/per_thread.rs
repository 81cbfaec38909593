//! Per-thread default streams: seeing whether the program uses one, before its work is
//! queued there.
//!
//! # Policy, and why
//!
//! Under `free_sync:auto` a block freed by one thread is handed at once to a malloc of
//! another thread while every thread's work goes to the legacy default stream: the legacy
//! stream runs its work in submission order, and the free that released a block is
//! submitted-before (under the device's lock) the malloc that hands it out again. That is
//! no longer so once a thread queues work on its *per-thread* default stream, which nothing
//! orders with another thread's; then (and only once several threads allocate) frees wait
//! for the GPU-side barrier (`src/alloc/barrier.rs`). The shim therefore watches for the
//! first use of a per-thread default stream and tells the allocator
//! (`CachingAllocator::per_thread_streams_used`) *before* that call reaches CUDA:
//!
//! - every `_ptsz`/`_ptds` entry point of the runtime (what nvcc's `--default-stream
//!   per-thread` programs call), exported here, and every per-thread name of `cuda.h`, for
//!   programs linked with `-lcuda` and `dlsym` on a driver handle (`per_thread/stubs.rs`);
//! - every driver entry point handed out as its per-thread variant: `cuGetProcAddress` with
//!   `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, a default-mode answer that is the
//!   per-thread function, a `dlsym` of a `_ptsz`/`_ptds` name on a library handle. The
//!   runtimes ask for all of them at start-up, so the request proves nothing: the *call*
//!   does, and what is handed out is a stub that notes it and jumps to the real function;
//! - the handles `cudaStreamPerThread`/`CU_STREAM_PER_THREAD` (2) passed as the stream of a
//!   stream-taking entry point, runtime (exported here) or driver (exported here, and their
//!   legacy variants from `cuGetProcAddress`, [`DRIVER`]), at the argument position of that
//!   entry point's ABI; an entry point whose signature changed across versions in a way this
//!   file does not place, or whose stream is behind a pointer ([`Check::Always`]), counts
//!   as a use on its first call;
//! - the shim's own stream-taking hooks (`cudaMallocAsync`, `cudaFreeAsync`, capture,
//!   ...) call [`note_stream`] / [`note_ptds`].
//!
//! A stub costs a load of one byte and a compare or two, allocates nothing and takes no
//! lock; after the first use it is a load, a branch and a jump. When in doubt the stub
//! counts a use (a full pool of stubs, an unknown ABI): that only costs speed (the barrier
//! that threads paid before), never safety. Entry points of streams the shim does not list
//! and that are not looked up through `cuGetProcAddress`/`dlsym` as per-thread variants
//! are not watched (README, Limitations). Stubs exist on x86-64 only; elsewhere the
//! allocator is told at start that per-thread streams may be used (a second thread then
//! makes frees wait, as before).

use std::ffi::{c_int, CStr};
use std::sync::atomic::{fence, AtomicU8, AtomicUsize, Ordering};

use cushim::alloc::CachingAllocator;
use once_cell::sync::OnceCell;

use crate::real::driver::RealFn;

/// `cudaStreamPerThread` / `CU_STREAM_PER_THREAD`.
pub const PER_THREAD_HANDLE: usize = 2;

/// 1 once a per-thread default stream was used (read by the stubs as one byte).
static SEEN: AtomicU8 = AtomicU8::new(0);

/// Whether a per-thread default stream was used so far.
pub fn seen() -> bool {
    SEEN.load(Ordering::Relaxed) != 0
}

/// A stream-taking hook of the shim was called with stream `h`.
#[inline]
pub fn note_stream(h: usize) {
    if h == PER_THREAD_HANDLE && !seen() {
        mark();
    }
}

/// A per-thread (`_ptsz`/`_ptds`) hook of the shim was called.
#[inline]
pub fn note_ptds() {
    if !seen() {
        mark();
    }
}

/// What tells the shim's allocator of the first use, if the allocator exists yet.
/// Registered when the state is built (`life/state.rs`), before the state is published.
static TELL: OnceCell<fn()> = OnceCell::new();

/// Register what tells the allocator of the first use (once; later calls are ignored).
pub fn on_first_use(tell: fn()) {
    let _ = TELL.set(tell);
}

/// The first use: remember it and tell the allocator, if it exists yet (else [`apply`]
/// tells it when it is built). Never unwinds (stubs call it).
#[cold]
#[inline(never)]
extern "C" fn mark() {
    let _ = std::panic::catch_unwind(|| {
        SEEN.store(1, Ordering::SeqCst);
        // Pairs with the fence in `apply`: either this sees the state (`TELL` is registered
        // before the state is published), or `apply` sees SEEN.
        fence(Ordering::SeqCst);
        if let Some(tell) = TELL.get() {
            tell();
        }
    });
}

/// Tell a freshly built (or just published) allocator what was seen so far.
pub fn apply(alloc: &CachingAllocator) {
    fence(Ordering::SeqCst);
    if !cfg!(target_arch = "x86_64") || seen() {
        alloc.per_thread_streams_used();
    }
}

/// Where a stub finds the stream it checks: the integer-class argument slot (0-5 are
/// registers, 6 and up the stack), a field of a structure that argument points to, or
/// nowhere (a per-thread variant, or a stream-taking function whose ABI is not placed:
/// the first call counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Always,
    Arg(u8),
    /// The `u64` at this byte offset of the structure argument 0 points to.
    Field0(u8),
    /// The `u64` at this byte offset of the structure argument 2 points to.
    Field2(u8),
}

/// A stub's target: the function it jumps to (0 until known; read by the stubs at offset
/// 0), and for the exported runtime stubs the real function of their name, found on first
/// call as every runtime export finds its own ([`RealFn`]).
#[repr(C)]
pub struct Slot {
    target: AtomicUsize,
    pub real: RealFn,
}

impl Slot {
    pub const fn new(name: &'static CStr) -> Slot {
        Slot {
            target: AtomicUsize::new(0),
            real: RealFn::new(name),
        }
    }
}

/// The function a slot stands for (0: none; the stub then returns `cudaErrorUnknown`).
/// Called by the stubs with the slot's address when its target is not known yet.
extern "C" fn resolve(slot: &Slot) -> usize {
    std::panic::catch_unwind(|| {
        let a = slot.target.load(Ordering::Acquire);
        if a != 0 || slot.real.name().is_empty() {
            return a;
        }
        let Some(p) = slot.real.get() else {
            return 0;
        };
        let _ = slot
            .target
            .compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire);
        slot.target.load(Ordering::Acquire)
    })
    .unwrap_or(0)
}

/// The shared tails of every stub. On entry `rax` holds the address of the stub's [`Slot`]
/// and every argument register and the stack are the caller's, untouched.
///
/// Why this is sound: a stub is entered by the program's `call` and leaves by a tail jump to
/// the real function with every argument register (integer and vector) and the stack as the
/// caller left them, so the real function sees the program's own call; `rax` and `r11` are
/// scratch at a call boundary in the System V ABI (`al` counts vector registers only for
/// variadic functions, and none of the stubbed functions is variadic). The calls into Rust
/// ([`mark`], [`resolve`]) save and restore every argument register around them, on a
/// 16-byte aligned stack, and never unwind (each catches its own panics).
#[cfg(target_arch = "x86_64")]
mod tails {
    use super::{mark, resolve, SEEN};

    /// Save the argument registers (integer and vector) around a call: entry `rsp` is 8 mod
    /// 16, so 7 pushes and 128 bytes leave it 16-byte aligned for the call.
    macro_rules! save {
        () => {
            concat!(
                "push rax\n push rdi\n push rsi\n push rdx\n push rcx\n push r8\n push r9\n",
                "sub rsp, 128\n",
                "movdqu [rsp], xmm0\n movdqu [rsp + 16], xmm1\n movdqu [rsp + 32], xmm2\n",
                "movdqu [rsp + 48], xmm3\n movdqu [rsp + 64], xmm4\n movdqu [rsp + 80], xmm5\n",
                "movdqu [rsp + 96], xmm6\n movdqu [rsp + 112], xmm7",
            )
        };
    }

    macro_rules! restore {
        () => {
            concat!(
                "movdqu xmm0, [rsp]\n movdqu xmm1, [rsp + 16]\n movdqu xmm2, [rsp + 32]\n",
                "movdqu xmm3, [rsp + 48]\n movdqu xmm4, [rsp + 64]\n movdqu xmm5, [rsp + 80]\n",
                "movdqu xmm6, [rsp + 96]\n movdqu xmm7, [rsp + 112]\n",
                "add rsp, 128\n",
                "pop r9\n pop r8\n pop rcx\n pop rdx\n pop rsi\n pop rdi\n pop rax",
            )
        };
    }

    /// Note the use, then go.
    #[unsafe(naked)]
    pub unsafe extern "C" fn marking() {
        core::arch::naked_asm!(
            save!(),
            "call {mark}",
            restore!(),
            "jmp {go}",
            mark = sym mark,
            go = sym go,
        )
    }

    /// The slot had no target yet: resolve it and go; with none, return
    /// `cudaErrorUnknown` / `CUDA_ERROR_UNKNOWN` (999) without calling anything.
    #[unsafe(naked)]
    unsafe extern "C" fn resolving() {
        core::arch::naked_asm!(
            save!(),
            "mov rdi, rax",
            "call {resolve}",
            "test rax, rax",
            "jz 2f",
            restore!(),
            "jmp {go}",
            "2:",
            "add rsp, 184",
            "mov eax, 999",
            "ret",
            resolve = sym resolve,
            go = sym go,
        )
    }

    /// Jump to the slot's target, resolving it first if it is not known yet.
    #[unsafe(naked)]
    pub unsafe extern "C" fn go() {
        core::arch::naked_asm!(
            "mov r11, qword ptr [rax]",
            "test r11, r11",
            "jz {resolving}",
            "jmp r11",
            resolving = sym resolving,
        )
    }

    macro_rules! check {
        ($name:ident, $($test:literal),*) => {
            #[unsafe(naked)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "cmp byte ptr [rip + {seen}], 0",
                    "jne {go}",
                    $($test,)*
                    "jmp {marking}",
                    seen = sym SEEN,
                    go = sym go,
                    marking = sym marking,
                )
            }
        };
    }

    check!(always,);
    check!(arg0, "cmp rdi, 2", "jne {go}");
    check!(arg1, "cmp rsi, 2", "jne {go}");
    check!(arg2, "cmp rdx, 2", "jne {go}");
    check!(arg3, "cmp rcx, 2", "jne {go}");
    check!(arg4, "cmp r8, 2", "jne {go}");
    check!(arg5, "cmp r9, 2", "jne {go}");
    check!(arg6, "cmp qword ptr [rsp + 8], 2", "jne {go}");
    check!(arg7, "cmp qword ptr [rsp + 16], 2", "jne {go}");
    check!(arg8, "cmp qword ptr [rsp + 24], 2", "jne {go}");
    check!(
        field0_32,
        "test rdi, rdi",
        "jz {go}",
        "cmp qword ptr [rdi + 32], 2",
        "jne {go}"
    );
    check!(
        field2_8,
        "test rdx, rdx",
        "jz {go}",
        "cmp qword ptr [rdx + 8], 2",
        "jne {go}"
    );
}

/// The driver's stream-taking entry points by base name: from which `cudaVersion` (and
/// below which) an ABI holds, and where its stream is. Signatures from `cuda.h`; those
/// with several ABIs over versions this file does not place are [`Check::Always`].
pub const DRIVER: &[(&str, c_int, c_int, Check)] = &[
    ("cuMemcpyAsync", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemcpyPeerAsync", 0, c_int::MAX, Check::Arg(5)),
    ("cuMemcpyHtoDAsync", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemcpyDtoHAsync", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemcpyDtoDAsync", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemcpyHtoAAsync", 0, c_int::MAX, Check::Arg(4)),
    ("cuMemcpyAtoHAsync", 0, c_int::MAX, Check::Arg(4)),
    ("cuMemcpy2DAsync", 0, c_int::MAX, Check::Arg(1)),
    ("cuMemcpy3DAsync", 0, c_int::MAX, Check::Arg(1)),
    ("cuMemcpy3DPeerAsync", 0, c_int::MAX, Check::Arg(1)),
    ("cuMemcpyBatchAsync", 0, c_int::MAX, Check::Always),
    ("cuMemcpy3DBatchAsync", 0, c_int::MAX, Check::Always),
    ("cuMemcpyWithAttributesAsync", 0, c_int::MAX, Check::Always),
    (
        "cuMemcpy3DWithAttributesAsync",
        0,
        c_int::MAX,
        Check::Always,
    ),
    ("cuMemsetD8Async", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemsetD16Async", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemsetD32Async", 0, c_int::MAX, Check::Arg(3)),
    ("cuMemsetD2D8Async", 0, c_int::MAX, Check::Arg(5)),
    ("cuMemsetD2D16Async", 0, c_int::MAX, Check::Arg(5)),
    ("cuMemsetD2D32Async", 0, c_int::MAX, Check::Arg(5)),
    (
        "cuSignalExternalSemaphoresAsync",
        0,
        c_int::MAX,
        Check::Arg(3),
    ),
    (
        "cuWaitExternalSemaphoresAsync",
        0,
        c_int::MAX,
        Check::Arg(3),
    ),
    ("cuLaunchKernel", 0, c_int::MAX, Check::Arg(8)),
    ("cuLaunchCooperativeKernel", 0, c_int::MAX, Check::Arg(8)),
    ("cuLaunchKernelEx", 0, c_int::MAX, Check::Field0(32)),
    ("cuLaunchHostFunc", 0, c_int::MAX, Check::Arg(0)),
    ("cuLaunchGridAsync", 0, c_int::MAX, Check::Arg(3)),
    // The stream is in an array of launch parameters.
    (
        "cuLaunchCooperativeKernelMultiDevice",
        0,
        c_int::MAX,
        Check::Always,
    ),
    ("cuMemMapArrayAsync", 0, c_int::MAX, Check::Arg(2)),
    ("cuMemBatchDecompressAsync", 0, c_int::MAX, Check::Arg(4)),
    // The stream is passed by pointer.
    (
        "cuEGLStreamConsumerAcquireFrame",
        0,
        c_int::MAX,
        Check::Always,
    ),
    (
        "cuEGLStreamConsumerReleaseFrame",
        0,
        c_int::MAX,
        Check::Always,
    ),
    (
        "cuEGLStreamProducerPresentFrame",
        0,
        c_int::MAX,
        Check::Always,
    ),
    (
        "cuEGLStreamProducerReturnFrame",
        0,
        c_int::MAX,
        Check::Always,
    ),
    ("cuEventRecord", 0, c_int::MAX, Check::Arg(1)),
    ("cuEventRecordWithFlags", 0, c_int::MAX, Check::Arg(1)),
    ("cuStreamWaitValue32", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamWriteValue32", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamWaitValue64", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamWriteValue64", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamBatchMemOp", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamWaitEvent", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamAddCallback", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamSynchronize", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamQuery", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamAttachMemAsync", 0, c_int::MAX, Check::Arg(0)),
    ("cuGLMapBufferObjectAsync", 0, c_int::MAX, Check::Arg(3)),
    ("cuGLUnmapBufferObjectAsync", 0, c_int::MAX, Check::Arg(1)),
    ("cuGraphicsMapResources", 0, c_int::MAX, Check::Arg(2)),
    ("cuGraphicsUnmapResources", 0, c_int::MAX, Check::Arg(2)),
    ("cuMemPrefetchAsync", 0, 12020, Check::Arg(3)),
    ("cuMemPrefetchAsync", 12020, c_int::MAX, Check::Arg(4)),
    ("cuMemPrefetchBatchAsync", 0, c_int::MAX, Check::Always),
    ("cuMemDiscardBatchAsync", 0, c_int::MAX, Check::Always),
    (
        "cuMemDiscardAndPrefetchBatchAsync",
        0,
        c_int::MAX,
        Check::Always,
    ),
    ("cuGraphUpload", 0, c_int::MAX, Check::Arg(1)),
    ("cuGraphLaunch", 0, c_int::MAX, Check::Arg(1)),
    (
        "cuGraphInstantiateWithParams",
        0,
        c_int::MAX,
        Check::Field2(8),
    ),
    ("cuStreamBeginCapture", 0, 10010, Check::Arg(0)),
    ("cuStreamBeginCaptureToGraph", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamIsCapturing", 0, c_int::MAX, Check::Arg(0)),
    ("cuStreamGetCaptureInfo", 0, c_int::MAX, Check::Arg(0)),
    (
        "cuStreamUpdateCaptureDependencies",
        0,
        c_int::MAX,
        Check::Arg(0),
    ),
];

#[cfg(target_arch = "x86_64")]
mod pools;
#[cfg(target_arch = "x86_64")]
mod stubs;
#[cfg(target_arch = "x86_64")]
pub use stubs::by_symbol as runtime_hook;
#[cfg(target_arch = "x86_64")]
pub use stubs::driver_by_symbol as driver_hook;
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use stubs::driver_slots;

/// Without stubs there are no runtime stubs to hand out.
#[cfg(not(target_arch = "x86_64"))]
pub fn runtime_hook(_: &[u8]) -> Option<crate::real::driver::Hook> {
    None
}

/// Without stubs there are no driver stubs to hand out.
#[cfg(not(target_arch = "x86_64"))]
pub fn driver_hook(_: &[u8]) -> Option<crate::real::driver::Hook> {
    None
}

/// The stub to hand out for the driver function at `got`, named `base` and asked at
/// `version` with `flags`, that the shim does not otherwise hook; `None` to hand out `got`
/// itself (not stream-taking, or no stubs on this architecture).
pub fn driver_stub(base: &[u8], version: c_int, flags: u64, got: usize) -> Option<usize> {
    if got == 0 {
        return None;
    }
    let per_thread = flags & 2 != 0 || (flags & 1 == 0 && is_per_thread_fn(base, got));
    let check = if per_thread {
        Check::Always
    } else {
        let name = std::str::from_utf8(base).ok()?;
        DRIVER
            .iter()
            .find(|(n, from, below, _)| *n == name && (*from..*below).contains(&version))
            .map(|e| e.3)?
    };
    stub_for(check, got)
}

/// Whether `got` is the driver's per-thread variant of `base` (a default-mode answer). Only
/// the families that have per-thread variants are looked up (start-up cost).
fn is_per_thread_fn(base: &[u8], got: usize) -> bool {
    let Ok(base) = std::str::from_utf8(base) else {
        return false;
    };
    const FAMILIES: [&str; 9] = [
        "cuMemcpy",
        "cuMemset",
        "cuStream",
        "cuEvent",
        "cuLaunch",
        "cuGraph",
        "cuMemAlloc",
        "cuMemFree",
        "cuMemPrefetch",
    ];
    if !FAMILIES.iter().any(|f| base.starts_with(f)) && !DRIVER.iter().any(|e| e.0 == base) {
        return false;
    }
    ["_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds"]
        .iter()
        .any(|tail| {
            let Ok(name) = std::ffi::CString::new(format!("{base}{tail}")) else {
                return false;
            };
            // SAFETY: a pseudo-handle and a NUL-terminated name.
            let p = unsafe { crate::real::driver::real_dlsym(libc::RTLD_NEXT, name.as_ptr()) };
            p as usize == got
        })
}

/// The stub for a function looked up by exact symbol `name` on a library handle (`dlsym`):
/// a per-thread variant gets a counting stub; `None` for every other name.
pub fn dlsym_stub(name: &[u8], got: usize) -> Option<usize> {
    if got == 0 || !(name.ends_with(b"_ptsz") || name.ends_with(b"_ptds")) {
        return None;
    }
    if !name.starts_with(b"cu") {
        return None;
    }
    stub_for(Check::Always, got)
}

/// A stub running `check` then jumping to `got`: one already made for `got`, else a free
/// one. With none left, the use is counted now (when in doubt, order) and `None` returned;
/// without stubs (not x86-64) `None`: [`apply`] counted it at start.
fn stub_for(check: Check, got: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(s) = pools::take(check, got) {
            return Some(s);
        }
        mark();
    }
    let _ = (check, got);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in address per request, the same for the same request in every list.
    fn fake(name: &str, version: c_int, flags: u64) -> usize {
        let h = name
            .bytes()
            .chain(version.to_le_bytes())
            .chain(flags.to_le_bytes())
            .fold(1469598103934665603u64, |h, b| {
                (h ^ b as u64).wrapping_mul(1099511628211)
            });
        (h as usize | 1) & 0x7fff_ffff_ffff
    }

    #[test]
    fn every_per_thread_entry_point_nvidias_runtimes_ask_for_gets_a_stub_and_none_counts_as_used() {
        for version in ["12.9", "13.2", "13.5"] {
            let path = format!(
                "{}/../tests/data/cudart-{version}-static-getprocaddress.txt",
                env!("CARGO_MANIFEST_DIR")
            );
            let text = std::fs::read_to_string(path).expect("the measured request list");
            let mut per_thread = 0;
            for line in text.lines().filter(|l| l.starts_with("cu")) {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (name, v, flags) = (f[0], f[1].parse().expect("v"), f[2].parse().expect("f"));
                let got = fake(name, v, flags);
                let stub = driver_stub(name.as_bytes(), v, flags, got);
                if flags & 2 != 0 {
                    per_thread += 1;
                    assert!(stub.is_some(), "{version}: {name} {v} {flags}");
                }
                if let Some(s) = stub {
                    assert_ne!(s, got);
                    assert_eq!(
                        driver_stub(name.as_bytes(), v, flags, got),
                        Some(s),
                        "the same function gets the same stub"
                    );
                }
            }
            assert!(per_thread > 60, "{version}: {per_thread}");
        }
        assert!(!seen(), "looking them up is not using them");
    }

    #[test]
    fn legacy_entry_points_get_the_check_of_their_abi() {
        assert_eq!(
            DRIVER
                .iter()
                .filter(|e| e.0 == "cuMemPrefetchAsync")
                .map(|e| (e.1, e.2, e.3))
                .collect::<Vec<_>>(),
            [
                (0, 12020, Check::Arg(3)),
                (12020, c_int::MAX, Check::Arg(4))
            ]
        );
        assert!(driver_stub(b"cuMemAlloc", 3020, 0, 0x1234).is_none());
        assert!(driver_stub(b"cuCtxSynchronize", 2000, 0, 0x1234).is_none());
        assert!(driver_stub(b"cuLaunchKernel", 7000, 0, 0x1238).is_some());
    }
}
