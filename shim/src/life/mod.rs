//! The process life of the shim: its state and initialization, what it records, snapshot
//! triggers and writing, fork, graceful ends and the signal chain, fail open.

pub mod capture;
pub mod dump;
pub mod ending;
pub mod fork;
pub mod forked;
pub mod history;
pub mod log;
pub mod mode;
pub mod nvtx_handles;
pub mod shim;
pub mod sigchain;
pub mod sleep;
pub mod sleep_requests;
pub mod snapshot;
pub mod state;
pub mod stats;
pub mod unexplained;
