//! Physical handles whose release failed, kept for a later retry.
//!
//! Policy: a page of an expandable segment is given back in two driver calls, unmap then
//! release. When the release (`cuMemRelease`) fails after the unmap succeeded, the handle
//! is already out of every reservation; dropping it would leak its physical memory for the
//! life of the process, unseen. So it is kept here and released again at the start of every
//! later release of cached memory (`empty_cache`, garbage collection, the out-of-memory
//! retry), up to [`IMMEDIATE_TRIES`] times in a row each time, until the driver takes it.
//! The first failure of the process prints one line (even when a retry then succeeds); later ones are silent (a fault that
//! repeats would otherwise flood stderr). Unmap failures leave the page mapped and cached,
//! and are retried the same way by the caller (`expandable.rs`).

use crate::alloc::caching::Ctx;
use crate::device::PhysHandle;
use std::sync::atomic::{AtomicBool, Ordering};

/// Attempts per handle and per release pass (a transient failure is usually gone on the
/// next call; a persistent one waits for the next pass).
pub const IMMEDIATE_TRIES: usize = 3;

static REPORTED: AtomicBool = AtomicBool::new(false);

/// Print the process's one line about a driver call that failed while giving memory back.
pub fn report_once(what: &str, dev: i32, err: &dyn std::fmt::Debug) {
    if !REPORTED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "cushim: {what} failed on device {dev} ({err:?}); the memory stays held by the cache \
             and is released again at the next release of cached memory (reported once)"
        );
    }
}

/// Handles of one device still to be released.
#[derive(Debug, Default)]
pub(crate) struct Unreleased {
    handles: Vec<PhysHandle>,
}

impl Unreleased {
    /// Release `h` (tried up to [`IMMEDIATE_TRIES`] times); on failure keep it.
    pub fn release(&mut self, ctx: &Ctx, dev: i32, h: PhysHandle) {
        if !try_release(ctx, dev, h) {
            self.handles.push(h);
        }
    }

    /// Try again to release every waiting handle; keep those that still fail.
    pub fn retry(&mut self, ctx: &Ctx, dev: i32) {
        if self.handles.is_empty() {
            return;
        }
        self.handles.retain(|&h| !try_release(ctx, dev, h));
    }
}

fn try_release(ctx: &Ctx, dev: i32, h: PhysHandle) -> bool {
    for _ in 0..IMMEDIATE_TRIES {
        match ctx.device.release_physical(dev, h) {
            Ok(()) => return true,
            Err(e) => report_once("cuMemRelease", dev, &e),
        }
    }
    false
}
