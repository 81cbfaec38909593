//! `ReplayDevice`: an in-process [`Device`] doing address bookkeeping only: the device
//! `cushim replay` runs the engine over, and (with faults injected, `cushim-testsupport`'s
//! `FakeDevice`) the device of the engine's tests and benchmarks.
//!
//! Policy: fault injection is a type parameter ([`Faults`]); the replay device's
//! [`NoFaults`] never fails a call, and only a plan that can be armed ([`ArmFaults`], which
//! lives in the test support crate) gets `fail_nth` / `fail_calls`, so nothing that ships
//! can inject a fault.
//!
//! Invariant: it enforces what the driver enforces (capacity of physical bytes per device,
//! mappings only inside reservations and never overlapping, physical memory released only
//! when unmapped, frees only of live allocations) and counts every call. Nothing is ever
//! backed by memory; addresses are never reused, so a stale pointer can never alias.
//!
//! Addresses of `malloc` rise by default; [`ReplayDevice::set_descending`] makes each new
//! allocation lie below every earlier one instead, as CUDA's driver mostly hands them out
//! (in public PyTorch recordings consecutive `cudaMalloc`s fall more often than they rise).
//! The order matters to a replay: PyTorch's best fit breaks ties between free blocks of
//! one size by address, so which of two equal cached blocks is reused, and so which
//! segment stays whole to be released, follows it (on one public recording that calls
//! `empty_cache` every iteration, rising addresses kept one more 392 MiB segment per
//! iteration than the recording: +7% peak reserved; falling ones reproduce it exactly).

use std::collections::{BTreeMap, HashMap, HashSet};

use parking_lot::Mutex;

use cushim::device::{DevPtr, DevResult, Device, DeviceError, Event, PhysHandle, Stream};

/// Calls that fault injection can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Malloc,
    Reserve,
    CreatePhysical,
    Map,
    SetAccess,
    Unmap,
    RecordEvent,
    SyncStream,
    HostAlloc,
    ReleasePhysical,
    WaitEvent,
}

/// How many times each call was made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub malloc: u64,
    pub free: u64,
    pub reserve: u64,
    pub release_reservation: u64,
    pub create_physical: u64,
    pub release_physical: u64,
    pub map: u64,
    pub set_access: u64,
    pub unmap: u64,
    pub create_event: u64,
    pub record_event: u64,
    pub event_query: u64,
    pub event_sync: u64,
    pub stream_wait_event: u64,
    pub stream_query: u64,
    pub destroy_event: u64,
    pub sync_stream: u64,
    pub sync_device: u64,
    pub host_alloc: u64,
    pub host_free: u64,
}

impl Counters {
    /// Every event-related driver call.
    pub fn event_calls(&self) -> u64 {
        self.create_event
            + self.record_event
            + self.event_query
            + self.event_sync
            + self.stream_wait_event
    }
}

/// Which calls fail: asked once per call of an [`Op`], after the call is counted.
pub trait Faults: Default + Send {
    /// Whether this call of `op` fails.
    fn fault(&mut self, op: Op) -> bool;
}

/// A fault plan that can be armed (the test support crate's).
pub trait ArmFaults {
    /// Make `count` calls of `op` fail, starting with the `nth` next one (both at least 1).
    fn arm(&mut self, op: Op, nth: u64, count: u64);
}

/// No call ever fails: the replay device.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFaults;

impl Faults for NoFaults {
    #[inline]
    fn fault(&mut self, _op: Op) -> bool {
        false
    }
}

#[derive(Default)]
struct EventState {
    dev: i32,
    done: bool,
    /// Queries left before a recorded event completes by itself (0: never by queries).
    queries_left: u32,
}

struct Inner<F> {
    vmm: bool,
    capacity: u64,
    used: Vec<u64>,
    peak_used: Vec<u64>,
    next_addr: Vec<u64>,
    /// With descending addresses: the lowest address handed out so far, per device.
    next_down: Option<Vec<u64>>,
    segments: HashMap<DevPtr, (i32, u64)>,
    reservations: BTreeMap<DevPtr, (i32, u64)>,
    handles: HashMap<u64, (i32, u64, u32)>,
    next_handle: u64,
    mappings: BTreeMap<DevPtr, (i32, u64, u64)>,
    events: HashMap<u64, EventState>,
    next_event: u64,
    auto_complete: bool,
    complete_after_queries: u32,
    capturing: HashSet<Stream>,
    host: HashMap<DevPtr, (u64, u32)>,
    next_host: u64,
    faults: F,
    counters: Counters,
}

/// A device set: `count` devices of `capacity` bytes each, 2 MiB granularity; `F` says
/// which calls fail.
pub struct ReplayDevice<F = NoFaults> {
    count: usize,
    granularity: u64,
    inner: Mutex<Inner<F>>,
}

const DEV_SPAN: u64 = 1 << 44;
/// Where descending addresses live: above 2^62, 64 PiB per device.
const DOWN_BASE: u64 = 1 << 62;
const DOWN_SPAN: u64 = 1 << 56;

impl<F: Faults> ReplayDevice<F> {
    pub fn new(count: usize, capacity: u64) -> ReplayDevice<F> {
        let count = count.max(1);
        ReplayDevice {
            count,
            granularity: 2 << 20,
            inner: Mutex::new(Inner {
                vmm: true,
                capacity,
                used: vec![0; count],
                peak_used: vec![0; count],
                next_addr: (0..count as u64).map(|d| (d + 1) * DEV_SPAN).collect(),
                next_down: None,
                segments: HashMap::new(),
                reservations: BTreeMap::new(),
                handles: HashMap::new(),
                next_handle: 1,
                mappings: BTreeMap::new(),
                events: HashMap::new(),
                next_event: 1,
                auto_complete: true,
                complete_after_queries: 0,
                capturing: HashSet::new(),
                host: HashMap::new(),
                next_host: 0x10_0000_0000,
                faults: F::default(),
                counters: Counters::default(),
            }),
        }
    }

    /// Whether `vmm_supported` reports true (default true).
    pub fn set_vmm(&self, on: bool) {
        self.inner.lock().vmm = on;
    }

    /// Hand out each `malloc` below every earlier one (the driver's usual order; see the
    /// module comment). Each device falls from the top of its own 64 PiB above 2^62, clear
    /// of the rising addresses of reservations and host memory, and never exhausted (a
    /// replay's device allocations, all told, stay far below 64 PiB).
    pub fn set_descending(&self) {
        let mut g = self.inner.lock();
        let n = g.next_addr.len() as u64;
        g.next_down = Some((0..n).map(|d| DOWN_BASE + (d + 1) * DOWN_SPAN).collect());
    }

    /// Whether recorded events complete at once (default true). When false they complete at
    /// [`ReplayDevice::complete_events`], `event_sync` or a device synchronization.
    pub fn set_auto_complete(&self, on: bool) {
        self.inner.lock().auto_complete = on;
    }

    /// With auto-completion off: a recorded event completes by itself on its `n`-th query
    /// (0: only by [`ReplayDevice::complete_events`] or a synchronization). Models work that
    /// finishes a little after the event was recorded.
    pub fn set_complete_after_queries(&self, n: u32) {
        self.inner.lock().complete_after_queries = n;
    }

    /// Complete every recorded event.
    pub fn complete_events(&self) {
        for e in self.inner.lock().events.values_mut() {
            e.done = true;
        }
    }

    /// Mark `stream` as capturing (or not).
    pub fn set_capturing(&self, stream: Stream, on: bool) {
        let mut g = self.inner.lock();
        if on {
            g.capturing.insert(stream);
        } else {
            g.capturing.remove(&stream);
        }
    }

    pub fn counters(&self) -> Counters {
        self.inner.lock().counters.clone()
    }

    /// Physical bytes in use on `dev` (segments plus physical allocations).
    pub fn used(&self, dev: i32) -> u64 {
        self.inner
            .lock()
            .used
            .get(dev as usize)
            .copied()
            .unwrap_or(0)
    }

    /// The largest [`ReplayDevice::used`] seen.
    pub fn peak_used(&self, dev: i32) -> u64 {
        self.inner
            .lock()
            .peak_used
            .get(dev as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Live physical handles on any device.
    pub fn live_handles(&self) -> usize {
        self.inner.lock().handles.len()
    }

    /// Live ordinary segments on any device.
    pub fn live_segments(&self) -> usize {
        self.inner.lock().segments.len()
    }

    /// Bytes currently mapped on `dev`.
    pub fn mapped_bytes(&self, dev: i32) -> u64 {
        self.inner
            .lock()
            .mappings
            .values()
            .filter(|m| m.0 == dev)
            .map(|m| m.1)
            .sum()
    }

    /// Live pinned host allocations.
    pub fn live_host(&self) -> usize {
        self.inner.lock().host.len()
    }

    fn check(&self, dev: i32) -> DevResult<usize> {
        if dev >= 0 && (dev as usize) < self.count {
            Ok(dev as usize)
        } else {
            Err(DeviceError::Driver(101))
        }
    }
}

impl<F: Faults + ArmFaults> ReplayDevice<F> {
    /// Make the `nth` next call (1 = the very next) of `op` fail.
    pub fn fail_nth(&self, op: Op, nth: u64) {
        self.fail_calls(op, nth, 1);
    }

    /// Make `count` calls of `op` fail, starting with the `nth` next one.
    pub fn fail_calls(&self, op: Op, nth: u64, count: u64) {
        if nth > 0 && count > 0 {
            self.inner.lock().faults.arm(op, nth, count);
        }
    }
}

impl<F: Faults> Inner<F> {
    fn fault(&mut self, op: Op) -> bool {
        self.faults.fault(op)
    }

    fn charge(&mut self, d: usize, size: u64) -> DevResult<()> {
        if self.used[d].saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        self.used[d] += size;
        self.peak_used[d] = self.peak_used[d].max(self.used[d]);
        Ok(())
    }

    /// A `malloc`'s address: below the last one when descending, else as any other.
    fn take_malloc_addr(&mut self, d: usize, size: u64, align: u64) -> DevPtr {
        match self.next_down.as_mut().and_then(|v| v.get_mut(d)) {
            Some(top) => {
                let a = top.saturating_sub(size.max(1)) / align * align;
                *top = a;
                a
            }
            None => self.take_addr(d, size, align),
        }
    }

    fn take_addr(&mut self, d: usize, size: u64, align: u64) -> DevPtr {
        let a = self.next_addr[d].div_ceil(align) * align;
        self.next_addr[d] = a + size.max(1);
        a
    }
}

impl<F: Faults> Device for ReplayDevice<F> {
    fn device_count(&self) -> usize {
        self.count
    }

    fn mem_get_info(&self, dev: i32) -> DevResult<(u64, u64)> {
        let d = self.check(dev)?;
        let g = self.inner.lock();
        Ok((g.capacity - g.used[d], g.capacity))
    }

    fn malloc(&self, dev: i32, size: u64) -> DevResult<DevPtr> {
        let d = self.check(dev)?;
        let mut g = self.inner.lock();
        g.counters.malloc += 1;
        if g.fault(Op::Malloc) {
            return Err(DeviceError::OutOfMemory);
        }
        g.charge(d, size)?;
        let p = g.take_malloc_addr(d, size, 2 << 20);
        g.segments.insert(p, (dev, size));
        Ok(p)
    }

    fn free(&self, dev: i32, ptr: DevPtr) -> DevResult<()> {
        let d = self.check(dev)?;
        let mut g = self.inner.lock();
        g.counters.free += 1;
        match g.segments.remove(&ptr) {
            Some((sd, size)) if sd == dev => {
                g.used[d] -= size;
                Ok(())
            }
            Some(v) => {
                g.segments.insert(ptr, v);
                Err(DeviceError::Driver(1))
            }
            None => Err(DeviceError::Driver(1)),
        }
    }

    fn vmm_supported(&self, _dev: i32) -> bool {
        self.inner.lock().vmm
    }

    fn granularity(&self, _dev: i32) -> u64 {
        self.granularity
    }

    fn reserve(&self, dev: i32, size: u64) -> DevResult<DevPtr> {
        let d = self.check(dev)?;
        let mut g = self.inner.lock();
        g.counters.reserve += 1;
        if !g.vmm {
            return Err(DeviceError::NotSupported);
        }
        if g.fault(Op::Reserve) || size % self.granularity != 0 {
            return Err(DeviceError::Driver(1));
        }
        let p = g.take_addr(d, size, self.granularity);
        g.reservations.insert(p, (dev, size));
        Ok(p)
    }

    fn release_reservation(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.release_reservation += 1;
        if g.reservations.get(&ptr) != Some(&(dev, size)) {
            return Err(DeviceError::Driver(1));
        }
        if g.mappings.range(ptr..ptr + size).next().is_some() {
            return Err(DeviceError::Driver(1));
        }
        g.reservations.remove(&ptr);
        Ok(())
    }

    fn create_physical(&self, dev: i32, size: u64) -> DevResult<PhysHandle> {
        let d = self.check(dev)?;
        let mut g = self.inner.lock();
        g.counters.create_physical += 1;
        if g.fault(Op::CreatePhysical) {
            return Err(DeviceError::OutOfMemory);
        }
        if size == 0 || size % self.granularity != 0 {
            return Err(DeviceError::Driver(1));
        }
        g.charge(d, size)?;
        let h = g.next_handle;
        g.next_handle += 1;
        g.handles.insert(h, (dev, size, 0));
        Ok(PhysHandle(h))
    }

    fn release_physical(&self, dev: i32, handle: PhysHandle) -> DevResult<()> {
        let d = self.check(dev)?;
        let mut g = self.inner.lock();
        g.counters.release_physical += 1;
        if g.fault(Op::ReleasePhysical) {
            return Err(DeviceError::Driver(1));
        }
        match g.handles.get(&handle.0).copied() {
            Some((hd, size, 0)) if hd == dev => {
                g.handles.remove(&handle.0);
                g.used[d] -= size;
                Ok(())
            }
            _ => Err(DeviceError::Driver(1)),
        }
    }

    fn map(&self, dev: i32, ptr: DevPtr, size: u64, handle: PhysHandle) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.map += 1;
        if g.fault(Op::Map) {
            return Err(DeviceError::Driver(2));
        }
        let Some(&(hd, hsize, _)) = g.handles.get(&handle.0) else {
            return Err(DeviceError::Driver(1));
        };
        if hd != dev || hsize != size || ptr % self.granularity != 0 {
            return Err(DeviceError::Driver(1));
        }
        let inside = g
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &(rd, rs))| rd == dev && ptr + size <= b + rs);
        let overlaps = g
            .mappings
            .range(..ptr + size)
            .next_back()
            .is_some_and(|(&a, &(_, s, _))| a + s > ptr);
        if !inside || overlaps {
            return Err(DeviceError::Driver(1));
        }
        g.mappings.insert(ptr, (dev, size, handle.0));
        if let Some(h) = g.handles.get_mut(&handle.0) {
            h.2 += 1;
        }
        Ok(())
    }

    fn set_access(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.set_access += 1;
        if g.fault(Op::SetAccess) {
            return Err(DeviceError::Driver(2));
        }
        // The range must be mapped whole, by this device's mappings side by side.
        let end = ptr.checked_add(size).ok_or(DeviceError::Driver(1))?;
        let mut at = ptr;
        if let Some((&a, &(md, ms, _))) = g.mappings.range(..=ptr).next_back() {
            if a < ptr && a + ms > ptr && md == dev {
                at = a + ms;
            }
        }
        for (&a, &(md, ms, _)) in g.mappings.range(at..end) {
            if a != at || md != dev {
                break;
            }
            at = a + ms;
        }
        if size == 0 || at < end {
            return Err(DeviceError::Driver(1));
        }
        Ok(())
    }

    fn unmap(&self, dev: i32, ptr: DevPtr, size: u64) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.unmap += 1;
        if g.fault(Op::Unmap) {
            return Err(DeviceError::Driver(1));
        }
        match g.mappings.get(&ptr).copied() {
            Some((md, ms, h)) if md == dev && ms == size => {
                g.mappings.remove(&ptr);
                if let Some(hh) = g.handles.get_mut(&h) {
                    hh.2 -= 1;
                }
                Ok(())
            }
            _ => Err(DeviceError::Driver(1)),
        }
    }

    fn create_event(&self, dev: i32) -> DevResult<Event> {
        self.check(dev)?;
        let mut g = self.inner.lock();
        g.counters.create_event += 1;
        let e = g.next_event;
        g.next_event += 1;
        g.events.insert(
            e,
            EventState {
                dev,
                done: true,
                queries_left: 0,
            },
        );
        Ok(Event(e))
    }

    fn record_event(&self, dev: i32, event: Event, stream: Stream) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.record_event += 1;
        if g.capturing.contains(&stream) {
            return Err(DeviceError::Capturing);
        }
        if g.fault(Op::RecordEvent) {
            return Err(DeviceError::Driver(1));
        }
        let auto = g.auto_complete;
        let after = g.complete_after_queries;
        match g.events.get_mut(&event.0) {
            Some(e) if e.dev == dev => {
                e.done = auto;
                e.queries_left = after;
                Ok(())
            }
            _ => Err(DeviceError::Driver(400)),
        }
    }

    fn event_done(&self, _dev: i32, event: Event) -> DevResult<bool> {
        let mut g = self.inner.lock();
        g.counters.event_query += 1;
        let e = g.events.get_mut(&event.0).ok_or(DeviceError::Driver(400))?;
        if !e.done && e.queries_left > 0 {
            e.queries_left -= 1;
            e.done = e.queries_left == 0;
        }
        Ok(e.done)
    }

    fn event_sync(&self, _dev: i32, event: Event) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.event_sync += 1;
        match g.events.get_mut(&event.0) {
            Some(e) => {
                e.done = true;
                Ok(())
            }
            None => Err(DeviceError::Driver(400)),
        }
    }

    fn stream_wait_event(&self, dev: i32, stream: Stream, event: Event) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.stream_wait_event += 1;
        if g.capturing.contains(&stream) {
            return Err(DeviceError::Capturing);
        }
        if g.fault(Op::WaitEvent) {
            return Err(DeviceError::Driver(1));
        }
        match g.events.get(&event.0) {
            Some(e) if e.dev == dev => Ok(()),
            _ => Err(DeviceError::Driver(400)),
        }
    }

    fn destroy_event(&self, _dev: i32, event: Event) {
        let mut g = self.inner.lock();
        g.counters.destroy_event += 1;
        g.events.remove(&event.0);
    }

    fn stream_is_capturing(&self, _dev: i32, stream: Stream) -> bool {
        self.inner.lock().capturing.contains(&stream)
    }

    fn stream_idle(&self, _dev: i32, stream: Stream) -> DevResult<bool> {
        let mut g = self.inner.lock();
        g.counters.stream_query += 1;
        if g.capturing.contains(&stream) {
            return Err(DeviceError::Capturing);
        }
        // A stream is idle exactly when the events recorded on it complete at once.
        Ok(g.auto_complete)
    }

    fn synchronize_stream(&self, _dev: i32, _stream: Stream) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.sync_stream += 1;
        if g.fault(Op::SyncStream) {
            return Err(DeviceError::Driver(400));
        }
        Ok(())
    }

    fn synchronize_device(&self, dev: i32) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.sync_device += 1;
        for e in g.events.values_mut().filter(|e| e.dev == dev) {
            e.done = true;
        }
        Ok(())
    }

    fn host_alloc(&self, size: u64, flags: u32) -> DevResult<DevPtr> {
        let mut g = self.inner.lock();
        g.counters.host_alloc += 1;
        if g.fault(Op::HostAlloc) {
            return Err(DeviceError::OutOfMemory);
        }
        if size > 1 << 40 {
            return Err(DeviceError::OutOfMemory);
        }
        let p = g.next_host;
        g.next_host += size.max(1).div_ceil(4096) * 4096;
        g.host.insert(p, (size, flags));
        Ok(p)
    }

    fn host_free(&self, ptr: DevPtr) -> DevResult<()> {
        let mut g = self.inner.lock();
        g.counters.host_free += 1;
        g.host
            .remove(&ptr)
            .map(|_| ())
            .ok_or(DeviceError::Driver(1))
    }
}
