//! Which code was loaded when a stack was taken: module epochs.
//!
//! Problem: a stack holds raw return addresses, symbolized at dump time against the modules
//! loaded then. If a library was `dlclose`d after the capture and another mapped at the
//! same address, its frames would be attributed to the other library. (The DWARF unwinder
//! pins every module it walks, so this concerns the frame-pointer unwinder and any frame of
//! a module that unwinder never saw.)
//!
//! Policy: the epoch counts the `dlclose` calls the shim has seen (it interposes `dlclose`
//! when stacks are recorded). Before each one, every loaded module not yet known is noted
//! with the current epoch (it was loaded during it, since everything loaded during an
//! earlier epoch was noted at that epoch's end); after it, modules no longer loaded are
//! forgotten. A stack captured during epoch `e > 0` carries `e` as a tag word after its
//! frames (a non-canonical address, never a return address), so identical stacks of
//! different epochs are different stacks. At dump time, the modules loaded then are noted
//! the same way, and a frame whose address lies in a module noted with an epoch later than
//! its stack's was not that module's code when it was captured: it is shown as unknown,
//! never as another library's. A frame in no loaded module keeps the raw address.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// High bits of a stack's epoch tag word; the low 32 bits hold the epoch.
const TAG: u64 = 0xffff_fffe_0000_0000;
const TAG_MASK: u64 = 0xffff_ffff_0000_0000;

/// What a frame of unloaded code is replaced with before symbolization.
pub const UNKNOWN_IP: u64 = 0xffff_fffd_0000_0000;

static TRACKING: AtomicBool = AtomicBool::new(false);
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// A loaded module: address range, path, and the epoch it was first noted in.
struct Module {
    start: u64,
    end: u64,
    name: String,
    epoch: u64,
}

static KNOWN: Mutex<Vec<Module>> = Mutex::new(Vec::new());

/// The module registry's lock, held around `fork` (a leaf lock: nothing is taken under it).
pub struct ForkHold {
    _held: MutexGuard<'static, Vec<Module>>,
}

/// Take the registry's lock (before `fork`).
pub fn hold_for_fork() -> ForkHold {
    ForkHold {
        _held: KNOWN.lock().unwrap_or_else(PoisonError::into_inner),
    }
}

/// Turn the bookkeeping on (when stacks are recorded).
pub fn set_tracking(on: bool) {
    TRACKING.store(on, Ordering::Relaxed);
}

/// Whether `dlclose` calls are being counted.
pub fn tracking() -> bool {
    TRACKING.load(Ordering::Relaxed)
}

/// The tag word for a stack captured now, if any `dlclose` happened yet.
#[inline]
pub fn tag() -> Option<u64> {
    let e = EPOCH.load(Ordering::Acquire);
    (e > 0).then_some(TAG | e.min(u64::from(u32::MAX)))
}

/// Whether `word` is an epoch tag.
pub fn is_tag(word: u64) -> bool {
    word & TAG_MASK == TAG
}

/// Remove a trailing tag from `ips`; the stack's epoch (0 when untagged).
pub fn split_tag(ips: &mut Vec<u64>) -> u64 {
    match ips.last() {
        Some(&w) if is_tag(w) => {
            ips.pop();
            w & !TAG_MASK
        }
        _ => 0,
    }
}

/// Before the real `dlclose`: note what is loaded, then start a new epoch.
pub fn before_unload() {
    note_loaded();
    EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// After the real `dlclose`: forget the modules that are gone.
pub fn after_unload() {
    let loaded = loaded_modules();
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    known.retain(|m| {
        loaded
            .iter()
            .any(|(s, e, n)| (*s, *e) == (m.start, m.end) && *n == m.name)
    });
}

/// Note every loaded module not yet known, with the current epoch (also at dump time).
pub fn note_loaded() {
    if !tracking() {
        return;
    }
    let loaded = loaded_modules();
    let epoch = EPOCH.load(Ordering::Acquire);
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    for (start, end, name) in loaded {
        if !known
            .iter()
            .any(|m| (m.start, m.end) == (start, end) && m.name == name)
        {
            known.push(Module {
                start,
                end,
                name,
                epoch,
            });
        }
    }
}

/// Replace, in a stack of epoch `epoch`, every address of a module loaded after that epoch
/// with [`UNKNOWN_IP`]. Call [`note_loaded`] first (once per dump).
pub fn mark_unloaded(ips: &mut [u64], epoch: u64) {
    if !tracking() || EPOCH.load(Ordering::Acquire) == 0 {
        return;
    }
    let known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    for ip in ips.iter_mut() {
        if known
            .iter()
            .any(|m| m.start <= *ip && *ip < m.end && m.epoch > epoch)
        {
            *ip = UNKNOWN_IP;
        }
    }
}

/// `(start, end, path)` of every loaded module's PT_LOAD span.
fn loaded_modules() -> Vec<(u64, u64, String)> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our own Vec.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<(u64, u64, String)>)) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: the loader's program headers, dlpi_phnum of them.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for p in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
            let start = info.dlpi_addr.wrapping_add(p.p_vaddr);
            lo = lo.min(start);
            hi = hi.max(start.wrapping_add(p.p_memsz));
        }
        if lo < hi {
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                // SAFETY: a NUL-terminated string owned by the loader.
                unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
                    .to_string_lossy()
                    .into_owned()
            };
            out.push((lo, hi, name));
        }
        0
    }
    let mut out: Vec<(u64, u64, String)> = Vec::new();
    // SAFETY: the callback only reads the loader's data and pushes to `out`.
    unsafe {
        libc::dl_iterate_phdr(Some(visit), &mut out as *mut _ as *mut libc::c_void);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_are_never_return_addresses() {
        let mut ips = vec![0x40_1000, TAG | 7];
        assert!(is_tag(TAG | 7) && !is_tag(0x7fff_ffff_f000) && !is_tag(UNKNOWN_IP));
        assert_eq!(split_tag(&mut ips), 7);
        assert_eq!(ips, vec![0x40_1000]);
        assert_eq!(split_tag(&mut ips), 0);
    }
}
