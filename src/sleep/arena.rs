//! The sleep-mode arena: with `sleep_mode:True`, `cudaMalloc`/`cuMemAlloc` are served here,
//! each allocation on its own virtual-memory reservation with one physical allocation mapped
//! over it, so its pages can be dropped and mapped again at the same address.
//!
//! Invariants (under the arena's one lock): a region is either live (its physical memory
//! mapped read-write over the whole reservation) or paused (nothing mapped; its bytes, in
//! backup mode, in a pinned host buffer with their checksum). A pause or resume of a tag
//! changes every matching region or none: each step that can fail is undone for the regions
//! it already changed before the error is returned, so a failed pause leaves the tag live
//! and a failed resume leaves it paused, whole, resumable later (its backups kept). A
//! physical handle is released only once nothing maps it; a release the driver refuses is
//! retried, and a handle it keeps refusing stays with its region (a paused region may then
//! keep its handle and its bytes, and is mapped again from it at resume), so every handle
//! is released by the time its region is freed.
//!
//! Why one reservation per allocation and not the cache's segments: a block's pages must
//! hold nothing but that block, so pausing one tag never drops another tag's bytes; the
//! price is driver calls per allocation (reserve, create, map, set access; and their
//! inverses per free) instead of a cached block, measured in BENCHMARKS.md. Memory the
//! cache serves (stream-ordered allocations, graph captures) is not pausable.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::checksum::{fold, PIECE};
use super::tag;
use crate::alloc::rounding::round_up;
use crate::device::{DevPtr, DevResult, Device, DeviceError, PhysHandle};

/// What a pause does with the contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Contents are lost; resume gives zeroed or stale memory at the same address.
    Discard,
    /// Contents are copied to pinned host memory and restored at resume.
    Backup,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Discard => "discard",
            Mode::Backup => "backup",
        }
    }
}

/// Why a pause or resume failed (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SleepError {
    Device(DeviceError),
    /// A backup's bytes changed while paused: the region at this address was not restored.
    Corrupt(DevPtr),
}

impl std::fmt::Display for SleepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SleepError::Device(e) => write!(f, "{e}"),
            SleepError::Corrupt(a) => write!(
                f,
                "the host backup of the block at {a:#x} does not match its checksum"
            ),
        }
    }
}

impl From<DeviceError> for SleepError {
    fn from(e: DeviceError) -> Self {
        SleepError::Device(e)
    }
}

/// What a pause or resume changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SleepOutcome {
    /// Device bytes released (pause) or mapped again (resume).
    pub bytes: u64,
    /// Regions changed.
    pub regions: usize,
    /// Of those bytes, the ones backed up (pause) or restored (resume).
    pub backed_up: u64,
    /// The regions changed: (device, address).
    pub changed: Vec<(i32, DevPtr)>,
}

struct Backup {
    host: DevPtr,
    sum: u64,
}

struct Paused {
    mode: Mode,
    backup: Option<Backup>,
}

struct Region {
    dev: i32,
    /// Bytes the program asked for.
    size: u64,
    /// Bytes reserved and mapped (a multiple of the granularity).
    mapped: u64,
    tag: String,
    /// The physical memory: mapped while live; kept while paused only when the driver
    /// refused to release it.
    handle: Option<PhysHandle>,
    paused: Option<Paused>,
}

/// One paused or live region, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    pub dev: i32,
    pub addr: DevPtr,
    pub size: u64,
    pub mapped: u64,
    pub tag: String,
    /// `None` when live, else the pause's mode.
    pub paused: Option<Mode>,
}

/// Tries of a driver call that failed for another reason than lack of memory.
const TRIES: usize = 3;

fn retry<T>(mut f: impl FnMut() -> DevResult<T>) -> DevResult<T> {
    let mut last = f();
    for _ in 1..TRIES {
        match last {
            Err(e) if e != DeviceError::OutOfMemory => last = f(),
            _ => break,
        }
    }
    last
}

/// The arena of one process.
pub struct SleepArena {
    device: Arc<dyn Device>,
    regions: Mutex<BTreeMap<DevPtr, Region>>,
}

impl SleepArena {
    pub fn new(device: Arc<dyn Device>) -> SleepArena {
        SleepArena {
            device,
            regions: Mutex::new(BTreeMap::new()),
        }
    }

    /// Allocate `size` bytes on `dev` tagged `tag`; nothing is left behind on failure.
    pub fn alloc(&self, dev: i32, size: u64, tag: &str) -> DevResult<DevPtr> {
        let d = &*self.device;
        let gran = d.granularity(dev).max(1);
        let mapped = round_up(size.max(1), gran);
        let base = d.reserve(dev, mapped)?;
        let undo_reserve = || {
            let _ = retry(|| d.release_reservation(dev, base, mapped));
        };
        let h = match d.create_physical(dev, mapped) {
            Ok(h) => h,
            Err(e) => {
                undo_reserve();
                return Err(e);
            }
        };
        if let Err(e) = map_rw(d, dev, base, mapped, h) {
            let _ = retry(|| d.release_physical(dev, h));
            undo_reserve();
            return Err(e);
        }
        self.regions.lock().insert(
            base,
            Region {
                dev,
                size,
                mapped,
                tag: tag.to_string(),
                handle: Some(h),
                paused: None,
            },
        );
        Ok(base)
    }

    /// Whether `ptr` starts a region of this arena.
    pub fn owns(&self, ptr: DevPtr) -> bool {
        self.regions.lock().contains_key(&ptr)
    }

    /// Free the region at `ptr` (after the device's work, as `cudaFree` does): `None` when
    /// it is not ours. A live region whose unmapping fails stays allocated (the error is
    /// returned); a paused one is freed with its backup.
    pub fn free(&self, ptr: DevPtr) -> Option<DevResult<()>> {
        let d = &*self.device;
        let mut regions = self.regions.lock();
        let r = regions.get(&ptr)?;
        let dev = r.dev;
        let _ = d.synchronize_device(dev);
        if r.paused.is_none() {
            if let Err(e) = retry(|| d.unmap(dev, ptr, r.mapped)) {
                return Some(Err(e));
            }
        }
        let r = regions.remove(&ptr)?;
        drop(regions);
        if let Some(h) = r.handle {
            let _ = retry(|| d.release_physical(dev, h));
        }
        if let Some(b) = r.paused.and_then(|p| p.backup) {
            let _ = d.host_free(b.host);
        }
        Some(retry(|| d.release_reservation(dev, ptr, r.mapped)))
    }

    /// The region containing `addr`: (start, bytes asked for, device).
    pub fn range_of(&self, addr: DevPtr) -> Option<(DevPtr, u64, i32)> {
        let regions = self.regions.lock();
        let (&a, r) = regions.range(..=addr).next_back()?;
        (addr < a + r.mapped).then_some((a, r.size, r.dev))
    }

    /// Pause every live region whose tag matches `want` (`None`: every tag): the device's
    /// work is waited for, backups are made (backup mode), then every region is unmapped and
    /// its physical memory released. All or nothing.
    pub fn pause(&self, want: Option<&str>, mode: Mode) -> Result<SleepOutcome, SleepError> {
        let d = &*self.device;
        let mut regions = self.regions.lock();
        let keys: Vec<DevPtr> = regions
            .iter()
            .filter(|(_, r)| r.paused.is_none() && tag::matches(&r.tag, want))
            .map(|(&a, _)| a)
            .collect();
        if keys.is_empty() {
            return Ok(SleepOutcome::default());
        }
        let mut devs: Vec<i32> = keys.iter().map(|k| regions[k].dev).collect();
        devs.sort_unstable();
        devs.dedup();
        for &dev in &devs {
            d.synchronize_device(dev)?;
        }
        // Backups first: nothing is unmapped until every byte is safe on the host.
        let mut backups: Vec<Option<Backup>> = Vec::with_capacity(keys.len());
        let free_backups = |b: &mut Vec<Option<Backup>>| {
            for x in b.drain(..).flatten() {
                let _ = d.host_free(x.host);
            }
        };
        if mode == Mode::Backup {
            for k in &keys {
                let r = &regions[k];
                match backup(d, r.dev, *k, r.size) {
                    Ok(b) => backups.push(Some(b)),
                    Err(e) => {
                        free_backups(&mut backups);
                        return Err(e.into());
                    }
                }
            }
        } else {
            backups.resize_with(keys.len(), || None);
        }
        // Unmap every region; on failure map back the ones unmapped (their handles are
        // still held, so their bytes are intact).
        for (i, k) in keys.iter().enumerate() {
            let r = &regions[k];
            if let Err(e) = retry(|| d.unmap(r.dev, *k, r.mapped)) {
                for back in &keys[..i] {
                    let r = &regions[back];
                    if let Some(h) = r.handle {
                        let _ = retry(|| map_rw(d, r.dev, *back, r.mapped, h));
                    }
                }
                free_backups(&mut backups);
                return Err(e.into());
            }
        }
        let mut out = SleepOutcome::default();
        for (k, b) in keys.iter().zip(backups) {
            let Some(r) = regions.get_mut(k) else {
                continue;
            };
            if let Some(h) = r.handle {
                if retry(|| d.release_physical(r.dev, h)).is_ok() {
                    r.handle = None;
                }
            }
            out.bytes += r.mapped;
            out.regions += 1;
            out.changed.push((r.dev, *k));
            if b.is_some() {
                out.backed_up += r.size;
            }
            r.paused = Some(Paused { mode, backup: b });
        }
        Ok(out)
    }

    /// Resume every paused region whose tag matches `want`: new physical memory mapped at
    /// the same addresses, backups checked and restored, then their host memory freed. All
    /// or nothing: on failure every region this call mapped is unmapped again and the tag
    /// stays paused with its backups.
    pub fn resume(&self, want: Option<&str>) -> Result<SleepOutcome, SleepError> {
        let d = &*self.device;
        let mut regions = self.regions.lock();
        let keys: Vec<DevPtr> = regions
            .iter()
            .filter(|(_, r)| r.paused.is_some() && tag::matches(&r.tag, want))
            .map(|(&a, _)| a)
            .collect();
        if keys.is_empty() {
            return Ok(SleepOutcome::default());
        }
        // (address, handle, whether this call created it)
        let mut done: Vec<(DevPtr, PhysHandle, bool)> = Vec::with_capacity(keys.len());
        let undo = |done: &mut Vec<(DevPtr, PhysHandle, bool)>,
                    regions: &mut BTreeMap<DevPtr, Region>| {
            for (a, h, created) in done.drain(..) {
                let Some(r) = regions.get_mut(&a) else {
                    continue;
                };
                let _ = retry(|| d.unmap(r.dev, a, r.mapped));
                if created && retry(|| d.release_physical(r.dev, h)).is_err() {
                    r.handle = Some(h);
                }
            }
        };
        for k in &keys {
            let (dev, mapped, kept) = {
                let r = &regions[k];
                (r.dev, r.mapped, r.handle)
            };
            let (h, created) = match kept {
                Some(h) => (h, false),
                None => match d.create_physical(dev, mapped) {
                    Ok(h) => (h, true),
                    Err(e) => {
                        undo(&mut done, &mut regions);
                        return Err(e.into());
                    }
                },
            };
            if let Err(e) = map_rw(d, dev, *k, mapped, h) {
                if created && retry(|| d.release_physical(dev, h)).is_err() {
                    if let Some(r) = regions.get_mut(k) {
                        r.handle = Some(h);
                    }
                }
                undo(&mut done, &mut regions);
                return Err(e.into());
            }
            done.push((*k, h, created));
        }
        // Each piece of a backup is checked while it is copied (summed, then copied while
        // still in cache); a mismatch undoes the whole resume, so nothing corrupt stays.
        for k in &keys {
            let r = &regions[k];
            if let Some(b) = r.paused.as_ref().and_then(|p| p.backup.as_ref()) {
                if let Err(e) = restore(d, r.dev, *k, r.size, b) {
                    undo(&mut done, &mut regions);
                    return Err(e);
                }
            }
        }
        let mut out = SleepOutcome::default();
        for (a, h, _) in done {
            let Some(r) = regions.get_mut(&a) else {
                continue;
            };
            r.handle = Some(h);
            if let Some(b) = r.paused.take().and_then(|p| p.backup) {
                out.backed_up += r.size;
                let _ = d.host_free(b.host);
            }
            out.bytes += r.mapped;
            out.regions += 1;
            out.changed.push((r.dev, a));
        }
        Ok(out)
    }

    /// Every region, in address order.
    pub fn list(&self) -> Vec<RegionInfo> {
        self.regions
            .lock()
            .iter()
            .map(|(&addr, r)| RegionInfo {
                dev: r.dev,
                addr,
                size: r.size,
                mapped: r.mapped,
                tag: r.tag.clone(),
                paused: r.paused.as_ref().map(|p| p.mode),
            })
            .collect()
    }

    /// Bytes paused on `dev` (reserved, without physical memory).
    pub fn paused_bytes(&self, dev: i32) -> u64 {
        self.regions
            .lock()
            .values()
            .filter(|r| r.dev == dev && r.paused.is_some())
            .map(|r| r.mapped)
            .sum()
    }
}

/// Map `h` over `[base, base + size)` and make it read-write; unmapped again on failure.
fn map_rw(d: &dyn Device, dev: i32, base: DevPtr, size: u64, h: PhysHandle) -> DevResult<()> {
    retry(|| d.map(dev, base, size, h))?;
    if let Err(e) = retry(|| d.set_access(dev, base, size)) {
        let _ = retry(|| d.unmap(dev, base, size));
        return Err(e);
    }
    Ok(())
}

/// Copy `size` bytes at `addr` into a new pinned buffer, with their checksum.
fn backup(d: &dyn Device, dev: i32, addr: DevPtr, size: u64) -> DevResult<Backup> {
    let host = d.host_alloc(size.max(1), 0)?;
    let mut sum = 0;
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(PIECE as u64);
        if let Err(e) = retry(|| d.copy_to_host(dev, host + at, addr + at, n)) {
            let _ = d.host_free(host);
            return Err(e);
        }
        // SAFETY: `host` is our pinned buffer of at least `size` bytes; this piece was just
        // filled.
        let piece = unsafe { std::slice::from_raw_parts((host + at) as *const u8, n as usize) };
        sum = fold(sum, piece);
        at += n;
    }
    Ok(Backup { host, sum })
}

/// Copy a backup of `size` bytes back to `addr`, checking its checksum on the way.
fn restore(
    d: &dyn Device,
    dev: i32,
    addr: DevPtr,
    size: u64,
    b: &Backup,
) -> Result<(), SleepError> {
    let mut sum = 0;
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(PIECE as u64);
        // SAFETY: the backup is our own pinned buffer of `size` bytes.
        let piece = unsafe { std::slice::from_raw_parts((b.host + at) as *const u8, n as usize) };
        sum = fold(sum, piece);
        retry(|| d.copy_to_device(dev, addr + at, b.host + at, n))?;
        at += n;
    }
    if sum != b.sum {
        return Err(SleepError::Corrupt(addr));
    }
    Ok(())
}
