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
//! - A checked read is a system call, the larger part of its cost: [`Cached`] reads whole
//!   4 KiB blocks and serves later reads in them from its copy, for the life of one walk
//!   over memory that does not change during it (a thread's own frames, read by that
//!   thread). A 4 KiB-aligned block lies in one page, so it reads whenever the bytes asked
//!   for do.

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

/// Bytes per cached block.
const BLOCK: usize = 4096;
/// Blocks kept.
const BLOCKS: usize = 16;

/// The blocks a [`Cached`] reader keeps (64 KiB), reused from walk to walk.
pub struct Blocks {
    tags: [usize; BLOCKS],
    /// `BLOCKS` blocks of `BLOCK` bytes, on the heap (never built on a thread's stack).
    data: Box<[u8]>,
    next: usize,
}

impl Default for Blocks {
    fn default() -> Self {
        Blocks {
            tags: [usize::MAX; BLOCKS],
            data: vec![0; BLOCK * BLOCKS].into_boxed_slice(),
            next: 0,
        }
    }
}

/// [`Checked`] reads through whole blocks kept in `Blocks`; starts empty.
pub struct Cached<'a>(std::cell::RefCell<&'a mut Blocks>);

impl<'a> Cached<'a> {
    pub fn new(blocks: &'a mut Blocks) -> Self {
        blocks.tags = [usize::MAX; BLOCKS];
        Cached(std::cell::RefCell::new(blocks))
    }
}

impl Mem for Cached<'_> {
    fn read(&self, addr: usize, buf: &mut [u8]) -> bool {
        if addr == 0 {
            return false;
        }
        let Ok(mut b) = self.0.try_borrow_mut() else {
            return false;
        };
        let mut done = 0;
        while done < buf.len() {
            let Some(at) = addr.checked_add(done) else {
                return false;
            };
            let base = at & !(BLOCK - 1);
            let off = at - base;
            let take = (BLOCK - off).min(buf.len() - done);
            let slot = match b.tags.iter().position(|&t| t == base) {
                Some(i) => i,
                None => {
                    let i = b.next;
                    b.next = (i + 1) % BLOCKS;
                    b.tags[i] = usize::MAX;
                    if !Checked.read(base, &mut b.data[i * BLOCK..(i + 1) * BLOCK]) {
                        return false;
                    }
                    b.tags[i] = base;
                    i
                }
            };
            let from = slot * BLOCK + off;
            buf[done..done + take].copy_from_slice(&b.data[from..from + take]);
            done += take;
        }
        true
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

    #[test]
    fn cached_reads_match_the_memory_across_block_edges_and_refuse_unmapped_blocks() {
        let data: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 251) as u8).collect();
        let mut blocks = Blocks::default();
        let m = Cached::new(&mut blocks);
        let at = data.as_ptr() as usize;
        for (start, len) in [
            (0, 8),
            (BLOCK - 3, 8),
            (10, 2 * BLOCK),
            (2 * BLOCK + 5, 100),
        ] {
            let mut buf = vec![0u8; len];
            assert!(m.read(at + start, &mut buf));
            assert_eq!(&buf[..], &data[start..start + len]);
        }
        assert_eq!(m.word(16), None);
        assert_eq!(m.word(0), None);
    }
}
