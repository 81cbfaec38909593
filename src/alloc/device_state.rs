//! One device's allocator state (`DeviceState`): the struct and what every method keeps
//! true. The behaviour lives in files by concept: the malloc and free sequences and their
//! policy in `caching.rs`, the deferred merge in `deferred.rs`, expandable segments in
//! `expandable.rs`, giving memory back in `release.rs` and `cap.rs`, the plain-data listing
//! in `listing.rs`, address queries in `allocator/address.rs`.
//!
//! Invariant (maintained by every method, under the device's lock): every byte of every
//! segment and reservation belongs to exactly one block of its chain; a block is in a pool
//! iff it is `Free`, except the one block whose merge is deferred (`deferred.rs`); `live`
//! holds exactly the `Allocated` and `Pending` blocks by address; once the deferred block
//! is settled, the blocks, pools and statistics are exactly what `caching.rs`'s policy gives.

use std::collections::BTreeMap;

use super::block::{Arena, BlockId};
use super::caching::Ctx;
use super::expandable::Expandable;
use super::live::LiveMap;
use super::pending::Pending;
use super::pool::Pool;
use super::stats::DeviceStats;
use crate::config::alloc::AllocConf;
use crate::device::{DevPtr, Device, Stream};
use crate::trace::event::{Action, EventSink, StackId, TraceEvent};

/// An ordinary (`cuMemAlloc`) segment.
pub(crate) struct Segment {
    pub size: u64,
    pub stream: Stream,
    pub large: bool,
    pub stack: StackId,
    pub head: BlockId,
}

/// The locked state of one device's allocator.
pub struct DeviceState {
    pub(crate) dev: i32,
    pub(crate) blocks: Arena,
    pub(crate) small: Pool,
    pub(crate) large: Pool,
    pub(crate) live: LiveMap,
    pub(crate) segments: BTreeMap<DevPtr, Segment>,
    pub(crate) exp: Expandable,
    pub(crate) pending: Pending,
    pub(crate) stats: DeviceStats,
    pub(crate) sink: Box<dyn EventSink>,
    /// `sink.enabled()`, read once (it is constant): the hot path tests a field, not a
    /// virtual call.
    pub(crate) history: bool,
    /// A block the program freed whose merge and pool insertion wait (see `deferred.rs`).
    pub(crate) deferred: Option<BlockId>,
    /// Whether frees defer their merge (always, except in the test that proves deferring
    /// changes nothing).
    pub(crate) defer: bool,
    /// Mallocs answered from the deferred block (read by that test).
    pub(crate) deferred_hits: u64,
    pub(crate) scratch: Vec<BlockId>,
    pub(crate) total_memory: u64,
}

impl DeviceState {
    pub(crate) fn new(dev: i32, conf: &AllocConf, sink: Box<dyn EventSink>) -> DeviceState {
        DeviceState {
            dev,
            blocks: Arena::default(),
            small: Pool::default(),
            large: Pool::default(),
            live: LiveMap::default(),
            segments: BTreeMap::new(),
            exp: Expandable::new(conf.expandable_segments, conf.expandable_fixed_pages),
            pending: Pending::new(conf.free_sync),
            stats: DeviceStats::default(),
            history: sink.enabled(),
            sink,
            deferred: None,
            defer: true,
            deferred_hits: 0,
            scratch: Vec::new(),
            total_memory: 0,
        }
    }

    /// Record one event when history is on.
    #[inline(always)]
    pub(crate) fn record(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: Stream,
        stack: StackId,
    ) {
        if self.history {
            self.record_now(action, addr, size, stream, stack);
        }
    }

    #[inline(never)]
    fn record_now(&mut self, action: Action, addr: u64, size: u64, stream: Stream, stack: StackId) {
        self.sink
            .record(TraceEvent::now(action, self.dev, addr, size, stream, stack));
    }

    pub(crate) fn pool_mut(&mut self, large: bool) -> &mut Pool {
        if large {
            &mut self.large
        } else {
            &mut self.small
        }
    }

    /// Put a `Free` block into its pool, counting it as an inactive split if it shares its
    /// segment.
    pub(crate) fn pool_insert(&mut self, id: BlockId) {
        let (stream, size, addr, large, split) = {
            let b = &self.blocks[id];
            (b.stream, b.size, b.addr, b.large, b.is_split())
        };
        let lookups = self.pool_mut(large).lookups;
        self.pool_mut(large).insert(stream, size, addr, id);
        let cached_at = self.blocks.tick();
        let b = &mut self.blocks[id];
        b.gc_base = lookups;
        b.cached_at = cached_at;
        b.counted_split = split;
        if split {
            self.stats.inactive_split.add(large, 1);
            self.stats.inactive_split_bytes.add(large, size as i64);
        }
    }

    /// Take a block out of its pool (undoing its inactive-split count).
    pub(crate) fn pool_remove(&mut self, id: BlockId) {
        let (stream, size, addr, large, counted) = {
            let b = &self.blocks[id];
            (b.stream, b.size, b.addr, b.large, b.counted_split)
        };
        if self.pool_mut(large).remove(stream, size, addr) && counted {
            self.stats.inactive_split.sub(large, 1);
            self.stats.inactive_split_bytes.sub(large, size as i64);
        }
        self.blocks[id].counted_split = false;
    }

    /// Total device memory (asked once).
    pub(crate) fn total_memory(&mut self, device: &dyn Device) -> u64 {
        if self.total_memory == 0 {
            self.total_memory = device.mem_get_info(self.dev).map(|(_, t)| t).unwrap_or(0);
        }
        self.total_memory
    }

    /// Whether `extra` more reserved bytes stay within `per_process_memory_fraction`.
    pub(crate) fn within_fraction(&mut self, ctx: &Ctx, extra: u64) -> bool {
        let f = ctx.conf.per_process_memory_fraction;
        if f >= 1.0 {
            return true;
        }
        let allowed = (self.total_memory(ctx.device) as f64 * f) as u64;
        (self.stats.reserved_bytes.all.current as u64).saturating_add(extra) <= allowed
    }
}
