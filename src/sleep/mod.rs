//! Sleep mode: give an idle program's device memory back without losing its pointers, and
//! restore it later (`sleep_mode:True` in `CUSHIM_ALLOC_CONF`).
//!
//! `tag.rs` says which tag an allocation belongs to, `arena.rs` serves the allocations on
//! virtual-memory mappings and pauses and resumes them, `checksum.rs` guards host backups.
//! The user's side is documented in `docs/SLEEP-MODE.md`.

pub mod arena;
pub mod checksum;
pub mod request;
pub mod tag;

pub use arena::{Mode, SleepArena, SleepError, SleepOutcome};
