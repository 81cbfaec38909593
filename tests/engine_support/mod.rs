//! What the engine-level tests share: an event sink that keeps every event in memory.

use std::sync::{Arc, Mutex};

use cushim::trace::event::{EventSink, TraceEvent};

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
