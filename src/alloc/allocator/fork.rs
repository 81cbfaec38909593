//! Holding every lock of the allocator across `fork`.
//!
//! Policy: the forking thread takes every device's lock in ordinal order, then the pinned
//! host's, before `fork` (the order `snapshot`/`empty_cache` use; no other code holds one of
//! these while taking another), and releases them after it in the parent and in the child.
//! So the child inherits a consistent copy of the allocator that no thread is inside, and
//! its first allocation, free or dump cannot wait on a lock held by a thread that does not
//! exist there. A lock biased to another thread is revoked by the forking thread's
//! acquisition (`devlock.rs`), so in the child every lock is free or biased to the thread
//! that remains.

use super::{CachingAllocator, DeviceState};
use crate::alloc::devlock::{DevLock, DevLockGuard};
use crate::alloc::host::HostCache;

/// Every lock of a [`CachingAllocator`], held; dropping it releases them (hosts last taken,
/// first released).
pub struct ForkHold<'a> {
    devices: Vec<DevLockGuard<'a, DeviceState>>,
    host: Option<DevLockGuard<'a, HostCache>>,
}

impl CachingAllocator {
    /// Take every lock of the allocator (before `fork`).
    pub fn hold_for_fork(&self) -> ForkHold<'_> {
        let devices = self.states.iter().map(DevLock::lock).collect();
        ForkHold {
            devices,
            host: Some(self.host.lock()),
        }
    }
}

impl ForkHold<'_> {
    /// In the fork child (one thread): forget the parent threads registered to sleep on
    /// these locks, then release them.
    pub fn release_in_child(self) {
        for g in &self.devices {
            DevLock::forget_sleepers_after_fork(g);
        }
        if let Some(h) = &self.host {
            DevLock::forget_sleepers_after_fork(h);
        }
        drop(self);
    }
}

impl Drop for ForkHold<'_> {
    fn drop(&mut self) {
        self.host = None;
        while self.devices.pop().is_some() {}
    }
}
