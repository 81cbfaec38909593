//! The caching allocator (the policy is described at the head of `caching.rs`).
//!
//! Invariant: the engine reaches memory only through [`crate::device::Device`]; every
//! public entry point is on [`CachingAllocator`].

mod addr_hash;
mod allocator;
pub mod barrier;
pub mod block;
pub mod caching;
mod cap;
mod deferred;
mod device_state;
pub mod devlock;
pub mod expandable;
pub mod host;
pub mod info;
mod listing;
mod live;
pub mod observed;
pub mod pending;
pub mod pool;
mod quiet;
mod release;
mod release_retry;
mod request;
pub mod rounding;
pub mod stats;

pub use addr_hash::{AddrBuild, AddrMap};
pub use allocator::{AddressRange, CachingAllocator, DeviceSnapshot, ForkHold};
pub use release::gc_threshold;

use crate::device::DeviceError;

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// Out of memory after the release-and-retry sequence (`cudaErrorMemoryAllocation`).
    OutOfMemory,
    /// Not allowed while the stream is capturing (`cudaErrorStreamCaptureUnsupported`).
    Capturing,
    /// A stream-ordered allocation named a stream the program destroyed
    /// (`cudaErrorInvalidResourceHandle`, 400).
    InvalidHandle,
    /// Any other device failure.
    Device(DeviceError),
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocError::OutOfMemory => f.write_str("out of memory"),
            AllocError::Capturing => f.write_str("allocation not permitted while capturing"),
            AllocError::InvalidHandle => f.write_str("the stream was destroyed"),
            AllocError::Device(e) => write!(f, "device error: {e}"),
        }
    }
}

impl std::error::Error for AllocError {}

/// Why a free was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeError {
    /// Not allocated by us: forward to the real free.
    NotOurs,
    /// Ours but not a live block start (double free, interior pointer).
    InvalidValue,
    /// A stream-ordered free named a stream the program destroyed
    /// (`cudaErrorInvalidResourceHandle`, 400); the block stays allocated.
    InvalidHandle,
}

impl std::fmt::Display for FreeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FreeError::NotOurs => f.write_str("pointer not allocated by the cache"),
            FreeError::InvalidValue => {
                f.write_str("invalid pointer (double free or not a block start)")
            }
            FreeError::InvalidHandle => f.write_str("the stream was destroyed"),
        }
    }
}

impl std::error::Error for FreeError {}
