//! Inter-process memory handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle[_v2]`,
//! `cuIpcCloseMemHandle` and the runtime's `cudaIpc*`), so sharing device memory between two
//! processes can be tested without a GPU.
//!
//! How: exporting a `cuMemAlloc` allocation moves the pages under it, in place and with their
//! contents, onto a memfd mapped shared at the same address; the handle names the exporting
//! process, that memfd and where the allocation lies in it. The importer opens the memfd
//! through `/proc/<pid>/fd/<fd>` and maps it shared, so both processes see the same bytes.
//! As in CUDA: a handle is for the whole allocation containing the pointer (the importer gets
//! the allocation's base); a freed and reallocated range gets a new handle; opening a handle
//! twice in one process returns the same pointer with a reference count, which
//! `cuIpcCloseMemHandle` decrements (unmapping at zero); a process cannot open its own handle.
//! Limits: pages shared with a neighbouring allocation (allocations are 512-byte aligned)
//! follow the allocation exported last; imported memory does not count against the
//! importer's device capacity.
//!
//! Lock order: [`EXPORTING`], then a heap lock, then [`EXPORTS`] (`forget` runs under the
//! heap lock); nothing takes a heap lock while holding `EXPORTS` or `IMPORTS`. A memfd stays
//! open for the exporter's life (the importer opens it through `/proc`).
#![allow(clippy::missing_safety_doc, non_snake_case)]

use crate::api::{driver, out, runtime, Api};
use crate::error::*;
use crate::{memory, state};
use libc::{c_uint, c_void};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The 64 opaque bytes of `CUipcMemHandle` / `cudaIpcMemHandle_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

const MAGIC: &[u8; 8] = b"simcIPC1";
const PAGE: usize = 4096;

/// What a handle says: the exporter, its memfd and the allocation's place in it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Exported {
    pid: u32,
    fd: i32,
    /// Offset of the allocation's base in the memfd.
    offset: u64,
    size: u64,
    device: u32,
    /// Unique per export in the exporting process (a reallocated range gets a new handle).
    serial: u64,
}

impl Exported {
    fn encode(&self) -> IpcMemHandle {
        let mut r = [0u8; 64];
        r[..8].copy_from_slice(MAGIC);
        r[8..12].copy_from_slice(&self.pid.to_le_bytes());
        r[12..16].copy_from_slice(&self.fd.to_le_bytes());
        r[16..24].copy_from_slice(&self.offset.to_le_bytes());
        r[24..32].copy_from_slice(&self.size.to_le_bytes());
        r[32..36].copy_from_slice(&self.device.to_le_bytes());
        r[36..44].copy_from_slice(&self.serial.to_le_bytes());
        IpcMemHandle { reserved: r }
    }

    fn decode(h: &IpcMemHandle) -> Option<Exported> {
        let r = &h.reserved;
        if &r[..8] != MAGIC || r[44..].iter().any(|b| *b != 0) {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&r[i..i + 8]);
            u64::from_le_bytes(b)
        };
        Some(Exported {
            pid: u32_at(8),
            fd: u32_at(12) as i32,
            offset: u64_at(16),
            size: u64_at(24),
            device: u32_at(32),
            serial: u64_at(36),
        })
    }
}

/// Exports of this process by allocation base.
static EXPORTS: Lazy<Mutex<BTreeMap<usize, Exported>>> = Lazy::new(|| Mutex::new(BTreeMap::new()));
static SERIAL: AtomicU64 = AtomicU64::new(1);

/// One imported mapping: its whole mapping, the handle it came from, its reference count.
struct Import {
    map: usize,
    map_len: usize,
    from: Exported,
    refs: u32,
}

/// Imports of this process by the pointer handed out.
static IMPORTS: Lazy<Mutex<BTreeMap<usize, Import>>> = Lazy::new(|| Mutex::new(BTreeMap::new()));

/// Forget the export of the allocation at `base` (it was freed): a later allocation there
/// gets a new handle. Called under the heap lock.
pub fn forget(base: usize) {
    if let Some(mut e) = Lazy::get(&EXPORTS).map(|m| m.lock()) {
        e.remove(&base);
    }
}

/// The imported mapping containing `[addr, addr + len)`: its device.
pub fn imported(addr: usize, len: usize) -> Option<usize> {
    let imports = Lazy::get(&IMPORTS)?.lock();
    let (&p, i) = imports.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= p + i.from.size as usize).then_some(i.from.device as usize)
}

/// Move `[start, end)` (page-aligned, inside a device heap) onto a new memfd mapped shared at
/// the same address, keeping its bytes; returns the memfd.
fn share_pages(start: usize, end: usize) -> Result<i32, CUresult> {
    let len = end - start;
    // SAFETY: memfd_create with a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"simcuda-ipc".as_ptr(), 0) };
    if fd < 0 {
        return Err(OUT_OF_MEMORY);
    }
    let fail = |code| {
        // SAFETY: closing the memfd made above.
        unsafe { libc::close(fd) };
        Err(code)
    };
    // SAFETY: plain syscalls on our own fd; the source range is our own mapped device heap,
    // and the final MAP_FIXED replaces exactly those pages with the same bytes, shared.
    unsafe {
        if libc::ftruncate(fd, len as libc::off_t) != 0 {
            return fail(OUT_OF_MEMORY);
        }
        let written = libc::pwrite(fd, start as *const c_void, len, 0);
        if written != len as isize {
            return fail(MAP_FAILED);
        }
        let p = libc::mmap(
            start as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        );
        if p == libc::MAP_FAILED {
            return fail(MAP_FAILED);
        }
    }
    Ok(fd)
}

/// Serializes exports, so one allocation is moved onto one memfd once. Never taken by
/// `forget`, so holding it while waiting for streams cannot deadlock with a stream job that
/// frees memory.
static EXPORTING: Mutex<()> = Mutex::new(());

/// `cuIpcGetMemHandle`: the handle of the `cuMemAlloc` allocation containing `dptr`.
pub fn get_handle(dptr: usize) -> Result<IpcMemHandle, CUresult> {
    let _one = EXPORTING.lock();
    let (dev, base, size) = memory::find(dptr).ok_or(INVALID_VALUE)?;
    if let Some(e) = EXPORTS.lock().get(&base) {
        return Ok(e.encode());
    }
    // No queued work may write the pages while they move.
    crate::stream::sync_device(state::device(dev)?);
    let start = base & !(PAGE - 1);
    let end = (base + size + PAGE - 1) & !(PAGE - 1);
    let fd = share_pages(start, end)?;
    let e = Exported {
        pid: std::process::id(),
        fd,
        offset: (base - start) as u64,
        size: size as u64,
        device: dev as u32,
        serial: SERIAL.fetch_add(1, Ordering::Relaxed),
    };
    EXPORTS.lock().insert(base, e);
    Ok(e.encode())
}

/// `cuIpcOpenMemHandle`: map the exporter's allocation here.
pub fn open_handle(h: &IpcMemHandle, flags: c_uint) -> Result<usize, CUresult> {
    if flags > 1 {
        return Err(INVALID_VALUE);
    }
    let e = Exported::decode(h).ok_or(INVALID_VALUE)?;
    if e.pid == std::process::id() {
        return Err(INVALID_CONTEXT);
    }
    state::device(e.device as usize).map_err(|_| INVALID_DEVICE)?;
    let mut imports = IMPORTS.lock();
    if let Some((&p, i)) = imports.iter_mut().find(|(_, i)| i.from == e) {
        i.refs += 1;
        return Ok(p);
    }
    let path = format!("/proc/{}/fd/{}\0", e.pid, e.fd);
    // SAFETY: a NUL-terminated path; the fd is ours until closed below.
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_RDWR | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(INVALID_HANDLE);
    }
    let map_len = ((e.offset + e.size) as usize + PAGE - 1) & !(PAGE - 1);
    // SAFETY: a fresh shared mapping of the exporter's memfd at a kernel-chosen address; the
    // fd is closed after mapping (the mapping keeps the file).
    let p = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        p
    };
    if p == libc::MAP_FAILED {
        return Err(MAP_FAILED);
    }
    let ptr = p as usize + e.offset as usize;
    imports.insert(
        ptr,
        Import {
            map: p as usize,
            map_len,
            from: e,
            refs: 1,
        },
    );
    Ok(ptr)
}

/// `cuIpcCloseMemHandle`: drop one reference; unmap at zero.
pub fn close_handle(dptr: usize) -> Result<(), CUresult> {
    let mut imports = IMPORTS.lock();
    let i = imports.get_mut(&dptr).ok_or(INVALID_VALUE)?;
    i.refs -= 1;
    if i.refs == 0 {
        let (map, len, dev) = (i.map, i.map_len, i.from.device as usize);
        imports.remove(&dptr);
        drop(imports);
        // No queued work may touch the mapping once it is gone.
        if let Ok(d) = state::device(dev) {
            crate::stream::sync_device(d);
        }
        // SAFETY: the mapping made by `open_handle`, no longer handed out.
        unsafe { libc::munmap(map as *mut c_void, len) };
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(h: *mut IpcMemHandle, dptr: u64) -> CUresult {
    driver(Api::cuIpcGetMemHandle, || {
        state::current_device()?;
        out(h, get_handle(dptr as usize)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    p: *mut u64,
    h: IpcMemHandle,
    flags: c_uint,
) -> CUresult {
    driver(Api::cuIpcOpenMemHandle, || {
        state::current_device()?;
        out(p, open_handle(&h, flags)? as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    p: *mut u64,
    h: IpcMemHandle,
    flags: c_uint,
) -> CUresult {
    driver(Api::cuIpcOpenMemHandle_v2, || {
        state::current_device()?;
        out(p, open_handle(&h, flags)? as u64)
    })
}

#[no_mangle]
pub extern "C" fn cuIpcCloseMemHandle(dptr: u64) -> CUresult {
    driver(Api::cuIpcCloseMemHandle, || {
        state::current_device()?;
        close_handle(dptr as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(h: *mut IpcMemHandle, p: *mut c_void) -> CUresult {
    runtime(Api::cudaIpcGetMemHandle, || {
        state::runtime_device()?;
        out(h, get_handle(p as usize)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcOpenMemHandle(
    p: *mut *mut c_void,
    h: IpcMemHandle,
    flags: c_uint,
) -> CUresult {
    runtime(Api::cudaIpcOpenMemHandle, || {
        state::runtime_device()?;
        out(p, open_handle(&h, flags)? as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn cudaIpcCloseMemHandle(p: *mut c_void) -> CUresult {
    runtime(Api::cudaIpcCloseMemHandle, || {
        state::runtime_device()?;
        close_handle(p as usize)
    })
}
