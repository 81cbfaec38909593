//! Virtual memory management that really maps: reservations are `PROT_NONE` address ranges,
//! physical allocations are memfds charged to their device, `cuMemMap` maps a memfd
//! `MAP_FIXED` (still inaccessible), `cuMemSetAccess` `mprotect`s it, `cuMemUnmap` puts
//! `PROT_NONE` anonymous memory back so touching the range faults. Granularity 2 MiB.
//! Access is kept per device and granule (`cuMemSetAccess` sets the listed devices only, as
//! CUDA does; `cuMemGetAccess` reads one device's); the host protection is the union over
//! devices, so a range is device memory for copies when any device may read and write it;
//! a memset (a kernel of its stream's device) needs that device's write access.
//! A physical allocation counts references (`cuMemCreate`, `cuMemImportFromShareableHandle`
//! and `cuMemRetainAllocationHandle` add one, `cuMemRelease` drops one).
//! Invariant: every mapping lies inside one reservation and never overlaps another; a
//! physical allocation's bytes stay charged until it has no reference and no mapping left.

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
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: i32 = 1;

struct Mapping {
    size: usize,
    handle: u64,
    device: usize,
    /// Per granule: bit `d` of `.0` says device `d` may read, of `.1` that it may write.
    access: Vec<(u64, u64)>,
}

impl Mapping {
    /// The host protection of granule `i`: the union over devices.
    fn prot(&self, i: usize) -> i32 {
        let (r, w) = self.access[i];
        (if r != 0 { libc::PROT_READ } else { 0 }) | (if w != 0 { libc::PROT_WRITE } else { 0 })
    }
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
    /// References the program holds; the handle is dead at zero.
    refs: usize,
    /// `CUmemAllocationHandleType` bits requested at creation.
    handle_types: i32,
    /// Whether `size` is charged to the device (imported memory is the exporter's).
    charged: bool,
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
            p.refs == 0 && p.maps == 0
        }
        None => false,
    };
    if free {
        if let Some(p) = v.handles.remove(&handle) {
            if let (true, Ok(d)) = (p.charged, device(p.device)) {
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
    // The name carries the device, so an importer of the descriptor knows it.
    let name = std::ffi::CString::new(format!("{MEMFD_PREFIX}{dev}")).map_err(|_| INVALID_VALUE)?;
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
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
    // SAFETY: validate_prop checked that `prop` is non-NULL.
    let handle_types = unsafe { (*prop).requested_handle_types };
    Ok(insert(Physical {
        fd,
        size,
        device: dev,
        maps: 0,
        refs: 1,
        handle_types,
        charged: true,
    }))
}

/// Prefix of the memfd names (then the device ordinal).
pub const MEMFD_PREFIX: &str = "simcuda-physical-dev";

/// Record a new physical allocation holding one reference: its handle.
fn insert(p: Physical) -> u64 {
    let dev = p.device;
    let mut v = VMM.lock();
    let h = v.next_handle;
    v.next_handle += 1;
    v.handles.insert(h, p);
    drop(v);
    if let Ok(d) = device(dev) {
        d.ledger
            .live_physical_handles
            .fetch_add(1, Ordering::Relaxed);
    }
    h
}

/// `cuMemExportToShareableHandle` for POSIX descriptors: a new descriptor of the memfd
/// (the caller owns it). Only for allocations created with that handle type, as in CUDA.
pub fn export_fd(handle: u64) -> Result<i32, CUresult> {
    let v = VMM.lock();
    let p = v
        .handles
        .get(&handle)
        .filter(|p| p.refs > 0)
        .ok_or(INVALID_VALUE)?;
    if p.handle_types & HANDLE_TYPE_POSIX_FD == 0 {
        return Err(INVALID_VALUE);
    }
    // SAFETY: duplicating a descriptor we own; the result is checked.
    let fd = unsafe { libc::fcntl(p.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(OUT_OF_MEMORY);
    }
    Ok(fd)
}

/// `cuMemImportFromShareableHandle` for POSIX descriptors: a new handle on the memory of
/// `fd`, which must be a simcuda physical allocation (its device is in its name). The caller
/// keeps `fd`. The memory stays charged to the exporter.
pub fn import_fd(fd: i32) -> Result<u64, CUresult> {
    supported()?;
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|_| INVALID_VALUE)?;
    let link = link.to_string_lossy();
    let dev: usize = link
        .strip_prefix("/memfd:")
        .and_then(|n| n.strip_prefix(MEMFD_PREFIX))
        .and_then(|n| n.split(' ').next())
        .and_then(|n| n.parse().ok())
        .ok_or(INVALID_VALUE)?;
    device(dev)?;
    // SAFETY: fstat into a zeroed stat; the result is checked.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(INVALID_VALUE);
    }
    let size = usize::try_from(st.st_size).map_err(|_| INVALID_VALUE)?;
    if size == 0 || !aligned(size) {
        return Err(INVALID_VALUE);
    }
    // SAFETY: duplicating the caller's descriptor; the result is checked.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(OUT_OF_MEMORY);
    }
    Ok(insert(Physical {
        // SAFETY: `dup` is a fresh descriptor we own.
        fd: unsafe { OwnedFd::from_raw_fd(dup) },
        size,
        device: dev,
        maps: 0,
        refs: 1,
        handle_types: HANDLE_TYPE_POSIX_FD,
        charged: false,
    }))
}

/// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, with one more reference.
pub fn retain(addr: usize) -> Result<u64, CUresult> {
    let mut v = VMM.lock();
    let (&base, r) = v
        .reservations
        .range(..=addr)
        .next_back()
        .ok_or(INVALID_VALUE)?;
    if addr >= base + r.size {
        return Err(INVALID_VALUE);
    }
    let (&a, m) = r.mappings.range(..=addr).next_back().ok_or(INVALID_VALUE)?;
    if addr >= a + m.size {
        return Err(INVALID_VALUE);
    }
    let h = m.handle;
    let p = v.handles.get_mut(&h).ok_or(INVALID_VALUE)?;
    p.refs += 1;
    let dev = p.device;
    drop(v);
    if let Ok(d) = device(dev) {
        d.ledger
            .live_physical_handles
            .fetch_add(1, Ordering::Relaxed);
    }
    Ok(h)
}

/// `cuMemGetAllocationPropertiesFromHandle`: (device, requested handle types).
pub fn properties(handle: u64) -> Result<(usize, i32), CUresult> {
    let v = VMM.lock();
    let p = v
        .handles
        .get(&handle)
        .filter(|p| p.refs > 0)
        .ok_or(INVALID_VALUE)?;
    Ok((p.device, p.handle_types))
}

/// `cuMemGetAccess`: device `dev`'s access to the mapped granule at `addr` (0, 1 or 3).
pub fn get_access(addr: usize, dev: usize) -> Result<u64, CUresult> {
    device(dev)?;
    let v = VMM.lock();
    let (&base, r) = v
        .reservations
        .range(..=addr)
        .next_back()
        .ok_or(INVALID_VALUE)?;
    if addr >= base + r.size {
        return Err(INVALID_VALUE);
    }
    let (&a, m) = r.mappings.range(..=addr).next_back().ok_or(INVALID_VALUE)?;
    if addr >= a + m.size {
        return Err(INVALID_VALUE);
    }
    let (rd, wr) = m.access[(addr - a) / GRANULARITY];
    let bit = 1u64 << dev;
    Ok(match (rd & bit != 0, wr & bit != 0) {
        (true, true) => 3,
        (true, false) => 1,
        _ => 0,
    })
}

/// `cuMemRelease`: drops one reference; the handle dies with its last, the memory when its
/// last mapping goes too.
pub fn release(handle: u64) -> Result<(), CUresult> {
    let mut v = VMM.lock();
    let p = v
        .handles
        .get_mut(&handle)
        .filter(|p| p.refs > 0)
        .ok_or(INVALID_VALUE)?;
    p.refs -= 1;
    let (dev, size, gone, charged) = (p.device, p.size, p.refs == 0 && p.maps == 0, p.charged);
    if gone {
        v.handles.remove(&handle);
    }
    drop(v);
    if let Ok(d) = device(dev) {
        d.ledger
            .live_physical_handles
            .fetch_sub(1, Ordering::Relaxed);
        if gone && charged {
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
        Some(p) if p.refs > 0 => (p.fd.as_raw_fd(), p.size, p.device),
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
            access: vec![(0, 0); size / GRANULARITY],
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
    // (device bit, may read, may write) per descriptor.
    let mut set = Vec::with_capacity(count);
    for d in descs {
        if d.location.type_ != LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        let dev = device(usize::try_from(d.location.id).map_err(|_| INVALID_DEVICE)?)?;
        let (rd, wr) = match d.flags {
            0 => (false, false),
            1 => (true, false),
            3 => (true, true),
            _ => return Err(INVALID_VALUE),
        };
        set.push((1u64 << dev.ordinal, rd, wr));
    }
    let mut v = VMM.lock();
    let r = reservation_of(&mut v, ptr, size)?;
    let starts = tiling(r, ptr, size, false)?;
    for a in starts {
        if let Some(m) = r.mappings.get_mut(&a) {
            for i in 0..m.access.len() {
                let g = a + i * GRANULARITY;
                if g < ptr || g >= ptr + size {
                    continue;
                }
                for &(bit, rd, wr) in &set {
                    let (r, w) = &mut m.access[i];
                    *r = if rd { *r | bit } else { *r & !bit };
                    *w = if wr { *w | bit } else { *w & !bit };
                }
                // SAFETY: the granule is mapped by our own memfd mapping.
                if unsafe { libc::mprotect(g as *mut libc::c_void, GRANULARITY, m.prot(i)) } != 0 {
                    return Err(INVALID_VALUE);
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

/// Whether device `dev` may write all of `[addr, addr + len)`: true outside virtual-memory
/// reservations (other memory is not governed by per-device access here).
pub fn writable_by(addr: usize, len: usize, dev: usize) -> bool {
    let v = VMM.lock();
    let Some((&base, r)) = v.reservations.range(..=addr).next_back() else {
        return true;
    };
    if addr >= base + r.size {
        return true;
    }
    let end = addr.saturating_add(len.max(1));
    let bit = 1u64 << dev.min(63);
    r.mappings
        .range(..end)
        .rev()
        .take_while(|(&a, m)| a + m.size > addr)
        .all(|(&a, m)| {
            let first = addr.saturating_sub(a) / GRANULARITY;
            let last = (end.min(a + m.size) - 1 - a) / GRANULARITY;
            (first..=last).all(|i| m.access[i].1 & bit != 0 && m.access[i].0 & bit != 0)
        })
}

/// Whether any byte of `[addr, addr + len)` lies in a virtual-memory reservation: such an
/// address is device address space even where nothing is mapped, so touching it through a
/// copy or a set is an illegal address on the device, never host memory.
pub fn reserved(addr: usize, len: usize) -> bool {
    let v = VMM.lock();
    let end = addr.saturating_add(len.max(1));
    v.reservations
        .range(..end)
        .next_back()
        .is_some_and(|(&base, r)| base + r.size > addr)
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
        if (first..=last).any(|i| m.prot(i) != libc::PROT_READ | libc::PROT_WRITE) {
            return None;
        }
        dev = Some(m.device);
        at = a + m.size;
        iter_from = at;
    }
    dev
}
