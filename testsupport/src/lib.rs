//! cushim's test and bench infrastructure, kept out of the engine and the preloaded library:
//! [`fake_device`] (the replay device with fault injection), [`sim13`] (simcuda dressed as
//! CUDA 13), and, re-exported from `cushim-tools` where `cushim run`, `demo` and `bench` need
//! them, [`artifacts`] (where the built pieces live, simcuda laid out as a CUDA installation,
//! C programs compiled against it) and [`workloads`] (the bench workloads shared by the
//! criterion benches and `cushim bench`).
//!
//! Invariant: nothing in `src/` (the engine), `shim/` or `tools/` depends on this crate.

pub use cushim_tools::{artifacts, workloads};

pub mod fake_device;
pub mod sim13;
