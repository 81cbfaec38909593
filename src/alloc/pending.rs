//! Stream safety of freed blocks: pending frees, covered lazily (when a malloc would need
//! them) by one of three mechanisms, chosen by `free_sync`:
//!
//! - `auto` (once streams exist) and `barrier`: a GPU-side ordering barrier (`barrier.rs`);
//!   the blocks are reusable as soon as it is issued. None when every stream's queue is
//!   empty, and under `auto` a device synchronization instead over many streams
//!   (`quiet.rs`).
//! - `event`: a batch of events, one per live stream, polled on the CPU.
//! - `device`: a device synchronization.
//!
//! Invariant: a block handed in by [`Pending::push`] is returned (by `poll`, `cover` or
//! `sync_all`) only once no work queued before the free can overlap work queued after the
//! block is returned: a barrier was issued after the free on the legacy stream (which
//! orders all blocking streams) and on every tracked non-blocking stream, or an event
//! recorded after the free on each of them has completed, or the device was synchronized.
//! Nothing is recorded, waited or queried on a capturing stream. Events are reused; a
//! batch or barrier costs one event per live stream, never one per free.

use std::collections::VecDeque;

use super::barrier::{self, Barrier};
use super::block::BlockId;
use crate::config::alloc::FreeSync;
use crate::device::{Device, Event, Stream, LEGACY_STREAM};

/// Whether the legacy stream or one of `streams` of `dev` is capturing (a barrier may not be
/// recorded into a capture).
fn capturing(device: &dyn Device, dev: i32, streams: &[Stream]) -> bool {
    std::iter::once(LEGACY_STREAM)
        .chain(streams.iter().copied())
        .any(|s| device.stream_is_capturing(dev, s))
}

/// How many destroyed stream handles are remembered (to refuse a `cudaFreeAsync` on one).
const DEAD_STREAMS: usize = 1024;

struct Batch {
    events: Vec<(Stream, Event)>,
    blocks: Vec<BlockId>,
}

/// Pending frees of one device.
pub struct Pending {
    mode: FreeSync,
    unbatched: Vec<BlockId>,
    /// Streams named by `free_async` that are not tracked (covered with the next batch).
    extra: Vec<Stream>,
    batches: VecDeque<Batch>,
    event_pool: Vec<Event>,
    spare: Vec<Vec<BlockId>>,
    /// Tracked live non-blocking streams of this device.
    streams: Vec<Stream>,
    /// Tracked live blocking streams of this device (a quiet check must query them too).
    blocking: Vec<Stream>,
    /// Streams the program destroyed, newest last, at most [`DEAD_STREAMS`] (a handle the
    /// driver hands out again is removed when it is created).
    dead: VecDeque<Stream>,
    /// Events recorded so far by `event` batches (for tests and stats).
    pub events_recorded: u64,
    /// The GPU-side barriers (`auto`, `barrier`).
    pub barrier: Barrier,
}

impl Pending {
    pub fn new(mode: FreeSync) -> Pending {
        Pending {
            mode,
            unbatched: Vec::new(),
            extra: Vec::new(),
            batches: VecDeque::new(),
            event_pool: Vec::new(),
            spare: Vec::new(),
            streams: Vec::new(),
            blocking: Vec::new(),
            dead: VecDeque::new(),
            events_recorded: 0,
            barrier: Barrier::default(),
        }
    }

    /// Whether blocks are covered by GPU-side barriers.
    fn barriers(&self) -> bool {
        matches!(self.mode, FreeSync::Auto | FreeSync::Barrier)
    }

    pub fn mode(&self) -> FreeSync {
        self.mode
    }

    /// Any stream was created: its handle is live again.
    pub fn stream_born(&mut self, s: Stream) {
        if !self.dead.is_empty() {
            self.dead.retain(|&x| x != s);
        }
    }

    /// A blocking stream was created: the legacy record covers it in a barrier, but a quiet
    /// check (`quiet.rs`) must find it idle too.
    pub fn blocking_stream_created(&mut self, s: Stream) {
        if !barrier::covered_by_legacy(s) && !self.blocking.contains(&s) {
            self.blocking.push(s);
        }
    }

    /// Whether `s` is a stream the program destroyed (and no stream since took its handle).
    pub fn is_dead(&self, s: Stream) -> bool {
        !self.dead.is_empty() && self.dead.contains(&s)
    }

    /// A non-blocking stream was created. Under barriers it is made to wait for everything
    /// queued so far (blocks released until now may be used on it at once); if that fails,
    /// the device is synchronized instead.
    pub fn stream_created(&mut self, device: &dyn Device, dev: i32, s: Stream) {
        if !self.streams.contains(&s) {
            self.streams.push(s);
        }
        if self.barriers() {
            let barrier = &mut self.barrier;
            let mut r = Ok(());
            device.batched(dev, &mut || {
                r = if device.stream_is_capturing(dev, LEGACY_STREAM) {
                    Err(crate::device::DeviceError::Capturing)
                } else {
                    barrier.tie_new_stream(device, dev, s)
                };
            });
            if r.is_err() {
                let _ = device.synchronize_device(dev);
            }
        }
    }

    /// Streams (or several threads with per-thread default streams) appeared under `auto`:
    /// blocks freed until now were reused at once, so every later piece of work is ordered
    /// after everything queued so far (a barrier with no block to release; nothing while a
    /// stream captures).
    pub fn order_all(&mut self, device: &dyn Device, dev: i32) {
        if !self.barriers() {
            return;
        }
        let streams = &self.streams;
        let barrier = &mut self.barrier;
        device.batched(dev, &mut || {
            if !capturing(device, dev, streams) && barrier.issue(device, dev, streams).is_err() {
                let _ = device.synchronize_device(dev);
            }
        });
    }

    /// A stream is about to be destroyed. Under barriers the legacy stream is first made to
    /// wait for its queued work: blocks freed while it ran may still wait (the next barrier
    /// no longer names it), and blocks of its own pool may go to a stream that gets its
    /// handle later (which is tied to the legacy stream when it appears). If that fails,
    /// the stream is synchronized.
    pub fn stream_destroyed(&mut self, device: &dyn Device, dev: i32, s: Stream) {
        let tracked = self.streams.contains(&s) || self.extra.contains(&s);
        if tracked
            && self.barriers()
            && !device.stream_is_capturing(dev, s)
            && self.barrier.tie_dying_stream(device, dev, s).is_err()
        {
            let _ = device.synchronize_stream(dev, s);
        }
        self.streams.retain(|&x| x != s);
        self.blocking.retain(|&x| x != s);
        self.extra.retain(|&x| x != s);
        if !super::barrier::covered_by_legacy(s) {
            if self.dead.len() >= DEAD_STREAMS {
                self.dead.pop_front();
            }
            self.dead.push_back(s);
        }
    }

    /// A freed block whose reuse must wait; `stream` is the stream of the free, if it is one
    /// that the next batch must cover beyond the legacy and tracked streams.
    pub fn push(&mut self, id: BlockId, stream: Option<Stream>) {
        self.unbatched.push(id);
        if let Some(s) = stream {
            if s != LEGACY_STREAM && !self.streams.contains(&s) && !self.extra.contains(&s) {
                self.extra.push(s);
            }
        }
    }

    /// Whether any block is waiting.
    pub fn any(&self) -> bool {
        !self.unbatched.is_empty() || !self.batches.is_empty()
    }

    /// The blocks waiting for recorded events, oldest batch first.
    pub fn batched_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.batches.iter().flat_map(|b| b.blocks.iter().copied())
    }

    pub fn has_unbatched(&self) -> bool {
        !self.unbatched.is_empty()
    }

    fn live_streams(&self) -> impl Iterator<Item = Stream> + '_ {
        std::iter::once(LEGACY_STREAM)
            .chain(self.streams.iter().copied())
            .chain(self.extra.iter().copied())
    }

    fn any_capturing(&self, device: &dyn Device, dev: i32) -> bool {
        self.live_streams()
            .any(|s| device.stream_is_capturing(dev, s))
    }

    fn recycle(&mut self, mut v: Vec<BlockId>, out: &mut Vec<BlockId>) {
        out.append(&mut v);
        self.spare.push(v);
    }

    /// Move the blocks of completed batches (oldest first, stopping at the first incomplete
    /// one) into `out`.
    pub fn poll(&mut self, device: &dyn Device, dev: i32, out: &mut Vec<BlockId>) {
        while let Some(front) = self.batches.front() {
            let done = front.events.iter().all(|&(s, e)| {
                !device.stream_is_capturing(dev, s) && device.event_done(dev, e).unwrap_or(false)
            });
            if !done {
                break;
            }
            if let Some(b) = self.batches.pop_front() {
                self.event_pool.extend(b.events.iter().map(|&(_, e)| e));
                self.recycle(b.blocks, out);
            }
        }
    }

    /// Cover every unbatched block: record a batch of events (`event`/`auto`), or
    /// synchronize the device and release them into `out` (`device`). Does nothing while a
    /// live stream is capturing. A failing event call falls back to synchronizing. Under
    /// barriers, `all_streams_known` (no per-thread default stream was used) lets a quiet
    /// check stand in for the barrier (`quiet.rs`).
    pub fn cover(
        &mut self,
        device: &dyn Device,
        dev: i32,
        out: &mut Vec<BlockId>,
        all_streams_known: bool,
    ) {
        if self.unbatched.is_empty() {
            return;
        }
        if self.barriers() {
            self.cover_by_barrier(device, dev, out, all_streams_known);
            return;
        }
        if self.any_capturing(device, dev) {
            return;
        }
        let blocks = std::mem::replace(&mut self.unbatched, self.spare.pop().unwrap_or_default());
        if self.mode == FreeSync::Device {
            if device.synchronize_device(dev).is_ok() {
                self.recycle(blocks, out);
            } else {
                self.unbatched = blocks;
            }
            return;
        }
        let streams: Vec<Stream> = self.live_streams().collect();
        let mut events = Vec::with_capacity(streams.len());
        let mut failed = false;
        for s in streams {
            let ev = match self.event_pool.pop() {
                Some(e) => Ok(e),
                None => device.create_event(dev),
            };
            match ev.and_then(|e| device.record_event(dev, e, s).map(|_| e)) {
                Ok(e) => {
                    self.events_recorded += 1;
                    events.push((s, e));
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        self.extra.clear();
        if failed {
            self.event_pool.extend(events.iter().map(|&(_, e)| e));
            if device.synchronize_device(dev).is_ok() {
                self.recycle(blocks, out);
            } else {
                self.unbatched = blocks;
            }
            return;
        }
        self.batches.push_back(Batch { events, blocks });
    }

    /// [`Self::cover`] under barriers: unless a live stream captures, issue one barrier (the
    /// capture checks and the barrier in one driver scope) and release every unbatched block.
    fn cover_by_barrier(
        &mut self,
        device: &dyn Device,
        dev: i32,
        out: &mut Vec<BlockId>,
        all_streams_known: bool,
    ) {
        let Some(r) = self.barrier_now(device, dev, all_streams_known) else {
            return;
        };
        let blocks = std::mem::replace(&mut self.unbatched, self.spare.pop().unwrap_or_default());
        if r.is_ok() || device.synchronize_device(dev).is_ok() {
            self.recycle(blocks, out);
        } else {
            self.unbatched = blocks;
        }
    }

    /// Under barriers, one ordering point: the quiet check, a barrier, or (over many streams
    /// under `auto`) a device synchronization, over the tracked streams and those frees
    /// named. `None` while a live stream captures (nothing done), else the driver's answer.
    fn barrier_now(
        &mut self,
        device: &dyn Device,
        dev: i32,
        all_streams_known: bool,
    ) -> Option<crate::device::DevResult<()>> {
        // The tracked non-blocking streams, then the ones frees named; the barrier skips the
        // default streams the legacy record covers.
        let tracked = self.streams.len();
        self.streams.extend_from_slice(&self.extra);
        let mut r = Err(crate::device::DeviceError::Capturing);
        let mut capturing = false;
        device.batched(dev, &mut || {
            capturing = self::capturing(device, dev, &self.streams);
            if capturing {
                return;
            }
            if all_streams_known
                && super::quiet::all_idle(device, dev, &self.streams, &self.blocking)
            {
                self.barrier.quiet += 1;
                r = Ok(());
                return;
            }
            let ordered = self
                .streams
                .iter()
                .filter(|&&s| !barrier::covered_by_legacy(s))
                .count();
            if self.mode == FreeSync::Auto && ordered > super::quiet::BARRIER_STREAMS {
                // As CUDA's own free would: see `quiet.rs`.
                self.barrier.synced += 1;
                r = device.synchronize_device(dev);
                return;
            }
            r = self.barrier.issue(device, dev, &self.streams);
        });
        self.streams.truncate(tracked);
        if capturing {
            return None;
        }
        self.extra.clear();
        Some(r)
    }

    /// Order everything queued so far on this device before everything queued later, for
    /// blocks another cache freed (sleep mode's): under barriers the same ordering point as
    /// [`Self::cover`] (quiet check, barrier or synchronization), otherwise a device
    /// synchronization. Whether it was done: never while a live stream captures.
    pub fn order_now(&mut self, device: &dyn Device, dev: i32, all_streams_known: bool) -> bool {
        if !self.barriers() {
            return !self.any_capturing(device, dev) && device.synchronize_device(dev).is_ok();
        }
        match self.barrier_now(device, dev, all_streams_known) {
            None => false,
            Some(r) => r.is_ok() || device.synchronize_device(dev).is_ok(),
        }
    }

    /// Wait for everything: cover the unbatched blocks, then synchronize every batch's
    /// events; all blocks go to `out` (unless a stream is capturing).
    pub fn sync_all(&mut self, device: &dyn Device, dev: i32, out: &mut Vec<BlockId>) {
        self.cover(device, dev, out, false);
        while let Some(front) = self.batches.front() {
            if front
                .events
                .iter()
                .any(|&(s, _)| device.stream_is_capturing(dev, s))
            {
                break;
            }
            let synced = front
                .events
                .iter()
                .all(|&(_, e)| device.event_sync(dev, e).is_ok());
            // A failing event falls back to waiting for the whole device.
            if !synced && device.synchronize_device(dev).is_err() {
                break;
            }
            if let Some(b) = self.batches.pop_front() {
                self.event_pool.extend(b.events.iter().map(|&(_, e)| e));
                self.recycle(b.blocks, out);
            }
        }
    }

    /// Forget every pending block and destroy every event (device reset).
    pub fn clear(&mut self, device: &dyn Device, dev: i32) {
        self.unbatched.clear();
        self.extra.clear();
        self.barrier.clear(device, dev);
        for b in self.batches.drain(..) {
            for (_, e) in b.events {
                device.destroy_event(dev, e);
            }
        }
        for e in self.event_pool.drain(..) {
            device.destroy_event(dev, e);
        }
    }
}
