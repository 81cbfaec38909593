//! Device memory from `cuMemAlloc`: one `MAP_NORESERVE` read-write reservation per device
//! (twice the capacity, so fragmentation never causes a false out-of-memory) carved by a
//! best-fit range allocator into 512-byte aligned blocks. Invariant: free ranges are
//! coalesced and indexed both by address and by (size, address); every byte of the span is
//! in exactly one free range or one live block; capacity is charged on the device ledger.

use crate::error::*;
use crate::state::{device, state, Device};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::Ordering;

/// Allocation granule of `cuMemAlloc`.
pub const ALIGN: usize = 512;
/// Frees at least this large give their pages back to the host.
const DONTNEED_MIN: usize = 1 << 20;

/// One device's address span and its range allocator.
pub struct Heap {
    base: usize,
    span: usize,
    free_by_addr: BTreeMap<usize, usize>,
    free_by_size: BTreeSet<(usize, usize)>,
    live: BTreeMap<usize, usize>,
}

impl Heap {
    /// Reserve `2 * capacity` (at least 2 MiB) of address space.
    pub fn new(capacity: u64) -> io::Result<Heap> {
        let span = usize::try_from(capacity)
            .ok()
            .and_then(|c| c.checked_mul(2))
            .map(|s| s.max(2 << 20))
            .ok_or_else(|| io::Error::other("device capacity too large"))?;
        let align = 2usize << 20;
        // SAFETY: anonymous private mapping at a kernel-chosen address; nothing aliases it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span + align,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw = p as usize;
        let base = (raw + align - 1) & !(align - 1);
        let mut heap = Heap {
            base,
            span,
            free_by_addr: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            live: BTreeMap::new(),
        };
        heap.insert_free(base, span);
        Ok(heap)
    }

    fn insert_free(&mut self, addr: usize, size: usize) {
        self.free_by_addr.insert(addr, size);
        self.free_by_size.insert((size, addr));
    }

    fn remove_free(&mut self, addr: usize, size: usize) {
        self.free_by_addr.remove(&addr);
        self.free_by_size.remove(&(size, addr));
    }

    /// Best-fit allocation of `size` (a multiple of `ALIGN`).
    pub fn alloc(&mut self, size: usize) -> Option<usize> {
        let &(fsize, addr) = self.free_by_size.range((size, 0)..).next()?;
        self.remove_free(addr, fsize);
        if fsize > size {
            self.insert_free(addr + size, fsize - size);
        }
        self.live.insert(addr, size);
        Some(addr)
    }

    /// Free the block starting at `addr`; returns its size, or `None` if no block starts there.
    pub fn free(&mut self, addr: usize) -> Option<usize> {
        let size = self.live.remove(&addr)?;
        crate::ipc::forget(addr);
        if size >= DONTNEED_MIN {
            let page = 4096;
            let start = (addr + page - 1) & !(page - 1);
            let end = (addr + size) & !(page - 1);
            if end > start {
                // SAFETY: [start, end) lies inside our own mapping and inside a block nobody
                // owns any more; dropping its pages only makes later reads see zeros.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
                };
            }
        }
        let (mut a, mut s) = (addr, size);
        if let Some((&pa, &ps)) = self.free_by_addr.range(..addr).next_back() {
            if pa + ps == addr {
                self.remove_free(pa, ps);
                a = pa;
                s += ps;
            }
        }
        if let Some(&ns) = self.free_by_addr.get(&(addr + size)) {
            self.remove_free(addr + size, ns);
            s += ns;
        }
        self.insert_free(a, s);
        Some(size)
    }

    /// The live block containing `addr`: (start, size).
    pub fn find(&self, addr: usize) -> Option<(usize, usize)> {
        if !self.in_span(addr) {
            return None;
        }
        let (&a, &s) = self.live.range(..=addr).next_back()?;
        (addr < a + s).then_some((a, s))
    }

    /// Whether `addr` lies in this heap's address span.
    pub fn in_span(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.span
    }

    /// Free every live block (device reset); returns (blocks, bytes).
    pub fn clear(&mut self) -> (u64, u64) {
        let blocks: Vec<usize> = self.live.keys().copied().collect();
        let mut bytes = 0u64;
        for a in &blocks {
            bytes += self.free(*a).unwrap_or(0) as u64;
        }
        (blocks.len() as u64, bytes)
    }
}

/// Round a request up to the allocation granule.
pub fn round(size: usize) -> Option<usize> {
    size.checked_add(ALIGN - 1).map(|s| s & !(ALIGN - 1))
}

/// Allocate `size` bytes (> 0) on `d`.
pub fn alloc(d: &Device, size: usize) -> Result<usize, CUresult> {
    let size = round(size).ok_or(OUT_OF_MEMORY)?;
    if !d.ledger.try_charge(size as u64) {
        return Err(OUT_OF_MEMORY);
    }
    let got = d.heap.lock().alloc(size);
    match got {
        Some(addr) => {
            d.ledger.live_allocations.fetch_add(1, Ordering::Relaxed);
            Ok(addr)
        }
        None => {
            d.ledger.release(size as u64);
            Err(OUT_OF_MEMORY)
        }
    }
}

/// Free a `cuMemAlloc` block on whichever device holds it; unknown or double free is
/// `INVALID_VALUE`. Synchronises that device first, as the real free does.
pub fn free(addr: usize) -> Result<(), CUresult> {
    let st = state()?;
    let d = st
        .devices
        .iter()
        .find(|d| d.heap.lock().find(addr).is_some_and(|(a, _)| a == addr))
        .ok_or(INVALID_VALUE)?;
    crate::stream::sync_device(d);
    let size = d.heap.lock().free(addr).ok_or(INVALID_VALUE)?;
    d.ledger.release(size as u64);
    d.ledger.live_allocations.fetch_sub(1, Ordering::Relaxed);
    Ok(())
}

/// The `cuMemAlloc` block containing `addr`: (device, start, size).
pub fn find(addr: usize) -> Option<(usize, usize, usize)> {
    let st = state().ok()?;
    st.devices.iter().find_map(|d| {
        let h = d.heap.lock();
        h.find(addr).map(|(a, s)| (d.ordinal, a, s))
    })
}

/// Check that `[addr, addr + len)` is memory the device can touch (a live block, an
/// accessible VMM mapping or pinned host memory); returns the device that owns it, if any.
/// A range in a virtual-memory reservation that is not all mapped read-write is
/// `CUDA_ERROR_ILLEGAL_ADDRESS`, as a kernel or copy engine touching it reports on a GPU.
pub fn check_device_range(addr: usize, len: usize) -> Result<Option<usize>, CUresult> {
    let end = addr.checked_add(len).ok_or(INVALID_VALUE)?;
    if let Some((dev, a, s)) = find(addr) {
        return if end <= a + s {
            Ok(Some(dev))
        } else {
            Err(INVALID_VALUE)
        };
    }
    if let Some(dev) = crate::vmm::accessible(addr, len) {
        return Ok(Some(dev));
    }
    if let Some(dev) = crate::ipc::imported(addr, len) {
        return Ok(Some(dev));
    }
    if crate::host::contains(addr, len) {
        return Ok(None);
    }
    if crate::vmm::reserved(addr, len) {
        return Err(ILLEGAL_ADDRESS);
    }
    Err(INVALID_VALUE)
}

/// Free every block of device `ordinal` (cudaDeviceReset).
pub fn reset(ordinal: usize) -> Result<(), CUresult> {
    let d = device(ordinal)?;
    crate::stream::sync_device(d);
    let (blocks, bytes) = d.heap.lock().clear();
    d.ledger.release(bytes);
    d.ledger
        .live_allocations
        .fetch_sub(blocks, Ordering::Relaxed);
    Ok(())
}
