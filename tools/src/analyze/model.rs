//! The one model of a snapshot every analysis reads: per device its segments (the state at
//! the end) and its trace (oldest first), with stacks interned once.
//!
//! Invariant: `Stacks::lists[0]` is the empty stack; every `stack` field indexes `lists`
//! and every frame index in a list indexes `frames`. `devices` holds only the ordinals the
//! input names, in ascending order.

use cushim::trace::event::Action;
use std::sync::Arc;

/// One stack frame (innermost first within a stack).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub name: Arc<str>,
    pub file: Arc<str>,
    pub line: i64,
}

/// Interned frames and stacks.
#[derive(Debug, Clone)]
pub struct Stacks {
    pub frames: Vec<Frame>,
    pub lists: Vec<Box<[u32]>>,
}

impl Default for Stacks {
    fn default() -> Self {
        Stacks {
            frames: Vec::new(),
            lists: vec![Box::new([])],
        }
    }
}

impl Stacks {
    /// The frames of stack `id`, innermost first (empty for an unknown id).
    pub fn frames_of(&self, id: u32) -> impl Iterator<Item = &Frame> {
        self.lists
            .get(id as usize)
            .map_or(&[][..], |l| &l[..])
            .iter()
            .filter_map(|&f| self.frames.get(f as usize))
    }
}

/// A block's state at the end of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    Allocated,
    /// Freed by the program; the allocator waits for work on other streams to finish.
    PendingFree,
    Inactive,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
    pub stack: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub expandable: bool,
    /// What an observed allocation is (`managed`, `vmm`, `pool`, ...); `None`: the cache's.
    pub kind: Option<Arc<str>>,
    /// PyTorch's `segment_pool_id`: `(0, 0)` the default pool; any other a private pool (a
    /// CUDA graph's, a `torch.cuda.MemPool`), whose cached memory serves only that pool.
    pub pool: (i64, i64),
    pub blocks: Vec<Block>,
}

/// One trace entry, as compact as the analyses allow (32 bytes: a 1 GB trace has some
/// 18 million of them). Its time is not kept: no analysis reads it (the timeline is drawn
/// by event index, and replay keeps the order only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub stack: u32,
}

const _: () = assert!(std::mem::size_of::<Event>() == 32);

/// One device (or the pinned host memory).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    pub ordinal: i64,
    pub segments: Vec<Segment>,
    /// Oldest first.
    pub events: crate::analyze::event_list::EventList,
}

impl Device {
    /// Whether nothing was ever recorded here.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.events.is_empty()
    }
}

/// The model of one input.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// What the input was (`"cushim/PyTorch snapshot"`, `"RMM log"`, `"alloc/free log"`).
    pub kind: &'static str,
    pub devices: Vec<Device>,
    pub host: Option<Device>,
    /// The recorded allocator settings as a configuration string, when the input has them.
    pub settings: Option<String>,
    /// The device's total memory, when the input records it (the largest, when devices
    /// differ).
    pub device_total: Option<u64>,
    /// Whether the segments describe the state at the end (false for logs, which have only
    /// events).
    pub has_state: bool,
    pub stacks: Stacks,
    /// The snapshot's `cushim` section (version, command line, stats, observed memory), as
    /// read; small, kept for the lines that read it (`snapshot::kinds`).
    pub cushim: Option<cushim::snapshot::value::Value>,
}

impl Snapshot {
    /// The device with ordinal `d`.
    pub fn device(&self, d: i64) -> Option<&Device> {
        self.devices.iter().find(|x| x.ordinal == d)
    }

    /// Whether `dev`'s reserved memory is known: from the end state, or, for an input with
    /// only events, from segment events (cushim's whole-run log records every segment from
    /// the run's start; an allocation log of another tool has none).
    pub fn reserved_known(&self, dev: &Device) -> bool {
        self.has_state
            || dev
                .events
                .iter()
                .any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
    }
}
