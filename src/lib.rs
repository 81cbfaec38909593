//! cushim's engine: a PyTorch-compatible caching allocator (`alloc`), allocation history with
//! native stacks (`trace`), and memory snapshots in the formats PyTorch's viewers read
//! (`snapshot`). Pure Rust: it never calls CUDA; everything CUDA goes through [`device::Device`].
//!
//! Capture stays cheap (raw instruction pointers, interned stacks, a bounded ring under the
//! allocator's own lock); symbolization and formatting happen at dump time.

pub mod action;
pub mod alloc;
pub mod config;
pub mod device;
pub mod files;
pub mod quiet_thread;
pub mod sleep;
pub mod snapshot;
pub mod trace;
pub mod version;
