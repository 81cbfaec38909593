//! The deferred merge: a block the program frees is merged with its free neighbours and put
//! in its pool by the next call that needs it, not by the free itself.
//!
//! Invariant: at most one block is deferred (`DeviceState::deferred`); it is `Free`, in no
//! pool and not merged, and nothing but [`DeviceState::malloc_deferred`] looks at the
//! blocks, pools or statistics before [`DeviceState::settle`] has merged and pooled it.
//! Every observable result (addresses handed out, blocks, pools, every statistic including
//! peaks and the `allocated`/`freed` sums, garbage-collection ages, block ids) is the one
//! the immediate merge gives.
//!
//! Why: the commonest thing a cached allocation does is come back to the block its own
//! size freed last. With the merge done at once, a cached malloc+free pair of a small
//! block splits its segment and merges it back every time: two pool removals, two pool
//! insertions, an arena insertion and removal (together about a third of the pair's perf
//! samples when the merge was immediate). The deferred merge answers the next malloc from
//! the unmerged block whenever the merged pool would have answered with the same block split
//! at the same point, and then none of that happens.
//!
//! When that is so (`malloc_deferred`): with `d` the deferred block and `T` its free
//! address successor if any, the immediate merge makes `M = d + T` (a free predecessor would
//! move the start, so it disqualifies). Best fit on the merged pool takes `M` iff no other
//! pooled key of the stream lies in `[(stream, rounded, 0), (stream, |M|, d.addr))`, it is
//! not refused as oversize, and `take` splits it exactly when `T` exists (the tail is then
//! `T` again, same address, size and even id: the arena reuses the id the absorb freed).
//! The statistics the merge and split would have moved (`inactive_split*`, transiently)
//! are moved the same way, in the same order, so peaks and sums agree.

use super::block::State;
use super::caching::{oversize_refuses, splits, Ctx, DeviceState};
use super::request::Request;
use crate::device::DevPtr;

impl DeviceState {
    /// Merge and pool the deferred block, as the free that deferred it would have.
    #[inline]
    pub(crate) fn settle(&mut self) {
        if self.deferred.is_some() {
            self.settle_now();
        }
    }

    #[inline(never)]
    fn settle_now(&mut self) {
        if let Some(id) = self.deferred.take() {
            self.merge_and_pool(id);
        }
    }

    /// Steps (1)-(2) of malloc answered from the deferred block, when the merged pool would
    /// answer with it (see the file's head). `None`: nothing was changed; settle and run the
    /// full sequence. Only called with no pending frees (step (1) has nothing to do).
    #[inline]
    pub(crate) fn malloc_deferred(&mut self, ctx: &Ctx, req: &Request) -> Option<DevPtr> {
        let (rounded, large, stream) = (req.rounded, req.large, req.stream);
        let d = self.deferred?;
        let (addr, expandable, prev, next) = {
            let b = &self.blocks[d];
            if b.stream != stream || b.large != large || b.size != rounded {
                return None;
            }
            (b.addr, b.res.is_some(), b.prev, b.next)
        };
        if prev.is_some_and(|p| self.blocks[p].state == State::Free) {
            return None;
        }
        let tail = next.filter(|&n| self.blocks[n].state == State::Free);
        let tail_size = tail.map_or(0, |t| self.blocks[t].size);
        let merged = rounded + tail_size;
        if !expandable && oversize_refuses(ctx.conf, rounded, merged) {
            return None;
        }
        if splits(ctx.conf, large, expandable, rounded, merged) != tail.is_some() {
            return None;
        }
        let gone = tail.map(|t| (tail_size, self.blocks[t].addr));
        if !self
            .pool_mut(large)
            .would_pick(stream, rounded, (merged, addr), gone)
        {
            return None;
        }
        self.deferred = None;
        self.deferred_hits += 1;
        // What the merged pool's lookup, removal of M and the split would have done.
        let pool = self.pool_mut(large);
        pool.lookups += 1;
        let lookups = pool.lookups;
        let merged_is_split =
            prev.is_some() || tail.map_or(next, |t| self.blocks[t].next).is_some();
        let s = &mut self.stats;
        let tail_counted = tail.is_some_and(|t| self.blocks[t].counted_split);
        if tail_counted && !merged_is_split {
            // T left its pool and came back as the split's tail; M was never counted.
            s.inactive_split.sub_then_add(large, 1);
            s.inactive_split_bytes.sub_then_add(large, tail_size as i64);
        } else {
            // The same moves one by one, in order (M's passage can raise the peak).
            if tail_counted {
                // The free's merge: T leaves its pool, M enters it.
                s.inactive_split.sub(large, 1);
                s.inactive_split_bytes.sub(large, tail_size as i64);
            }
            if merged_is_split {
                // M entered its pool (counted) and leaves it for this malloc.
                s.inactive_split.add(large, 1);
                s.inactive_split_bytes.add(large, merged as i64);
                s.inactive_split.sub(large, 1);
                s.inactive_split_bytes.sub(large, merged as i64);
            }
            if tail.is_some() {
                // The split's new tail enters the pool: T again, as a fresh block.
                s.inactive_split.add(large, 1);
                s.inactive_split_bytes.add(large, tail_size as i64);
            }
        }
        if let Some(t) = tail {
            let tb = &mut self.blocks[t];
            tb.gc_base = lookups;
            tb.counted_split = true;
            tb.stack = 0;
        }
        Some(self.hand_out(ctx, d, req))
    }
}
