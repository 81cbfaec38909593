//! cushim's test and bench infrastructure, kept out of the engine and the preloaded library:
//! [`fake_device`] (an in-process `Device` doing address bookkeeping, with fault injection),
//! [`artifacts`] (where the built pieces live, simcuda laid out as a CUDA installation, C
//! programs compiled against it), [`sim13`] (simcuda dressed as CUDA 13) and [`workloads`]
//! (the bench workloads shared by the criterion benches and `cushim bench`).
//!
//! Invariant: nothing in `src/` (the engine) or `shim/` depends on this crate.

pub mod artifacts;
pub mod fake_device;
pub mod sim13;
pub mod workloads;
