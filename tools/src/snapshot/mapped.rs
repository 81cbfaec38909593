//! A snapshot file mapped read-only into memory, so a JSON or msgpack parser reads it as
//! one slice (serde_json's slice parser scans strings in place and borrows them; its reader
//! parser takes the file a byte at a time, several times slower).
//!
//! Policy: memory stays bounded. The mapping's pages are the file's own (clean, shared
//! with the page cache, reclaimable by the kernel at any time), and the parser tells
//! [`Mapped::release_before`] how far it has got: the pages behind that point are given
//! back (`MADV_DONTNEED`), so the resident part of the mapping is a window of a few MB
//! around the parse point, not the file. A page given back and touched again (an error
//! message counting lines from the start) is read from the file again, unchanged.
//!
//! Invariant: the slice is the file's bytes as they were when mapped, provided nobody
//! truncates or rewrites the file while it is read (as with any mapping, truncating it then
//! ends the process with SIGBUS instead of an error line; snapshots are written once and
//! then read).

use std::cell::Cell;
use std::fs::File;

/// How far behind the parse point pages are given back, and how often.
pub const RELEASE_STEP: usize = 8 << 20;

/// A read-only private mapping of a whole file.
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
    /// Bytes from the start already given back (a multiple of the page size).
    released: Cell<usize>,
}

impl Mapped {
    /// Map `f` whole (an empty file is an empty slice, with nothing mapped).
    pub fn open(f: &File) -> Result<Mapped, String> {
        use std::os::unix::io::AsRawFd;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let len = usize::try_from(len).map_err(|_| "file too large to map".to_string())?;
        if len == 0 {
            return Ok(Mapped {
                ptr: std::ptr::null_mut(),
                len: 0,
                released: Cell::new(0),
            });
        }
        // SAFETY: a fresh read-only private mapping of an open file descriptor, at an
        // address the kernel chooses; nothing else refers to that memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mapping: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: advice on the mapping just made; it changes no contents.
        unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
        Ok(Mapped {
            ptr,
            len,
            released: Cell::new(0),
        })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is mapped readable for as long as `self` lives (unmapped
        // only in `drop`); the mapping is private and never written.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The parser has read up to byte `pos`: give back the whole pages more than
    /// [`RELEASE_STEP`] behind it.
    pub fn release_before(&self, pos: usize) {
        let page = page_size();
        let upto = pos.saturating_sub(RELEASE_STEP).min(self.len) / page * page;
        let from = self.released.get();
        if upto <= from {
            return;
        }
        // SAFETY: `from..upto` lies inside the mapping and starts on a page boundary (the
        // mapping does, and `from` is a multiple of the page size). On a private read-only
        // file mapping MADV_DONTNEED only drops the resident pages; a later read of them
        // reads the same bytes from the file again, so slices of `bytes()` stay valid.
        let r = unsafe {
            libc::madvise(
                (self.ptr as *mut u8).add(from).cast(),
                upto - from,
                libc::MADV_DONTNEED,
            )
        };
        if r == 0 {
            self.released.set(upto);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping made in `open`, unmapped once; no slice of it outlives
            // `self` (`bytes` borrows `self`).
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_mapped_file_reads_its_bytes_also_after_pages_are_given_back() {
        let dir = std::env::temp_dir().join(format!("cushim-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let data: Vec<u8> = (0..3 * RELEASE_STEP).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let m = Mapped::open(&std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(m.bytes(), &data[..]);
        m.release_before(2 * RELEASE_STEP + 123);
        assert!(m.released.get() > 0);
        assert_eq!(m.bytes(), &data[..]);
        let empty = dir.join("e");
        std::fs::File::create(&empty).unwrap();
        let e = Mapped::open(&std::fs::File::open(&empty).unwrap()).unwrap();
        assert!(e.bytes().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
