//! Stream-ordered allocation on a per-thread default stream (`cudaMallocAsync` /
//! `cudaFreeAsync` and the driver's twins given `cudaStreamPerThread` /
//! `CU_STREAM_PER_THREAD`, or their `_ptsz` entry points given the null stream).
//!
//! The problem: that handle names a different stream in every thread. The cache reuses a
//! block freed on its own stream at once on that stream, which would hand a block one
//! thread freed on its per-thread stream to another thread's per-thread stream, with nothing
//! ordering the second thread's work after the first one's.
//!
//! Policy (why: the ordering CUDA gives, at no cost while one thread allocates): the cache
//! sees such an allocation as one on the legacy default stream, and its free as a plain
//! free. A per-thread default stream is a blocking stream (its work waits for the legacy
//! stream's earlier work, and the legacy stream's for its), so this is exactly what
//! `cudaMalloc` / `cudaFree` get in a per-thread program: a freed block is reused at once
//! while one thread allocates, and behind the GPU-side barrier once several threads do
//! (`per_thread.rs`, `cushim::alloc::CachingAllocator::per_thread_streams_used`).

use cushim::alloc::{AllocError, CachingAllocator, FreeError};
use cushim::trace::event::StackId;

/// `cudaStreamPerThread` / `CU_STREAM_PER_THREAD`.
const PER_THREAD: u64 = 2;

/// A stream-ordered allocation of `size` bytes on `stream` (the handle the call means).
#[inline]
pub fn malloc_async(
    alloc: &CachingAllocator,
    dev: i32,
    size: u64,
    stream: u64,
    stack: StackId,
) -> Result<u64, AllocError> {
    let on = if stream == PER_THREAD { 0 } else { stream };
    alloc.malloc_async(dev, size, on, stack)
}

/// A stream-ordered free of `ptr` on `stream` (the handle the call means).
#[inline]
pub fn free_async(
    alloc: &CachingAllocator,
    ptr: u64,
    stream: u64,
    dev: i32,
    stack: StackId,
) -> Result<(), FreeError> {
    alloc.free_ordered(ptr, (stream != PER_THREAD).then_some(stream), dev, stack)
}
