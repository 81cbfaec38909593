//! The sleep-mode cache: with `sleep_mode:True`, `cudaMalloc`/`cuMemAlloc` are served here,
//! from segments built on the virtual-memory API and owned by one tag each, so a tag's pages
//! can be dropped and mapped again at the same addresses (`pause.rs`).
//!
//! Policy: each segment is one reservation with one physical allocation mapped over it,
//! sized as the cache sizes a new segment (2 MiB for small requests, 20 MiB under 10 MiB,
//! else the request rounded to 2 MiB; then to the device's granularity). Requests are
//! rounded, pooled (small and large), served best fit, split and merged under the cache's
//! rules for ordinary segments (`alloc/caching.rs`); a block is served only from its own
//! tag's segments on its own device, so no page ever holds two tags' bytes and pausing one
//! tag never touches another's. Freed blocks stay cached; fully free segments go back to the
//! device at a pause, on lack of memory, on `cushim_empty_cache` and at exit.
//!
//! Stream safety, as the main cache's (`alloc/barrier.rs`): a freed block is never handed
//! out again while work queued before its free, on any stream, can still touch it. The
//! main cache's rule and mechanism decide, through [`CachingAllocator::frees_wait`] and
//! [`CachingAllocator::order_for_reuse`]: until the program has streams (under
//! `free_sync:auto`) a freed block is reusable at once, in the legacy stream's order; after
//! that it waits, out of the pool, until a malloc that finds no free block asks the main
//! cache for one ordering point on the device (its quiet check, barrier or
//! synchronization, over the streams it tracks), which releases every block freed before
//! it. The ordering point is asked without this cache's lock (the main cache's lock is
//! never taken under it), so only blocks freed before the call are released (a sequence
//! number). A pause waits for the device, so it releases every waiting block.
//!
//! Recording, as the main cache's (`alloc/caching.rs`), into the same kind of event sink
//! per device (trace ring and event log): `segment_alloc` when a segment is made and
//! `segment_free` when it goes back, `alloc` for each block handed out (the call's stack),
//! `free_requested` at each free (the free's stack) and `free_completed` when the block is
//! reusable. The snapshot draws each segment's blocks with their stacks
//! ([`SleepArena::segment_blocks`]).
//!
//! Why its own cache and not the main one with a tag key: the main cache's hot path (and its
//! pool keys) stay as they are when sleep mode is off, and everything a pause needs (which
//! segments are a tag's, which of their bytes are in use) is in one place under one lock.
//!
//! Hot path (a cached malloc or free): one lock, no allocation (stacks are captured by the
//! caller before it). The tag is found under the
//! lock by comparing the thread's explicit tag with the few tag names, or its NVTX range id
//! with the ids already seen (a new tag or range is the cold path); blocks and free blocks
//! are sorted vectors, whose capacity only grows, searched by bisection.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::backup::{map_rw, retry, Backup};
use super::tag;
use crate::alloc::caching::{oversize_refuses, splits};
use crate::alloc::info::{BlockInfo, BlockState};
use crate::alloc::rounding::{is_small, round_size, round_up, segment_size};
use crate::alloc::CachingAllocator;
use crate::config::alloc::AllocConf;
use crate::device::{DevPtr, DevResult, Device, DeviceError, PhysHandle};
use crate::trace::event::{Action, EventSink, StackId, TraceEvent, NO_STACK};
use crate::trace::range::{self, RangeId, NO_RANGE};

/// What a pause does with the contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Contents are lost; resume gives zeroed or stale memory at the same address.
    Discard,
    /// Contents are copied to pinned host memory and restored at resume.
    Backup,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Discard => "discard",
            Mode::Backup => "backup",
        }
    }
}

/// Why a pause or resume failed (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SleepError {
    Device(DeviceError),
    /// A backup's bytes changed while paused: the segment at this address was not restored.
    Corrupt(DevPtr),
}

impl std::fmt::Display for SleepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SleepError::Device(e) => write!(f, "{e}"),
            SleepError::Corrupt(a) => write!(
                f,
                "the host backup of the segment at {a:#x} does not match its checksum"
            ),
        }
    }
}

impl From<DeviceError> for SleepError {
    fn from(e: DeviceError) -> Self {
        SleepError::Device(e)
    }
}

/// What a pause or resume changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SleepOutcome {
    /// Device bytes released (pause) or mapped again (resume), cached free segments a pause
    /// gave back not counted.
    pub bytes: u64,
    /// Segments paused or resumed.
    pub regions: usize,
    /// Of those bytes, the ones backed up (pause) or restored (resume).
    pub backed_up: u64,
    /// The segments paused or resumed: (device, address).
    pub changed: Vec<(i32, DevPtr)>,
    /// Fully free segments a pause gave back to the device: (device, address).
    pub released: Vec<(i32, DevPtr)>,
}

pub(crate) struct Paused {
    pub mode: Mode,
    pub backup: Option<Backup>,
}

/// One segment: a reservation of `size` bytes, with its physical memory mapped over it
/// while live.
pub(crate) struct Seg {
    pub dev: i32,
    pub tag: u32,
    pub large: bool,
    pub size: u64,
    /// Mapped while live; kept while paused only when the driver refused to release it.
    pub handle: Option<PhysHandle>,
    pub paused: Option<Paused>,
    /// Blocks of this segment in use.
    pub used: u32,
    /// Stack of the allocation that made it.
    pub stack: StackId,
}

/// One block of a segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blk {
    /// The segment's base.
    pub seg: DevPtr,
    pub size: u64,
    /// Bytes the program asked for (0 when free).
    pub requested: u64,
    pub used: bool,
    /// Freed, waiting for an ordering point before reuse (out of the pool).
    pub waiting: bool,
    /// Stack of the allocation that made it what it is (kept while waiting).
    pub stack: StackId,
}

impl Blk {
    /// Neither in use nor waiting: in the pool (when its segment is live), mergeable.
    pub(crate) fn is_free(&self) -> bool {
        !self.used && !self.waiting
    }
}

/// A free block of a live segment, in best-fit order: device, tag, large pool, size,
/// address.
pub(crate) type FreeKey = (i32, u32, bool, u64, DevPtr);

pub(crate) struct State {
    pub tags: Vec<String>,
    /// NVTX range ids seen, with their tag.
    pub ranges: Vec<(RangeId, u32)>,
    pub segs: BTreeMap<DevPtr, Seg>,
    /// Every block of every segment, sorted by address.
    pub blocks: Vec<(DevPtr, Blk)>,
    /// The free blocks of live segments, sorted.
    pub free: Vec<FreeKey>,
    /// Freed blocks waiting for an ordering point: (sequence number, device, address), in
    /// the order freed.
    pub waiting: Vec<(u64, i32, DevPtr)>,
    /// Frees that waited so far (the next one's sequence number).
    pub freed: u64,
    /// One event sink per device (trace ring and log).
    pub sinks: Vec<Box<dyn EventSink>>,
    /// Whether any sink records (constant).
    pub history: bool,
}

/// A granted allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub ptr: DevPtr,
    /// The segment this allocation created (address, bytes), when it made one.
    pub new_segment: Option<(DevPtr, u64)>,
    /// Fully free segments given back to make room for it: (device, address).
    pub released: Vec<(i32, DevPtr)>,
}

/// A failed allocation: the driver's error, and the fully free segments given back while
/// trying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowError {
    pub error: DeviceError,
    pub released: Vec<(i32, DevPtr)>,
}

/// One segment, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    pub dev: i32,
    pub addr: DevPtr,
    pub mapped: u64,
    /// Bytes of its blocks in use.
    pub in_use: u64,
    pub tag: String,
    /// `None` when live, else the pause's mode.
    pub paused: Option<Mode>,
}

/// The sleep-mode cache's lock, held across a `fork` so the child inherits a state no
/// thread is inside.
pub struct ForkHold<'a>(#[allow(dead_code)] parking_lot::MutexGuard<'a, State>);

/// The sleep-mode cache of one process.
pub struct SleepArena {
    pub(crate) device: Arc<dyn Device>,
    pub(crate) conf: AllocConf,
    pub(crate) state: Mutex<State>,
}

impl State {
    /// Record one event on device `dev` when history is on.
    #[inline(always)]
    pub(crate) fn record(
        &mut self,
        dev: i32,
        action: Action,
        addr: u64,
        size: u64,
        stack: StackId,
    ) {
        if self.history {
            self.record_now(dev, action, addr, size, stack);
        }
    }

    #[inline(never)]
    fn record_now(&mut self, dev: i32, action: Action, addr: u64, size: u64, stack: StackId) {
        if let Some(sink) = usize::try_from(dev)
            .ok()
            .and_then(|d| self.sinks.get_mut(d))
        {
            sink.record(TraceEvent::now(action, dev, addr, size, 0, stack));
        }
    }

    fn block_index(&self, addr: DevPtr) -> Result<usize, usize> {
        self.blocks.binary_search_by_key(&addr, |(a, _)| *a)
    }

    pub(crate) fn insert_block(&mut self, addr: DevPtr, b: Blk) {
        if let Err(i) = self.block_index(addr) {
            self.blocks.insert(i, (addr, b));
        }
    }

    pub(crate) fn free_key(&self, addr: DevPtr, b: &Blk) -> Option<FreeKey> {
        let s = self.segs.get(&b.seg)?;
        Some((s.dev, s.tag, s.large, b.size, addr))
    }

    pub(crate) fn pool_insert(&mut self, k: FreeKey) {
        if let Err(i) = self.free.binary_search(&k) {
            self.free.insert(i, k);
        }
    }

    pub(crate) fn pool_remove(&mut self, k: FreeKey) {
        if let Ok(i) = self.free.binary_search(&k) {
            self.free.remove(i);
        }
    }

    /// The tag of an allocation made now by this thread (cold only for a new tag or range).
    fn tag_of(&mut self, explicit: Option<&str>, range_id: RangeId) -> u32 {
        if let Some(t) = explicit {
            return self.intern(t);
        }
        if range_id != NO_RANGE {
            if let Some(&(_, t)) = self.ranges.iter().find(|(r, _)| *r == range_id) {
                return t;
            }
            let t = match range::path(range_id).filter(|p| !p.is_empty()) {
                Some(p) => self.intern(&p),
                None => self.intern(tag::DEFAULT),
            };
            self.ranges.push((range_id, t));
            return t;
        }
        self.intern(tag::DEFAULT)
    }

    fn intern(&mut self, t: &str) -> u32 {
        if let Some(i) = self.tags.iter().position(|x| x == t) {
            return i as u32;
        }
        self.tags.push(t.to_string());
        (self.tags.len() - 1) as u32
    }

    /// Best fit among the tag's free blocks: the smallest big enough, lowest address first,
    /// under the oversize rules.
    fn best_fit(
        &self,
        conf: &AllocConf,
        dev: i32,
        t: u32,
        large: bool,
        rounded: u64,
    ) -> Option<usize> {
        let i = self
            .free
            .partition_point(|k| *k < (dev, t, large, rounded, 0));
        let &(d, tt, l, size, _) = self.free.get(i)?;
        if (d, tt, l) != (dev, t, large) {
            return None;
        }
        if large && oversize_refuses(conf, rounded, size) {
            return None;
        }
        Some(i)
    }

    /// Hand out free block `free[i]` for `size` bytes (rounded `rounded`), splitting off the
    /// tail under the cache's rule.
    fn take(
        &mut self,
        conf: &AllocConf,
        i: usize,
        rounded: u64,
        size: u64,
        stack: StackId,
    ) -> DevPtr {
        let (dev, _, large, bsize, addr) = self.free.remove(i);
        let Ok(bi) = self.block_index(addr) else {
            return addr;
        };
        let seg = self.blocks[bi].1.seg;
        if splits(conf, large, false, rounded, bsize) {
            let tail = Blk {
                seg,
                size: bsize - rounded,
                requested: 0,
                used: false,
                waiting: false,
                stack: NO_STACK,
            };
            self.blocks[bi].1.size = rounded;
            self.blocks.insert(bi + 1, (addr + rounded, tail));
            if let Some(k) = self.free_key(addr + rounded, &tail) {
                self.pool_insert(k);
            }
        }
        let b = &mut self.blocks[bi].1;
        b.used = true;
        b.requested = size;
        b.stack = stack;
        if let Some(s) = self.segs.get_mut(&seg) {
            s.used += 1;
        }
        self.record(dev, Action::Alloc, addr, size, stack);
        addr
    }

    /// Merge the free block at index `bi` (in no pool) with its free neighbours of the same
    /// segment (taking them out of the pool when `pooled`); the merged block's index.
    pub(crate) fn merge(&mut self, mut bi: usize, pooled: bool) -> usize {
        let seg = self.blocks[bi].1.seg;
        if let Some(&(na, nb)) = self.blocks.get(bi + 1) {
            if nb.seg == seg && nb.is_free() {
                if pooled {
                    if let Some(k) = self.free_key(na, &nb) {
                        self.pool_remove(k);
                    }
                }
                self.blocks[bi].1.size += nb.size;
                self.blocks.remove(bi + 1);
            }
        }
        if bi > 0 {
            let (pa, pb) = self.blocks[bi - 1];
            if pb.seg == seg && pb.is_free() {
                if pooled {
                    if let Some(k) = self.free_key(pa, &pb) {
                        self.pool_remove(k);
                    }
                }
                let size = self.blocks[bi].1.size;
                self.blocks[bi - 1].1.size += size;
                self.blocks.remove(bi);
                bi -= 1;
            }
        }
        bi
    }

    /// Forget segment `base` and its blocks (the caller gave its memory back).
    pub(crate) fn forget_segment(&mut self, base: DevPtr) -> Option<Seg> {
        let s = self.segs.remove(&base)?;
        let from = self.blocks.partition_point(|(a, _)| *a < base);
        let to = self.blocks.partition_point(|(a, _)| *a < base + s.size);
        for j in from..to {
            let (a, b) = self.blocks[j];
            if b.is_free() {
                self.pool_remove((s.dev, s.tag, s.large, b.size, a));
            } else if b.waiting {
                // Given back after the device's work (`give_back`): its free completed.
                self.record(s.dev, Action::FreeCompleted, a, b.requested, b.stack);
            }
        }
        self.blocks.drain(from..to);
        let end = base + s.size;
        self.waiting.retain(|&(_, _, a)| a < base || a >= end);
        Some(s)
    }

    /// A freed block at index `bi` becomes reusable: `free_completed`, merged with its free
    /// neighbours, into the pool when its segment is live; the segment's base and whether
    /// it is paused with no block left in use (the caller gives it back).
    pub(crate) fn complete_free(&mut self, bi: usize) -> (DevPtr, bool) {
        let (a, b) = self.blocks[bi];
        let Some(seg) = self.segs.get(&b.seg) else {
            return (b.seg, false);
        };
        let (dev, paused, left) = (seg.dev, seg.paused.is_some(), seg.used);
        self.record(dev, Action::FreeCompleted, a, b.requested, b.stack);
        let blk = &mut self.blocks[bi].1;
        blk.used = false;
        blk.waiting = false;
        blk.requested = 0;
        if paused {
            self.merge(bi, false);
            return (b.seg, left == 0);
        }
        let bi = self.merge(bi, true);
        let (a, mb) = self.blocks[bi];
        if let Some(k) = self.free_key(a, &mb) {
            self.pool_insert(k);
        }
        (b.seg, false)
    }

    /// Release the waiting blocks of device `dev` (every device: `None`) freed before
    /// sequence number `upto`, after an ordering point made then: whether any was.
    pub(crate) fn release_waiting(&mut self, dev: Option<i32>, upto: u64) -> bool {
        let mut ready = Vec::new();
        self.waiting.retain(|&(seq, d, addr)| {
            let go = seq < upto && dev.map_or(true, |x| x == d);
            if go {
                ready.push(addr);
            }
            !go
        });
        let mut any = false;
        for addr in ready {
            if let Ok(bi) = self.block_index(addr) {
                if self.blocks[bi].1.waiting {
                    self.complete_free(bi);
                    any = true;
                }
            }
        }
        any
    }

    /// Live segments with no block in use matching `pick`, in address order.
    pub(crate) fn idle_segments(&self, pick: impl Fn(&Seg) -> bool) -> Vec<DevPtr> {
        self.segs
            .iter()
            .filter(|(_, s)| s.used == 0 && s.paused.is_none() && pick(s))
            .map(|(&a, _)| a)
            .collect()
    }
}

impl SleepArena {
    /// The cache of a process; `make_sink(d)` gives device `d`'s event sink, as for the main
    /// cache.
    pub fn new(
        device: Arc<dyn Device>,
        conf: AllocConf,
        make_sink: &dyn Fn(i32) -> Box<dyn EventSink>,
    ) -> SleepArena {
        let sinks: Vec<Box<dyn EventSink>> = (0..device.device_count().max(1) as i32)
            .map(make_sink)
            .collect();
        SleepArena {
            device,
            conf,
            state: Mutex::new(State {
                tags: vec![tag::DEFAULT.to_string()],
                ranges: Vec::new(),
                segs: BTreeMap::new(),
                blocks: Vec::new(),
                free: Vec::new(),
                waiting: Vec::new(),
                freed: 0,
                history: sinks.iter().any(|s| s.enabled()),
                sinks,
            }),
        }
    }

    /// Allocate `size` bytes on `dev` for the calling thread's tag: its explicit tag
    /// ([`tag::push`]), else its NVTX range path, else `default`. `stack` is the call's;
    /// `main` is the main cache, whose stream ordering this cache follows.
    pub fn alloc(
        &self,
        dev: i32,
        size: u64,
        stack: StackId,
        main: &CachingAllocator,
    ) -> Result<Grant, GrowError> {
        tag::with_explicit(|explicit| self.alloc_tagged(dev, size, explicit, stack, main))
    }

    /// Allocate `size` bytes on `dev`, tagged `explicit` when given, else by the calling
    /// thread's NVTX range path, else `default`: a cached block of the tag's live segments
    /// (after an ordering point releases the device's waiting frees, when none is free),
    /// else a new segment (on lack of memory, after this cache's fully free segments were
    /// given back). Nothing is left behind on failure.
    pub fn alloc_tagged(
        &self,
        dev: i32,
        size: u64,
        explicit: Option<&str>,
        stack: StackId,
        main: &CachingAllocator,
    ) -> Result<Grant, GrowError> {
        main.note_thread();
        let rounded = round_size(size.max(1), &self.conf);
        let large = !is_small(rounded);
        let range_id = if explicit.is_some() {
            NO_RANGE
        } else {
            range::current()
        };
        let mut st = self.state.lock();
        let t = st.tag_of(explicit, range_id);
        // A cached block of the tag, best fit: no driver call.
        let cached = |st: &mut State| {
            let i = st.best_fit(&self.conf, dev, t, large, rounded)?;
            Some(Grant {
                ptr: st.take(&self.conf, i, rounded, size, stack),
                new_segment: None,
                released: Vec::new(),
            })
        };
        if let Some(g) = cached(&mut st) {
            return Ok(g);
        }
        if st.waiting.iter().any(|w| w.1 == dev) && Self::reuse_waiting(&mut st, dev, main) {
            if let Some(g) = cached(&mut st) {
                return Ok(g);
            }
        }
        self.grow(&mut st, dev, t, large, rounded, size, stack, main)
    }

    /// No free block fits and freed blocks of `dev` wait: one ordering point by the main
    /// cache (asked without this cache's lock), then the blocks freed before it are
    /// released. Whether any was.
    #[cold]
    #[inline(never)]
    fn reuse_waiting(
        st: &mut parking_lot::MutexGuard<'_, State>,
        dev: i32,
        main: &CachingAllocator,
    ) -> bool {
        let upto = st.freed;
        let ordered = parking_lot::MutexGuard::unlocked(st, || main.order_for_reuse(dev));
        ordered && st.release_waiting(Some(dev), upto)
    }

    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn grow(
        &self,
        st: &mut State,
        dev: i32,
        t: u32,
        large: bool,
        rounded: u64,
        size: u64,
        stack: StackId,
        main: &CachingAllocator,
    ) -> Result<Grant, GrowError> {
        let d = &*self.device;
        let gran = d.granularity(dev).max(1);
        let seg_size = round_up(segment_size(rounded), gran);
        let mut released = Vec::new();
        let (base, h) = match new_segment(d, dev, seg_size) {
            Ok(x) => x,
            Err(DeviceError::OutOfMemory) => {
                released = self.release_idle(st, |s| s.dev == dev);
                match new_segment(d, dev, seg_size) {
                    Ok(x) => x,
                    Err(e) => return Err(GrowError { error: e, released }),
                }
            }
            Err(e) => return Err(GrowError { error: e, released }),
        };
        main.note_shared_use(dev);
        st.segs.insert(
            base,
            Seg {
                dev,
                tag: t,
                large,
                size: seg_size,
                handle: Some(h),
                paused: None,
                used: 0,
                stack,
            },
        );
        st.record(dev, Action::SegmentAlloc, base, seg_size, stack);
        let whole = Blk {
            seg: base,
            size: seg_size,
            requested: 0,
            used: false,
            waiting: false,
            stack: NO_STACK,
        };
        // Room for the splits and frees to come, so a cached malloc or free seldom grows
        // the vectors (their capacity only grows).
        st.blocks.reserve(8);
        st.free.reserve(8);
        st.waiting.reserve(8);
        st.insert_block(base, whole);
        let k = (dev, t, large, seg_size, base);
        st.pool_insert(k);
        let i = st.free.binary_search(&k).unwrap_or(0);
        let ptr = st.take(&self.conf, i, rounded, size, stack);
        Ok(Grant {
            ptr,
            new_segment: Some((base, seg_size)),
            released,
        })
    }

    /// Free the block at `ptr` (`stack`: the free's): `None` when no block in use starts
    /// there. A block of a live segment returns to the cache, at once or (once the program
    /// has streams, as `main` says) after an ordering point; the last block of a paused
    /// segment frees the segment (its memory, its backup, its reservation):
    /// `Some(Some((device, address)))` names the segment given back.
    pub fn free(
        &self,
        ptr: DevPtr,
        stack: StackId,
        main: &CachingAllocator,
    ) -> Option<Option<(i32, DevPtr)>> {
        let wait = main.frees_wait();
        let mut st = self.state.lock();
        let bi = st.block_index(ptr).ok()?;
        let b = st.blocks[bi].1;
        if !b.used {
            return None;
        }
        let seg = st.segs.get_mut(&b.seg)?;
        seg.used = seg.used.saturating_sub(1);
        let (dev, paused) = (seg.dev, seg.paused.is_some());
        // As the main cache records it: the allocation's stack when the free carries none.
        let fstack = if stack == NO_STACK { b.stack } else { stack };
        st.record(dev, Action::FreeRequested, ptr, b.requested, fstack);
        // A paused segment's memory is gone, and the pause waited for the device's work.
        if wait && !paused {
            let blk = &mut st.blocks[bi].1;
            blk.used = false;
            blk.waiting = true;
            let seq = st.freed;
            st.freed += 1;
            st.waiting.push((seq, dev, ptr));
            return Some(None);
        }
        let (seg, give_back) = st.complete_free(bi);
        if give_back {
            return Some(self.give_back(&mut st, seg));
        }
        Some(None)
    }

    /// Give segment `base` back to the device (its memory unmapped when live): its device
    /// and address, or `None` when it could not be unmapped (it stays, whole).
    #[cold]
    pub(crate) fn give_back(&self, st: &mut State, base: DevPtr) -> Option<(i32, DevPtr)> {
        let d = &*self.device;
        let s = st.segs.get(&base)?;
        let dev = s.dev;
        if s.paused.is_none() {
            let _ = d.synchronize_device(dev);
            retry(|| d.unmap(dev, base, s.size)).ok()?;
        }
        let s = st.forget_segment(base)?;
        st.record(dev, Action::SegmentFree, base, s.size, s.stack);
        if let Some(h) = s.handle {
            let _ = retry(|| d.release_physical(dev, h));
        }
        // A backup goes with its segment (its shared buffer when it was the last).
        drop(s.paused);
        let _ = retry(|| d.release_reservation(dev, base, s.size));
        Some((dev, base))
    }

    /// Give back the fully free live segments that `pick` selects; the ones given back.
    pub(crate) fn release_idle(
        &self,
        st: &mut State,
        pick: impl Fn(&Seg) -> bool,
    ) -> Vec<(i32, DevPtr)> {
        let idle = st.idle_segments(pick);
        idle.into_iter()
            .filter_map(|base| self.give_back(st, base))
            .collect()
    }

    /// Give every fully free live segment back to the device (`cushim_empty_cache`, exit):
    /// the segments given back.
    pub fn empty_cache(&self) -> Vec<(i32, DevPtr)> {
        let mut st = self.state.lock();
        self.release_idle(&mut st, |_| true)
    }

    /// Take the lock for a `fork` (released by dropping the hold, in parent and child).
    pub fn hold_for_fork(&self) -> ForkHold<'_> {
        ForkHold(self.state.lock())
    }

    /// Every segment, in address order.
    pub fn list(&self) -> Vec<RegionInfo> {
        let st = self.state.lock();
        st.segs
            .iter()
            .map(|(&addr, s)| {
                let from = st.blocks.partition_point(|(a, _)| *a < addr);
                let to = st.blocks.partition_point(|(a, _)| *a < addr + s.size);
                RegionInfo {
                    dev: s.dev,
                    addr,
                    mapped: s.size,
                    in_use: st.blocks[from..to]
                        .iter()
                        .filter(|(_, b)| b.used)
                        .map(|(_, b)| b.size)
                        .sum(),
                    tag: st.tags.get(s.tag as usize).cloned().unwrap_or_default(),
                    paused: s.paused.as_ref().map(|p| p.mode),
                }
            })
            .collect()
    }

    /// Device `dev`'s segments with their blocks, for the snapshot: (address, the stack that
    /// made it, its blocks in address order with their state and stack).
    pub fn segment_blocks(&self, dev: i32) -> Vec<(DevPtr, StackId, Vec<BlockInfo>)> {
        let st = self.state.lock();
        st.segs
            .iter()
            .filter(|(_, s)| s.dev == dev)
            .map(|(&addr, s)| {
                let from = st.blocks.partition_point(|(a, _)| *a < addr);
                let to = st.blocks.partition_point(|(a, _)| *a < addr + s.size);
                let blocks = st.blocks[from..to]
                    .iter()
                    .map(|&(a, b)| BlockInfo {
                        address: a,
                        size: b.size,
                        requested_size: b.requested,
                        state: if b.used {
                            BlockState::ActiveAllocated
                        } else if b.waiting {
                            BlockState::ActivePendingFree
                        } else {
                            BlockState::Inactive
                        },
                        stack: if b.is_free() { NO_STACK } else { b.stack },
                    })
                    .collect();
                (addr, s.stack, blocks)
            })
            .collect()
    }

    /// Device `dev`'s recorded events, oldest first.
    pub fn events(&self, dev: i32) -> Vec<TraceEvent> {
        let st = self.state.lock();
        usize::try_from(dev)
            .ok()
            .and_then(|d| st.sinks.get(d))
            .map(|s| s.events())
            .unwrap_or_default()
    }

    /// Bytes paused (reserved, without physical memory) of the tags `want` names.
    pub fn paused_bytes(&self, want: Option<&str>) -> u64 {
        let st = self.state.lock();
        st.segs
            .values()
            .filter(|s| {
                s.paused.is_some()
                    && st
                        .tags
                        .get(s.tag as usize)
                        .is_some_and(|t| tag::matches(t, want))
            })
            .map(|s| s.size)
            .sum()
    }
}

/// Reserve `size` bytes and map new physical memory over them: (base, handle); nothing is
/// left behind on failure.
fn new_segment(d: &dyn Device, dev: i32, size: u64) -> DevResult<(DevPtr, PhysHandle)> {
    let base = d.reserve(dev, size)?;
    let undo_reserve = || {
        let _ = retry(|| d.release_reservation(dev, base, size));
    };
    let h = match d.create_physical(dev, size) {
        Ok(h) => h,
        Err(e) => {
            undo_reserve();
            return Err(e);
        }
    };
    if let Err(e) = map_rw(d, dev, base, size, h) {
        let _ = retry(|| d.release_physical(dev, h));
        undo_reserve();
        return Err(e);
    }
    Ok((base, h))
}
