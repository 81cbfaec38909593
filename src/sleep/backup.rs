//! Host backups of paused segments, and the driver-call helpers a pause and a resume share.
//!
//! Policy: a backup covers the bytes of a segment from its first block in use to the end of
//! its last (free bytes outside hold nothing the program may read). The backups of one pause
//! are laid out one after another (each from a page boundary) in pinned host buffers of
//! [`CHUNK`] bytes, pinned one after another on a helper thread while the caller copies into
//! those already pinned: pinning (the OS zeroes and locks every page) is the dearest part of
//! a backup after the copy, and this way the two overlap. A buffer is freed when the last
//! backup using it goes. Each backup is copied piece by piece, each piece summed on another
//! helper thread while the next is copied (`checksum.rs`); a resume sums the backup the same
//! way while copying it back and checks the sum, so a backup changed while paused is an
//! error, never silently restored. A driver call that fails for another reason than lack of
//! memory is tried up to three times.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
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

/// Bytes per pinned host buffer of a pause (the last one holds the rest): large enough that
/// a host allocation's fixed cost (about 2 ms on a GPU) is small against pinning its pages,
/// small enough that the first buffer, pinned before any copy can start, is a small part of
/// a large backup.
const CHUNK: u64 = 128 << 20;

/// Where each backup starts in the pause's host buffers: page-aligned.
const ALIGN: u64 = 4096;

/// One pinned host buffer holding backups of one pause, given back when the last backup
/// using it is dropped (resumed, or its segment freed).
struct HostBuf {
    device: Arc<dyn Device>,
    host: DevPtr,
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        let _ = self.device.host_free(self.host);
    }
}

/// Consecutive bytes of a backup in one host buffer.
struct Run {
    buf: Arc<HostBuf>,
    off: u64,
    len: u64,
}

impl Run {
    fn host(&self) -> DevPtr {
        self.buf.host + self.off
    }
}

/// The bytes `[addr, addr + len)` of a device, in runs of the pause's pinned host buffers,
/// with their checksum.
pub(crate) struct Backup {
    pub addr: DevPtr,
    pub len: u64,
    runs: Vec<Run>,
    sum: u64,
}

impl Backup {
    /// Copy each `(device, addr, len)` into pinned host memory: the backups in the same
    /// order, or the error (nothing kept, every buffer freed).
    pub(crate) fn take_all(
        device: &Arc<dyn Device>,
        parts: &[(i32, DevPtr, u64)],
    ) -> DevResult<Vec<Backup>> {
        let mut starts = Vec::with_capacity(parts.len());
        let mut total = 0u64;
        for &(_, _, len) in parts {
            starts.push(total);
            total += len.div_ceil(ALIGN) * ALIGN;
        }
        let sizes: Vec<u64> = (0..total.div_ceil(CHUNK))
            .map(|i| (total - i * CHUNK).min(CHUNK))
            .collect();
        let d = &**device;
        let own = |host: DevPtr| {
            Arc::new(HostBuf {
                device: device.clone(),
                host,
            })
        };
        // Every buffer is pinned ahead without waiting: the channel holds them all.
        let (tx, rx) = sync_channel::<DevResult<DevPtr>>(sizes.len().max(1));
        let mut bufs: Vec<Arc<HostBuf>> = Vec::with_capacity(sizes.len());
        let mut runs: Vec<Vec<Run>> = parts.iter().map(|_| Vec::new()).collect();
        // Set once the copies are over (done or failed): the pinner pins nothing more.
        let stop = AtomicBool::new(false);
        let sums = std::thread::scope(|s| {
            let (sizes, stop) = (&sizes, &stop);
            // One buffer is waited for in any case: a thread only pays from the second on.
            let pinner = (sizes.len() > 1)
                .then(|| {
                    crate::quiet_thread::spawn_quiet_scoped(s, "cushim-pin", move || {
                        for &n in sizes {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            let r = retry(|| d.host_alloc(n, 0));
                            let failed = r.is_err();
                            if tx.send(r).is_err() || failed {
                                break;
                            }
                        }
                    })
                    .ok()
                })
                .flatten();
            let pinning = pinner.is_some();
            // Buffer `c`: from the pinner, or pinned here when no thread could be started.
            let buffer = |c: usize, bufs: &mut Vec<Arc<HostBuf>>| -> DevResult<DevPtr> {
                while bufs.len() <= c {
                    let got = if pinning {
                        rx.recv().unwrap_or(Err(DeviceError::NotSupported))
                    } else {
                        retry(|| d.host_alloc(sizes[bufs.len()], 0))
                    };
                    bufs.push(own(got?));
                }
                Ok(bufs[c].host)
            };
            // SAFETY: each piece fed lies in a pinned buffer of `bufs` (within its size: a
            // piece never crosses a buffer's end), was just filled and is not written again;
            // `bufs` outlives the call.
            let sums = unsafe {
                sums_behind(parts.len(), total, |feed| {
                    for (i, &(dev, addr, len)) in parts.iter().enumerate() {
                        let mut done = 0u64;
                        while done < len {
                            let at = starts[i] + done;
                            let (c, off) = ((at / CHUNK) as usize, at % CHUNK);
                            let n = (len - done).min(PIECE).min(CHUNK - off);
                            let h = buffer(c, &mut bufs)? + off;
                            retry(|| d.copy_to_host(dev, h, addr + done, n))?;
                            feed(i, h, n);
                            match runs[i].last_mut() {
                                Some(r)
                                    if Arc::ptr_eq(&r.buf, &bufs[c]) && r.off + r.len == off =>
                                {
                                    r.len += n
                                }
                                _ => runs[i].push(Run {
                                    buf: bufs[c].clone(),
                                    off,
                                    len: n,
                                }),
                            }
                            done += n;
                        }
                    }
                    Ok(())
                })
            };
            stop.store(true, Ordering::Relaxed);
            if let Some(p) = pinner {
                let _ = p.join();
            }
            sums
        });
        // Buffers pinned after a failure are given back here.
        while let Ok(r) = rx.try_recv() {
            if let Ok(host) = r {
                drop(own(host));
            }
        }
        let sums = sums?;
        Ok(parts
            .iter()
            .zip(runs)
            .zip(sums)
            .map(|((&(_, addr, len), runs), sum)| Backup {
                addr,
                len,
                runs,
                sum,
            })
            .collect())
    }

    /// Copy the bytes back to where they came from, checking the checksum on the way.
    pub(crate) fn restore(&self, d: &dyn Device, dev: i32) -> Result<(), Option<DeviceError>> {
        // SAFETY: the backup's runs lie in pinned buffers this backup keeps alive, and
        // nothing writes them while they are copied back.
        let sums = unsafe {
            sums_behind(1, self.len, |feed| {
                let mut to = self.addr;
                for r in &self.runs {
                    let mut done = 0u64;
                    while done < r.len {
                        let n = (r.len - done).min(PIECE);
                        let h = r.host() + done;
                        retry(|| d.copy_to_device(dev, to + done, h, n))?;
                        feed(0, h, n);
                        done += n;
                    }
                    to += r.len;
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
