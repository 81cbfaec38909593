//! Host backups of paused segments, and the driver-call helpers a pause and a resume share.
//!
//! Policy: a backup covers the bytes of a segment from its first block in use to the end of
//! its last (free bytes outside hold nothing the program may read); the backups of one pause
//! share one pinned host buffer (one host allocation, whatever the number of segments),
//! freed when the last of them goes; each is copied piece by piece, each piece summed on a
//! helper thread while the next is copied (`checksum.rs`); a resume sums the backup the same
//! way while copying it back and checks the sum, so a backup changed while paused is an
//! error, never silently restored. A driver call that
//! fails for another reason than lack of memory is tried up to three times.

use std::sync::Arc;

use super::checksum::{sums_behind, PIECE};
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
        let mut starts = Vec::with_capacity(parts.len());
        let mut at = 0u64;
        for &(_, _, len) in parts {
            starts.push(at);
            at += len.div_ceil(ALIGN) * ALIGN;
        }
        // SAFETY: each piece fed lies in our pinned buffer of `total` bytes (the parts'
        // aligned lengths), was just filled, and is not written again: the buffer outlives
        // the call (`buf`).
        let sums = unsafe {
            sums_behind(parts.len(), |feed| {
                for (i, &(dev, addr, len)) in parts.iter().enumerate() {
                    let mut done = 0u64;
                    while done < len {
                        let n = (len - done).min(PIECE);
                        let h = host + starts[i] + done;
                        retry(|| d.copy_to_host(dev, h, addr + done, n))?;
                        feed(i, h, n);
                        done += n;
                    }
                }
                Ok(())
            })
        }?;
        Ok(parts
            .iter()
            .zip(starts)
            .zip(sums)
            .map(|((&(_, addr, len), at), sum)| Backup {
                addr,
                len,
                buf: buf.clone(),
                at,
                sum,
            })
            .collect())
    }

    /// Copy the bytes back to where they came from, checking the checksum on the way.
    pub(crate) fn restore(&self, d: &dyn Device, dev: i32) -> Result<(), Option<DeviceError>> {
        let base = self.buf.host + self.at;
        // SAFETY: the backup's bytes lie in the shared pinned buffer, which this backup keeps
        // alive, and nothing writes them while they are copied back.
        let sums = unsafe {
            sums_behind(1, |feed| {
                let mut done = 0u64;
                while done < self.len {
                    let n = (self.len - done).min(PIECE);
                    retry(|| d.copy_to_device(dev, self.addr + done, base + done, n))?;
                    feed(0, base + done, n);
                    done += n;
                }
                Ok(())
            })
        }
        .map_err(Some)?;
        if sums.first() != Some(&self.sum) {
            return Err(None);
        }
        Ok(())
    }
}
