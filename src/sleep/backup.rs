//! Host backups of paused segments, and the driver-call helpers a pause and a resume share.
//!
//! Policy: a backup covers the bytes of a segment from its first block in use to the end of
//! its last (free bytes outside hold nothing the program may read); the backups of one pause
//! share one pinned host buffer (one host allocation, whatever the number of segments),
//! freed when the last of them goes; each is copied and summed piece by piece; a resume checks the sum while copying back, so
//! a backup changed while paused is an error, never silently restored. A driver call that
//! fails for another reason than lack of memory is tried up to three times.

use std::sync::Arc;

use super::checksum::{fold, PIECE};
use crate::device::{DevPtr, DevResult, Device, DeviceError, PhysHandle};

/// Tries of a driver call that failed for another reason than lack of memory.
const TRIES: usize = 3;

pub(crate) fn retry<T>(mut f: impl FnMut() -> DevResult<T>) -> DevResult<T> {
    let mut last = f();
    for _ in 1..TRIES {
        match last {
            Err(e) if e != DeviceError::OutOfMemory => last = f(),
            _ => break,
        }
    }
    last
}

/// Map `h` over `[base, base + size)` and make it read-write; unmapped again on failure.
pub(crate) fn map_rw(
    d: &dyn Device,
    dev: i32,
    base: DevPtr,
    size: u64,
    h: PhysHandle,
) -> DevResult<()> {
    retry(|| d.map(dev, base, size, h))?;
    if let Err(e) = retry(|| d.set_access(dev, base, size)) {
        let _ = retry(|| d.unmap(dev, base, size));
        return Err(e);
    }
    Ok(())
}

/// One pinned host buffer holding the backups of one pause, given back when the last of
/// them is dropped (resumed, or its segment freed).
struct HostBuf {
    device: Arc<dyn Device>,
    host: DevPtr,
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        let _ = self.device.host_free(self.host);
    }
}

/// The bytes `[addr, addr + len)` of a device, in a pinned host buffer shared by the pause's
/// backups, with their checksum.
pub(crate) struct Backup {
    pub addr: DevPtr,
    pub len: u64,
    buf: Arc<HostBuf>,
    at: u64,
    sum: u64,
}

/// Where each backup starts in the shared buffer: page-aligned.
const ALIGN: u64 = 4096;

impl Backup {
    /// Copy each `(device, addr, len)` into one new pinned buffer (one host allocation per
    /// pause, the dearest call of a backup): the backups in the same order, or the error
    /// (nothing kept).
    pub(crate) fn take_all(
        device: &Arc<dyn Device>,
        parts: &[(i32, DevPtr, u64)],
    ) -> DevResult<Vec<Backup>> {
        let total: u64 = parts
            .iter()
            .map(|p| p.2.div_ceil(ALIGN) * ALIGN)
            .sum::<u64>()
            .max(1);
        let host = device.host_alloc(total, 0)?;
        let buf = Arc::new(HostBuf {
            device: device.clone(),
            host,
        });
        let d = &**device;
        let mut out = Vec::with_capacity(parts.len());
        let mut at = 0u64;
        for &(dev, addr, len) in parts {
            let mut sum = 0;
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(PIECE as u64);
                let h = host + at + done;
                retry(|| d.copy_to_host(dev, h, addr + done, n))?;
                // SAFETY: `h..h + n` lies in our pinned buffer of `total` bytes and was just
                // filled.
                let piece = unsafe { std::slice::from_raw_parts(h as *const u8, n as usize) };
                sum = fold(sum, piece);
                done += n;
            }
            out.push(Backup {
                addr,
                len,
                buf: buf.clone(),
                at,
                sum,
            });
            at += len.div_ceil(ALIGN) * ALIGN;
        }
        Ok(out)
    }

    /// Copy the bytes back to where they came from, checking the checksum on the way.
    pub(crate) fn restore(&self, d: &dyn Device, dev: i32) -> Result<(), Option<DeviceError>> {
        let base = self.buf.host + self.at;
        let mut sum = 0;
        let mut done = 0u64;
        while done < self.len {
            let n = (self.len - done).min(PIECE as u64);
            // SAFETY: the backup's bytes lie in the shared pinned buffer, which this backup
            // keeps alive.
            let piece =
                unsafe { std::slice::from_raw_parts((base + done) as *const u8, n as usize) };
            sum = fold(sum, piece);
            retry(|| d.copy_to_device(dev, self.addr + done, base + done, n)).map_err(Some)?;
            done += n;
        }
        if sum != self.sum {
            return Err(None);
        }
        Ok(())
    }
}
