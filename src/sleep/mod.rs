//! Sleep mode: give an idle program's device memory back without losing its pointers, and
//! restore it later (`sleep_mode:True` in `CUSHIM_ALLOC_CONF`).
//!
//! `tag.rs` says which tag an allocation belongs to, `arena.rs` is the cache of per-tag
//! segments on virtual-memory mappings, `pause.rs` pauses and resumes them, `backup.rs` and
//! `checksum.rs` keep the bytes of a backup. The user's side is documented in
//! `docs/SLEEP-MODE.md`.

pub mod arena;
pub(crate) mod backup;
pub mod checksum;
mod pause;
pub mod request;
pub mod tag;

pub use arena::{Grant, GrowError, Mode, SleepArena, SleepError, SleepOutcome};
