//! The NVTX handles the program holds (domains and registered strings, `exports/nvtx.rs`)
//! and the range names they stand for.
//!
//! Invariant: a leaf lock (nothing is locked while it is held), held across `fork` with the
//! others (`fork.rs`), so a child never inherits it locked by a thread that no longer exists.

use std::collections::HashMap;

use cushim::trace::range::NameId;
use once_cell::sync::Lazy;
use parking_lot::Mutex;

/// Domain and registered-string handles the program holds, to the names they stand for.
pub static HANDLES: Lazy<Mutex<HashMap<usize, NameId>>> = Lazy::new(Default::default);

/// The handle table's lock, held across `fork` (see `fork.rs`).
pub fn hold_for_fork() -> parking_lot::MutexGuard<'static, HashMap<usize, NameId>> {
    HANDLES.lock()
}
