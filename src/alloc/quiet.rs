//! The quiet check: a barrier is not needed when every stream's queue is empty.
//!
//! # Policy
//!
//! A barrier (`barrier.rs`) orders work queued before a free ahead of work queued after the
//! block is handed out again. If, after the free, every stream the program can have queued
//! work on reports an empty queue (`cuStreamQuery` says all its work completed), every use of
//! every freed block has already finished on the GPU: nothing is left to order, so the blocks
//! are released with no record and no wait queued anywhere. This needs no hook on the
//! program's submissions, unlike skipping idle streams lazily (`barrier.rs`): it asks the GPU
//! about the past, and a block's uses were all queued before its free.
//!
//! The streams asked: the legacy stream, every tracked non-blocking stream, every stream a
//! `cudaFreeAsync` named, and every tracked blocking stream (the legacy stream's own queue
//! says nothing about theirs). It is not used once a per-thread default stream was seen
//! (`all_streams_known` false): another thread's per-thread stream cannot be asked from this
//! one. The first busy stream ends the check (the caller issues the barrier); a stream that
//! captures is never asked (the caller checked the non-blocking ones; a blocking one is
//! checked here), nor is any once a query fails.
//!
//! Why: in a loop of `cudaMalloc`/`cudaFree` with idle streams a barrier costs `4n + 4` driver
//! calls for `n` streams and queues `2n + 1` commands; the check costs `n + 1` queries and
//! queues nothing, so the next check finds the queues empty again.
//!
//! # When the check finds work: a barrier, or over many streams what CUDA's free does
//!
//! A barrier's own waits stay queued on every stream for a while, so a check soon after one
//! finds the streams busy again, and with many streams every reuse would pay the check and
//! the `4n + 4` calls of a barrier. Under `free_sync:auto`, when more than
//! [`BARRIER_STREAMS`] non-blocking streams would be ordered, the allocator synchronizes the
//! device instead: what the program's own `cudaFree` does at *every* free without the shim,
//! here at most once per reuse, so never more waiting than without the shim, and it leaves
//! every queue empty so the next reuse's check succeeds. With one or two streams the barrier
//! stays (no CPU wait while the GPU lags, `tests/shim/shim_streams.rs`); `free_sync:barrier` always
//! issues the barrier. Measured with CUDA's costs modelled in BENCHMARKS.md ("Never slower
//! than CUDA").

/// The most non-blocking streams `auto` orders with a barrier when the quiet check finds
/// work; above it, the device is synchronized instead.
pub const BARRIER_STREAMS: usize = 2;

use crate::device::{Device, Stream, LEGACY_STREAM};

/// Whether every stream that can hold work using freed blocks has an empty queue: the legacy
/// stream, `streams` (non-blocking, already checked not to capture) and `blocking`.
pub fn all_idle(device: &dyn Device, dev: i32, streams: &[Stream], blocking: &[Stream]) -> bool {
    // A per-thread default stream named by a free cannot be asked from this thread.
    if streams.contains(&2) {
        return false;
    }
    let idle = |s: Stream| device.stream_idle(dev, s).unwrap_or(false);
    idle(LEGACY_STREAM)
        && streams
            .iter()
            .filter(|&&s| !super::barrier::covered_by_legacy(s))
            .all(|&s| idle(s))
        && blocking
            .iter()
            .all(|&s| !device.stream_is_capturing(dev, s) && idle(s))
}
