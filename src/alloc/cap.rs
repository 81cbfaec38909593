//! The cache cap: an optional bound on cached-but-unused device memory, after ND4J's
//! `ArrayCacheMemoryMgr` (which keeps at most a quarter of the device cached and, when
//! caching a released array would exceed that, deallocates the oldest cached arrays first).
//!
//! Policy (per device; the pinned host cache is not capped): with `max_cached_mb:N` and/or
//! `max_cached_fraction:F` in `CUSHIM_ALLOC_CONF` (default off; with both, the smaller bound
//! applies), after every free and every malloc (whose start returns the blocks of completed
//! pending frees to the pools), when the cached bytes (reserved minus active: free blocks, not blocks whose pending free is still
//! waiting) exceed the cap, whole free ordinary segments go back to the device oldest first
//! (by when they last became wholly free, [`super::block::Block::cached_at`]), then whole
//! free expandable pages (address order), until the cached bytes are within the cap or
//! nothing whole is left. Free space inside a segment that still holds a live block cannot
//! be released, so it alone can leave the cache above the cap.
//!
//! Why: a program sharing a GPU with others (several processes, or a framework next to
//! another library's allocator) needs the cache's footprint bounded, and PyTorch's only
//! bound (`garbage_collection_threshold`) acts when the cache grows, not when it idles.
//! Oldest first because the segment cached longest is the least likely to serve the next
//! request (the same argument as the garbage collector's ages).
//!
//! Invariant: only `Free` memory is released (never a pending block: its queued work may
//! still touch it); each release goes through `release_segment` / the expandable unmap,
//! which update pools, statistics and the trace (`segment_free` / `segment_unmap`) in the
//! same step; `num_cache_cap_releases` counts the segments and pages released here.

use super::block::BlockId;
use super::caching::{Ctx, DeviceState};

impl DeviceState {
    /// Bytes in free blocks (reserved but neither allocated nor waiting on a pending free).
    pub(crate) fn cached_bytes(&self) -> u64 {
        let s = &self.stats;
        (s.reserved_bytes.all.current - s.active_bytes.all.current).max(0) as u64
    }

    /// Release cached memory, oldest first, until the cached bytes are within the cap.
    /// Called after a free and after a malloc when a cap is configured.
    pub(crate) fn enforce_cache_cap(&mut self, ctx: &Ctx) {
        let total = self.total_memory(ctx.device);
        let cap = ctx.conf.cache_cap(total);
        if self.cached_bytes() <= cap {
            return;
        }
        // The deferred free's merge decides which segments are whole.
        self.settle();
        // Free bytes outside whole free blocks are `inactive_split_bytes`: when that is all
        // of the cache (and no expandable page can go), nothing can be released, and the
        // pool is not scanned (a cap the program's live blocks keep exceeded costs each free
        // this test, not a scan).
        let split = self.stats.inactive_split_bytes.all.current.max(0) as u64;
        if self.cached_bytes() <= split && !self.exp.enabled() {
            return;
        }
        let before = self.stats.num_device_free;
        let mut oldest: Vec<(u64, BlockId)> = [true, false]
            .into_iter()
            .flat_map(|large| self.whole_free_segments(large))
            .map(|id| (self.blocks[id].cached_at, id))
            .collect();
        oldest.sort_unstable();
        for (_, id) in oldest {
            if self.cached_bytes() <= cap {
                break;
            }
            self.release_segment(ctx, id);
        }
        let excess = self.cached_bytes().saturating_sub(cap);
        if excess > 0 && self.exp.enabled() {
            self.expandable_gc(ctx, excess);
        }
        self.stats.num_cache_cap_releases += self.stats.num_device_free - before;
    }
}
