//! What a snapshot is built from: the allocators' state and events, copied out under their
//! locks, plus settings, stats and the history configuration.
//!
//! Invariant: `devices[i]` holds one device's segments (the state after its last event)
//! and its events oldest first; the snapshot's `device_traces` has one list per ordinal
//! from 0 to the largest ordinal present, empty where a device recorded nothing.
//!
//! The schema written (PyTorch's `torch.cuda.memory._snapshot()`):
//! - top level: `segments`, `device_traces`, `allocator_settings`, and with pinned memory
//!   `host_segments`, `host_traces`; plus `cushim` (version, command line, stats, history).
//! - segment: `device, address, total_size, allocated_size, active_size, requested_size,
//!   stream, segment_type ("small"|"large"), segment_pool_id (tuple), is_expandable,
//!   frames, blocks`; an observed one also `kind` and `flags`.
//! - block: `address, size, requested_size, state, frames`.
//! - trace entry: `action, addr, size, stream, time_us, frames`, plus `user_metadata` (the
//!   NVTX range path, `trace::range`) on entries made inside a range (`oom`: `device_free`
//!   instead of `addr`).
//! - frame: `name, filename, line`.
//! - `external_annotations` (when any NVTX range opened with history on): `stage`
//!   (`START`/`END`), `name`, `device`, `time_us` per start or end, and `range` (the range's
//!   whole path, as its allocations' `user_metadata`).

use crate::alloc::info::SegmentInfo;
use crate::alloc::observed::ObservedSegment;
use crate::config::history::HistoryConf;
use crate::trace::event::TraceEvent;

/// One device's part of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct DeviceState {
    /// Device ordinal (index into `device_traces`).
    pub device: i32,
    pub segments: Vec<SegmentInfo>,
    /// Oldest first.
    pub events: Vec<TraceEvent>,
}

/// Everything a snapshot is built from.
#[derive(Debug, Clone, Default)]
pub struct SnapshotInput {
    pub devices: Vec<DeviceState>,
    /// Pinned host memory: segments and events (written as `host_segments` / `host_traces`).
    pub host: Option<(Vec<SegmentInfo>, Vec<TraceEvent>)>,
    /// `AllocConf::settings_json()`: the config as the viewer shows it.
    pub allocator_settings: serde_json::Value,
    /// Memory statistics, under `cushim.stats`.
    pub stats: serde_json::Value,
    /// Which entries carry frames.
    pub history: HistoryConf,
    /// The program's command line, under `cushim.cmdline`.
    pub cmdline: Vec<String>,
    /// Allocations recorded as the program made them (observing mode, and the families the
    /// cache does not serve): device segments join `segments`, host ones `host_segments`,
    /// each with its `kind` and `flags`.
    pub observed: Vec<ObservedSegment>,
    /// NVTX range starts and ends, written as `external_annotations` when any.
    pub annotations: Vec<crate::trace::annotations::Annotation>,
    /// More keys for the `cushim` dict (an object: `mode`, `memory`, ...).
    pub extra: serde_json::Value,
}

impl From<(i32, Vec<SegmentInfo>, Vec<TraceEvent>)> for DeviceState {
    fn from((device, segments, events): (i32, Vec<SegmentInfo>, Vec<TraceEvent>)) -> Self {
        DeviceState {
            device,
            segments,
            events,
        }
    }
}
