//! The per-device caching allocator: PyTorch's CUDA caching-allocator policy over a
//! [`Device`].
//!
//! The state these sequences work on, and what every method keeps true, is
//! `device_state.rs`'s `DeviceState`.
//!
//! # The policy, in our words
//!
//! **Sizes.** A request is rounded to a multiple of 512 bytes (at least 512). When
//! `roundup_power2_divisions` gives the request's power-of-two interval `d > 1` divisions
//! (and the request is larger than `512 * d`), it is rounded instead to the next of `d`
//! equal steps between the powers of two around it. Rounded sizes up to 1 MiB live in the
//! small pool, larger ones in the large pool. A new segment is 2 MiB for small requests,
//! 20 MiB for requests under 10 MiB, and the request rounded up to 2 MiB otherwise.
//!
//! **Finding a block.** Each pool is ordered by (stream, size, address); a request takes
//! the smallest free block of its own stream that is big enough, lowest address first. A
//! block is only ever reused by the stream that owns it (`cudaMalloc` uses the legacy
//! stream 0). Blocks of `max_split_size` or more are "oversize": a request below
//! `max_split_size` never takes one, and an oversize request takes one only if it wastes
//! less than 20 MiB.
//!
//! **Splitting and merging.** After taking a block, the tail is split off as a new free
//! block if at least 512 bytes remain (small pool, or any expandable segment), or, in the
//! large pool, if the request is below `max_split_size` and more than 1 MiB remains. When
//! a block becomes free it merges with free neighbours of its own segment (never across
//! segments, never with unmapped address space).
//!
//! **The malloc sequence.** (1) Blocks whose pending frees completed return to the pools.
//! (2) Best fit. (3) If nothing fits but freed blocks still wait, the waiting blocks are
//! covered and (1)-(2) retried: by a GPU-side ordering barrier (`free_sync:auto` with
//! streams, `barrier`: the blocks are reusable at once, `barrier.rs`), by one event per
//! live stream (`event`: when a waiting block could serve the request by itself, the fresh
//! batch is polled, 16 quick polls, then with a yield between polls, for up to 100 µs), or
//! by a device synchronization (`device`).
//! (4) With `garbage_collection_threshold` set and reserved memory above that fraction of
//! the allowed memory, whole cached large segments that have waited longest unused (age
//! counted in pool lookups, at least the average age) are released until enough is under
//! the threshold. (5) A new segment is allocated from the device (or an expandable
//! reservation grows), refused without a device call if it would exceed
//! `per_process_memory_fraction` of the device. (6) On failure, cached oversize blocks of
//! the stream are released (the smallest one big enough, else the largest ones until enough
//! is freed) and the allocation retried. (7) Then every pending free is synchronized and the
//! best fit retried. (8) Then all cached memory is released (whole free segments, whole
//! free expandable pages), `num_alloc_retries` counted, and the allocation retried. (9) Then
//! an `oom` event is recorded with the device's free bytes, `num_ooms` counted, and the
//! request fails with out-of-memory; the allocator stays usable.
//!
//! **Freeing.** A free decrements `allocation`/`allocated_bytes` at once. When the block
//! may still be in use by queued work (see `pending.rs`) it becomes `Pending`; otherwise,
//! or once its batch completes, it becomes `Free` (decrementing `active`, `active_bytes`,
//! `requested_bytes`), merges, and returns to its pool. (A free the program makes merges
//! lazily, at the next call that needs it, which changes nothing anyone can observe; see
//! `deferred.rs`.) Cached memory goes back to the device only in the sequence above, on
//! `empty_cache`, at a device reset, or, with a cache cap configured, after a free that
//! leaves more than the cap cached (`cap.rs`).
//!
//! **Statistics.** Named as PyTorch names them; `inactive_split` counts free blocks that
//! share their segment; `oversize_*` count blocks/segments of at least `max_split_size`;
//! with expandable segments `reserved_bytes` is mapped bytes and `num_device_alloc/free`
//! count maps and unmaps.
//!
//! Deviation from PyTorch: PyTorch runs the garbage collector only after
//! `set_per_process_memory_fraction`; here the fraction is a configuration key defaulting to
//! 1.0, so the threshold alone enables it.

use super::block::{Block, BlockId, State};
pub use super::device_state::DeviceState;
pub(crate) use super::device_state::Segment;
use super::request::Request;
use super::rounding::{segment_size, MIN_BLOCK, SMALL_SIZE};
use super::{AllocError, FreeError};
use crate::config::alloc::{AllocConf, FreeSync};
use crate::device::{DevPtr, DevResult, Device, DeviceError, Stream};
use crate::trace::event::{now_us, Action, StackId, TraceEvent, NO_STACK};

/// How long a malloc that finds nothing free polls a batch of events it just recorded
/// before growing the cache (see `DeviceState::await_fresh_batch`).
const FRESH_BATCH_GRACE: std::time::Duration = std::time::Duration::from_micros(100);
/// Polls made before the first yield, whatever the time (each is an event query).
const FRESH_BATCH_SPINS: u32 = 16;

/// What a device state needs from its allocator for one call.
pub(crate) struct Ctx<'a> {
    pub device: &'a dyn Device,
    pub conf: &'a AllocConf,
    /// `CachingAllocator::solo`: whether the program ever created a stream, or several
    /// threads allocate or free and a per-thread default stream was used (`free_sync:auto`:
    /// each thread may then work on its own per-thread default stream). Read under the
    /// device lock ([`Ctx::streams_seen`]).
    pub solo: &'a std::sync::atomic::AtomicUsize,
    /// `CachingAllocator::per_thread`: whether a per-thread default stream was used (then
    /// a quiet check cannot ask every stream, `quiet.rs`).
    pub per_thread: &'a std::sync::atomic::AtomicBool,
}

impl Ctx<'_> {
    /// Whether streams (or several threads with per-thread default streams) were seen. Read under the device's lock: the
    /// allocator marks them before it takes each device's lock to order what earlier frees
    /// released, so a free either sees the mark or is ordered by that barrier.
    #[inline(always)]
    pub fn streams_seen(&self) -> bool {
        self.solo.load(std::sync::atomic::Ordering::Relaxed) == super::allocator::SHARED
    }
}

fn map_dev_err(e: DeviceError) -> AllocError {
    match e {
        DeviceError::OutOfMemory => AllocError::OutOfMemory,
        DeviceError::Capturing => AllocError::Capturing,
        other => AllocError::Device(other),
    }
}

impl DeviceState {
    // ----------------------------------------------------------------------------- malloc

    #[inline]
    pub(crate) fn malloc(
        &mut self,
        ctx: &Ctx,
        size: u64,
        stream: Stream,
        stack: StackId,
    ) -> Result<DevPtr, AllocError> {
        if size == 0 {
            return Ok(0);
        }
        // A user stream (not 0, 1 or 2) may have been destroyed.
        if stream > 2 && self.pending.is_dead(stream) {
            return Err(AllocError::InvalidHandle);
        }
        if self.deferred.is_some() && !self.pending.any() {
            let req = Request::new(ctx.conf, size, stream, stack);
            if let Some(ptr) = self.malloc_deferred(ctx, &req) {
                return Ok(ptr);
            }
        }
        self.malloc_full(ctx, size, stream, stack)
    }

    /// The whole malloc sequence (kept out of line: the cached path above stays small).
    #[inline(never)]
    fn malloc_full(
        &mut self,
        ctx: &Ctx,
        size: u64,
        stream: Stream,
        stack: StackId,
    ) -> Result<DevPtr, AllocError> {
        let req = &Request::new(ctx.conf, size, stream, stack);
        self.settle();
        self.complete_pending(ctx, false);
        let mut found = self.best_fit(ctx, req);
        if found.is_none() && self.pending.has_unbatched() {
            self.cover_pending(ctx);
            self.complete_pending(ctx, false);
            found = self.best_fit(ctx, req);
            if found.is_none() {
                found = self.await_fresh_batch(ctx, req);
            }
        }
        let id = match found {
            Some(id) => {
                self.pool_remove(id);
                id
            }
            None => self.alloc_sequence(ctx, req)?,
        };
        let ptr = self.take(ctx, id, req);
        if found.is_none() && self.exp.enabled() {
            // Expandable garbage collection: once the new block is taken, whole free pages
            // the growth could not use go back while reserved memory is above the threshold.
            let excess = self.gc_excess(ctx);
            if excess > 0 {
                self.expandable_gc(ctx, excess);
            }
        }
        Ok(ptr)
    }

    /// The events of the batch just recorded are rarely complete at the instant they are
    /// recorded, even when the streams are idle, and growing the cache costs far more
    /// (`cudaMalloc` takes tens of microseconds and more). So poll the pending frees for a
    /// short, bounded time ([`FRESH_BATCH_GRACE`]) before growing, when one of the waiting
    /// blocks could serve the request by itself: on idle streams the batch
    /// completes within it and its blocks serve the request; on busy ones the malloc grows as
    /// before. Never a synchronization: each poll is an event query.
    fn await_fresh_batch(&mut self, ctx: &Ctx, req: &Request) -> Option<BlockId> {
        // Wait only when a block that is waiting could serve the request by itself.
        let could_serve = self.pending.batched_blocks().any(|id| {
            let b = &self.blocks[id];
            b.stream == req.stream && b.large == req.large && b.size >= req.rounded
        });
        if !could_serve {
            return None;
        }
        let start = std::time::Instant::now();
        let mut polls = 0u32;
        while self.pending.any()
            && (polls < FRESH_BATCH_SPINS || start.elapsed() < FRESH_BATCH_GRACE)
        {
            // A few quick polls first (a device signals completion by itself), then yield
            // between polls rather than spin: whatever completes the events may need this CPU
            // (a simulated stream's worker thread, on a machine with few cores). With spinning
            // only, a loop of 64 MiB pairs with one idle stream grew the cache by tens of
            // segments; with the yields it stays at one or two (BENCHMARKS.md, "Measurements
            // behind design choices").
            if polls < FRESH_BATCH_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            polls += 1;
            self.complete_pending(ctx, false);
            if let Some(id) = self.best_fit(ctx, req) {
                return Some(id);
            }
        }
        None
    }

    /// Steps (4)-(9) of the malloc sequence; returns a free block not in any pool.
    fn alloc_sequence(&mut self, ctx: &Ctx, req: &Request) -> Result<BlockId, AllocError> {
        if ctx.conf.garbage_collection_threshold > 0.0 {
            self.garbage_collect(ctx);
        }
        if let Some(id) = self.grow(ctx, req)? {
            return Ok(id);
        }
        if self.release_oversize(ctx, req) {
            if let Some(id) = self.grow(ctx, req)? {
                return Ok(id);
            }
        }
        if self.pending.any() {
            self.complete_pending(ctx, true);
            if let Some(id) = self.best_fit(ctx, req) {
                self.pool_remove(id);
                return Ok(id);
            }
        }
        self.release_cached(ctx);
        self.stats.num_alloc_retries += 1;
        if let Some(id) = self.grow(ctx, req)? {
            return Ok(id);
        }
        self.stats.num_ooms += 1;
        if self.history {
            let device_free = ctx
                .device
                .mem_get_info(self.dev)
                .map(|(f, _)| f)
                .unwrap_or(0);
            self.sink.record(TraceEvent {
                action: Action::Oom,
                device: self.dev,
                addr: 0,
                size: req.size,
                stream: req.stream,
                time_us: now_us(),
                stack: req.stack,
                device_free,
                range: 0,
            });
        }
        Err(AllocError::OutOfMemory)
    }

    /// Best fit in the pool, honouring the oversize rules. Leaves the block in the pool.
    fn best_fit(&mut self, ctx: &Ctx, req: &Request) -> Option<BlockId> {
        let pool = self.pool_mut(req.large);
        pool.lookups += 1;
        let (bsize, id) = pool.best_fit(req.stream, req.rounded)?;
        if self.blocks[id].res.is_none() && oversize_refuses(ctx.conf, req.rounded, bsize) {
            return None;
        }
        Some(id)
    }

    /// Hand out `id` (a free block not in any pool) for a request, splitting off the tail.
    fn take(&mut self, ctx: &Ctx, id: BlockId, req: &Request) -> DevPtr {
        let (bsize, large, expandable) = {
            let b = &self.blocks[id];
            (b.size, b.large, b.res.is_some())
        };
        if splits(ctx.conf, large, expandable, req.rounded, bsize) {
            let tail = self.blocks.split(id, req.rounded);
            self.pool_insert(tail);
        }
        self.hand_out(ctx, id, req)
    }

    /// The second half of [`Self::take`]: block `id` (split as needed, in no pool) becomes
    /// the program's allocation of `req.size` bytes.
    #[inline(always)]
    pub(crate) fn hand_out(&mut self, ctx: &Ctx, id: BlockId, req: &Request) -> DevPtr {
        let (size, stack) = (req.size, req.stack);
        let b = &mut self.blocks[id];
        b.state = State::Allocated;
        b.requested = size;
        b.stack = stack;
        let (addr, bsize, stream, large) = (b.addr, b.size, b.stream, b.large);
        self.live.insert(addr, id);
        let s = &mut self.stats;
        s.allocation.add(large, 1);
        s.allocated_bytes.add(large, bsize as i64);
        s.active.add(large, 1);
        s.active_bytes.add(large, bsize as i64);
        s.requested_bytes.add(large, size as i64);
        if bsize >= ctx.conf.max_split_size {
            s.oversize_allocations.add(1);
        }
        self.record(Action::Alloc, addr, size, stream, stack);
        addr
    }

    /// A new segment or an expandable growth for the request: a free block not in any pool
    /// whose first `rounded` bytes serve it. `Ok(None)` means out of memory.
    fn grow(&mut self, ctx: &Ctx, req: &Request) -> Result<Option<BlockId>, AllocError> {
        let Request {
            rounded,
            large,
            stream,
            stack,
            ..
        } = *req;
        if self.exp.enabled() {
            if let Some(r) = self.ensure_reservation(ctx, stream, large) {
                return Ok(self.expandable_grow(ctx, r, rounded, stack));
            }
        }
        let alloc_size = segment_size(rounded);
        if !self.within_fraction(ctx, alloc_size) {
            return Ok(None);
        }
        let ptr = match ctx.device.malloc(self.dev, alloc_size) {
            Ok(p) => p,
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(map_dev_err(e)),
        };
        let id = self
            .blocks
            .insert(Block::new(ptr, alloc_size, stream, large, State::Free));
        self.segments.insert(
            ptr,
            Segment {
                size: alloc_size,
                stream,
                large,
                stack,
                head: id,
            },
        );
        self.stats.segment.add(large, 1);
        self.stats.reserved_bytes.add(large, alloc_size as i64);
        if alloc_size >= ctx.conf.max_split_size {
            self.stats.oversize_segments.update(1);
        }
        self.stats.num_device_alloc += 1;
        self.record(Action::SegmentAlloc, ptr, alloc_size, stream, stack);
        Ok(Some(id))
    }

    // ------------------------------------------------------------------------------- free

    /// Whether `ptr` lies inside memory this allocator holds.
    pub(crate) fn contains(&self, ptr: DevPtr) -> bool {
        self.head_of_span_containing(ptr).is_some()
    }

    /// The first block of the segment or expandable reservation containing `ptr`.
    pub(crate) fn head_of_span_containing(&self, ptr: DevPtr) -> Option<BlockId> {
        if let Some((&a, s)) = self.segments.range(..=ptr).next_back() {
            if ptr < a + s.size {
                return Some(s.head);
            }
        }
        self.exp
            .list
            .iter()
            .find(|r| ptr >= r.base && ptr < r.base + r.size)
            .map(|r| r.head)
    }

    /// The program frees `ptr`. `async_stream` is the stream of `cudaFreeAsync`.
    #[inline(always)]
    pub(crate) fn free(
        &mut self,
        ctx: &Ctx,
        ptr: DevPtr,
        async_stream: Option<Stream>,
        stack: StackId,
    ) -> Result<(), FreeError> {
        // A free is a point where the previous free's merge must have happened.
        self.settle();
        // One lookup: the entry found here is also what an immediate free removes.
        let Some(entry) = self.live.entry(ptr) else {
            return Err(self.refused_free(ptr));
        };
        let id = entry.id();
        let (state, size, requested, large, stream, alloc_stack) = {
            let b = &self.blocks[id];
            (b.state, b.size, b.requested, b.large, b.stream, b.stack)
        };
        if state != State::Allocated {
            return Err(FreeError::InvalidValue);
        }
        if let Some(s) = async_stream {
            if self.pending.is_dead(s) {
                return Err(FreeError::InvalidHandle);
            }
        }
        let wait = match async_stream {
            Some(s) if s == stream => false,
            Some(_) => ctx.conf.free_sync != FreeSync::None,
            None => match ctx.conf.free_sync {
                FreeSync::None => false,
                FreeSync::Auto => ctx.streams_seen(),
                FreeSync::Barrier | FreeSync::Event | FreeSync::Device => true,
            },
        };
        if !wait {
            entry.remove();
        }
        self.stats.allocation.sub(large, 1);
        self.stats.allocated_bytes.sub(large, size as i64);
        if size >= ctx.conf.max_split_size {
            self.stats.oversize_allocations.sub(1);
        }
        // As PyTorch records it: the requested size, and the allocation's stack when the
        // free itself carries none.
        let stack = if stack == NO_STACK {
            alloc_stack
        } else {
            stack
        };
        self.record(Action::FreeRequested, ptr, requested, stream, stack);
        if wait {
            self.free_pending(id, async_stream);
        } else if self.defer {
            self.retire(id);
            // Merged and pooled by the next call that needs it (`deferred.rs`).
            self.deferred = Some(id);
        } else {
            self.finish_free(id);
        }
        if ctx.conf.cache_capped() {
            // The optional bound on cached bytes (`cap.rs`).
            self.enforce_cache_cap(ctx);
        }
        Ok(())
    }

    /// Why a pointer that is not a live block start is refused.
    #[cold]
    #[inline(never)]
    fn refused_free(&self, ptr: DevPtr) -> FreeError {
        if self.contains(ptr) {
            FreeError::InvalidValue
        } else {
            FreeError::NotOurs
        }
    }

    /// A freed block that queued work may still use waits for its stream(s).
    #[inline(never)]
    fn free_pending(&mut self, id: BlockId, async_stream: Option<Stream>) {
        self.blocks[id].state = State::Pending;
        self.pending.push(id, async_stream);
    }

    /// A freed block becomes reusable: stats, `free_completed`, merge, back to its pool.
    pub(crate) fn complete_free(&mut self, id: BlockId) {
        let addr = self.blocks[id].addr;
        self.live.remove(addr);
        self.finish_free(id);
    }

    /// [`Self::complete_free`] for a block already taken out of `live`.
    fn finish_free(&mut self, id: BlockId) {
        self.retire(id);
        self.merge_and_pool(id);
    }

    /// A freed block stops being active: stats, `free_completed`, state `Free` (not yet
    /// merged or in a pool).
    #[inline(always)]
    fn retire(&mut self, id: BlockId) {
        let (addr, size, requested, large, stream, stack) = {
            let b = &self.blocks[id];
            (b.addr, b.size, b.requested, b.large, b.stream, b.stack)
        };
        let s = &mut self.stats;
        s.active.sub(large, 1);
        s.active_bytes.sub(large, size as i64);
        s.requested_bytes.sub(large, requested as i64);
        self.record(Action::FreeCompleted, addr, requested, stream, stack);
        let b = &mut self.blocks[id];
        b.state = State::Free;
        b.requested = 0;
    }

    /// Merge a `Free` block (not in a pool) with free neighbours and put it in its pool.
    pub(crate) fn merge_and_pool(&mut self, mut id: BlockId) {
        if let Some(p) = self.blocks[id].prev {
            if self.blocks[p].state == State::Free {
                self.pool_remove(p);
                self.blocks.absorb_next(p);
                id = p;
            }
        }
        if let Some(n) = self.blocks[id].next {
            if self.blocks[n].state == State::Free {
                self.pool_remove(n);
                self.blocks.absorb_next(id);
            }
        }
        self.pool_insert(id);
    }

    // ---------------------------------------------------------------------- pending frees

    /// Return completed pending frees to the pools; with `wait`, synchronize them all.
    #[inline]
    pub(crate) fn complete_pending(&mut self, ctx: &Ctx, wait: bool) {
        if self.pending.any() {
            self.complete_pending_now(ctx, wait);
        }
    }

    fn complete_pending_now(&mut self, ctx: &Ctx, wait: bool) {
        let mut done = std::mem::take(&mut self.scratch);
        if wait {
            self.pending.sync_all(ctx.device, self.dev, &mut done);
        } else {
            self.pending.poll(ctx.device, self.dev, &mut done);
        }
        for id in done.drain(..) {
            self.complete_free(id);
        }
        self.scratch = done;
    }

    fn cover_pending(&mut self, ctx: &Ctx) {
        let mut done = std::mem::take(&mut self.scratch);
        let all_streams_known = !ctx.per_thread.load(std::sync::atomic::Ordering::SeqCst);
        self.pending
            .cover(ctx.device, self.dev, &mut done, all_streams_known);
        if self.pending.mode() == FreeSync::Device && !done.is_empty() {
            self.stats.num_sync_all_streams += 1;
        }
        for id in done.drain(..) {
            self.complete_free(id);
        }
        self.scratch = done;
    }

    /// Before a snapshot: cover the pending frees as the next malloc would, and take back
    /// those whose work is done, without waiting (a program that synchronized or destroyed
    /// its streams sees its frees done; a snapshot should too).
    pub(crate) fn settle_pending_for_snapshot(&mut self, ctx: &Ctx) {
        if self.pending.has_unbatched() {
            self.cover_pending(ctx);
        }
        self.complete_pending(ctx, false);
    }

    /// Synchronize the device and complete every pending free (`empty_cache`, reset).
    pub(crate) fn drain_pending(&mut self, ctx: &Ctx) {
        if self.pending.any() {
            self.complete_pending(ctx, true);
        }
    }

    /// `(free, total)` with cached free bytes optionally counted as free.
    pub(crate) fn mem_get_info(&self, ctx: &Ctx) -> DevResult<(u64, u64)> {
        let (free, total) = ctx.device.mem_get_info(self.dev)?;
        if ctx.conf.free_includes_cache {
            Ok(((free + self.cached_bytes()).min(total), total))
        } else {
            Ok((free, total))
        }
    }
}

/// Whether best fit refuses a cached ordinary block of `bsize` bytes for a request of
/// `rounded` bytes: a request below `max_split_size` never takes an oversize block, and an
/// oversize request only one that wastes less than `max_non_split_rounding_size`.
pub(crate) fn oversize_refuses(conf: &AllocConf, rounded: u64, bsize: u64) -> bool {
    let max_split = conf.max_split_size;
    if rounded < max_split {
        bsize >= max_split
    } else {
        bsize >= rounded.saturating_add(conf.max_non_split_rounding_size)
    }
}

/// Whether taking `rounded` bytes of a block of `bsize` bytes splits off the tail.
pub(crate) fn splits(
    conf: &AllocConf,
    large: bool,
    expandable: bool,
    rounded: u64,
    bsize: u64,
) -> bool {
    let remaining = bsize - rounded;
    if !large || expandable {
        remaining >= MIN_BLOCK
    } else {
        rounded < conf.max_split_size && remaining > SMALL_SIZE
    }
}
