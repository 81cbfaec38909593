//! The frame-pointer unwinder: follows the saved-frame-pointer chain by hand.
//!
//! Invariant: every word read lies inside `[current sp, top of this thread's stack)`, is
//! 8-byte aligned, and each frame is strictly above the previous one, so a broken chain
//! (code built without frame pointers) ends the walk instead of faulting. The thread's
//! stack top is looked up once per thread (`pthread_getattr_np`) and cached.

use crate::trace::stack::SkipRange;
use std::cell::Cell;

thread_local! {
    /// Top (highest address) of the calling thread's stack; 0 until looked up, 1 if unknown.
    static STACK_TOP: Cell<usize> = const { Cell::new(0) };
}

fn stack_top() -> Option<usize> {
    let cached = STACK_TOP.try_with(Cell::get).ok()?;
    if cached > 1 {
        return Some(cached);
    }
    if cached == 1 {
        return None;
    }
    let top = lookup_stack_top();
    let _ = STACK_TOP.try_with(|c| c.set(top.unwrap_or(1)));
    top
}

fn lookup_stack_top() -> Option<usize> {
    crate::trace::thread_stack::bounds().map(|(_, hi)| hi as usize)
}

/// Walk a frame chain starting at frame pointer `fp`, reading only inside `lo..hi`.
/// Each frame is `[saved fp, return address]`.
pub fn walk_chain(mut fp: usize, lo: usize, hi: usize, buf: &mut [u64], skip: &SkipRange) -> usize {
    let mut n = 0;
    let mut leading = true;
    while n < buf.len() {
        if fp < lo || fp % 8 != 0 || fp.checked_add(16).map_or(true, |end| end > hi) {
            break;
        }
        // SAFETY: fp..fp+16 lies in lo..hi, which the caller guarantees is readable
        // (the live part of this thread's stack, or a test's buffer), and is aligned.
        let (next, ret) = unsafe {
            (
                std::ptr::read_volatile(fp as *const usize),
                std::ptr::read_volatile((fp + 8) as *const usize),
            )
        };
        if ret == 0 {
            break;
        }
        if !(leading && skip.contains(ret)) {
            leading = false;
            buf[n] = ret as u64;
            n += 1;
        }
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// Walk the calling thread's chain from frame pointer `fp` (a frame of this thread that is
/// still live, e.g. `__builtin_frame_address(0)` of a caller), within the thread's stack.
#[inline(never)]
pub fn capture_from(fp: usize, buf: &mut [u64], skip: &SkipRange) -> usize {
    let Some(hi) = stack_top() else { return 0 };
    let (_, sp) = registers();
    if sp == 0 {
        return 0;
    }
    walk_chain(fp, sp, hi, buf, skip)
}

/// See [`crate::trace::stack::capture`].
#[inline(never)]
pub fn capture(buf: &mut [u64], skip: &SkipRange) -> usize {
    let Some(hi) = stack_top() else { return 0 };
    let (fp, sp) = registers();
    if sp == 0 {
        return 0;
    }
    walk_chain(fp, sp, hi, buf, skip)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn registers() -> (usize, usize) {
    let (fp, sp): (usize, usize);
    // SAFETY: reads two registers, touches no memory.
    unsafe {
        std::arch::asm!("mov {}, rbp", "mov {}, rsp", out(reg) fp, out(reg) sp,
            options(nomem, nostack, preserves_flags));
    }
    (fp, sp)
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn registers() -> (usize, usize) {
    let (fp, sp): (usize, usize);
    // SAFETY: reads two registers, touches no memory.
    unsafe {
        std::arch::asm!("mov {}, x29", "mov {}, sp", out(reg) fp, out(reg) sp,
            options(nomem, nostack, preserves_flags));
    }
    (fp, sp)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn registers() -> (usize, usize) {
    (0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake stack: frames at word indices `at`, each linking to the next.
    fn fake_stack(at: &[usize], rets: &[usize]) -> Vec<usize> {
        let mut mem = vec![0usize; 64];
        let base = mem.as_ptr() as usize;
        for (i, &w) in at.iter().enumerate() {
            mem[w] = at.get(i + 1).map_or(0, |&nx| base + nx * 8);
            mem[w + 1] = rets[i];
        }
        mem
    }

    #[test]
    fn walks_a_valid_chain_innermost_first() {
        let mem = fake_stack(&[2, 10, 20], &[0x1000, 0x2000, 0x3000]);
        let (lo, hi) = (mem.as_ptr() as usize, mem.as_ptr() as usize + mem.len() * 8);
        let mut buf = [0u64; 8];
        let n = walk_chain(lo + 16, lo, hi, &mut buf, &SkipRange::NONE);
        assert_eq!(&buf[..n], &[0x1000, 0x2000, 0x3000]);
    }

    #[test]
    fn leading_skip_frames_are_dropped_but_not_later_ones() {
        let mem = fake_stack(&[0, 4, 8, 12], &[0x1100, 0x1200, 0x5000, 0x1300]);
        let (lo, hi) = (mem.as_ptr() as usize, mem.as_ptr() as usize + mem.len() * 8);
        let mut buf = [0u64; 8];
        let skip = SkipRange {
            lo: 0x1000,
            hi: 0x2000,
        };
        let n = walk_chain(lo, lo, hi, &mut buf, &skip);
        assert_eq!(&buf[..n], &[0x5000, 0x1300]);
    }

    #[test]
    fn broken_chains_stop_instead_of_faulting() {
        let mut mem = fake_stack(&[0, 4, 8], &[1, 2, 3]);
        let (lo, hi) = (mem.as_ptr() as usize, mem.as_ptr() as usize + mem.len() * 8);
        let mut buf = [0u64; 8];
        // A link pointing outside the stack (to an unmapped address).
        mem[4] = 0x10;
        assert_eq!(walk_chain(lo, lo, hi, &mut buf, &SkipRange::NONE), 2);
        // A link pointing downwards (a loop).
        mem[4] = lo;
        assert_eq!(walk_chain(lo, lo, hi, &mut buf, &SkipRange::NONE), 2);
        // Misaligned start, start outside, frame straddling the top.
        assert_eq!(walk_chain(lo + 3, lo, hi, &mut buf, &SkipRange::NONE), 0);
        assert_eq!(
            walk_chain(0xdead_0000, lo, hi, &mut buf, &SkipRange::NONE),
            0
        );
        assert_eq!(walk_chain(hi - 8, lo, hi, &mut buf, &SkipRange::NONE), 0);
    }

    #[test]
    fn buffer_limit_is_respected() {
        let mem = fake_stack(&[0, 4, 8, 12], &[1, 2, 3, 4]);
        let (lo, hi) = (mem.as_ptr() as usize, mem.as_ptr() as usize + mem.len() * 8);
        let mut buf = [0u64; 2];
        assert_eq!(walk_chain(lo, lo, hi, &mut buf, &SkipRange::NONE), 2);
    }

    #[test]
    fn live_capture_stays_inside_the_thread_stack() {
        // Whatever the build's frame-pointer setting, the walk must return and every
        // frame read must have come from this thread's stack.
        let top = stack_top().expect("stack bounds of the test thread");
        let here = &top as *const usize as usize;
        assert!(here < top);
        let mut buf = [0u64; 64];
        let n = capture(&mut buf, &SkipRange::NONE);
        assert!(n <= 64);
    }
}
