//! One allocator event, as the allocator emits it and the history ring stores it.
//!
//! Invariant: a `TraceEvent` is plain `Copy` data (no heap), so recording one under the
//! allocator's lock allocates nothing. Stacks are referenced by [`StackId`] and resolved at
//! dump time.

/// An interned native stack. `0` means "no stack recorded".
pub type StackId = u32;

/// No stack.
pub const NO_STACK: StackId = 0;

pub use crate::action::Action;

/// One event. For `Oom`, `addr` is unused and `device_free` holds the device's free bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    pub action: Action,
    /// Device ordinal; `-1` for pinned host memory.
    pub device: i32,
    pub addr: u64,
    /// Bytes: the requested size for `Alloc` and the frees (as PyTorch records them), the segment or
    /// mapping size for segment actions, the request for `Oom`.
    pub size: u64,
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
    pub stack: StackId,
    /// Free device bytes, for `Oom` only (0 otherwise).
    pub device_free: u64,
    /// The recording thread's open NVTX range path ([`crate::trace::range`]); `0`: none.
    pub range: crate::trace::range::RangeId,
}

impl TraceEvent {
    /// An allocator's event happening now (no free-bytes figure, no range: the sink adds
    /// the range where it keeps them). The one constructor of the caches' events.
    #[inline]
    pub fn now(
        action: Action,
        device: i32,
        addr: u64,
        size: u64,
        stream: u64,
        stack: StackId,
    ) -> TraceEvent {
        TraceEvent {
            action,
            device,
            addr,
            size,
            stream,
            time_us: now_us(),
            stack,
            device_free: 0,
            range: 0,
        }
    }
}

/// Microseconds since the Unix epoch, for `TraceEvent::time_us`; monotonic within the
/// process. Cheap: the TSC where the kernel trusts it, else vDSO `clock_gettime` (see
/// [`crate::trace::clock`]).
#[inline]
pub fn now_us() -> i64 {
    crate::trace::clock::now_us()
}

/// Where an allocator records its events: the history ring, or nothing. One sink per device
/// allocator (and one for pinned memory), owned by the allocator's locked state, so
/// `record` runs under that lock and must not allocate after warm-up or take another lock.
pub trait EventSink: Send {
    /// Whether any event is recorded at all (lets the allocator skip taking timestamps).
    /// Constant for the sink's life: the allocator reads it once, when it takes the sink.
    fn enabled(&self) -> bool;
    /// Record one event (the sink applies its own filters, such as `skip_actions`).
    fn record(&mut self, ev: TraceEvent);
    /// The recorded events, oldest first.
    fn events(&self) -> Vec<TraceEvent>;
}

/// A sink that records nothing (history off).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl EventSink for NullSink {
    fn enabled(&self) -> bool {
        false
    }
    fn record(&mut self, _ev: TraceEvent) {}
    fn events(&self) -> Vec<TraceEvent> {
        Vec::new()
    }
}
