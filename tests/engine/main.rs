//! The engine in process: the caching allocator's rules against the fake device (PyTorch
//! parity, stream safety, expandable segments, caps, pinned memory) and the snapshot writers.
//! One module per area; one test binary, linked once.

#[path = "../common/mod.rs"]
mod common;

mod engine_barrier;
mod engine_cache_cap;
mod engine_core;
mod engine_deferred;
mod engine_expandable;
mod engine_host;
mod engine_huge;
mod engine_parity;
mod engine_pending;
mod engine_pytorch_sequences;
mod engine_random;
mod engine_release_retry;
mod engine_sleep;
mod engine_thread_exit;
mod pytorch_model;
mod snapshot_formats;
mod snapshot_reader;
mod snapshot_scale;
mod snapshot_summary;
