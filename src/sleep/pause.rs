//! Pausing and resuming a tag's segments (`arena.rs` is the cache they belong to).
//!
//! Invariants (under the arena's one lock): a segment is either live (its physical memory
//! mapped read-write over the whole reservation, its free blocks in the pool) or paused
//! (nothing mapped, its free blocks out of the pool so nothing is served from it; in backup
//! mode the bytes of its blocks in use in a pinned host buffer with their checksum). A pause
//! or resume of a tag changes every matching segment or none: each step that can fail is
//! undone for the segments it already changed before the error is returned, so a failed
//! pause leaves the tag live and a failed resume leaves it paused, whole, resumable later
//! (its backups kept). A physical handle is released only once nothing maps it; a release
//! the driver refuses is retried, and a handle it keeps refusing stays with its segment (and
//! is mapped again at resume), so every handle is released by the time its segment is.
//!
//! A pause first waits for the device's work behind the cache's waiting frees (`arena.rs`,
//! stream safety), which makes them reusable, then gives the tag's fully free cached segments back (they hold nothing to keep),
//! so pausing releases the whole of the tag's memory. An allocation in a paused tag gets a
//! new live segment; the paused ones come back with the next resume.

use std::collections::BTreeMap;

use super::arena::{Paused, Seg, SleepArena, SleepError, SleepOutcome, State};
use super::backup::{map_rw, retry, Backup};
use super::tag;
use super::Mode;
use crate::device::{DevPtr, PhysHandle};

impl State {
    fn tag_matches(&self, s: &Seg, want: Option<&str>) -> bool {
        self.tags
            .get(s.tag as usize)
            .is_some_and(|t| tag::matches(t, want))
    }

    /// Segment `base`'s blocks: (first, end) indexes into `blocks`.
    fn span(&self, base: DevPtr, size: u64) -> (usize, usize) {
        let from = self.blocks.partition_point(|(a, _)| *a < base);
        let to = self.blocks.partition_point(|(a, _)| *a < base + size);
        (from, to)
    }

    /// The bytes of segment `base` from its first block in use to the end of its last.
    fn used_extent(&self, base: DevPtr) -> Option<(DevPtr, u64)> {
        let s = self.segs.get(&base)?;
        let (from, to) = self.span(base, s.size);
        let used = || self.blocks[from..to].iter().filter(|(_, b)| b.used);
        let lo = used().map(|(a, _)| *a).next()?;
        let hi = used().map(|(a, b)| a + b.size).next_back()?;
        Some((lo, hi - lo))
    }

    /// Take segment `base`'s free blocks out of the pool (`out`) or put them back.
    fn pool_segment(&mut self, base: DevPtr, out: bool) {
        let Some(s) = self.segs.get(&base) else {
            return;
        };
        let (dev, t, large, size) = (s.dev, s.tag, s.large, s.size);
        let (from, to) = self.span(base, size);
        for j in from..to {
            let (a, b) = self.blocks[j];
            if b.is_free() {
                let k = (dev, t, large, b.size, a);
                if out {
                    self.pool_remove(k);
                } else {
                    self.pool_insert(k);
                }
            }
        }
    }
}

impl SleepArena {
    /// Pause every live segment of the tags `want` names (`None`: every tag): their cached
    /// free segments are given back, the device's work is waited for, backups are made
    /// (backup mode), then every segment is unmapped and its physical memory released. All
    /// or nothing.
    pub fn pause(&self, want: Option<&str>, mode: Mode) -> Result<SleepOutcome, SleepError> {
        let d = &*self.device;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        // Freed blocks waiting for an ordering point: the device's work is waited for, then
        // they are reusable (and a segment that holds only them is fully free).
        let mut waiting: Vec<i32> = st.waiting.iter().map(|w| w.1).collect();
        waiting.sort_unstable();
        waiting.dedup();
        for &dev in &waiting {
            d.synchronize_device(dev)?;
        }
        let upto = st.freed;
        st.release_waiting(None, upto);
        let tags: Vec<u32> = (0..st.tags.len() as u32)
            .filter(|&t| tag::matches(&st.tags[t as usize], want))
            .collect();
        let mut out = SleepOutcome {
            released: self.release_idle(st, |s| tags.contains(&s.tag)),
            ..SleepOutcome::default()
        };
        let keys: Vec<DevPtr> = st
            .segs
            .iter()
            .filter(|(_, s)| s.paused.is_none() && st.tag_matches(s, want))
            .map(|(&a, _)| a)
            .collect();
        if keys.is_empty() {
            return Ok(out);
        }
        let mut devs: Vec<i32> = keys.iter().map(|k| st.segs[k].dev).collect();
        devs.sort_unstable();
        devs.dedup();
        for &dev in &devs {
            d.synchronize_device(dev)?;
        }
        // Backups first: nothing is unmapped until every byte is safe on the host.
        let mut backups: Vec<Option<Backup>> = Vec::with_capacity(keys.len());
        if mode == Mode::Backup {
            let extents: Vec<Option<(i32, DevPtr, u64)>> = keys
                .iter()
                .map(|k| {
                    st.used_extent(*k)
                        .map(|(lo, len)| (st.segs[k].dev, lo, len))
                })
                .collect();
            let parts: Vec<(i32, DevPtr, u64)> = extents.iter().flatten().copied().collect();
            let mut taken = if parts.is_empty() {
                Vec::new()
            } else {
                Backup::take_all(&self.device, &parts)?
            }
            .into_iter();
            for e in &extents {
                backups.push(e.and_then(|_| taken.next()));
            }
        } else {
            backups.resize_with(keys.len(), || None);
        }
        // Unmap every segment; on failure map back the ones unmapped (their handles are
        // still held, so their bytes are intact).
        for (i, k) in keys.iter().enumerate() {
            let s = &st.segs[k];
            if let Err(e) = retry(|| d.unmap(s.dev, *k, s.size)) {
                for back in &keys[..i] {
                    let s = &st.segs[back];
                    if let Some(h) = s.handle {
                        let _ = retry(|| map_rw(d, s.dev, *back, s.size, h));
                    }
                }
                return Err(e.into());
            }
        }
        for (k, b) in keys.iter().zip(backups) {
            st.pool_segment(*k, true);
            let Some(s) = st.segs.get_mut(k) else {
                continue;
            };
            if let Some(h) = s.handle {
                if retry(|| d.release_physical(s.dev, h)).is_ok() {
                    s.handle = None;
                }
            }
            out.bytes += s.size;
            out.regions += 1;
            out.changed.push((s.dev, *k));
            if let Some(b) = &b {
                out.backed_up += b.len;
            }
            s.paused = Some(Paused { mode, backup: b });
        }
        Ok(out)
    }

    /// Resume every paused segment of the tags `want` names: new physical memory mapped at
    /// the same addresses, backups checked and restored, then their host memory freed. All
    /// or nothing: on failure every segment this call mapped is unmapped again and the tag
    /// stays paused with its backups.
    pub fn resume(&self, want: Option<&str>) -> Result<SleepOutcome, SleepError> {
        let d = &*self.device;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let keys: Vec<DevPtr> = st
            .segs
            .iter()
            .filter(|(_, s)| s.paused.is_some() && st.tag_matches(s, want))
            .map(|(&a, _)| a)
            .collect();
        if keys.is_empty() {
            return Ok(SleepOutcome::default());
        }
        // (address, handle, whether this call created it)
        let mut done: Vec<(DevPtr, PhysHandle, bool)> = Vec::with_capacity(keys.len());
        let undo = |done: &mut Vec<(DevPtr, PhysHandle, bool)>,
                    segs: &mut BTreeMap<DevPtr, Seg>| {
            for (a, h, created) in done.drain(..) {
                let Some(s) = segs.get_mut(&a) else {
                    continue;
                };
                let _ = retry(|| d.unmap(s.dev, a, s.size));
                if created && retry(|| d.release_physical(s.dev, h)).is_err() {
                    s.handle = Some(h);
                }
            }
        };
        for k in &keys {
            let (dev, size, kept) = {
                let s = &st.segs[k];
                (s.dev, s.size, s.handle)
            };
            let (h, created) = match kept {
                Some(h) => (h, false),
                None => match d.create_physical(dev, size) {
                    Ok(h) => (h, true),
                    Err(e) => {
                        undo(&mut done, &mut st.segs);
                        return Err(e.into());
                    }
                },
            };
            if let Err(e) = map_rw(d, dev, *k, size, h) {
                if created && retry(|| d.release_physical(dev, h)).is_err() {
                    if let Some(s) = st.segs.get_mut(k) {
                        s.handle = Some(h);
                    }
                }
                undo(&mut done, &mut st.segs);
                return Err(e.into());
            }
            done.push((*k, h, created));
        }
        // A mismatch undoes the whole resume, so nothing corrupt stays.
        for k in &keys {
            let s = &st.segs[k];
            if let Some(b) = s.paused.as_ref().and_then(|p| p.backup.as_ref()) {
                if let Err(e) = b.restore(d, s.dev) {
                    let at = *k;
                    undo(&mut done, &mut st.segs);
                    return Err(match e {
                        Some(e) => e.into(),
                        None => SleepError::Corrupt(at),
                    });
                }
            }
        }
        let mut out = SleepOutcome::default();
        for (a, h, _) in done {
            let Some(s) = st.segs.get_mut(&a) else {
                continue;
            };
            s.handle = Some(h);
            if let Some(b) = s.paused.take().and_then(|p| p.backup) {
                out.backed_up += b.len;
                drop(b);
            }
            out.bytes += s.size;
            out.regions += 1;
            out.changed.push((s.dev, a));
            st.pool_segment(a, false);
        }
        Ok(out)
    }
}
