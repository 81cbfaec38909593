//! Native stack capture: raw return addresses into a caller-provided buffer.
//!
//! Invariant: `capture` writes only into `buf`, never allocates (after a thread's first
//! capture, which caches the thread's stack bounds and, for DWARF, its unwind-rule caches;
//! and after the module list was built), never symbolizes, and drops
//! the leading frames whose address lies in the [`SkipRange`] (the shim's own code), so
//! `buf[0]` is the program's call site. Entries are return addresses: a symbolizer looks
//! up `ip - 1`. Never call it from a signal handler (the DWARF unwinder may take loader
//! locks); the shim's handler only writes a byte to a pipe.

use crate::config::history::Unwinder;
use crate::trace::event::StackId;
use crate::trace::intern::StackTable;

/// An address range `lo..hi` whose frames are dropped from the top of a stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SkipRange {
    pub lo: usize,
    pub hi: usize,
}

impl SkipRange {
    /// Skip nothing.
    pub const NONE: SkipRange = SkipRange { lo: 0, hi: 0 };

    /// Whether `ip` lies in the range.
    pub fn contains(&self, ip: usize) -> bool {
        self.lo <= ip && ip < self.hi
    }

    /// The extent of the loaded segments of the module (executable or shared object)
    /// containing `addr`; [`SkipRange::NONE`] if no module contains it. The shim passes the
    /// address of one of its own functions.
    pub fn of_module_containing(addr: usize) -> SkipRange {
        struct Search {
            addr: usize,
            found: SkipRange,
        }
        unsafe extern "C" fn visit(
            info: *mut libc::dl_phdr_info,
            _size: libc::size_t,
            data: *mut libc::c_void,
        ) -> libc::c_int {
            // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call and
            // `data` is the `Search` we handed it.
            let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
            if info.dlpi_phdr.is_null() {
                return 0;
            }
            // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
            let phdrs =
                unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
            let base = info.dlpi_addr as usize;
            let (mut lo, mut hi, mut hit) = (usize::MAX, 0usize, false);
            for p in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
                let start = base.wrapping_add(p.p_vaddr as usize);
                let end = start.wrapping_add(p.p_memsz as usize);
                lo = lo.min(start);
                hi = hi.max(end);
                hit |= start <= search.addr && search.addr < end;
            }
            if hit {
                search.found = SkipRange { lo, hi };
                return 1;
            }
            0
        }
        let mut search = Search {
            addr,
            found: SkipRange::NONE,
        };
        // SAFETY: `visit` matches the callback signature and only touches `search`, which
        // outlives the call.
        unsafe {
            libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut libc::c_void);
        }
        search.found
    }
}

/// Capture the calling thread's stack into `buf` (innermost first), dropping leading frames
/// inside `skip`. Returns the number of frames written.
#[inline(never)]
pub fn capture(buf: &mut [u64], unwinder: Unwinder, skip: &SkipRange) -> usize {
    match unwinder {
        Unwinder::Dwarf => crate::trace::unwind_dwarf::capture(buf, skip),
        Unwinder::Fp => crate::trace::unwind_fp::capture(buf, skip),
    }
}

/// Largest stack captured by [`capture_id`].
pub const CAPTURE_MAX: usize = crate::config::history::MAX_MAX_FRAMES;

/// Frames a capture of the default depth fits in, with the room [`intern_tagged`] needs
/// for a module epoch's tag after them.
const SMALL_CAPTURE: usize = crate::config::history::DEFAULT_MAX_FRAMES + 1;

/// Run `f` on a zeroed frame buffer on the stack, of at least `max_frames + 1` words (the
/// tag's room), or [`CAPTURE_MAX`] words when more are asked for.
///
/// Why two sizes: the buffer is zeroed on every capture, and [`CAPTURE_MAX`] words are
/// 8 KiB: zeroing them was a quarter of a recorded pair's time with native stacks at the
/// default depth, which needs 65 words.
#[inline(always)]
pub fn with_frame_buf<R>(max_frames: usize, f: impl FnOnce(&mut [u64]) -> R) -> R {
    if max_frames < SMALL_CAPTURE {
        f(&mut [0u64; SMALL_CAPTURE])
    } else {
        f(&mut [0u64; CAPTURE_MAX])
    }
}

/// Capture at most `max_frames` frames and intern them in the global [`StackTable`].
#[inline(never)]
pub fn capture_id(max_frames: usize, unwinder: Unwinder, skip: &SkipRange) -> StackId {
    let max = max_frames.clamp(1, CAPTURE_MAX);
    with_frame_buf(max, |buf| {
        let n = capture(&mut buf[..max], unwinder, skip);
        intern_tagged(buf, n)
    })
}

/// Intern the first `n` words of `buf` in the global [`StackTable`]; once any `dlclose`
/// happened, the stack's epoch tag goes after them (module_epochs.rs), in place of the last
/// frame when `buf` is full.
pub(crate) fn intern_tagged(buf: &mut [u64], n: usize) -> StackId {
    let mut n = n.min(buf.len());
    if n > 0 {
        if let Some(t) = crate::trace::module_epochs::tag() {
            n = (n + 1).min(buf.len());
            buf[n - 1] = t;
        }
    }
    StackTable::global().intern(&buf[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_range_of_own_function_contains_it() {
        let f = module_range_of_own_function_contains_it as *const () as usize;
        let r = SkipRange::of_module_containing(f);
        assert!(r.contains(f), "{r:?} should contain {f:#x}");
        assert!(
            !r.contains(libc::malloc as *const () as usize),
            "libc is another module"
        );
    }

    #[test]
    fn unmapped_address_has_no_module() {
        assert_eq!(SkipRange::of_module_containing(8), SkipRange::NONE);
    }

    #[test]
    fn skipping_the_whole_program_leaves_only_foreign_frames() {
        let me = skipping_the_whole_program_leaves_only_foreign_frames as *const () as usize;
        let skip = SkipRange::of_module_containing(me);
        let mut buf = [0u64; 64];
        let n = capture(&mut buf, Unwinder::Dwarf, &skip);
        // The test binary calls itself from start to here: every leading frame is inside
        // it, so what remains starts outside (libc's thread start) or nothing at all.
        assert!(buf[..n]
            .first()
            .map_or(true, |ip| !skip.contains(*ip as usize)));
    }
}
