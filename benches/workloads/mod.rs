//! Benchmark workloads shared by the criterion benches (`benches/*.rs`) and the quick mode
//! (`cushim bench`, which includes this directory with `#[path]`).
//!
//! Invariant: every workload here does the real work it is named for through cushim's
//! public API (or a real process on simcuda) and returns what it measured; nothing is
//! estimated or hard-coded. Tables compare each figure with a baseline measured in the
//! same run.
#![allow(dead_code)]
// The unit tests below run with the `cushim` binary's tests; in a `harness = false` bench
// built for checking (`cargo clippy --benches`) their #[test] functions are compiled out,
// which leaves their imports unused.
#![cfg_attr(test, allow(unused_imports))]

pub mod engine;
pub mod procs;
pub mod snapshot;
pub mod table;
pub mod timing;
pub mod trace;
