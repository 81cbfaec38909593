//! cushim's offline side: what reads the files the engine wrote. The snapshot reader
//! (`snapshot`: any format in, one value tree out) and the analyses on it (`analyze`:
//! summary, kinds, replay, diff, report); the `cushim` command in `src/bin/cushim/` drives
//! them. Also what the command needs at run time: [`replay_device`] (the bookkeeping device
//! `cushim replay` runs the engine over), [`artifacts`] (where the built pieces live, simcuda
//! laid out as a CUDA installation) and [`workloads`] (what `cushim bench` measures, shared
//! with the criterion benches).
//!
//! Invariant: this crate depends on the engine (`cushim`), never the reverse, so nothing here
//! is linked into the preloaded library.

pub mod analyze;
pub mod artifacts;
pub mod export;
pub mod replay_device;
pub mod snapshot;
pub mod state;
pub mod workloads;
