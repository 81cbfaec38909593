//! Giving cached memory back: whole free segments, cached oversize blocks, garbage
//! collection by age, and forgetting everything at a device reset.
//!
//! Invariant: only whole free ordinary segments (a `Free` block with no neighbours) go back
//! with `Device::free`, and each release updates the pools, segment table and statistics in
//! the same step; expandable memory shrinks only through `expandable.rs` (whole free pages).

use super::block::{BlockId, State};
use super::caching::{Ctx, DeviceState};
use super::request::Request;
use crate::config::alloc::AllocConf;
use crate::trace::event::Action;

impl DeviceState {
    /// Give a whole free ordinary segment (a free block without neighbours, in its pool)
    /// back to the device.
    pub(crate) fn release_segment(&mut self, ctx: &Ctx, id: BlockId) -> bool {
        let (addr, size, large, stream) = {
            let b = &self.blocks[id];
            (b.addr, b.size, b.large, b.stream)
        };
        if ctx.device.free(self.dev, addr).is_err() {
            return false;
        }
        self.pool_remove(id);
        let stack = self.segments.remove(&addr).map(|s| s.stack).unwrap_or(0);
        self.blocks.remove(id);
        self.stats.segment.update(large, -1);
        self.stats.reserved_bytes.update(large, -(size as i64));
        if size >= ctx.conf.max_split_size {
            self.stats.oversize_segments.update(-1);
        }
        self.stats.num_device_free += 1;
        self.record(Action::SegmentFree, addr, size, stream, stack);
        true
    }

    pub(crate) fn whole_free_segments(&self, large: bool) -> Vec<BlockId> {
        let pool = if large { &self.large } else { &self.small };
        pool.ids()
            .into_iter()
            .filter(|&id| {
                let b = &self.blocks[id];
                b.res.is_none() && !b.is_split()
            })
            .collect()
    }

    /// Step (6): release cached oversize blocks of `stream` (only with `max_split_size`).
    pub(crate) fn release_oversize(&mut self, ctx: &Ctx, req: &Request) -> bool {
        let (stream, rounded, large) = (req.stream, req.rounded, req.large);
        let max_split = ctx.conf.max_split_size;
        if max_split == u64::MAX || !large {
            return false;
        }
        let want = rounded.max(max_split);
        let candidates: Vec<(u64, BlockId)> = self
            .large
            .largest_first(stream)
            .filter(|&(sz, id)| {
                sz >= max_split && self.blocks[id].res.is_none() && !self.blocks[id].is_split()
            })
            .collect();
        // The smallest single block that is big enough.
        if let Some(&(_, id)) = candidates.iter().rev().find(|&&(sz, _)| sz >= want) {
            return self.release_segment(ctx, id);
        }
        let mut released = 0;
        for (sz, id) in candidates {
            if released >= want {
                break;
            }
            if self.release_segment(ctx, id) {
                released += sz;
            }
        }
        released >= want
    }

    /// Step (8) and `empty_cache`: release every whole free segment and free page.
    ///
    /// Order as PyTorch's `release_cached_blocks` (c10/cuda/CUDACachingAllocator.cpp): the
    /// large pool's segments first, then the small pool's, each pool in its (stream, size,
    /// address) order; the bytes are the same either way, the `segment_free` events are not.
    pub(crate) fn release_cached(&mut self, ctx: &Ctx) {
        self.settle();
        self.complete_pending(ctx, true);
        for large in [true, false] {
            for id in self.whole_free_segments(large) {
                self.release_segment(ctx, id);
            }
        }
        self.expandable_release_free(ctx);
    }

    /// Step (4): age-based release of whole cached large segments above the threshold.
    /// Reserved bytes above `garbage_collection_threshold` of the allowed memory (0 when
    /// collection is off or the device size is unknown).
    pub(crate) fn gc_excess(&mut self, ctx: &Ctx) -> u64 {
        match self.gc_threshold(ctx) {
            Some(threshold) => {
                (self.stats.reserved_bytes.all.current as u64).saturating_sub(threshold)
            }
            None => 0,
        }
    }

    fn gc_threshold(&mut self, ctx: &Ctx) -> Option<u64> {
        let total = self.total_memory(ctx.device);
        gc_threshold(ctx.conf, total)
    }

    /// PyTorch's `garbage_collect_cached_blocks` (c10/cuda/CUDACachingAllocator.cpp): each
    /// pass releases every whole cached large segment whose age is at least the average age
    /// of those still cached, until enough is reclaimed or a pass frees nothing. The
    /// average is a real number, as PyTorch's `double` `total_age / freeable_block_count`:
    /// with ages 2 and 1 the threshold is 1.5 and only the older segment goes (integer
    /// division made it 1 and released both).
    pub(crate) fn garbage_collect(&mut self, ctx: &Ctx) {
        let target = self.gc_excess(ctx);
        if target == 0 {
            return;
        }
        let now = self.large.lookups;
        let mut candidates: Vec<(u64, u64, BlockId)> = self
            .whole_free_segments(true)
            .into_iter()
            .map(|id| (now - self.blocks[id].gc_base, self.blocks[id].size, id))
            .collect();
        let mut total_age: f64 = candidates.iter().map(|c| c.0 as f64).sum();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let avg = total_age / candidates.len() as f64;
            let mut freed_any = false;
            let mut keep = Vec::with_capacity(candidates.len());
            for (age, size, id) in candidates {
                if age as f64 >= avg && self.release_segment(ctx, id) {
                    freed_any = true;
                    reclaimed += size;
                    total_age -= age as f64;
                } else {
                    keep.push((age, size, id));
                }
            }
            candidates = keep;
            if !freed_any {
                break;
            }
        }
    }

    /// Forget every block (device reset): complete frees, release everything we can.
    pub(crate) fn reset(&mut self, ctx: &Ctx) {
        self.settle();
        let _ = ctx.device.synchronize_device(self.dev);
        self.drain_pending(ctx);
        let live: Vec<BlockId> = self.live.ids().collect();
        for id in live {
            let (addr, size, large, stream) = {
                let b = &self.blocks[id];
                (b.addr, b.size, b.large, b.stream)
            };
            if self.blocks[id].state == State::Allocated {
                self.stats.allocation.update(large, -1);
                self.stats.allocated_bytes.update(large, -(size as i64));
                if size >= ctx.conf.max_split_size {
                    self.stats.oversize_allocations.update(-1);
                }
                self.record(Action::FreeRequested, addr, size, stream, 0);
            }
            self.complete_free(id);
        }
        self.pending.clear(ctx.device, self.dev);
        self.release_cached(ctx);
        self.expandable_release_reservations(ctx);
    }
}

/// The reserved bytes above which garbage collection acts under `conf` on a device of
/// `total` bytes: `garbage_collection_threshold` of the allowed memory (`None` when
/// collection is off or the device size is unknown). Reserved memory that never passes it
/// leaves every choice as without the setting (the offline replay relies on that).
pub fn gc_threshold(conf: &AllocConf, total: u64) -> Option<u64> {
    let t = conf.garbage_collection_threshold;
    if t <= 0.0 || total == 0 {
        return None;
    }
    let allowed = (total as f64 * conf.per_process_memory_fraction) as u64;
    Some((t * allowed as f64) as u64)
}
