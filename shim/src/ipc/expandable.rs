//! Inter-process handles of blocks inside expandable segments.
//!
//! The problem: CUDA refuses `cuIpcGetMemHandle` of virtual-memory ranges, so a block of an
//! expandable segment could not be shared at all.
//!
//! Policy (why: share exactly the block, through the one mechanism CUDA offers for virtual
//! memory, without opening anything to another user):
//! - Export: the physical pages behind the block (each mapping of the segment the block
//!   touches, found with `cuMemRetainAllocationHandle` / `cuMemGetAddressRange`) are exported
//!   as POSIX descriptors (`cuMemExportToShareableHandle`; the cache creates its pages asking
//!   for that handle type when the device supports it). The descriptors stay open in the
//!   exporter until the program frees the block ([`forget`], from any free entry point) or
//!   exits; freeing closes them and removes the record (importers that mapped the pages keep
//!   their mappings). Their numbers, each mapping's size, the block's offset in the
//!   first one, its size and the exporter's start time go into a record file made as
//!   [`crate::ipc::records`] says (private to the user, exclusive, random name); the handle
//!   ("CUSHIMX1", pid, serial, token) names it. Exporting the same block on the same pages
//!   again gives the same handle.
//! - Import (a process under cushim): the record is read and checked (owner = the
//!   exporter's user, mode 0600, no link), the exporter is pinned with `pidfd_open` and
//!   checked to be the process that wrote the record (same start time), and each descriptor
//!   is copied out of it with `pidfd_getfd`. That needs ptrace permission over the exporter
//!   (the same user, and `kernel.yama.ptrace_scope` 0 or `CAP_SYS_PTRACE`: with Yama's
//!   default 1 only an ancestor may); without it the open fails with
//!   `CUDA_ERROR_INVALID_VALUE` and one `cushim:` line saying so. The pages are imported
//!   (`cuMemImportFromShareableHandle`), mapped in order into a fresh reservation of the
//!   importer's own, made read-write for its current device, and the importer gets the
//!   block's address in it; the copied descriptors and imported handles are released at
//!   once (the mapping keeps the memory). The exporter opening its own handle gets
//!   `CUDA_ERROR_INVALID_CONTEXT`, as in CUDA. Opening a handle twice gives the same pointer;
//!   each open needs a close; the last close unmaps and frees the reservation.
//! - A process without cushim hands the handle to the driver, which refuses it (it is no
//!   handle of the driver's): never another block's memory.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use cudarc::driver::sys as cu;

use crate::driver::entry as de;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, as the driver's integer argument.
const POSIX_FD_HANDLE: std::ffi::c_uint = 1;
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::ffi::intercept::Inside;
use crate::ffi::{ERR_INVALID_CONTEXT, ERR_INVALID_VALUE, ERR_NOT_SUPPORTED, SUCCESS};
use crate::ipc::records as ipc_records;
use crate::ipc::IpcHandle;

const MAGIC: &[u8; 8] = b"CUSHIMX1";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    pid: u32,
    serial: u32,
    token: u64,
}

impl Key {
    fn encode(&self) -> IpcHandle {
        let mut r = [0u8; 64];
        r[..8].copy_from_slice(MAGIC);
        r[8..12].copy_from_slice(&self.pid.to_le_bytes());
        r[12..16].copy_from_slice(&self.serial.to_le_bytes());
        r[16..24].copy_from_slice(&self.token.to_le_bytes());
        IpcHandle { reserved: r }
    }

    fn decode(h: &IpcHandle) -> Option<Key> {
        let r = &h.reserved;
        if &r[..8] != MAGIC || r[24..].iter().any(|b| *b != 0) {
            return None;
        }
        let mut b4 = [0u8; 4];
        let mut b8 = [0u8; 8];
        b4.copy_from_slice(&r[8..12]);
        let pid = u32::from_le_bytes(b4);
        b4.copy_from_slice(&r[12..16]);
        let serial = u32::from_le_bytes(b4);
        b8.copy_from_slice(&r[16..24]);
        Some(Key {
            pid,
            serial,
            token: u64::from_le_bytes(b8),
        })
    }
}

/// What a record says.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    start_time: u64,
    offset: u64,
    size: u64,
    /// (descriptor number in the exporter, mapping size), in address order.
    pages: Vec<(i32, u64)>,
}

impl Record {
    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(32 + 12 * self.pages.len());
        v.extend_from_slice(&self.start_time.to_le_bytes());
        v.extend_from_slice(&self.offset.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&(self.pages.len() as u64).to_le_bytes());
        for (fd, size) in &self.pages {
            v.extend_from_slice(&fd.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
        }
        v
    }

    fn parse(v: &[u8]) -> Option<Record> {
        let u64_at = |i: usize| -> Option<u64> {
            let mut b = [0u8; 8];
            b.copy_from_slice(v.get(i..i + 8)?);
            Some(u64::from_le_bytes(b))
        };
        let n = usize::try_from(u64_at(24)?).ok()?;
        if v.len() != 32usize.checked_add(n.checked_mul(12)?)? || n == 0 {
            return None;
        }
        let mut pages = Vec::with_capacity(n);
        for k in 0..n {
            let at = 32 + 12 * k;
            let mut b = [0u8; 4];
            b.copy_from_slice(&v[at..at + 4]);
            pages.push((i32::from_le_bytes(b), u64_at(at + 4)?));
        }
        Some(Record {
            start_time: u64_at(0)?,
            offset: u64_at(8)?,
            size: u64_at(16)?,
            pages,
        })
    }
}

/// Field 22 of `/proc/<pid>/stat`: when the process started (clock ticks since boot).
fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it follow its last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

struct Exported {
    size: u64,
    record: PathBuf,
    /// The page handles the export was made from (same pages: same handle).
    pages: Vec<u64>,
    handle: IpcHandle,
    _fds: Vec<OwnedFd>,
}

#[derive(Default)]
struct Exports {
    by_block: HashMap<u64, Exported>,
    files: Vec<PathBuf>,
}

static EXPORTS: Lazy<Mutex<Exports>> = Lazy::new(|| Mutex::new(Exports::default()));
static SERIAL: AtomicU32 = AtomicU32::new(1);
static TOLD: AtomicBool = AtomicBool::new(false);

extern "C" fn remove_records() {
    if let Some(e) = Lazy::get(&EXPORTS) {
        crate::ipc::records::remove_at_exit(e, |x| &mut x.files);
    }
}

fn ok(r: c_int) -> Result<(), String> {
    if r == de::SUCCESS {
        Ok(())
    } else {
        Err(format!("CUresult {r}"))
    }
}

/// The mappings covering `[block, block + size)`: (mapping start, mapping size, handle),
/// each handle retained once (the caller releases it).
fn mappings(block: u64, size: u64) -> Result<Vec<(u64, u64, u64)>, String> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    let mut at = block;
    let end = block + size;
    let result = (|| {
        while at < end {
            let (mut base, mut len) = (0u64, 0usize);
            let mut h: cu::CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointers; `at` lies in a range the cache mapped.
            unsafe {
                ok(de::cuMemGetAddressRange_v2(&mut base, &mut len, at))
                    .map_err(|e| format!("cuMemGetAddressRange at {at:#x}: {e}"))?;
                ok(de::cuMemRetainAllocationHandle(&mut h, at as *mut c_void))
                    .map_err(|e| format!("cuMemRetainAllocationHandle at {at:#x}: {e}"))?;
            }
            out.push((base, len as u64, h));
            if len == 0 || base + len as u64 <= at {
                return Err(format!("empty mapping at {at:#x}"));
            }
            at = base + len as u64;
        }
        Ok(())
    })();
    if let Err(e) = result {
        release_all(&out);
        return Err(e);
    }
    Ok(out)
}

fn release_all(maps: &[(u64, u64, u64)]) {
    for (_, _, h) in maps {
        // SAFETY: a handle retained by `mappings`.
        let _ = unsafe { de::cuMemRelease(*h) };
    }
}

/// Export the block `[block, block + size)` of an expandable segment into `out`.
/// `live(block, size)`: whether an earlier export's block is still that live block.
pub fn export(
    block: u64,
    size: u64,
    out: *mut IpcHandle,
    live: impl Fn(u64, u64) -> bool,
) -> c_int {
    let _inside = Inside::enter();
    prune(&live);
    match export_inner(block, size) {
        Ok(h) => {
            if !TOLD.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "cushim: IPC handle of block {block:#x} (in an expandable segment): \
                     processes running under cushim with ptrace permission over this one open \
                     it at the block; without cushim the driver refuses it (invalid value)"
                );
            }
            // SAFETY: `out` is the program's non-null out-pointer (checked by the caller).
            unsafe { *out = h };
            SUCCESS
        }
        Err(e) => {
            eprintln!("cushim: IPC handle of block {block:#x} refused (not supported): {e}");
            ERR_NOT_SUPPORTED
        }
    }
}

/// The program freed `block`: its export, if any, is forgotten (descriptors closed, record
/// removed; importers keep their mappings).
pub fn forget(block: u64) {
    if let Some(e) = Lazy::get(&EXPORTS) {
        let mut ex = e.lock();
        if let Some(gone) = ex.by_block.remove(&block) {
            crate::ipc::export_gone();
            ex.files.retain(|f| f != &gone.record);
            let _ = std::fs::remove_file(&gone.record);
        }
    }
}

/// Forget the exports of blocks the program has freed since: their descriptors are closed
/// and their records removed (importers that mapped them keep their own mappings).
fn prune(live: &impl Fn(u64, u64) -> bool) {
    let mut ex = EXPORTS.lock();
    let dead: Vec<u64> = ex
        .by_block
        .iter()
        .filter(|(b, e)| !live(**b, e.size))
        .map(|(b, _)| *b)
        .collect();
    for b in dead {
        if let Some(e) = ex.by_block.remove(&b) {
            crate::ipc::export_gone();
            ex.files.retain(|f| f != &e.record);
            let _ = std::fs::remove_file(&e.record);
        }
    }
}

fn export_inner(block: u64, size: u64) -> Result<IpcHandle, String> {
    let maps = mappings(block, size)?;
    let handles: Vec<u64> = maps.iter().map(|m| m.2).collect();
    let mut ex = EXPORTS.lock();
    if let Some(e) = ex.by_block.get(&block) {
        if e.size == size && e.pages == handles {
            release_all(&maps);
            return Ok(e.handle);
        }
    }
    let made = (|| {
        let mut fds = Vec::with_capacity(maps.len());
        for (_, _, h) in &maps {
            let mut fd: c_int = -1;
            // SAFETY: a retained handle of ours; the out-pointer is an int, as the POSIX
            // descriptor handle type requires.
            unsafe {
                ok(de::cuMemExportToShareableHandle(
                    &mut fd as *mut c_int as *mut c_void,
                    *h,
                    POSIX_FD_HANDLE,
                    0,
                ))
                .map_err(|e| format!("cuMemExportToShareableHandle: {e}"))?;
                fds.push(OwnedFd::from_raw_fd(fd));
            }
        }
        let pid = std::process::id();
        let record = Record {
            start_time: start_time(pid).ok_or("reading this process's start time")?,
            offset: block - maps[0].0,
            size,
            pages: fds
                .iter()
                .zip(&maps)
                .map(|(fd, m)| (fd.as_raw_fd(), m.1))
                .collect(),
        };
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let (path, token) = ipc_records::write_new(serial, &record.bytes())?;
        Ok::<_, String>((Key { pid, serial, token }, path, fds))
    })();
    release_all(&maps);
    let (key, path, fds) = made?;
    if ex.files.is_empty() {
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(remove_records) };
    }
    ex.files.push(path.clone());
    let handle = key.encode();
    crate::ipc::export_made();
    if let Some(old) = ex.by_block.remove(&block) {
        // The same address exported before on other pages: that export is gone.
        crate::ipc::export_gone();
        ex.files.retain(|f| f != &old.record);
        let _ = std::fs::remove_file(&old.record);
    }
    ex.by_block.insert(
        block,
        Exported {
            size,
            record: path,
            pages: handles,
            handle,
            _fds: fds,
        },
    );
    Ok(handle)
}

struct Import {
    ptr: u64,
    base: u64,
    span: u64,
    opens: u32,
}

/// Opened handles, by handle and by the pointer handed out.
#[derive(Default)]
struct Imports {
    by_key: HashMap<Key, Import>,
}

static IMPORTS: Lazy<Mutex<Imports>> = Lazy::new(|| Mutex::new(Imports::default()));

/// Whether `h` is a handle of a block inside an expandable segment.
pub fn is_handle(h: &IpcHandle) -> bool {
    Key::decode(h).is_some()
}

/// Open `h` into `out` if it is an expandable-segment handle (else `None`).
pub fn open(h: &IpcHandle, out: *mut u64) -> Option<c_int> {
    let key = Key::decode(h)?;
    if out.is_null() {
        return Some(ERR_INVALID_VALUE);
    }
    if key.pid == std::process::id() {
        // As CUDA: a process cannot open its own handle.
        return Some(ERR_INVALID_CONTEXT);
    }
    let mut imports = IMPORTS.lock();
    if let Some(i) = imports.by_key.get_mut(&key) {
        i.opens += 1;
        // SAFETY: `out` is the program's non-null out-pointer.
        unsafe { *out = i.ptr };
        return Some(SUCCESS);
    }
    let _inside = Inside::enter();
    match import(&key) {
        Ok(i) => {
            // SAFETY: as above.
            unsafe { *out = i.ptr };
            imports.by_key.insert(key, i);
            Some(SUCCESS)
        }
        Err(e) => {
            eprintln!(
                "cushim: IPC handle from process {}: {e}; returning invalid value",
                key.pid
            );
            Some(ERR_INVALID_VALUE)
        }
    }
}

fn import(key: &Key) -> Result<Import, String> {
    let v = ipc_records::read(key.pid, key.serial, key.token, |n| n >= 44)
        .map_err(|e| format!("its record is gone or wrong ({e})"))?;
    let rec = Record::parse(&v).ok_or("its record is gone or wrong (not a record)")?;
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, key.pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as c_int) };
    if start_time(key.pid) != Some(rec.start_time) {
        return Err("the exporting process is gone (its pid is another process now)".into());
    }
    let mut fds = Vec::with_capacity(rec.pages.len());
    for (remote, _) in &rec.pages {
        // SAFETY: pidfd_getfd on our pidfd; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), *remote, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let why = if e.raw_os_error() == Some(libc::EPERM) {
                " (copying a descriptor out of another process needs ptrace permission over \
                 it: the same user with kernel.yama.ptrace_scope 0, under ptrace_scope 1 only \
                 an ancestor of the exporter or a process it named with prctl(PR_SET_PTRACER), \
                 or CAP_SYS_PTRACE)"
            } else {
                ""
            };
            return Err(format!("pidfd_getfd: {e}{why}"));
        }
        // SAFETY: a fresh descriptor we own.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd as c_int) });
    }
    map_pages(&rec, &fds)
}

/// Import `fds` (one per record page), map them in order into a fresh reservation, make it
/// read-write for the current device.
fn map_pages(rec: &Record, fds: &[OwnedFd]) -> Result<Import, String> {
    let span: u64 = rec.pages.iter().map(|p| p.1).sum();
    if rec.offset.checked_add(rec.size).map_or(true, |e| e > span) {
        return Err("the record's block lies outside its pages".into());
    }
    let mut dev: c_int = 0;
    let mut base: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        ok(de::cuCtxGetDevice(&mut dev)).map_err(|e| format!("cuCtxGetDevice: {e}"))?;
        ok(de::cuMemAddressReserve(&mut base, span as usize, 0, 0, 0))
            .map_err(|e| format!("cuMemAddressReserve: {e}"))?;
    }
    let mut mapped = 0u64;
    let result = (|| {
        for (fd, (_, size)) in fds.iter().zip(&rec.pages) {
            let mut h: cu::CUmemGenericAllocationHandle = 0;
            // SAFETY: the descriptor travels in the pointer's bits, as the POSIX handle
            // type says; the mapping lies inside our fresh reservation.
            unsafe {
                ok(de::cuMemImportFromShareableHandle(
                    &mut h,
                    fd.as_raw_fd() as usize as *mut c_void,
                    POSIX_FD_HANDLE,
                ))
                .map_err(|e| format!("cuMemImportFromShareableHandle: {e}"))?;
                let m = ok(de::cuMemMap(base + mapped, *size as usize, 0, h, 0));
                let _ = de::cuMemRelease(h);
                m.map_err(|e| format!("cuMemMap: {e}"))?;
            }
            mapped += size;
        }
        // SAFETY: plain C data for which all-zero is valid.
        let mut desc: cu::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        desc.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = dev;
        desc.flags = cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the whole span was mapped just above.
        unsafe { ok(de::cuMemSetAccess(base, span as usize, &desc, 1)) }
            .map_err(|e| format!("cuMemSetAccess: {e}"))
    })();
    if let Err(e) = result {
        unmap(base, mapped, span);
        return Err(e);
    }
    Ok(Import {
        ptr: base + rec.offset,
        base,
        span,
        opens: 1,
    })
}

fn unmap(base: u64, mapped: u64, span: u64) {
    // SAFETY: the range was reserved (and its first `mapped` bytes mapped) by `map_pages`.
    unsafe {
        if mapped > 0 {
            let _ = de::cuMemUnmap(base, mapped as usize);
        }
        let _ = de::cuMemAddressFree(base, span as usize);
    }
}

/// Close `ptr` if it came from [`open`] (else `None`).
pub fn close(ptr: u64) -> Option<c_int> {
    let mut imports = Lazy::get(&IMPORTS)?.lock();
    let key = *imports.by_key.iter().find(|(_, i)| i.ptr == ptr)?.0;
    let i = imports.by_key.get_mut(&key)?;
    i.opens -= 1;
    if i.opens == 0 {
        let i = imports.by_key.remove(&key)?;
        let _inside = Inside::enter();
        unmap(i.base, i.span, i.span);
    }
    Some(SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_records_round_trip_and_others_are_not_ours() {
        let k = Key {
            pid: 9,
            serial: 2,
            token: 0xfeed_beef_1234_5678,
        };
        assert_eq!(Key::decode(&k.encode()), Some(k));
        assert_eq!(Key::decode(&IpcHandle { reserved: [0; 64] }), None);
        let r = Record {
            start_time: 77,
            offset: 4096,
            size: 3 << 20,
            pages: vec![(5, 2 << 20), (6, 4 << 20)],
        };
        assert_eq!(Record::parse(&r.bytes()), Some(r));
        assert_eq!(Record::parse(&[0u8; 40]), None);
    }

    #[test]
    fn this_process_has_a_start_time() {
        assert!(start_time(std::process::id()).is_some());
    }
}
