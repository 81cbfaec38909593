//! Benchmark workloads shared by the criterion benches (`benches/*.rs`) and the quick mode
//! (`cushim bench`).
//!
//! Invariant: every workload here does the real work it is named for through cushim's
//! public API (or a real process on simcuda) and returns what it measured; nothing is
//! estimated or hard-coded. Tables compare each figure with a baseline measured in the
//! same run.
#![allow(dead_code)]

pub mod engine;
pub mod procs;
pub mod snapshot;
pub mod table;
pub mod timing;
pub mod trace;
