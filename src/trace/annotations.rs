//! NVTX range starts and ends, as a snapshot's `external_annotations` (PyTorch's key: one
//! dict per start or end with `stage` `"START"`/`"END"`, `name`, `device`, `time_us`; we add
//! `range`, the whole path the range has on its thread, the `user_metadata` its allocations
//! carry, so an analysis can tell when the range that made an allocation ended).
//!
//! Policy: recorded only while history is on (the shim calls [`enable`] from its history
//! configuration), so a program without history pays one relaxed load per push or pop. The
//! newest `max` are kept (the history's `max_entries`), under one short lock of their own (a
//! leaf: nothing else is taken while it is held). The device is the one the shim would
//! allocate on for the calling thread, asked of a function the shim registers.
//!
//! Policy (the event log): the shim's log registers a hook ([`set_log_hook`]) that is
//! called with the starts and ends kept before it, then with each one, under this module's
//! lock, so the hook's callers are
//! serialized (the log's single-producer ring of marks relies on it). The hook must not
//! block on anything that waits for this lock.

use crate::trace::range::{NameId, RangeId};
use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

/// One range start or end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Annotation {
    pub start: bool,
    pub domain: NameId,
    pub name: NameId,
    /// The range's path (its own level included).
    pub path: RangeId,
    pub device: i32,
    pub time_us: i64,
}

static ON: AtomicBool = AtomicBool::new(false);
static DEVICE: OnceCell<fn() -> i32> = OnceCell::new();
static LOG_HOOK: OnceCell<fn(&Annotation)> = OnceCell::new();
static KEPT: Lazy<Mutex<(VecDeque<Annotation>, usize)>> =
    Lazy::new(|| Mutex::new((VecDeque::new(), 0)));

/// Record starts and ends from now on, keeping the newest `max`; `device` names the
/// calling thread's device.
pub fn enable(max: usize, device: fn() -> i32) {
    let _ = DEVICE.set(device);
    KEPT.lock().1 = max.max(1);
    ON.store(true, Ordering::Release);
}

/// Call `hook` with the starts and ends kept so far (those recorded before the log
/// started: ranges opened before the program's first CUDA call), then with every one
/// recorded from now on, always under this module's lock (the first hook set stays).
pub fn set_log_hook(hook: fn(&Annotation)) {
    let k = KEPT.lock();
    if LOG_HOOK.set(hook).is_ok() {
        for a in &k.0 {
            hook(a);
        }
    }
}

/// Whether starts and ends are recorded.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Record a start (`start`) or end of range `name` in `domain`, whose path is `path`, now.
pub fn record(start: bool, domain: NameId, name: NameId, path: RangeId) {
    let device = DEVICE.get().map_or(0, |f| f());
    let a = Annotation {
        start,
        domain,
        name,
        path,
        device,
        time_us: crate::trace::event::now_us(),
    };
    let mut k = KEPT.lock();
    if k.0.len() >= k.1 {
        k.0.pop_front();
    }
    k.0.push_back(a);
    if let Some(hook) = LOG_HOOK.get() {
        hook(&a);
    }
}

/// The kept starts and ends, oldest first.
pub fn entries() -> Vec<Annotation> {
    KEPT.lock().0.iter().copied().collect()
}

/// The kept annotations' lock, held across `fork` (see the shim's `fork.rs`).
pub struct ForkHold {
    _held: parking_lot::MutexGuard<'static, (VecDeque<Annotation>, usize)>,
}

/// Take the kept annotations' lock until the returned hold is dropped.
pub fn hold_for_fork() -> ForkHold {
    ForkHold { _held: KEPT.lock() }
}
