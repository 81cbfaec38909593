//! Pinned host memory (`cuMemAllocHost`, `cuMemHostAlloc`, `cudaMallocHost`, `cudaHostAlloc`):
//! page-aligned host allocations with their flags, counted against `SIMCUDA_HOST_MEM_MB`.
//! Invariant: `LIVE` holds exactly the pinned blocks not yet freed, and the host ledger's
//! bytes equal the sum of their sizes.
//!
//! Policy: a block is resident when it is returned, as CUDA's page-locked memory is (the
//! driver pins every page at the allocation): its pages are faulted in at once, in bulk
//! (`MADV_POPULATE_WRITE`, with transparent huge pages asked for blocks of 2 MiB or more,
//! which are 2 MiB aligned), so a first copy into it pays no page faults, as on a GPU.
//! Where the kernel lacks the advice, pages fault in on first use as before.

use crate::error::*;
use crate::state::Ledger;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// `CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED`.
pub const VALID_FLAGS: u32 = 0x7;

static LIVE: Lazy<Mutex<BTreeMap<usize, (usize, u32)>>> = Lazy::new(|| Mutex::new(BTreeMap::new()));

/// The host ledger.
pub static LEDGER: Lazy<Ledger> = Lazy::new(|| {
    let cfg = crate::config::Config::from_env();
    Ledger {
        capacity: cfg.host_mem_bytes,
        ..Ledger::default()
    }
});

/// Allocate `size` (> 0) pinned bytes with `flags`.
pub fn alloc(size: usize, flags: u32) -> Result<usize, CUresult> {
    if flags & !VALID_FLAGS != 0 || size == 0 {
        return Err(INVALID_VALUE);
    }
    if !LEDGER.try_charge(size as u64) {
        return Err(OUT_OF_MEMORY);
    }
    let mut p: *mut libc::c_void = std::ptr::null_mut();
    let align = if size >= HUGE { HUGE } else { 4096 };
    // SAFETY: posix_memalign writes a fresh allocation into `p` or returns an error.
    let rc = unsafe { libc::posix_memalign(&mut p, align, size) };
    if rc != 0 || p.is_null() {
        LEDGER.release(size as u64);
        return Err(OUT_OF_MEMORY);
    }
    make_resident(p as usize, size);
    LIVE.lock().insert(p as usize, (size, flags));
    LEDGER.live_allocations.fetch_add(1, Ordering::Relaxed);
    Ok(p as usize)
}

/// A transparent huge page.
const HUGE: usize = 2 << 20;

/// Fault the whole pages of `[addr, addr + size)` in at once (module policy); advice the
/// kernel refuses changes nothing.
fn make_resident(addr: usize, size: usize) {
    let lo = addr.next_multiple_of(4096);
    let hi = (addr + size) & !4095;
    if hi <= lo {
        return;
    }
    // SAFETY: advice on whole pages of a block we just allocated and own; neither call
    // changes its contents (fresh anonymous memory reads as zero either way).
    unsafe {
        if size >= HUGE {
            libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
        }
        libc::madvise(lo as *mut libc::c_void, hi - lo, MADV_POPULATE_WRITE);
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14), not in every libc's constants.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Free a pinned block; anything else is `INVALID_VALUE`.
pub fn free(addr: usize) -> Result<(), CUresult> {
    let (size, _) = LIVE.lock().remove(&addr).ok_or(INVALID_VALUE)?;
    // SAFETY: `addr` came from posix_memalign above and was just removed from LIVE, so it is
    // freed exactly once.
    unsafe { libc::free(addr as *mut libc::c_void) };
    LEDGER.release(size as u64);
    LEDGER.live_allocations.fetch_sub(1, Ordering::Relaxed);
    Ok(())
}

/// The pinned block containing `addr`: (start, size, flags).
pub fn find(addr: usize) -> Option<(usize, usize, u32)> {
    let live = LIVE.lock();
    let (&a, &(s, f)) = live.range(..=addr).next_back()?;
    (addr < a + s).then_some((a, s, f))
}

/// Whether `[addr, addr + len)` lies inside one pinned block.
pub fn contains(addr: usize, len: usize) -> bool {
    find(addr).is_some_and(|(a, s, _)| addr + len <= a + s)
}
