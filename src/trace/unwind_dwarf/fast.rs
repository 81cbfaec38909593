//! The fast DWARF walk: framehop over the shared module snapshot, with per-thread caches
//! of unwind rules keyed by return address.
//!
//! Invariant: every stack word read lies in `[sp at capture, top of this thread's stack)`
//! and is 8-byte aligned, and each frame's sp is strictly above the previous one, so bad
//! unwind info ends the walk instead of faulting or looping; a return address in no known
//! module (after asking the loader for new ones) is reported and ends the walk, as libgcc
//! does. After a thread's first call (which builds its caches and looks up its stack
//! bounds) the walk allocates nothing and takes no lock, unless the module snapshot was replaced (one lock to pick up the new one)
//! or an address lies in no known module (the loader's lock, to see whether to refresh).

use super::modules::{self, Snapshot};
use crate::trace::stack::SkipRange;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, MustNotAllocateDuringUnwind, Unwinder as _};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// Frames the walk may drop as leading skip-range frames, beyond the buffer's length.
const MAX_SKIPPED: usize = 256;

/// Stack the fast path wants free below the caller: a rule-cache miss evaluates the DWARF
/// program with fixed-size tables on the stack (tens of KiB); with less room left, libgcc
/// (a few KiB) takes the capture instead.
const STACK_HEADROOM: u64 = 128 << 10;

/// framehop's rule cache is direct-mapped on `address % 509`: two hot return addresses
/// that share a slot would miss on every walk (a full `.eh_frame` lookup each).
/// Each thread keeps [`WAYS`] caches and sends an address to the one picked by
/// `address / 509`, so such a pair usually lands in different caches.
const FRAMEHOP_SLOTS: u64 = 509;
const WAYS: usize = 4;

struct ThreadState {
    snap: Arc<Snapshot>,
    /// [`modules::generation`] when `snap` was taken.
    generation: u64,
    caches: [CacheX86_64<MustNotAllocateDuringUnwind>; WAYS],
    /// This thread's stack, `lo..hi`.
    stack: (u64, u64),
}

thread_local! {
    static STATE: RefCell<Option<ThreadState>> = const { RefCell::new(None) };
}

impl ThreadState {
    fn new(stack: (u64, u64)) -> ThreadState {
        let generation = modules::generation();
        ThreadState {
            snap: modules::current(),
            generation,
            caches: std::array::from_fn(|_| CacheX86_64::new_in()),
            stack,
        }
    }

    /// Pick up a replaced snapshot.
    fn sync(&mut self) {
        let g = modules::generation();
        if g != self.generation {
            self.generation = g;
            self.snap = modules::current();
        }
    }
}

/// Capture like [`crate::trace::stack::capture`]; `None` when this thread cannot use the fast
/// path (its state is being torn down or in use, the stack pointer is outside the thread's
/// known stack, or too near its end), so the caller falls back to the general unwinder.
#[inline(never)]
pub fn capture(buf: &mut [u64], skip: &SkipRange) -> Option<usize> {
    let (pc, sp, bp) = registers();
    STATE
        .try_with(|cell| {
            let mut guard = cell.try_borrow_mut().ok()?;
            let st = match &mut *guard {
                Some(st) if has_room(st.stack, sp) => st,
                Some(_) => return None,
                None => {
                    let stack = stack_bounds()?;
                    if !has_room(stack, sp) {
                        return None;
                    }
                    guard.insert(ThreadState::new(stack))
                }
            };
            st.sync();
            // A second pass only if the first met a newly loaded module.
            match walk(st, (pc, sp, bp), buf, skip) {
                Walk::Done(n) => Some(n),
                Walk::Refreshed => {
                    st.sync();
                    match walk(st, (pc, sp, bp), buf, skip) {
                        Walk::Done(n) => Some(n),
                        Walk::Refreshed => None,
                    }
                }
            }
        })
        .ok()
        .flatten()
}

/// Which of a thread's caches holds the rule for lookup address `addr`.
fn way_of(addr: u64) -> usize {
    (addr / FRAMEHOP_SLOTS) as usize % WAYS
}

/// Whether `sp` lies in the thread's stack `lo..hi` with [`STACK_HEADROOM`] free below it.
fn has_room((lo, hi): (u64, u64), sp: u64) -> bool {
    lo.saturating_add(STACK_HEADROOM) <= sp && sp < hi
}

enum Walk {
    Done(usize),
    /// An address in no known module led to a new snapshot: walk again.
    Refreshed,
}

fn walk(
    st: &mut ThreadState,
    (pc, sp, bp): (u64, u64, u64),
    buf: &mut [u64],
    skip: &SkipRange,
) -> Walk {
    let (lo, hi) = (sp, st.stack.1);
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        if addr < lo || addr % 8 != 0 || addr >= hi - 7 {
            return Err(());
        }
        // SAFETY: `addr..addr+8` is aligned and lies between this thread's current stack
        // pointer and the top of its stack: live, mapped stack memory.
        Ok(unsafe { std::ptr::read_volatile(addr as *const u64) })
    };
    let mut regs = UnwindRegsX86_64::new(pc, sp, bp);
    let mut addr = FrameAddress::from_instruction_pointer(pc);
    let (mut n, mut leading) = (0, true);
    // The module of the previous frame: consecutive frames are mostly in the same one.
    let mut module = (0u64, 0u64);
    let mut budget = buf.len() + MAX_SKIPPED;
    while n < buf.len() && budget > 0 {
        budget -= 1;
        let prev_sp = regs.sp();
        let cache = &mut st.caches[way_of(addr.address_for_lookup())];
        let ra = match st
            .snap
            .unwinder
            .unwind_frame(addr, &mut regs, cache, &mut read_stack)
        {
            Ok(Some(ra)) => ra,
            Ok(None) | Err(_) => break,
        };
        let Some(next) = FrameAddress::from_return_address(ra) else {
            break;
        };
        if regs.sp() <= prev_sp {
            break;
        }
        let known = (module.0 <= ra && ra < module.1)
            || match st.snap.module_of(ra) {
                Some(m) => {
                    module = m;
                    true
                }
                None => false,
            };
        if !known {
            // Possibly a library loaded after the snapshot: ask the loader.
            if modules::refresh_after(&st.snap) {
                return Walk::Refreshed;
            }
        }
        if !(leading && skip.contains(ra as usize)) {
            leading = false;
            buf[n] = ra;
            n += 1;
        }
        if !known {
            // No unwind rules for this frame: like libgcc, report it and stop here
            // rather than guess its caller.
            break;
        }
        addr = next;
    }
    Walk::Done(n)
}

/// This thread's stack `lo..hi`, looked up once per thread (`None` if unknown).
fn stack_bounds() -> Option<(u64, u64)> {
    thread_local! {
        /// (0, 0) until looked up; (1, 1) if the lookup failed.
        static BOUNDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }
    let cached = BOUNDS.try_with(Cell::get).ok()?;
    match cached {
        (0, 0) => {
            let found = crate::trace::thread_stack::bounds();
            let _ = BOUNDS.try_with(|b| b.set(found.unwrap_or((1, 1))));
            found
        }
        (1, 1) => None,
        known => Some(known),
    }
}

/// The instruction pointer, stack pointer and frame pointer at this point of the caller.
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, touches no memory.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    (pc, sp, bp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_sharing_a_framehop_slot_go_to_different_caches() {
        let a = 0x5555_1234_5678u64;
        let ways: Vec<usize> = (0..WAYS as u64)
            .map(|k| way_of(a + k * FRAMEHOP_SLOTS))
            .collect();
        let mut distinct = ways.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), WAYS, "{ways:?}");
    }

    #[test]
    fn room_needs_headroom_above_the_stack_bottom() {
        let (lo, hi) = (0x10_0000u64, 0x90_0000u64);
        assert!(has_room((lo, hi), hi - 8));
        assert!(!has_room((lo, hi), lo + 8), "too near the end");
        assert!(!has_room((lo, hi), hi), "outside");
    }
}
