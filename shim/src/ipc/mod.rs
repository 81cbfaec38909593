//! Inter-process handles of cached blocks (`cudaIpcGetMemHandle`, `cuIpcGetMemHandle` and
//! their open/close twins).
//!
//! The problem: a block the cache hands out usually lies inside a larger segment (one real
//! `cuMemAlloc`), and CUDA's handle names the whole allocation: an importer maps the
//! segment's base and would read another block.
//!
//! Policy (why: make exported blocks exact where both sides run cushim, and never let a
//! process without cushim silently map the wrong bytes):
//! - A block at its segment's base (offset 0) gets the driver's own handle: any importer
//!   maps the segment and finds the block at the pointer it gets. Right bytes, right offset,
//!   with or without cushim.
//! - A block at offset N > 0 gets a cushim handle ("CUSHIMH2", the exporter's pid, a
//!   serial, N, the block size and a random token). The driver's handle of the segment is
//!   kept in a record file private to the exporter's user ([`crate::ipc::records`] says where
//!   and how it is created and checked), removed when the program frees the block (through
//!   any free entry point: [`freed`]; CUDA's handle is valid only while the allocation
//!   lives) and at the latest when the exporter exits. An importer under
//!   cushim opens the segment with the driver's handle and gets base + N. When the record
//!   directory fails its checks the export is refused (`CUDA_ERROR_NOT_SUPPORTED`,
//!   `cudaErrorNotSupported`) with one `cushim:` line: the driver's own handle of an
//!   interior pointer would open the segment's base, another block. An importer without cushim
//!   hands the cushim handle to the driver, which refuses it (`CUDA_ERROR_INVALID_VALUE`,
//!   `cudaErrorInvalidValue`: it is no handle of the driver's); the exporter says so once, on
//!   stderr, when it first hands out such a handle.
//! - Exporting the same block again gives the same handle while its segment is the same
//!   allocation. Opening a handle twice gives the same pointer; each open needs a close
//!   (the driver's reference count on the segment does the rest).
//! - A block of an expandable segment (virtual memory, which CUDA refuses to export) gets a
//!   handle of [`crate::ipc::expandable`], which shares its physical pages.
//! - Memory the cache does not own goes to the driver unchanged.

pub mod expandable;
pub mod records;

use std::collections::HashMap;
use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use cushim::alloc::info::BlockState;
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use self::records as ipc_records;
use crate::ffi::failopen::{self, Point};
pub use crate::ffi::types::IpcHandle;
use crate::ffi::{ERR_INVALID_VALUE, ERR_NOT_SUPPORTED, SUCCESS};
use crate::life::state::Shim;

const MAGIC: &[u8; 8] = b"CUSHIMH2";

/// A cushim handle's fields.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Ours {
    pid: u32,
    serial: u32,
    offset: u64,
    size: u64,
    /// Random: names the record file, so neither can be guessed.
    token: u64,
}

impl Ours {
    fn encode(&self) -> IpcHandle {
        let mut r = [0u8; 64];
        r[..8].copy_from_slice(MAGIC);
        r[8..12].copy_from_slice(&self.pid.to_le_bytes());
        r[12..16].copy_from_slice(&self.serial.to_le_bytes());
        r[16..24].copy_from_slice(&self.offset.to_le_bytes());
        r[24..32].copy_from_slice(&self.size.to_le_bytes());
        r[32..40].copy_from_slice(&self.token.to_le_bytes());
        IpcHandle { reserved: r }
    }

    fn decode(h: &IpcHandle) -> Option<Ours> {
        let r = &h.reserved;
        if &r[..8] != MAGIC || r[40..].iter().any(|b| *b != 0) {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        Some(Ours {
            pid: u32_at(8),
            serial: u32_at(12),
            offset: u64_at(16),
            size: u64_at(24),
            token: u64_at(32),
        })
    }
}

/// A record: the driver's handle of the segment, then the block's offset and size.
fn record_bytes(real: &IpcHandle, o: &Ours) -> Vec<u8> {
    let mut v = real.reserved.to_vec();
    v.extend_from_slice(&o.offset.to_le_bytes());
    v.extend_from_slice(&o.size.to_le_bytes());
    v
}

fn read_record(o: &Ours) -> Result<IpcHandle, String> {
    let v = ipc_records::read(o.pid, o.serial, o.token, |n| {
        n == ipc_records::RECORD_LEN as u64
    })?;
    if v[64..] != record_bytes(&IpcHandle { reserved: [0; 64] }, o)[64..] {
        return Err("not the record of this handle".into());
    }
    let mut real = IpcHandle { reserved: [0; 64] };
    real.reserved.copy_from_slice(&v[..64]);
    Ok(real)
}

/// Create the record of `o` in the exporter's checked directory (setting its token): its
/// path.
fn write_record(real: &IpcHandle, o: &mut Ours) -> Result<PathBuf, String> {
    let (path, token) = ipc_records::write_new(o.serial, &record_bytes(real, o))?;
    o.token = token;
    Ok(path)
}

/// One exported block.
struct Exported {
    /// The driver's handle of its segment.
    real: IpcHandle,
    /// Ours.
    ours: IpcHandle,
    record: PathBuf,
}

struct Exports {
    by_block: HashMap<u64, Exported>,
    /// Every record still on disk, for the exit handler.
    files: Vec<PathBuf>,
}

impl Exports {
    /// Forget `block`'s export and remove its record.
    fn forget(&mut self, block: u64) {
        if let Some(e) = self.by_block.remove(&block) {
            EXPORTED.fetch_sub(1, Ordering::Relaxed);
            self.files.retain(|f| f != &e.record);
            let _ = std::fs::remove_file(&e.record);
        }
    }
}

static EXPORTS: Lazy<Mutex<Exports>> = Lazy::new(|| {
    Mutex::new(Exports {
        by_block: HashMap::new(),
        files: Vec::new(),
    })
});
static SERIAL: AtomicU32 = AtomicU32::new(1);
/// Blocks with a live export (both kinds): a free looks further only when it is not 0.
static EXPORTED: AtomicUsize = AtomicUsize::new(0);
static TOLD: AtomicBool = AtomicBool::new(false);
static REFUSED_TOLD: AtomicBool = AtomicBool::new(false);

extern "C" fn remove_records() {
    if let Some(e) = Lazy::get(&EXPORTS) {
        crate::ipc::records::remove_at_exit(e, |x| &mut x.files);
    }
}

/// The active block containing `ptr` in a cached segment: (segment base, block address,
/// block size, whether the segment is expandable); `Err(())` when `ptr` is cached memory
/// but no live block.
fn cached_block(s: &Shim, ptr: u64) -> Option<Result<(u64, u64, u64, bool), ()>> {
    let dev = s.alloc.owner(ptr)?;
    let segs = s.alloc.segments(dev);
    let seg = segs
        .iter()
        .find(|g| ptr >= g.address && ptr < g.address + g.total_size)?;
    Some(
        seg.blocks
            .iter()
            .find(|b| ptr >= b.address && ptr < b.address + b.size)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| (seg.address, b.address, b.size, seg.is_expandable))
            .ok_or(()),
    )
}

/// Whether the driver's own handle of `ptr` is exact: `ptr` is not the cache's memory, or
/// it is a block at the base of a segment that is not expandable (fail open's fallback,
/// `exports/ipc.rs`).
pub fn driver_handle_is_exact(s: &Shim, ptr: u64) -> bool {
    match cached_block(s, ptr) {
        None => true,
        Some(Ok((seg, block, _, expandable))) => block == seg && ptr == block && !expandable,
        Some(Err(())) => false,
    }
}

/// Export `ptr` into `out`: `None` to let the driver answer for `ptr` itself (not cached, a
/// block at its segment's base, an expandable segment); else the code. `real_get(base, out)`
/// is the driver's export of the segment at `base`.
pub fn export(
    s: &Shim,
    ptr: u64,
    out: *mut IpcHandle,
    real_get: impl FnOnce(u64, *mut IpcHandle) -> c_int,
) -> Option<c_int> {
    failopen::inject(Point::Ipc);
    if out.is_null() {
        return None;
    }
    let (seg, block, size, expandable) = match cached_block(s, ptr)? {
        Ok(b) => b,
        Err(()) => return Some(ERR_INVALID_VALUE),
    };
    if expandable {
        let live = |b: u64, z: u64| matches!(cached_block(s, b), Some(Ok((_, a, n, true))) if a == b && n == z);
        return Some(crate::ipc::expandable::export(block, size, out, live));
    }
    if block == seg {
        return None;
    }
    let mut real = IpcHandle { reserved: [0; 64] };
    let rc = real_get(seg, &mut real);
    if rc != SUCCESS {
        return Some(rc);
    }
    failopen::inject(Point::Ipc);
    let mut ex = EXPORTS.lock();
    let handle = match ex.by_block.get(&block) {
        Some(e) if e.real == real && Ours::decode(&e.ours).is_some_and(|o| o.size == size) => {
            e.ours
        }
        _ => {
            // A block at this address exported before, since freed: its record goes.
            ex.forget(block);
            let mut o = Ours {
                pid: std::process::id(),
                serial: SERIAL.fetch_add(1, Ordering::Relaxed),
                offset: block - seg,
                size,
                token: 0,
            };
            let path = match write_record(&real, &mut o) {
                Ok(p) => p,
                Err(e) => {
                    if !REFUSED_TOLD.swap(true, Ordering::Relaxed) {
                        eprintln!(
                            "cushim: IPC handle of block {block:#x} refused (not supported): \
                             its record cannot be kept private ({e}); the driver's handle would \
                             open another block"
                        );
                    }
                    return Some(ERR_NOT_SUPPORTED);
                }
            };
            if ex.files.is_empty() {
                // SAFETY: registering a plain extern "C" function with no arguments.
                unsafe { libc::atexit(remove_records) };
            }
            ex.files.push(path.clone());
            let ours = o.encode();
            let e = Exported {
                real,
                ours,
                record: path,
            };
            ex.by_block.insert(block, e);
            EXPORTED.fetch_add(1, Ordering::Relaxed);
            ours
        }
    };
    drop(ex);
    if !TOLD.swap(true, Ordering::Relaxed) {
        eprintln!(
            "cushim: IPC handle of block {block:#x} (at offset {} of a cached segment): \
             processes running under cushim open it at the block; without cushim the driver \
             refuses it (invalid value)",
            block - seg
        );
    }
    // SAFETY: `out` is the program's non-null out-pointer.
    unsafe { *out = handle };
    Some(SUCCESS)
}

/// An expandable block's export was made ([`crate::ipc::expandable`]).
pub fn export_made() {
    EXPORTED.fetch_add(1, Ordering::Relaxed);
}

/// An expandable block's export was forgotten.
pub fn export_gone() {
    EXPORTED.fetch_sub(1, Ordering::Relaxed);
}

/// The program freed the block at `ptr` (any free entry point, after the cache took it):
/// its export, if any, is forgotten and its record removed. One relaxed load, inlined into
/// the free, when nothing was exported.
#[inline(always)]
pub fn freed(ptr: u64) {
    if EXPORTED.load(Ordering::Relaxed) != 0 {
        forget_export(ptr);
    }
}

#[cold]
fn forget_export(ptr: u64) {
    if let Some(e) = Lazy::get(&EXPORTS) {
        e.lock().forget(ptr);
    }
    crate::ipc::expandable::forget(ptr);
}

/// Imported pointer -> (segment base the driver mapped, opens not yet closed).
static IMPORTS: Lazy<Mutex<HashMap<u64, (u64, u32)>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// Open `h` into `out`: `None` for a driver handle (the driver answers); else the code.
/// `real_open(out, handle)` is the driver's open.
pub fn open(
    h: &IpcHandle,
    out: *mut u64,
    real_open: impl FnOnce(*mut u64, IpcHandle) -> c_int,
) -> Option<c_int> {
    failopen::inject(Point::Ipc);
    if let Some(rc) = crate::ipc::expandable::open(h, out) {
        return Some(rc);
    }
    let o = Ours::decode(h)?;
    if out.is_null() {
        return Some(ERR_INVALID_VALUE);
    }
    let real = match read_record(&o) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "cushim: IPC handle from process {}: its record is gone or wrong ({e}); \
                 returning invalid value",
                o.pid
            );
            return Some(ERR_INVALID_VALUE);
        }
    };
    let mut base = 0u64;
    let rc = real_open(&mut base, real);
    if rc != SUCCESS {
        return Some(rc);
    }
    failopen::inject(Point::Ipc);
    let ptr = base + o.offset;
    IMPORTS.lock().entry(ptr).or_insert((base, 0)).1 += 1;
    // SAFETY: `out` is the program's non-null out-pointer.
    unsafe { *out = ptr };
    Some(SUCCESS)
}

/// Close `ptr`: `None` when it did not come from [`open`] (the driver answers).
pub fn close(ptr: u64, real_close: impl FnOnce(u64) -> c_int) -> Option<c_int> {
    failopen::inject(Point::Ipc);
    if let Some(rc) = crate::ipc::expandable::close(ptr) {
        return Some(rc);
    }
    let base = {
        let imports = Lazy::get(&IMPORTS)?.lock();
        imports.get(&ptr)?.0
    };
    let rc = real_close(base);
    failopen::inject(Point::Ipc);
    if rc == SUCCESS {
        let mut imports = IMPORTS.lock();
        if let Some(e) = imports.get_mut(&ptr) {
            e.1 -= 1;
            if e.1 == 0 {
                imports.remove(&ptr);
            }
        }
    }
    Some(rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_handles_round_trip_and_driver_handles_are_not_ours() {
        let o = Ours {
            pid: 77,
            serial: 3,
            offset: 2 << 20,
            size: 4 << 20,
            token: 0x1234_5678_9abc_def0,
        };
        assert_eq!(Ours::decode(&o.encode()), Some(o));
        assert_eq!(Ours::decode(&IpcHandle { reserved: [0; 64] }), None);
        let mut other = o.encode();
        other.reserved[48] = 1;
        assert_eq!(Ours::decode(&other), None);
    }
}
