//! The loaded modules' unwind tables, as one immutable snapshot shared by all threads.
//!
//! Invariant: every byte slice in a [`Snapshot`] is memory of a loaded module that can never
//! be unmapped: the main program, the vDSO, or a shared object this file has pinned with
//! `dlopen(RTLD_NOLOAD)` (and never closes: such a library stays loaded after the program's
//! `dlclose`). A module that cannot be pinned is left out, so a walk reaching it ends there
//! instead of reading memory that may vanish. A snapshot is replaced, never changed; [`generation`] counts
//! replacements so threads can notice one with a single atomic load.

use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder as _};
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The framehop unwinder over in-memory sections that live as long as the process.
pub type NativeUnwinder = UnwinderX86_64<&'static [u8], MustNotAllocateDuringUnwind>;

/// Unwind tables of the modules loaded when the snapshot was taken.
pub struct Snapshot {
    pub unwinder: NativeUnwinder,
    /// Loaded address ranges `(start, end)` of the modules, sorted by start.
    ranges: Vec<(u64, u64)>,
    /// The loader's count of objects ever loaded (`dlpi_adds`) when this was taken.
    pub adds: u64,
}

impl Snapshot {
    /// The loaded range `(start, end)` of the snapshot's module containing `addr`.
    pub fn module_of(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.ranges.partition_point(|&(start, _)| start <= addr);
        let range = *self.ranges.get(i.checked_sub(1)?)?;
        (addr < range.1).then_some(range)
    }
}

static CURRENT: Mutex<Option<Arc<Snapshot>>> = Mutex::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The lock of the current snapshot (`std`'s, for the reason given in `trace::intern`).
fn lock_current() -> MutexGuard<'static, Option<Arc<Snapshot>>> {
    CURRENT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hold the module list's lock (around `fork`).
pub fn hold_for_fork() -> ModulesHold {
    ModulesHold {
        _held: lock_current(),
    }
}

/// The module list's lock, held; dropping it releases it.
pub struct ModulesHold {
    _held: MutexGuard<'static, Option<Arc<Snapshot>>>,
}

/// Incremented each time the shared snapshot is replaced (0: none taken yet).
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The current snapshot, taking the first one if there is none yet.
pub fn current() -> Arc<Snapshot> {
    if let Some(s) = lock_current().as_ref() {
        return s.clone();
    }
    install(take(), |_| false)
}

/// Replace the snapshot if objects were loaded since `seen` was taken (an address outside
/// every known module may belong to one). Returns whether a newer snapshot exists.
pub fn refresh_after(seen: &Snapshot) -> bool {
    if loader_adds() == seen.adds {
        return false;
    }
    if lock_current().as_ref().is_some_and(|c| c.adds > seen.adds) {
        return true; // another thread already refreshed
    }
    let snap = take();
    let adds = snap.adds;
    install(snap, |c| c.adds < adds);
    true
}

/// Make `snap` current unless one exists that `replace` says to keep; returns the current
/// one. Snapshots are taken without this lock held: taking one calls into the loader
/// (`dlopen`), whose lock a library constructor may hold while it allocates (and captures).
fn install(snap: Snapshot, replace: impl FnOnce(&Snapshot) -> bool) -> Arc<Snapshot> {
    let mut cur = lock_current();
    if let Some(c) = cur.as_ref() {
        if !replace(c) {
            return c.clone();
        }
    }
    let snap = Arc::new(snap);
    *cur = Some(snap.clone());
    GENERATION.fetch_add(1, Ordering::Release);
    snap
}

/// The loader's `dlpi_adds` counter (read from the first object it reports).
fn loader_adds() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info; `data` is the u64 we handed it.
        unsafe { *(data as *mut u64) = (*info).dlpi_adds };
        1
    }
    let mut adds = 0u64;
    // SAFETY: the callback only writes `adds`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut adds as *mut u64 as *mut libc::c_void) };
    adds
}

/// One loaded object as the loader reports it.
struct Object {
    name: CString,
    base: u64,
    /// `(vaddr, memsz, flags)` of each PT_LOAD segment.
    loads: Vec<(u64, u64, u32)>,
    /// `(vaddr, memsz)` of PT_GNU_EH_FRAME.
    eh_frame_hdr: Option<(u64, u64)>,
    adds: u64,
}

fn list_objects() -> Vec<Object> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call and
        // `data` is the Vec we handed it.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<Object>)) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let name = if info.dlpi_name.is_null() {
            CString::default()
        } else {
            // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned()
        };
        let loads = phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD)
            .map(|p| (p.p_vaddr, p.p_memsz, p.p_flags))
            .collect();
        let eh_frame_hdr = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_GNU_EH_FRAME)
            .map(|p| (p.p_vaddr, p.p_memsz));
        out.push(Object {
            name,
            base: info.dlpi_addr,
            loads,
            eh_frame_hdr,
            adds: info.dlpi_adds,
        });
        0
    }
    let mut out: Vec<Object> = Vec::new();
    // SAFETY: `visit` matches the callback signature and only touches `out`.
    unsafe {
        libc::dl_iterate_phdr(
            Some(visit),
            &mut out as *mut Vec<Object> as *mut libc::c_void,
        )
    };
    out
}

/// Whether the object stays mapped without pinning: the main program (listed first,
/// unnamed) or the vDSO.
fn permanent(obj: &Object, first: bool) -> bool {
    let name = obj.name.as_bytes();
    first || name.is_empty() || name.starts_with(b"linux-vdso") || name.starts_with(b"linux-gate")
}

/// Pin the shared object so it is never unloaded; false if it is no longer loaded.
fn pin(obj: &Object) -> bool {
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only takes a reference to an object that
    // is already loaded (null if it is not), and the reference is deliberately never
    // dropped, so the object's sections stay mapped for the life of the process.
    // (Each snapshot takes one more reference; the count only keeps the object loaded.)
    !unsafe { libc::dlopen(obj.name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) }.is_null()
}

/// Take a snapshot of the loaded modules, pinning them.
fn take() -> Snapshot {
    // Pin first, then list again: whatever the second listing reports under a pinned
    // name is the pinned load, which can no longer go away. The load count is the first
    // listing's, so an object loaded in between (and left out) causes a later refresh.
    let first = list_objects();
    let pinned: Vec<&CString> = first
        .iter()
        .enumerate()
        .filter(|&(i, obj)| !permanent(obj, i == 0) && pin(obj))
        .map(|(_, obj)| &obj.name)
        .collect();
    let adds = first.first().map_or(0, |o| o.adds);
    let objects = list_objects();
    let mut unwinder = NativeUnwinder::new();
    let mut ranges = Vec::new();
    for (i, obj) in objects.iter().enumerate() {
        if !permanent(obj, i == 0) && !pinned.contains(&&obj.name) {
            continue; // loaded after the pinning pass, or could not be pinned
        }
        let Some((lo, hi)) = extent(obj) else {
            continue;
        };
        let info = section_info(obj).unwrap_or_default();
        let name = obj.name.to_string_lossy().into_owned();
        unwinder.add_module(Module::new(name, lo..hi, obj.base, info));
        ranges.push((lo, hi));
    }
    ranges.sort_unstable();
    Snapshot {
        unwinder,
        ranges,
        adds,
    }
}

/// The loaded extent `(lo, hi)` of an object's PT_LOAD segments.
fn extent(obj: &Object) -> Option<(u64, u64)> {
    let lo = obj.loads.iter().map(|l| obj.base.wrapping_add(l.0)).min()?;
    let hi = obj
        .loads
        .iter()
        .map(|l| obj.base.wrapping_add(l.0 + l.1))
        .max()?;
    (lo < hi).then_some((lo, hi))
}

/// The object's `.eh_frame_hdr` and `.eh_frame` as in-memory slices. `.eh_frame`'s length
/// is not recorded anywhere loaded, so its slice runs to the end of the segment holding it
/// (lookups go through the header's table, which only points inside it).
fn section_info(obj: &Object) -> Option<ExplicitModuleSectionInfo<&'static [u8]>> {
    let (hdr_vaddr, hdr_len) = obj.eh_frame_hdr?;
    let hdr_seg = segment_end(obj, hdr_vaddr)?;
    if hdr_len < 4 || hdr_vaddr.checked_add(hdr_len)? > hdr_seg {
        return None;
    }
    let hdr_avma = obj.base.wrapping_add(hdr_vaddr);
    // SAFETY: `hdr_vaddr..hdr_vaddr+hdr_len` lies inside a loaded segment of an object that
    // stays mapped (see the file invariant), so the slice is valid for the process's life.
    let hdr: &'static [u8] =
        unsafe { std::slice::from_raw_parts(hdr_avma as *const u8, hdr_len as usize) };
    if hdr[0] != 1 {
        return None; // unknown .eh_frame_hdr version
    }
    let eh_avma = decode_ptr(hdr[1], &hdr[4..], hdr_avma + 4, hdr_avma)?;
    let eh_vaddr = eh_avma.checked_sub(obj.base)?;
    let eh_end = segment_end(obj, eh_vaddr)?;
    // SAFETY: `eh_vaddr..eh_end` lies inside one loaded segment of the same object.
    let eh: &'static [u8] =
        unsafe { std::slice::from_raw_parts(eh_avma as *const u8, (eh_end - eh_vaddr) as usize) };
    let text_svma = obj
        .loads
        .iter()
        .find(|l| l.2 & libc::PF_X != 0)
        .map(|l| l.0..l.0 + l.1);
    Some(ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma,
        eh_frame_svma: Some(eh_vaddr..eh_end),
        eh_frame: Some(eh),
        eh_frame_hdr_svma: Some(hdr_vaddr..hdr_vaddr + hdr_len),
        eh_frame_hdr: Some(hdr),
        ..Default::default()
    })
}

/// End (vaddr) of the file-backed PT_LOAD segment containing `vaddr`.
fn segment_end(obj: &Object, vaddr: u64) -> Option<u64> {
    obj.loads
        .iter()
        .find(|l| l.0 <= vaddr && vaddr < l.0 + l.1)
        .map(|l| l.0 + l.1)
}

/// Decode a DWARF exception-header pointer of encoding `enc` at the start of `bytes`, which
/// sits at address `at`; `data` is the base of data-relative encodings.
fn decode_ptr(enc: u8, bytes: &[u8], at: u64, data: u64) -> Option<u64> {
    let raw: u64 = match enc & 0x0f {
        0x03 => u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as u64,
        0x0b => i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as i64 as u64,
        0x00 | 0x04 | 0x0c => u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    match enc & 0x70 {
        0x00 => Some(raw),
        0x10 => Some(at.wrapping_add(raw)),
        0x30 => Some(data.wrapping_add(raw)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_contains_own_code_and_libc_but_not_the_null_page() {
        let snap = current();
        let me = snapshot_contains_own_code_and_libc_but_not_the_null_page as *const () as u64;
        let own = snap.module_of(me).expect("own module");
        assert!(own.0 <= me && me < own.1);
        let libc_fn = libc::malloc as *const () as u64;
        assert!(snap.module_of(libc_fn).is_some_and(|r| r != own));
        assert_eq!(snap.module_of(8), None);
    }

    #[test]
    fn eh_frame_pointer_encodings_decode() {
        let b = (-16i32).to_le_bytes();
        assert_eq!(decode_ptr(0x1b, &b, 0x1000, 0), Some(0x1000 - 16));
        assert_eq!(decode_ptr(0x3b, &b, 0, 0x2000), Some(0x2000 - 16));
        assert_eq!(decode_ptr(0x03, &7u32.to_le_bytes(), 0, 0), Some(7));
        assert_eq!(decode_ptr(0x01, &b, 0, 0), None, "uleb128 is not supported");
        assert_eq!(decode_ptr(0x0b, &b[..2], 0, 0), None, "short input");
    }
}
