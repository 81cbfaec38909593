//! cushim's offline side: what reads the files the engine wrote. The snapshot reader
//! (`snapshot`: any format in, one value tree out) and the analyses on it (`analyze`:
//! summary, kinds, replay, diff, report); the `cushim` command in `src/bin/cushim/` drives
//! them.
//!
//! Invariant: this crate depends on the engine (`cushim`), never the reverse, so nothing here
//! is linked into the preloaded library.

pub mod analyze;
pub mod snapshot;
