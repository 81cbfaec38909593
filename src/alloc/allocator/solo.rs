//! Knowing exactly whether the thread that allocates is the only one that ever did.
//!
//! The problem: under `free_sync:auto` the allocator remembers the only thread that
//! allocated or freed so far by a token that is cheap to read on every call, the thread
//! pointer (`devlock::thread_token`). The C library reuses a thread's pointer (its control
//! block) for the next thread created after that one ended, so a thread started after the
//! only one exited would read the same token and be taken for it: not seen as a second
//! thread, so the barrier that per-thread default streams need between threads would never
//! come, though the exited thread's work may still be running on its own per-thread stream.
//!
//! Policy (why: exact identity without a cost on the hot path, which stays one relaxed load
//! and a compare): the thread that becomes the only one registers a thread-exit hook (a
//! thread-local destructor, which the C library runs before the thread's control block can
//! be reused). When it runs, the mark moves from that thread's token to [`EXITED`]: one
//! thread allocated, and it is gone. No later thread holds that value, so the next one to
//! allocate or free counts as a second thread, whatever its thread pointer. The hook costs
//! one small allocation once per allocator, when the mark is first taken (cold). A thread
//! that can no longer register one (it is exiting already) does not become the only one:
//! the mark goes straight to "several threads", as if another had come.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// The only thread that allocated or freed so far has exited (below every other mark of
/// `CachingAllocator::solo` but the tokens, which are thread pointers, never this high).
pub(crate) const EXITED: usize = usize::MAX - 2;

/// The marks this thread holds: each allocator's mark, with this thread's token in it.
struct Held(RefCell<Vec<(Weak<AtomicUsize>, usize)>>);

impl Drop for Held {
    fn drop(&mut self) {
        for (mark, token) in self.0.get_mut().drain(..) {
            if let Some(mark) = mark.upgrade() {
                // Only if this thread still holds it (not once several threads came).
                let _ = mark.compare_exchange(token, EXITED, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }
}

thread_local! {
    static HELD: Held = const { Held(RefCell::new(Vec::new())) };
}

/// The calling thread, whose token is `token`, just took `mark`: hand it back at the
/// thread's exit. `false` when the thread can no longer register the hook (it is exiting).
pub(super) fn release_at_exit(mark: &Arc<AtomicUsize>, token: usize) -> bool {
    HELD.try_with(|h| {
        h.0.try_borrow_mut()
            .map(|mut v| v.push((Arc::downgrade(mark), token)))
            .is_ok()
    })
    .unwrap_or(false)
}
