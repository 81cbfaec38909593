//! The GPU-side ordering barrier: how freed blocks are handed out again at once, with no CPU
//! wait, while the program has streams (`free_sync:auto` once streams exist, `barrier`).
//!
//! # Policy
//!
//! A freed block may still be touched by work queued before the free, on any stream. Rather
//! than waiting on the CPU for that work (the GPU normally lags the CPU, so every free would
//! still be pending at the next malloc and the cache would grow by all the memory in
//! flight), the allocator makes every later piece of work on every stream run, on the GPU,
//! after every earlier one. One barrier:
//!
//! 1. on each live non-blocking stream `s` (and each stream a `cudaFreeAsync` named):
//!    record `e_s`; make the legacy default stream wait for `e_s`;
//! 2. record `e_L` on the legacy stream: it completes after everything queued before it on
//!    the legacy stream, on every blocking stream (CUDA's implicit ordering, which covers
//!    per-thread default streams) and, through step 1, on every non-blocking stream;
//! 3. make each non-blocking stream wait for `e_L`. Blocking streams and the legacy stream
//!    wait for `e_L` implicitly (their later work follows earlier legacy work).
//!
//! After it, any work submitted on any stream runs after all work submitted before it, so
//! every block freed before the barrier is reusable as soon as the barrier is *issued*. A
//! barrier is issued only when a malloc finds no free block and freed blocks wait: once per
//! burst of reuse, never per free, and never while nothing waits. It costs `3n + 1` driver
//! calls for `n` non-blocking streams (1 with blocking streams only), plus one
//! capture-status query per stream, none of them a wait on the CPU, all in one driver
//! scope (`Device::batched`).
//!
//! # Idle streams: every live non-blocking stream is ordered, idle or not
//!
//! Unless no stream has work left at all: then no barrier is issued (`quiet.rs`, the queues
//! asked after the free, which needs no hook). What follows is about a barrier that is
//! issued because some stream is busy.
//!
//! For each non-blocking stream `s` a barrier needs (1) `s`'s past work to precede the reuse
//! (steps 1 and 2) and (2) `s`'s *future* work to follow the freed blocks' past uses on every
//! other stream (step 3). Whether `s` is idle on the GPU answers neither: (2) is about work
//! not submitted yet, and for (1) a `cuStreamQuery` first was measured and dropped (in a
//! loop of cudaMalloc/cudaFree pairs the last barrier's own wait is still queued on the
//! stream, so every query said busy and only added a call; BENCHMARKS.md, "Measurements
//! behind design choices"). A stream can be skipped only if it is ordered *lazily*, when
//! work is next submitted to it:
//!
//! - each stream has a state, changed lock-free by the hook of every stream-taking entry
//!   point and by barriers: `Clean` (fully ordered by a barrier, nothing submitted since),
//!   `Dirty` (work submitted since its last ordering), `Owing` (skipped by a barrier: it
//!   must wait for the newest `e_L` before its next submission);
//! - a barrier orders a `Dirty` stream fully (steps 1 and 3, after setting it `Clean`) and
//!   turns a `Clean` or `Owing` one into `Owing` with no driver call. That is sound for (1)
//!   because its past work was covered when it last became `Clean` (the legacy stream
//!   waited for it then, and every later `e_L` follows that wait), and for (2) because of
//!   the hook;
//! - a hook swaps the state to `Dirty` first and, if it was `Owing`, issues
//!   `cuStreamWaitEvent(s, e_L)` before the program's call. A wait on a later record of
//!   `e_L` (events are reused) only orders more; a barrier running meanwhile sees `Dirty`
//!   and orders `s` fully, which orders twice, never too little;
//! - a capture starts or joins only through a submission (`BeginCapture`, a wait on an
//!   event recorded in a capture), so the owed wait is issued before the stream captures
//!   and a capturing stream never gets a wait it did not ask for; a hook that still finds
//!   `s` capturing waits for `e_L` on the CPU instead.
//!
//! It is not done, because it is sound only if *every* submission to *every* stream reaches
//! a hook, on every route a program reaches the driver by: the runtime's and the driver's
//! exported symbols, `cuGetProcAddress`, `dlsym` on a library handle. One missed submission
//! lets a kernel write a block the cache has already handed to someone else.
//! `tests/data/cuda12-stream-entry-points.txt` (kept true to NVIDIA's headers and to the
//! shim's hook tables by `shim/src/per_thread/entry_points.rs`) says which routes the shim
//! hooks for each entry point: every submitting entry point by symbol, the driver's on every
//! route, but `dlsym` on a runtime handle does not hand out the hooks of two runtime ones;
//! the stubs only watch for the per-thread handle (they would have to track), and a name
//! newer than the list reaches none (the skip would have to be turned off when one is
//! resolved). Beyond hooks, NVIDIA's runtime calls `cuGetExportTable` for private function tables, and
//! one of them holds a kernel launch that takes a stream (the ZLUDA project's list of those
//! functions, `zluda_dark_api`): a skip would need those tables wrapped too, and an entry
//! nobody has identified that queues work would still be missed, so it must be checked on a
//! real driver (every launch, copy and memset of a program seen at a hook) before a skip can
//! be trusted there. What it would take is in docs/STREAMS.md ("Why idle streams are not
//! skipped").
//!
//! Events are reused at once (a wait is fixed when it is issued). A non-blocking stream
//! created later has no implicit ordering with anything, so when it appears it waits for a
//! fresh record on the legacy stream (which follows every earlier barrier and all blocking
//! work). A stream about to be destroyed is tied into the legacy stream first (its queued
//! work still runs, and its handle, with the blocks of its pool, may come back). When
//! `auto` first sees a stream (or several threads with per-thread default streams), blocks
//! were reused at once until then: one barrier with nothing to release orders everything
//! queued so far.
//!
//! Why this and not events waited on the CPU (`free_sync:event`, kept as a mode): on
//! simcuda the CPU-waited batches made a cudaMalloc/cudaFree loop with one idle stream
//! allocate many segments and several driver calls per pair, and a GPU kept behind the CPU
//! grew the cache many times over (see BENCHMARKS.md).
//!
//! A capturing stream is never touched: while any live stream (or, implicitly, the legacy
//! stream) captures, no barrier is issued and the freed blocks keep waiting. A failing
//! driver call falls back to synchronizing the device (a barrier half issued orders too
//! much, never too little).

use crate::device::{DevResult, Device, Event, Stream, LEGACY_STREAM};

/// Whether `s` is the legacy stream or aliases a blocking default stream (`1` is
/// `cudaStreamLegacy`, `2` the calling thread's per-thread default stream): the legacy
/// record covers it.
pub fn covered_by_legacy(s: Stream) -> bool {
    s <= 2
}

/// The events of the barriers of one device.
#[derive(Default)]
pub struct Barrier {
    /// Events for step 1, reused by every barrier.
    spare: Vec<Event>,
    /// `e_L`, recorded by the last barrier issued (`None` before the first one).
    legacy: Option<Event>,
    /// Barriers issued so far.
    pub issued: u64,
    /// Driver calls made by barriers so far (records and waits).
    pub calls: u64,
    /// Barriers not needed because every stream's queue was empty (`quiet.rs`).
    pub quiet: u64,
    /// Device synchronizations made instead of a barrier over many streams (`quiet.rs`).
    pub synced: u64,
}

impl Barrier {
    fn event(&mut self, device: &dyn Device, dev: i32, i: usize) -> DevResult<Event> {
        while self.spare.len() <= i {
            self.spare.push(device.create_event(dev)?);
        }
        Ok(self.spare[i])
    }

    /// The event recorded on the legacy stream, made on first use.
    fn legacy_event(&mut self, device: &dyn Device, dev: i32) -> DevResult<Event> {
        match self.legacy {
            Some(e) => Ok(e),
            None => {
                let e = device.create_event(dev)?;
                self.legacy = Some(e);
                Ok(e)
            }
        }
    }

    /// Issue one barrier over the legacy stream and `streams` (the non-blocking ones; those
    /// the legacy record covers are skipped). The caller checked that none captures.
    pub fn issue(&mut self, device: &dyn Device, dev: i32, streams: &[Stream]) -> DevResult<()> {
        for (n, &s) in streams
            .iter()
            .filter(|&&s| !covered_by_legacy(s))
            .enumerate()
        {
            let e = self.event(device, dev, n)?;
            self.calls += 2;
            device.record_event(dev, e, s)?;
            device.stream_wait_event(dev, LEGACY_STREAM, e)?;
        }
        let el = self.legacy_event(device, dev)?;
        self.calls += 1;
        device.record_event(dev, el, LEGACY_STREAM)?;
        for &s in streams.iter().filter(|&&s| !covered_by_legacy(s)) {
            self.calls += 1;
            device.stream_wait_event(dev, s, el)?;
        }
        self.issued += 1;
        Ok(())
    }

    /// A non-blocking stream appeared: its work must follow everything queued so far
    /// (blocks released until now, by a barrier or by a free made before any stream
    /// existed, may be used on it). One record on the legacy stream, which follows every
    /// earlier barrier and every blocking stream, and the new stream waits for it.
    pub fn tie_new_stream(&mut self, device: &dyn Device, dev: i32, s: Stream) -> DevResult<()> {
        if covered_by_legacy(s) {
            return Ok(());
        }
        let el = self.legacy_event(device, dev)?;
        self.calls += 2;
        device.record_event(dev, el, LEGACY_STREAM)?;
        device.stream_wait_event(dev, s, el)
    }

    /// A stream is about to be destroyed: the legacy stream (and so every later barrier and
    /// new-stream tie) waits for its queued work.
    pub fn tie_dying_stream(&mut self, device: &dyn Device, dev: i32, s: Stream) -> DevResult<()> {
        if covered_by_legacy(s) {
            return Ok(());
        }
        let e = self.event(device, dev, 0)?;
        self.calls += 2;
        device.record_event(dev, e, s)?;
        device.stream_wait_event(dev, LEGACY_STREAM, e)
    }

    /// Destroy every event (device reset).
    pub fn clear(&mut self, device: &dyn Device, dev: i32) {
        for e in self.spare.drain(..).chain(self.legacy.take()) {
            device.destroy_event(dev, e);
        }
    }
}
