//! What the engine-level tests share: an allocator over a fake device, a statistic by name,
//! the blocks waiting for a free to be safe, and an event sink that keeps every event in
//! memory. (Each test binary uses a part.)
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use cushim::alloc::info::BlockState;
use cushim::alloc::CachingAllocator;
use cushim::config::alloc::parse;
use cushim::trace::event::{EventSink, NullSink, TraceEvent};
use cushim_testsupport::fake_device::FakeDevice;

/// An allocator with configuration `conf` (which must parse cleanly) over a fake device of
/// `devices` ordinals of `capacity` bytes each, history off.
pub fn setup_devices(
    conf: &str,
    devices: usize,
    capacity: u64,
) -> (Arc<FakeDevice>, CachingAllocator) {
    let dev = Arc::new(FakeDevice::new(devices, capacity));
    let (c, errs) = parse(conf);
    assert!(errs.is_empty(), "{errs:?}");
    let a = CachingAllocator::new(dev.clone(), c, &|_| Box::new(NullSink));
    (dev, a)
}

/// [`setup_devices`] with one device.
pub fn setup(conf: &str, capacity: u64) -> (Arc<FakeDevice>, CachingAllocator) {
    setup_devices(conf, 1, capacity)
}

/// [`setup`] with history on: every event goes to the returned sink.
pub fn setup_recorded(conf: &str, capacity: u64) -> (Arc<FakeDevice>, CachingAllocator, VecSink) {
    let dev = Arc::new(FakeDevice::new(1, capacity));
    let (c, errs) = parse(conf);
    assert!(errs.is_empty(), "{errs:?}");
    let sink = VecSink::default();
    let s2 = sink.clone();
    let a = CachingAllocator::new(dev.clone(), c, &move |_| Box::new(s2.clone()));
    (dev, a, sink)
}

/// Device 0's statistic `key` (PyTorch's name).
pub fn stat(a: &CachingAllocator, key: &str) -> i64 {
    a.stats(0)[key]
}

/// A 12 MiB block malloc'd and freed on the legacy stream under `conf` (1 GiB device) while
/// non-blocking stream 0x77 exists and the fake GPU completes no event unless told: the
/// freed block must wait. Returns the block's address too.
pub fn freed_behind_a_stream(conf: &str) -> (Arc<FakeDevice>, CachingAllocator, u64) {
    let (dev, a) = setup(conf, 1 << 30);
    dev.set_auto_complete(false);
    a.stream_created(0, 0x77, true);
    let p = a.malloc(0, 12 << 20, 0, 0).unwrap();
    a.free(p, 0, 0).unwrap();
    (dev, a, p)
}

/// How many of device 0's blocks are freed but still waiting for the GPU (or a barrier)
/// before they may be handed out again.
pub fn pending_blocks(a: &CachingAllocator) -> usize {
    a.segments(0)
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::ActivePendingFree)
        .count()
}

/// Records every event into a shared vector (clones share it), so a test can read what the
/// allocator recorded after handing the sink over.
#[derive(Clone, Default)]
pub struct VecSink(pub Arc<Mutex<Vec<TraceEvent>>>);

impl EventSink for VecSink {
    fn enabled(&self) -> bool {
        true
    }
    fn record(&mut self, ev: TraceEvent) {
        if let Ok(mut v) = self.0.lock() {
            v.push(ev);
        }
    }
    fn events(&self) -> Vec<TraceEvent> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}
