//! The one table of the shim's hooked symbols: for each exported symbol, the hook, the real
//! function it forwards to, its layer, and for a driver entry point the `cuGetProcAddress`
//! request it answers (base name, the CUDA version from which that base resolves to this
//! symbol, and which per-thread variant it is). `dlsym` (exact symbols) and
//! `cuGetProcAddress` (base name, version, flags) both read this table, so a new entry point
//! is one row here plus its hook.
//!
//! Adding an entry point: write its hook and its `RealFn` slot next to it in `exports/`, then
//! add one `drv(...)` row (driver: symbol, hook, real slot, the `cuGetProcAddress` base name,
//! the first CUDA version whose requests for that base get this symbol, and `Only`, or
//! `Legacy` / `PTSZ` / `PTSZ_BY_FLAG` for a legacy / per-thread pair) or one `rt(...)` row
//! (runtime export: symbol, hook, `real::runtime::fns` slot).
//!
//! Invariants: symbols are matched exactly (no prefixes, no other versions); for one base
//! name the row with the highest version not above the request's wins, and a pair of
//! legacy / per-thread (`_ptsz`) rows of one version is chosen between by the request's
//! flags (and, where `follows_driver`, by which of the two the driver answered with in
//! default mode). Only the symbol lookup reads it: never a hot path.

use std::ffi::c_int;

use crate::exports::lasterror;
use crate::exports::{address, capture, driver, families, ipc, peer, runtime, stream, vmm};
use crate::ffi::intercept::Layer;
use crate::lookup::procaddr;
use crate::real::driver::RealFn;
use crate::real::runtime::fns;
use crate::real::slots;

pub use crate::real::driver::Hook;

/// Which function of a legacy / per-thread pair a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// No per-thread twin.
    Only,
    /// The legacy-stream function of a pair.
    Legacy,
    /// The per-thread default stream function (`_ptsz`) of a pair; `follows_driver`: in
    /// default mode (neither flag) the request keeps the variant the driver answered with,
    /// else it gets the legacy one.
    PerThread { follows_driver: bool },
}

/// What `cuGetProcAddress` request a row answers.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// The base name asked for (`cuMemAlloc` for `cuMemAlloc_v2`).
    pub base: &'static [u8],
    /// The first CUDA version whose requests for `base` resolve to this row.
    pub since: c_int,
    pub variant: Variant,
}

/// One hooked symbol.
pub struct Row {
    /// The exported name.
    pub symbol: &'static [u8],
    /// The shim's function exported under it.
    hook: *const (),
    /// The real function it forwards to.
    pub real: &'static RealFn,
    pub layer: Layer,
    /// The `cuGetProcAddress` request it answers (`None`: runtime exports).
    pub request: Option<Request>,
}

// SAFETY: `hook` is the address of a function (immutable code), only read as a number.
unsafe impl Sync for Row {}

impl Row {
    /// The hook and its real function.
    pub fn hook(&self) -> Hook {
        Hook {
            hook: self.hook as usize,
            real: self.real,
        }
    }
}

const fn drv(
    symbol: &'static [u8],
    hook: *const (),
    real: &'static RealFn,
    base: &'static [u8],
    since: c_int,
    variant: Variant,
) -> Row {
    Row {
        symbol,
        hook,
        real,
        layer: Layer::Driver,
        request: Some(Request {
            base,
            since,
            variant,
        }),
    }
}

const fn rt(symbol: &'static [u8], hook: *const (), real: &'static RealFn) -> Row {
    Row {
        symbol,
        hook,
        real,
        layer: Layer::Runtime,
        request: None,
    }
}

use Variant::{Legacy, Only};
const PTSZ: Variant = Variant::PerThread {
    follows_driver: true,
};
const PTSZ_BY_FLAG: Variant = Variant::PerThread {
    follows_driver: false,
};

/// Every hooked symbol, one row each (kept one line a row so a new entry point is one line).
#[rustfmt::skip]
pub static ROWS: &[Row] = &[
    // Driver allocation and stream hooks (`exports/driver.rs`, `exports/capture.rs`).
    drv(b"cuMemAlloc_v2", driver::cuMemAlloc_v2 as *const (), &slots::REAL_MEM_ALLOC, b"cuMemAlloc", 3020, Only),
    drv(b"cuMemFree_v2", driver::cuMemFree_v2 as *const (), &slots::REAL_MEM_FREE, b"cuMemFree", 3020, Only),
    drv(b"cuMemAllocHost_v2", driver::cuMemAllocHost_v2 as *const (), &slots::REAL_MEM_ALLOC_HOST, b"cuMemAllocHost", 3020, Only),
    drv(b"cuMemHostAlloc", driver::cuMemHostAlloc as *const (), &slots::REAL_MEM_HOST_ALLOC, b"cuMemHostAlloc", 2020, Only),
    drv(b"cuMemFreeHost", driver::cuMemFreeHost as *const (), &slots::REAL_MEM_FREE_HOST, b"cuMemFreeHost", 2000, Only),
    drv(b"cuMemGetInfo_v2", driver::cuMemGetInfo_v2 as *const (), &slots::REAL_MEM_GET_INFO, b"cuMemGetInfo", 3020, Only),
    drv(b"cuMemAllocAsync", driver::cuMemAllocAsync as *const (), &slots::REAL_MEM_ALLOC_ASYNC, b"cuMemAllocAsync", 11020, Legacy),
    drv(b"cuMemAllocAsync_ptsz", driver::cuMemAllocAsync_ptsz as *const (), &slots::REAL_MEM_ALLOC_ASYNC_PTSZ, b"cuMemAllocAsync", 11020, PTSZ),
    drv(b"cuMemFreeAsync", driver::cuMemFreeAsync as *const (), &slots::REAL_MEM_FREE_ASYNC, b"cuMemFreeAsync", 11020, Legacy),
    drv(b"cuMemFreeAsync_ptsz", driver::cuMemFreeAsync_ptsz as *const (), &slots::REAL_MEM_FREE_ASYNC_PTSZ, b"cuMemFreeAsync", 11020, PTSZ),
    drv(b"cuStreamCreate", driver::cuStreamCreate as *const (), &slots::REAL_STREAM_CREATE, b"cuStreamCreate", 2000, Only),
    drv(b"cuStreamCreateWithPriority", driver::cuStreamCreateWithPriority as *const (), &slots::REAL_STREAM_CREATE_PRIO, b"cuStreamCreateWithPriority", 5050, Only),
    drv(b"cuStreamDestroy_v2", driver::cuStreamDestroy_v2 as *const (), &slots::REAL_STREAM_DESTROY, b"cuStreamDestroy", 4000, Only),
    drv(b"cuStreamBeginCapture_v2", capture::cuStreamBeginCapture_v2 as *const (), &capture::REAL_BEGIN_CAPTURE, b"cuStreamBeginCapture", 10010, Legacy),
    drv(b"cuStreamBeginCapture_v2_ptsz", capture::cuStreamBeginCapture_v2_ptsz as *const (), &capture::REAL_BEGIN_CAPTURE_PTSZ, b"cuStreamBeginCapture", 10010, PTSZ),
    drv(b"cuStreamEndCapture", capture::cuStreamEndCapture as *const (), &capture::REAL_END_CAPTURE, b"cuStreamEndCapture", 10000, Legacy),
    drv(b"cuStreamEndCapture_ptsz", capture::cuStreamEndCapture_ptsz as *const (), &capture::REAL_END_CAPTURE_PTSZ, b"cuStreamEndCapture", 10000, PTSZ),
    // Address queries (`exports/address.rs`).
    drv(b"cuMemGetAddressRange_v2", address::cuMemGetAddressRange_v2 as *const (), &address::REAL_GET_ADDRESS_RANGE, b"cuMemGetAddressRange", 3020, Only),
    drv(b"cuPointerGetAttribute", address::cuPointerGetAttribute as *const (), &address::REAL_POINTER_GET_ATTRIBUTE, b"cuPointerGetAttribute", 4000, Only),
    drv(b"cuPointerGetAttributes", address::cuPointerGetAttributes as *const (), &address::REAL_POINTER_GET_ATTRIBUTES, b"cuPointerGetAttributes", 7000, Only),
    // IPC (`exports/ipc.rs`).
    drv(b"cuIpcGetMemHandle", ipc::cuIpcGetMemHandle as *const (), &ipc::REAL_GET, b"cuIpcGetMemHandle", 4010, Only),
    drv(b"cuIpcOpenMemHandle", ipc::cuIpcOpenMemHandle as *const (), &ipc::REAL_OPEN, b"cuIpcOpenMemHandle", 4010, Only),
    drv(b"cuIpcOpenMemHandle_v2", ipc::cuIpcOpenMemHandle_v2 as *const (), &ipc::REAL_OPEN_V2, b"cuIpcOpenMemHandle", 11000, Only),
    drv(b"cuIpcCloseMemHandle", ipc::cuIpcCloseMemHandle as *const (), &ipc::REAL_CLOSE, b"cuIpcCloseMemHandle", 4010, Only),
    // The families the cache does not serve (`exports/vmm.rs`).
    drv(b"cuMemCreate", vmm::cuMemCreate as *const (), &vmm::REAL_MEM_CREATE, b"cuMemCreate", 10020, Only),
    drv(b"cuMemRelease", vmm::cuMemRelease as *const (), &vmm::REAL_MEM_RELEASE, b"cuMemRelease", 10020, Only),
    drv(b"cuMemMap", vmm::cuMemMap as *const (), &vmm::REAL_MEM_MAP, b"cuMemMap", 10020, Only),
    drv(b"cuMemUnmap", vmm::cuMemUnmap as *const (), &vmm::REAL_MEM_UNMAP, b"cuMemUnmap", 10020, Only),
    drv(b"cuMemAddressReserve", vmm::cuMemAddressReserve as *const (), &vmm::REAL_ADDRESS_RESERVE, b"cuMemAddressReserve", 10020, Only),
    drv(b"cuMemAddressFree", vmm::cuMemAddressFree as *const (), &vmm::REAL_ADDRESS_FREE, b"cuMemAddressFree", 10020, Only),
    drv(b"cuMemAllocManaged", vmm::cuMemAllocManaged as *const (), &vmm::REAL_ALLOC_MANAGED, b"cuMemAllocManaged", 6000, Only),
    drv(b"cuMemAllocPitch_v2", vmm::cuMemAllocPitch_v2 as *const (), &vmm::REAL_ALLOC_PITCH, b"cuMemAllocPitch", 3020, Only),
    drv(b"cuMemAllocFromPoolAsync", vmm::cuMemAllocFromPoolAsync as *const (), &vmm::REAL_ALLOC_FROM_POOL, b"cuMemAllocFromPoolAsync", 11020, Legacy),
    drv(b"cuMemAllocFromPoolAsync_ptsz", vmm::cuMemAllocFromPoolAsync_ptsz as *const (), &vmm::REAL_ALLOC_FROM_POOL_PTSZ, b"cuMemAllocFromPoolAsync", 11020, PTSZ_BY_FLAG),
    drv(b"cuMemHostRegister_v2", vmm::cuMemHostRegister_v2 as *const (), &vmm::REAL_HOST_REGISTER, b"cuMemHostRegister", 6050, Only),
    drv(b"cuMemHostUnregister", vmm::cuMemHostUnregister as *const (), &vmm::REAL_HOST_UNREGISTER, b"cuMemHostUnregister", 4000, Only),
    // Peer access (`exports/peer.rs`).
    drv(b"cuCtxEnablePeerAccess", peer::cuCtxEnablePeerAccess as *const (), &peer::REAL_ENABLE, b"cuCtxEnablePeerAccess", 4000, Only),
    drv(b"cuCtxDisablePeerAccess", peer::cuCtxDisablePeerAccess as *const (), &peer::REAL_DISABLE, b"cuCtxDisablePeerAccess", 4000, Only),
    // The lookup itself (`lookup/procaddr.rs`).
    drv(b"cuGetProcAddress", procaddr::cuGetProcAddress as *const (), &procaddr::REAL_GPA, b"cuGetProcAddress", 11030, Only),
    drv(b"cuGetProcAddress_v2", procaddr::cuGetProcAddress_v2 as *const (), &procaddr::REAL_GPA_V2, b"cuGetProcAddress", 12000, Only),
    // Runtime exports, for a `dlsym` on a runtime handle (`exports/runtime.rs`, ...).
    rt(b"cudaMalloc", runtime::cudaMalloc as *const (), &fns::cudaMalloc),
    rt(b"cudaMallocAsync", runtime::cudaMallocAsync as *const (), &fns::cudaMallocAsync),
    rt(b"cudaFree", runtime::cudaFree as *const (), &fns::cudaFree),
    rt(b"cudaFreeAsync", runtime::cudaFreeAsync as *const (), &fns::cudaFreeAsync),
    rt(b"cudaMallocAsync_ptsz", runtime::cudaMallocAsync_ptsz as *const (), &fns::cudaMallocAsync_ptsz),
    rt(b"cudaFreeAsync_ptsz", runtime::cudaFreeAsync_ptsz as *const (), &fns::cudaFreeAsync_ptsz),
    rt(b"cudaMallocFromPoolAsync_ptsz", families::cudaMallocFromPoolAsync_ptsz as *const (), &fns::cudaMallocFromPoolAsync_ptsz),
    rt(b"cudaMallocHost", runtime::cudaMallocHost as *const (), &fns::cudaMallocHost),
    rt(b"cudaHostAlloc", runtime::cudaHostAlloc as *const (), &fns::cudaHostAlloc),
    rt(b"cudaFreeHost", runtime::cudaFreeHost as *const (), &fns::cudaFreeHost),
    rt(b"cudaMemGetInfo", runtime::cudaMemGetInfo as *const (), &fns::cudaMemGetInfo),
    rt(b"cudaStreamCreate", stream::cudaStreamCreate as *const (), &fns::cudaStreamCreate),
    rt(b"cudaStreamCreateWithFlags", stream::cudaStreamCreateWithFlags as *const (), &fns::cudaStreamCreateWithFlags),
    rt(b"cudaStreamCreateWithPriority", stream::cudaStreamCreateWithPriority as *const (), &fns::cudaStreamCreateWithPriority),
    rt(b"cudaStreamDestroy", stream::cudaStreamDestroy as *const (), &fns::cudaStreamDestroy),
    rt(b"cudaDeviceReset", stream::cudaDeviceReset as *const (), &fns::cudaDeviceReset),
    rt(b"cudaGetLastError", lasterror::cudaGetLastError as *const (), &fns::cudaGetLastError),
    rt(b"cudaPeekAtLastError", lasterror::cudaPeekAtLastError as *const (), &fns::cudaPeekAtLastError),
    rt(b"cudaIpcGetMemHandle", ipc::cudaIpcGetMemHandle as *const (), &fns::cudaIpcGetMemHandle),
    rt(b"cudaIpcOpenMemHandle", ipc::cudaIpcOpenMemHandle as *const (), &fns::cudaIpcOpenMemHandle),
    rt(b"cudaIpcCloseMemHandle", ipc::cudaIpcCloseMemHandle as *const (), &fns::cudaIpcCloseMemHandle),
    rt(b"cudaDeviceEnablePeerAccess", peer::cudaDeviceEnablePeerAccess as *const (), &fns::cudaDeviceEnablePeerAccess),
    rt(b"cudaDeviceDisablePeerAccess", peer::cudaDeviceDisablePeerAccess as *const (), &fns::cudaDeviceDisablePeerAccess),
];

/// The row exported under exactly `name`.
pub fn row(name: &[u8]) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.symbol == name)
}

/// The hook exported under exactly `name`, with the real function it stands for.
pub fn by_symbol(name: &[u8]) -> Option<Hook> {
    row(name).map(Row::hook)
}

/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM`.
pub const LEGACY_FLAG: u64 = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_FLAG: u64 = 2;

/// The hooked symbol a `cuGetProcAddress` request for `base` at `version` with `flags`
/// resolves to, given that the driver answered `got`; `None` when the request is not one the
/// shim substitutes.
pub fn hooked_symbol(base: &[u8], version: c_int, flags: u64, got: usize) -> Option<&'static [u8]> {
    let rows = || {
        ROWS.iter()
            .filter_map(|r| r.request.map(|q| (r, q)))
            .filter(move |(_, q)| q.base == base && q.since <= version)
    };
    let since = rows().map(|(_, q)| q.since).max()?;
    let mut legacy = None;
    let mut per_thread = None;
    for (r, q) in rows().filter(|(_, q)| q.since == since) {
        match q.variant {
            Variant::Only => return Some(r.symbol),
            Variant::Legacy => legacy = Some(r),
            Variant::PerThread { follows_driver } => per_thread = Some((r, follows_driver)),
        }
    }
    let (legacy, (per_thread, follows_driver)) = (legacy?, per_thread?);
    let pick = if flags & PER_THREAD_FLAG != 0 {
        per_thread
    } else if flags & LEGACY_FLAG != 0 || !follows_driver {
        legacy
    } else if per_thread.real.get() == Some(got) {
        // Default mode: the driver chose; keep the variant it answered with.
        per_thread
    } else {
        legacy
    };
    Some(pick.symbol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn no_per_thread_driver_stub_is_also_a_hook_of_the_table() {
        // A name is either hooked here or watched by a per-thread stub, never both: the two
        // would each claim the lookup of that name.
        let slots = crate::per_thread::driver_slots();
        assert!(slots.len() > 100);
        for s in slots {
            let name = s.real.name().to_bytes();
            assert!(row(name).is_none(), "{name:?} is both");
        }
    }

    #[test]
    fn only_exact_exported_names_have_hooks() {
        for n in [
            "cuMemAlloc_v2",
            "cuMemFreeAsync_ptsz",
            "cuStreamDestroy_v2",
            "cudaMalloc",
            "cudaFreeHost",
            "cudaGetLastError",
            "cudaDeviceReset",
        ] {
            let h = by_symbol(n.as_bytes()).expect(n);
            assert_eq!(h.real.name().to_bytes(), n.as_bytes());
        }
        for n in [
            "cuMemAlloc",
            "cuMemAlloc_v",
            "cuMemAlloc_v2x",
            "cuMemAllocPitch",
            "cuStreamDestroy",
            "cudnnCreate",
            "cudaMalloc_v2",
            "cudaMallocManaged",
            "cudaMallocPitch",
            "cudaMemcpy",
            "cuda",
            "",
        ] {
            assert!(by_symbol(n.as_bytes()).is_none(), "{n}");
        }
    }

    #[test]
    fn every_row_is_one_symbol_named_like_its_real_function() {
        for (i, r) in ROWS.iter().enumerate() {
            assert_eq!(r.real.name().to_bytes(), r.symbol);
            assert!(ROWS[..i].iter().all(|o| o.symbol != r.symbol));
            assert_eq!(r.request.is_some(), r.layer == Layer::Driver);
        }
    }
}
