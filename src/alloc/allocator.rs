//! `CachingAllocator`: the process-wide front of the engine, one locked [`DeviceState`] per
//! device ordinal plus one locked pinned-host cache.
//!
//! Invariant: every call takes exactly one lock in the common case (the device named by the
//! caller, or the hinted device for frees); a lock is never held while taking another,
//! except `snapshot`/`empty_cache`, which take them one after the other. Whatever reads a
//! device's blocks or statistics from here goes through [`settled`] (or a `DeviceState`
//! method that settles), so it never sees a deferred merge (`deferred.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::caching::{Ctx, DeviceState};
use super::devlock::{thread_token, DevLock, DevLockGuard};
use super::host::HostCache;
use super::info::SegmentInfo;
use super::{AllocError, FreeError};
use crate::config::alloc::{AllocConf, FreeSync};
use crate::device::{DevPtr, DevResult, Device, DeviceError, Stream};
use crate::trace::event::{now_us, Action, EventSink, StackId, TraceEvent};

mod address;
mod fork;
mod solo;
pub use address::AddressRange;
pub use fork::ForkHold;

/// One device's (or the pinned host's, `device == -1`) segments and history.
#[derive(Debug, Clone)]
pub struct DeviceSnapshot {
    pub device: i32,
    pub segments: Vec<SegmentInfo>,
    pub events: Vec<crate::trace::event::TraceEvent>,
}

/// The caching allocator of a process.
pub struct CachingAllocator {
    device: Arc<dyn Device>,
    conf: AllocConf,
    states: Vec<DevLock<DeviceState>>,
    host: DevLock<HostCache>,
    /// Under `free_sync:auto`: 0 before the first allocation or free, then the token
    /// (`devlock::thread_token`) of the only thread that allocated or freed so far
    /// ([`solo::EXITED`] once that thread exited, `allocator/solo.rs`), [`THREADS`] once a
    /// second thread came while no per-thread default stream was used, or [`SHARED`] once a
    /// stream was created, or several threads allocate and a per-thread default stream was
    /// used (for ever). [`SHARED`] from the start under every other mode. Shared with the
    /// only thread's exit hook.
    solo: Arc<AtomicUsize>,
    /// Whether the program used a per-thread default stream ([`Self::per_thread_streams_used`]).
    per_thread: AtomicBool,
    /// Per device: whether sleep mode's cache made memory there ([`Self::note_shared_use`];
    /// atomics, so that cache marks it under its own lock without taking a device's).
    shared_use: Vec<AtomicBool>,
}

/// [`CachingAllocator::solo`]: streams (or several threads and per-thread default streams)
/// seen.
pub(crate) const SHARED: usize = usize::MAX;
/// [`CachingAllocator::solo`]: several threads allocate, all of their work on the legacy
/// default stream (ordered in submission order), so frees are still reusable at once.
const THREADS: usize = usize::MAX - 1;

const INVALID_DEVICE: DeviceError = DeviceError::Driver(101);

/// Lock a device's state with its deferred merge done, for anything that reads its blocks
/// or statistics.
fn settled(st: &DevLock<DeviceState>) -> DevLockGuard<'_, DeviceState> {
    let mut g = st.lock();
    g.settle();
    g
}

impl CachingAllocator {
    /// `make_sink(d)` gives the event sink of device `d`, and `make_sink(-1)` the pinned
    /// host's.
    pub fn new(
        device: Arc<dyn Device>,
        conf: AllocConf,
        make_sink: &dyn Fn(i32) -> Box<dyn EventSink>,
    ) -> Self {
        let conf_auto = conf.free_sync == FreeSync::Auto;
        let n = device.device_count().max(1);
        let states = (0..n as i32)
            .map(|d| DevLock::new(DeviceState::new(d, &conf, make_sink(d))))
            .collect();
        CachingAllocator {
            device,
            host: DevLock::new(HostCache::new(make_sink(-1))),
            conf,
            states,
            solo: Arc::new(AtomicUsize::new(if conf_auto { 0 } else { SHARED })),
            per_thread: AtomicBool::new(false),
            shared_use: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// The context of one call, noting the calling thread under `free_sync:auto`: a second
    /// thread that allocates or frees counts as a stream once a per-thread default stream
    /// was used (a thread may queue its work on its own per-thread default stream, which
    /// nothing orders with another thread's). Without one, every thread's work goes to the
    /// legacy default stream, where work submitted after a malloc (which follows the free
    /// that released its block, under the device's lock) runs after work submitted before
    /// that free, whichever threads submitted them.
    #[inline(always)]
    fn ctx_noting_thread(&self) -> Ctx<'_> {
        let solo = self.solo.load(Ordering::Relaxed);
        if solo < THREADS && solo != thread_token() {
            self.other_thread(solo);
        }
        self.ctx()
    }

    /// A thread that is not the only one so far: the first one becomes the only one (until
    /// it exits, `allocator/solo.rs`); a second one (also one that comes after the only one
    /// exited) marks several threads, and, if a per-thread default stream was used, makes
    /// every later free wait and orders on the GPU what earlier frees released
    /// ([`Self::streams_appeared`]).
    #[cold]
    #[inline(never)]
    fn other_thread(&self, solo: usize) {
        let me = thread_token();
        if solo == 0
            && self
                .solo
                .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            && solo::release_at_exit(&self.solo, me)
        {
            return;
        }
        // Both this and `per_thread_streams_used` write their mark, then read the other's
        // (sequentially consistent): at least one of them sees both and orders.
        let _ = self
            .solo
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                (s < THREADS).then_some(THREADS)
            });
        if self.per_thread.load(Ordering::SeqCst) {
            self.streams_appeared();
        }
    }

    /// The program used a per-thread default stream (seen by the caller before the work
    /// was submitted): once several threads allocate, their work is no longer ordered by the
    /// legacy stream alone, so from then on frees wait for the GPU-side barrier.
    pub fn per_thread_streams_used(&self) {
        if self.per_thread.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.solo.load(Ordering::SeqCst) == THREADS {
            self.streams_appeared();
        }
    }

    /// Whether [`Self::per_thread_streams_used`] was called.
    pub fn per_thread_streams_seen(&self) -> bool {
        self.per_thread.load(Ordering::Relaxed)
    }

    /// Streams (or several threads with per-thread default streams) appeared: from now on
    /// frees wait; blocks freed until now were reused at once, so every later piece of work
    /// is ordered after everything queued so far, on every device (once).
    fn streams_appeared(&self) {
        if self.solo.swap(SHARED, Ordering::Relaxed) != SHARED {
            for (d, st) in self.states.iter().enumerate() {
                let mut g = st.lock();
                // A device that never allocated (here or in sleep mode's cache) has nothing
                // to order.
                let shared = self
                    .shared_use
                    .get(d)
                    .is_some_and(|u| u.load(Ordering::Relaxed));
                if g.stats.num_device_alloc > 0 || shared {
                    g.pending.order_all(&*self.device, d as i32);
                }
            }
        }
    }

    pub fn conf(&self) -> &AllocConf {
        &self.conf
    }

    pub fn device_count(&self) -> usize {
        self.states.len()
    }

    #[inline]
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            device: &*self.device,
            conf: &self.conf,
            solo: &self.solo,
            per_thread: &self.per_thread,
        }
    }

    #[inline]
    fn state(&self, dev: i32) -> Option<&DevLock<DeviceState>> {
        usize::try_from(dev).ok().and_then(|d| self.states.get(d))
    }

    /// `cudaMalloc` (stream 0) and friends. Size 0 gives a null pointer.
    #[inline]
    pub fn malloc(
        &self,
        dev: i32,
        size: u64,
        stream: Stream,
        stack: StackId,
    ) -> Result<DevPtr, AllocError> {
        if size == 0 {
            return Ok(0);
        }
        let st = self.state(dev).ok_or(AllocError::Device(INVALID_DEVICE))?;
        let ctx = self.ctx_noting_thread();
        let mut g = st.lock();
        let r = g.malloc(&ctx, size, stream, stack);
        if ctx.conf.cache_capped() {
            // Pending frees that completed during the malloc are cached now (`cap.rs`).
            g.enforce_cache_cap(&ctx);
        }
        r
    }

    /// `cudaMallocAsync`: the block belongs to `stream`.
    pub fn malloc_async(
        &self,
        dev: i32,
        size: u64,
        stream: Stream,
        stack: StackId,
    ) -> Result<DevPtr, AllocError> {
        self.malloc(dev, size, stream, stack)
    }

    #[inline]
    fn free_inner(
        &self,
        ptr: DevPtr,
        stream: Option<Stream>,
        hint_dev: i32,
        stack: StackId,
    ) -> Result<(), FreeError> {
        let ctx = self.ctx_noting_thread();
        if let Some(st) = self.state(hint_dev) {
            match st.lock().free(&ctx, ptr, stream, stack) {
                Err(FreeError::NotOurs) => {}
                other => return other,
            }
        }
        self.free_elsewhere(&ctx, ptr, stream, hint_dev, stack)
    }

    /// [`Self::free_inner`] on every device but the hinted one (out of line: rare).
    #[inline(never)]
    fn free_elsewhere(
        &self,
        ctx: &Ctx,
        ptr: DevPtr,
        stream: Option<Stream>,
        hint_dev: i32,
        stack: StackId,
    ) -> Result<(), FreeError> {
        for (d, st) in self.states.iter().enumerate() {
            if d as i32 == hint_dev {
                continue;
            }
            match st.lock().free(ctx, ptr, stream, stack) {
                Err(FreeError::NotOurs) => {}
                other => return other,
            }
        }
        Err(FreeError::NotOurs)
    }

    /// `cudaFree`: `NotOurs` means the pointer should go to the real free.
    #[inline]
    pub fn free(&self, ptr: DevPtr, hint_dev: i32, stack: StackId) -> Result<(), FreeError> {
        self.free_inner(ptr, None, hint_dev, stack)
    }

    /// [`Self::free_async`] on `Some(stream)`, [`Self::free`] on `None` (one call for a
    /// caller that decides at run time).
    pub fn free_ordered(
        &self,
        ptr: DevPtr,
        stream: Option<Stream>,
        hint_dev: i32,
        stack: StackId,
    ) -> Result<(), FreeError> {
        self.free_inner(ptr, stream, hint_dev, stack)
    }

    /// `cudaFreeAsync`: reusable at once on the block's own stream.
    pub fn free_async(
        &self,
        ptr: DevPtr,
        stream: Stream,
        hint_dev: i32,
        stack: StackId,
    ) -> Result<(), FreeError> {
        self.free_inner(ptr, Some(stream), hint_dev, stack)
    }

    /// Which device's allocator holds memory at `ptr`.
    pub fn owner(&self, ptr: DevPtr) -> Option<i32> {
        self.states
            .iter()
            .position(|st| st.lock().contains(ptr))
            .map(|d| d as i32)
    }

    /// For a cache beside this one (sleep mode's, `crate::sleep`), which follows the same
    /// stream-safety rule with this allocator's streams and barriers: whether a block freed
    /// now must wait for an ordering point ([`Self::order_for_reuse`]) before it is handed
    /// out again. False while `free_sync:auto` has seen no stream (nor several threads with
    /// per-thread default streams): all work is then in the legacy stream's order; and
    /// always under `free_sync:none`. Notes the calling thread, as this allocator's own
    /// calls do.
    #[inline]
    pub fn frees_wait(&self) -> bool {
        self.note_thread();
        self.solo.load(Ordering::Relaxed) == SHARED && self.conf.free_sync != FreeSync::None
    }

    /// For a cache beside this one: note the calling thread at an allocation, as this
    /// allocator's own calls do (a second thread with per-thread default streams orders
    /// everything queued so far, and makes later frees wait).
    #[inline]
    pub fn note_thread(&self) {
        let _ = self.ctx_noting_thread();
    }

    /// For a cache beside this one: order, on device `dev`, everything queued so far before
    /// everything queued later, as this allocator does before it reuses its own pending
    /// frees (`pending.rs`, `barrier.rs`); blocks that cache freed before the call are then
    /// reusable. False while a stream captures (nothing was done; they keep waiting).
    #[cold]
    pub fn order_for_reuse(&self, dev: i32) -> bool {
        let Some(st) = self.state(dev) else {
            return false;
        };
        let all_streams_known = !self.per_thread.load(Ordering::SeqCst);
        let mut g = st.lock();
        g.pending.order_now(&*self.device, dev, all_streams_known)
    }

    /// A cache beside this one made memory on device `dev`: when streams first appear, the
    /// device's past work is ordered as if this allocator had allocated there. Takes no lock.
    #[cold]
    pub fn note_shared_use(&self, dev: i32) {
        if let Some(u) = usize::try_from(dev)
            .ok()
            .and_then(|d| self.shared_use.get(d))
        {
            u.store(true, Ordering::Relaxed);
        }
    }

    /// The program created `stream` on device `dev` (after the real creation succeeded).
    pub fn stream_created(&self, dev: i32, stream: Stream, non_blocking: bool) {
        self.streams_appeared();
        if let Some(st) = self.state(dev) {
            let mut g = st.lock();
            g.pending.stream_born(stream);
            if non_blocking {
                g.pending.stream_created(&*self.device, dev, stream);
            } else {
                g.pending.blocking_stream_created(stream);
            }
        }
    }

    /// The program is about to destroy `stream` of device `dev` (before the real destroy).
    pub fn stream_destroyed(&self, dev: i32, stream: Stream) {
        if let Some(st) = self.state(dev) {
            st.lock()
                .pending
                .stream_destroyed(&*self.device, dev, stream);
        }
    }

    /// GPU-side ordering barriers issued on device `dev` so far, and the driver calls they
    /// made (`barrier.rs`).
    pub fn barriers(&self, dev: i32) -> (u64, u64) {
        self.state(dev)
            .map(|st| {
                let g = st.lock();
                (g.pending.barrier.issued, g.pending.barrier.calls)
            })
            .unwrap_or((0, 0))
    }

    /// Reuses on device `dev` that needed no barrier because every stream's queue was empty
    /// (`quiet.rs`).
    pub fn quiet_checks(&self, dev: i32) -> u64 {
        self.state(dev)
            .map_or(0, |st| st.lock().pending.barrier.quiet)
    }

    /// Wait for pending frees and release every free segment and page of every device, and
    /// every cached pinned block.
    pub fn empty_cache(&self) {
        let ctx = self.ctx();
        for st in &self.states {
            st.lock().release_cached(&ctx);
        }
        self.host.lock().release_free(&*self.device);
    }

    /// Forget device `dev`'s blocks and release its cache (before the real reset).
    pub fn device_reset(&self, dev: i32) {
        if let Some(st) = self.state(dev) {
            st.lock().reset(&self.ctx());
        }
    }

    pub fn mem_get_info(&self, dev: i32) -> DevResult<(u64, u64)> {
        let st = self.state(dev).ok_or(INVALID_DEVICE)?;
        settled(st).mem_get_info(&self.ctx())
    }

    /// Device `dev`'s total memory as the allocator knows it (0: unknown).
    pub fn total_memory(&self, dev: i32) -> u64 {
        let ctx = self.ctx();
        self.state(dev)
            .map_or(0, |st| st.lock().total_memory(ctx.device))
    }

    /// PyTorch-named statistics of device `dev` (empty for an unknown device).
    pub fn stats(&self, dev: i32) -> BTreeMap<String, i64> {
        self.state(dev)
            .map(|st| settled(st).stats.to_map())
            .unwrap_or_default()
    }

    pub fn host_stats(&self) -> BTreeMap<String, i64> {
        self.host.lock().stats_map()
    }

    pub fn reset_peak_stats(&self) {
        for st in &self.states {
            settled(st).stats.reset_peaks();
        }
        self.host.lock().reset_peaks();
    }

    pub fn host_alloc(&self, size: u64, flags: u32, stack: StackId) -> Result<DevPtr, AllocError> {
        self.host.lock().alloc(&*self.device, size, flags, stack)
    }

    pub fn host_free(&self, ptr: DevPtr, stack: StackId) -> Result<(), FreeError> {
        self.host.lock().free(self.conf.free_sync, ptr, stack)
    }

    /// Whether `ptr` is a pinned block of the cache.
    pub fn host_owns(&self, ptr: DevPtr) -> bool {
        self.host.lock().owns(ptr)
    }

    /// Segments of device `dev` (without recording a snapshot event).
    pub fn segments(&self, dev: i32) -> Vec<SegmentInfo> {
        self.state(dev)
            .map(|st| settled(st).segments_info())
            .unwrap_or_default()
    }

    /// Mapped expandable pages of device `dev` as (address, size).
    pub fn expandable_pages(&self, dev: i32) -> Vec<(DevPtr, u64)> {
        self.state(dev)
            .map(|st| settled(st).expandable_pages())
            .unwrap_or_default()
    }

    /// Mallocs of device `dev` answered from a deferred merge so far (`deferred.rs`).
    pub fn deferred_hits(&self, dev: i32) -> u64 {
        self.state(dev)
            .map(|st| st.lock().deferred_hits)
            .unwrap_or(0)
    }

    /// Make every free merge at once, as if deferral did not exist. Only for the test that
    /// proves the two give the same results.
    #[doc(hidden)]
    pub fn merge_frees_at_once(&self) {
        for st in &self.states {
            let mut g = settled(st);
            g.defer = false;
        }
    }

    /// Events recorded for pending-free batches on device `dev` so far.
    pub fn pending_events_recorded(&self, dev: i32) -> u64 {
        self.state(dev)
            .map(|st| st.lock().pending.events_recorded)
            .unwrap_or(0)
    }

    /// One snapshot per device ordinal, then the pinned host (device -1), each under its
    /// lock, each recording a `snapshot` event first. Pending frees are covered and those
    /// whose work is done (their streams synchronized or destroyed) completed first,
    /// without waiting, so the snapshot does not show as pending what already finished.
    pub fn snapshot(&self) -> Vec<DeviceSnapshot> {
        self.snapshot_asking(true)
    }

    /// [`Self::snapshot`] without a single device call: pending frees are shown as they
    /// stand, neither covered nor polled. For a `fork` child, where the driver's own locks
    /// may be held by threads that do not exist there (CUDA leaves its use after `fork`
    /// undefined), so the shim's dump must not depend on it.
    pub fn snapshot_without_device_calls(&self) -> Vec<DeviceSnapshot> {
        self.snapshot_asking(false)
    }

    fn snapshot_asking(&self, ask_device: bool) -> Vec<DeviceSnapshot> {
        let mut out = Vec::with_capacity(self.states.len() + 1);
        let ctx = self.ctx();
        for st in &self.states {
            let mut g = settled(st);
            if ask_device {
                g.settle_pending_for_snapshot(&ctx);
            }
            g.record(Action::Snapshot, 0, 0, 0, 0);
            out.push(DeviceSnapshot {
                device: g.dev,
                segments: g.segments_info(),
                events: g.sink.events(),
            });
        }
        let mut h = self.host.lock();
        if h.sink.enabled() {
            h.sink.record(TraceEvent {
                action: Action::Snapshot,
                device: -1,
                addr: 0,
                size: 0,
                stream: 0,
                time_us: now_us(),
                stack: 0,
                device_free: 0,
                range: 0,
            });
        }
        out.push(DeviceSnapshot {
            device: -1,
            segments: h.segments_info(),
            events: h.sink.events(),
        });
        out
    }
}
