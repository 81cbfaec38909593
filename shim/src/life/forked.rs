//! Whether this process is a `fork` child of a process that ran the shim (set by the
//! child's `pthread_atfork` handler, `fork.rs`; read by every path that would otherwise ask
//! the driver at a dump).

use std::sync::atomic::{AtomicBool, Ordering};

/// Set in a `fork` child (and never cleared: `exec` starts a new image).
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a `fork` child of a process that ran the shim. Its dumps make no
/// device call of the shim's own: the parent's threads may have held the driver's locks at
/// the fork (CUDA leaves any use of the driver after `fork` undefined), so a dump that asked
/// the driver could wait for ever on a lock no thread of the child will release.
pub fn in_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::Relaxed)
}

/// Note that this process is a `fork` child (the child's handler, first thing).
pub fn mark_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
}
