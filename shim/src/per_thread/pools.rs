//! The stubs handed out for driver entry points: per check routine, pools of 64 slots and
//! a block of 64 stubs of 16 bytes, stub `i` loading the address of slot `i` and jumping to
//! the routine. A slot, once given a target, keeps it for the life of the process (a
//! lookup of the same function gets the same stub again).

use std::sync::atomic::Ordering;

use super::{tails, Check, Slot};

const POOL: usize = 64;

const fn empty() -> [Slot; POOL] {
    [const { Slot::new(c"") }; POOL]
}

macro_rules! pool {
    ($block:ident, $slots:ident, $routine:ident, $($i:literal)*) => {
        static $slots: [Slot; POOL] = empty();

        /// Stub `i` at 16-byte step `i` from the block's aligned start.
        #[unsafe(naked)]
        unsafe extern "C" fn $block() {
            core::arch::naked_asm!(
                ".balign 16",
                $(concat!(
                    "lea rax, [rip + {slots} + ", stringify!($i), " * {size}]\n",
                    "jmp {routine}\n",
                    ".balign 16"
                ),)*
                slots = sym $slots,
                routine = sym tails::$routine,
                size = const std::mem::size_of::<Slot>(),
            )
        }
    };
}

macro_rules! pools {
    ($(($check:expr, $block:ident, $slots:ident, $routine:ident)),* $(,)?) => {
        $(pool!($block, $slots, $routine, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);)*

        /// Every pool: its check, slots and stub block.
        fn all() -> [(Check, &'static [Slot; POOL], usize); COUNT] {
            [$(($check, &$slots, $block as *const () as usize)),*]
        }
    };
}

const COUNT: usize = 15;

pools!(
    (Check::Always, b_always, S_ALWAYS, always),
    (Check::Always, b_always2, S_ALWAYS2, always),
    (Check::Always, b_always3, S_ALWAYS3, always),
    (Check::Always, b_always4, S_ALWAYS4, always),
    (Check::Arg(0), b_arg0, S_ARG0, arg0),
    (Check::Arg(1), b_arg1, S_ARG1, arg1),
    (Check::Arg(2), b_arg2, S_ARG2, arg2),
    (Check::Arg(3), b_arg3, S_ARG3, arg3),
    (Check::Arg(4), b_arg4, S_ARG4, arg4),
    (Check::Arg(5), b_arg5, S_ARG5, arg5),
    (Check::Arg(6), b_arg6, S_ARG6, arg6),
    (Check::Arg(7), b_arg7, S_ARG7, arg7),
    (Check::Arg(8), b_arg8, S_ARG8, arg8),
    (Check::Field0(32), b_field0_32, S_FIELD0_32, field0_32),
    (Check::Field2(8), b_field2_8, S_FIELD2_8, field2_8),
);

/// The stub of `check`'s pool that jumps to `got`: the one already given `got`, else the
/// first free one; `None` when the pool is full (or `check` has no routine).
pub fn take(check: Check, got: usize) -> Option<usize> {
    for (c, slots, block) in all() {
        if c != check {
            continue;
        }
        let base = (block + 15) & !15;
        for (i, slot) in slots.iter().enumerate() {
            let t = match slot
                .target
                .compare_exchange(0, got, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => got,
                Err(t) => t,
            };
            if t == got {
                return Some(base + 16 * i);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stub_loads_its_own_slot() {
        // `lea rax, [rip + disp32]` is 48 8d 05 disp32; the slot is at the next instruction
        // plus disp32.
        for (_, slots, block) in all() {
            let base = (block + 15) & !15;
            for (i, slot) in slots.iter().enumerate() {
                let at = base + 16 * i;
                // SAFETY: reads the stub's own code bytes, mapped readable in the text segment.
                let code = unsafe { std::slice::from_raw_parts(at as *const u8, 7) };
                assert_eq!(&code[..3], &[0x48, 0x8d, 0x05], "stub {i}");
                let disp = i32::from_le_bytes([code[3], code[4], code[5], code[6]]);
                let target = (at as i64 + 7 + disp as i64) as usize;
                assert_eq!(target, slot as *const Slot as usize, "stub {i}");
            }
        }
    }
}
