//! Reads of this process's own memory, plain or checked.
//!
//! Policy, and why:
//! - [`Plain`] loads directly: for memory the caller knows is alive (a thread holding the
//!   GIL reading its own Python frames).
//! - [`Checked`] copies through `process_vm_readv` on the process itself, which fails with
//!   `EFAULT` instead of faulting on an unmapped address: for memory that another thread
//!   could free under the reader (a Python thread running native code without the GIL,
//!   whose thread state the interpreter's finalization frees without waiting for it). A
//!   read of freed but still mapped memory gives garbage, never a fault, so every value
//!   read this way is validated before it is followed. Reading one's own process needs no
//!   ptrace permission (the kernel allows its own thread group); a kernel or seccomp filter
//!   that refuses the call makes every checked read fail, which the caller treats as
//!   "nothing to read".
//! - Each read is one system call: callers read whole structures at once.

use std::ffi::c_void;

/// A source of bytes at addresses of this process.
pub trait Mem {
    /// Fill `buf` from `addr`; false when the memory could not be read.
    fn read(&self, addr: usize, buf: &mut [u8]) -> bool;

    /// The pointer-sized word at `addr`.
    fn word(&self, addr: usize) -> Option<usize> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| usize::from_ne_bytes(b))
    }
}

/// Direct loads: the caller guarantees the memory is alive and mapped.
pub struct Plain;

impl Mem for Plain {
    fn read(&self, addr: usize, buf: &mut [u8]) -> bool {
        if addr == 0 {
            return false;
        }
        // SAFETY: by this type's contract the caller only reads memory it knows to be
        // alive and at least `buf.len()` bytes long; an unaligned copy needs no alignment.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        true
    }
}

/// Fault-tolerant copies through `process_vm_readv` on this process.
pub struct Checked;

impl Mem for Checked {
    fn read(&self, addr: usize, buf: &mut [u8]) -> bool {
        if addr == 0 || buf.is_empty() {
            return addr != 0;
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut c_void,
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, writable for its length; the kernel validates
        // `remote` and answers EFAULT for any part of it that is not mapped readable.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        n == buf.len() as isize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_reads_copy_live_memory_and_refuse_unmapped_addresses() {
        let data: [u64; 2] = [0x1122_3344_5566_7788, 42];
        let at = data.as_ptr() as usize;
        assert_eq!(Checked.word(at), Some(0x1122_3344_5566_7788));
        assert_eq!(Checked.word(at + 8), Some(42));
        assert_eq!(Plain.word(at + 8), Some(42));
        // The first page is never mapped; a null pointer is refused without a call.
        assert_eq!(Checked.word(16), None);
        assert_eq!(Checked.word(0), None);
        assert_eq!(Plain.word(0), None);
    }
}
