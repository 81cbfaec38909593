//! Virtual memory management that really maps: reservations are `PROT_NONE` address ranges,
//! physical allocations are memfds charged to their device, `cuMemMap` maps a memfd
//! `MAP_FIXED` (still inaccessible), `cuMemSetAccess` `mprotect`s it, `cuMemUnmap` puts
//! `PROT_NONE` anonymous memory back so touching the range faults. Granularity 2 MiB.
//! Invariant: every mapping lies inside one reservation and never overlaps another; a
//! physical allocation's bytes stay charged until it is both released and unmapped everywhere.

use crate::error::*;
use crate::state::{device, Device};
use crate::types::{MemAccessDesc, MemAllocationProp};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

/// Minimum and recommended granularity.
pub const GRANULARITY: usize = 2 << 20;

const ALLOCATION_TYPE_PINNED: i32 = 1;
const LOCATION_TYPE_DEVICE: i32 = 1;

struct Mapping {
    size: usize,
    handle: u64,
    device: usize,
    /// Protection per granule.
    prot: Vec<i32>,
}

struct Reservation {
    size: usize,
    device: usize,
    mappings: BTreeMap<usize, Mapping>,
}

struct Physical {
    fd: OwnedFd,
    size: usize,
    device: usize,
    maps: usize,
    released: bool,
}

#[derive(Default)]
struct Vmm {
    reservations: BTreeMap<usize, Reservation>,
    handles: HashMap<u64, Physical>,
    next_handle: u64,
}

static VMM: Lazy<Mutex<Vmm>> = Lazy::new(|| {
    Mutex::new(Vmm {
        next_handle: 0x1000,
        ..Vmm::default()
    })
});

fn supported() -> Result<(), CUresult> {
    if crate::state::state()?.config.vmm {
        Ok(())
    } else {
        Err(NOT_SUPPORTED)
    }
}

fn aligned(x: usize) -> bool {
    x % GRANULARITY == 0
}

/// Put inaccessible, unbacked memory over `[addr, addr + len)`.
fn blank(addr: usize, len: usize) -> Result<(), CUresult> {
    // SAFETY: the range is inside a reservation simcuda owns; replacing it is what unmapping
    // means.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(OUT_OF_MEMORY);
    }
    Ok(())
}

fn validate_prop(prop: *const MemAllocationProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL pointer to the caller's CUmemAllocationProp.
    let p = unsafe { &*prop };
    if p.type_ != ALLOCATION_TYPE_PINNED || p.location.type_ != LOCATION_TYPE_DEVICE {
        return Err(INVALID_VALUE);
    }
    let d = device(usize::try_from(p.location.id).map_err(|_| INVALID_DEVICE)?)?;
    Ok(d.ordinal)
}

/// `cuMemGetAllocationGranularity`.
pub fn granularity(prop: *const MemAllocationProp, option: u32) -> Result<usize, CUresult> {
    validate_prop(prop)?;
    if option > 1 {
        return Err(INVALID_VALUE);
    }
    Ok(GRANULARITY)
}

/// `cuMemAddressReserve`.
pub fn reserve(
    d: &Device,
    size: usize,
    alignment: usize,
    hint: usize,
    flags: u64,
) -> Result<usize, CUresult> {
    supported()?;
    if size == 0 || !aligned(size) || flags != 0 || (alignment != 0 && !alignment.is_power_of_two())
    {
        return Err(INVALID_VALUE);
    }
    let align = alignment.max(GRANULARITY);
    let total = size.checked_add(align).ok_or(OUT_OF_MEMORY)?;
    // SAFETY: a fresh anonymous PROT_NONE mapping at a kernel-chosen address (the hint is
    // only a hint, as in CUDA).
    let p = unsafe {
        libc::mmap(
            hint as *mut libc::c_void,
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(OUT_OF_MEMORY);
    }
    let raw = p as usize;
    let base = (raw + align - 1) & !(align - 1);
    // SAFETY: trimming the unaligned head and the tail of the mapping made just above.
    unsafe {
        if base > raw {
            libc::munmap(raw as *mut libc::c_void, base - raw);
        }
        let end = base + size;
        if raw + total > end {
            libc::munmap(end as *mut libc::c_void, raw + total - end);
        }
    }
    VMM.lock().reservations.insert(
        base,
        Reservation {
            size,
            device: d.ordinal,
            mappings: BTreeMap::new(),
        },
    );
    d.ledger.live_reservations.fetch_add(1, Ordering::Relaxed);
    Ok(base)
}

/// `cuMemAddressFree`: exactly a reservation; mappings still in it are unmapped.
pub fn address_free(ptr: usize, size: usize) -> Result<(), CUresult> {
    let mut v = VMM.lock();
    match v.reservations.get(&ptr) {
        Some(r) if r.size == size => {}
        _ => return Err(INVALID_VALUE),
    }
    let r = v.reservations.remove(&ptr).ok_or(INVALID_VALUE)?;
    for m in r.mappings.values() {
        unmapped(&mut v, m.handle);
    }
    // SAFETY: the whole reservation is ours and no longer recorded anywhere.
    unsafe { libc::munmap(ptr as *mut libc::c_void, size) };
    if let Ok(d) = device(r.device) {
        d.ledger.live_reservations.fetch_sub(1, Ordering::Relaxed);
    }
    Ok(())
}

fn unmapped(v: &mut Vmm, handle: u64) {
    let free = match v.handles.get_mut(&handle) {
        Some(p) => {
            p.maps -= 1;
            p.released && p.maps == 0
        }
        None => false,
    };
    if free {
        if let Some(p) = v.handles.remove(&handle) {
            if let Ok(d) = device(p.device) {
                d.ledger.release(p.size as u64);
            }
        }
    }
}

/// `cuMemCreate`.
pub fn create(size: usize, prop: *const MemAllocationProp, flags: u64) -> Result<u64, CUresult> {
    supported()?;
    let dev = validate_prop(prop)?;
    if size == 0 || !aligned(size) || flags != 0 {
        return Err(INVALID_VALUE);
    }
    let d = device(dev)?;
    if !d.ledger.try_charge(size as u64) {
        return Err(OUT_OF_MEMORY);
    }
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"simcuda-physical".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        d.ledger.release(size as u64);
        return Err(OUT_OF_MEMORY);
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: resizing our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        d.ledger.release(size as u64);
        return Err(OUT_OF_MEMORY);
    }
    let mut v = VMM.lock();
    let h = v.next_handle;
    v.next_handle += 1;
    v.handles.insert(
        h,
        Physical {
            fd,
            size,
            device: dev,
            maps: 0,
            released: false,
        },
    );
    d.ledger
        .live_physical_handles
        .fetch_add(1, Ordering::Relaxed);
    Ok(h)
}

/// `cuMemRelease`: the handle dies now; the memory when its last mapping goes.
pub fn release(handle: u64) -> Result<(), CUresult> {
    let mut v = VMM.lock();
    let p = v
        .handles
        .get_mut(&handle)
        .filter(|p| !p.released)
        .ok_or(INVALID_VALUE)?;
    p.released = true;
    let (dev, size, maps) = (p.device, p.size, p.maps);
    if maps == 0 {
        v.handles.remove(&handle);
    }
    drop(v);
    if let Ok(d) = device(dev) {
        d.ledger
            .live_physical_handles
            .fetch_sub(1, Ordering::Relaxed);
        if maps == 0 {
            d.ledger.release(size as u64);
        }
    }
    Ok(())
}

fn reservation_of(v: &mut Vmm, ptr: usize, size: usize) -> Result<&mut Reservation, CUresult> {
    let (&base, r) = v
        .reservations
        .range_mut(..=ptr)
        .next_back()
        .ok_or(INVALID_VALUE)?;
    let end = ptr.checked_add(size).ok_or(INVALID_VALUE)?;
    if end > base + r.size {
        return Err(INVALID_VALUE);
    }
    Ok(r)
}

/// `cuMemMap`.
pub fn map(
    ptr: usize,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> Result<(), CUresult> {
    if size == 0 || !aligned(ptr) || !aligned(size) || offset != 0 || flags != 0 {
        return Err(INVALID_VALUE);
    }
    let mut v = VMM.lock();
    let (fd, psize, pdev) = match v.handles.get(&handle) {
        Some(p) if !p.released => (p.fd.as_raw_fd(), p.size, p.device),
        _ => return Err(INVALID_VALUE),
    };
    if size > psize {
        return Err(INVALID_VALUE);
    }
    let r = reservation_of(&mut v, ptr, size)?;
    let overlaps = r
        .mappings
        .range(..ptr + size)
        .next_back()
        .is_some_and(|(&a, m)| a + m.size > ptr);
    if overlaps {
        return Err(INVALID_VALUE);
    }
    // SAFETY: [ptr, ptr + size) is an unmapped part of our reservation; the memfd is ours.
    let p = unsafe {
        libc::mmap(
            ptr as *mut libc::c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(OUT_OF_MEMORY);
    }
    r.mappings.insert(
        ptr,
        Mapping {
            size,
            handle,
            device: pdev,
            prot: vec![libc::PROT_NONE; size / GRANULARITY],
        },
    );
    if let Some(p) = v.handles.get_mut(&handle) {
        p.maps += 1;
    }
    Ok(())
}

/// The mappings (start addresses) exactly tiling `[ptr, ptr + size)`, or `INVALID_VALUE`.
fn tiling(r: &Reservation, ptr: usize, size: usize, whole: bool) -> Result<Vec<usize>, CUresult> {
    let end = ptr + size;
    let mut at = ptr;
    let mut out = Vec::new();
    if let Some((&a, m)) = r.mappings.range(..=ptr).next_back() {
        if a < ptr && a + m.size > ptr {
            if whole {
                return Err(INVALID_VALUE);
            }
            out.push(a);
            at = (a + m.size).min(end);
        }
    }
    for (&a, m) in r.mappings.range(at..end) {
        if a != at || (whole && a + m.size > end) {
            return Err(INVALID_VALUE);
        }
        out.push(a);
        at = (a + m.size).min(end);
    }
    if at != end {
        return Err(INVALID_VALUE);
    }
    Ok(out)
}

/// `cuMemUnmap`: the range must be exactly whole mappings.
pub fn unmap(ptr: usize, size: usize) -> Result<(), CUresult> {
    if size == 0 || !aligned(ptr) || !aligned(size) {
        return Err(INVALID_VALUE);
    }
    let mut v = VMM.lock();
    let r = reservation_of(&mut v, ptr, size)?;
    let starts = tiling(r, ptr, size, true)?;
    blank(ptr, size)?;
    let handles: Vec<u64> = starts
        .iter()
        .filter_map(|a| r.mappings.remove(a))
        .map(|m| m.handle)
        .collect();
    for h in handles {
        unmapped(&mut v, h);
    }
    Ok(())
}

/// `cuMemSetAccess`.
pub fn set_access(
    ptr: usize,
    size: usize,
    desc: *const MemAccessDesc,
    count: usize,
) -> Result<(), CUresult> {
    if desc.is_null() || count == 0 || size == 0 || !aligned(ptr) || !aligned(size) {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller passes `count` descriptors at `desc`.
    let descs = unsafe { std::slice::from_raw_parts(desc, count) };
    let mut prot = libc::PROT_NONE;
    for d in descs {
        if d.location.type_ != LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        device(usize::try_from(d.location.id).map_err(|_| INVALID_DEVICE)?)?;
        prot |= match d.flags {
            0 => libc::PROT_NONE,
            1 => libc::PROT_READ,
            3 => libc::PROT_READ | libc::PROT_WRITE,
            _ => return Err(INVALID_VALUE),
        };
    }
    let mut v = VMM.lock();
    let r = reservation_of(&mut v, ptr, size)?;
    let starts = tiling(r, ptr, size, false)?;
    // SAFETY: the range is fully mapped by our own memfd mappings.
    if unsafe { libc::mprotect(ptr as *mut libc::c_void, size, prot) } != 0 {
        return Err(INVALID_VALUE);
    }
    for a in starts {
        if let Some(m) = r.mappings.get_mut(&a) {
            for (i, p) in m.prot.iter_mut().enumerate() {
                let g = a + i * GRANULARITY;
                if g >= ptr && g < ptr + size {
                    *p = prot;
                }
            }
        }
    }
    Ok(())
}

/// The mapping containing `addr`: (start, size).
pub fn mapping_range(addr: usize) -> Option<(usize, usize)> {
    let v = VMM.lock();
    let (&base, r) = v.reservations.range(..=addr).next_back()?;
    if addr >= base + r.size {
        return None;
    }
    let (&a, m) = r.mappings.range(..=addr).next_back()?;
    (addr < a + m.size).then_some((a, m.size))
}

/// If `[addr, addr + len)` is mapped read-write, the device of its memory.
pub fn accessible(addr: usize, len: usize) -> Option<usize> {
    let v = VMM.lock();
    let (&base, r) = v.reservations.range(..=addr).next_back()?;
    let end = addr.checked_add(len.max(1))?;
    if end > base + r.size {
        return None;
    }
    let mut at = addr;
    let mut dev = None;
    let mut iter_from = r
        .mappings
        .range(..=addr)
        .next_back()
        .map_or(addr, |(&a, _)| a);
    while at < end {
        let (&a, m) = r.mappings.range(iter_from..).next()?;
        if a > at || at >= a + m.size {
            return None;
        }
        let first = (at - a) / GRANULARITY;
        let last = (end.min(a + m.size) - 1 - a) / GRANULARITY;
        if m.prot[first..=last]
            .iter()
            .any(|p| *p != libc::PROT_READ | libc::PROT_WRITE)
        {
            return None;
        }
        dev = Some(m.device);
        at = a + m.size;
        iter_from = at;
    }
    dev
}
